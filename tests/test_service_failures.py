"""``arena serve`` when runs fail or the operator acts: a killed rank makes the job resume
from its last checkpoint in a later round; a job that keeps failing is marked failed with
the reason (never retried forever); cancel stops a running job with a checkpoint; SIGTERM
stops the service with every running job checkpointed, and the next start resumes them.
"""
from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.service.client import Client
from engine.service.scenario import ServiceProcess, free_port, resumes
from engine.service.store import Store
from launcher.launch import rank_pids
from tests.browser import status_page
from tests.prometheus import parse_metrics
from tests.test_engine_helpers import wait_until

pytestmark = pytest.mark.slow

# fcfs keeps a job where it is (this file tests failures, not the policy's moves)
JOB = {"name": "long", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 400, "gpus": 2}


def _start(tmp: Path, port: int, *extra: str, slots: int = 2) -> ServiceProcess:
    args = ["--local-slots", str(slots), "--policy", "fcfs", "--db", str(tmp / "state.db"),
            "--work-dir", str(tmp / "work"), "--port", str(port), "--round-interval", "2",
            "--checkpoint-interval", "2", "--failure-backoff", "1",
            "--stop-timeout", "30", "--stop-after", "600", "--step-delay", "0.05", *extra]
    sp = ServiceProcess(args, tmp / "serve.log", f"http://127.0.0.1:{port}")
    sp.start()
    sp.wait_healthy(120)
    return sp


def _job(client: Client, jid: int) -> dict:
    return client.get(f"/api/jobs/{jid}")


def _running_step(client: Client, jid: int, at_least: int):
    j = _job(client, jid)
    done = j["progress"].get("iterations_done") or 0
    return j if j["status"] == "running" and j["progress"].get("status") == "running" and done >= at_least else None


def _checkpointed(client: Client, jid: int, at_least: int):
    j = _running_step(client, jid, at_least)
    return j if j and (j["progress"].get("last_checkpoint_step") or 0) >= at_least else None


def _kill_a_rank(work: Path, jid: int, gen: int) -> None:
    run_dir = work / str(jid) / f"launch_{gen}"
    pids = wait_until(lambda: rank_pids(run_dir), what="rank pids")
    os.kill(pids[max(pids)][0], signal.SIGKILL)


def test_a_killed_rank_resumes_from_the_checkpoint_and_repeated_failures_fail_the_job(tmp_path):
    port = free_port()
    sp = _start(tmp_path, port, "--max-failures", "2")
    client = Client(sp.url)
    try:
        jid = client.post("/api/jobs", JOB)["id"]
        ck = wait_until(lambda: _checkpointed(client, jid, 10), what="a checkpoint")["progress"]["last_checkpoint_step"]
        first = _job(client, jid)["launch"]["generation"]
        _kill_a_rank(tmp_path / "work", jid, first)
        # the run fails, the job waits its backoff, then a new launch resumes from the checkpoint
        wait_until(lambda: (_job(client, jid)["launch"]["generation"] > first
                       and _running_step(client, jid, ck + 1)), what="the relaunch")
        with Store(tmp_path / "state.db", readonly=True) as st:
            assert any(h.to_status == "queued" and "run failed (1 of 2)" in h.reason for h in st.jobs.history(jid))
            rs = resumes(str(tmp_path / "work"), jid, st)
            assert rs and all(start == saved for _, start, saved in rs), rs   # nothing past a checkpoint lost
            assert rs[-1][1] >= ck
        second = _job(client, jid)["launch"]["generation"]
        _kill_a_rank(tmp_path / "work", jid, second)
        j = wait_until(lambda: (lambda j: j if j["status"] == "failed" else None)(_job(client, jid)),
                  what="the job to fail for good")
        assert "failed 2 times" in j["history"][-1]["reason"] and "mpiexec exited" in j["history"][-1]["reason"]
    finally:
        sp.terminate()


