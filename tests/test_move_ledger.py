"""The move ledger (engine/core/move_ledger.py): payback by hand, and a simulated run's ledger
held to the jobs' own counts (called from tests/test_bounds.py on fcfs, arena and sia-ap)."""
from __future__ import annotations

import pytest

from engine.core.move_ledger import MoveEntry, MoveLedger

ENDS = {"moved again", "preempted", "evicted", "failed", "finished", "cancelled", "run ended"}


def entry(job="j", t=100.0, rate=1.0, est=(1.0, 2.0), forced=False, at=50.0):
    return MoveEntry(job, t, forced, "a:1x1", "a:1x2", rate, est[0], est[1], 20.0, at)


def test_payback_by_hand():
    led = MoveLedger()
    led.opened(entry())
    led.observe("j", 200.0, 120.0)             # 70 made in 100 s at a rate before of 1/s: not yet
    assert led.entries[0].paid_back_s is None
    led.observe("j", 300.0, 260.0)             # 210 in 200 s: paid back, 200 s after the move
    led.observe("j", 400.0, 261.0)             # later readings do not move it
    led.closed("j", 500.0, 400.0, "finished")
    e = led.entries[0]
    assert (e.paid_back_s, e.iterations_after, e.end, e.paid_back) == (200.0, 350.0, "finished", True)
    assert e.realized_gain == pytest.approx(350.0 / 400.0) and e.est_gain == 2.0
    # moved again before it paid: the next entry closes this one, unpaid
    led.opened(entry(job="k", t=0.0, at=0.0))
    led.opened(entry(job="k", t=300.0, at=100.0))
    k = [x for x in led.entries if x.job_id == "k"]
    assert (k[0].end, k[0].paid_back, k[0].iterations_after, k[1].ended_s) == ("moved again", False, 100.0, None)
    # a job finishing between rounds pays back at its closing reading
    led.opened(entry(job="f", t=0.0, at=0.0))
    led.closed("f", 50.0, 60.0, "finished")
    assert led.entries[-1].paid_back_s == 50.0
    # no rate before the move: it is not judged; a forced move is counted apart
    led.opened(entry(job="n", rate=0.0))
    led.opened(entry(job="g", est=(2.0, 1.0)))                      # gave GPUs up for others
    led.opened(entry(job="x", forced=True))
    led.close_all(1000.0, {"n": 500.0, "g": 60.0, "x": 60.0, "k": 900.0})
    assert all(e.ended_s is not None for e in led.entries)
    s = led.summary()
    assert s["moves_decided"] == 6 and s["moves_forced"] == 1 and s["moves_giving_way"] == 1
    assert s["moves_speeding_up"] == 5                               # j, k twice, f, n
    # of j, k, k, f (n not judged): j, f and the second k (800 made in 700 s at 1/s)
    assert s["moves_paid_back_share"] == pytest.approx(3 / 4)


def assert_ledger_consistent(res) -> None:
    """A simulated run's ledger against the run's own records: one entry per move of a
    running job (a job's reconfigurations that were not resumes), every entry closed with
    a known end, a job's entries in time order without overlap, and payback where the
    rate made since the move beat the rate before it."""
    by_job: dict[str, list] = {}
    for e in res.moves:
        by_job.setdefault(e.job_id, []).append(e)
        assert e.end in ENDS and e.ended_s is not None and e.ended_s >= e.time_s
        if e.rate_before and e.iterations_after > 0 and e.realized_gain is not None and e.realized_gain >= 1.0:
            assert e.paid_back, e
        if e.paid_back:
            assert e.paid_back_s <= e.elapsed_s + 1e-9
    for j in res.jobs:
        resumes = max(0, j.launches - 1)
        assert len(by_job.get(j.job_id, [])) == j.reconfigurations - resumes, j.job_id
    for entries in by_job.values():
        for a, b in zip(entries, entries[1:]):
            assert a.ended_s <= b.time_s
            if a.end == "moved again":
                assert a.ended_s == b.time_s
    assert res.summary["moves_decided"] + res.summary["moves_forced"] == len(res.moves)


