"""The soak of ``arena serve`` (engine/service/soak.py), short form: a two-node local
service with real torch jobs, three clients submitting with keys (some sent again, some
twice at once), cancelling, holding and releasing, the service SIGKILLed twice at random
moments and started again at once. No job lost, no key answered with two jobs, no launch
resumed before its last checkpoint, never two launches of one job alive at once, no
refused restart, no 5xx, no request unanswered while the service was up
(``bench/service_soak.py`` runs the full soak). Beside it, the duplicate-run detector
itself on real processes, and the report's verdict on made-up figures.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.service.soak import RankSampler, SoakConfig, analyse, format_report, run_soak, worker_folders

SHORT = SoakConfig(submissions=12, clients=3, kills=2, steps=(5, 15), submit_window_s=10.0,
                   repeat_share=0.3, twin_share=0.15, cancel_share=0.2, hold_share=0.2, release_share=0.5,
                   act_after_s=(0.5, 8.0), settle_stall_s=120.0, timeout_s=480.0, slots=2)


@pytest.mark.slow
def test_soak_short_form_meets_the_zero_targets(tmp_path):
    rep = analyse(run_soak(SHORT, tmp_path, progress=lambda m: print(m, file=sys.stderr, flush=True)))
    table = format_report(rep)
    print("\n" + table, file=sys.stderr)
    assert rep["violations"] == [], table
    sent = rep["submissions"]["sent"]
    # the run did what it is meant to check: repeated and simultaneous keys, cancels, holds,
    # kills that landed on running jobs
    assert sent["repeat"] and sent["twin"] and sent["cancel"] and sent["hold"], sent
    assert rep["submissions"]["replayed_answers"] >= sent["repeat"], rep["submissions"]
    assert rep["kills"]["on_running_jobs"] >= 1, rep["kills"]
    assert rep["jobs"]["accepted"] == SHORT.submissions


def _fake_rank(path) -> subprocess.Popen:
    """A process whose command line reads as a rank's (``... launcher.worker PATH``)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "launcher.worker", str(path)])


def test_the_sampler_sees_two_launches_of_one_job_alive_at_once(tmp_path):
    work = tmp_path / "work"
    procs = [_fake_rank(work / "3" / "launch_1" / "config.json"),
             _fake_rank(work / "3" / "launch_1" / "move_2.json"),       # a move's joining ranks: one launch
             _fake_rank(work / "4" / "launch_2" / "config.json")]
    try:
        deadline = time.monotonic() + 10
        while worker_folders(str(work)) != {3: {"3/launch_1"}, 4: {"4/launch_2"}}:
            assert time.monotonic() < deadline, worker_folders(str(work))
            time.sleep(0.05)
        sampler = RankSampler(str(work), 0.05)
        sampler.start()
        time.sleep(0.3)
        assert sampler.overlaps == []
        procs.append(_fake_rank(work / "4" / "launch_3" / "config.json"))   # a second launch of job 4
        deadline = time.monotonic() + 10
        while not sampler.overlaps:
            assert time.monotonic() < deadline, "the overlap was not seen"
            time.sleep(0.05)
        sampler.stop.set()
        sampler.join(5)
        assert sampler.overlaps[0]["job"] == 4
        assert sampler.overlaps[0]["folders"] == ["4/launch_2", "4/launch_3"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert worker_folders(str(work)) == {}              # killed and reaped: none left
