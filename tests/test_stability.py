"""The stability rule (engine/decide/stability.py), the move pricing it works with, and the
``-ap`` column reduction."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.allocation import Allocation
from engine.core.context import ChangeHistory, Decisions, JobView
from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.decide.stability import StabilityRule
from engine.sim.simulator import simulate
from instances.builtin import get_instance
from instances.errors import InputError
from launcher.reshard_plan import changed_owner_bytes
from tests.test_engine_helpers import grid, job

CUR = Allocation(grid("a100", 1, 2), ((0, 0), (0, 1)))


def _view(change: ChangeHistory | None, current: Allocation | None = CUR) -> JobView:
    return JobView(job("A", 0.0, 1000), 500.0, current, last_change=change)


def test_payback_rule():
    rule = StabilityRule(max_moves_per_hour=0)
    # moved at t=1000 from 1 it/s: by t=1100 staying would have made 100 iterations
    assert rule.is_frozen(_view(ChangeHistory(1000.0, 50.0, 1.0)), 1100.0)
    assert not rule.is_frozen(_view(ChangeHistory(1000.0, 100.0, 1.0)), 1100.0)
    # a start from the queue pays once it has made one iteration (a launch still starting is kept)
    assert rule.is_frozen(_view(ChangeHistory(1000.0, 0.0, 0.0)), 1300.0)
    assert not rule.is_frozen(_view(ChangeHistory(1000.0, 1.0, 0.0)), 1300.0)
    # a move that never pays for the job itself is held for payback_max_s
    slow = ChangeHistory(0.0, 10.0, 1.0)
    assert rule.is_frozen(_view(slow), 3599.0) and not rule.is_frozen(_view(slow), 3601.0)
    assert not StabilityRule(payback=False, max_moves_per_hour=0).is_frozen(_view(slow), 100.0)
    # queued jobs and jobs never changed are never frozen
    assert not rule.is_frozen(_view(ChangeHistory(0.0, 0.0, 1.0), current=None), 10.0)
    assert not rule.is_frozen(_view(None), 10.0)


def test_move_limit_per_hour():
    rule = StabilityRule(payback=False, max_moves_per_hour=2)
    paid = dict(changed_at_s=0.0, iterations_since=1e9, rate_before=0.0)
    assert not rule.is_frozen(_view(ChangeHistory(**paid, recent_s=(100.0,))), 3000.0)
    assert rule.is_frozen(_view(ChangeHistory(**paid, recent_s=(100.0, 2000.0))), 3000.0)
    assert not rule.is_frozen(_view(ChangeHistory(**paid, recent_s=(100.0, 2000.0))), 3700.0)   # one left the hour
    assert not StabilityRule(enabled=False).is_frozen(_view(ChangeHistory(**paid, recent_s=(1, 2, 3))), 10.0)


def test_lifetime_change_limit():
    rule = StabilityRule(payback=False, max_moves_per_hour=0, max_changes_per_job=1)
    paid = dict(changed_at_s=0.0, iterations_since=1e9, rate_before=0.0)
    assert not rule.is_frozen(_view(ChangeHistory(**paid, total=0)), 1e6)
    assert rule.is_frozen(_view(ChangeHistory(**paid, recent_s=(5.0,), total=1)), 1e6)     # however long ago
    assert not StabilityRule(payback=False, max_moves_per_hour=0).is_frozen(_view(ChangeHistory(**paid, total=9)), 1e6)


def test_move_backoff_doubles_the_hold_with_every_change():
    rule = StabilityRule(payback=False, max_moves_per_hour=0, move_backoff_s=100.0)
    paid = dict(changed_at_s=1000.0, iterations_since=1e9, rate_before=0.0)
    assert not rule.is_frozen(_view(ChangeHistory(**paid, total=0)), 1001.0)      # never changed: free
    assert rule.is_frozen(_view(ChangeHistory(**paid, total=1)), 1099.0)
    assert not rule.is_frozen(_view(ChangeHistory(**paid, total=1)), 1100.0)
    assert rule.is_frozen(_view(ChangeHistory(**paid, total=3)), 1399.0)          # 100 x 2^2
    assert not rule.is_frozen(_view(ChangeHistory(**paid, total=3)), 1400.0)


def test_lifetime_change_limit_bounds_reconfigurations_per_job():
    inst = get_instance("demo")
    capped = simulate(inst, make_policy("arena", max_changes_per_job=1), perf=_table(), rounds=80,
                      reconfig=ReconfigCostModel())
    free = simulate(inst, make_policy("arena"), perf=_table(), rounds=80, reconfig=ReconfigCostModel())
    per_job = [r.reconfigurations for r in capped.jobs]
    assert max(per_job) <= 1 < max(r.reconfigurations for r in free.jobs)


def test_change_budget_allowance_is_paid_by_completions():
    from engine.core.context import RoundContext
    inst = get_instance("demo")
    rule = StabilityRule(change_budget_per_job=0.5)

    def allowance(finished, changes):
        return rule.round_allowance(RoundContext(0.0, 0, 300.0, inst.cluster, (), None, None,
                                                 finished_jobs=finished, changes_total=changes))
    assert allowance(0, 0) == 0 and allowance(4, 0) == 2 and allowance(4, 1) == 1 and allowance(5, 1) == 1
    assert allowance(4, 3) == 0                                  # overdrawn by a preemption: nothing moves
    assert StabilityRule().round_allowance(RoundContext(0.0, 0, 300.0, inst.cluster, (), None, None)) is None
    assert StabilityRule(enabled=False, change_budget_per_job=1).round_allowance(
        RoundContext(0.0, 0, 300.0, inst.cluster, (), None, None)) is None


class BudgetRecording:
    """A policy that checks the wrapped policy moved at most its round's allowance of running jobs."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.moves_seen = 0

    def decide(self, ctx) -> Decisions:
        d = self.inner.decide(ctx)
        k = self.inner.stability.round_allowance(ctx)
        moved = [v.job_id for v in ctx.jobs
                 if v.current is not None and v.job_id in d.grids and d.grids[v.job_id] != v.current.grid]
        assert len(moved) <= k, f"round {ctx.round_index}: {len(moved)} running jobs moved, allowance {k}"
        if k == 0:      # a spent budget freezes every running job: not preempted either
            assert all(v.job_id in d.grids for v in ctx.jobs if v.current is not None)
        self.moves_seen += len(moved)
        # info's "frozen" counts the rule's jobs only; the ones the budget held are apart
        assert d.info.get("frozen", 0) == len(self.inner.stability.frozen(ctx)), d.info
        return d


