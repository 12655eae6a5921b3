"""The ``arena`` policy: picks the faster grid, keeps a running job where a move does
not pay, validates its config, dumps models, and runs a short simulation cleanly."""
from __future__ import annotations

import pytest

from engine.core.context import JobView, RoundContext
from engine.core.policy import Policy, make_policy
from engine.core.reconfig import ReconfigCostModel
from estimators.base import Estimate
from instances.allocation import Allocation
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job

CLUSTER = ClusterSpec((NodeGroup("a100", 1, 4), NodeGroup("a40", 2, 2)), "tiny")


class TypeSpeedPerf:
    """Stand-in estimator: throughput = type speed x GPUs ** 0.9 (pp 1 only)."""
    name = "stand-in"

    def __init__(self, speed):
        self.speed = speed

    def estimate(self, job, grid):
        if grid.pp > 1:
            return Estimate(float("inf"), 0.0, 0.0, None, False, "stand-in")
        thr = self.speed[grid.gpu_type.split("-")[0]] * grid.num_gpus ** 0.9
        return Estimate(job.global_batch / thr, thr, 1e9, None, True, "stand-in")


def ctx_of(views, perf, cluster=CLUSTER):
    return RoundContext(0.0, 0, 300.0, cluster, tuple(views), perf, ReconfigCostModel())


def job(jid="j", gpus=1, gpu_type="a40"):
    return Job(jid, "gpt__350M", 64, 1000, 0.0, requested_gpus=gpus, requested_gpu_type=gpu_type)


@pytest.mark.parametrize("backend", ["auto", "highs", "cpsat", "lagrangian"])
def test_arena_picks_the_faster_grid(backend):
    pol = make_policy("arena", backend=backend)
    d = pol.decide(ctx_of([JobView(job(), 1000.0, None)], TypeSpeedPerf({"a100": 3.0, "a40": 1.0})))
    assert d.grids["j"].gpu_type == "a100-40gb"
    d = pol.decide(ctx_of([JobView(job(), 1000.0, None)], TypeSpeedPerf({"a100": 1.0, "a40": 3.0})))
    assert d.grids["j"].gpu_type == "a40"
    assert d.stats.status == "optimal" and d.stats.jobs == 1


def test_arena_keeps_a_running_job_when_moving_does_not_pay():
    cur = Allocation(Grid(Shape("a40", 2, 2)), ((1, 0), (1, 1), (2, 0), (2, 1)))
    view = JobView(job(gpus=4), 1000.0, cur)
    # a100 x4 is 2% faster: less than the downtime of a move (40 s of a 300 s round)
    d = make_policy("arena").decide(ctx_of([view], TypeSpeedPerf({"a100": 1.02, "a40": 1.0})))
    assert d.grids["j"] == cur.grid
    # twice as fast: worth the move
    d = make_policy("arena").decide(ctx_of([view], TypeSpeedPerf({"a100": 2.0, "a40": 1.0})))
    assert d.grids["j"].gpu_type == "a100-40gb"


def test_arena_skips_shapes_known_infeasible():
    fast = TypeSpeedPerf({"a100": 3.0, "a40": 1.0})
    free = make_policy("arena").decide(ctx_of([JobView(job(gpus=4), 1000.0, None)], fast))
    s = free.grids["j"].shape
    assert (s.gpu_type, s.num_nodes, s.gpus_per_node) == ("a100-40gb", 1, 4)   # the best shape...
    bad = Shape("a100", 1, 4)          # ...marked infeasible under an alias of its GPU type
    assert bad == s
    view = JobView(job(gpus=4), 1000.0, None, known_infeasible_shapes=frozenset({bad}))
    d = make_policy("arena").decide(ctx_of([view], fast))
    s = d.grids["j"].shape
    assert (s.gpu_type, s.num_nodes, s.gpus_per_node) != ("a100-40gb", 1, 4)


