"""SlurmExecutor on a real Slurm cluster of three nodes on this host (the ``slurm_cluster``
fixture: n1 and n2 with two fake GPUs each, n3 CPU-only): a job across two Slurm nodes
trains on the one-process losses; a stop checkpoints and a relaunch on another node resumes
exactly; an outside ``scancel`` is a failed run that resumes from its checkpoint; a fresh
executor takes over a running job (no relaunch, no step lost, a device-to-device move
inside its Slurm job) and accounts launches that ended while nobody watched; bad inputs
are clear errors."""
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.plan import Plan
from instances.slurm import SlurmCommands, discover, list_jobs
from launcher import slurm_executor
from launcher.launch import read_results
from launcher.mpi_executor import MpiExecutorConfig
from launcher.reference import train_reference
from launcher.slurm_executor import SlurmExecutor, SlurmExecutorConfig, SlurmRun
from tests.test_engine_helpers import wait_until

MODEL = "tiny-gpt__2L"
BATCH = 8
LOSS_TOL = 1e-4                           # as tests/test_launcher_executor.py
REPO = Path(__file__).resolve().parents[1]
DP2 = Plan(pp=1, dp=2, tp=1, stage_layers=(4,))
PP2 = Plan(pp=2, dp=1, tp=1, stage_layers=(2, 2), microbatches=2)


@pytest.fixture
def slurm_cluster(slurm_cluster):
    """The session's cluster, with every job left by a test cancelled after it."""
    yield slurm_cluster
    slurm_cluster.cancel_all_jobs()


