"""What the page and the API show of many jobs: loss curves read once and then only what
was appended (``engine/service/losses.py``), the page's list bounded to the jobs not
ended and the last to end, and the page saying so in a real browser."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as hs

from engine.service.api import ApiContext, create_app
from engine.service.jobspec import JobSpec
from engine.service.losses import LossLog, merged
from engine.service.store import Store
from engine.service.views import loss_curve, state_view
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
    assert log._held == 3 and list(log._files) == [str(dirs[2] / "results.jsonl")]   # 3 + 3 > 5: older dropped
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
            jid = st.submit(spec)
            gen = st.record_launch_intent(jid, {"dp": 1, "tp": 1, "pp": 1}, ["0:0"])
            st.mark_launch(jid, gen, "started", pid_info={"pid": 1})
            st.set_status(jid, "running", "test")
            write(work / str(jid) / f"launch_{gen}" / "results.jsonl",
                  [{"step": s, "loss": 3.0 - s / steps, "time": float(s)} for s in range(1, steps + 1)])
            st.mark_launch(jid, gen, "finished")
            st.set_status(jid, "finished", "test")
            ids.append(jid)
    return ids


def test_state_lists_the_jobs_not_ended_and_the_last_to_end(tmp_path):
    db, work = tmp_path / "state.db", tmp_path / "work"
    done = finished_jobs(db, work, 4)
    with Store(db) as st:
        waiting = st.submit(JobSpec.from_dict({"name": "later", "model": "tiny-gpt__2L", "global_batch": 8,
                                               "steps": 5, "after": [done[0]]}))
        view = state_view(st, str(work), CLUSTER, ended=2)
        assert [j["id"] for j in view["jobs"]] == done[2:] + [waiting]
        assert (view["ended_total"], view["ended_shown"], view["queue"]) == (4, 2, [waiting])
        assert view["jobs"][-1]["waiting_for"] == [] and view["jobs"][-1]["after"] == [done[0]]
        assert len(view["jobs"][0]["loss_curve"]) <= 60 + 1 and view["jobs"][0]["loss"] == 2.0
        every = state_view(st, str(work), CLUSTER, ended=10)
        assert [j["id"] for j in every["jobs"]] == done + [waiting] and every["ended_shown"] == 4
        # the curve in a job's own view: at most about LOSS_POINTS, its last point the last step
        full = loss_curve(str(work), st.launches(done[0]))
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
            st.jobs(last=2, ids=[1])
    assert jobs[0]["loss"] == 2.0 and client.get(f"/api/jobs/{done[0]}").json()["loss_curve"] == full


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_page_lists_the_last_ended_jobs_and_shows_one_in_detail(tmp_path):
    """A real browser on the API (no scheduler; its liveness given as a dict the test
    changes): 53 ended jobs and one queued; the page lists the queued one and the last
    50 to end, and says so; it shows the scheduler's phase, in red once stalled. Clicking a job's row shows
    its history, its loss curve and its latest launch's output, and the address names the
    job, so that the same view opens from a link."""
    import uvicorn
    db, work = tmp_path / "state.db", tmp_path / "work"
    done = finished_jobs(db, work, 53, steps=5)
    (work / str(done[-1]) / "launch_1" / "stderr.log").write_text("rank 0: step 5 <done>\n")
    (work / str(done[-1]) / "launch_1" / "stdout.log").write_text("")
    with Store(db) as st:
        queued = st.submit(JobSpec.from_dict({"name": "q", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 5}))
    port = free_port()
    live = {"phase": "round 7", "since_s": 12.0, "stalled": False}
    app = create_app(ApiContext(str(db), str(work), CLUSTER, "arena", local_hosts=frozenset({"127.0.0.1"}),
                                liveness=lambda: dict(live)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           limit_max_requests=400, timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with status_page(f"http://127.0.0.1:{port}") as page:
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
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()
