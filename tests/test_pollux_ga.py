"""Pollux's genetic search the way the Sia artifact runs it (``pollux`` with ``search=ga``):
its repair always gives feasible solutions, the search never loses its best solution and
finds the optimum of small problems, and a solution over virtual nodes comes back as
grids on free GPUs of one type."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli.common import goodput_perf, reconfig_for
from engine.core.context import JobView, RoundContext
from engine.core.policy import make_policy
from engine.decide.policies.pollux_ga import GaProblem, crowding, fronts, search
from engine.decide.policies.vnodes import VirtualNodes
from engine.sim.simulator import simulate
from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.sia_instances import load_sia_instance

FIXTURE = Path(__file__).parent / "data" / "sia_artifact"


def _problem(n_jobs, caps, max_rep, max_nodes, seed, p=-1.0):
    rng = np.random.default_rng(seed)
    n_v = len(caps)
    table = rng.random((n_jobs, n_v + 1, int(max(max_rep)) + 1)) * 2
    table[:, :, 0] = 0.0
    base = np.zeros((n_jobs, n_v), dtype=np.int64)
    return GaProblem(base=base, max_replicas=np.array(max_rep), capacity=np.array(caps, dtype=np.int64),
                     speedup=lambda j, n, r: table[j, n, np.minimum(r, table.shape[2] - 1)],
                     restart=rng.random(n_jobs), scale=0.25, p=p, max_nodes=max_nodes)


def _feasible(pr: GaProblem, states: np.ndarray) -> None:
    assert (states >= 0).all()
    assert (states.sum(axis=1) <= pr.capacity).all()                        # a node's GPUs
    assert (states.sum(axis=2) <= pr.max_replicas).all()                    # a job's replicas
    assert (np.count_nonzero(states, axis=2) <= pr.max_nodes).all()         # a job's nodes
    spread = np.count_nonzero(states, axis=2) > 1
    assert (((states > 0) & spread[:, :, None]).sum(axis=1) <= 1).all()    # one spread job per node


@settings(max_examples=150, deadline=None)
@given(n_jobs=st.integers(1, 6), caps=st.lists(st.integers(0, 4), min_size=1, max_size=6),
       max_rep=st.data(), max_nodes=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_repair_and_mutation_keep_every_solution_feasible(n_jobs, caps, max_rep, max_nodes, seed):
    reps = max_rep.draw(st.lists(st.integers(1, 8), min_size=n_jobs, max_size=n_jobs))
    pr = _problem(n_jobs, caps, reps, max_nodes, seed)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 7, size=(5, n_jobs, len(caps)))
    fixed = pr.repair(raw, rng)
    _feasible(pr, fixed)
    assert (fixed <= raw).all()                                             # repair only removes
    _feasible(pr, pr.repair(pr.mutate(fixed, rng), rng))


@settings(max_examples=40, deadline=None)
@given(n_jobs=st.integers(1, 5), caps=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       seed=st.integers(0, 10**6))
def test_the_search_never_loses_its_best_solution(n_jobs, caps, seed):
    pr = _problem(n_jobs, caps, [4] * n_jobs, 16, seed)
    rng = np.random.default_rng(seed)
    start = pr.repair(rng.integers(0, 3, size=(3, n_jobs, len(caps))), np.random.default_rng(seed))
    best, last = search(pr, start, rng, generations=5, population=10)
    _feasible(pr, best[None])
    _feasible(pr, last)
    assert pr.evaluate(best[None])[0, 0] <= pr.evaluate(start)[:, 0].min() + 1e-12
    assert pr.evaluate(best[None])[0, 0] == pytest.approx(pr.evaluate(last)[:, 0].min())


def test_the_search_finds_the_optimum_of_a_small_problem():
    pr = _problem(3, [2, 2, 1], [3, 3, 3], 16, seed=7)
    every = np.array([np.array(c).reshape(3, 3) for c in itertools.product(range(3), repeat=9)])
    ok = every[np.all(every.sum(axis=1) <= pr.capacity, axis=1) & np.all(every.sum(axis=2) <= 3, axis=1)]
    spread = np.count_nonzero(ok, axis=2) > 1
    ok = ok[(((ok > 0) & spread[:, :, None]).sum(axis=1) <= 1).all(axis=1)]
    optimum = pr.evaluate(ok)[:, 0].min()
    best, _ = search(pr, pr.base[None], np.random.default_rng(0), generations=60, population=40)
    assert pr.evaluate(best[None])[0, 0] == pytest.approx(optimum)


def test_fronts_and_crowding_on_a_hand_example():
    f = np.array([[0.0, 3.0], [1.0, 1.0], [3.0, 0.0], [2.0, 2.0], [2.0, 2.0], [3.0, 3.0], [1.0, 1.0]])
    rank = fronts(f)
    assert rank.tolist() == [0, 0, 0, 1, 1, 2, 0]              # equal points share a front
    assert fronts(f, enough=4).tolist() == [0, 0, 0, 1, 1, 1, 0]   # peeled only as far as asked
    crowd = crowding(f, rank)
    assert np.isinf(crowd[[0, 2]]).all() and np.isfinite(crowd[[1, 6]]).all()
    assert np.isinf(crowd[[3, 4, 5]]).all()                      # fronts of one or two points


def _ctx(jobs=()):
    inst = load_sia_instance("sia:mini/workload-1", FIXTURE)   # 2 x 4 T4 (nodes 0, 1), 1 x 8 RTX (node 2)
    return inst, RoundContext(now_s=0.0, round_index=0, round_interval_s=60.0, cluster=inst.cluster, jobs=jobs,
                              perf=None, reconfig=None)


def test_virtual_nodes_drop_a_second_type_and_round_to_a_symmetric_shape():
    _, ctx = _ctx()
    vn = VirtualNodes.of(ctx, 4)
    assert vn.keys == [(0, 0), (1, 0), (2, 0), (2, 1)]
    assert vn.gpu_type == ["t4", "t4", "rtx-2080ti", "rtx-2080ti"]
    assert vn.one_type(np.array([1, 0, 2, 0])) == {2: 2}           # the type with most replicas
    assert vn.one_type(np.array([2, 0, 1, 1])) == {2: 1, 3: 1}     # a tie: the higher fp32 peak
    assert vn.one_type(np.array([0, 0, 0, 0])) == {}
    assert vn.shape_of({0: 3, 1: 1}) == Shape("t4", 1, 3)          # 3 + 1 runs as 3 on one node
    assert vn.shape_of({0: 2, 1: 2}) == Shape("t4", 2, 2)
    assert vn.shape_of({2: 4, 3: 3}) == Shape("rtx-2080ti", 1, 7)  # two slices of one node
    out = VirtualNodes.of(dataclasses.replace(ctx, unavailable_nodes=frozenset({1})), 4)
    assert out.capacity.tolist() == [4, 0, 4, 4]


def test_virtual_nodes_pin_a_kept_job_on_its_gpus_and_the_others_on_free_ones():
    inst, _ = _ctx()
    a, b, c = inst.jobs[:3]
    held = Allocation(Grid(Shape("rtx-2080ti", 1, 2)), ((2, 4), (2, 5)))
    moving = Allocation(Grid(Shape("t4", 1, 2)), ((0, 0), (0, 1)))
    views = [JobView(a, 1.0, held), JobView(b, 1.0, moving), JobView(c, 1.0, None)]
    _, ctx = _ctx(tuple(views))
    vn = VirtualNodes.of(ctx, 4)
    base = np.array([[0, 0, 0, 2], [2, 0, 0, 0], [0, 0, 0, 0]])
    best = np.array([[0, 0, 0, 2], [0, 0, 4, 2], [2, 2, 0, 0]])
    kept = {v.job_id: vn.one_type(best[i]) for i, v in enumerate(views)}
    d = vn.pin(ctx, views, base, best, kept)
    assert d.placements[a.job_id] == held.gpus and d.grids[a.job_id] == held.grid
    assert d.grids[b.job_id].shape == Shape("rtx-2080ti", 1, 6)
    assert set(d.placements[b.job_id]) == {(2, 0), (2, 1), (2, 2), (2, 3), (2, 6), (2, 7)}
    assert d.grids[c.job_id].shape == Shape("t4", 2, 2)
    every = [g for gpus in d.placements.values() for g in gpus]
    assert len(every) == len(set(every))


def _run(**opts):
    inst = load_sia_instance("sia:mini/workload-1", FIXTURE)
    return simulate(inst, make_policy("pollux", **opts), perf=goodput_perf(None, None, None, inst.oracle),
                    reconfig=reconfig_for(inst, {}), run_out=True, iteration_noise_cv=0.0)


def test_pollux_with_the_genetic_search_runs_the_fixture_out_the_same_each_time():
    one = _run(search="ga", generations=20, population=20)
    assert one.summary["jobs_finished_runout"] == 4
    two = _run(search="ga", generations=20, population=20)
    assert [j.jct_s for j in one.jobs] == [j.jct_s for j in two.jobs]   # seeded per round
    for bad, match in ((dict(search="nsga"), "search must be one of exact, ga"),
                       (dict(generations=0), "generations must be"),
                       (dict(population=2.5), "population must be a whole number")):
        with pytest.raises(InputError, match=match):
            make_policy("pollux", **bad)


def _fronts_by_definition(f: np.ndarray) -> list[int]:
    """Each point's front by peeling: the points no remaining point dominates, again and
    again (a point with a NaN objective dominates nothing and is dominated by nothing)."""
    rank, left, k = [-1] * len(f), set(range(len(f))), 0

    def dominates(a, b):
        return all(x <= y for x, y in zip(f[a], f[b])) and any(x < y for x, y in zip(f[a], f[b]))
    while left:
        front = {j for j in left if not any(dominates(i, j) for i in left if i != j)}
        for j in front:
            rank[j] = k
        left -= front
        k += 1
    return rank


@settings(max_examples=150, deadline=None, derandomize=True)
@given(points=st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 3.0, -1.0, np.inf, np.nan]),
                                 st.sampled_from([0.0, 1.0, 2.0, 5.0, -np.inf, np.nan])), max_size=25),
       enough=st.one_of(st.none(), st.integers(0, 30)))
def test_fronts_are_the_non_dominated_fronts(points, enough):
    """The O(n log n) sort gives each point the front the definition gives (ties, infinite
    and NaN objectives included); with ``enough``, the points past the first fronts that
    hold that many get the next front."""
    f = np.array(points, dtype=float).reshape(-1, 2)
    want = np.array(_fronts_by_definition(f), dtype=np.int64)
    if enough is not None and len(f):
        counts = np.cumsum(np.bincount(want))
        last = int(np.searchsorted(counts, enough))
        want[want > last] = last + 1
    assert fronts(f, enough).tolist() == want.tolist()


def test_fronts_of_a_large_population_take_no_square_memory():
    """B7: a population of 100,000 built (2n)^2 matrices, past 3 GB; now n log n."""
    import time
    f = np.random.default_rng(0).random((200_000, 2))
    t0 = time.perf_counter()
    rank = fronts(f, 100_000)
    assert time.perf_counter() - t0 < 10.0 and rank.shape == (200_000,)
    with pytest.raises(ValueError, match="two objectives"):
        fronts(np.zeros((3, 3)))
