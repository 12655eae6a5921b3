"""The incremental re-scheduling search: start from the current allocation, then
*expand* and *balance* on the round's own model.

It runs on a ``MilpModel`` restricted to the candidate columns (``candidates.py``;
``build_model(..., columns=...)``): the same objective coefficients ``c`` and the same
rows ``A v <= b`` as the full per-round MILP, restricted to those columns, so the value
of its decision is the full MILP's objective function evaluated on it. Row activities
are maintained incrementally (one vector over the coupling rows: capacity and
node-shape rows and whatever rows objective terms add over the choice variables).

Steps (each is a flag, so tests can show that each matters; expand and balance are
compiled loops, ``kernel.py``):

1. **start**: every job on its current column (queued jobs on none). A start that
   violates a row (a row tightened since the last round) is repaired by stopping the
   lowest-valued non-frozen jobs on that row.
2. **expand**: admit queued jobs, grow running ones or move them sideways. A move is
   (job, from column, to column) with a positive gain ``c[to] - c[from]``, which
   already nets out the move's cost (the ``reconfig`` term's penalty on the new
   column). Every job's best open move, by gain per GPU added on the destination type
   (pinned queued jobs first), waits in one heap; the best is taken when it fits the
   rows' slack and the move budget, and the job's next move joins the heap, so growing
   what a job was just given competes with the other jobs' first moves. A move that
   does not fit is not looked at again in the step until its job moves (slack only
   shrinks here, but for sideways moves), and the job's next move takes its place.
3. **balance**: moves GPUs from low to high marginal gain. Receivers: each job's best
   upgrade that does not fit. Donors: each placed job's cheapest way to free GPUs of
   its type (a candidate with fewer GPUs, or stopping), priced by value lost per GPU
   freed. A receiver takes donors of its destination type, cheapest first, until its
   move fits, and the exchange is made only if the receiver's gain exceeds the donors'
   losses (all net of every moved job's move cost, amortized over the ``reconfig``
   term's horizon, since that is how ``c`` prices moves; the term's hysteresis is in
   ``c`` too).
4. **expand** again, to fill what balance freed.

Stability seams: ``frozen`` jobs keep exactly their current column (the rest of the
stability rule, hysteresis included, is in ``c``: engine/decide/stability.py). Move budget:
at most ``max_moved_jobs`` running jobs change column and at most ``max_moved_gpus``
GPUs in the columns moved jobs land on; both are two more rows of the same slack
arithmetic.

Complexity: with K candidate columns, J jobs, R coupling rows and c columns per job:
O(K R) to set up; expand O(K (R + c)) to rank and check every job's columns once, plus
O(R + log J) per heap event, a job's columns re-ranked after each of its moves; balance
O(J log J + K + J D R) for at most D donors examined per receiver. Polynomial, and no
solver call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..formulation.model import MilpModel
from ..solvers.base import Solution
from ..solvers.greedy import complete


@dataclass(frozen=True)
class SearchSteps:
    """Which steps run (all by default; switching one off is for tests and ablations)."""
    expand: bool = True
    balance: bool = True


class SearchState:
    """The incumbent: a column per job and the activities of the coupling rows (rows
    over the choice variables with a finite upper bound, job rows excluded), plus two
    budget rows (jobs moved, GPUs moved). Column usage is held densely, one row per
    column (``U``): the coupling rows are few (GPU types x node-shape levels, plus any
    quota rows). ``incremental_search`` runs its steps (``repair_start``, ``expand``,
    ``balance``); a test or an ablation can run them one at a time."""

    def __init__(self, model: MilpModel, start: np.ndarray, col_gpus: np.ndarray, col_type: np.ndarray,
                 frozen: np.ndarray, max_moved_jobs: float, max_moved_gpus: float):
        if model.job_rows is None:
            raise ValueError("incremental search: the model must know its job rows")
        n_x = model.n_x
        self.n_x = n_x
        per_job = np.bincount(model.col_job, minlength=model.n_jobs)       # columns are grouped by job
        self.hi = np.cumsum(per_job).astype(np.int64)
        self.lo = self.hi - per_job
        self.c = np.append(model.c[:n_x], 0.0)          # index n_x: "no column"
        self.gpus = np.append(np.asarray(col_gpus, dtype=float), 0.0)
        self.ctype = np.append(np.asarray(col_type, dtype=np.int64), -1)
        A = model.A.tocsr()
        cont = np.zeros(model.n_rows, dtype=bool)
        if model.n_vars > n_x:
            cont[np.unique(A[:, n_x:].tocsc().indices)] = True
        coupling = np.isfinite(model.row_ub) & ~cont
        coupling[model.job_rows] = False
        rows = np.flatnonzero(coupling)
        # few rows: each column's usage of them, densely (a row of U per column, "no column" last)
        from .kernel import dense_usage, type_min_usage
        self.U = np.zeros((n_x + 1, len(rows)))
        dense_usage(A.indptr.astype(np.int64), A.indices.astype(np.int64), A.data, rows, n_x, self.U)
        # per GPU type, its capacity row among these (-1: not known, or not a coupling row)
        # and the least a column of the type uses of it: expand's exact short cuts
        n_types = int(self.ctype.max()) + 1 if n_x else 0
        local = np.full(model.n_rows, -1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        known = model.capacity_rows if model.capacity_rows is not None else np.zeros(0, dtype=np.int64)
        self.cap = np.full(n_types, -1, dtype=np.int64)
        m = min(n_types, len(known))
        self.cap[:m] = np.where(known[:m] >= 0, local[np.maximum(known[:m], 0)], -1)
        self.min_use = type_min_usage(self.ctype, self.U, self.cap)
        self.ub = np.concatenate([model.row_ub[rows], [max_moved_jobs, max_moved_gpus]]).astype(float)
        self.pinned = np.zeros(model.n_jobs, dtype=bool)
        self.pinned[np.flatnonzero(model.row_lb[model.job_rows] > 0.5)] = True
        self.start = np.where(start >= 0, start, n_x).astype(np.int64)
        self.assign = self.start.copy()
        self.running0 = start >= 0
        self.frozen = np.asarray(frozen, dtype=bool) & self.running0
        self.act = np.concatenate([self.U[self.assign].sum(axis=0), [0.0, 0.0]])
        self.counts = np.zeros(2, dtype=np.int64)       # expand, balance moves
        self.repairs = 0
        self.order = np.empty(n_x, dtype=np.int64)      # expand's rankings, kept between its calls
        self.dens = np.empty(n_x)
        self.ranked = np.full(model.n_jobs, -1, dtype=np.int64)
        self.live = np.zeros(model.n_jobs, dtype=np.int64)       # with the rankings: see kernel._live_end

    def moved(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        return self.running0[j] & (new != self.start[j])

    def repair_start(self) -> None:
        """Stop the lowest-valued jobs on any row the start violates (non-frozen first).
        A forced stop is not charged to the move budget (it is reported apart)."""
        from .kernel import EPS
        over = self.act[:-2] > self.ub[:-2] + EPS
        if not over.any():
            return
        placed = np.flatnonzero(self.assign < self.n_x)
        for j in placed[np.lexsort((self.c[self.assign[placed]], self.frozen[placed]))].tolist():
            over = self.act[:-2] > self.ub[:-2] + EPS
            if not over.any():
                return
            col = self.U[self.assign[j]]
            if np.any(col[over] > 0):
                self.act[:-2] -= col
                self.assign[j] = self.start[j] = self.n_x
                self.running0[j] = False
                self.repairs += 1

    def _args(self) -> tuple:
        return (self.lo, self.hi, self.assign, self.start, self.running0, self.frozen, self.pinned, self.c,
                self.gpus, self.ctype, self.U, self.ub, self.act, self.counts)

    # the kernels are imported when a search runs: importing numba costs about half a
    # second, which a process that never searches incrementally should not pay
    def expand(self) -> None:
        from . import kernel
        kernel.expand(*(self._args() + (self.order, self.dens, self.ranked, self.cap, self.min_use, self.live)))

    def balance(self) -> bool:
        from . import kernel
        return bool(kernel.balance(*self._args()))

    def all_types_closed(self) -> bool:
        """Whether every GPU type is closed now (expand's short cut): its capacity row's
        slack is below the least any of its columns uses, so no column of a job that
        holds no GPUs fits (a type whose capacity row is not known stays open)."""
        from . import kernel
        return bool(kernel._all_closed(self.cap, self.min_use, self.ub, self.act))

    def values(self) -> np.ndarray:
        x = np.zeros(self.n_x + 1)
        x[self.assign] = 1.0
        return x[: self.n_x]


def incremental_search(model: MilpModel, start: np.ndarray, col_gpus: np.ndarray, col_type: np.ndarray, *,
                       frozen: np.ndarray | None = None,
                       max_moved_jobs: float = np.inf, max_moved_gpus: float = np.inf,
                       steps: SearchSteps = SearchSteps()) -> Solution:
    """The incremental decision on ``model`` (see module doc). ``start``: per job, the
    model column it runs on now, or -1; ``col_gpus``/``col_type``: per model column;
    ``frozen``: per job, keep its current column. Returns a Solution (status
    ``feasible``; ``fallback`` when a pinned job or another lower-bound row is left
    unmet), with the step counts and the moves made in ``extra``."""
    t0 = time.perf_counter()
    n_jobs = model.n_jobs
    frozen = np.zeros(n_jobs, dtype=bool) if frozen is None else np.asarray(frozen, dtype=bool)
    if len(start) != n_jobs or len(frozen) != n_jobs:
        raise ValueError("incremental search: start and frozen need one entry per job")
    if not (max_moved_jobs >= 0 and max_moved_gpus >= 0):
        raise ValueError("incremental search: move budgets must be >= 0")
    st = SearchState(model, np.asarray(start, dtype=np.int64), col_gpus, col_type, frozen,
                     max_moved_jobs, max_moved_gpus)
    st.repair_start()
    t1 = time.perf_counter()
    if steps.expand:
        st.expand()
    t2 = time.perf_counter()
    if steps.balance and st.balance() and steps.expand:
        st.expand()                                  # fill what balance freed
    t3 = time.perf_counter()
    v, ok = complete(model, st.values())
    value = float(st.c[st.assign].sum() + (model.c[model.n_x:] * v[model.n_x:]).sum())   # c @ v, no BLAS call
    moved = st.moved(np.arange(n_jobs), st.assign)
    extra = {"moved_jobs": int(moved.sum()), "moved_gpus": int(st.gpus[st.assign[moved]].sum()),
             "expand_moves": int(st.counts[0]), "balance_moves": int(st.counts[1]),
             "repair_stops": st.repairs, "candidates": model.n_x,
             # wall time of the parts: setting up (and repairing) the start, the first
             # expand, balance with the second expand, the rest (completion, checks)
             "setup_s": t1 - t0, "expand_s": t2 - t1, "balance_s": t3 - t2}
    act = model.A @ v
    unmet = bool(np.any(act < model.row_lb - 1e-6)) or not ok
    return Solution.of(model, v, float("inf"), value=value, status="fallback" if unmet else "feasible",
                       solve_time_s=time.perf_counter() - t0, backend="incremental",
                       message="pinned jobs or other lower-bound rows left unmet" if unmet else "", extra=extra)
