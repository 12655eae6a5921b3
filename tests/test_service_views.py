"""What the page and the API show of many jobs: loss curves read once and then only what
was appended (``engine/service/losses.py``), the page's list bounded to the jobs not
ended and the last to end, and the page saying so in a real browser."""
from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as hs

from engine.service.api import ApiContext, create_app
from engine.service.jobspec import JobSpec
from engine.service.losses import LossLog, merged
from engine.service.store import Store
from engine.service.views import job_view, loss_curve, state_view
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from launcher.launch import read_results
from tests.browser import status_page

CLUSTER = ClusterSpec((NodeGroup("cpu", 1, 4),), "local-4")


def write(path: Path, records: list, raw: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + raw)


def test_a_results_file_is_read_once_then_only_what_was_appended(tmp_path, monkeypatch):
    run = tmp_path / "launch_1"
    f = run / "results.jsonl"
    log = LossLog()
    assert [len(a) for a in log.points(run)] == [0, 0, 0]                 # no file yet
    write(f, [{"step": 1, "loss": 2.0, "time": 0.5}, {"event": "no loss"}, {"step": 2, "loss": 1.5}],
          raw='{"step": 3, "lo')                                          # a line being written
    steps, loss, times = log.points(run)
    assert steps.tolist() == [1, 2] and loss.tolist() == [2.0, 1.5] and times[0] == 0.5 and times[1] != times[1]
    write(f, [], raw='ss": 1.25}\n')                                      # the line completed
    assert log.points(run)[1].tolist() == [2.0, 1.5, 1.25]
    reads = []
    real_open = open

    def counting_open(path, mode="r", *a, **k):
        reads.append(str(path))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr("builtins.open", counting_open)
    assert log.points(run)[0].tolist() == [1, 2, 3] and reads == []      # unchanged: not opened again
    monkeypatch.undo()
    f.write_text(json.dumps({"step": 7, "loss": 9.0}) + "\n")              # shorter: read again from its start
    assert log.points(run)[0].tolist() == [7]
    write(f, [], raw="not json\n")
    write(f, [{"step": 8, "loss": 8.0}])
    assert log.points(run)[0].tolist() == [7] == [r["step"] for r in read_results(run)]   # as read_jsonl: stops


def test_the_log_forgets_the_least_recently_read_files_beyond_its_points(tmp_path):
    log = LossLog(max_points=5)
    dirs = [tmp_path / f"launch_{i}" for i in range(3)]
    for d in dirs:
        write(d / "results.jsonl", [{"step": s, "loss": 1.0} for s in range(3)])
        log.points(d)
    assert log.points_held == 3 and log.files_held == (str(dirs[2] / "results.jsonl"),)   # 3 + 3 > 5: older dropped
    assert log.points(dirs[0])[0].tolist() == [0, 1, 2]                    # forgotten, read again when asked
    with pytest.raises(ValueError):
        LossLog(max_points=-1)


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.lists(hs.tuples(hs.integers(0, 30), hs.floats(0, 10, allow_nan=False)), max_size=12),
                min_size=1, max_size=4))
def test_merged_curve_is_the_last_loss_trained_per_step(tmp_path_factory, launches):
    """Against the plain definition: every record of every launch in order into a dict
    by step (a later one replaces an earlier), sorted by step."""
    root = tmp_path_factory.mktemp("merge")
    dirs = []
    for g, recs in enumerate(launches, start=1):
        d = root / f"launch_{g}"
        d.mkdir()
        write(d / "results.jsonl", [{"step": s, "loss": x, "time": float(g)} for s, x in recs])
        dirs.append((g, d))
    ref: dict[int, tuple[float, int]] = {}
    for g, d in dirs:
        for r in read_results(d):
            ref[r["step"]] = (r["loss"], g)
    steps, loss, times, launch = merged(LossLog(), dirs)
    assert steps.tolist() == sorted(ref)
    assert [(x, g) for x, g in zip(loss.tolist(), launch.tolist())] == [ref[s] for s in sorted(ref)]
    assert (times == launch).all()