def gpus(*placed: tuple[int, int], pp: int = 1) -> Allocation:
    """An allocation of a100 GPUs (node id, GPU index); node ids 0, 1 are Slurm's n1, n2."""
    nodes = sorted({n for n, _ in placed})
    return Allocation(Grid(Shape("a100-40gb", len(nodes), len(placed) // len(nodes)), pp=pp), tuple(placed))


ACROSS = gpus((0, 0), (1, 0))                         # one rank on n1, one on n2
ACROSS_PP = gpus((0, 0), (1, 0), pp=2)
ON_N2 = gpus((1, 0), (1, 1))                          # both ranks on n2
ON_N1_PP = gpus((0, 0), (0, 1), pp=2)


def slurm_config(cluster, tag: str, **kw) -> SlurmExecutorConfig:
    v = discover(SlurmCommands(str(cluster.conf)))
    return SlurmExecutorConfig(nodes=v.node_names(), gres=v.launch_gres(), conf=str(cluster.conf), tag=tag,
                               poll_s=0.5, **kw)


def executor(cluster, work: Path, tag: str, **kw) -> SlurmExecutor:
    cfg = MpiExecutorConfig(work_dir=str(work), checkpoint_every=4, checkpoint_interval_s=0, step_delay_s=0.1,
                            stop_timeout_s=60, **kw)
    return SlurmExecutor(cfg, slurm_config(cluster, tag))


def wait_for(pred, timeout_s=150.0, poll_s=0.1):
    return wait_until(pred, timeout_s, "the condition", poll_s)


def check_losses(runs: list[list[dict]], ref: list[float]) -> None:
    for res in runs:
        for r in res:
            assert abs(r["loss"] - ref[r["step"] - 1]) < LOSS_TOL, (r, ref[r["step"] - 1])


def step_nodes(cluster, slurm_id: int) -> str:
    """The nodes of the job's first step (the ranks), as Slurm lists them."""
    out = cluster.run("squeue", "-h", "-s", "-j", str(slurm_id), "-o", "%i %N").stdout.split()
    return out[1] if len(out) >= 2 else ""


@pytest.mark.slow
def test_across_nodes_stop_relaunch_elsewhere_outside_cancel_and_ended_launches(slurm_cluster, tmp_path):
    """Three launches of one job (about 60 s here): dp=2 across n1+n2, stopped with a
    checkpoint; relaunched on n2 alone, cancelled from outside; a fresh executor accounts
    that launch as failed, relaunches pp=2 on n1 to the end; another fresh executor
    accounts the finished launch. Every launch's losses are on the uninterrupted track."""
    steps = 40
    ref = train_reference(MODEL, steps=steps, global_batch=BATCH, seed=0)
    job = Job("j1", MODEL, BATCH, steps, 0.0)
    cmds = SlurmCommands(str(slurm_cluster.conf))
    ex = executor(slurm_cluster, tmp_path, "a")
    # 1. dp=2 across two Slurm nodes, one rank (and one GPU) on each
    ex.launch(job, ACROSS, DP2, ex.now_s())
    first, first_dir = ex.slurm_job_id("j1"), ex.run_dir("j1")
    wait_for(lambda: ex.progress("j1").last_checkpoint_iteration >= 4)
    assert step_nodes(slurm_cluster, first) == "n[1-2]"
    script = (Path(first_dir) / "slurm_job.sh").read_text()
    assert "/mpiexec -print-all-exitcodes -n 2 -ppn 1 " in script         # Hydra, in the allocation
    assert list_jobs(cmds, [first])[first].name == "arena.a.j1.0"

    # 2. stop: the ranks checkpoint at the step they are in and exit; the Slurm job completes
    ex.stop("j1", ex.now_s())
    stopped = max(r["step"] for r in read_results(first_dir))
    p = ex.progress("j1")
    assert not p.running and p.last_checkpoint_iteration == stopped == p.iterations_done
    assert list_jobs(cmds, [first])[first].state == "COMPLETED"

    # 3. relaunch on n2 alone (two ranks): resumes at the next step
    ex.launch(job, ON_N2, DP2, ex.now_s())
    second, second_dir = ex.slurm_job_id("j1"), ex.run_dir("j1")
    assert second != first
    wait_for(lambda: ex.progress("j1").last_checkpoint_iteration >= stopped + 4)
    assert step_nodes(slurm_cluster, second) == "n2"
    assert read_results(second_dir)[0]["step"] == stopped + 1

    # 4. scancel from outside: a failed run, its progress at the last checkpoint
    slurm_cluster.run("scancel", str(second))
    t0 = time.monotonic()
    events = ex.advance(ex.now_s() + 60)
    assert time.monotonic() - t0 < 15
    assert [e.job_id for e in events] == ["j1"] and events[0].failed, events
    assert events[0].failed.startswith(f"Slurm job {second} ended CANCELLED"), events[0].failed
    p = ex.progress("j1")
    assert not p.running and p.iterations_done == p.last_checkpoint_iteration >= stopped + 4
    ckpt = int(p.last_checkpoint_iteration)

    # 5. a fresh executor (a restarted service) accounts launch 1 as failed, from Slurm and the run folder
    ex2 = executor(slurm_cluster, tmp_path, "a")
    assert ex2.find_running() == []
    p = ex2.adopt(job, ON_N2, DP2, 1)
    assert p is not None and not p.running and p.failed.startswith(f"Slurm job {second} ended CANCELLED")
    assert [e.job_id for e in ex2.advance(ex2.now_s() + 5)] == ["j1"]
    assert ex2.next_launch_index("j1") == 2
    ex2.launch(job, ON_N1_PP, PP2, ex2.now_s())          # pp=2 on n1: reshards dp=2's checkpoint
    third, third_dir = ex2.slurm_job_id("j1"), ex2.run_dir("j1")
    events = ex2.advance(ex2.now_s() + 150)
    assert [e.job_id for e in events] == ["j1"] and events[0].finished, events
    assert [r["step"] for r in read_results(third_dir)] == list(range(ckpt + 1, steps + 1))
    check_losses([read_results(d) for d in (first_dir, second_dir, third_dir)], ref)

    # 6. another fresh executor accounts the finished launch 2: finished, nothing relaunched
    ex3 = executor(slurm_cluster, tmp_path, "a")
    p = ex3.adopt(job, ON_N1_PP, PP2, 2)
    assert p is not None and p.finished and p.iterations_done == steps and ex3.slurm_job_id("j1") == third
    assert ex3.adopt(job, ON_N1_PP, PP2, 7) is None                 # a launch nobody made
    mine = [j for j in list_jobs(cmds).values() if j.name.startswith("arena.a.")]
    assert sorted(j.job_id for j in mine) == [first, second, third]


CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from tests.test_launcher_slurm import ACROSS, DP2, MODEL, BATCH, executor
from tests.slurm_cluster import SlurmCluster
from pathlib import Path
from instances.jobs import Job
cluster = SlurmCluster(Path(sys.argv[1]))
ex = executor(cluster, Path(sys.argv[2]), "b")
ex.launch(Job("j2", MODEL, BATCH, int(sys.argv[4]), 0.0), ACROSS, DP2, ex.now_s())
while ex.progress("j2").iterations_done < 6:
    if ex.has_events():
        print(json.dumps({"failed": ex.progress("j2").failed}), flush=True)
        sys.exit(1)
    time.sleep(0.1)
print(json.dumps({"slurm_job": ex.slurm_job_id("j2")}), flush=True)
time.sleep(600)       # until SIGKILLed, like a crashed service
"""


@pytest.mark.slow
def test_a_fresh_executor_adopts_a_running_job_without_relaunch_or_lost_step(slurm_cluster, tmp_path):
    """A service process launches a job and is SIGKILLed mid-run; a fresh executor finds the
    Slurm job by its tag, takes it over, moves it device to device inside its Slurm job
    (same nodes, dp=2 -> pp=2), and it finishes: the same Slurm job, every step once, on
    the uninterrupted losses (about 40 s)."""
    steps = 40
    ref = train_reference(MODEL, steps=steps, global_batch=BATCH, seed=0)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(slurm_cluster.root), str(tmp_path), str(REPO),
                              str(steps)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 300)
        assert ready, "the child executor said nothing within 300 s"
        info = json.loads(child.stdout.readline() or "{}")
        assert "slurm_job" in info, info
        slurm_id = info["slurm_job"]
    finally:
        os.kill(child.pid, signal.SIGKILL)                    # the service crashes; its Slurm job runs on
        child.wait()
    job = Job("j2", MODEL, BATCH, steps, 0.0)
    ex = executor(slurm_cluster, tmp_path, "b")
    found = ex.find_running()
    assert [(f.job_id, f.launch_index, f.slurm_job_id) for f in found] == [("j2", 0, slurm_id)]
    p = ex.adopt(job, ACROSS, DP2, 0)
    assert p is not None and p.running and not p.failed and p.iterations_done >= 6
    at = p.iterations_done
    wait_for(lambda: ex.progress("j2").iterations_done >= at + 3)         # progress keeps being read
    ex.release("j2", ex.now_s(), target=ACROSS_PP)
    assert ex.released_path("j2") == "d2d"
    ex.reconfigure("j2", ACROSS_PP, PP2, ex.now_s())
    events = ex.advance(ex.now_s() + 150)
    assert [e.job_id for e in events] == ["j2"] and events[0].finished, events
    assert ex.slurm_job_id("j2") == slurm_id
    moves = ex.move_records("j2")
    assert [(m["path"], m["kind"]) for m in moves] == [("d2d", "dp->pp")], moves
    res = read_results(ex.run_dir("j2"))
    assert [r["step"] for r in res] == list(range(1, steps + 1))           # every step once: none lost or redone
    check_losses([res], ref)
    assert sorted(Path(tmp_path, "j2").glob("launch_*")) == [Path(tmp_path, "j2", "launch_0")]


def dead_conf(cluster, tmp_path: Path) -> Path:
    """The cluster's slurm.conf with a controller port nobody listens on (clients give up in ~1 s)."""
    dead = tmp_path / "dead.conf"
    dead.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", cluster.conf.read_text()) + "MessageTimeout=1\n")
    return dead


def test_slurm_not_answering_mid_run_is_no_end_of_the_run(slurm_cluster, tmp_path, monkeypatch):
    """The controller gone while a launch runs: the launch runs on as far as the executor
    knows (no failure, no traceback; stop and kill say nothing), and ends once its batch
    script has written srun's exit status and Slurm still does not answer."""
    cfg = slurm_config(slurm_cluster, "d")
    ex = SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path)), SlurmExecutorConfig(
        nodes=cfg.nodes, gres=cfg.gres, conf=str(dead_conf(slurm_cluster, tmp_path)), tag="d", poll_s=0.1))
    run_dir = tmp_path / "launch_0"
    run_dir.mkdir()
    run = SlurmRun(ex, 4242, str(run_dir), time.time())
    assert run.poll() is None
    assert ex.slurm_error.startswith("the Slurm controller does not answer (`squeue")
    run.request_stop()
    run.kill()
    monkeypatch.setattr(slurm_executor, "EXIT_GRACE_S", 0.0)
    (run_dir / slurm_executor.EXIT_FILE).write_text("0\n")
    assert run.poll() == 0
    assert run.describe_end(0).startswith("Slurm job 4242 ended unknown (Slurm did not answer: the Slurm "
                                          "controller does not answer"), run.describe_end(0)


