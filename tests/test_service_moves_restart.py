"""The move ledger follows a job across a restart of ``arena serve`` (engine/service/daemon.py,
``_resume_moves``): a move whose job was running where it put it when the service died
(or stopped) stays open, so what the job makes after the restart counts; any other move
left open closes at what the job's progress says, never at 0."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.core.move_ledger import MoveEntry
from engine.service.jobspec import JobSpec
from engine.service.store import Store

SPEC = JobSpec("j", "tiny-gpt__2L", 8, 100)
SMALL, BIG = "cpu:1x1:pp1", "cpu:1x2:pp1"


def _moved(st: Store, work: Path, gpus: list[str], *, then: str, checkpoint: int, done: int) -> int:
    """A job that ran on SMALL, moved to BIG at step 10 (its ledger entry stored open, 20
    steps made at the last reading), then ``then``: ``died`` (the service died with it
    running there), ``finished`` (its training finished while the service was down),
    ``shutdown`` (stopped by the service's shutdown) or ``preempted`` (stopped by a round,
    the entry's close not stored before the service died)."""
    jid = st.jobs.submit(SPEC)
    g1 = st.launches.record_intent(jid, {"grid": SMALL}, gpus[:1])
    st.launches.mark(jid, g1, "started")
    st.jobs.set_status(jid, "running", "launch 1")
    moved_at = time.time()
    st.launches.mark(jid, g1, "finished", reason="moving: stopped with a checkpoint at step 10")
    st.jobs.set_status(jid, "queued", "moving")
    st.moves.record([MoveEntry(str(jid), moved_at, False, SMALL, BIG, 1.0, 1.0, 1.8, 8.0, 10.0, iterations_after=20.0)])
    g2 = st.launches.record_intent(jid, {"grid": BIG}, gpus)
    st.launches.mark(jid, g2, "started", pid_info={"run_dir": str(work / str(jid) / "gone")})
    st.jobs.set_status(jid, "running", "launch 2")
    if then in ("shutdown", "preempted"):
        st.launches.mark(jid, g2, "finished", reason=f"{'service shutdown' if then == 'shutdown' else 'preempted'}: "
                                                   f"stopped with a checkpoint at step {checkpoint}")
        st.jobs.set_status(jid, "queued", then)
    (work / str(jid)).mkdir(parents=True)
    (work / str(jid) / "progress.json").write_text(json.dumps(
        {"status": "finished" if then == "finished" else "running", "iterations_done": done,
         "last_checkpoint_step": checkpoint}))
    return jid


def test_a_restart_carries_on_the_moves_of_jobs_running_where_they_were_moved_and_closes_the_rest(tmp_path):
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.core.state import JobStatus
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), tmp_path / "work"
    with Store(db) as st:
        died = _moved(st, work, ["0:0", "0:1"], then="died", checkpoint=40, done=45)
        finished = _moved(st, work, ["1:0", "1:1"], then="finished", checkpoint=90, done=100)
        shutdown = _moved(st, work, ["2:0", "2:1"], then="shutdown", checkpoint=50, done=50)
        preempted = _moved(st, work, ["3:0", "3:1"], then="preempted", checkpoint=35, done=35)
        preempted_at = st.launches.rows(preempted)[-1].updated_at
    logs: list[str] = []
    svc = Service(ClusterSpec((NodeGroup("cpu", 2, 2),), "local-2x2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=str(work)), log=logs.append)
    try:
        svc.recover()
        rows = {m["job_id"]: m for m in svc.store.moves.rows()}
        for jid, resumed_at in ((died, 40.0), (shutdown, 50.0)):     # carried on: open, in this run's ledger
            assert rows[jid]["ended_at"] is None and rows[jid]["iterations_after"] == 20.0
            assert svc.loop.moves.open_entry(str(jid)).to_grid == BIG
            r = svc.loop.state.jobs[str(jid)]
            assert r.status is JobStatus.QUEUED and r.iterations_done == resumed_at
            # relaunched where the move put it, the job's steps since the restart count
            svc.loop.moves.launched(str(jid), time.time(), BIG, resumed_at)
            svc.loop.moves.closed(str(jid), time.time() + 60, 100.0, "finished")
        assert (rows[finished]["end_reason"], rows[finished]["iterations_after"]) == ("finished", 90.0)
        assert (rows[preempted]["end_reason"], rows[preempted]["iterations_after"]) == ("service restarted", 25.0)
        assert rows[preempted]["ended_at"] == pytest.approx(preempted_at)
        assert any("2 open move(s) of the last run carried on" in m for m in logs), logs
        svc.store_moves()
        assert all(m["end_reason"] == "finished" and m["iterations_after"] == 90.0
                   for m in svc.store.moves.rows() if m["job_id"] in (died, shutdown))
        assert svc.store.check() == []
    finally:
        svc.shutdown()


def test_a_moves_ledger_entry_is_stored_before_its_new_launch_is(tmp_path):
    """The journal's order for a move: its ledger entry is committed before the second
    half's launch intent, so a service killed in between leaves no move the ledger lacks
    (recovery then carries the entry on, or closes it at the job's progress)."""
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.allocation import Allocation
    from instances.cluster import ClusterSpec, NodeGroup
    from tests.test_engine_helpers import grid

    class Killed(Exception):
        pass

    class Released:                                   # the launcher's side: the job released through storage
        def released_path(self, job_id):
            return "storage"

    def fault(point: str) -> None:
        if point == "after-launch-intent":
            raise Killed

    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=str(tmp_path / "state.db"), work_dir=str(tmp_path / "w")),
                  log=lambda m: None)
    try:
        st = svc.store
        jid = st.jobs.submit(SPEC)
        g1 = st.launches.record_intent(jid, {"grid": SMALL}, ["0:0"])
        st.launches.mark(jid, g1, "started")
        st.jobs.set_status(jid, "running", "launch 1")
        st.launches.mark(jid, g1, "finished", reason="moving: stopped with a checkpoint at step 10")   # first half
        st.jobs.set_status(jid, "queued", "moving")
        svc.executor.mpi, svc.executor.fault = Released(), fault
        svc.loop.moves.opened(MoveEntry(str(jid), time.time(), False, SMALL, BIG, 1.0, 1.0, 1.8, 8.0, 10.0))
        with pytest.raises(Killed):
            svc.executor.reconfigure(str(jid), Allocation(grid("cpu", 1, 2), ((0, 0), (0, 1))), None, time.time())
        assert st.launches.rows(jid)[-1].state == "intent"
        (row,) = st.moves.rows(jid)
        assert (row["to_grid"], row["ended_at"]) == (BIG, None)
    finally:
        svc.shutdown()


