"""Greedy decisions on a model: the fast heuristic, the rounding repair and the fallback.

``greedy_select`` walks the choice variables in a given order and takes one when its
job has none yet and every row it touches stays within its upper bound (rows that also
hold continuous variables are left to those variables). Rows with a positive lower
bound (pinned jobs, hard deadlines) are served first. ``complete`` then sets the
continuous variables (an LP with x fixed, by HiGHS) when the model has any.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .base import Solution, SolverOptions, register_backend

EPS = 1e-9
CHUNK = 64


@dataclass(frozen=True)
class RowBlock:
    """Some rows of a model's choice columns, column-major as plain arrays (scipy's
    indexing costs more than the work at these sizes): column ``k``'s entries are
    ``indptr[k]:indptr[k + 1]``, with rows local to the block."""
    indptr: np.ndarray
    rows: np.ndarray
    data: np.ndarray

    @classmethod
    def of(cls, Ax, rows: np.ndarray, n_rows: int) -> RowBlock:
        """``rows`` (sorted) of the column-major matrix ``Ax`` (one row per model row)."""
        local = np.full(n_rows, -1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        mapped = local[Ax.indices]
        keep = mapped >= 0
        col = np.repeat(np.arange(Ax.shape[1]), np.diff(Ax.indptr))
        indptr = np.zeros(Ax.shape[1] + 1, dtype=np.int64)
        np.cumsum(np.bincount(col[keep], minlength=Ax.shape[1]), out=indptr[1:])
        return cls(indptr, mapped[keep], Ax.data[keep])

    def entries(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(entry positions, each one's index in ``cols``) of the columns ``cols``, in order."""
        starts = self.indptr[cols]
        lens = self.indptr[cols + 1] - starts
        pos = np.repeat(np.arange(len(cols)), lens)
        return np.arange(len(pos)) + np.repeat(starts - (np.cumsum(lens) - lens), lens), pos

    def column_sums(self, cols: np.ndarray, n: int) -> np.ndarray:
        """Per row of the block, the sum of the columns ``cols``."""
        idx, _ = self.entries(cols)
        return np.bincount(self.rows[idx], weights=self.data[idx], minlength=n)


class _Structure:
    """Per-model arrays that the greedy needs (built once per model)."""

    def __init__(self, model):
        self.model = model
        n_x = model.n_x
        A = model.A.tocsc()
        Ax = A[:, :n_x] if model.n_vars > n_x else A
        cont_rows = np.zeros(model.n_rows, dtype=bool)
        if model.n_vars > n_x:
            cont_rows[np.unique(A[:, n_x:].indices)] = True
        self.Ax = Ax
        self.checked = (~cont_rows) & np.isfinite(model.row_ub)
        self.ub = np.where(self.checked, model.row_ub, np.inf)
        self.indptr = Ax.indptr.tolist()
        self.indices = Ax.indices.tolist()
        # whole-number coefficients (GPU counts, ones) as Python ints: their list is built
        # about 2.3x faster than floats', and int + float is the float sum: the same checks
        whole = Ax.data.size and np.abs(Ax.data).max() < 2.0 ** 53 and np.array_equal(Ax.data, np.rint(Ax.data))
        self.data = (Ax.data.astype(np.int64) if whole else Ax.data).tolist()
        self.lb_rows = np.flatnonzero((~cont_rows) & (model.row_lb > EPS))
        # the checked rows other than the one-grid-per-job rows, for the vectorized path
        self.vector_ok = model.job_rows is not None
        if self.vector_ok:
            coupling = self.checked.copy()
            coupling[model.job_rows] = False
            self.coupling = np.flatnonzero(coupling)
            self.Bc = RowBlock.of(Ax, self.coupling, model.n_rows)

    @cached_property
    def usage(self) -> np.ndarray:
        """Resource use of each column relative to the checked rows' capacities (only the
        greedy backend's orders read it)."""
        ub_safe = np.where(np.isfinite(self.ub) & (self.ub > 0), self.ub, np.inf)
        rel = self.Ax.multiply(1.0 / ub_safe[:, None]).tocsc() if self.model.n_rows else self.Ax
        return np.asarray(abs(rel).sum(axis=0)).ravel()


