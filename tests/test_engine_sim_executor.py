"""SimExecutor: the event heap agrees with a direct per-job computation, and the
cluster's sample count with the jobs' progress."""
from __future__ import annotations

import random

import pytest

from engine.core.allocation import Allocation
from engine.core.reconfig import ReconfigCostModel
from engine.sim.sim_executor import InfeasibleAllocation, SimExecutor
from tests.test_engine_helpers import LinearOracle, grid, job


class Reference:
    """Each job: segments of (start, downtime end, iteration time); progress by direct sums."""

    def __init__(self):
        self.segs: dict[str, list] = {}
        self.ends: dict[str, float] = {}

    def start(self, jid, t, down, it):
        self.segs.setdefault(jid, []).append([t, t + down, it, None])

    def stop(self, jid, t):
        self.segs[jid][-1][3] = t

    def iterations(self, jid, t):
        done = 0.0
        for s0, w0, it, s1 in self.segs.get(jid, []):
            end = t if s1 is None else min(s1, t)
            if end > w0:
                done += (end - w0) / it
        return done


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_schedule_matches_reference(seed):
    rng = random.Random(seed)
    oracle = LinearOracle(12.0)
    model = ReconfigCostModel(replan_per_gpu_s=15.0, replan_cap_s=100.0, restart_s=5.0)
    ex = SimExecutor(oracle, model)
    ref = Reference()
    jobs = {f"j{i}": job(f"j{i}", 0.0, rng.randint(20, 400), batch=rng.choice([1, 4, 16])) for i in range(12)}
    running: dict[str, Allocation] = {}
    finished: dict[str, float] = {}
    t = 0.0
    for step in range(60):
        for p in ex.advance(t):
            finished[p.job_id] = p.finished_at_s
            running.pop(p.job_id)
        for jid in list(running):                   # the reference agrees on who is still running
            assert ref.iterations(jid, t) < jobs[jid].num_iterations + 1e-6
        expect = sum(min(ref.iterations(j, t), jobs[j].num_iterations) * jobs[j].global_batch for j in jobs)
        assert ex.samples_done == pytest.approx(expect, rel=1e-9, abs=1e-6)
        for jid, jb in jobs.items():
            if jid in finished:
                continue
            action = rng.random()
            g = grid("a100", 1, rng.choice([1, 2, 4]))
            alloc = Allocation(g, tuple((0, i) for i in range(g.num_gpus)))
            if jid not in running and action < 0.3:
                ex.launch(jb, alloc, None, t)
                ref.start(jid, t, model.cost_s(jb, None, alloc), 12.0 / g.num_gpus)
                running[jid] = alloc
            elif jid in running and action < 0.15:
                ex.stop(jid, t)
                ref.stop(jid, t)
                running.pop(jid)
            elif jid in running and action < 0.3:
                cost = model.cost_s(jb, running[jid], alloc)
                ex.reconfigure(jid, alloc, None, t)
                ref.stop(jid, t)
                ref.start(jid, t, cost, 12.0 / g.num_gpus)
                running[jid] = alloc
            assert ex.progress(jid).iterations_done == pytest.approx(ref.iterations(jid, t), abs=1e-6)
        t += rng.choice([30.0, 100.0, 300.0])
    for jid, ft in finished.items():
        # the reference reaches the job's iteration count exactly at the reported time
        assert ref.iterations(jid, ft) == pytest.approx(jobs[jid].num_iterations, rel=1e-9)
    assert finished, "the schedule should finish some jobs"


def test_infeasible_launch_refused():
    ex = SimExecutor(LinearOracle(infeasible={"A"}), ReconfigCostModel())
    with pytest.raises(InfeasibleAllocation):
        ex.launch(job("A", 0.0, 10), Allocation(grid("a100", 1, 1), ((0, 0),)), None, 0.0)
