"""The incremental re-scheduling search (engine/decide/incremental): feasible on the full model,
frozen jobs and the move budget respected, expand and balance each matter, the
restricted model is the full one restricted, suika runs the demo, the yardstick and
its CLI."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli.main import main
from engine.core.policy import make_policy
from engine.decide.formulation import build_model, synthetic_round_data, tiny_round_data
from engine.decide.formulation.synthetic import local_columns
from engine.decide.incremental import (
    OTHER_TYPE_CHOICES,
    QUEUED_CHOICES,
    IncrementalConfig,
    SearchSteps,
    candidate_columns,
    search_round,
)
from engine.decide.incremental.yardstick import summarize, yardstick
from engine.decide.objectives import parse_objective
from engine.decide.solvers import make_backend
from instances.errors import InputError

ARENA = {"throughput": 1.0, "jct": 1.0, "queue": 1.0, "reconfig": 1.0}
OBJ = parse_objective({}, ARENA)


def decide(data, config=IncrementalConfig(), frozen=frozenset(), objective=OBJ):
    """(full model, the decision as a 0/1 vector over the full model's columns, solution)."""
    model, cols, sol = search_round(data, objective, config, frozen=frozen)
    x = np.zeros(data.n_cols)
    x[cols[model.selected(sol.values)]] = 1.0
    return build_model(data, objective), x, sol


def moved(data, x):
    chosen = {int(data.col_job[k]): int(k) for k in np.flatnonzero(x)}
    out = [j for j in range(data.n_jobs) if data.current_col[j] >= 0 and chosen.get(j, -1) != data.current_col[j]]
    gpus = sum(int(data.col_gpus[chosen[j]]) for j in out if j in chosen)
    return out, gpus


def sequence_round(gpus, jobs, seed, per_gpu=10.0):
    """Round 1 of a synthetic sequence: starts from round 0's full-MILP decision."""
    d0 = synthetic_round_data(gpus, jobs, seed, current={}, reconfig_s_per_gpu=per_gpu, reconfig_cap_s=40.0)
    m0 = build_model(d0, OBJ)
    sol = make_backend("highs").solve(m0, 20.0)
    cur = local_columns(d0, m0.selected(sol.values))
    return synthetic_round_data(gpus, jobs, seed, round_index=1, current=cur, reconfig_s_per_gpu=per_gpu,
                                reconfig_cap_s=40.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([16, 32, 64, 128]), jobs=st.integers(1, 40), seed=st.integers(0, 10_000),
       running=st.floats(0.0, 1.0), budget=st.sampled_from([0.0, 0.1, 1.0]), queued=st.sampled_from(["all", "small"]))
def test_search_never_violates_a_row_and_keeps_the_budget(gpus, jobs, seed, running, budget, queued):
    # random current columns: the start may itself violate capacity (repaired by stopping jobs)
    data = synthetic_round_data(gpus, jobs, seed, running_fraction=running)
    cfg = IncrementalConfig(queued=queued, move_budget_jobs=budget, move_budget_gpus=budget)
    frozen = frozenset(data.job_ids[j] for j in np.flatnonzero(data.current_col >= 0)[::3])
    full, x, sol = decide(data, cfg, frozen=frozen)
    assert full.violation(x) <= 1e-9
    if sol.extra["repair_stops"] == 0:      # frozen jobs are stopped only to repair a start that does not fit
        assert all(x[data.current_col[data.job_ids.index(jid)]] == 1.0 for jid in frozen)
    assert sol.objective == pytest.approx(full.objective_value(x))      # same c @ x + offset
    lim_jobs, lim_gpus = cfg.limits(data)
    mv, mv_gpus = moved(data, x)
    # forced stops (a start that violates a row) are not moves of the budget
    assert len(mv) - sol.extra["repair_stops"] <= lim_jobs
    assert sol.extra["moved_jobs"] <= lim_jobs and sol.extra["moved_gpus"] <= lim_gpus
    if sol.extra["repair_stops"] == 0:
        assert sol.extra["moved_jobs"] == len(mv) and sol.extra["moved_gpus"] == mv_gpus


@pytest.mark.parametrize("seed", [0, 1])
def test_search_from_a_real_start_is_feasible_and_close_to_the_milp(seed):
    data = sequence_round(128, 40, seed)
    full, x, sol = decide(data)
    assert full.violation(x) <= 1e-9 and sol.extra["repair_stops"] == 0
    opt = make_backend("highs").solve(full, 20.0, rel_gap=1e-6)
    c = full.c[: full.n_x]
    assert c @ x <= opt.bound + 1e-6
    stay = np.zeros(data.n_cols)
    stay[data.current_col[data.current_col >= 0]] = 1.0
    assert c @ x >= c @ stay - 1e-9                     # never worse than staying put
    assert c @ x >= 0.9 * (c @ opt.values[: full.n_x])


def test_frozen_jobs_keep_exactly_their_column():
    data = sequence_round(128, 40, 3)
    running = [data.job_ids[j] for j in np.flatnonzero(data.current_col >= 0)]
    _, x_free, _ = decide(data)
    moved_free = {data.job_ids[j] for j in moved(data, x_free)[0]}
    assert moved_free, "the round should move someone when nothing is frozen"
    frozen = frozenset(running)
    _, x, sol = decide(data, frozen=frozen)
    for j in np.flatnonzero(data.current_col >= 0):
        assert x[data.current_col[j]] == 1.0
    assert sol.extra["moved_jobs"] == 0


def two_job_round(**kw):
    """8 a100 GPUs on one node. A runs on 8 with little value; B waits and is worth much
    more on 8 GPUs (or 4). Nothing is free: only balance can help B."""
    return tiny_round_data({"a100": [8]}, [
        {"id": "A", "cols": [("a100", 1, 8, 1.0), ("a100", 1, 4, 0.6)], "current": 0, "remaining": 1e6},
        {"id": "B", "cols": [("a100", 1, 8, 8.0), ("a100", 1, 4, 5.0)], "remaining": 1e3}], **kw)


def test_balance_moves_gpus_to_the_higher_marginal_gain():
    data = two_job_round()
    full, x, sol = decide(data)
    assert full.violation(x) <= 1e-9
    with_balance = full.c[: full.n_x] @ x
    _, x_nb, _ = decide(data, IncrementalConfig(steps=SearchSteps(balance=False)))
    assert x_nb[0] == 1.0 and x_nb[2:].sum() == 0        # without balance, B waits
    assert with_balance > full.c[: full.n_x] @ x_nb + 1e-6
    assert sol.extra["balance_moves"] >= 2
    # a zero move budget keeps A too (B is admitted only where it fits)
    _, x_b, _ = decide(data, IncrementalConfig(move_budget_jobs=0.0))
    assert x_b[0] == 1.0


def test_expand_admits_and_grows():
    data = tiny_round_data({"a100": [8]}, [
        {"id": "A", "cols": [("a100", 1, 2, 1.0), ("a100", 1, 4, 2.5)], "current": 0},
        {"id": "B", "cols": [("a100", 1, 2, 1.0), ("a100", 1, 4, 1.5)]}])
    full, x, _ = decide(data)
    c = full.c[: full.n_x]
    _, x_ne, sol_ne = decide(data, IncrementalConfig(steps=SearchSteps(expand=False)))
    assert x[1] == 1.0 and x[2:].sum() == 1.0           # A grew to 4, B admitted
    assert c @ x > c @ x_ne + 1e-6 and sol_ne.extra["expand_moves"] == 0


def test_restricted_model_is_the_full_model_restricted():
    data = synthetic_round_data(64, 20, 5)
    cols = candidate_columns(data, "small")
    assert 0 < len(cols) < data.n_cols
    full, part = build_model(data, OBJ), build_model(data, OBJ, columns=cols)
    assert np.allclose(part.c[: part.n_x], full.c[cols]) and part.offset == full.offset
    assert (abs(part.A - full.A[:, cols]) > 1e-12).nnz == 0
    assert np.array_equal(part.row_ub, full.row_ub)


def _plain_candidates(data, queued, other_type):
    """The candidate rule written with numpy over every column (the compiled pass in
    candidate_columns must give exactly these)."""
    k = np.arange(data.n_cols)
    cur = data.current_col[data.col_job]
    running = cur >= 0
    safe = np.where(running, cur, 0)
    g, t = data.col_gpus, data.col_type
    same_type = t == t[safe]
    compact = data.col_gpn == np.minimum(g, np.asarray(data.capacity.max_gpus_per_node)[t])
    neighbour = (k == cur) | (same_type & ((g == 2 * g[safe]) | (2 * g == g[safe]) | (g == g[safe]))) \
        | (~same_type & ((g == g[safe]) | (other_type == "any")) & compact)
    if queued == "all":
        queued_ok = np.ones(data.n_cols, dtype=bool)
    else:
        min_g = np.full(data.n_jobs, np.iinfo(np.int64).max)
        np.minimum.at(min_g, data.col_job, g)
        ref_g = np.where(data.requested_gpus > 0, np.maximum(data.requested_gpus, min_g), min_g)
        queued_ok = g <= ref_g[data.col_job]
    return np.flatnonzero(np.where(running, neighbour, queued_ok))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([16, 64, 256]), jobs=st.integers(0, 60), seed=st.integers(0, 10_000),
       running=st.floats(0.0, 1.0), queued=st.sampled_from(QUEUED_CHOICES),
       other_type=st.sampled_from(OTHER_TYPE_CHOICES))