@pytest.mark.parametrize("name,opts", [("arena", {}), ("arena", {"search": "incremental"}), ("suika", {}),
                                       ("sia-ap", {}), ("gavel-ap", {}), ("elasticflow-ls-ap", {})])
def test_change_budget_bounds_moves_per_round_and_reconfigurations_per_job(name, opts):
    inst = get_instance("demo")
    pol = BudgetRecording(make_policy(name, change_budget_per_job=0.5, **opts))
    res = simulate(inst, pol, perf=_table(), rounds=120, reconfig=ReconfigCostModel())
    assert pol.moves_seen > 0                                   # the budget was spent, not just kept
    finished = sum(1 for r in res.jobs if r.status == "finished")
    changes = sum(r.reconfigurations for r in res.jobs)          # moves and resumes after preemptions
    assert changes <= 0.5 * finished + sum(r.preemptions for r in res.jobs)
    spent = [r.changes_total for r in res.rounds]                 # rounds.csv's running count of the spend
    assert spent == sorted(spent) and spent[-1] == len(res.moves) + sum(r.preemptions for r in res.rounds) > 0
    free = simulate(inst, make_policy(name, **opts), perf=_table(), rounds=120, reconfig=ReconfigCostModel())
    assert sum(r.reconfigurations for r in free.jobs) > 0.5 * finished   # without it, more (the test can fail)