def test_arena_config_is_validated():
    with pytest.raises(InputError, match="bogus"):
        make_policy("arena", bogus=1)
    with pytest.raises(InputError, match="backend"):
        make_policy("arena", backend="nope")
    with pytest.raises(InputError, match="time_limit_s"):
        make_policy("arena", time_limit_s="-1")
    p = make_policy("arena", w_jct="2", **{"reconfig.per_move": "0.1"}, backend="highs", rel_gap="0.001")
    assert p.rel_gap == 0.001
    assert {t.name: w for w, t in p.objective.terms}["jct"] == 2.0


def test_arena_dumps_every_round_model(tmp_path):
    pol = make_policy("arena", dump_rounds_dir=str(tmp_path))
    pol.decide(ctx_of([JobView(job(), 1000.0, None)], TypeSpeedPerf({"a100": 3.0, "a40": 1.0})))
    assert (tmp_path / "round_00000.mps").stat().st_size > 0
    assert (tmp_path / "round_00000.lp").stat().st_size > 0


def test_arena_simulates_the_demo_without_packing_failures():
    from engine.sim.simulator import simulate
    from estimators import make_performance_model
    from instances.builtin import get_instance
    inst = get_instance("demo")
    res = simulate(inst, make_policy("arena"), perf=make_performance_model("table"), rounds=40)
    s = res.summary
    assert s["jobs_finished"] > 0
    assert s["packing_failures"] == 0
    # without refinements (as before 6 Dec), more of its chosen grids need a smaller
    # fallback or wait
    blind = simulate(inst, make_policy("arena", max_refines=0), perf=make_performance_model("table"),
                     rounds=40).summary
    assert blind["packing_failures"] == 0 and blind["placement_refines"] == 0 < s["placement_refines"]
    assert s["fallbacks"] + s["fallback_waits"] < blind["fallbacks"] + blind["fallback_waits"]
    with pytest.raises(InputError, match="held_rows must be true or false"):
        make_policy("arena", held_rows="maybe")


def test_arena_refines_a_round_at_most_max_refines_times():
    """Each refinement's decision can be refined once less; 0: none (fallbacks at once)."""
    from engine.core.round_placement import MAX_REFINES
    ctx = ctx_of([JobView(job(), 1000.0, None)], TypeSpeedPerf({"a100": 3.0, "a40": 1.0}))
    d = make_policy("arena", max_refines=2).decide(ctx)
    chain = 0
    while d.refine is not None:
        d = d.refine.without({})
        chain += 1
    assert chain == 2 and d.grids
    assert make_policy("arena", max_refines=0).decide(ctx).refine is None
    for bad in (-1, MAX_REFINES + 1, "many"):
        with pytest.raises(InputError, match="max_refines"):
            make_policy("arena", max_refines=bad)


class NodeLocalPerf(TypeSpeedPerf):
    """Stand-in estimator that prefers fewer nodes: 5% slower per extra node."""

    def estimate(self, job, grid):
        e = super().estimate(job, grid)
        if not e.feasible:
            return e
        thr = e.throughput * 0.95 ** (grid.shape.num_nodes - 1)
        return Estimate(job.global_batch / thr, thr, 1e9, None, True, "stand-in")


def test_columns_option_separates_co_designed_placement_from_the_best_plan_per_count():
    # one 2-GPU node and two 1-GPU nodes of a40: two 2-GPU jobs both run only if one of
    # them takes the slower 2x1 shape, which the best-plan-per-count columns do not offer
    cluster = ClusterSpec((NodeGroup("a40", 1, 2), NodeGroup("a40", 2, 1)), "mixed")
    views = [JobView(job("a", gpus=2), 1000.0, None), JobView(job("b", gpus=2), 1000.0, None)]
    ctx = ctx_of(views, NodeLocalPerf({"a40": 1.0}), cluster)
    both = make_policy("arena").decide(ctx)
    assert sorted((g.num_gpus, g.shape.num_nodes) for g in both.grids.values()) == [(2, 1), (2, 2)]
    best = make_policy("arena", columns="best_per_count").decide(ctx)
    assert [(g.num_gpus, g.shape.num_nodes) for g in best.grids.values() if g.num_gpus == 2] == [(2, 1)]
    assert make_policy("sia-ap").best_per_count and not make_policy("sia-ap", columns="all").best_per_count
    assert not make_policy("arena").best_per_count
    with pytest.raises(InputError, match="columns"):
        make_policy("arena", columns="some")