def finished_jobs(db: Path, work: Path, n: int, steps: int = 40) -> list[int]:
    spec = JobSpec.from_dict({"name": "done", "model": "tiny-gpt__2L", "global_batch": 8, "steps": steps})
    ids = []
    with Store(db) as st:
        for i in range(n):
            jid = st.jobs.submit(spec)
            gen = st.launches.record_intent(jid, {"dp": 1, "tp": 1, "pp": 1}, ["0:0"])
            st.launches.mark(jid, gen, "started", pid_info={"pid": 1})
            st.jobs.set_status(jid, "running", "test")
            write(work / str(jid) / f"launch_{gen}" / "results.jsonl",
                  [{"step": s, "loss": 3.0 - s / steps, "time": float(s)} for s in range(1, steps + 1)])
            st.launches.mark(jid, gen, "finished")
            st.jobs.set_status(jid, "finished", "test")
            ids.append(jid)
    return ids


def test_state_lists_the_jobs_not_ended_and_the_last_to_end(tmp_path):
    db, work = tmp_path / "state.db", tmp_path / "work"
    done = finished_jobs(db, work, 4)
    with Store(db) as st:
        waiting = st.jobs.submit(JobSpec.from_dict({"name": "later", "model": "tiny-gpt__2L", "global_batch": 8,
                                               "steps": 5, "after": [done[0]]}))
        view = state_view(st, str(work), CLUSTER, ended=2)
        assert [j["id"] for j in view["jobs"]] == done[2:] + [waiting]
        assert (view["ended_total"], view["ended_shown"], view["queue"]) == (4, 2, [waiting])
        assert view["jobs"][-1]["waiting_for"] == [] and view["jobs"][-1]["after"] == [done[0]]
        assert len(view["jobs"][0]["loss_curve"]) <= 60 + 1 and view["jobs"][0]["loss"] == 2.0
        every = state_view(st, str(work), CLUSTER, ended=10)
        assert [j["id"] for j in every["jobs"]] == done + [waiting] and every["ended_shown"] == 4
        # the curve in a job's own view: at most about LOSS_POINTS, its last point the last step
        full = loss_curve(str(work), st.launches.rows(done[0]))
        assert len(full) == 40 and full[-1] == {"step": 40, "loss": 2.0, "time": 40.0, "launch": 1}
    client = TestClient(create_app(ApiContext(str(db), str(work), CLUSTER, "arena")))
    r = client.get("/api/state", params={"ended": 1})
    assert r.status_code == 200 and [j["id"] for j in r.json()["jobs"]] == done[3:] + [waiting]
    for bad in (-1, 10**9):
        r = client.get("/api/state", params={"ended": bad})
        assert r.status_code == 422 and r.json()["field"] == "ended"
    jobs = client.get("/api/jobs").json()
    assert [j["id"] for j in jobs] == done + [waiting] and all(j["loss_curve"] == [] for j in jobs)
    assert [j["id"] for j in client.get("/api/jobs", params={"status": "queued"}).json()] == [waiting]
    assert client.get("/api/jobs", params={"status": "held"}).json() == []
    r = client.get("/api/jobs", params={"status": "done"})
    assert r.status_code == 422 and r.json()["field"] == "status" and "known: queued, running" in r.json()["error"]
    assert [j["id"] for j in client.get("/api/jobs", params={"last": 2}).json()] == [done[3], waiting]
    assert [j["id"] for j in client.get("/api/jobs", params={"last": 2, "status": "finished"}).json()] == done[2:]
    for bad in (0, 10**9):
        r = client.get("/api/jobs", params={"last": bad})
        assert r.status_code == 422 and r.json()["field"] == "last"
    with Store(db) as st:
        with pytest.raises(InputError):
            st.jobs.rows(last=2, ids=[1])
    assert jobs[0]["loss"] == 2.0 and client.get(f"/api/jobs/{done[0]}").json()["loss_curve"] == full


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app) -> Iterator[int]:
    """``app`` served on 127.0.0.1 (a free port, yielded) by uvicorn in a thread, for at
    most 400 requests; stopped on leaving."""
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           limit_max_requests=400, timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_page_lists_the_last_ended_jobs_and_shows_one_in_detail(tmp_path):
    """A real browser on the API (no scheduler; its liveness given as a dict the test
    changes): 53 ended jobs and one queued; the page lists the queued one and the last
    50 to end, and says so; it shows the scheduler's phase, in red once stalled. Clicking a job's row shows
    its history, its loss curve and its latest launch's output, and the address names the
    job, so that the same view opens from a link."""
    db, work = tmp_path / "state.db", tmp_path / "work"
    done = finished_jobs(db, work, 53, steps=5)
    (work / str(done[-1]) / "launch_1" / "stderr.log").write_text("rank 0: step 5 <done>\n")
    (work / str(done[-1]) / "launch_1" / "stdout.log").write_text("")
    with Store(db) as st:
        queued = st.jobs.submit(JobSpec.from_dict({"name": "q", "model": "tiny-gpt__2L", "global_batch": 8,
                                                   "steps": 5}))
    live = {"phase": "round 7", "since_s": 12.0, "stalled": False}
    app = create_app(ApiContext(str(db), str(work), CLUSTER, "arena", local_hosts=frozenset({"127.0.0.1"}),
                                liveness=lambda: dict(live)))
    with serving(app) as port, status_page(f"http://127.0.0.1:{port}") as page:
        rows = page.locator("#jobs tbody tr")
        assert rows.count() == 51
        assert page.locator(f"#jobs tbody tr[data-job='{queued}']").count() == 1
        assert page.locator("#jobs tbody tr[data-job='3']").count() == 0          # among the first to end
        assert page.locator("#ended").inner_text() == \
            "ended jobs: the last 50 of 53 to end are listed (every job: /api/jobs, arena jobs)"
        assert page.locator("#scheduler").inner_text() == "scheduler: round 7, last sign of life 12 s ago"
        live.update(since_s=700.0, stalled=True)                          # the next poll shows the stall
        page.wait_for_selector("#scheduler.stalled", timeout=10_000)
        assert page.locator("#scheduler").inner_text().endswith("700 s ago — stalled (health answers 503)")
        assert page.locator("#job-detail").is_hidden()
        page.locator(f"#jobs tbody tr[data-job='{done[-1]}']").click()
        page.wait_for_selector(f"#job-detail[data-job='{done[-1]}']", state="visible", timeout=30_000)
        assert page.locator("#job-title").inner_text() == f"job {done[-1]}: done (finished)"
        assert page.locator("#job-stderr").inner_text().strip() == "rank 0: step 5 <done>"   # text, not markup
        assert page.locator("#job-stdout").inner_text() == "(empty)"
        assert page.locator("#job-history tbody tr").count() == 3                      # queued, running, finished
        assert page.locator("#job-curve svg").get_attribute("data-points") == "5"
        assert page.locator("#job-curve .muted").inner_text() == \
            "loss 2.8000 at step 1 → 2.0000 at step 5 (5 points shown)"
        assert page.evaluate("location.hash") == f"#job={done[-1]}"
        assert page.locator("#jobs tbody tr.selected").get_attribute("data-job") == str(done[-1])
        page.goto(f"http://127.0.0.1:{port}/#job={queued}")                              # a link to a job
        page.reload()
        page.wait_for_selector(f"#job-detail[data-job='{queued}']", state="visible", timeout=30_000)
        assert "(queued)" in page.locator("#job-title").inner_text()
        assert page.locator("#job-curve").inner_text() == "no loss recorded yet"
        assert page.locator("#job-stderr").inner_text() == "(empty)"