def test_hold_release_cancel_and_sigterm_keep_the_work(tmp_path, capsys):
    """As an operator would, through the CLI, on four slots: two long jobs hold them all;
    holding one stops it with a checkpoint and an urgent job runs in its slots, and a job
    submitted after it waits for it; cancelling the other long job stops it with a
    checkpoint; the held job stays held while slots are free;
    released, it resumes from the checkpoint it was held at; SIGTERM stops it with a
    checkpoint and the next start resumes it from there."""
    from engine.cli.main import main as cli_main
    port = free_port()
    sp = _start(tmp_path, port, slots=4)
    client = Client(sp.url)
    try:
        a = client.post("/api/jobs", {**JOB, "steps": 3000})["id"]
        b = client.post("/api/jobs", {**JOB, "name": "other", "steps": 3000})["id"]
        foreign = urllib.request.Request(f"{sp.url}/api/jobs/{a}/hold", data=b"{}", method="POST",
                                         headers={"Host": "evil.example", "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:       # DNS rebinding: not this service's name
            urllib.request.urlopen(foreign, timeout=10)
        assert refused.value.code == 403
        wait_until(lambda: _checkpointed(client, a, 10) and _running_step(client, b, 10), what="both jobs running")
        c = client.post("/api/jobs", {**JOB, "name": "urgent", "steps": 40})["id"]
        assert _job(client, c)["status"] == "queued"                 # no room
        assert cli_main(["submit", "--name", "eval", "--model", JOB["model"], "--batch", "8", "--steps", "20",
                         "--gpus", "2", "--after", str(c), "--url", sp.url]) == 0
        d = int(capsys.readouterr().out.split("job ")[1].split()[0])
        assert cli_main(["hold", str(a), "--reason", "urgent run first", "--url", sp.url]) == 0
        assert f"hold of job {a} requested" in capsys.readouterr().out
        wait_until(lambda: _job(client, a)["status"] == "held", what="the hold")
        client.post(f"/api/jobs/{b}/cancel")
        jb = wait_until(lambda: (lambda j: j if j["status"] == "cancelled" else None)(_job(client, b)), what="cancel")
        assert "stopped with a checkpoint" in jb["launch"]["reason"] or jb["launch"]["state"] == "finished"
        assert _job(client, d)["waiting_for"] == [c]
        assert cli_main(["status", str(d), "--url", sp.url]) == 0
        assert f"after job(s) {c}, waiting for {c}" in capsys.readouterr().out
        wait_until(lambda: _job(client, c)["status"] == "finished", what="the urgent job")
        jd = wait_until(lambda: (lambda j: j if j["status"] == "finished" else None)(_job(client, d)),
                   what="the job after it")
        ran = [h for h in jd["history"] if h["to"] == "running"]
        assert ran and ran[0]["at"] >= _job(client, c)["updated_at"] - 1e-6  # it started once c had finished
        time.sleep(3)                                                # rounds with free slots: still held
        held = _job(client, a)
        assert held["status"] == "held" and held["gpus"] == []
        assert "held by the user: urgent run first" in held["history"][-1]["reason"]
        assert "stopped with a checkpoint" in held["launch"]["reason"]
        assert cli_main(["release", str(a), "--url", sp.url]) == 0
        assert f"job {a} released" in capsys.readouterr().out
        with Store(tmp_path / "state.db", readonly=True) as st:
            at_hold = st.launches.latest_checkpoint(a).step
        wait_until(lambda: _running_step(client, a, at_hold + 30), what="the released job")
        with Store(tmp_path / "state.db", readonly=True) as st:
            launch, start, before = resumes(str(tmp_path / "work"), a, st)[-1]
            assert start == before == at_hold                        # nothing past the checkpoint lost
            assert [h.to_status for h in st.jobs.history(a)][-4:] == ["queued", "held", "queued", "running"]
        assert cli_main(["release", str(a), "--url", sp.url]) == 2      # not held: a clear refusal
        assert "not held" in capsys.readouterr().err
        assert sp.terminate() == 0                   # SIGTERM: clean exit
        with Store(tmp_path / "state.db", readonly=True) as st:
            assert st.jobs.get(a).status == "queued" and not st.launches.active() and st.check() == []
            last = st.launches.rows(a)[-1]
            assert last.state == "finished" and "service shutdown" in last.reason
            saved = st.launches.latest_checkpoint(a).step
        assert saved >= at_hold + 30
        sp = _start(tmp_path, port, slots=4)         # the next start resumes it from there
        wait_until(lambda: _running_step(client, a, saved + 1), what="the resumed job")
        with Store(tmp_path / "state.db", readonly=True) as st:
            launch, start, before = resumes(str(tmp_path / "work"), a, st)[-1]
            assert start == before == saved
    finally:
        sp.terminate()


def test_draining_moves_a_job_device_to_device_then_stops_it_with_a_checkpoint_when_no_room_is_left(
        tmp_path, capsys):
    """Two nodes of two slots on this host, through the CLI as an operator would. Draining
    the job's node moves it device to device to the other node, where it keeps training;
    draining that one too leaves no room, so it is stopped with a checkpoint and nothing
    is launched while both are out; returning a node resumes it from that checkpoint."""
    from engine.cli.main import main as cli_main
    port = free_port()
    sp = _start(tmp_path, port, "--local-nodes", "2")
    client = Client(sp.url)

    def on_node(j: dict) -> int | None:
        nodes = {int(g.split(":")[0]) for g in j["gpus"]}
        return nodes.pop() if j["status"] == "running" and len(nodes) == 1 else None

    try:
        a = client.post("/api/jobs", {**JOB, "steps": 3000})["id"]
        first = on_node(wait_until(lambda: _running_step(client, a, 10), what="the job running"))
        other = 1 - first
        assert cli_main(["drain", str(first), "--reason", "fan replaced", "--url", sp.url]) == 0
        assert f"node {first} drained" in capsys.readouterr().out
        moved = wait_until(lambda: (lambda j: j if on_node(j) == other else None)(_job(client, a)),
                      what="the job on the other node")
        assert any("moved device to device" in h["reason"] for h in moved["history"]), moved["history"]
        wait_until(lambda: _checkpointed(client, a, (moved["progress"].get("iterations_done") or 0) + 5),
              what="steps and a checkpoint on the other node")
        # one clock on both sides of the move: the rate before it (wall clock, the 0.05 s step
        # delay included) is what the job makes after it on the same shape, within the
        # move's downtime, not the step's compute alone; samples/s is over the last steps'
        # wall time (below the delay's bound, 8 samples / 0.05 s), not one step's
        now = _job(client, a)
        (entry,) = now["move_ledger"]
        wall = now["progress"]["throughput_samples_per_s"] / JOB["global_batch"]
        assert entry["forced"] and 0.5 < entry["rate_before"] / wall < 2.5, (entry, now["progress"])
        assert now["progress"]["throughput_samples_per_s"] < JOB["global_batch"] / 0.05
        assert cli_main(["drain", str(first), "--url", sp.url]) == 0 and "already" in capsys.readouterr().out
        assert cli_main(["nodes", "--url", sp.url]) == 0
        assert "drained: fan replaced" in (shown := capsys.readouterr().out) and " 2/2 " in shown
        with status_page(sp.url) as page:                # the page marks the node with its reason
            assert page.inner_text(f"#cluster .node.drained[data-node='{first}'] .drain-note") == \
                "drained: fan replaced"
        with urllib.request.urlopen(sp.url + "/metrics", timeout=10) as r:      # what monitoring scrapes
            m = parse_metrics(r.read().decode())
        assert m['arena_gpus_held{gpu_type="cpu"}'] == 2 and m["arena_nodes_drained"] == 1
        assert m['arena_jobs{status="running"}'] == 1 and m['arena_rounds{policy="fcfs"}'] >= 2

        assert cli_main(["drain", str(other), "--url", sp.url]) == 0      # no room left anywhere
        j = wait_until(lambda: (lambda j: j if j["status"] == "queued" else None)(_job(client, a)), what="the eviction")
        assert any(f"node {other} drained" in h["reason"] for h in j["history"])
        time.sleep(3)                                    # rounds every 2 s: nothing goes anywhere
        with Store(tmp_path / "state.db", readonly=True) as st:
            assert st.jobs.get(a).status == "queued" and not st.launches.active()
            saved = st.launches.latest_checkpoint(a).step
        assert cli_main(["undrain", str(first), "--url", sp.url]) == 0
        back = wait_until(lambda: _running_step(client, a, saved + 1), what="the job back on the returned node")
        assert on_node(back) == first
        with Store(tmp_path / "state.db", readonly=True) as st:
            launch, start, before = resumes(str(tmp_path / "work"), a, st)[-1]
            assert start == before == saved and st.check() == []
        assert cli_main(["drain", "7", "--url", sp.url]) == 2
        assert "no node '7'" in capsys.readouterr().err
    finally:
        sp.terminate()


def test_a_node_where_runs_of_different_jobs_keep_failing_is_drained_and_the_jobs_finish_elsewhere(tmp_path):
    """Two nodes of one slot; every run on node 1 is killed (a bad node, as a test can make
    one). Once runs of two different jobs failed there, the service drains node 1 with the
    jobs named in the reason, and the three jobs finish on node 0, each resumed from its
    checkpoints (nothing past one lost); nothing is counted for node 0."""
    port = free_port()
    sp = _start(tmp_path, port, "--local-nodes", "2", "--drain-after-failures", "2", "--max-failures", "3",
                slots=1)
    client = Client(sp.url)
    work = tmp_path / "work"

    def on_node_1() -> tuple[int, int] | None:
        for jid in ids:
            j = _job(client, jid)
            if j["status"] == "running" and j["progress"].get("status") == "running" and \
                    {int(g.split(":")[0]) for g in j["gpus"]} == {1}:
                return jid, j["launch"]["generation"]
        return None

    try:
        # long enough that node 0 is still busy when the next job is placed (a short one
        # could finish first, and the next job would take node 0, the lower id, again)
        ids = [client.post("/api/jobs", {**JOB, "name": f"j{i}", "steps": 150, "gpus": 1})["id"] for i in range(3)]
        killed: list[int] = []
        while len(set(killed)) < 2:
            jid, gen = wait_until(on_node_1, what="a job running on node 1")
            _kill_a_rank(work, jid, gen)
            killed.append(jid)
            wait_until(lambda: _job(client, jid)["launch"]["generation"] > gen or
                       _job(client, jid)["status"] == "queued", what="the failure booked")
        with Store(tmp_path / "state.db", readonly=True) as st:
            drained = wait_until(lambda: st.nodes.drained().get(1), what="node 1 drained")
        assert drained[0].startswith("auto: runs of 2 jobs failed on it") and all(f"{j}" in drained[0] for j in killed)
        for jid in ids:
            wait_until(lambda: _job(client, jid)["status"] == "finished", what=f"job {jid} finished")
        with Store(tmp_path / "state.db", readonly=True) as st:
            assert set(st.nodes.drained()) == {1} and st.check() == []
            for jid in ids:
                rs = resumes(str(work), jid, st)
                assert all(start == saved for _, start, saved in rs), rs      # nothing past a checkpoint lost
            assert any("run failed (1 of 3)" in h.reason for jid in killed for h in st.jobs.history(jid))
        assert "node 1 drained, auto: runs of 2 jobs" in (tmp_path / "serve.log").read_text()
        with urllib.request.urlopen(sp.url + "/metrics", timeout=10) as r:      # what an alert would watch
            m = parse_metrics(r.read().decode())
        assert m['arena_node_failed_jobs{node="1"}'] == 2 and m['arena_node_failed_jobs{node="0"}'] == 0
        assert m["arena_nodes_drained"] == 1
    finally:
        sp.terminate()


def test_scenario_resubmits_the_workload_while_a_fault_is_still_to_come(tmp_path):
    # fcfs never moves a job, so the mid-move fault never fires (nor does what ``until``
    # waits for): the scenario submits the workload again once (repeats=1), then reports
    # both as not reached
    from engine.service.scenario import Submission, run_scenario
    port = free_port()
    args = ["--local-slots", "2", "--policy", "fcfs", "--db", str(tmp_path / "state.db"),
            "--work-dir", str(tmp_path / "work"), "--port", str(port), "--round-interval", "2",
            "--stop-after", "300"]
    job = {"name": "short", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 3}
    res = run_scenario(args, f"http://127.0.0.1:{port}", tmp_path / "serve.log", [Submission(0, job)],
                       faults=("mid-move:1",), repeats=1, timeout_s=300, until=lambda: "a move")
    assert [s.job["name"] for s in res.submitted] == ["short", "short-r1"]
    assert res.unfired == ["mid-move:1", "a move"] and res.kills == []
    with Store(str(tmp_path / "state.db"), readonly=True) as st:
        assert [(j.name, j.status) for j in st.jobs.rows()] == [("short", "finished"), ("short-r1", "finished")]


def test_restart_stops_ranks_left_training_by_an_interrupted_device_to_device_move(tmp_path):
    # the first half of a device-to-device move, journaled for real (the launch ends in the
    # store, its ranks keep training), then the service "dies" before the second half: the
    # next start finds the ranks, has them checkpoint and stop, and the job is queued with
    # its checkpoint
    from engine.service.jobspec import JobSpec
    from engine.service.journal import JournaledExecutor
    from instances.allocation import Allocation
    from launcher.launch import live_rank_pids, stop_detached
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
    from tests.test_engine_helpers import grid

    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    store = Store(db)
    spec = JobSpec.from_dict({"name": "moving", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 400})
    jid = store.jobs.submit(spec)
    mpi = MpiExecutor(MpiExecutorConfig(work_dir=work, checkpoint_interval_s=1.0, step_delay_s=0.05))
    journal = JournaledExecutor(mpi, store)
    journal.launch(spec.to_job(str(jid), 0.0), Allocation(grid("cpu", 1, 2), ((0, 0), (0, 1))), None, 0.0)
    run_dir = mpi.run_dir(str(jid))
    try:
        _interrupted_move_then_restart(store, mpi, journal, jid, db, work, run_dir)
    finally:                                          # whatever failed, no rank outlives the test
        if live_rank_pids(run_dir):
            stop_detached(run_dir, None, 10)


def _interrupted_move_then_restart(store, mpi, journal, jid, db, work, run_dir):
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup
    from launcher.launch import live_rank_pids

    wait_until(lambda: journal.progress(str(jid)).last_checkpoint_iteration >= 2, what="a checkpoint")
    journal.release(str(jid), 0.0)
    assert mpi.released_path(str(jid)) == "d2d"
    assert live_rank_pids(run_dir), "the ranks keep training through the first half of the move"
    assert store.jobs.get(jid).status == "queued" and "device to device" in store.launches.rows(jid)[-1].reason
    store.close()                                     # the service dies here: nothing else is told

    logs: list[str] = []
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=work, stop_timeout_s=30), log=logs.append)
    try:
        svc.recover()
        assert not live_rank_pids(run_dir), logs
        assert any("still training" in m for m in logs), logs
        assert svc.store.jobs.get(jid).status == "queued" and svc.store.check() == []
        ck = svc.store.launches.latest_checkpoint(jid)
        assert ck is not None and ck.step >= 2
        assert svc.loop.state.jobs[str(jid)].iterations_done >= ck.step     # adopted from its checkpoint
    finally:
        svc.shutdown()