SRUN_ONCE_AWAY = """#!/bin/bash
# Hydra's srun for its proxies: the first call meets a controller that does not answer
if [ -e {mark} ]; then rm -f {mark}; SLURM_CONF={dead} exec {srun} "$@"; fi
exec {srun} "$@"
"""


def test_ranks_that_never_start_are_a_stall_and_are_killed(slurm_cluster, tmp_path, monkeypatch):
    """Issue 48: the controller away just as a launch's batch script starts its ranks.
    Hydra's ``srun`` for the proxies gives up ("Unable to confirm allocation for job N:
    Unable to contact slurm controller"), and ``mpiexec`` then waits for proxies that never
    come: the Slurm job runs on and no rank ever starts. Here that ``srun`` (the real one,
    through ``HYDRA_LAUNCHER_EXEC``) meets a slurm.conf whose controller port nobody
    listens on, for the first launch only. The executor's stall watch kills the launch
    ``run_stall_s`` after Slurm started it: a failed run that says so (about 15 s here).
    (Start-up counts: a launch's first write comes after its imports, which take seconds
    on a loaded host; hence 8 s here, and ``arena serve --launch-stall-after`` 600 s.)"""
    mark, wrapper = tmp_path / "away-once", tmp_path / "srun-once-away"
    wrapper.write_text(SRUN_ONCE_AWAY.format(mark=mark, dead=dead_conf(slurm_cluster, tmp_path),
                                             srun=shutil.which("srun")))
    wrapper.chmod(0o755)
    mark.touch()
    monkeypatch.setenv("HYDRA_LAUNCHER_EXEC", str(wrapper))     # sbatch passes the environment on to the job
    ex = executor(slurm_cluster, tmp_path / "work", "s", run_stall_s=8.0)
    job, one, plan = Job("j5", MODEL, BATCH, 8, 0.0), gpus((0, 0)), Plan(pp=1, dp=1, tp=1, stage_layers=(4,))
    ex.launch(job, one, plan, ex.now_s())
    first, first_dir = ex.slurm_job_id("j5"), Path(ex.run_dir("j5"))
    t0 = time.monotonic()
    events = ex.advance(ex.now_s() + 90)
    assert [e.job_id for e in events] == ["j5"] and events[0].failed, events   # (old code: nothing, ever)
    assert time.monotonic() - t0 < 60
    assert not mark.exists() and "Unable to contact slurm controller" in (first_dir / "stderr.log").read_text()
    assert events[0].failed.startswith(
        "stalled: its ranks wrote nothing since it started running (no step, progress or event for more than 8 s), "
        f"so it was killed; Slurm job {first} ended CANCELLED"), events[0].failed
    assert read_results(first_dir) == [] and ex.progress("j5").last_checkpoint_iteration == 0
    left = list_jobs(SlurmCommands(str(slurm_cluster.conf)), [first])
    assert first not in left or left[first].ended, left                     # its node given back
    # (a failed run resumes from its last checkpoint at its next launch: the outside scancel above)


