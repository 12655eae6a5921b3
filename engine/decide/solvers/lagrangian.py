"""Lagrangian prices for the capacity rows, then rounding and a greedy fill.

The model's rows other than the one-grid-per-job rows (capacity, node shape, quotas)
are few (tens), the jobs many. Pricing those rows with lambda >= 0 splits the model
per job: L(lambda) = sum_j max(0, max_g (c_g - lambda . a_g)) + lambda . b, an upper
bound on the MILP (and on its LP) for every lambda >= 0 — so the gap reported is
proved. lambda is found by a cutting-plane (Kelley) method in a box trust region
around the best point; each cut costs one sparse product over the columns. The primal
is the greedy in decreasing priced profit (each job's priced best column first).

Warm start: the backend keeps the last prices by row name and starts the next call
from them (rounds change little, so a few iterations usually prove the gap). It also
keeps the last model's structure (``_Memo``: the greedy's arrays, the dual's row block)
and takes it as is when the next model's matrix, row bounds and job rows are equal to
it element for element (most rounds change only the objective).
Applies to models whose extra rows are all "<=" rows with non-negative coefficients
and no continuous variables; on any other model it answers with HiGHS's LP rounding.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..same_inputs import kept, same
from .base import Solution, SolverOptions, register_backend, relative_gap
from .greedy import RowBlock, Structure, greedy_select
from .highs_api import reuse_highs

MAX_ITERS = 200
PRIMAL_EVERY = 8


def applicable(model) -> bool:
    if model.job_rows is None or model.n_vars != model.n_x:
        return False
    if len(model.A.data) and model.A.data.min() < 0:
        return False
    mask = np.ones(model.n_rows, dtype=bool)
    mask[model.job_rows] = False
    if np.any(model.row_lb[mask] > 0) or np.any(model.row_lb[model.job_rows] > 0):
        return False
    if not np.all(np.diff(model.col_job) >= 0):
        return False
    return True


class _Dual:
    def __init__(self, model, s: Structure, like: _Dual | None = None):
        """``like``: a dual of a model with the same structure (``_Memo``), whose row
        block is taken as is; only the objective is read from ``model``."""
        self.model = model
        if like is not None:
            self.rows, self.B, self.BT, self.b = like.rows, like.B, like.BT, like.b
            self.starts, self.has_cols = like.starts, like.has_cols
        else:
            mask = np.ones(model.n_rows, dtype=bool)
            mask[model.job_rows] = False
            self.rows = np.flatnonzero(mask)
            same = s.vector_ok and np.array_equal(self.rows, s.coupling)     # the usual case: reuse the greedy's
            self.B = s.Bc if same else RowBlock.of(s.Ax, self.rows, model.n_rows)
            self.BT = sp.csr_matrix((self.B.data, self.B.rows, self.B.indptr), shape=(model.n_x, len(self.rows)))
            self.b = model.row_ub[self.rows]
            self.starts = np.searchsorted(model.col_job, np.arange(model.n_jobs))
            self.has_cols = np.r_[self.starts[1:], model.n_x] > self.starts
        self.c = model.c[: model.n_x]

    def evaluate(self, lam: np.ndarray):
        r = self.c - self.BT @ lam
        n_x = self.model.n_x
        if n_x == 0:
            return float(lam @ self.b), np.zeros(len(lam)), r, np.zeros(0, dtype=np.int64)
        jm = np.full(self.model.n_jobs, -np.inf)
        jm[self.has_cols] = np.maximum.reduceat(r, self.starts[self.has_cols])
        pos = np.maximum(jm, 0.0)
        val = float(pos.sum() + lam @ self.b)
        col_job = self.model.col_job
        is_max = (r >= jm[col_job] - 1e-12) & (r > 0)
        idx = np.flatnonzero(is_max)
        _, first = np.unique(col_job[idx], return_index=True)
        chosen = idx[first]
        g = self.b - self.B.column_sums(chosen, len(self.rows))
        return val, g, r, chosen


class _Memo:
    """The last model's structure — whether the Lagrangian applies, the greedy's arrays,
    the dual's row block — reused for the next model when everything they are computed
    from is equal element for element: the matrix, the row bounds, the job rows, the
    columns' jobs (the usual round: only the objective changed). The compared arrays are
    copies, so a model made by writing into an earlier model's arrays is still compared
    with what the structure was built from; the same model object asked about twice in a
    row (``auto``, then the solve) is not compared again (models are read-only)."""

    def __init__(self) -> None:
        self.model: object = None          # the last model looked at (the same object: no comparison)
        self.key: tuple | None = None
        self.applies = False
        self.structure: Structure | None = None
        self.dual: _Dual | None = None

    @staticmethod
    def _key_of(model) -> tuple:
        A = model.A
        return (A.shape, model.n_x, model.n_jobs, A.indptr, A.indices, A.data, model.row_lb, model.row_ub,
                model.col_job, model.job_rows)

    def look(self, model) -> bool:
        """Whether the Lagrangian applies to ``model``; afterwards ``structure`` and
        ``dual`` are the last model's when its structure is ``model``'s, else None."""
        if model is self.model:
            return self.applies
        key = self._key_of(model)
        if not same(self.key, key):
            self.key = kept(key)
            self.applies = applicable(model)
            self.structure = self.dual = None
        self.model = model
        return self.applies

    def structures(self, model) -> tuple[Structure, _Dual]:
        """The greedy's structure and the dual of ``model`` (after ``look(model)``)."""
        if self.structure is None or self.dual is None:
            self.structure = Structure(model)
            self.dual = _Dual(model, self.structure)
            return self.structure, self.dual
        return self.structure, _Dual(model, self.structure, like=self.dual)