class Clock:
    """The store's clock: one second later at every change (times in commit order)."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def tiny(name: str, **kw) -> JobSpec:
    return JobSpec.from_dict({"name": name, "model": "tiny-gpt__2L", "global_batch": 8, "steps": 5, **kw})


def launch(st: Store, jid: int, gpus: list[str]) -> int:
    gen = st.launches.record_intent(jid, {"dp": len(gpus), "tp": 1, "pp": 1, "gpu_type": "cpu", "nodes": 1,
                                        "gpus_per_node": len(gpus)}, gpus)
    st.launches.mark(jid, gen, "started", pid_info={"pid": 1})
    st.jobs.set_status(jid, "running", "test")
    return gen


def test_the_view_says_why_each_queued_job_waits(tmp_path):
    """Each queued job's ``waits``, from what the store knows: a cancel or hold asked for,
    a job it runs after, no round since it was queued, a failed run's backoff, the room
    left against what it asks for (drained nodes named), else the last round's choice."""
    two = ClusterSpec((NodeGroup("cpu", 2, 2),), "two")
    work = str(tmp_path / "work")
    with Store(tmp_path / "s.db", clock=Clock()) as st:
        big = st.jobs.submit(tiny("big"))
        launch(st, big, ["0:0", "0:1"])
        after = st.jobs.submit(tiny("after", after=[big]))
        held = st.jobs.submit(tiny("held"))
        st.jobs.request_hold(held, "inspect")
        gone = st.jobs.submit(tiny("gone"))
        st.jobs.request_cancel(gone)
        wide = st.jobs.submit(tiny("wide", gpus=4))
        failed = st.jobs.submit(tiny("failed"))
        gen = launch(st, failed, ["1:0"])
        st.launches.mark(failed, gen, "failed", reason="boom")
        st.jobs.set_status(failed, "queued", "run failed (1 of 3); resumes from step 0: boom")
        idle = st.jobs.submit(tiny("idle"))
        a100 = st.jobs.submit(tiny("a100", gpu_type="a100"))
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1, decisions={"grids": {}})
        late = st.jobs.submit(tiny("late"))
        view = state_view(st, work, two)
        waits = {j["id"]: j["waits"] for j in view["jobs"]}
        assert view["queue"] == [after, held, gone, wide, failed, idle, a100, late]
        assert waits == {
            big: None,
            after: f"runs after job {big}, not finished yet",
            held: "hold requested: it is set aside at the next round",
            gone: "cancel requested: it is cancelled at the next round",
            wide: "no room: it asks for 4 GPUs, 2 free now",
            failed: "its last run failed: it is offered to the policy again after the failure backoff "
                    "(--failure-backoff, doubling with each failure)",
            idle: "not placed by round 1 with 2 GPUs free now: the policy chose other jobs' grids, or none of its "
                  "grids fits the free GPUs",
            a100: "asks for a100-40gb GPUs, which cluster 'two' lacks (it has cpu)",
            late: "waits for the next round"}
        st.nodes.drain(1, "disk")
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1, decisions={"grids": {}})
        waits = {j["id"]: j["waits"] for j in state_view(st, work, two)["jobs"]}
        assert waits[idle] == "no room: every GPU in service is held by other jobs; 2 on drained nodes"
        assert waits[wide] == "no room: it asks for 4 GPUs, 0 free now; 2 on drained nodes"
        assert waits[late] == waits[idle]
        assert job_view(st, work, idle, cluster=two)["waits"] == waits[idle]     # one job's view: the same
        assert job_view(st, work, idle)["waits"] == "not placed by round 2"      # (no cluster given)


