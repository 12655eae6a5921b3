"""End to end: ``arena serve --local-slots 4`` with the ``arena`` policy runs five real
torch jobs of three model families (one given as a Hugging Face-style config.json),
submitted at different times; the policy moves running jobs as others arrive and
finish (really executed: stop, checkpoint, relaunch on another plan, reshard); every
job finishes with the loss trajectory of the same job trained uninterrupted in one
process; ``arena status`` and the status page (in a real headless Chromium) agree with
the database.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.service.scenario import (
    LOSS_TOL,
    ServiceProcess,
    demo_jobs,
    demo_serve_args,
    format_report,
    free_port,
    job_report,
    loss_deviation,
    resumes,
    run_scenario,
)
from engine.service.store import Store
from tests.browser import status_page

pytestmark = pytest.mark.slow

JOBS = demo_jobs()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    result = run_scenario(demo_serve_args(tmp, port), url, tmp / "serve.log", JOBS, timeout_s=900,
                          progress=lambda m: print(m, file=sys.stderr), repeats=2,
                          until=lambda: None if d2d_moves(tmp / "state.db") else "a device-to-device move")
    rows = job_report(str(tmp / "state.db"), str(tmp / "work"))
    print("\n" + format_report(rows), file=sys.stderr)
    return {"tmp": tmp, "url": url, "port": port, "ids": result.ids, "rows": rows, "result": result}


def d2d_moves(db) -> list[dict]:
    """The device-to-device moves that reached a step after them, as the service measured them."""
    with Store(str(db), readonly=True) as st:
        return [m.reconfig for j in st.jobs.rows() for m in st.launches.measurements(j.id)
                if m.reconfig.get("device_to_device") == 1]


def test_every_job_finishes_and_running_jobs_are_moved(run):
    rows = run["rows"]
    # (the workload is submitted again, at most twice, if no move went device to device:
    # whether one does depends on the policy's decisions, hence on measured timings)
    assert not run["result"].unfired, run["result"].unfired
    assert len(rows) == len(run["result"].submitted) and all(r["status"] == "finished" for r in rows), \
        format_report(rows)
    moved = [r for r in rows if r["moves"] > 0]
    assert moved, "the policy never moved a running job:\n" + format_report(rows)
    # a move really changed the plan (a reshard, not a restart on the same layout)
    assert any(len(set(r["plans"])) > 1 for r in moved), format_report(rows)
    with Store(str(run["tmp"] / "state.db"), readonly=True) as st:
        assert st.check() == []
        assert not st.launches.active()
        # the move ledger has one entry per move, each closed, with the decision's estimates
        for r in rows:
            ledger = st.moves.rows(r["id"])
            assert len(ledger) == r["moves"], (r["name"], ledger)
            assert all(m["ended_at"] is not None and m["est_rate_after"] and m["price_s"] is not None
                       for m in ledger), ledger
        # every move that reached its first step is measured in the store
        moves = [m for r in rows for m in st.launches.measurements(r["id"]) if "move_total_s" in m.reconfig]
        assert moves and all(m.reconfig["move_total_s"] > 0 for m in moves)
        # one host, running jobs: moves go device to device, the new launch record
        # continuing its predecessor's run folder and mpiexec; one that falls back (the job
        # ended first, or the move failed) relaunches in a folder of its own
        # (a data-parallel shrink moves no bytes: the surviving ranks hold the whole state)
        assert all(m["bytes_moved"] >= 0 and m["move_total_s"] > 0 for m in d2d_moves(run["tmp"] / "state.db"))
        continued = 0
        for r in rows:
            launches = st.launches.rows(r["id"])
            for a, b in zip(launches, launches[1:]):
                if "device to device" in a.reason and b.state != "failed":
                    moved_to = next(h.reason for h in st.jobs.history(r["id"]) if h.reason.startswith(
                        f"launch {b.generation} on "))
                    if b.pid_info["run_dir"] == a.pid_info["run_dir"]:
                        assert b.pid_info["pid"] == a.pid_info["pid"] and moved_to.endswith("moved device to device")
                        continued += 1
                    else:
                        assert b.pid_info["run_dir"].endswith(f"launch_{b.generation}")
                        assert "moved through storage (not device to device: " in moved_to, moved_to
        assert continued >= 1


def test_losses_equal_the_uninterrupted_run(run, reference_losses):
    dev = loss_deviation(str(run["tmp"] / "state.db"), str(run["tmp"] / "work"), run["result"].submitted, run["ids"],
                         reference_losses)
    assert max(dev.values()) <= LOSS_TOL, dev


def test_no_step_is_lost_past_a_checkpoint(run):
    with Store(str(run["tmp"] / "state.db"), readonly=True) as st:
        for jid in run["ids"].values():
            for launch, start, saved in resumes(str(run["tmp"] / "work"), jid, st):
                assert start == saved, f"job {jid} launch {launch} resumed at {start}, last checkpoint {saved}"


def test_status_agrees_with_the_database(run, tmp_path):
    # the service has shut down; start it again over the same state (recovery of a
    # finished run: nothing to do) and read it through the CLI and a real browser
    tmp, port = run["tmp"], run["port"]
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", *demo_serve_args(tmp, port)],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "serve2.log", "wb"),
                            start_new_session=True)
    try:
        ServiceProcess([], tmp / "unused.log", run["url"], proc=proc).wait_healthy(120)
        out = subprocess.run([sys.executable, "-m", "engine.cli", "jobs", "--json", "--url", run["url"]],
                             capture_output=True, text=True, timeout=60, check=True)
        shown = {j["id"]: j for j in json.loads(out.stdout)}
        newest = subprocess.run([sys.executable, "-m", "engine.cli", "jobs", "--json", "--last", "2", "--status",
                                 "finished", "--url", run["url"]], capture_output=True, text=True, timeout=60,
                                check=True)
        done = sorted(i for i, j in shown.items() if j["status"] == "finished")
        assert [j["id"] for j in json.loads(newest.stdout)] == done[-2:] and len(done) >= 2
        with Store(str(tmp / "state.db"), readonly=True) as st:
            for row in st.jobs.rows():
                last = st.launches.rows(row.id)[-1]
                assert shown[row.id]["status"] == row.status
                assert shown[row.id]["plan"] == last.plan
                assert shown[row.id]["launches"] == len(st.launches.rows(row.id))
            moved = next(r["id"] for r in run["rows"] if r["moves"] > 0)
            ledger = st.moves.rows(moved)
        out = subprocess.run([sys.executable, "-m", "engine.cli", "status", str(moved), "--url", run["url"]],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        lines = out.split("moves (expected", 1)[1].splitlines()[1:]
        assert len(lines) == len(ledger) and all(f"{m['from_grid']} -> {m['to_grid']}" in ln and "expected " in ln
                                                 for m, ln in zip(ledger, lines)), out
        check_shadow(run["url"], tmp)
        check_page(run["url"], shown, tmp_path)
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def check_shadow(url: str, tmp: Path) -> None:
    """The shadow policy (sia-ap) was asked in every round that had a job, never failed,
    and `arena rounds` reports what the database holds."""
    with Store(str(tmp / "state.db"), readonly=True) as st:
        rounds = st.rounds.rows()
    comps = [r.decisions["shadow"] for r in rounds if "shadow" in r.decisions]
    assert comps and len(comps) == sum(1 for r in rounds if r.decisions.get("jobs")), "a round without its shadow"
    assert all(c["policy"] == "sia-ap" and c["error"] is None and c["agree"] + c["disagreements"] == c["jobs"]
               for c in comps), comps
    ans = subprocess.run([sys.executable, "-m", "engine.cli", "rounds", "--last", "1000", "--json", "--url", url],
                         capture_output=True, text=True, timeout=60, check=True)
    counts = json.loads(ans.stdout)["shadow"]["counts"]["sia-ap"]
    assert counts["rounds"] == len(comps) and counts["failed"] == 0
    assert counts["agreeing"] == sum(c["all_agree"] for c in comps)
    assert counts["disagreeing"] == sum(c["disagreements"] for c in comps)
    text = subprocess.run([sys.executable, "-m", "engine.cli", "rounds", "--last", "1000", "--url", url],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"shadow policy sia-ap: asked in {len(comps)} rounds (0 failed)" in text, text
    print("\n" + text.splitlines()[-1], file=sys.stderr)
    from engine.service.client import Client
    live = Client(url).get("/api/health")["scheduler"]          # `arena serve` hands its liveness to the API
    assert not live["stalled"] and (live["phase"] == "idle" or live["phase"].startswith("round ")), live


def check_page(url: str, shown: dict, tmp_path: Path) -> None:
    with status_page(url) as page:
        rows = page.query_selector_all("#jobs tbody tr")
        assert len(rows) == len(shown)
        for row in rows:
            jid = int(row.get_attribute("data-job"))
            status = row.query_selector("td.status").inner_text().split()[0]
            assert status == shown[jid]["status"]
        assert len(page.query_selector_all("#cluster .gpu")) == 4
        assert "shadow policy sia-ap" in page.inner_text("#policy")
        assert any(c.inner_text().startswith("sia-ap: same grid for") for c in page.query_selector_all("td.shadow"))
        assert page.query_selector_all("#jobs svg.curve"), "no loss curve drawn"
        shot = tmp_path / "status-page.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        if os.environ.get("ARENA_DOCS_SCREENSHOT"):
            shutil.copy(shot, os.environ["ARENA_DOCS_SCREENSHOT"])