def test_compiled_candidates_equal_the_plain_rule(gpus, jobs, seed, running, queued, other_type):
    data = synthetic_round_data(gpus, jobs, seed, running_fraction=running)
    assert candidate_columns(data, queued, other_type).tolist() == _plain_candidates(data, queued, other_type).tolist()


def _varied(data, seed):
    """The round with random per-job fields that terms read (deadlines, priorities,
    tenants, attained service, queueing, resume costs)."""
    rng = np.random.default_rng(seed)
    n = data.n_jobs
    return replace(data, deadline_s=np.where(rng.random(n) < 0.5, data.now_s + rng.uniform(1e2, 1e6, n), np.inf),
                   priority=rng.choice([0.5, 1.0, 2.0], n), tenants=tuple(rng.choice(["a", "b"], n).tolist()),
                   attained_gpu_s=rng.uniform(0, 1e6, n), queued_s=rng.uniform(0, 1e5, n),
                   resume_s=np.where(data.current_col >= 0, rng.uniform(0, 300, n), 0.0))


COLUMNWISE = [{}, {"w_las": 1.0}, {"w_deadline": 2.0}, {"w_quota": 1.0, "quota.quotas": "a=24,b=40"},
              {"w_makespan": 1.0, "makespan.basis": "reference"}, {"queue.aging_s": 600.0},
              {"reconfig.per_move": 0.25, "reconfig.horizon_rounds": 4.0}, {"reconfig.give_way": 3.0}, {"w_jct": 0.0}]
