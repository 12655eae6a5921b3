"""The incremental re-scheduling search: start from the current allocation, then
*expand* and *balance* on the round's own model.

It runs on a ``MilpModel`` restricted to the candidate columns (``candidates.py``;
``build_model(..., columns=...)``): the same objective coefficients ``c`` and the same
rows ``A v <= b`` as the full per-round MILP, restricted to those columns, so the value
of its decision is the full MILP's objective function evaluated on it. Row activities
are maintained incrementally (one vector over the coupling rows: capacity and
node-shape rows and whatever rows objective terms add over the choice variables).

Steps (each is a flag, so tests can show that each matters):

1. **start**: every job on its current column (queued jobs on none). A start that
   violates a row (a row tightened since the last round) is repaired by stopping the
   lowest-valued non-frozen jobs on that row.
2. **expand**: admit queued jobs and grow (or move sideways) running ones. A move is
   (job, from column, to column) with at least as many GPUs; its gain is
   ``c[to] - c[from]``, which already nets out the move's cost (the ``reconfig``
   term's penalty on the new column). Moves are taken in decreasing gain per GPU added
   on the destination type (best move per job per pass; pinned queued jobs first)
   while they fit the rows' slack and the move budget; up to ``EXPAND_PASSES`` passes.
3. **balance**: moves GPUs from low to high marginal gain. Receivers: each job's best
   upgrade that does not fit. Donors: each placed job's cheapest way to free GPUs of
   its type (a candidate with fewer GPUs, or stopping), priced by value lost per GPU
   freed. A receiver takes donors of its destination type, cheapest first, until its
   move fits, and the exchange is made only if the receiver's gain exceeds the donors'
   losses (all net of every moved job's move cost, amortized over the ``reconfig``
   term's horizon, since that is how ``c`` prices moves), plus hysteresis.
4. **expand** again, to fill what balance freed.

Stability seams: ``frozen`` jobs keep exactly their current column; ``hysteresis`` h:
a running job leaves its current column only if the exchange's gain exceeds h x |value
of its current column| (summed over the running jobs an exchange moves). Move budget:
at most ``max_moved_jobs`` running jobs change column (stopping one counts) and at most
``max_moved_gpus`` GPUs in the columns moved jobs land on; both are two more rows of
the same slack arithmetic.

Complexity: with K candidate columns, J jobs, R coupling rows and P passes, each expand
pass is O(K + J R) vectorized (plus a sorted walk, O(J R) in the worst case);
balance is O(J log J + J D R) for at most D donors examined per receiver. Polynomial,
and no solver call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..formulation.model import MilpModel
from ..solvers.base import Solution
from ..solvers.greedy import complete

EPS = 1e-9
EXPAND_PASSES = 3
MAX_DONORS_EXAMINED = 64       # per receiver in balance
PREFIX_ROUNDS = 24             # vectorized prefix rounds per walk before a plain loop


@dataclass(frozen=True)
class SearchSteps:
    """Which steps run (all by default; switching one off is for tests and ablations)."""
    expand: bool = True
    balance: bool = True


class _State:
    """The incumbent: a column per job and the coupling rows' activities (the last two
    rows are the move budget: jobs moved, GPUs moved)."""

    def __init__(self, model: MilpModel, start: np.ndarray, col_gpus: np.ndarray, col_type: np.ndarray,
                 frozen: np.ndarray, hysteresis: float, max_moved_jobs: float, max_moved_gpus: float):
        if model.job_rows is None:
            raise ValueError("incremental search: the model must know its job rows")
        n_x = model.n_x
        self.model = model
        self.n_x = n_x
        self.col_job = model.col_job
        self.c = np.append(model.c[:n_x], 0.0)          # index n_x: "no column"
        self.gpus = np.append(np.asarray(col_gpus, dtype=float), 0.0)
        self.ctype = np.append(np.asarray(col_type, dtype=np.int64), -1)
        A = model.A.tocsr()
        cont = np.zeros(model.n_rows, dtype=bool)
        if model.n_vars > n_x:
            cont[np.unique(A[:, n_x:].tocsc().indices)] = True
        coupling = np.isfinite(model.row_ub) & ~cont
        coupling[model.job_rows] = False
        self.rows = np.flatnonzero(coupling)
        B = A[self.rows][:, :n_x]
        nb = len(self.rows)
        # budget rows: moved jobs, moved GPUs (filled per move, not per column)
        self.Bz = sp.hstack([B.tocsc(), sp.csc_matrix((nb, 1))], format="csc")
        self.ub = np.concatenate([model.row_ub[self.rows], [max_moved_jobs, max_moved_gpus]])
        self.pinned = np.zeros(model.n_jobs, dtype=bool)
        jr = model.job_rows
        self.pinned[np.flatnonzero(model.row_lb[jr] > 0.5)] = True
        self.start = np.where(start >= 0, start, n_x).astype(np.int64)
        self.assign = self.start.copy()
        self.running0 = start >= 0
        self.frozen = np.asarray(frozen, dtype=bool) & self.running0
        self.hyst = hysteresis * np.abs(self.c[self.start]) * self.running0
        x = np.zeros(n_x + 1)
        x[self.assign] = 1.0
        self.act = np.concatenate([self.Bz @ x, [0.0, 0.0]])
        self.counts = {"expand": 0, "balance": 0, "repair": 0}

    # -- bookkeeping ---------------------------------------------------------------
    def moved(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        return self.running0[j] & (new != self.start[j])

    def budget_delta(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        """(2, n) change of the budget rows if job j goes to column ``new``."""
        was = self.moved(j, self.assign[j])
        now = self.moved(j, new)
        dj = now.astype(float) - was
        dg = np.where(now, self.gpus[new], 0.0) - np.where(was, self.gpus[self.assign[j]], 0.0)
        return np.vstack([dj, dg])

    def deltas(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Dense (rows + 2, n) change of the activities if each job j[i] goes to new[i]."""
        D = (self.Bz[:, new] - self.Bz[:, self.assign[j]]).toarray()
        return np.vstack([D, self.budget_delta(j, new)])

    def threshold(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Hysteresis owed if j moves to ``new`` (0 unless it leaves its start column)."""
        return np.where(self.moved(j, new) & ~self.moved(j, self.assign[j]), self.hyst[j], 0.0)

    def apply(self, j: np.ndarray, new: np.ndarray, total_delta: np.ndarray, step: str) -> None:
        self.assign[j] = new
        self.act += total_delta
        self.counts[step] += len(j)

    def slack(self) -> np.ndarray:
        return self.ub - self.act

    # -- steps ---------------------------------------------------------------------
    def repair_start(self) -> None:
        """Stop the lowest-valued jobs on any row the start violates (non-frozen first)."""
        over = np.flatnonzero(self.act[:-2] > self.ub[:-2] + EPS)
        if not len(over):
            return
        placed = np.flatnonzero(self.assign < self.n_x)
        order = placed[np.lexsort((self.c[self.assign[placed]], self.frozen[placed]))]
        for j in order.tolist():
            over = np.flatnonzero(self.act[:-2] > self.ub[:-2] + EPS)
            if not len(over):
                return
            col = self.Bz[:, self.assign[j]].toarray().ravel()
            if np.any(col[over] > 0):
                jj, none = np.array([j]), np.array([self.n_x])
                self.start[j] = self.n_x          # stopped: the start no longer holds it
                self.running0[j] = False
                self.apply(jj, none, np.concatenate([-col, [0.0, 0.0]]), "repair")

    def upgrade_moves(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every eligible expand move: (job, to column, gain net of hysteresis, density)."""
        k = np.arange(self.n_x)
        j = self.col_job
        frm = self.assign[j]
        gain = self.c[k] - self.c[frm] - self.threshold(j, k)
        same = self.ctype[k] == self.ctype[frm]
        added = self.gpus[k] - np.where(same, self.gpus[frm], 0.0)
        ok = (~self.frozen[j]) & (k != frm) & (self.gpus[k] >= self.gpus[frm]) & (gain > EPS)
        k = k[ok]
        gain, added = gain[ok], added[ok]
        density = gain / np.maximum(added, 1.0)
        density = np.where(self.pinned[j[ok]] & (frm[ok] == self.n_x), np.inf, density)
        return j[ok], k, gain, density

    def expand(self) -> None:
        for _ in range(EXPAND_PASSES):
            j, k, gain, density = self.upgrade_moves()
            if not len(k):
                return
            D = self.deltas(j, k)
            fits = np.all(D <= self.slack()[:, None] + EPS, axis=0)
            j, k, gain, density, D = j[fits], k[fits], gain[fits], density[fits], D[:, fits]
            order = np.lexsort((-gain, -density))
            _, first = np.unique(j[order], return_index=True)
            pick = order[np.sort(first)]              # each job's best move, best first
            if not self._walk(j[pick], k[pick], D[:, pick], "expand"):
                return

    def _walk(self, j: np.ndarray, k: np.ndarray, D: np.ndarray, step: str) -> int:
        """Take the moves in order while each fits (one per job; deltas precomputed)."""
        taken = 0
        active = np.arange(len(k))
        for _ in range(PREFIX_ROUNDS):
            if not len(active):
                return taken
            slack = self.slack()
            cum = np.cumsum(D[:, active], axis=1)
            bad = np.flatnonzero(~np.all(cum <= slack[:, None] + EPS, axis=0))
            cut = int(bad[0]) if len(bad) else len(active)
            if cut:
                acc = active[:cut]
                self.apply(j[acc], k[acc], cum[:, cut - 1], step)
                taken += cut
            rest = active[cut + 1:]
            active = rest[np.all(D[:, rest] <= self.slack()[:, None] + EPS, axis=0)]
        for i in active.tolist():                  # the long tail, one by one
            if np.all(D[:, i] <= self.slack() + EPS):
                self.apply(j[i:i + 1], k[i:i + 1], D[:, i], step)
                taken += 1
        return taken

    def balance(self) -> None:
        # receivers: each job's best upgrade (fitting or not), best gain per GPU first
        j, k, gain, density = self.upgrade_moves()
        if not len(k):
            return
        order = np.lexsort((-gain, -density))
        _, first = np.unique(j[order], return_index=True)
        pick = order[np.sort(first)]
        rj, rk, rgain, rdens = j[pick], k[pick], gain[pick], density[pick]
        # donors: each placed, non-frozen job's cheapest way to free GPUs of its type
        kk = np.arange(self.n_x)
        jj = self.col_job
        cur = self.assign[jj]
        down = (cur < self.n_x) & (self.ctype[kk] == self.ctype[cur]) & (self.gpus[kk] < self.gpus[cur]) \
            & ~self.frozen[jj]
        dj = np.concatenate([jj[down], np.flatnonzero((self.assign < self.n_x) & ~self.frozen)])
        dk = np.concatenate([kk[down], np.full(len(dj) - int(down.sum()), self.n_x)])
        if not len(dj):
            return
        freed = self.gpus[self.assign[dj]] - self.gpus[dk]
        loss = self.c[self.assign[dj]] - self.c[dk] + self.threshold(dj, dk)
        per = loss / freed
        o = np.lexsort((-freed, per, dj))
        _, first = np.unique(dj[o], return_index=True)
        best = o[first]
        dj, dk, loss, per = dj[best], dk[best], loss[best], per[best]
        dtype = self.ctype[self.assign[dj]]
        o = np.argsort(per, kind="stable")
        dj, dk, loss, per, dtype = dj[o], dk[o], loss[o], per[o], dtype[o]
        DD = self.deltas(dj, dk)
        RD = self.deltas(rj, rk)
        used = np.zeros(self.model.n_jobs, dtype=bool)
        by_type = {t: np.flatnonzero(dtype == t) for t in np.unique(dtype).tolist()}
        cheapest = {t: float(per[idx[0]]) for t, idx in by_type.items()}
        for i in range(len(rk)):
            t = int(self.ctype[rk[i]])
            if used[rj[i]] or t not in by_type or rdens[i] <= cheapest[t]:
                continue
            need = self.act + RD[:, i] - self.ub
            if np.all(need <= EPS):
                self.apply(rj[i:i + 1], rk[i:i + 1], RD[:, i], "balance")
                used[rj[i]] = True
                continue
            if np.any(need[-2:] > EPS):
                continue                            # the move budget is spent
            lost, take, examined = 0.0, [], 0
            for d in by_type[t].tolist():
                if used[dj[d]] or dj[d] == rj[i]:
                    continue
                examined += 1
                if examined > MAX_DONORS_EXAMINED or lost + loss[d] >= rgain[i]:
                    break
                if not np.any(DD[:-2, d][need[:-2] > EPS] < -EPS):
                    continue
                take.append(d)
                lost += loss[d]
                need = need + DD[:, d]
                if np.all(need <= EPS):
                    break
            if take and np.all(need <= EPS) and lost < rgain[i]:
                dsel = np.array(take)
                total = RD[:, i] + DD[:, dsel].sum(axis=1)
                self.apply(np.concatenate([rj[i:i + 1], dj[dsel]]), np.concatenate([rk[i:i + 1], dk[dsel]]),
                           total, "balance")
                used[rj[i]] = True
                used[dj[dsel]] = True

    def values(self) -> np.ndarray:
        x = np.zeros(self.n_x + 1)
        x[self.assign] = 1.0
        return x[: self.n_x]


def incremental_search(model: MilpModel, start: np.ndarray, col_gpus: np.ndarray, col_type: np.ndarray, *,
                       frozen: np.ndarray | None = None, hysteresis: float = 0.0,
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
    if not (hysteresis >= 0 and max_moved_jobs >= 0 and max_moved_gpus >= 0):
        raise ValueError("incremental search: hysteresis and budgets must be >= 0")
    st = _State(model, np.asarray(start, dtype=np.int64), col_gpus, col_type, frozen, hysteresis,
                max_moved_jobs, max_moved_gpus)
    st.repair_start()
    if steps.expand:
        st.expand()
    if steps.balance:
        st.balance()
        if steps.expand:
            st.expand()
    v, ok = complete(model, st.values())
    moved = st.moved(np.arange(n_jobs), st.assign)
    extra = {"moved_jobs": int(moved.sum()), "moved_gpus": int(st.gpus[st.assign[moved]].sum()),
             "expand_moves": st.counts["expand"], "balance_moves": st.counts["balance"],
             "repair_stops": st.counts["repair"], "candidates": model.n_x}
    act = model.A @ v
    unmet = bool(np.any(act < model.row_lb - 1e-6)) or not ok
    return Solution.of(model, v, float("inf"), status="fallback" if unmet else "feasible",
                       solve_time_s=time.perf_counter() - t0, backend="incremental",
                       message="pinned jobs or other lower-bound rows left unmet" if unmet else "", extra=extra)