class StubMpi:
    """The launcher's side of a move's first half, as ``JournaledExecutor.release`` asks
    it (the journal and the store are the real ones)."""

    def __init__(self, path: str):
        self.path, self.released = path, None

    def release(self, job_id: str, now_s: float, *, target=None) -> None:
        self.released = self.path

    def released_path(self, job_id: str) -> str | None:
        return self.released

    def progress(self, job_id: str):
        from engine.core.executor import JobProgress
        return JobProgress(job_id, 3.0, True, last_checkpoint_iteration=0.0)


@pytest.mark.parametrize("path", ["d2d", "storage"])
def test_a_job_in_the_middle_of_a_move_is_shown_moving_not_queued(tmp_path, path):
    """Between the two halves of a move the store calls the job queued (its launch
    ended); the view shows it moving (device to device: its ranks still train) until a
    later round, and leaves it out of the queue."""
    from engine.service.journal import JournaledExecutor
    from launcher.telemetry import write_progress
    work = tmp_path / "work"
    with Store(tmp_path / "s.db", clock=Clock()) as st:
        jid = st.jobs.submit(tiny("mover"))
        gen = launch(st, jid, ["0:0"])
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1, decisions={"grids": {str(jid): "x"}})
        journal = JournaledExecutor(StubMpi(path), st)       # type: ignore[arg-type]
        journal.generation[str(jid)] = gen
        journal.release(str(jid), 0.0)
        write_progress(work / str(jid) / "progress.json", status="running" if path == "d2d" else "stopped",
                       iterations_done=3, steps_total=5)
        view = state_view(st, str(work), CLUSTER)
        (job,) = view["jobs"]
        assert job["status"] == "queued" and job["state"] == "moving" and view["queue"] == []
        assert job["moving"]["path"] == ("device to device" if path == "d2d" else "through storage")
        assert job["moving"]["ranks_training"] is (path == "d2d") and job["waits"] is None
        if path == "d2d":                                  # ranks stopped (a restart): not moving any more
            write_progress(work / str(jid) / "progress.json", status="stopped", iterations_done=3, steps_total=5)
            assert job_view(st, str(work), jid)["state"] == "queued"
            write_progress(work / str(jid) / "progress.json", status="running", iterations_done=3, steps_total=5)
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1, decisions={"grids": {}})
        job = job_view(st, str(work), jid, cluster=CLUSTER)          # a round since: the move is over
        assert (job["state"], job["moving"]) == ("queued", None) and job["waits"].startswith("not placed by round 2")


