"""A genetic search over replicas per virtual node: Pollux's allocation search the way
Sia's artifact runs it (``pollux`` with ``search=ga``; engine/decide/policies/pollux.py).

A solution is a matrix ``jobs x virtual nodes`` of replica counts. Two objectives are
minimized: the negated power mean of the jobs' scaled speedups (Pollux's objective) and
the negated cluster utility (each job's speedup per replica, weighted by its share of the
GPUs on the nodes in use). The search is NSGA-II: a population of ``population``
solutions evolves for ``generations`` generations; parents are picked by binary
tournament on (non-dominated front, crowding distance), Deb's rule (pymoo 0.4 compares
the two by dominance, then crowding); two parents give two children by
a one-point crossover over the jobs; children mutate (a job reset to its current
allocation, a job's replicas zeroed here and there, replicas raised on nodes with free
GPUs) and are repaired to be feasible (at most one job spread over several nodes on each
node, at most a job's maximum replicas and ``max_nodes`` nodes, at most a node's GPUs, the
jobs earlier in the order first); the next population is the best fronts of parents and
children, duplicates removed (not replaced by new matings as pymoo does: 3% of the
children on Philly workload 1). The result is the solution with the best power mean. The
first round starts from the current allocation alone, later rounds from the previous
round's last population (jobs that left dropped, new jobs at zero).

Written here after what the artifact's ``pollux_unaware.py`` does (pymoo 0.4's NSGA-II
with its own operators); none of its code is used. The operators' probabilities are the
artifact's (10% reset, 10% of jobs thinned at 10% of their nodes). Pure numpy;
randomness from the ``rng`` given.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EPS = 1e-3                      # offset of a speedup in the power mean (Pollux's)
RESET_P = 0.1                   # a child's job reset to its current allocation
THIN_JOB_P = 0.1                # a child's job whose replicas are thinned ...
THIN_NODE_P = 0.1               # ... on each node with this probability


@dataclass(frozen=True)
class GaProblem:
    """One round's search. ``speedup(jobs, nodes, replicas)`` gives the jobs' speedups
    (arrays of equal shape; replicas 0 gives 0); ``restart`` each job's factor when its
    allocation changes; ``scale`` the speedups' scale (dominant share x virtual nodes)."""
    base: np.ndarray                 # (J, V) replicas of each job on each virtual node now
    max_replicas: np.ndarray         # (J,)
    capacity: np.ndarray             # (V,) GPUs of each virtual node (0: out of service)
    speedup: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    restart: np.ndarray              # (J,)
    scale: float
    p: float
    max_nodes: int = 16

    def evaluate(self, states: np.ndarray) -> np.ndarray:
        """(P, J, V) -> (P, 2): the two objectives to minimize."""
        n_jobs = states.shape[1]
        nodes = np.count_nonzero(states, axis=2)
        reps = states.sum(axis=2)
        jobs = np.broadcast_to(np.arange(n_jobs), reps.shape)
        sp = self.speedup(jobs, nodes, reps)
        scaled = sp * self.scale
        changed = np.any(states != self.base, axis=2)
        scaled = np.where(changed, scaled * self.restart, scaled)
        mean = (np.sum((scaled + EPS) ** self.p, axis=1) / n_jobs) ** (1.0 / self.p)
        in_use = states.sum(axis=1) > 0
        total = (in_use * self.capacity).sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(reps > 0, reps / np.maximum(total, 1), 0.0)
            per_replica = np.where(reps > 0, sp / np.maximum(reps, 1), 0.0)
        return np.column_stack([-mean, -(per_replica * share).sum(axis=1)])

    def repair(self, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        states = np.minimum(states, self.capacity)
        # at most one job spread over several nodes on each node: the first in job order
        spread = np.count_nonzero(states, axis=2) > 1
        mark = (states > 0) & spread[:, :, None]
        states = np.where(np.cumsum(mark, axis=1) > 1, 0, states)
        # at most max_replicas and max_nodes nodes per job, nodes taken in a random order
        order = np.argsort(rng.random(states.shape), axis=2)
        s = np.take_along_axis(states, order, axis=2)
        s = np.diff(np.minimum(np.cumsum(s, axis=2), self.max_replicas[None, :, None]), axis=2, prepend=0)
        s = np.where(np.cumsum(s > 0, axis=2) > self.max_nodes, 0, s)
        states = np.take_along_axis(s, np.argsort(order, axis=2), axis=2)
        # at most a node's GPUs, the jobs earlier in the order first
        return np.diff(np.minimum(np.cumsum(states, axis=1), self.capacity), axis=1, prepend=0)

    def mutate(self, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n, n_jobs, _ = states.shape
        states = np.where((rng.random((n, n_jobs)) < RESET_P)[:, :, None], self.base, states)
        thin = np.where(rng.random((n, n_jobs)) < THIN_JOB_P, THIN_NODE_P, 0.0)
        states = np.where(rng.random(states.shape) < thin[:, :, None], 0, states)
        free = (self.capacity - states.sum(axis=1)) > 0                       # (P, V)
        p_any = free[:, None, :] / n_jobs                                     # any job, 1/J
        here = (states > 0) & free[:, None, :]
        p_here = here / np.maximum(here.sum(axis=1, keepdims=True), 1)        # one of those there
        grow = rng.random(states.shape) < p_any + p_here - p_any * p_here
        raised = rng.integers(states, self.capacity[None, None, :] + 1)
        return np.where(grow, raised, states)


def fronts(f: np.ndarray, enough: int | None = None) -> np.ndarray:
    """Each point's non-dominated front (0 best) for minimization of the two objectives
    ``f[:, 0]``, ``f[:, 1]``; with ``enough``, only the fronts that first hold that many
    points keep theirs (the rest get the next). A point with a NaN objective dominates
    nothing and is dominated by nothing (front 0).

    In O(n log n) time and O(n) memory (a population of 1,000 is sorted in milliseconds,
    where pairwise dominance matrices took seconds): taken in order of the first
    objective (then the second), a point's front is the first whose smallest second
    objective so far (with the first objective it came with) is not below its own; the
    fronts' keys stay sorted, so a binary search finds it."""
    if f.ndim != 2 or f.shape[1] != 2:
        raise ValueError(f"fronts: two objectives per point expected, got shape {f.shape}")
    n = len(f)
    rank = np.zeros(n, dtype=np.int64)
    ok = np.flatnonzero(~np.isnan(f).any(axis=1))
    order = ok[np.lexsort((f[ok, 1], f[ok, 0]))]
    keys: list[tuple[float, float]] = []        # per front: (its smallest f1, that point's f0)
    for i, a, b in zip(order.tolist(), f[order, 0].tolist(), f[order, 1].tolist()):
        k = bisect.bisect_left(keys, (b, a))    # fronts before k hold a point that dominates i
        if k == len(keys):
            keys.append((b, a))
        else:
            keys[k] = (b, a)
        rank[i] = k
    if enough is not None and n:
        counts = np.cumsum(np.bincount(rank))
        last = int(np.searchsorted(counts, enough))      # the first front by which enough have one
        if last < len(counts) - 1:
            rank[rank > last] = last + 1
    return rank


def crowding(f: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Crowding distance of each point within its front (inf at a front's ends)."""
    out = np.zeros(len(f))
    for m in range(f.shape[1]):
        o = np.lexsort((f[:, m], rank))
        r, v = rank[o], f[o, m]
        first = np.r_[True, r[1:] != r[:-1]]
        last = np.r_[r[1:] != r[:-1], True]
        starts = np.flatnonzero(first)
        lo = np.repeat(v[starts], np.diff(np.r_[starts, len(o)]))
        hi = np.repeat(v[np.flatnonzero(last)], np.diff(np.r_[starts, len(o)]))
        span = hi - lo
        inner = ~(first | last)
        gap = np.zeros(len(o))
        gap[1:-1] = v[2:] - v[:-2]
        with np.errstate(divide="ignore", invalid="ignore"):
            add = np.where(inner & (span > 0), gap / np.where(span > 0, span, 1.0), 0.0)
        add[first | last] = np.inf
        out[o] += add
    return out


def _unique(states: np.ndarray, f: np.ndarray, seen: set[bytes] | None = None) -> tuple[np.ndarray, np.ndarray]:
    keep, seen = [], set() if seen is None else seen
    for i in range(len(states)):
        key = states[i].tobytes()
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return states[keep], f[keep]


def search(problem: GaProblem, start: np.ndarray, rng: np.random.Generator, generations: int = 100,
           population: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """NSGA-II from the solutions ``start`` (S, J, V); returns (the solution with the best
    power mean, the last population)."""
    pop = problem.repair(start.astype(np.int64), rng)
    f = problem.evaluate(pop)
    pop, f = _unique(pop, f)
    rank = fronts(f)
    crowd = crowding(f, rank)
    for _ in range(generations):
        n_pairs = (population + 1) // 2
        pick = rng.integers(0, len(pop), size=(2 * n_pairs, 2))
        a, b = pick[:, 0], pick[:, 1]
        better_b = (rank[b] < rank[a]) | ((rank[b] == rank[a]) & (crowd[b] > crowd[a]))
        parents = np.where(better_b, b, a).reshape(n_pairs, 2)
        pa, pb = pop[parents[:, 0]], pop[parents[:, 1]]
        n_jobs = pop.shape[1]
        point = rng.integers(0, n_jobs, size=(n_pairs, 1))
        swap = (np.arange(n_jobs)[None, :] < point)[:, :, None]
        kids = np.concatenate([np.where(swap, pb, pa), np.where(swap, pa, pb)])[:population]
        kids = problem.repair(problem.mutate(kids, rng), rng)
        kf = problem.evaluate(kids)
        kids, kf = _unique(kids, kf, {s.tobytes() for s in pop})
        allp, allf = np.concatenate([pop, kids]), np.concatenate([f, kf])
        rank = fronts(allf, population)
        crowd = crowding(allf, rank)
        keep = np.lexsort((-crowd, rank))[:population]
        pop, f, rank, crowd = allp[keep], allf[keep], rank[keep], crowd[keep]
    best = int(np.argmin(f[:, 0]))
    return pop[best], pop