NOT_COLUMNWISE = [{"w_makespan": 1.0}, {"throughput.reference": "smallest"}, {"w_fairness": 1.0},
                  {"w_deadline": 1.0, "deadline.mode": "constraint"}]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([16, 64]), jobs=st.integers(1, 30), seed=st.integers(0, 10_000),
       running=st.floats(0.0, 1.0), cfg=st.sampled_from(COLUMNWISE), queued=st.sampled_from(QUEUED_CHOICES))
def test_columnwise_objectives_build_the_restricted_model_from_the_candidates_alone(gpus, jobs, seed, running,
                                                                                   cfg, queued):
    data = _varied(synthetic_round_data(gpus, jobs, seed, running_fraction=running), seed)
    obj = parse_objective(cfg, ARENA)
    assert obj.columnwise
    cols = candidate_columns(data, queued)
    part, alone = build_model(data, obj, columns=cols), build_model(data.restricted(cols), obj)
    assert np.array_equal(part.c, alone.c) and part.offset == alone.offset
    assert part.A.shape == alone.A.shape and (abs(part.A - alone.A) > 0).nnz == 0
    assert np.array_equal(part.row_lb, alone.row_lb) and np.array_equal(part.row_ub, alone.row_ub)
    assert list(part.row_names) == list(alone.row_names) and np.array_equal(part.col_job, alone.col_job)


def test_terms_that_read_a_jobs_other_columns_are_not_columnwise():
    """Each of these gives another model when built from a subset of columns, so the
    flag is what keeps search_round on the build-over-all path for them."""
    data = _varied(synthetic_round_data(64, 30, 3, running_fraction=0.5), 3)
    # deadlines only a job's fastest column meets: a queued job's is often not a small one
    need = data.remaining_iterations[data.col_job] / data.col_rate_iters_per_s()
    fastest = np.full(data.n_jobs, np.inf)
    np.minimum.at(fastest, data.col_job, need)
    data = replace(data, deadline_s=data.now_s + fastest * 1.0001)
    cols = candidate_columns(data, "small")
    for cfg in NOT_COLUMNWISE:
        obj = parse_objective(cfg, ARENA)
        assert not obj.columnwise, cfg
        part, alone = build_model(data, obj, columns=cols), build_model(data.restricted(cols), obj)
        same = part.A.shape == alone.A.shape and np.array_equal(part.c, alone.c) \
            and (abs(part.A - alone.A) > 0).nnz == 0 and np.array_equal(part.row_lb, alone.row_lb)
        assert not same, cfg


