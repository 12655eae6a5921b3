"""The round model: capacity and node-shape rows hold on random rounds (hypothesis),
one grid per job, pinned jobs, best pipeline depth per shape, current grid kept."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.context import JobView, RoundContext
from engine.core.reconfig import ReconfigCostModel
from engine.decide.formulation import Capacity, build_model, build_round_data, tiny_round_data
from engine.decide.objectives import parse_objective
from engine.decide.solvers import make_backend
from estimators.base import Estimate
from instances.allocation import Allocation
from instances.cluster import ClusterSpec, NodeGroup
from instances.grid import Grid, Shape
from instances.jobs import Job

POW2 = [1, 2, 4, 8, 16]


@st.composite
def rounds(draw):
    types = draw(st.lists(st.sampled_from(["a100", "v100", "a40"]), min_size=1, max_size=3, unique=True))
    sizes = {t: draw(st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=4)) for t in types}
    jobs = []
    for _ in range(draw(st.integers(1, 10))):
        cols = []
        for _ in range(draw(st.integers(1, 5))):
            t = draw(st.sampled_from(types))
            m = draw(st.sampled_from([s for s in POW2 if s <= max(sizes[t])]))
            n = draw(st.integers(1, 3))
            cols.append((t, n, m, draw(st.floats(0.1, 10.0))))
        jobs.append({"cols": cols, "remaining": draw(st.floats(1.0, 1e5))})
    return sizes, jobs


def pack_aligned(node_sizes: list[int], chunks: list[int]) -> bool:
    """Place power-of-two chunks on aligned offsets, largest first (first fit)."""
    free = [np.ones(s, dtype=bool) for s in node_sizes]
    for c in sorted(chunks, reverse=True):
        for f in free:
            done = False
            for off in range(0, len(f) - c + 1, c):
                if f[off:off + c].all():
                    f[off:off + c] = False
                    done = True
                    break
            if done:
                break
        else:
            return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds(), st.sampled_from(["highs", "lagrangian", "greedy"]))
def test_decisions_fit_capacity_and_node_shapes(r, backend):
    sizes, jobs = r
    data = tiny_round_data(sizes, jobs)
    model = build_model(data, parse_objective({}, {"throughput": 1, "queue": 1}))
    sol = make_backend(backend).solve(model, 10.0)
    chosen = sol.selected(model.n_x)
    assert len(set(data.col_job[chosen].tolist())) == len(chosen)          # one grid per job
    for ti, t in enumerate(data.capacity.types):
        mine = [k for k in chosen if data.col_type[k] == ti]
        assert sum(int(data.col_gpus[k]) for k in mine) <= sum(sizes[t])
        chunks = [int(data.col_gpn[k]) for k in mine for _ in range(int(data.col_nodes[k]))]
        assert pack_aligned(sizes[t], chunks), (t, sizes[t], chunks)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b"]), st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1,
                                                             max_size=5), min_size=1))
def test_capacity_blocks_count_aligned_blocks(sizes):
    cap = Capacity.from_node_sizes(sizes)
    for ti, t in enumerate(cap.types):
        for lvl, blocks in zip(cap.levels[ti], cap.blocks[ti]):
            assert blocks == sum(s // lvl for s in sizes[t])
        assert cap.levels[ti][-1] == max(sizes[t])


def test_pinned_job_must_run():
    jobs = [{"cols": [("a100", 1, 1, 5.0)], "id": "fast"}, {"cols": [("a100", 1, 1, 1.0)], "id": "slow"}]
    data = tiny_round_data({"a100": [1]}, jobs)
    obj = parse_objective({}, {"throughput": 1})
    free = make_backend("highs").solve(build_model(data, obj), 5.0)
    assert free.selected(2).tolist() == [0]
    pinned = make_backend("highs").solve(build_model(data, obj, pinned=frozenset({"slow"})), 5.0)
    assert pinned.selected(2).tolist() == [1]


def test_round_data_derives_its_arrays_once_and_read_only():
    jobs = [{"cols": [("a100", 1, 1, 5.0), ("a100", 1, 2, 8.0)], "id": "a"}, {"cols": [("a100", 1, 1, 1.0)], "id": "b"}]
    data = tiny_round_data({"a100": [2]}, jobs)
    assert data.speedup is data.speedup and data.col_gpus is data.col_gpus      # computed once per round
    np.testing.assert_allclose(data.speedup, data.col_throughput / data.ref_throughput[data.col_job])
    np.testing.assert_array_equal(data.col_gpus, data.col_nodes * data.col_gpn)
    for arr in (data.speedup, data.col_gpus, data.remaining_time_ref_s):
        with pytest.raises(ValueError):                  # one objective term cannot change what the next reads
            arr[0] = 0


class FakePerf:
    """Throughput by GPU type and pipeline depth (a stand-in estimator for this test)."""
    name = "fake"
    SPEED = {"a100": 3.0, "a40": 1.0}

    def estimate(self, job, grid):
        thr = self.SPEED[grid.gpu_type.split("-")[0]] * grid.num_gpus ** 0.8 * (1.0 + 0.1 * (grid.pp == 2))
        return Estimate(job.global_batch / thr, thr, 1e9, None, True, "fake")


def fake_grids(job, cluster, max_gpus=16):
    out = []
    for t, gpn in (("a100", 4), ("a40", 2)):
        for n in (1, 2, 4):
            m = min(n, gpn)
            out += [Grid(Shape(t, n // m, m), pp) for pp in (1, 2) if n % pp == 0]
    return out


def test_round_data_keeps_the_best_depth_per_shape_and_the_current_grid():
    cluster = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("a40", 2, 2)))
    job = Job("j", "gpt__350M", 64, 100, 0.0)
    cur = Grid(Shape("a100", 1, 2), 1)          # pp=1 is slower than pp=2 on this shape
    views = (JobView(job, 100.0, Allocation(cur, ((0, 0), (0, 1)))),
             JobView(Job("k", "gpt__350M", 64, 100, 0.0), 50.0, None))
    ctx = RoundContext(0.0, 0, 300.0, cluster, views, FakePerf(), ReconfigCostModel())
    data = build_round_data(ctx, ctx.perf, grids_fn=fake_grids)
    shapes = [(data.col_type[k], data.col_nodes[k], data.col_gpn[k]) for k in range(data.n_cols)
              if data.col_job[k] == 0]
    assert len(shapes) == len(set(shapes))                 # one column per shape
    for k in range(data.n_cols):
        g = data.grids[k]
        if data.col_job[k] == 0 and g.shape == cur.shape:
            assert g == cur and data.current_col[0] == k and data.col_reconfig_s[k] == 0.0
        elif g.num_gpus % 2 == 0 and g.shape != cur.shape:
            assert g.pp == 2                                # the faster depth
    # moving the running job costs the shared model's downtime; launching the queued one too
    other = [k for k in range(data.n_cols) if data.col_job[k] == 0 and data.grids[k] != cur]
    assert all(data.col_reconfig_s[k] > 0 for k in other)
    assert data.current_col[1] == -1


def test_model_building_is_fast_at_scale():
    import time

    from engine.decide.formulation import synthetic_round_data
    data = synthetic_round_data(2048, 1000, 0)
    t0 = time.perf_counter()
    model = build_model(data, parse_objective({}, {"throughput": 1, "jct": 1, "queue": 1, "reconfig": 1}))
    assert time.perf_counter() - t0 < 1.0       # ~0.01-0.03 s measured; generous for shared CI
    assert model.n_x == data.n_cols and model.n_rows > data.n_jobs


def test_bad_model_arrays_are_rejected():
    from engine.decide.formulation import ModelBuilder
    b = ModelBuilder(2, np.array([0, 0]), 1)
    with pytest.raises(ValueError):
        b.add_x_objective(np.array([1.0]))
    with pytest.raises(ValueError):
        b.add_x_objective(np.array([1.0, np.nan]))
    with pytest.raises(ValueError):
        b.add_rows(np.array([1]), np.array([0]), np.array([1.0]), 0.0, 1.0, ["r"])


def test_row_names_are_made_when_read_and_match_the_rows():
    """Job rows are named ``job_<id>`` and capacity rows ``cap_<type>_l<level>``, one name
    per row in row order, for the full and the restricted model alike (the names are
    made lazily; the Lagrangian keys its warm prices by them)."""
    data = tiny_round_data({"a100": [8, 8], "v100": [4]},
                           [{"id": "a", "cols": [("a100", 1, 8, 4.0), ("v100", 1, 4, 2.0)]},
                            {"id": "b", "cols": [("a100", 2, 8, 7.0)]}])
    obj = parse_objective({}, {"throughput": 1.0})
    for model in (build_model(data, obj), build_model(data, obj, columns=np.array([0, 2]))):
        names = list(model.row_names)
        assert len(names) == model.n_rows
        assert names[:2] == ["job_a", "job_b"]
        assert names[2:] == ["cap_a100_l1", "cap_a100_l2", "cap_a100_l4", "cap_a100_l8",
                             "cap_v100_l1", "cap_v100_l2", "cap_v100_l4"]
        assert model.row_names[-1] == "cap_v100_l4" and model.row_names[1:3] == ["job_b", "cap_a100_l1"]
        with pytest.raises(IndexError):
            model.row_names[model.n_rows]
        assert model.names() == tuple(f"x{i}" for i in range(model.n_x))


def test_the_model_matrix_is_the_same_whichever_way_it_is_assembled():
    """Rows given in order become CSR directly; any other order goes through COO. Both
    give the same canonical matrix (duplicates summed)."""
    from engine.decide.formulation.model import ModelBuilder
    rng = np.random.default_rng(3)
    r = np.sort(rng.integers(0, 6, 60))
    c = rng.integers(0, 9, 60)
    v = rng.normal(size=60)
    mats = []
    for order in (np.arange(60), rng.permutation(60)):
        b = ModelBuilder(9, np.repeat(np.arange(3), 3), 3)
        b.add_rows(r[order], c[order], v[order], -np.inf, 1.0, [f"r{i}" for i in range(6)])
        A = b.build().A
        assert A.has_canonical_format
        mats.append(A.toarray())
    dense = np.zeros((6, 9))
    np.add.at(dense, (r, c), v)
    assert np.allclose(mats[0], dense) and np.allclose(mats[1], dense)


def _same_model(a, b) -> None:
    for f in ("c", "col_lb", "col_ub", "integral", "row_lb", "row_ub", "col_job"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.A.shape == b.A.shape and (a.A != b.A).nnz == 0
    assert list(a.row_names) == list(b.row_names)
    assert (a.n_x, a.n_jobs, a.offset, a.extra_names) == (b.n_x, b.n_jobs, b.offset, b.extra_names)
    for f in ("job_rows", "capacity_rows"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None and y is None) or np.array_equal(x, y), f


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans(), st.integers(0, 2), st.integers(0, 2)),
                min_size=2, max_size=12))
def test_rows_kept_across_rounds_build_the_model_built_afresh(calls):
    """``build_model`` with a ``RowsMemo`` over any sequence of rounds (other jobs or
    capacity, other objectives, some adding rows and variables, pinned jobs, a model
    restricted to some columns with or without a frozen job's column fixed, move budgets)
    gives the model built without it."""
    from engine.decide.formulation import synthetic_round_data
    from engine.decide.formulation.build import RowsMemo
    datas = [synthetic_round_data(64, 12, 0), synthetic_round_data(64, 12, 0, round_index=1),
             synthetic_round_data(64, 12, 1), synthetic_round_data(128, 12, 0)]
    objectives = [parse_objective({}, {"throughput": 1, "jct": 1, "queue": 1, "reconfig": 1}),
                  parse_objective({}, {"throughput": 1, "jct": 3}),
                  parse_objective({}, {"throughput": 1, "fairness": 1})]
    memo = RowsMemo()
    for d, o, pin, freeze, budget in calls:
        data = datas[d]
        pinned = frozenset(data.job_ids[:1]) if pin else frozenset()
        columns = fixed = None
        if freeze:
            out = data.current_col[data.current_col >= 0][:1]
            keep = np.ones(data.n_cols, dtype=bool)
            keep[out] = False
            columns = np.flatnonzero(keep)
            fixed = out if freeze == 2 else None
        moves = budget or None
        _same_model(build_model(data, objectives[o], pinned, columns, fixed, moves, memo=memo),
                    build_model(data, objectives[o], pinned, columns, fixed, moves))


def test_rows_kept_across_rounds_are_taken_as_they_are_only_while_their_inputs_stay_equal():
    from engine.decide.formulation import synthetic_round_data
    from engine.decide.formulation.build import RowsMemo
    data = synthetic_round_data(64, 12, 0)
    arena = parse_objective({}, {"throughput": 1, "jct": 1, "queue": 1, "reconfig": 1})
    memo = RowsMemo()
    first = build_model(data, arena, memo=memo)
    again = build_model(data, parse_objective({}, {"throughput": 1, "jct": 3}), memo=memo)
    assert again.A is first.A and not np.array_equal(again.c, first.c)      # only the objective is new
    other = build_model(synthetic_round_data(64, 12, 0, round_index=1), arena, memo=memo)
    assert other.A is not first.A
    pinned = build_model(data, arena, frozenset(data.job_ids[:1]), memo=memo)
    assert pinned.A is not first.A and pinned.row_lb.max() == 1.0
    one, two = (build_model(data, arena, max_moves=k, memo=memo) for k in (1, 2))
    assert two.A is not one.A and (one.row_ub[-1], two.row_ub[-1]) == (1.0, 2.0)


def _held_round(node_size: int, nodes: int, running: list[tuple[int, int]], queued: list[list[tuple[int, float]]],
                on_nodes: list[int] | None = None):
    """A one-type round (``node_size`` GPUs x ``nodes``) whose running jobs hold one
    single-node chunk each (``running``: (GPUs, throughput)), placed by the engine's
    placer (or on the lowest GPUs of the nodes ``on_nodes`` names, one per job); every
    running job has a column per single-node power-of-two shape, every queued one the
    (GPUs, throughput) columns ``queued`` gives. Returns the round data with ``held``,
    the placer and the running jobs' allocations."""
    from dataclasses import replace

    from engine.core.placement import Placer
    from engine.decide.formulation.round_data import held_on_nodes
    spec = ClusterSpec((NodeGroup("a100", nodes, node_size),))
    placer = Placer(spec)
    if on_nodes is None:
        current = dict(placer.place({f"r{i}": Grid(Shape("a100", 1, m)) for i, (m, _) in enumerate(running)},
                                    {}).allocations)
    else:
        used = [0] * nodes
        current = {}
        for i, ((m, _), n) in enumerate(zip(running, on_nodes)):
            current[f"r{i}"] = Allocation(Grid(Shape("a100", 1, m)), tuple((n, used[n] + k) for k in range(m)))
            used[n] += m
    sizes = [m for m in POW2 if m <= node_size]
    jobs = []
    for i, (m, thr) in enumerate(running):
        if f"r{i}" not in current:
            continue
        cols = [("a100", 1, g, thr * (g / m) ** 0.8) for g in sizes]
        jobs.append({"id": f"r{i}", "cols": cols, "current": sizes.index(m), "ref": thr})
    for i, cols in enumerate(queued):
        jobs.append({"id": f"q{i}", "cols": [("a100", 1, g, t) for g, t in cols if g <= node_size]
                     or [("a100", 1, 1, 1.0)]})
    data = tiny_round_data({"a100": [node_size] * nodes}, jobs)
    on = [[(n, c) for n, _, c in current[jid].node_masks] if jid in current else None for jid in data.job_ids]
    held = held_on_nodes(data.capacity, np.zeros(nodes, dtype=np.int64), np.full(nodes, node_size), on)
    return replace(data, held=held), placer, current


def test_the_shape_rows_see_the_gpus_running_jobs_keep():
    # two nodes of 4; A and C run on 2 GPUs each, one on each node; B (queued) is worth most
    # on a whole node. The whole-capacity rows admit all three as they are; the GPUs A and C
    # keep leave no whole node free, so with ``held`` one of them must move or give way
    data, placer, current = _held_round(4, 2, [(2, 1.0), (2, 1.0)], [[(4, 50.0)]], on_nodes=[0, 1])
    assert data.held.free_blocks == ((4, 2, 0),)
    assert data.held.gain.tolist() == [[2, 1, 1], [2, 1, 1], [0, 0, 0]]
    obj = parse_objective({"w_throughput": 1.0, "w_queue": 1.0}, {})

    def chosen(d):
        model = build_model(d, obj)
        sol = make_backend("highs").solve(model, 10.0, rel_gap=1e-9)
        return {d.job_ids[d.col_job[k]]: d.grids and d.grids[k] or (int(d.col_gpn[k])) for k in sol.selected(model.n_x)}

    from dataclasses import replace
    blind = chosen(replace(data, held=None))
    assert blind == {"r0": 2, "r1": 2, "q0": 4}                       # all three, as they are
    grids = {jid: Grid(Shape("a100", 1, m)) for jid, m in blind.items()}
    assert placer.place(grids, current).failed == ("q0",)                # which placement cannot map
    seen = chosen(data)
    assert seen["q0"] == 4 and len(seen) == 3                            # B on a whole node, A and C beside it
    grids = {jid: Grid(Shape("a100", 1, m)) for jid, m in seen.items()}
    assert not placer.place(grids, current).failed


@st.composite
def held_rounds(draw):
    """A one-type round whose running jobs sit on nodes drawn at random (fragmented, as
    jobs that came and went leave a cluster), for ``_held_round``."""
    node_size, nodes = draw(st.sampled_from([2, 4, 8])), draw(st.integers(1, 4))
    used, running, where = [0] * nodes, [], []
    for m, thr, n in draw(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.floats(0.5, 5.0),
                                             st.integers(0, nodes - 1)), max_size=8)):
        m = min(m, node_size)
        if used[n] + m <= node_size:
            used[n] += m
            running.append((m, thr))
            where.append(n)
    queued = draw(st.lists(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(0.1, 20.0)), min_size=1,
                                    max_size=3), max_size=6))
    return _held_round(node_size, nodes, running, queued, on_nodes=where)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held_rounds())
def test_a_decision_the_shape_rows_admit_places_around_what_running_jobs_keep(r):
    # single-node shapes: wherever the running jobs sit, the engine's placer maps every
    # decision the rows admit (the model's optimum, and the stay-put start); without
    # ``held`` the rows admit decisions it cannot map on such rounds
    data, placer, current = r
    obj = parse_objective({"w_throughput": 1.0, "w_queue": 1.0, "w_reconfig": 1.0}, {})
    model = build_model(data, obj)
    for backend in ("highs", "lagrangian"):
        sol = make_backend(backend).solve(model, 10.0, rel_gap=1e-6)
        assert model.violation(sol.values) <= 1e-6
        grids = {data.job_ids[data.col_job[k]]: Grid(Shape("a100", 1, int(data.col_gpn[k])))
                 for k in sol.selected(model.n_x)}
        kept = {j: a for j, a in current.items() if j in grids}
        assert not placer.place(grids, kept).failed, (grids, current)
    stay = np.zeros(model.n_x)
    stay[data.current_col[data.current_col >= 0]] = 1.0
    assert model.violation(stay) <= 1e-9                                # staying put is always admitted
