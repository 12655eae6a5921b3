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
2. **expand**: admit queued jobs, grow running ones or move them sideways. A move is
   (job, from column, to column) with a positive gain ``c[to] - c[from]``, which
   already nets out the move's cost (the ``reconfig`` term's penalty on the new
   column). Each job's best open move is ranked by gain per GPU added on the
   destination type (pinned queued jobs first) and taken in that order while it fits
   the rows' slack and the move budget; the first passes take at most
   ``EXPAND_BATCH`` of the slack, and the moved jobs' next moves are recomputed
   between passes (see ``_State.expand``).
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
stability rule, hysteresis included, is in ``c``: engine/stability.py). Move budget:
at most ``max_moved_jobs`` running jobs change column (stopping one counts) and at most
``max_moved_gpus`` GPUs in the columns moved jobs land on; both are two more rows of
the same slack arithmetic.

Complexity: with K candidate columns, J jobs, R coupling rows: O(K R) to set up; each
expand pass O(K) for the ranking (segmented reductions over the moves, grouped by job)
plus O(P R) for the P ranked moves whose fit is checked; at most EXPAND_PASSES +
EXPAND_FILLS + 1 passes; balance O(J log J + J D R) for at most D donors examined per
receiver. Polynomial, and no solver call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..formulation.model import MilpModel
from ..solvers.base import Solution
from ..solvers.greedy import complete

EPS = 1e-9
EXPAND_PASSES = 8              # the first ones take a share of the slack, the last all of it
EXPAND_FILLS = 4               # further passes that take all of it, while moves are taken
BATCH_PREFIX = 256             # moves of the ranking first checked for fit in a batched pass
EXPAND_BATCH = 0.5             # share of the slack a pass may take (but the last)
MAX_DONORS_EXAMINED = 32       # per receiver in balance
BALANCE_PATIENCE = 128        # balance stops after this many receivers in a row found no exchange


def _bits(mask: np.ndarray) -> list[int]:
    """Boolean row masks (n x rows) as Python int bit masks, one per row of ``mask``."""
    if mask.shape[-1] <= 62:
        return (mask.astype(np.int64) @ (np.int64(1) << np.arange(mask.shape[-1], dtype=np.int64))).tolist()
    return [sum(1 << r for r in np.flatnonzero(m).tolist()) for m in mask]


@dataclass(frozen=True)
class SearchSteps:
    """Which steps run (all by default; switching one off is for tests and ablations)."""
    expand: bool = True
    balance: bool = True


@dataclass(frozen=True)
class _Moves:
    """Candidate moves (job j to column k) with their gain and gain per GPU added. Their
    row changes are computed when needed (``_State.deltas``), for few moves at a time."""
    j: np.ndarray
    k: np.ndarray
    gain: np.ndarray
    density: np.ndarray

    def take(self, idx: np.ndarray) -> "_Moves":
        return _Moves(self.j[idx], self.k[idx], self.gain[idx], self.density[idx])

    def plus(self, other: "_Moves") -> "_Moves":
        return _Moves(*(np.concatenate([a, b]) for a, b in zip(
            (self.j, self.k, self.gain, self.density), (other.j, other.k, other.gain, other.density))))


def _runs(j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each job's run of moves starts, and the run of each move (moves grouped by job)."""
    if not len(j):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, j[1:] != j[:-1]])
    return starts, np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(j)]))


def _best_alive(m: _Moves, runs: tuple[np.ndarray, np.ndarray], alive: np.ndarray) -> np.ndarray:
    """Per job (run), the index of its alive move with the best gain per GPU (the first
    of ties); jobs with none left out. No sort: two segmented reductions."""
    starts, run_of = runs
    if not len(m.k):
        return np.zeros(0, dtype=np.int64)
    dens = np.where(alive, m.density, -np.inf)
    best = np.maximum.reduceat(dens, starts)
    pos = np.where(alive & (dens >= best[run_of]), np.arange(len(m.k)), len(m.k))
    first = np.minimum.reduceat(pos, starts)
    return first[first < len(m.k)]