def test_restricted_round_keeps_every_job_and_refuses_to_drop_a_current_column():
    data = synthetic_round_data(64, 20, 1, running_fraction=0.5)
    cols = candidate_columns(data, "small")
    r = data.restricted(cols)
    assert r.n_jobs == data.n_jobs and r.n_cols == len(cols)
    run = data.current_col >= 0
    assert np.array_equal(cols[r.current_col[run]], data.current_col[run]) and np.all(r.current_col[~run] == -1)
    assert np.array_equal(r.speedup, data.speedup[cols])
    running_col = int(data.current_col[np.flatnonzero(run)[0]])
    with pytest.raises(ValueError, match="current column"):
        data.restricted(cols[cols != running_col])
    with pytest.raises(ValueError, match="sorted"):
        data.restricted(cols[::-1])


def test_candidates_of_a_running_job_are_its_neighbours():
    data = tiny_round_data({"a100": [8, 8], "v100": [8]}, [
        {"cols": [("a100", 1, 4, 1.0), ("a100", 1, 8, 1.8), ("a100", 1, 2, 0.6), ("a100", 1, 1, 0.3),
                  ("a100", 2, 8, 3.0), ("a100", 2, 2, 1.7), ("v100", 1, 4, 0.9), ("v100", 2, 2, 0.8),
                  ("v100", 1, 8, 1.5)], "current": 0},
        {"cols": [("a100", 1, 1, 1.0), ("a100", 2, 8, 2.0)]}])
    got = set(candidate_columns(data, "all").tolist())
    # current, x2 (1x8), /2 (1x2), same count other shape (2x2), other type compact (v100 1x4); queued: all
    assert got == {0, 1, 2, 5, 6, 9, 10}
    assert set(candidate_columns(data, "small").tolist()) == {0, 1, 2, 5, 6, 9}
    # other_type="any": the other type at every count in its compact shape (v100 1x8 too, not 2x2)
    assert set(candidate_columns(data, "all", "any").tolist()) == {0, 1, 2, 5, 6, 8, 9, 10}
    with pytest.raises(ValueError):
        candidate_columns(data, "all", "some")


def test_incremental_option_and_suika_are_validated():
    assert make_policy("arena", search="incremental").search == "incremental"
    assert make_policy("suika").search == "incremental"
    assert make_policy("suika").incremental.other_type == "same"
    assert make_policy("suika", other_type_candidates="any").incremental.other_type == "any"
    for name, cfg, field in [("arena", {"search": "bogus"}, "search"), ("suika", {"search": "milp"}, "search"),
                             ("arena", {"move_budget_jobs": 2}, "move_budget_jobs"),
                             ("arena", {"move_budget_gpus": -1}, "move_budget_gpus"),
                             ("arena", {"queued_candidates": "some"}, "queued_candidates"),
                             ("suika", {"other_type_candidates": "all"}, "other_type_candidates")]:
        with pytest.raises(InputError) as e:
            make_policy(name, **cfg)
        assert e.value.field == field


@pytest.mark.parametrize("search", ["milp", "incremental"])
def test_stability_seam_freezes_a_job_in_both_searches(search):
    from engine.core.context import JobView
    from instances.allocation import Allocation
    from instances.grid import Grid, Shape
    from tests.test_policies_arena import TypeSpeedPerf, ctx_of, job
    cur = Allocation(Grid(Shape("a40", 2, 2)), ((1, 0), (1, 1), (2, 0), (2, 1)))
    ctx = ctx_of([JobView(job(gpus=4), 1000.0, cur)], TypeSpeedPerf({"a100": 2.0, "a40": 1.0}))
    pol = make_policy("arena", search=search)
    assert pol.decide(ctx).grids["j"].gpu_type == "a100-40gb"        # worth the move
    from engine.core.context import ChangeHistory
    started = ChangeHistory(changed_at_s=0.0, iterations_since=0.0, rate_before=0.0)   # not one step made yet
    ctx = ctx_of([JobView(job(gpus=4), 1000.0, cur, last_change=started)], TypeSpeedPerf({"a100": 2.0, "a40": 1.0}))
    d = pol.decide(ctx)
    assert d.grids["j"] == cur.grid and d.stats.frozen == 1


