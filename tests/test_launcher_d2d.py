"""Device-to-device moves of running jobs (MpiExecutor, real mpiexec + gloo): every move
kind continues on the one-process losses, with bytes and parts recorded; a rank killed in
the middle of a move makes the job resume from its last checkpoint on the new plan
(nothing half-moved is trained on)."""
import time

import pytest

from instances.grid import Grid, Shape
from instances.jobs import Job
from launcher.config import ParallelPlan
from launcher.d2d import FAULT_ENV
from launcher.launch import read_results
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
from launcher.reference import train_reference

MODEL = "tiny-gpt__2L"
BATCH = 8
LOSS_TOL = 1e-4                  # as tests/test_launcher_mpi.py


class Alloc:                     # structurally engine.core.allocation.Allocation
    def __init__(self, n: int, pp: int = 1):
        self.grid = Grid(Shape("cpu", 1, n), pp=pp)
        self.gpus = tuple((0, i) for i in range(n))


def plan(text: str, mb: int = 1) -> ParallelPlan:
    return ParallelPlan.parse(text, microbatches=mb)


def wait_for(pred, timeout_s=120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def all_results(ex, job_id):
    return {r["step"]: r["loss"] for d in sorted({m["_run_dir"] for m in ex._job(job_id).moves} | {ex.run_dir(job_id)})
            for r in read_results(d)}


@pytest.mark.slow
def test_every_move_kind_device_to_device_continues_on_the_uninterrupted_losses(tmp_path):
    """dp=2 -> pp=2 -> dp=2 -> tp=2 -> pp=2 -> dp=2,pp=2 (grow x2: two processes join) ->
    pp=2 (shrink /2: two park), 4 steps apart, in one job (about 35 s)."""
    moves = [(plan("pp=2", 2), "dp->pp"), (plan("dp=2"), "pp->dp"), (plan("tp=2"), "dp->tp"),
             (plan("pp=2", 2), "tp->pp"), (plan("dp=2,pp=2", 2), "grow x2"), (plan("pp=2", 2), "shrink /2")]
    steps = 4 * (len(moves) + 1) + 6
    ref = train_reference(MODEL, steps=steps, global_batch=BATCH, seed=0)
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=0, checkpoint_interval_s=0,
                                       step_delay_s=0.2))
    with ex:
        ex.launch(Job("j", MODEL, BATCH, steps, 0.0), Alloc(2), plan("dp=2"), 0.0)
        for i, (p, _) in enumerate(moves):
            wait_for(lambda: len(read_results(ex.run_dir("j"))) >= 4 * (i + 1))
            ex.reconfigure("j", Alloc(p.world_size), p, 0.0)
        wait_for(lambda: ex.progress("j").finished or ex.progress("j").failed, 180)
        assert ex.progress("j").finished, ex.progress("j").failed
        res = read_results(ex.run_dir("j"))
        assert [r["step"] for r in res] == list(range(1, steps + 1))       # one launch, no step lost
        diff = max(abs(r["loss"] - ref[r["step"] - 1]) for r in res)
        assert diff < LOSS_TOL, diff
        recs = ex.move_records("j")
    assert [r["kind"] for r in recs] == [k for _, k in moves]
    assert all(r["path"] == "d2d" for r in recs)
    assert len(ex.reconfiguration_times_s("j")) == len(moves)
    by_kind = {r["kind"]: r for r in recs}
    # DDP replicas each hold everything: moving to tp or pp only drops state, nothing is sent
    assert by_kind["dp->pp"]["bytes_moved"] == 0 and by_kind["dp->tp"]["bytes_moved"] == 0
    for k in ("pp->dp", "tp->pp", "grow x2", "shrink /2"):
        assert by_kind[k]["bytes_moved"] > 0
    for r in recs:
        assert r["total_s"] is not None and r["total_s"] >= r["drain_stop_s"] + r["state_s"]
        assert r["startup_s"] >= 0 and r["first_step_s"] > 0


@pytest.mark.slow
def test_a_rank_killed_mid_move_resumes_from_the_last_checkpoint_on_the_new_plan(tmp_path, monkeypatch):
    """pp=2 -> dp=2 with rank 1 SIGKILLed after posting its sends: the job is not reported
    failed; the move falls back to storage and the new plan resumes from the checkpoint of
    step 4 (steps 5.. trained again, on the one-process losses; about 25 s)."""
    monkeypatch.setenv(FAULT_ENV, "1")
    steps = 12
    ref = train_reference(MODEL, steps=steps, global_batch=BATCH, seed=0)
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=4, checkpoint_interval_s=0,
                                       step_delay_s=0.2))
    with ex:
        ex.launch(Job("j", MODEL, BATCH, steps, 0.0), Alloc(2), plan("pp=2", 2), 0.0)
        wait_for(lambda: len(read_results(ex.run_dir("j"))) >= 6)
        ex.reconfigure("j", Alloc(2), plan("dp=2"), 0.0)
        assert ex.progress("j").failed is None
        rec = ex.move_records("j")[-1]
        assert rec["path"] == "storage-fallback" and "exited" in rec["reason"], rec
        wait_for(lambda: ex.progress("j").finished or ex.progress("j").failed, 180)
        assert ex.progress("j").finished, ex.progress("j").failed
        res = read_results(ex.run_dir("j"))
        assert [r["step"] for r in res] == list(range(5, steps + 1))      # from the checkpoint of step 4
        diff = max(abs(r["loss"] - ref[r["step"] - 1]) for r in res)
        assert diff < LOSS_TOL, diff
        rec = ex.move_records("j")[-1]
        assert rec["step"] == 4 and rec["bytes_read"] > 0 and rec["total_s"] > 0