class _OpenMoves:
    """Every job's open moves: those computed at the start (``base``) for the jobs that
    have not moved since, and recomputed ones (``fresh``) for the jobs that have; both
    grouped by job, so that each job's best live move is found by segmented reductions."""

    def __init__(self, state: "_State"):
        self.state = state
        self.base = state.upgrade_moves()              # grouped by job (columns are)
        self.base_runs = _runs(self.base.j)
        self.changed = np.zeros(state.model.n_jobs, dtype=bool)
        self.fresh = state.upgrade_moves(np.zeros(0, dtype=np.int64))
        self.fresh_runs = _runs(self.fresh.j)

    def mark(self, jobs: np.ndarray) -> None:
        """Jobs that just moved: their moves are recomputed."""
        jobs = np.unique(jobs)
        self.changed[jobs] = True
        keep = np.flatnonzero(~self.changed[self.fresh.j] | ~np.isin(self.fresh.j, jobs))
        self.fresh = self.fresh.take(keep).plus(self.state.upgrade_moves(jobs))
        self.fresh_runs = _runs(self.fresh.j)

    def best(self, dead: np.ndarray | None = None) -> _Moves:
        """Each job's best open move (not to a column marked ``dead``), best first."""
        alive = ~self.changed[self.base.j]
        fresh_alive = np.ones(len(self.fresh.k), dtype=bool)
        if dead is not None:
            alive &= ~dead[self.base.k]
            fresh_alive = ~dead[self.fresh.k]
        m = self.base.take(_best_alive(self.base, self.base_runs, alive)).plus(
            self.fresh.take(_best_alive(self.fresh, self.fresh_runs, fresh_alive)))
        return m.take(np.argsort(-m.density, kind="stable"))

    def best_of(self, jobs: np.ndarray, dead: np.ndarray) -> _Moves:
        """The best open move of each of ``jobs`` (not to a ``dead`` column)."""
        out = []
        for m, runs, skip in ((self.base, self.base_runs, self.changed), (self.fresh, self.fresh_runs, None)):
            starts, _ = runs
            if not len(starts):
                continue
            run_of_job = np.full(len(self.changed), -1, dtype=np.int64)
            run_of_job[m.j[starts]] = np.arange(len(starts))
            r = run_of_job[jobs]
            r = r[r >= 0]
            if skip is not None:
                r = r[~skip[m.j[starts[r]]]]
            if not len(r):
                continue
            ends = np.r_[starts[1:], len(m.k)]
            n = ends[r] - starts[r]
            idx = np.repeat(starts[r] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
            sub = m.take(idx)
            out.append(sub.take(_best_alive(sub, _runs(sub.j), ~dead[sub.k])))
        if not out:
            return self.base.take(np.zeros(0, dtype=np.int64))
        return out[0] if len(out) == 1 else out[0].plus(out[1])


class _State:
    """The incumbent: a column per job and the activities of the coupling rows (rows
    over the choice variables with a finite upper bound, job rows excluded), plus two
    budget rows (jobs moved, GPUs moved). Column usage is held densely, one row per
    column (``U``): the coupling rows are few (GPU types x node-shape levels, plus any
    quota rows)."""

    def __init__(self, model: MilpModel, start: np.ndarray, col_gpus: np.ndarray, col_type: np.ndarray,
                 frozen: np.ndarray, max_moved_jobs: float, max_moved_gpus: float):
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
        self.U = np.zeros((n_x + 1, len(self.rows)))
        self.U[:n_x] = A[self.rows].toarray()[:, :n_x].T
        self.ub = np.concatenate([model.row_ub[self.rows], [max_moved_jobs, max_moved_gpus]])
        self.pinned = np.zeros(model.n_jobs, dtype=bool)
        self.pinned[np.flatnonzero(model.row_lb[model.job_rows] > 0.5)] = True
        self.start = np.where(start >= 0, start, n_x).astype(np.int64)
        self.assign = self.start.copy()
        self.running0 = start >= 0
        self.frozen = np.asarray(frozen, dtype=bool) & self.running0
        self.act = np.concatenate([self.U[self.assign].sum(axis=0), [0.0, 0.0]])
        self.counts = {"expand": 0, "balance": 0, "repair": 0}

    # -- bookkeeping ---------------------------------------------------------------
    def moved(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        return self.running0[j] & (new != self.start[j])

    def deltas(self, j: np.ndarray, new: np.ndarray) -> np.ndarray:
        """(n, rows + 2): change of the activities if each job j[i] goes to new[i]."""
        old = self.assign[j]
        was, now = self.moved(j, old), self.moved(j, new)
        dj = now.astype(float) - was
        dg = np.where(now, self.gpus[new], 0.0) - np.where(was, self.gpus[old], 0.0)
        return np.hstack([self.U[new] - self.U[old], dj[:, None], dg[:, None]])

    def apply(self, j: np.ndarray, new: np.ndarray, total_delta: np.ndarray, step: str) -> None:
        self.assign[j] = new
        self.act += total_delta
        self.counts[step] += len(j)

    def slack(self) -> np.ndarray:
        return self.ub - self.act

    def fits(self, D: np.ndarray) -> np.ndarray:
        return np.all(D <= self.slack() + EPS, axis=-1)

    # -- steps ---------------------------------------------------------------------
    def repair_start(self) -> None:
        """Stop the lowest-valued jobs on any row the start violates (non-frozen first).
        A forced stop is not charged to the move budget (it is reported apart)."""
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
                self.counts["repair"] += 1

    def upgrade_moves(self, jobs: np.ndarray | None = None) -> _Moves:
        """Every improving move (of ``jobs`` only, if given): to another column whose
        gain, net of move cost (in ``c``), is positive."""
        if jobs is None:
            k = np.arange(self.n_x)
        else:
            k = self.columns_of(jobs)
        j = self.col_job[k]
        frm = self.assign[j]
        gain = self.c[k] - self.c[frm]
        ok = (~self.frozen[j]) & (k != frm) & (gain > EPS)
        k, j, frm, gain = k[ok], j[ok], frm[ok], gain[ok]
        same = self.ctype[k] == self.ctype[frm]
        added = self.gpus[k] - np.where(same, self.gpus[frm], 0.0)
        density = gain / np.maximum(added, 1.0)
        must = self.pinned[j] & (frm == self.n_x)      # a pinned job without a grid: first, at any price
        return _Moves(j, k, np.where(must, np.inf, gain), np.where(must, np.inf, density))

    def columns_of(self, jobs: np.ndarray) -> np.ndarray:
        """The model columns of ``jobs`` (columns are grouped by job), job by job."""
        lo = np.searchsorted(self.col_job, jobs)
        n = np.searchsorted(self.col_job, jobs, side="right") - lo
        return np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))

    def prune(self, moves: _OpenMoves, dead: np.ndarray) -> None:
        """Mark every open move that does not fit now ``dead``."""
        for m, alive in ((moves.base, ~moves.changed[moves.base.j]), (moves.fresh, None)):
            live = np.flatnonzero(~dead[m.k] if alive is None else alive & ~dead[m.k])
            D = self.deltas(m.j[live], m.k[live])
            dead[m.k[live[~self.fits(D)]]] = True

    def batch(self, moves: _OpenMoves, dead: np.ndarray, share: float) -> tuple[_Moves, np.ndarray]:
        """The best-ranked of each job's best fitting move, up to ``share`` of the slack
        left on any row, with their row changes. Fits are checked on a prefix
        of the ranking that doubles until the batch is full; a move found not to fit is
        marked ``dead`` and its job's next move takes its place in the ranking."""
        n = len(self.rows)
        limit = share * np.maximum(self.slack()[:n], 0.0) + EPS
        pick = moves.best(dead)
        size = BATCH_PREFIX
        while True:
            m = min(size, len(pick.k))
            head = pick.take(np.arange(m))
            D = self.deltas(head.j, head.k)
            ok = self.fits(D)
            if not ok.all():
                dead[head.k[~ok]] = True
                keep = np.r_[np.flatnonzero(ok), np.arange(m, len(pick.k))]
                pick = pick.take(keep).plus(moves.best_of(np.unique(head.j[~ok]), dead))
                pick = pick.take(np.argsort(-pick.density, kind="stable"))
                continue
            over = np.flatnonzero(np.any(np.cumsum(D[:, :n], axis=0) > limit, axis=1))
            if len(over):
                cut = max(int(over[0]), 1)
                return head.take(np.arange(cut)), D[:cut]
            if m == len(pick.k):
                return head, D
            size *= 2

    def expand(self, moves: _OpenMoves, passes: int = EXPAND_PASSES) -> None:
        """The expand step, in passes. In each pass every job's best move that fits is
        ranked by gain per GPU and taken in that order while it fits: up to
        ``EXPAND_BATCH`` of the slack left on any row in the first passes, then all of it
        (until nothing more fits). The moves of the jobs just moved are recomputed after
        each pass, so that a job's next move (growing what it was just given) competes
        with the other jobs' first moves. Slack only shrinks here (but for sideways
        moves), so a move found not to fit is not looked at again in this step."""
        dead = np.zeros(self.n_x + 1, dtype=bool)
        for p in range(passes + EXPAND_FILLS):
            if p < passes - 1:
                pick, D = self.batch(moves, dead, EXPAND_BATCH)
            else:                                    # fill: every fitting move, best first
                self.prune(moves, dead)
                pick = moves.best(dead)
                D = self.deltas(pick.j, pick.k)
            if not len(pick.k):
                return
            taken, missed = self._walk(pick, D, "expand")
            dead[pick.k[missed]] = True
            if not len(taken):
                if p >= passes - 1:
                    return
                continue
            jobs = np.unique(pick.j[taken])
            dead[self.columns_of(jobs)] = False
            moves.mark(jobs)

    def _walk(self, mv: _Moves, D: np.ndarray, step: str) -> tuple[np.ndarray, np.ndarray]:
        """Take the moves in order while each fits (at most one per job; ``D`` their row
        changes). Returns the indices of the moves taken and of those that did not fit."""
        taken, missed = [], []
        active = np.arange(len(mv.k))
        while len(active):
            cum = np.cumsum(D[active], axis=0)
            bad = np.flatnonzero(~self.fits(cum))
            cut = int(bad[0]) if len(bad) else len(active)
            if cut:
                acc = active[:cut]
                self.apply(mv.j[acc], mv.k[acc], cum[cut - 1], step)
                taken.extend(acc.tolist())
            rest = active[cut:]
            ok = self.fits(D[rest])
            missed.extend(rest[~ok].tolist())
            active = rest[ok]
        return np.array(taken, dtype=np.int64), np.array(missed, dtype=np.int64)

    def donors(self) -> _Moves:
        """Each placed, non-frozen job's cheapest way to free GPUs of its type (a column
        of the same type with fewer GPUs, or none), cheapest per GPU freed first;
        ``gain`` holds the loss, ``density`` the loss per GPU."""
        k = np.arange(self.n_x)
        j = self.col_job
        cur = self.assign[j]
        down = (cur < self.n_x) & (self.ctype[k] == self.ctype[cur]) & (self.gpus[k] < self.gpus[cur]) \
            & ~self.frozen[j]
        stop = np.flatnonzero((self.assign < self.n_x) & ~self.frozen & ~self.pinned)   # pinned jobs run
        dj = np.concatenate([j[down], stop])
        dk = np.concatenate([k[down], np.full(len(stop), self.n_x)])
        freed = self.gpus[self.assign[dj]] - self.gpus[dk]
        loss = self.c[self.assign[dj]] - self.c[dk]
        per = loss / freed
        o = np.lexsort((-freed, per, dj))
        _, first = np.unique(dj[o], return_index=True)
        best = o[first]
        best = best[np.argsort(per[best], kind="stable")]
        dj, dk = dj[best], dk[best]
        return _Moves(dj, dk, loss[best], per[best])

    def balance(self, moves: _OpenMoves) -> None:
        """Receivers (each job's best open upgrade, best gain per GPU first) take donors
        of their destination GPU type, cheapest per GPU first, until they fit; the
        exchange is made when the receiver's gain beats the donors' losses. Stops after
        ``BALANCE_PATIENCE`` receivers in a row found no exchange that pays."""
        rcv = moves.best()
        don = self.donors()
        if not len(rcv.k) or not len(don.k):
            return
        rcv_D, don_D = self.deltas(rcv.j, rcv.k), self.deltas(don.j, don.k)
        n_rows = len(self.rows)
        dtype = self.ctype[self.assign[don.j]].tolist()
        don_j, don_loss, don_per = don.j.tolist(), don.gain.tolist(), don.density.tolist()
        frees = _bits(don_D[:, :n_rows] < -EPS)        # the rows each donor frees, as bits
        by_type: dict[int, list[int]] = {}
        for d, t in enumerate(dtype):
            by_type.setdefault(t, []).append(d)
        used = np.zeros(self.model.n_jobs, dtype=bool)
        moved: list[int] = []
        misses = 0
        r_j, r_t = rcv.j.tolist(), self.ctype[rcv.k].tolist()
        r_gain, r_dens = rcv.gain.tolist(), rcv.density.tolist()
        for i in range(len(r_j)):
            if misses >= BALANCE_PATIENCE:
                break
            j, gain = r_j[i], r_gain[i]
            pool = by_type.get(r_t[i], ())
            while pool and used[don_j[pool[0]]]:
                pool.pop(0)                        # drop used donors from the front
            if used[j] or not pool or r_dens[i] <= don_per[pool[0]]:
                continue                            # no donor of its type is cheap enough
            need = self.act + rcv_D[i] - self.ub
            if np.all(need <= EPS):
                self.apply(rcv.j[i:i + 1], rcv.k[i:i + 1], rcv_D[i], "balance")
                used[j] = True
                moved.append(j)
                continue
            misses += 1
            if np.any(need[n_rows:] > EPS):
                continue                            # the move budget is spent
            lacking = _bits((need[:n_rows] > EPS)[None])[0]
            lost, take = 0.0, []
            for d in pool[:MAX_DONORS_EXAMINED]:
                if used[don_j[d]] or don_j[d] == j or not frees[d] & lacking:
                    continue
                if lost + don_loss[d] >= gain:
                    break
                take.append(d)
                lost += don_loss[d]
                need = need + don_D[d]
                lacking = _bits((need[:n_rows] > EPS)[None])[0]
                if not lacking:
                    break
            if take and np.all(need <= EPS) and lost < gain:
                sel = np.array(take)
                self.apply(np.concatenate([rcv.j[i:i + 1], don.j[sel]]), np.concatenate([rcv.k[i:i + 1], don.k[sel]]),
                           rcv_D[i] + don_D[sel].sum(axis=0), "balance")
                used[j] = True
                used[don.j[sel]] = True
                moved.append(j)
                moved.extend(don.j[sel].tolist())
                misses = 0
        if moved:
            moves.mark(np.array(moved, dtype=np.int64))

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
    st = _State(model, np.asarray(start, dtype=np.int64), col_gpus, col_type, frozen,
                max_moved_jobs, max_moved_gpus)
    st.repair_start()
    moves = _OpenMoves(st)
    if steps.expand:
        st.expand(moves)
    if steps.balance:
        st.balance(moves)
        if steps.expand and st.counts["balance"]:
            st.expand(moves, passes=1)                # fill what balance freed
    v, ok = complete(model, st.values())
    value = float(st.c[st.assign].sum() + (model.c[model.n_x:] * v[model.n_x:]).sum())   # c @ v, no BLAS call
    moved = st.moved(np.arange(n_jobs), st.assign)
    extra = {"moved_jobs": int(moved.sum()), "moved_gpus": int(st.gpus[st.assign[moved]].sum()),
             "expand_moves": st.counts["expand"], "balance_moves": st.counts["balance"],
             "repair_stops": st.counts["repair"], "candidates": model.n_x}
    act = model.A @ v
    unmet = bool(np.any(act < model.row_lb - 1e-6)) or not ok
    return Solution.of(model, v, float("inf"), value=value, status="fallback" if unmet else "feasible",
                       solve_time_s=time.perf_counter() - t0, backend="incremental",
                       message="pinned jobs or other lower-bound rows left unmet" if unmet else "", extra=extra)
