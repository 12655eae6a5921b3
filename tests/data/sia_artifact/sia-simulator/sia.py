# Test fixture in the layout of the Sia artifact's sia.py (its restart penalties only).
def get_restart_penalty(jobname):
    if "toy" in jobname:
        return 20
    elif "big" in jobname:
        return 90
    else:
        return 30