def greedy_select(model, order: np.ndarray, start: np.ndarray | None = None,
                  structure: _Structure | None = None, x0: np.ndarray | None = None) -> np.ndarray:
    """Take columns in ``order`` while they fit. ``x0`` (optional) is a set of columns
    already known to fit together (taken first, without checks)."""
    s = structure or _Structure(model)
    n_x = model.n_x
    x = np.zeros(n_x)
    act = np.zeros(model.n_rows)
    taken_job = np.zeros(model.n_jobs, dtype=bool)
    if x0 is not None:
        pre = np.flatnonzero(x0[:n_x] > 0.5)
        x[pre] = 1.0
        taken_job[model.col_job[pre]] = True
        act = np.asarray(model.A[:, :n_x] @ x).ravel()
    indptr, indices, data = s.indptr, s.indices, s.data
    act_l = act.tolist()
    ub_l = (s.ub + EPS).tolist()
    taken = taken_job.tolist()
    col_job = model.col_job.tolist()
    xs = []

    def try_take(k: int) -> bool:
        j = col_job[k]
        if taken[j]:
            return False
        lo, hi = indptr[k], indptr[k + 1]
        for i in range(lo, hi):
            if act_l[indices[i]] + data[i] > ub_l[indices[i]]:
                return False
        for i in range(lo, hi):
            act_l[indices[i]] += data[i]
        taken[j] = True
        xs.append(k)
        return True

    if start is not None:
        for k in np.flatnonzero(start[:n_x] > 0.5).tolist():
            try_take(k)
    if len(s.lb_rows):
        A = model.A.tocsr()
        need = set()
        for r in s.lb_rows:
            need.update(A.indices[A.indptr[r]:A.indptr[r + 1]].tolist())
        for k in order.tolist():
            if k in need and k < n_x:
                try_take(k)
    if s.vector_ok:
        _vector_pass(model, s, order, taken, act_l, try_take)
    else:
        for k in order.tolist():
            if not taken[col_job[k]]:
                try_take(k)
    x[xs] = 1.0
    return x


def _vector_pass(model, s, order, taken, act_l, try_take) -> None:
    """Fast path of the greedy walk (same result as the plain walk over ``order``).

    1. Each job's first column in ``order`` is taken in order as long as the running sums
       on the coupling rows stay within bounds (one cumulative sum, no Python loop).
    2. After the first column that does not fit, only columns that fit the remaining
       slack right now are walked (a vectorized filter), since slack only shrinks.
    """
    col_job = model.col_job
    taken_arr = np.array(taken, dtype=bool)
    order = order[~taken_arr[col_job[order]]]
    if not len(order):
        return
    _, first_idx = np.unique(col_job[order], return_index=True)
    first_idx.sort()
    firsts = order[first_idx]
    # accept the longest prefix of the jobs' first columns that fits
    act = np.array(act_l)[s.coupling]
    ub = s.ub[s.coupling]
    if len(s.coupling):
        idx, pos = s.Bc.entries(firsts)
        M = np.zeros((len(s.coupling), len(firsts)))
        M[s.Bc.rows[idx], pos] = s.Bc.data[idx]
        cum = np.cumsum(M, axis=1) + act[:, None]
        ok = np.all(cum <= ub[:, None] + EPS, axis=0)
        bad = np.flatnonzero(~ok)
        cut = int(bad[0]) if len(bad) else len(firsts)
    else:
        cut = len(firsts)
    for k in firsts[:cut].tolist():
        try_take(k)                    # all fit: this only books them
    # the walk goes on at position first_idx[cut] of ``order``; skip what cannot fit now
    if cut >= len(firsts):
        return
    rest = order[first_idx[cut]:]
    chunk = CHUNK
    while len(rest):
        taken_arr = np.array(taken, dtype=bool)
        rest = rest[~taken_arr[col_job[rest]]]
        if not len(rest):
            break
        slack = s.ub[s.coupling] - np.array(act_l)[s.coupling]
        idx, pos = s.Bc.entries(rest)
        too_big = s.Bc.data[idx] > slack[s.Bc.rows[idx]] + EPS
        blocked = np.zeros(len(rest), dtype=bool)
        blocked[pos[too_big]] = True
        rest = rest[~blocked]
        head, rest = rest[:chunk], rest[chunk:]
        for k in head.tolist():
            if not taken[col_job[k]]:
                try_take(k)
        chunk *= 2          # slack shrinks as jobs are taken: re-filter, less often as it settles