def test_a_move_is_summed_up_by_one_function_for_the_cli_and_the_page(tmp_path):
    from engine.cli.commands.service import move_line
    from engine.core.move_ledger import MoveEntry
    from engine.service.views import move_summary
    with Store(tmp_path / "s.db") as st:
        jid = st.jobs.submit(tiny("m"))
        e = MoveEntry(str(jid), 100.0, False, "cpu:1x1:pp1", "cpu:1x2:pp1", 2.0, 2.1, 3.9, 8.0, 40.0,
                      paid_back_s=30.0)
        e.ended_s, e.end, e.iterations_after = 200.0, "moved again", 260.0
        st.moves.record([e])
        (m,) = job_view(st, str(tmp_path), jid)["move_ledger"]
    s = m["summary"]
    assert s == move_summary({k: v for k, v in m.items() if k != "summary"})
    assert s["expected_x"] == pytest.approx(3.9 / 2.1) and s["made_x"] == pytest.approx(260 / 100 / 2.0)
    assert (s["expected"], s["price"], s["made"], s["payback"]) == (
        "expected 1.86x", "priced 8 s down", "made 1.30x the rate before until moved again",
        "paid for itself after 30 s")
    assert move_line(m).split(" ", 1)[1] == s["text"] == \
        "cpu:1x1:pp1 -> cpu:1x2:pp1: expected 1.86x, priced 8 s down; made 1.30x the rate before until moved " \
        "again; paid for itself after 30 s"


def page_jobs(db: Path, work: Path) -> dict[str, int]:
    """What the page test shows: a job mid-move (device to device, its ranks training), a
    running job with a move in its ledger, and one queued with no room left (its id 3)."""
    from engine.core.move_ledger import MoveEntry
    from engine.service.journal import JournaledExecutor
    from launcher.telemetry import write_progress
    with Store(db, clock=Clock()) as st:
        mover = st.jobs.submit(tiny("mover"), user="alice")
        gen = launch(st, mover, ["0:0"])
        runner = st.jobs.submit(tiny("runner"), user="operator")
        waiting = st.jobs.submit(tiny("waiting"), user="alice")
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1, decisions={"grids": {}})
        journal = JournaledExecutor(StubMpi("d2d"), st)           # type: ignore[arg-type]
        journal.generation[str(mover)] = gen
        journal.release(str(mover), 0.0)
        write_progress(work / str(mover) / "progress.json", status="running", iterations_done=3, steps_total=5)
        launch(st, runner, ["0:0", "0:1", "0:2", "0:3"])
        e = MoveEntry(str(runner), time.time() - 300, False, "cpu:1x2:pp1", "cpu:1x4:pp1", 2.0, 2.1, 3.9, 8.0,
                      40.0, paid_back_s=30.0)
        e.ended_s, e.end, e.iterations_after = e.time_s + 100, "moved again", 260.0
        st.moves.record([e])
    return {"mover": mover, "runner": runner, "waiting": waiting}


