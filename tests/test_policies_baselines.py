"""Baselines decide with data-parallel-only estimates and follow their own rules."""
from __future__ import annotations

import pytest

from engine.core.context import JobView, RoundContext
from engine.core.policy import make_policy, policy_names
from engine.core.reconfig import ReconfigCostModel
from estimators import make_performance_model
from instances.builtin import get_instance
from instances.errors import InputError
from instances.jobs import Job


@pytest.fixture(scope="module")
def demo_ctx():
    inst = get_instance("demo")
    views = tuple(JobView(j, float(j.num_iterations), None) for j in inst.jobs[:16])
    return RoundContext(0.0, 0, 300.0, inst.cluster, views, make_performance_model("table"), ReconfigCostModel())


def test_baselines_are_registered():
    assert {"arena", "gavel", "sia", "elasticflow-ls"} <= set(policy_names())


@pytest.mark.parametrize("name", ["gavel", "sia", "elasticflow-ls"])
def test_baselines_use_data_parallel_plans_only(demo_ctx, name):
    d = make_policy(name).decide(demo_ctx)
    assert d.grids, "some job must run"
    for jid, g in d.grids.items():
        assert g.pp == 1
        plan = d.plans.get(jid)
        if plan is not None:
            assert plan.pp == 1 and plan.tp == 1


def test_gavel_keeps_the_requested_gpu_count(demo_ctx):
    d = make_policy("gavel").decide(demo_ctx)
    assert d.grids, "some job must run"
    for jid, g in d.grids.items():
        want = demo_ctx.job(jid).job.requested_gpus
        assert want is None or g.num_gpus == want


def test_elasticflow_keeps_the_requested_type_unless_heterogeneous(demo_ctx):
    d = make_policy("elasticflow-ls").decide(demo_ctx)
    assert d.grids, "some job must run"
    for jid, g in d.grids.items():
        want = demo_ctx.job(jid).job.requested_gpu_type
        assert want is None or g.gpu_type == want


def test_elasticflow_admits_the_deadline_job_first():
    inst = get_instance("demo")
    base = inst.jobs[0]
    # identical jobs; only one has a (loose but binding) deadline
    a = Job("late", base.model, base.global_batch, base.num_iterations, 0.0,
            requested_gpus=1, requested_gpu_type=base.requested_gpu_type)
    b = Job("urgent", base.model, base.global_batch, base.num_iterations, 0.0, deadline_s=1e7,
            requested_gpus=1, requested_gpu_type=base.requested_gpu_type)
    views = (JobView(a, float(a.num_iterations), None), JobView(b, float(b.num_iterations), None))
    ctx = RoundContext(0.0, 0, 300.0, inst.cluster, views, make_performance_model("table"), ReconfigCostModel())
    d = make_policy("elasticflow-ls", slack_factor=1.0).decide(ctx)
    assert "urgent" in d.grids


def _moves(policy, speedup: float) -> bool:
    """Whether ``policy``'s objective and solver move a running a40 2x2 job to a100 1x4
    when the a100 shape is ``speedup`` times faster (same estimates for both policies:
    the data-parallel-only estimation of the baselines is not what this compares)."""
    from engine.core.allocation import Allocation
    from engine.decide.formulation import build_model, build_round_data
    from instances.grid import Grid, Shape
    from tests.test_policies_arena import CLUSTER, TypeSpeedPerf, job
    cur = Allocation(Grid(Shape("a40", 2, 2)), ((1, 0), (1, 1), (2, 0), (2, 1)))
    ctx = RoundContext(0.0, 0, 300.0, CLUSTER, (JobView(job(gpus=4), 1000.0, cur),),
                       TypeSpeedPerf({"a100": speedup, "a40": 1.0}), ReconfigCostModel())
    data = build_round_data(ctx, ctx.perf, grid_filter=lambda v, g: g.num_gpus == 4 and g.pp == 1)
    model = build_model(data, policy.objective)
    sol = policy.backend.solve(model, 10.0, rel_gap=0.0)
    (k,) = sol.selected(model.n_x)
    return data.grids[k].gpu_type != "a40"