def complete(model, x: np.ndarray, threads: int = 1) -> tuple[np.ndarray, bool]:
    """Full variable vector from choice values ``x``: continuous variables by an LP with
    x fixed (HiGHS). Returns (values, feasible)."""
    n_x = model.n_x
    v = np.zeros(model.n_vars)
    v[:n_x] = x
    if model.n_vars == n_x:
        return v, bool(np.all(model.A @ v <= model.row_ub + 1e-6))
    import highspy

    from .highs_api import new_highs, to_highs_lp
    lb = model.col_lb.copy()
    ub = model.col_ub.copy()
    lb[:n_x] = x
    ub[:n_x] = x
    # rows over choice variables only are fixed by x: their lower bounds are checked by
    # the caller, not here (a greedy decision may leave a pinned job out)
    A = model.A.tocsc()
    has_cont = np.zeros(model.n_rows, dtype=bool)
    has_cont[np.unique(A[:, n_x:].indices)] = True
    row_lb = np.where(has_cont, model.row_lb, -np.inf)
    lp = to_highs_lp(model, relax=True, col_lb=lb, col_ub=ub, row_lb=row_lb)
    h = new_highs(threads)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return v, False
    v = np.array(h.getSolution().col_value)
    v[:n_x] = x
    return v, True


def orders(model, s: _Structure) -> list[np.ndarray]:
    c = model.c[: model.n_x]
    by_value = np.lexsort((s.usage, -c))
    by_density = np.lexsort((-c, -(c / np.maximum(s.usage, 1e-12))))
    return [by_value, by_density]


def greedy_solution(model, *, backend: str = "greedy", status: str = "feasible", message: str = "",
                    build_time_s: float = 0.0, bound: float = float("inf"),
                    start: np.ndarray | None = None) -> Solution:
    t0 = time.perf_counter()
    s = _Structure(model)
    best_v, best_val = None, -np.inf
    for order in orders(model, s):
        x = greedy_select(model, order, start=start, structure=s)
        v, ok = complete(model, x)
        val = float(model.c @ v)
        if ok and val > best_val:
            best_v, best_val = v, val
    if best_v is None:       # nothing feasible: run nothing
        best_v = np.zeros(model.n_vars)
        best_v, _ = complete(model, best_v[: model.n_x])
        best_val = float(model.c @ best_v)
    act = model.A @ best_v
    if status == "feasible" and np.any(act < model.row_lb - 1e-6):
        status = "fallback"
        message = ((message + "; " if message else "")
                   + "greedy left lower-bound rows (pinned jobs, hard deadlines) unmet")
    return Solution.of(model, best_v, bound, value=best_val, status=status, build_time_s=build_time_s,
                       solve_time_s=time.perf_counter() - t0, backend=backend, message=message)


@register_backend("greedy")
@dataclass(frozen=True)
class GreedyBackend:
    """Greedy by marginal gain (two orders: by coefficient, by coefficient per resource)."""
    options: SolverOptions = SolverOptions()
    name: str = "greedy"

    def available(self) -> bool:
        return True

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        return greedy_solution(model, backend=self.name, status="feasible", start=None)