@pytest.mark.parametrize("cfg", [{"change_budget_per_job": -1}, {"change_budget_per_job": "lots"},
                                 {"stability": "maybe"}, {"max_moves_per_hour": -1}, {"max_moves_per_hour": 1.5},
                                 {"payback_max_s": "x"}, {"max_changes_per_job": -2}, {"max_changes_per_job": "one"},
                                 {"move_backoff_s": -1}, {"move_backoff_s": "inf"}])
def test_stability_config_is_validated(cfg):
    with pytest.raises(InputError):
        make_policy("arena", **cfg)


class Recording:
    """A policy that records what the wrapped policy decided for the jobs its rule froze."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.frozen_checked = 0

    def decide(self, ctx) -> Decisions:
        d = self.inner.decide(ctx)
        for jid in self.inner.stability.frozen(ctx):
            v = ctx.job(jid)
            assert d.grids.get(jid) == v.current.grid, f"round {ctx.round_index}: frozen job {jid} was moved"
            self.frozen_checked += 1
        return d


@pytest.mark.parametrize("name", ["arena", "sia-ap"])
def test_frozen_jobs_keep_their_grid_and_moves_drop(name):
    inst = get_instance("demo")
    pol = Recording(make_policy(name))
    stable = simulate(inst, pol, perf=_table(), rounds=60, reconfig=ReconfigCostModel())
    assert pol.frozen_checked > 0
    free = simulate(inst, make_policy(name, stability=False, **{"reconfig.hysteresis": 0}), perf=_table(),
                    rounds=60, reconfig=ReconfigCostModel())
    assert stable.summary["reconfigurations"] < free.summary["reconfigurations"]


def _table():
    from estimators import make_performance_model
    return make_performance_model("table")


layouts = st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))


@settings(max_examples=200, deadline=None)
@given(old=layouts, new=layouts, kept=st.integers(0, 64))
def test_changed_owner_bytes_properties(old, new, kept):
    n_new = new[0] * new[1] * new[2]
    need = changed_owner_bytes(1.0, old, new, 0)            # nothing kept: every new rank receives its share
    assert need >= 1.0 - 1e-12                              # at least one whole copy of the state
    moved = changed_owner_bytes(1.0, old, new, kept)
    assert -1e-12 <= moved <= need + 1e-12
    assert changed_owner_bytes(1.0, old, new, kept + 1) <= moved + 1e-12     # keeping more moves less
    if old == new:
        assert changed_owner_bytes(1.0, old, new, n_new) == pytest.approx(0.0, abs=1e-12)


def test_best_plan_per_count_keeps_one_column_per_type_and_count():
    from engine.core.context import RoundContext
    from engine.decide.formulation.round_data import best_plan_per_count, build_round_data
    inst = get_instance("demo")
    views = tuple(JobView(j, float(j.num_iterations), None) for j in inst.jobs[:6])
    ctx = RoundContext(0.0, 0, 300.0, inst.cluster, views, _table(), ReconfigCostModel())
    data = build_round_data(ctx, ctx.perf)
    ap = best_plan_per_count(data)
    assert ap.n_cols < data.n_cols
    for j in range(data.n_jobs):
        full = [k for k in range(data.n_cols) if data.col_job[k] == j]
        kept = [k for k in range(ap.n_cols) if ap.col_job[k] == j]
        keys = {(int(data.col_type[k]), int(data.col_gpus[k])) for k in full}
        assert len(kept) == len(keys)
        for k in kept:
            same = [q for q in full if (data.col_type[q], data.col_gpus[q]) == (ap.col_type[k], ap.col_gpus[k])]
            assert ap.col_throughput[k] == max(data.col_throughput[q] for q in same)


def test_policies_decide_from_estimates_by_default(tmp_path, monkeypatch):
    from engine.cli.common import build_perf
    from estimators.perf import default_kind, learned_artifact_path
    monkeypatch.setenv("ARENA_LEARNED_ARTIFACT", str(tmp_path / "none.joblib"))
    assert learned_artifact_path() == tmp_path / "none.joblib"
    assert default_kind() == "analytic"
    assert build_perf(None, "arena").kind == "analytic"
    assert build_perf(None, "fcfs") is None
    assert build_perf("table", "arena").kind == "table"       # the labelled mode


def test_fixed_columns_leave_the_model_but_keep_their_capacity_and_value():
    import numpy as np

    from engine.core.context import RoundContext
    from engine.decide.formulation import build_model, build_round_data
    from engine.decide.solvers.lagrangian import applicable
    inst = get_instance("demo")
    views = tuple(JobView(j, float(j.num_iterations), None) for j in inst.jobs[:8])
    ctx = RoundContext(0.0, 0, 300.0, inst.cluster, views, _table(), ReconfigCostModel())
    data = build_round_data(ctx, ctx.perf)
    obj = make_policy("arena").objective
    full = build_model(data, obj)
    fixed = np.array([0, int(np.searchsorted(data.col_job, 3))])          # one column of jobs 0 and 3
    cols = np.setdiff1d(np.arange(data.n_cols), fixed)
    part = build_model(data, obj, columns=cols, fixed=fixed)
    assert applicable(part)                                                 # the fast path stays open
    x = np.zeros(full.n_x)
    x[fixed] = 1.0
    act = full.A[:, : full.n_x] @ x
    np.testing.assert_allclose(part.row_ub, full.row_ub - act)
    assert part.offset == pytest.approx(full.offset + full.c[fixed].sum())
    np.testing.assert_allclose(part.c[: part.n_x], full.c[cols])
    with pytest.raises(ValueError, match="outside the given columns"):
        build_model(data, obj, columns=np.arange(data.n_cols), fixed=fixed)
    with pytest.raises(ValueError, match="choice-variable indices"):
        build_model(data, obj, columns=cols[:-1], fixed=np.array([data.n_cols]))


def test_preemption_is_charged_the_resume_it_will_cost():
    import numpy as np

    from engine.core.context import RoundContext
    from engine.decide.formulation import build_model, build_round_data
    inst = get_instance("demo")
    j0 = inst.jobs[0]
    views = [JobView(j, float(j.num_iterations), None) for j in inst.jobs[1:6]]
    realistic = ReconfigCostModel.from_options({"preset": "realistic"})
    probe = RoundContext(0.0, 0, 300.0, inst.cluster, (JobView(j0, 100.0, None),), _table(), realistic)
    g = build_round_data(probe, probe.perf).grids[0]
    running = JobView(j0, 100.0, Allocation(g, tuple((0, i) for i in range(g.num_gpus))), attained_gpu_s=1.0)
    ctx = RoundContext(0.0, 0, 300.0, inst.cluster, (running, *views), _table(), realistic)
    data = build_round_data(ctx, ctx.perf)
    assert data.current_col[0] >= 0 and data.resume_s[0] > 0 and (data.resume_s[1:] == 0).all()
    on = build_model(data, make_policy("arena").objective)
    off = build_model(data, make_policy("arena", **{"reconfig.preemption": False}).objective)
    bonus = on.c[: on.n_x] - off.c[: off.n_x]
    mine = data.col_job == 0
    assert (bonus[mine] > 0).all() and np.allclose(bonus[mine], bonus[mine][0]) and (bonus[~mine] == 0).all()


def test_event_driven_option_decides_fewer_rounds():
    inst = get_instance("demo")
    every = simulate(inst, make_policy("arena"), perf=_table(), rounds=60, reconfig=ReconfigCostModel())
    events = simulate(inst, make_policy("arena", event_driven="true"), perf=_table(), rounds=60,
                      reconfig=ReconfigCostModel())
    assert events.summary["rounds_decided"] < every.summary["rounds_decided"]
    assert events.summary["jobs_finished"] > 0
    with pytest.raises(InputError):
        make_policy("arena", event_driven="sometimes")