def _kelley(dual: _Dual, lam0: np.ndarray, deadline: float, target_gap: float, primal_fn, empty_lp):
    """Minimize L over lambda >= 0; ``primal_fn(r)`` gives a primal value at reduced profits r;
    ``empty_lp()`` an empty Highs instance for the cutting-plane LP, asked for only when
    the warm start does not already prove the gap (most rounds)."""
    import highspy
    R = len(lam0)
    best_lam = lam0.copy()
    best_val, g, r, _ = dual.evaluate(best_lam)
    best_primal, best_x = primal_fn(r)
    iters = 1
    scale = max(1.0, float(np.abs(dual.c).max(initial=1.0)))
    # a warm start begins with a small trust region around the previous prices
    delta = 0.1 * float(lam0.max()) if lam0.max() > 0 else scale
    inf = highspy.kHighsInf
    h = None

    def add_cut(val, g, lam):
        # theta - g . lambda >= val - g . lam
        idx = np.arange(R + 1, dtype=np.int32)
        coef = np.concatenate([[1.0], -g])
        h.addRow(float(val - g @ lam), inf, R + 1, idx, coef)

    since_primal = 0
    best_r = r
    while iters < MAX_ITERS and time.perf_counter() < deadline:
        if relative_gap(best_primal, best_val) <= target_gap:
            break
        if h is None:               # the LP: variables theta, lambda_1..R; minimize theta; the start's cut
            h = empty_lp()
            h.setOptionValue("presolve", "off")
            h.addVar(-inf, inf)
            h.changeColCost(0, 1.0)
            for i in range(R):
                h.addVar(0.0, inf)
            add_cut(best_val, g, best_lam)
        lo = np.maximum(best_lam - delta, 0.0)
        hi = best_lam + delta
        h.changeColsBounds(R, np.arange(1, R + 1, dtype=np.int32), lo, hi)
        h.run()
        sol = np.array(h.getSolution().col_value)
        model_val, lam = sol[0], sol[1:]
        lam = np.maximum(lam, 0.0)
        val, g, r, _ = dual.evaluate(lam)
        iters += 1
        add_cut(val, g, lam)
        predicted = best_val - model_val
        if val < best_val - 1e-12:
            if predicted > 0 and (best_val - val) >= 0.5 * predicted:
                delta *= 2.0
            best_val, best_lam, best_r = val, lam, r
            since_primal += 1
            # the primal costs a sort and a greedy pass: run it when the prices look settled
            if predicted <= target_gap * abs(best_val) or since_primal >= PRIMAL_EVERY:
                since_primal = 0
                p, x = primal_fn(r)
                if p > best_primal:
                    best_primal, best_x = p, x
        else:
            delta = max(delta * 0.5, 1e-9 * scale)
        if predicted <= 1e-9 * max(1.0, abs(best_val)) and delta < 1e-6 * scale:
            break
    if since_primal:
        p, x = primal_fn(best_r)
        if p > best_primal:
            best_primal, best_x = p, x
    return best_lam, best_val, best_primal, best_x, iters


@register_backend("lagrangian")
@dataclass
class LagrangianBackend:
    """Warm Lagrangian prices + rounding + greedy fill; proved gap from L(lambda)."""
    options: SolverOptions = SolverOptions()
    name: str = "lagrangian"
    _prices: dict = field(default_factory=dict, repr=False)
    _highs: object = field(default=None, repr=False)     # the cutting-plane LP's, cleared between solves
    _memo: _Memo = field(default_factory=_Memo, repr=False)

    def available(self) -> bool:
        return True

    @property
    def prices(self) -> dict[str, float]:
        """The warm-start prices the next solve starts from (row name -> Lagrange
        multiplier; the last solve's), a copy. Setting them starts this backend where
        another one is (rows of the next model not named start at 0)."""
        return dict(self._prices)

    @prices.setter
    def prices(self, prices: dict[str, float]) -> None:
        self._prices = dict(prices)

    @property
    def structure(self) -> Structure | None:
        """The greedy's arrays built for the last model solved, reused as is (the same
        object) while the next model has the same structure (None before the first solve)."""
        return self._memo.structure

    def applies_to(self, model) -> bool:
        """``applicable(model)``, remembered for a model of the last one's structure."""
        return self._memo.look(model)

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        t0 = time.perf_counter()
        if not self.applies_to(model):
            from .highs import lp_round_solve
            sol = lp_round_solve(model, self.options, time_limit_s, rel_gap, self.name)
            return Solution(**{**sol.__dict__, "message": "model outside the Lagrangian's scope; " + sol.message})
        s, dual = self._memo.structures(model)
        names = [model.row_names[i] for i in dual.rows]
        lam0 = np.array([self._prices.get(n, 0.0) for n in names])
        x_hint = None if hint is None else np.asarray(hint[: model.n_x], dtype=float)

        def primal_fn(r):
            order = np.argsort(-r, kind="stable")
            order = order[r[order] > 0] if len(order) else order
            best_x, best_v = None, -np.inf
            starts = [None] if x_hint is None else [None, x_hint]
            for st in starts:
                x = greedy_select(model, order, start=st, structure=s)
                v = float(dual.c @ x)
                if v > best_v:
                    best_x, best_v = x, v
            return best_v, best_x

        def empty_lp():
            self._highs = reuse_highs(self._highs, self.options.threads)
            return self._highs

        lam, bound, val, x, iters = _kelley(dual, lam0, t0 + time_limit_s, rel_gap, primal_fn, empty_lp)
        self._prices = dict(zip(names, lam.tolist()))
        return Solution.of(model, x, bound, value=val, rel_gap=rel_gap, solve_time_s=time.perf_counter() - t0,
                           backend=self.name, message=f"{iters} price iterations",
                           extra={"price_iterations": iters})