def test_max_queued_decides_over_a_window_of_the_queue_by_priority_then_arrival():
    from engine.decide.policies.milp import queue_window
    running = JobView(Job("r", "gpt__350M", 64, 1000, 0.0), 500.0,
                      Allocation(Grid(Shape("a40", 1, 2)), ((1, 0), (1, 1))))
    queued = [JobView(Job(f"q{i}", "gpt__350M", 64, 1000, float(i), priority=3.0 if i == 7 else 1.0), 1000.0, None)
              for i in range(8)]
    ctx = ctx_of([running, *queued], TypeSpeedPerf({"a100": 1.0, "a40": 1.0}))
    small, left = queue_window(ctx, 3)
    # the running job, the high-priority late arrival, then the earliest two; ctx's order kept
    assert [v.job_id for v in small.jobs] == ["r", "q0", "q1", "q7"] and left == 5 == small.queued_left_out
    assert queue_window(ctx, 0) == (ctx, 0) and queue_window(ctx, 8) == (ctx, 0)
    d = make_policy("arena", max_queued=3).decide(ctx)
    assert set(d.grids) <= {"r", "q0", "q1", "q7"} and d.stats.queued_left_out == 5 and d.stats.jobs == 4
    assert make_policy("arena").decide(ctx).stats.queued_left_out == 0
    for bad in (-1, 1.5, "x"):
        with pytest.raises(InputError) as e:
            make_policy("arena", max_queued=bad)
        assert e.value.field == "max_queued"


def test_the_round_loop_builds_views_only_for_the_policy_window_and_the_simulation_runs_out():
    """A policy with ``max_queued`` is given every running job and only its window of the
    queue (the loop builds no view for the others, ``queued_left_out`` counts them); the
    demo still finishes every job. A window larger than any queue changes nothing."""
    from engine.core.round_loop import RoundLoop
    from engine.sim.sim_executor import SimExecutor
    from engine.sim.simulator import simulate
    from estimators import make_performance_model
    from instances.builtin import get_instance
    inst = get_instance("demo")
    perf = make_performance_model("table")
    seen = []

    class Watch(Policy):
        def __init__(self, policy):
            self.policy, self.name, self.max_queued = policy, policy.name, policy.max_queued

        def decide(self, ctx):
            seen.append((sum(v.current is None for v in ctx.jobs), ctx.queued_left_out))
            return self.policy.decide(ctx)
    loop = RoundLoop(inst.cluster, Watch(make_policy("arena", max_queued=2)), SimExecutor(inst.oracle,
                     ReconfigCostModel()), perf=perf, round_interval_s=300.0, jobs=inst.jobs)
    for j in inst.jobs:
        loop.submit(j.job_id, 0.0)
    loop.round(0.0, 0)
    assert seen == [(2, len(inst.jobs) - 2)]
    res = simulate(inst, make_policy("arena", max_queued=2), perf=perf, run_out=True)
    assert res.summary["jobs_finished"] == len(inst.jobs)
    a = simulate(inst, make_policy("arena"), perf=perf, rounds=30).summary
    b = simulate(inst, make_policy("arena", max_queued=10_000), perf=perf, rounds=30).summary
    drop = {"wall_time_s", "decision_time_median_s", "decision_time_p99_s", "decision_time_total_s"}
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