def _serve_args(db: Path, work: Path, port: int) -> list[str]:
    return ["--local-slots", "2", "--local-nodes", "2", "--policy", "fcfs", "--db", str(db), "--work-dir", str(work),
            "--port", str(port), "--round-interval", "2", "--checkpoint-interval", "2", "--stop-timeout", "30",
            "--stop-after", "300", "--step-delay", "0.05"]


def _service(tmp: Path, log: str):
    from engine.service.scenario import ServiceProcess, free_port
    port = free_port()
    return ServiceProcess(_serve_args(tmp / "state.db", tmp / "work", port), tmp / log, f"http://127.0.0.1:{port}")


def _store(db: Path, what):
    with Store(db, readonly=True) as st:
        return what(st)


@pytest.mark.slow
def test_one_service_per_state_and_a_moved_job_counts_its_steps_after_a_kill_9_restart(tmp_path, capsys):
    """Real services, one run for two things (to spare CI). While the first runs a job: a
    second ``arena serve`` on its database (or on its work folder, with a database of its
    own) exits 2 naming the first's PID and host, and the job keeps its launch. Then the
    job is moved (its node drained), the service is killed with SIGKILL, and a new one
    starts at once on the same state (the lock is not stale); the job trains on to its
    end, and the move's ledger row counts every step made since the move, the ones after
    the restart too, as the job's progress says (it said 0 before)."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from engine.cli.main import main as cli_main
    from engine.service.client import Client
    from engine.service.scenario import free_port
    from tests.test_engine_helpers import wait_until
    # (steps: enough that the job is still running after two refused services have started
    # and exited, and after the move and the restart, on a loaded CI host: at 120 it could finish first)
    db, work, steps = tmp_path / "state.db", tmp_path / "work", 300
    first, second = _service(tmp_path, "serve.log"), None
    first.start()
    try:
        first.wait_healthy(120)
        client = Client(first.url)
        jid = client.post("/api/jobs", {"name": "moving", "model": "tiny-gpt__2L", "global_batch": 8,
                                         "steps": steps, "gpus": 2})["id"]

        def on_node(at_least: int) -> int | None:
            j = client.get(f"/api/jobs/{jid}")
            nodes = {int(g.split(":")[0]) for g in j["gpus"]}
            done = j["progress"].get("iterations_done") or 0
            ok = j["status"] == "running" and len(nodes) == 1 and done >= at_least
            return nodes.pop() + 1 if ok else None          # (+1: node 0 is a truthy answer too)
        node = wait_until(lambda: on_node(10), what="the job training") - 1
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        refused = {flag: subprocess.Popen([sys.executable, "-m", "engine.cli", "serve",
                                           *_serve_args(db2, work2, free_port())],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                   for db2, work2, flag in ((db, tmp_path / "work2", "--db"),
                                            (tmp_path / "other.db", work, "--work-dir"))}
        for flag, p in refused.items():
            _, err = p.communicate(timeout=120)
            assert p.returncode == 2 and "Traceback" not in err, err
            assert (f"field '{flag}': is in use by arena serve PID {first.proc.pid} on host {socket.gethostname()} "
                    f"since ") in err, err
        assert not (tmp_path / "other.db").exists()              # refused before anything was made
        assert first.alive() and on_node(10)
        (launch,) = _store(db, lambda st: st.launches.rows(jid))
        assert launch.generation == 1 and launch.state == "started"

        client.post(f"/api/nodes/{node}/drain", {"reason": "test"})      # moved device to device
        wait_until(lambda: _store(db, lambda st: st.moves.rows(jid)) and on_node(0) == 2 - node, what="the move")
        (move,) = _store(db, lambda st: st.moves.rows(jid))
        assert move["ended_at"] is None and move["rate_before"] > 0
        moved_at = move["iterations_at"]
        wait_until(lambda: (client.get(f"/api/jobs/{jid}")["progress"].get("last_checkpoint_step") or 0)
                   >= moved_at + 10, what="steps and a checkpoint after the move")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        second = _service(tmp_path, "serve2.log")
        second.start()
        second.wait_healthy(120)                                 # not refused: the lock died with the first
        client = Client(second.url)
        wait_until(lambda: client.get(f"/api/jobs/{jid}")["status"] == "finished", timeout_s=240, what="the end")
        (move,) = _store(db, lambda st: st.moves.rows(jid))
        progress = json.loads((work / str(jid) / "progress.json").read_text())
        assert progress["iterations_done"] == steps
        assert move["end_reason"] == "finished" and move["iterations_after"] == steps - moved_at > 0
        assert cli_main(["status", str(jid), "--url", second.url]) == 0
        made = capsys.readouterr().out.split("made ", 1)[1].split("x", 1)[0]
        span = move["ended_at"] - move["at"]
        assert float(made) > 0 and float(made) == pytest.approx(move["iterations_after"] / span / move["rate_before"],
                                                                 abs=0.01)
        assert _store(db, lambda st: st.check()) == []
    finally:
        first.kill()
        if second is not None:
            second.terminate()