def _restarted_loop(to_grid: str):
    """A round loop as a restarted service has it: job "1" queued, and the open entry of
    its move before the restart handed back (``MoveLedger.reopen``); the policy places it
    on one 2-GPU grid."""
    from engine.core.reconfig import ReconfigCostModel
    from engine.core.round_loop import RoundLoop
    from engine.sim.sim_executor import SimExecutor
    from tests.test_engine_helpers import LinearOracle, ScriptedPolicy, cluster, grid, job
    g = grid("a100", 1, 2)
    loop = RoundLoop(cluster(("a100", 1, 2)), ScriptedPolicy(lambda ctx: {v.job.job_id: g for v in ctx.jobs}),
                     SimExecutor(LinearOracle(work_s=2.0), ReconfigCostModel()), round_interval_s=10.0,
                     jobs=[job("1", 0.0, 100)])
    loop.submit("1", 0.0)
    e = MoveEntry("1", -50.0, False, "a:1x1:pp1", to_grid, 0.5, 1.0, 2.0, 20.0, 0.0, iterations_after=30.0)
    loop.moves.reopen(e)
    return loop, e, str(g)


def test_an_entry_handed_back_after_a_restart_counts_what_the_job_makes_after_it():
    from engine.core.state import JobStatus
    loop, e, g = _restarted_loop(to_grid="")
    e.to_grid = g                                  # it ran where its move put it: relaunched there
    t = 0.0
    while loop.state.jobs["1"].status is not JobStatus.FINISHED:
        loop.collect(t)
        loop.round(t, int(t // 10))
        assert t < 1000
        if loop.state.jobs["1"].status is JobStatus.RUNNING:
            assert e.ended_s is None                # still open, running where the move put it
        t += 10.0
    assert e.end == "finished" and e.iterations_after == 100.0 and loop.moves.entries == []
    # paid for itself in a round after the restart (at 0.5/s before the move, 100 steps in 170 s)
    assert e.paid_back_s is not None and 50.0 < e.paid_back_s <= e.elapsed_s == 170.0


def test_an_entry_handed_back_closes_when_its_job_relaunches_elsewhere_or_is_cancelled_queued():
    loop, e, g = _restarted_loop(to_grid="a:1x1:pp1")
    loop.round(0.0, 0)                             # launched on the 2-GPU grid, not where the move put it
    assert (e.end, e.ended_s, e.iterations_after) == ("service restarted", 0.0, 0.0)
    loop, e, g = _restarted_loop(to_grid="a:1x1:pp1")
    loop.cancel("1", 5.0)                          # cancelled before any round placed it
    assert (e.end, e.ended_s) == ("cancelled", 5.0)


def test_the_rate_before_a_move_is_on_the_wall_clock_as_the_progress_after_it():
    """Live, a step's measured time leaves out what the wall clock counts between steps
    (checkpoints, a --step-delay): the rate before a move is taken from the executor's
    wall-clock time per step where it reports one, so that a move at unchanged speed
    reads 1x, not a fraction (the issue: 50.9 it/s before against 4.4 measured after)."""
    from engine.core.state import EngineState
    from instances.allocation import Allocation
    from instances.cluster import ClusterSpec, NodeGroup
    from instances.jobs import Job
    from tests.test_engine_helpers import grid
    st = EngineState(ClusterSpec((NodeGroup("cpu", 1, 2),), "c"), [Job("j", "tiny-gpt__2L", 8, 1000, 0.0)])
    st.submit("j", 0.0)
    st.start("j", Allocation(grid("cpu", 1, 1), ((0, 0),)), 0.0)
    r = st.jobs["j"]
    r.measured_iteration_time_s, r.wall_iteration_time_s = 1 / 50.9, 1 / 4.4
    st.release_for_move("j")
    st.move("j", Allocation(grid("cpu", 1, 1), ((0, 1),)), 10.0)
    assert r.rate_before_change == pytest.approx(4.4)
    led = MoveLedger()                             # the same speed after it: paid back at once
    led.opened(MoveEntry("j", 10.0, False, "a", "b", r.rate_before_change, 1.0, 1.0, 0.0, 0.0))
    led.closed("j", 20.0, 44.0, "finished")
    assert led.entries[0].realized_gain == pytest.approx(1.0) and led.entries[0].paid_back
    r.wall_iteration_time_s = None                 # an executor without it (the simulator's): its measured time
    st.release_for_move("j")
    st.move("j", Allocation(grid("cpu", 1, 1), ((0, 0),)), 20.0)
    assert r.rate_before_change == pytest.approx(50.9)