def test_sia_penalises_moves_more_than_arena():
    # the objectives' own move prices, without the hysteresis every policy shares
    arena, sia = make_policy("arena", **{"reconfig.hysteresis": 0}), make_policy("sia", **{"reconfig.hysteresis": 0})
    speedups = [1.0 + 0.05 * i for i in range(1, 41)]
    arena_moves = [_moves(arena, s) for s in speedups]
    sia_moves = [_moves(sia, s) for s in speedups]
    assert any(arena_moves) and any(sia_moves)
    assert not any(s and not a for a, s in zip(arena_moves, sia_moves)), "sia moved where arena stayed"
    # sia needs a strictly larger speed-up before a move pays
    assert arena_moves.index(True) < sia_moves.index(True)


def test_hysteresis_raises_the_speedup_a_move_needs():
    speedups = [1.0 + 0.01 * i for i in range(1, 100)]
    plain = [_moves(make_policy("arena", **{"reconfig.hysteresis": 0}), s) for s in speedups]
    damped = [_moves(make_policy("arena", **{"reconfig.hysteresis": 0.2}), s) for s in speedups]
    assert any(damped)
    assert plain.index(True) < damped.index(True)


@pytest.mark.parametrize("name", ["gavel", "sia", "elasticflow-ls", "sia-ap", "gavel-ap", "elasticflow-ls-ap"])
def test_baseline_config_is_validated(name):
    with pytest.raises(InputError):
        make_policy(name, bogus=1)


@pytest.mark.parametrize("name", ["gavel", "sia", "elasticflow-ls"])
def test_baselines_simulate_the_demo_without_packing_failures(name):
    from engine.sim.simulator import simulate
    res = simulate(get_instance("demo"), make_policy(name), perf=make_performance_model("table"), rounds=30)
    assert res.summary["packing_failures"] == 0
    assert res.summary["jobs_finished"] > 0


def test_give_way_charges_only_the_slower_columns_of_a_running_job():
    """``reconfig.give_way`` charges a running job's move to a column slower than its
    current one that fraction of the loss once more; faster columns, the current one and
    queued jobs' columns are not touched."""
    import numpy as np

    from engine.core.allocation import Allocation
    from engine.decide.formulation import build_round_data
    from engine.decide.formulation.model import ModelBuilder
    from engine.decide.objectives.reconfig import ReconfigPenalty
    from instances.grid import Grid, Shape
    from tests.test_policies_arena import CLUSTER, TypeSpeedPerf, job
    cur = Allocation(Grid(Shape("a40", 2, 2)), ((1, 0), (1, 1), (2, 0), (2, 1)))
    queued = Job("q", job(gpus=4).model, 32, 1000, 0.0)
    ctx = RoundContext(0.0, 0, 300.0, CLUSTER, (JobView(job(gpus=4), 1000.0, cur), JobView(queued, 1000.0, None)),
                       TypeSpeedPerf({"a100": 1.5, "a40": 1.0}), ReconfigCostModel())
    data = build_round_data(ctx, ctx.perf)

    def coef(**kw):
        b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
        ReconfigPenalty(**kw).apply(data, b, 1.0)
        return b.c_x

    extra = coef(give_way=0.5) - coef()
    c = data.current_col[0]
    running = data.col_job == 0
    drop = np.maximum(0.0, data.speedup[c] - data.speedup)
    assert np.any(running & (drop > 0)) and np.any(running & (data.speedup > data.speedup[c]))
    assert np.allclose(extra[running], -0.5 * drop[running])
    assert np.all(extra[~running] == 0) and extra[c] == 0
    with pytest.raises(ValueError, match="give_way"):
        ReconfigPenalty(give_way=-1.0)


def test_arena_judges_giving_way_by_default_and_the_baselines_do_not():
    from engine.decide.objectives.reconfig import ReconfigPenalty

    def give_way(name, **cfg):
        (term,) = [t for _, t in make_policy(name, **cfg).objective.terms if isinstance(t, ReconfigPenalty)]
        return term.give_way

    assert give_way("arena") == give_way("arena-incremental") == 3.0
    assert give_way("arena", **{"reconfig.give_way": 0}) == 0.0
    assert give_way("sia-ap") == give_way("suika") == give_way("gavel-ap") == 0.0