def test_the_page_shows_moves_waits_and_the_queue_as_a_person_reads_them(tmp_path):
    """In a real browser, with a token given once in the address: the queue counts its jobs
    and names each with why it waits; a job mid-move reads "moving device to device", not
    queued; a job's detail shows its wait or move, who submitted it, and each move's
    expected, made and payback (the words of ``arena status ID``). The token leaves the
    address and survives a reload."""
    from engine.service.auth import Tokens
    db, work = tmp_path / "state.db", tmp_path / "work"
    ids = page_jobs(db, work)
    secret = "page-Token-0123456789"
    app = create_app(ApiContext(str(db), str(work), CLUSTER, "arena", tokens=Tokens.single(secret)))
    with serving(app) as port, status_page(f"http://127.0.0.1:{port}", f"?token={secret}") as page:
        assert page.evaluate("location.search") == ""                       # the token left the address
        assert page.locator("#queue-count").inner_text() == "1 job queued"
        assert page.locator("#queue li").all_inner_texts() == [
            f"job {ids['waiting']} (waiting): no room: every GPU in service is held by other jobs"]
        mover = page.locator(f"#jobs tbody tr[data-job='{ids['mover']}'] td.status")
        assert mover.inner_text() == "moving device to device (its ranks train until they move)"
        assert mover.get_attribute("class") == "status status-moving"
        waiting = page.locator(f"#jobs tbody tr[data-job='{ids['waiting']}'] td.status")
        assert waiting.inner_text() == "queued\nno room: every GPU in service is held by other jobs"
        page.locator(f"#jobs tbody tr[data-job='{ids['runner']}']").click()
        page.wait_for_selector(f"#job-detail[data-job='{ids['runner']}']", state="visible", timeout=30_000)
        assert page.locator("#job-summary").inner_text().endswith(" · submitted by operator")
        assert page.locator("#job-moves").is_visible()
        cells = page.locator("#job-moves tbody tr td").all_inner_texts()
        assert cells[1:] == ["cpu:1x2:pp1 → cpu:1x4:pp1", "expected 1.86x, priced 8 s down",
                             "made 1.30x the rate before until moved again", "paid for itself after 30 s"]
        page.locator(f"#jobs tbody tr[data-job='{ids['mover']}']").click()
        page.wait_for_selector(f"#job-detail[data-job='{ids['mover']}']", state="visible", timeout=30_000)
        assert page.locator("#job-title").inner_text() == f"job {ids['mover']}: mover (moving)"
        assert page.locator("#job-waits").inner_text() == \
            "moving device to device: its ranks keep training until they move"
        assert page.locator("#job-moves").is_hidden()
        page.locator(f"#jobs tbody tr[data-job='{ids['waiting']}']").click()
        page.wait_for_selector(f"#job-detail[data-job='{ids['waiting']}']", state="visible", timeout=30_000)
        assert page.locator("#job-waits").inner_text() == "waits: no room: every GPU in service is held by other jobs"
        page.reload()                                                       # the token kept for this tab
        page.wait_for_selector("body[data-loaded='1']", timeout=30_000)
        assert page.locator("#queue-count").inner_text() == "1 job queued"
        page.evaluate("sessionStorage.clear()")                             # a tab without it: says what to do
        page.reload()
        page.wait_for_function("document.getElementById('updated').textContent.includes('token')", timeout=30_000)
        assert page.locator("#updated").inner_text().startswith(
            "this service needs a token: open this page as /?token=YOUR-TOKEN")


