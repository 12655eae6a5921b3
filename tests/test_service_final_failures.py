"""Failures a retry would meet again fail the job for good, at once (issue 46): a data
file swapped, after submission, for a link out of the service's data roots (refused at
launch, nothing trained on it), and a run whose loss turns non-finite (stopped before its
weights are saved; the job is not relaunched)."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from engine.core.reconfig import ReconfigCostModel
from engine.service.config import ServiceConfig
from engine.service.jobspec import JobSpec
from engine.service.store import Store
from instances.cluster import ClusterSpec, NodeGroup
from launcher.config import OptimizerConfig
from tests.test_engine_helpers import wait_until
from tests.test_launcher_hardening import finite_checkpoint

CLUSTER = ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2")
JOB = {"name": "j", "model": "tiny-gpt__2L", "global_batch": 4, "steps": 20, "gpus": 2}


class _Running:
    """An in-process service (scheduler thread only, no HTTP) over ``tmp``; stopped on exit."""

    def __init__(self, tmp: Path, **cfg):
        from engine.core.policy import make_policy
        from engine.service.daemon import Service
        from estimators import make_performance_model
        self.db = tmp / "state.db"
        self.cfg = ServiceConfig(db_path=str(self.db), work_dir=str(tmp / "work"), round_interval_s=1.0,
                                 min_round_gap_s=0.1, poll_interval_s=0.1, failure_backoff_s=0.2,
                                 stop_timeout_s=20.0, **cfg)
        self.logs: list[str] = []
        self.svc = Service(CLUSTER, make_policy("fcfs"), make_performance_model("analytic"), ReconfigCostModel(),
                           self.cfg, log=self.logs.append)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.svc.run, args=(self.stop,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)

    def job(self, jid: int):
        with Store(self.db, readonly=True) as st:
            return st.jobs.get(jid), st.jobs.history(jid), st.launches.rows(jid)


def _submit(db: Path, spec: JobSpec) -> int:
    with Store(db) as st:
        return st.jobs.submit(spec)


def test_a_data_file_swapped_for_a_link_out_of_the_roots_fails_the_job_at_launch(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"s" * 4000)
    corpus = root / "corpus.txt"
    corpus.write_bytes(b"hello arena " * 300)
    run = _Running(tmp_path, data_roots=(str(root),))
    spec = JobSpec.from_dict(JOB | {"data": str(corpus)}, roots=run.cfg.data_roots)     # accepted at submission
    jid = _submit(run.db, spec)
    corpus.unlink()
    corpus.symlink_to(outside)                              # swapped before the job launched
    with run:
        row, history, launches = wait_until(lambda: (j := run.job(jid))[0].status == "failed" and j,
                                            timeout_s=60, what="the job failed")
        time.sleep(1.5)                                     # rounds go on: it is not queued again
        row, history, launches = run.job(jid)
    assert row.status == "failed" and len(launches) == 1 and launches[0].state == "failed"
    reason = history[-1].reason
    assert "not retried" in reason and f"is outside the folders training data may be read from: {root}" in reason
    assert str(corpus) in reason and str(outside) in reason
    assert not (tmp_path / "work" / str(jid) / "launch_1" / "results.jsonl").exists()     # nothing trained


@pytest.mark.slow
def test_a_non_finite_loss_fails_the_job_once_keeping_the_finite_checkpoint(tmp_path):
    run = _Running(tmp_path, checkpoint_every=1)
    mpi = run.svc.mpi
    mpi.config = dataclasses.replace(mpi.config, optimizer=OptimizerConfig(lr=1e30))    # diverges at step 2
    jid = _submit(run.db, JobSpec.from_dict(JOB | {"gpus": 1}))             # one rank: the cheapest launch
    with run:
        wait_until(lambda: run.job(jid)[0].status == "failed", timeout_s=120, what="the job failed")
        time.sleep(1.5)
        row, history, launches = run.job(jid)
        assert run.svc.node_failures() == {}                # the job's fault, not the node's
    assert row.status == "failed" and len(launches) == 1, (row, launches)
    reason = history[-1].reason
    assert "not retried" in reason and "training stopped at step 2: the loss is nan (not finite)" in reason, reason
    ck = tmp_path / "work" / str(jid) / "checkpoints"
    assert "the last checkpoint kept is step 1 in" in reason and str(ck) in reason
    from launcher.checkpoint import latest_checkpoint
    assert latest_checkpoint(ck)[0] == 1                    # nothing saved after the finite step
    assert finite_checkpoint(ck / "step_00000001", tmp_path / "flat.pt")
