"""Crash safety of ``arena serve``: the end-to-end run of test_service_e2e with the
service killed by SIGKILL four times (after a launch intent was committed and before
mpiexec started, in the middle of a move between the old launch's checkpoint and the new
launch, after a round's decision was recorded and before it was carried out, and at a
random moment) and started again each time over the same database. Every job still
finishes with the uninterrupted run's losses; no step is lost past a checkpoint; the
database stays consistent; no rank outlives the run.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from engine.service.scenario import (
    CRASH_FAULTS,
    CRASH_RANDOM_WINDOW_S,
    CRASH_REPEATS,
    LOSS_TOL,
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

pytestmark = pytest.mark.slow

FAULTS = CRASH_FAULTS


def test_killed_service_loses_no_job_and_no_step(tmp_path, reference_losses):
    port = free_port()
    result = run_scenario(demo_serve_args(tmp_path, port), f"http://127.0.0.1:{port}", tmp_path / "serve.log",
                          demo_jobs(),
                          faults=FAULTS, seed=7, timeout_s=1200, random_window_s=CRASH_RANDOM_WINDOW_S,
                          repeats=CRASH_REPEATS,
                          progress=lambda m: print(m, file=sys.stderr))
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    rows = job_report(db, work)
    print("\n" + format_report(rows) + f"\nkills: {result.kills}, starts: {result.starts}", file=sys.stderr)
    assert not result.unfired, f"the run ended before these kills: {result.unfired}"
    assert [k.split(":")[0] for k in result.kills] == [f.split(":")[0] for f in FAULTS]
    assert all(r["status"] == "finished" for r in rows), format_report(rows)
    dev = loss_deviation(db, work, result.submitted, result.ids, reference_losses)
    assert max(dev.values()) <= LOSS_TOL, dev
    with Store(db, readonly=True) as st:
        assert st.check() == []
        assert not st.launches.active()
        for jid in result.ids.values():
            for launch, start, saved in resumes(work, jid, st):
                assert start == saved, f"job {jid} launch {launch} resumed at {start}, last checkpoint {saved}"
    left = subprocess.run(["pgrep", "-f", f"launcher.worker {work}"], capture_output=True, text=True)
    assert not left.stdout.strip(), f"ranks still running: {left.stdout}"
