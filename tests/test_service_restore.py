"""Restoring the state database from an older copy (``arena backup``): recovery stops and
sets aside what the work folder holds and the copy does not know (engine/service/workdir.py)
— with real ranks training in launches the copy never saw — and keeps every checkpoint
of the jobs it does know."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.service.jobspec import JobSpec
from engine.service.store import Store
from engine.service.workdir import ASIDE, set_aside_unknown, unknown_folders
from tests.test_engine_helpers import wait_until

SPEC = {"name": "a", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 400}


def test_folders_the_database_does_not_know_are_found_and_moved_aside(tmp_path):
    work = tmp_path / "work"
    with Store(str(tmp_path / "state.db")) as st:
        a = st.jobs.submit(JobSpec.from_dict(SPEC))
        gen = st.launches.record_intent(a, {"grid": "cpu:1x1:pp1"}, ["0:0"])
        st.launches.mark(a, gen, "started", pid_info={"run_dir": str(work / str(a) / "launch_1")})
        b = st.jobs.submit(JobSpec.from_dict({**SPEC, "name": "b"}))
        last = st.launches.last_generations()
    assert last == {a: 1, b: 0}
    for d in (f"{a}/launch_1", f"{a}/launch_2", f"{a}/checkpoints", f"{b}/launch_1", "7/launch_1", "not-a-job"):
        (work / d).mkdir(parents=True)
    (work / str(a) / "progress.json").write_text("{}")
    (work / "7" / "launch_1" / "stderr.log").write_text("kept\n")
    assert [(j, n) for j, n, _ in unknown_folders(work, last)] == [(a, 2), (b, 1), (7, None)]
    logs: list[str] = []
    moved = set_aside_unknown(work, last, 5.0, logs.append)
    assert len(moved) == 3 and all(p.parent == work / ASIDE for p in moved)
    # the known job keeps its launch, its progress and its checkpoints in place
    assert sorted(p.name for p in (work / str(a)).iterdir()) == ["checkpoints", "launch_1", "progress.json"]
    assert not (work / str(b) / "launch_1").exists() and not (work / "7").exists() and (work / "not-a-job").is_dir()
    whole = next(p for p in moved if p.name.startswith("7-"))
    assert (whole / "launch_1" / "stderr.log").read_text() == "kept\n"          # moved whole, not deleted
    assert any("job folder 7" in m and "resubmit" in m for m in logs), logs
    assert any(f"job {a}'s launch folder launch_2" in m and "(1)" in m for m in logs), logs
    assert set_aside_unknown(work, last, 5.0, logs.append) == [] and len(logs) == 3   # nothing left to do
    assert set_aside_unknown(tmp_path / "absent", last, 5.0, logs.append) == []


def test_recovery_says_what_it_found_of_jobs_that_finished_while_it_was_down(tmp_path):
    """After a kill -9, or on a restored copy: a launch the store calls active whose ranks
    had exited after training to the end is logged as such, not as ranks asked to
    checkpoint and stopped; a job the copy has queued with no launch at all, whose work
    folder says it finished (in launches set aside as unknown), says that in its history."""
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup
    from launcher.telemetry import write_progress
    db, work = tmp_path / "state.db", tmp_path / "work"
    with Store(db) as st:
        done = st.jobs.submit(JobSpec.from_dict(SPEC))
        gen = st.launches.record_intent(done, {"dp": 1, "tp": 1, "pp": 1, "gpu_type": "cpu", "nodes": 1,
                                               "gpus_per_node": 1}, ["0:0"])
        run = work / str(done) / f"launch_{gen}"
        st.launches.mark(done, gen, "started", pid_info={"pid": None, "run_dir": str(run)})
        st.jobs.set_status(done, "running", "launch 1")
        unseen = st.jobs.submit(JobSpec.from_dict({**SPEC, "name": "b"}))
    run.mkdir(parents=True)
    (work / str(unseen) / "launch_1").mkdir(parents=True)          # a launch the copy does not know
    for jid in (done, unseen):
        write_progress(work / str(jid) / "progress.json", status="finished", iterations_done=400, steps_total=400,
                       last_checkpoint_step=400)
    logs: list[str] = []
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None, ReconfigCostModel(),
                  ServiceConfig(db_path=str(db), work_dir=str(work), stop_timeout_s=5), log=logs.append)
    try:
        svc.recover()
        assert f"job {done}: launch {gen} was active at restart; its ranks had already exited: training had " \
               "finished while the service was down (step 400)" in logs, logs
        assert not any("asked to checkpoint" in m for m in logs), logs
        st = svc.store
        assert st.jobs.get(done).status == "finished" and st.jobs.get(unseen).status == "finished"
        assert st.jobs.history(unseen)[-1].reason == (
            "training finished (step 400, its work folder's progress.json) in launches this database does not "
            "know: a database restored from an older copy")
    finally:
        svc.shutdown()


@pytest.mark.slow
def test_a_service_restored_from_an_older_copy_stops_what_the_copy_does_not_know(tmp_path):
    # job A runs (launch 1) and checkpoints; the copy is taken; then A is stopped and
    # launched again (launch 2) and job B is submitted and launched: both train for real
    # when the service dies. Started again on the copy, recovery must stop both runs the
    # copy does not know, resume A from launch 2's checkpoint, and give the next job
    # submitted (B's id again, in the copy) a fresh folder.
    from engine.service.journal import JournaledExecutor
    from instances.allocation import Allocation
    from launcher.launch import live_rank_pids, rank_pids, stop_detached
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
    from tests.test_engine_helpers import grid

    db, copy, work = str(tmp_path / "state.db"), tmp_path / "copy.db", str(tmp_path / "work")
    store = Store(db)
    spec = JobSpec.from_dict(SPEC)
    a = store.jobs.submit(spec)
    mpi = MpiExecutor(MpiExecutorConfig(work_dir=work, checkpoint_interval_s=1.0, step_delay_s=0.05))
    journal = JournaledExecutor(mpi, store)
    one = Allocation(grid("cpu", 1, 1), ((0, 0),))
    runs: list[Path] = []
    try:
        journal.launch(spec.to_job(str(a), 0.0), one, None, 0.0)
        runs.append(Path(mpi.run_dir(str(a))))
        wait_until(lambda: journal.progress(str(a)).last_checkpoint_iteration >= 2, what="a checkpoint of launch 1")
        store.backup(copy)                                   # the copy: A running in launch 1
        journal.stop(str(a), 1.0, "stopped for the test")
        at_copy = store.launches.latest_checkpoint(a).step
        journal.launch(spec.to_job(str(a), 0.0), one, None, 2.0)
        runs.append(Path(mpi.run_dir(str(a))))
        b_spec = JobSpec.from_dict({**SPEC, "name": "b"})
        b = store.jobs.submit(b_spec)
        journal.launch(b_spec.to_job(str(b), 0.0), Allocation(grid("cpu", 1, 1), ((0, 1),)), None, 2.0)
        runs.append(Path(mpi.run_dir(str(b))))
        assert [r.name for r in runs] == ["launch_1", "launch_2", "launch_1"]
        wait_until(lambda: journal.progress(str(a)).last_checkpoint_iteration >= at_copy + 3,
              what="a checkpoint of launch 2 past the copy's")
        wait_until(lambda: all(live_rank_pids(r) for r in runs[1:]), what="both later runs training")
        pids = [pid for r in runs[1:] for pid, _ in rank_pids(r).values()]
        store.close()                                        # the service dies; its ranks train on
        _restart_on_the_copy(copy, work, a, b, at_copy, pids)
    finally:                                                 # whatever failed, no rank outlives the test
        aside = Path(work) / ASIDE
        for d in [*runs, *aside.glob("*"), *aside.glob("*/launch_*")]:
            if d.is_dir() and live_rank_pids(d):
                stop_detached(d, None, 10)


def _restart_on_the_copy(copy, work, a, b, at_copy, pids):
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup

    logs: list[str] = []
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=str(copy), work_dir=work, stop_timeout_s=30),
                  log=logs.append)
    try:
        svc.recover()
        alive = [p for p in pids if _alive(p)]
        assert not alive, (alive, logs)
        assert any(f"job {a}'s launch folder launch_2" in m and "ranks still training" in m for m in logs), logs
        assert any(f"job folder {b}" in m and "ranks still training" in m for m in logs), logs
        aside = Path(work) / ASIDE
        assert not (Path(work) / str(a) / "launch_2").exists() and not (Path(work) / str(b)).exists()
        assert {p.name.split("-")[0] for p in aside.iterdir()} == {str(a), str(b)}
        st = svc.store
        assert st.check() == [] and st.jobs.get(a).status == "queued"
        # A resumes from launch 2's checkpoint, written after the copy: no step lost
        done = svc.loop.state.jobs[str(a)].iterations_done
        assert done >= at_copy + 3, (done, at_copy)
        # the copy gives B's id to the next job; it starts in a folder of its own
        c = st.jobs.submit(JobSpec.from_dict({**SPEC, "name": "c"}))
        assert c == b and not (Path(work) / str(c)).exists()
    finally:
        svc.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                              # a zombie (exited, not yet reaped) is not training
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