def smaller_jobs(db: Path, work: Path) -> dict[str, int]:
    """A job that asked for 2 GPUs runs on 1, the last round saying why; it made a step
    every 0.5 s for 40 s; a job finished in launches this database does not know (its
    only results stop at step 3 of 5)."""
    from launcher.telemetry import write_progress
    now = time.time()
    with Store(db, clock=Clock()) as st:
        small = st.jobs.submit(tiny("small", gpus=2))
        gen = launch(st, small, ["1:0"])
        why = "the policy's estimate (analytic): 9.1 it/s on cpu:1x1:pp1 against 8.4 it/s on cpu:1x2:pp1"
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.1,
                         decisions={"grids": {str(small): "cpu:1x1:pp1"}, "why": {str(small): why}})
        write(work / str(small) / f"launch_{gen}" / "results.jsonl",
              [{"step": k, "loss": 5.0 - k / 100, "iteration_time_s": 0.01, "time": now - 40 + k / 2}
               for k in range(1, 81)])
        write_progress(work / str(small) / "progress.json", status="running", iterations_done=80, steps_total=500,
                       iteration_time_s=0.01)
        old = st.jobs.submit(tiny("old"))
        g = launch(st, old, ["0:0"])
        st.launches.mark(old, g, "finished", reason="test")
        st.jobs.set_status(old, "finished", "training finished")
        write(work / str(old) / f"launch_{g}" / "results.jsonl",
              [{"step": k, "loss": 4.0 + k, "time": now - 100 + k} for k in (1, 2, 3)])
        write_progress(work / str(old) / "progress.json", status="finished", iterations_done=5, steps_total=5)
    return {"small": small, "old": old}


def test_a_job_smaller_than_asked_its_windowed_rate_and_an_older_steps_loss_in_the_view_cli_and_page(
        tmp_path, capsys):
    """What one step's compute time said (800 samples/s here) is not the rate: the view
    gives the steps of the last 30 s on the wall clock (2 steps/s x batch 8 = 16) and says
    the window; a running job on fewer GPUs than asked says why (the last round's
    reason); a loss older than the job's progress names its step. The same in ``arena
    status`` and, in a real browser, on the page, whose node grid names the hosts."""
    from engine.cli.main import main as cli_main
    from engine.service.views import RATE_WINDOW_S
    hosts = ClusterSpec((NodeGroup("cpu", 2, 2, hosts=("h-one", "h-two")),), "two-hosts")
    db, work = tmp_path / "state.db", tmp_path / "work"
    ids = smaller_jobs(db, work)
    with Store(db, readonly=True) as st:
        small = job_view(st, str(work), ids["small"], cluster=hosts)
        old = job_view(st, str(work), ids["old"], cluster=hosts)
    assert small["progress"]["throughput_samples_per_s"] == pytest.approx(16.0, rel=0.02)
    assert small["progress"]["throughput_window_s"] == pytest.approx(RATE_WINDOW_S, abs=0.6)
    assert small["smaller"] == ("runs on 1 of the 2 GPUs it asked for: the policy's estimate (analytic): 9.1 it/s "
                                "on cpu:1x1:pp1 against 8.4 it/s on cpu:1x2:pp1")
    assert (old["loss"], old["loss_step"], old["progress"]["throughput_samples_per_s"]) == (7.0, 3, None)
    app = create_app(ApiContext(str(db), str(work), hosts, "arena"))
    with serving(app) as port:
        url = f"http://127.0.0.1:{port}"
        assert cli_main(["status", "--url", url]) == 0
        out = capsys.readouterr().out
        assert " 16.0 " in out and "7.0000@3" in out, out
        assert f"samples/s: a running job's steps over its last {RATE_WINDOW_S:g} s (wall clock)" in out
        assert cli_main(["status", str(ids["small"]), "--url", url]) == 0
        assert f"smaller: {small['smaller']}" in capsys.readouterr().out
        with status_page(url) as page:
            assert page.locator("#rate-head").inner_text() == f"samples/s (last {RATE_WINDOW_S:g} s)"
            row = page.locator(f"#jobs tbody tr[data-job='{ids['small']}']")
            assert row.locator("td.num").nth(1).inner_text() == "16.0"
            assert row.locator("td.status .smaller").inner_text() == small["smaller"]
            assert page.locator(f"#jobs tbody tr[data-job='{ids['old']}'] td.num").nth(2).inner_text() == "7.0000@3"
            assert [page.locator(f"#cluster .node[data-node='{n}'] .label").inner_text() for n in (0, 1)] == \
                ["node 0 h-one (cpu)", "node 1 h-two (cpu)"]
