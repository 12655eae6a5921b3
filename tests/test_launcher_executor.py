"""MpiExecutor with real jobs: reconfigure (stop -> checkpoint -> relaunch on another plan ->
reshard), a rank killed mid-run reported as a failure within seconds, a relaunch
that resumes from the last checkpoint with no step lost beyond it, and a launch whose
rank runs out of memory recorded as an infeasible shape for the job. Under the round
loop: a move whose ranks are killed before they can save books the steps after the
checkpoint as lost, and a replaced launch writes no progress over the new one's."""
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.core.executor import JobProgress
from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.plan import Plan
from launcher.launch import rank_pids, ranks_not_done, read_events, read_results
from launcher.mpi_executor import LaunchedJobProgress, MpiExecutor, MpiExecutorConfig
from launcher.reference import train_reference

MODEL = "tiny-gpt__2L"
STEPS = 40
BATCH = 8
FAILURE_REPORT_S = 10.0          # a dead rank must be reported within this


def alloc(pp: int) -> Allocation:
    return Allocation(Grid(Shape("cpu", 1, 2), pp=pp), ((0, 0), (0, 1)))


def wait_for(pred, timeout_s=120.0, poll_s=0.1):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError("condition not reached in time")


def test_progress_has_the_engine_fields():
    import dataclasses
    assert [f.name for f in dataclasses.fields(LaunchedJobProgress)] == \
        [f.name for f in dataclasses.fields(JobProgress)]


def test_refuses_a_plan_that_does_not_match_the_allocation(tmp_path):
    ex = MpiExecutor(work_dir=str(tmp_path))
    job = Job("j0", MODEL, BATCH, STEPS, 0.0)
    with pytest.raises(KeyError):
        ex.progress("j0")                                   # never launched
    # a Wide-ResNet plan's tensor ranks run as data ranks (the launcher has no conv TP)
    wrn = Job("j3", "tiny-wide_resnet__50", BATCH, STEPS, 0.0)
    cfg = ex.train_config(wrn, alloc(1), Plan(pp=1, dp=1, tp=2, stage_layers=(18,)))
    assert (cfg.plan.dp, cfg.plan.tp, cfg.plan.pp) == (2, 1, 1)
    with pytest.raises(InputError, match="needs dp\\*tp\\*pp = 4 ranks but 2"):
        ex.launch(job, alloc(1), Plan(pp=1, dp=4, tp=1, stage_layers=(4,)), 0.0)


def test_reconfigure_then_rank_failure_then_resume(tmp_path):
    ref = train_reference(MODEL, steps=STEPS, global_batch=BATCH, seed=0)
    cfg = MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=4, step_delay_s=0.1,
                            stop_timeout_s=60, telemetry_store=str(tmp_path / "store"),
                            move_path="storage")     # the storage path (d2d: tests/test_launcher_d2d.py)
    job = Job("j1", MODEL, BATCH, STEPS, 0.0)
    with MpiExecutor(cfg) as ex:
        # 1. dp=2 until a periodic checkpoint exists
        ex.launch(job, alloc(1), Plan(pp=1, dp=2, tp=1, stage_layers=(4,)), ex.now_s())
        wait_for(lambda: ex.progress("j1").last_checkpoint_iteration >= 4)
        first_dir = ex.run_dir("j1")
        # the wall clock's seconds per step (what the move ledger's rate before is): the
        # step delay (0.1 s) and checkpoints included, as between results.jsonl's step
        # times; the measured iteration time is the step's own
        p, steps = ex.progress("j1"), read_results(first_dir)
        assert p.wall_iteration_time_s >= 0.1 > p.measured_iteration_time_s, p
        assert (steps[-1]["time"] - steps[0]["time"]) / (steps[-1]["step"] - steps[0]["step"]) >= 0.1
        ex.request_checkpoint("j1")                         # on request, between periodic ones
        wait_for(lambda: any(e["event"] == "save" and e["why"] == "request" for e in read_events(first_dir)))

        # 2. reconfigure to pp=2 (estimators' stage_layers count embedding and head)
        ex.reconfigure("j1", alloc(2), Plan(pp=2, dp=1, tp=1, stage_layers=(2, 2), microbatches=2),
                       ex.now_s())
        stopped_at = max(r["step"] for r in read_results(first_dir))
        assert ex.progress("j1").last_checkpoint_iteration == stopped_at   # checkpointed on stop
        second_dir = ex.run_dir("j1")
        wait_for(lambda: ex.reconfiguration_times_s("j1"))
        assert 0 < ex.reconfiguration_times_s("j1")[0] < 120
        rec = ex.move_records("j1")[0]
        assert (rec["path"], rec["kind"], rec["step"]) == ("storage", "dp->pp", stopped_at)
        assert rec["bytes_written"] > 0 and rec["bytes_read"] > 0 and rec["startup_s"] > 0
        assert rec["total_s"] == ex.reconfiguration_times_s("j1")[0]

        # 3. kill one rank after the next periodic checkpoint
        wait_for(lambda: ex.progress("j1").last_checkpoint_iteration >= stopped_at + 4)
        pid, _ = wait_for(lambda: rank_pids(second_dir).get(1))
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        events = ex.advance(ex.now_s() + 60)
        detect_s = time.monotonic() - t_kill
        assert [e.job_id for e in events] == ["j1"] and events[0].failed, events
        assert detect_s < FAILURE_REPORT_S, detect_s
        assert 1 in ranks_not_done(second_dir) and "did not reach the end" in ex.launched_job("j1").failed
        assert ex.runs_on(job, alloc(2).grid.shape)          # a killed rank is no memory verdict
        p = ex.progress("j1")
        assert not p.running and not p.finished and p.iterations_done == p.last_checkpoint_iteration
        ckpt = int(p.last_checkpoint_iteration)

        # 4. relaunch: resumes at the last checkpoint and finishes
        ex.launch(job, alloc(2), Plan(pp=2, dp=1, tp=1, stage_layers=(2, 2), microbatches=2), ex.now_s())
        events = ex.advance(ex.now_s() + 120)
        assert [e.job_id for e in events] == ["j1"] and events[0].finished, events
        assert ex.progress("j1").iterations_done == STEPS

    third = read_results(ex.run_dir("j1"))
    assert [r["step"] for r in third] == list(range(ckpt + 1, STEPS + 1))
    runs = [read_results(d) for d in (first_dir, second_dir)] + [third]
    assert [r["step"] for r in runs[1]][0] == stopped_at + 1
    for res in runs:                      # every launch's losses are on the uninterrupted track
        for r in res:
            assert abs(r["loss"] - ref[r["step"] - 1]) < 1e-4, (r, ref[r["step"] - 1])
    assert (tmp_path / "store" / "measured_runs.jsonl").is_file()


