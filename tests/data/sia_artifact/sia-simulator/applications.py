# Test fixture in the layout of the Sia artifact's applications.py (not its code).
import os


class Application(object):
    def __init__(self, trace_dir, cluster_suffix=None, max_epochs=None, **kwargs):
        self.name = os.path.basename(trace_dir)
        if self.name == "toy" and cluster_suffix == "rtx":
            self.max_local_bsz = 24
        if self.name == "toy":
            self.rescale_time = 20
        elif self.name == "big":
            self.rescale_time = 100
        else:
            self.rescale_time = 30


class PMPApplication(Application):
    pass


TRACES_DIR = os.path.join(os.path.dirname(__file__), "./traces")
APPLICATIONS = {
    "aws": {
        "toy": Application(os.path.join(TRACES_DIR, "toy"), cluster_suffix="aws", max_epochs=3),
        "big": Application(os.path.join(TRACES_DIR, "big"), cluster_suffix="aws", max_epochs=2),
        "pipe": PMPApplication(os.path.join(TRACES_DIR, "pipe"), cluster_suffix="aws", max_epochs=2, num_stages=4),
    },
    "rtx": {
        "toy": Application(os.path.join(TRACES_DIR, "toy"), cluster_suffix="rtx", max_epochs=3),
        "big": Application(os.path.join(TRACES_DIR, "big"), cluster_suffix="rtx", max_epochs=2),
        "pipe": PMPApplication(os.path.join(TRACES_DIR, "pipe"), cluster_suffix="rtx", max_epochs=2, num_stages=4),
    },
}