def test_bad_inputs_are_clear_errors(slurm_cluster, tmp_path, monkeypatch):
    job = Job("j3", MODEL, BATCH, 4, 0.0)
    one = gpus((0, 0))
    # an unknown partition: Slurm's refusal, at launch
    ex = SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path)), slurm_config(slurm_cluster, "c", partition="gpus"))
    with pytest.raises(InputError) as e:
        ex.launch(job, one, Plan(pp=1, dp=1, tp=1, stage_layers=(4,)), ex.now_s())
    assert str(e.value) == ("field 'sbatch': Slurm refused the launch of job j3 on n1: sbatch: error: Batch job "
                            "submission failed: Invalid partition name specified")
    assert not e.value.transient                    # a verdict on the request
    # the controller down: a slurm.conf whose controller port nobody listens on
    cfg = slurm_config(slurm_cluster, "c")
    ex = SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path)), SlurmExecutorConfig(
        nodes=cfg.nodes, gres=cfg.gres, conf=str(dead_conf(slurm_cluster, tmp_path)), tag="c"))
    with pytest.raises(InputError) as e:
        ex.launch(job, one, Plan(pp=1, dp=1, tp=1, stage_layers=(4,)), ex.now_s())
    assert str(e.value) == ("field 'sbatch': Slurm refused the launch of job j3 on n1: the Slurm controller does "
                            "not answer: sbatch: error: Batch job submission failed: Unable to contact slurm "
                            "controller (connect failure)")
    assert e.value.transient                        # Slurm away: no verdict on the job or its shape
    # options the executor sets itself, a bad tag, a node without a Slurm name
    with pytest.raises(InputError, match="field '--slurm-opt': 'nodelist=n3': the executor sets --nodelist itself"):
        SlurmExecutorConfig(nodes=cfg.nodes, options=("time=10", "nodelist=n3"))
    with pytest.raises(InputError, match="field '--slurm-opt': must be KEY=VALUE or KEY"):
        SlurmExecutorConfig(nodes=cfg.nodes, options=("=x",))
    with pytest.raises(InputError, match="field '--slurm-tag': must be 1-40 letters"):
        SlurmExecutorConfig(nodes=cfg.nodes, tag="my service")
    with pytest.raises(InputError, match="node 5 has no Slurm node name"):
        SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path)), cfg).launch(
            job, gpus((5, 0)), Plan(pp=1, dp=1, tp=1, stage_layers=(4,)), 0.0)
    # no Slurm commands here: refused when the executor is made, before any launch
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError) as e:
        SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path)), cfg)
    assert str(e.value).startswith("field '--slurm': no Slurm command 'sbatch' on PATH")