OOM_CHILD = """
import json, sys
from instances.allocation import Allocation
from instances.plan import Plan
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.models import get_model
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
job, shape = Job("j", sys.argv[2], 1, 2, 0.0), Shape("cpu", 1, 1)
ex = MpiExecutor(MpiExecutorConfig(work_dir=sys.argv[1], memory_device="a100-80gb"))
ex.launch(job, Allocation(Grid(shape, 1), ((0, 0),)),
          Plan(pp=1, dp=1, tp=1, stage_layers=(len(get_model(sys.argv[2]).layers()),)), ex.now_s())
ended = ex.advance(ex.now_s() + 120)
print(json.dumps({"failed": [p.failed for p in ended], "runs_on": ex.runs_on(job, shape),
                  "runs_on_other": ex.runs_on(job, Shape("cpu", 1, 2))}))
"""


@pytest.mark.slow
def test_a_launch_that_runs_out_of_memory_marks_its_shape_infeasible(tmp_path):
    # A real allocation failure: the executor and its ranks run under a 2.5 GB address-space
    # limit, and gpt__760M's fp32 weights (3 GB) do not fit in it; the launcher's own
    # memory check passes (it is told the device is an 80 GB A100), so the rank starts and
    # torch's CPU allocator fails while the model is built.
    limit = int(2.5e9)
    out = subprocess.run([sys.executable, "-c", OOM_CHILD, str(tmp_path), "gpt__760M"], capture_output=True,
                         text=True, timeout=240, cwd=Path(__file__).resolve().parents[1],
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(res["failed"]) == 1 and res["failed"][0].startswith("out of memory:"), res
    assert "can't allocate memory" in res["failed"][0]
    assert res["runs_on"] is False and res["runs_on_other"] is True


def test_out_of_memory_messages():
    import torch

    from launcher.mpi_executor import out_of_memory
    with pytest.raises(RuntimeError) as e:
        torch.empty(2 ** 62, dtype=torch.uint8)             # the CPU allocator's own failure
    assert out_of_memory(f"launcher.worker: rank failed: {e.value!r}")
    assert out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert out_of_memory(f"rank failed: {MemoryError()!r}")
    assert not out_of_memory("RuntimeError: Connection closed by peer") and not out_of_memory(None)


def test_a_move_whose_ranks_are_killed_books_the_steps_after_the_checkpoint_as_lost(tmp_path):
    """A move through storage whose ranks cannot checkpoint at the stop (frozen here with
    SIGSTOP, as ranks on a host cut off are beyond reach: killed after the stop timeout)
    resumes from the last checkpoint. The round loop books the steps after it as lost
    (``lost_iterations``) and the job's progress is the checkpoint's, as a stop's is, so
    that the new launch's readings never go back (they did: the next reading raised
    "iterations decreased N -> checkpoint" and the service stopped on it), and no step is
    lost or counted twice: the job ends at its iteration count."""
    from engine.core.round_loop import RoundLoop
    from engine.core.state import JobStatus
    from engine.decide.policies.fcfs import FcfsPolicy
    from instances.cluster import ClusterSpec, NodeGroup

    steps = 24
    cluster = ClusterSpec((NodeGroup("cpu", 2, 1),), "two-nodes")
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=4, checkpoint_interval_s=0,
                                       stop_timeout_s=1.0, move_path="storage", step_delay_s=0.1))
    loop = RoundLoop(cluster, FcfsPolicy(), ex, round_interval_s=1.0,
                     jobs=[Job("j", MODEL, BATCH, steps, 0.0), Job("k", MODEL, BATCH, 4, 0.0)])
    frozen: list[int] = []

    def freeze_between_checkpoints():
        """The ranks stopped (SIGSTOP) with steps trained since the last checkpoint."""
        p = ex.progress("j")
        if not (p.running and p.last_checkpoint_iteration >= 4 and p.iterations_done < steps - 4):
            return None
        pids = [pid for pid, _ in rank_pids(first_dir).values()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        p = ex.progress("j")                # (read again: frozen from here on)
        if p.iterations_done > p.last_checkpoint_iteration:
            frozen.extend(pids)
            return p
        for pid in pids:                    # at a checkpoint: let it train a step and try again
            os.kill(pid, signal.SIGCONT)
        return None

    with ex:
        loop.submit("j", ex.now_s())
        loop.round(ex.now_s(), 0)
        first_dir = ex.run_dir("j")
        try:
            p = wait_for(freeze_between_checkpoints)
            read, ck = p.iterations_done, p.last_checkpoint_iteration
            now = ex.now_s()
            loop.collect(now)
            loop.set_unavailable({0}, now)                  # it must leave node 0: moved to node 1
            rec = loop.round(now, 1)
        finally:
            for pid in frozen:                              # (killed by the stop; never left stopped)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        r = loop.state.jobs["j"]
        assert rec.reconfigurations == 1 and ex.run_dir("j") != first_dir
        assert [(e.iterations_at, e.forced) for e in loop.moves.entries] == [(read, True)]
        assert (r.iterations_done, r.lost_iterations) == (ck, read - ck), (read, ck)
        assert max(e["step"] for e in read_events(first_dir) if e["event"] == "save") == ck   # killed: no save

        loop.submit("k", ex.now_s())                        # an arrival: the next round reads j's progress
        loop.round(ex.now_s(), 2)                           # (it raised here: iterations decreased)
        deadline = time.monotonic() + 120
        for i in range(3, 10_000):
            now = ex.now_s()
            loop.collect(now)
            if r.status is JobStatus.FINISHED:
                break
            assert time.monotonic() < deadline, "j did not finish"
            loop.round(now, i)
            time.sleep(0.2)
        assert (r.iterations_done, r.lost_iterations) == (steps, read - ck)
        resumed = [row["step"] for row in read_results(ex.run_dir("j"))]
        assert resumed == list(range(int(ck) + 1, steps + 1))    # the lost steps trained again, once


def test_a_replaced_launch_saves_and_writes_no_progress_over_the_launch_that_replaced_it(tmp_path):
    """The fence (the job folder's ``current_launch``) is asked again at each progress
    write and before a checkpoint is committed: ranks cut off that agreed on a step, or
    began a save, just before a relaunch elsewhere replaced them leave the job's progress
    and checkpoints as the new launch found them, so that what the executor reported at the
    relaunch (the latest checkpoint then) is what the new launch resumes from and no reading
    goes ahead of it (one rank, in this process)."""
    import socket

    import torch
    import torch.distributed as dist

    from launcher.checkpoint import latest_checkpoint
    from launcher.config import ParallelPlan, TrainConfig
    from launcher.dist import make_env
    from launcher.telemetry import read_progress, write_progress
    from launcher.worker import CURRENT_FILE, RankRun

    job_dir = tmp_path / "j"
    progress, ck = job_dir / "progress.json", job_dir / "checkpoints"
    c = TrainConfig(model=MODEL, plan=ParallelPlan(), steps=10, run_dir=str(job_dir / "launch_0"),
                    progress_path=str(progress), checkpoint_dir=str(ck))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run = RankRun(c, make_env(c.plan, 0, 1, 0, torch.device("cpu"), socket.gethostname()), 0.0, 0.0)
        run.setup()
        run.build_schedule_and_data()
        (job_dir / CURRENT_FILE).write_text("launch_0")
        run.step(0)
        assert run.save(1, "periodic") and latest_checkpoint(ck)[0] == 1
        run.progress("running", 1, 0.1)
        assert read_progress(progress)["iterations_done"] == 1
        run.step(1)
        (job_dir / CURRENT_FILE).write_text("launch_1")         # relaunched elsewhere from step 1
        write_progress(progress, status="starting", iterations_done=1, steps_total=10, last_checkpoint_step=1,
                       iteration_time_s=None)
        assert run.save(2, "periodic")                          # (its step 2, agreed on before the fence)
        run.progress("running", 2, 0.1)
        assert latest_checkpoint(ck)[0] == 1 and sorted(p.name for p in ck.iterdir()) == ["step_00000001"]
        assert (read_progress(progress)["status"], read_progress(progress)["iterations_done"]) == ("starting", 1)
        assert run.last_ckpt == 1 and not any(e["event"] == "save" and e["step"] == 2
                                              for e in read_events(c.run_dir))
    finally:
        dist.destroy_process_group()