def test_suika_runs_the_demo_end_to_end(capsys, tmp_path):
    assert main(["simulate", "--instance", "demo", "--policy", "suika", "--run-out", "--quiet", "--no-plots",
                 "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "all jobs finished" in out


def test_yardstick_rounds_and_cli_json(capsys):
    rows = yardstick(64, 20, 2, OBJ, IncrementalConfig(), seed=1, reconfig_s_per_gpu=10.0, reconfig_cap_s=40.0)
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.5 < r["ratio"] <= 1.0 + 0.011        # the MILP is proved within 1%
        assert r["incremental_value"] >= r["stay_value"] - 1e-9
        parts = [r[f"incremental_{k}_s"] for k in ("setup", "expand", "balance")]
        assert all(p >= 0 for p in parts) and sum(parts) <= r["incremental_search_s"]
    assert summarize(rows)["rounds"] == 2
    assert main(["bench", "incremental", "--gpus", "64", "--jobs", "20", "--rounds", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["rounds"] == 1 and doc["rounds"][0]["candidates"] > 0
    assert main(["bench", "incremental", "--queued", "some", "--rounds", "1"]) != 0
    assert "--queued" in capsys.readouterr().err


def test_pinned_jobs_are_admitted_first_and_never_stopped():
    data = two_job_round()
    model, cols, sol = search_round(data, OBJ, IncrementalConfig(), pinned=frozenset({"A"}))
    chosen = set(cols[model.selected(sol.values)].tolist())
    assert chosen & {0, 1}, "pinned A keeps a grid"
    assert sol.status == "feasible"
    # a pinned queued job is admitted at any price: balance stops A for it
    full = tiny_round_data({"a100": [4]}, [
        {"id": "A", "cols": [("a100", 1, 4, 1.0)], "current": 0},
        {"id": "P", "cols": [("a100", 1, 4, 0.1)]}])
    model, cols, sol = search_round(full, OBJ, IncrementalConfig(), pinned=frozenset({"P"}))
    assert cols[model.selected(sol.values)].tolist() == [1] and sol.status == "feasible"
    # two pinned jobs that cannot both run: the round is a fallback, and says why
    model, cols, sol = search_round(full, OBJ, IncrementalConfig(), pinned=frozenset({"P", "A"}))
    assert sol.status == "fallback" and "pinned" in sol.message


@pytest.mark.parametrize("cfg", [{"w_fairness": 1.0}, {"w_fairness": 1.0, "fairness.kind": "power"},
                                 {"w_quota": 1.0, "quota.quotas": "default=40"}, {"w_las": 1.0}])
def test_other_objective_terms_keep_the_search_exact_and_feasible(cfg):
    """Rows a term adds are respected; continuous variables (fairness) are set after the
    search, and the reported objective is the full model's on the decision."""
    obj = parse_objective(cfg, ARENA)
    for seed in range(2):
        data = synthetic_round_data(64, 30, seed, running_fraction=0.3)
        model, cols, sol = search_round(data, obj, IncrementalConfig())
        full = build_model(data, obj)
        v = np.zeros(full.n_vars)
        v[cols[model.selected(sol.values)]] = 1.0
        v[full.n_x:] = sol.values[model.n_x:]
        assert full.violation(v) <= 1e-6
        assert full.objective_value(v) == pytest.approx(sol.objective)


def _reference_expand(st) -> None:
    """The expand step written plainly (no heap, no compiled code): each job's columns in
    order of gain per GPU added, a pointer per job past the columns found not to fit;
    repeatedly the job whose pointed move has the largest density (ties: lower job)
    moves if it still fits, else its pointer advances."""
    from engine.decide.incremental.kernel import EPS
    n_x, n_jobs = st.n_x, len(st.lo)

    def delta(j, k):
        old = st.assign[j]
        was = st.running0[j] and old != st.start[j]
        now = st.running0[j] and k != st.start[j]
        return np.concatenate([st.U[k] - st.U[old], [float(now) - float(was), st.gpus[k] * now - st.gpus[old] * was]])

    def fits(j, k):
        return bool(np.all(delta(j, k) <= st.ub - st.act + EPS))

    def rank(j):
        cur, out = st.assign[j], []
        for k in range(st.lo[j], st.hi[j]):
            gain = st.c[k] - st.c[cur]
            if st.frozen[j] or k == cur or gain <= EPS:
                d = -np.inf
            elif st.pinned[j] and cur == n_x:
                d = np.inf
            else:
                added = st.gpus[k] - st.gpus[cur] if st.ctype[k] == st.ctype[cur] else st.gpus[k]
                d = gain / max(added, 1.0)
            out.append((k, d))
        return sorted(out, key=lambda kd: -kd[1])           # stable: ties in column order

    def skip(j):                                            # to the next move that fits, or past the end
        while ptr[j] < len(ranked[j]) and ranked[j][ptr[j]][1] > -np.inf and not fits(j, ranked[j][ptr[j]][0]):
            ptr[j] += 1
        if ptr[j] < len(ranked[j]) and ranked[j][ptr[j]][1] == -np.inf:
            ptr[j] = len(ranked[j])

    ranked = [rank(j) for j in range(n_jobs)]
    ptr = [0] * n_jobs
    for j in range(n_jobs):
        skip(j)
    while True:
        live = [j for j in range(n_jobs) if ptr[j] < len(ranked[j])]
        if not live:
            return
        j = max(live, key=lambda i: (ranked[i][ptr[i]][1], -i))
        k = ranked[j][ptr[j]][0]
        if fits(j, k):
            st.act += delta(j, k)
            st.assign[j] = k
            st.counts[0] += 1
            ranked[j], ptr[j] = rank(j), 0
        else:
            ptr[j] += 1
        skip(j)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([16, 32, 64]), jobs=st.integers(1, 30), seed=st.integers(0, 10_000),
       running=st.floats(0.0, 1.0), budget=st.sampled_from([0.0, 0.2, 1.0]))
def test_compiled_expand_equals_the_plain_reference(gpus, jobs, seed, running, budget):
    from engine.decide.incremental.search import SearchState
    data = synthetic_round_data(gpus, jobs, seed, running_fraction=running)
    cols = candidate_columns(data)
    model = build_model(data, OBJ, columns=cols)
    cur = data.current_col
    start = np.where(cur >= 0, np.searchsorted(cols, np.maximum(cur, 0)), -1)
    frozen = np.zeros(data.n_jobs, dtype=bool)
    frozen[np.flatnonzero(cur >= 0)[::4]] = True
    lim_jobs, lim_gpus = IncrementalConfig(move_budget_jobs=budget, move_budget_gpus=budget).limits(data)
    a, b = (SearchState(model, start, data.col_gpus[cols], data.col_type[cols], frozen, lim_jobs, lim_gpus)
            for _ in range(2))
    a.repair_start()
    b.repair_start()
    a.expand()
    _reference_expand(b)
    assert a.assign.tolist() == b.assign.tolist() and a.counts[0] == b.counts[0]
    assert np.allclose(a.act, b.act)
    # the second expand, after balance, keeps the rankings of the jobs balance left alone
    assert a.balance() == b.balance()
    a.expand()
    _reference_expand(b)
    assert a.assign.tolist() == b.assign.tolist() and a.counts.tolist() == b.counts.tolist()
    assert np.allclose(a.act, b.act)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expand_short_cuts_on_a_closed_cluster_equal_the_plain_reference(seed):
    """Expand's two short cuts (the destination type's capacity row first; a job passed
    over whole while every type is closed) skip only moves that would not fit. On a
    round where the queued jobs want far more than the cluster has, every type closes
    during expand, so the short cuts are taken; the decision equals the plain reference,
    which has none."""
    from engine.decide.incremental.search import SearchState
    data = synthetic_round_data(32, 60, seed, running_fraction=0.3)
    cols = candidate_columns(data)
    model = build_model(data, OBJ, columns=cols)
    assert model.capacity_rows is not None and np.all(model.capacity_rows >= 0)
    start = data.current_among(cols)
    a, b = (SearchState(model, start, data.col_gpus[cols], data.col_type[cols], np.zeros(data.n_jobs, dtype=bool),
                   np.inf, np.inf) for _ in range(2))
    assert np.all(a.cap >= 0)                  # every type's capacity row is known to the kernel
    a.repair_start()
    b.repair_start()
    a.expand()
    _reference_expand(b)
    assert a.all_types_closed()
    assert a.assign.tolist() == b.assign.tolist() and a.counts[0] == b.counts[0]
    assert np.allclose(a.act, b.act)


def test_the_kernels_helpers_are_compiled_without_reference_counting():
    """The speed the bench measures depends on it (docs/engine.md): a numba that no
    longer has the flag still runs the kernels, but this test says it lost it."""
    from engine.decide.incremental import kernel
    assert kernel.HELPER == {"_nrt": False}
