"""The incremental search's compiled loops (numba): the candidate columns (the rule is
candidates.py's), and the expand and balance steps: sequential loops over moves, each a
few array reads (engine/decide/incremental/search.py holds the data layout and the module doc
that describes the steps).

Conventions: columns 0..n_x-1 of the restricted model, grouped by job (job j owns
``lo[j]:hi[j]``); index ``n_x`` is "no column" (value 0, no GPUs, type -1, no row
usage). ``U`` (n_x + 1, R): each column's usage of the R coupling rows; ``ub`` and
``act`` have R + 2 entries, the last two the move budget rows (running jobs moved, GPUs
in the columns they land on). ``assign``, ``act`` and ``counts`` are updated in place.

Speed notes (measured at 10,240 GPUs, ``arena bench incremental``; docs/engine.md): the
helpers called from the loops allocate nothing and are compiled without numba's
reference counting (``HELPER``: the private flag ``_nrt=False``, where this numba has it):
with it, every call counted references to its array arguments with atomic instructions,
a third of expand's time under ``perf``; and the
hottest helpers are written without early returns, which numba compiled into branches
that cost several times the arithmetic.
"""
from __future__ import annotations

import numpy as np
from numba import njit

EPS = 1e-9                     # tolerance of every row check (search.py's start repair too)


def _helper_options() -> dict:
    """numba's options for the helpers: no reference counting where this numba knows the
    (private) flag; without it the kernels are the same, only slower."""
    try:
        from numba.core.cpu import CPUTargetOptions
        return {"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {}
    except ImportError:
        return {}


HELPER = _helper_options()

MAX_DONORS_EXAMINED = 32       # per receiver in balance
BALANCE_PATIENCE = 128         # balance stops after this many receivers in a row found no exchange


@njit(cache=True)
def neighbour_columns(col_job, current_col, col_gpus, col_type, col_gpn, max_gpn, any_type, queued_all, ref_g,
                      out):
    """The candidate columns (candidates.py's rule) into ``out``, in column order; returns
    how many. ``ref_g``: per job, the GPU count a queued job's columns may reach (read only
    when not ``queued_all``)."""
    n = 0
    for k in range(col_job.shape[0]):
        j = col_job[k]
        cur = current_col[j]
        g = col_gpus[k]
        if cur < 0:
            ok = queued_all or g <= ref_g[j]
        elif k == cur:
            ok = True
        elif col_type[k] == col_type[cur]:
            cg = col_gpus[cur]
            ok = g == 2 * cg or 2 * g == cg or g == cg
        else:
            ok = (any_type or g == col_gpus[cur]) and col_gpn[k] == min(g, max_gpn[col_type[k]])
        if ok:
            out[n] = k
            n += 1
    return n


@njit(cache=True, inline="always", **HELPER)
def _density(j, k, cur, c, gpus, ctype, frozen, pinned, n_x):
    """Gain per GPU added on the destination type of moving job ``j`` from ``cur`` to
    ``k``; -inf when the move gains nothing (or the job is frozen), +inf for a pinned job
    without a column. Written with one return: numba compiles the early-return form into
    branches that took five times as long here (a ranking of 44,000 columns: 1.0 ms
    against 0.2 ms)."""
    gain = c[k] - c[cur]
    added = gpus[k] - (gpus[cur] if ctype[k] == ctype[cur] else 0.0)
    d = gain / max(added, 1.0)
    if pinned[j] and cur == n_x:
        d = np.inf
    if frozen[j] or k == cur or gain <= EPS:
        d = -np.inf
    return d


@njit(cache=True, **HELPER)
def _best(j, lo, hi, assign, c, gpus, ctype, frozen, pinned, n_x):
    """Job ``j``'s best move whether it fits or not (the first column of ties); (-1, 0)
    when it has none."""
    bk, bd = -1, -np.inf
    for k in range(lo[j], hi[j]):
        dens = _density(j, k, assign[j], c, gpus, ctype, frozen, pinned, n_x)
        if dens > bd:
            bk, bd = k, dens
    return (bk, bd) if bk >= 0 else (-1, 0.0)


@njit(cache=True, **HELPER)
def _delta(j, k, assign, start, running0, gpus, U, out):
    """Row changes (R + 2) if job ``j`` goes to column ``k``, into ``out``."""
    old = assign[j]
    R = U.shape[1]
    for r in range(R):
        out[r] = U[k, r] - U[old, r]
    was = 1.0 if (running0[j] and old != start[j]) else 0.0
    now = 1.0 if (running0[j] and k != start[j]) else 0.0
    out[R] = now - was
    out[R + 1] = gpus[k] * now - gpus[old] * was


@njit(cache=True, inline="always", **HELPER)
def _move_fits(j, k, assign, start, running0, gpus, U, ub, act):
    """Whether job ``j``'s move to column ``k`` fits the rows' slack: the row changes
    ``_delta`` gives, every row checked (no early exit: cheaper than its branches)."""
    old = assign[j]
    R = U.shape[1]
    ok = True
    for r in range(R):
        ok &= U[k, r] - U[old, r] <= ub[r] - act[r] + EPS
    was = 1.0 if (running0[j] and old != start[j]) else 0.0
    now = 1.0 if (running0[j] and k != start[j]) else 0.0
    ok &= now - was <= ub[R] - act[R] + EPS
    ok &= gpus[k] * now - gpus[old] * was <= ub[R + 1] - act[R + 1] + EPS
    return ok


@njit(cache=True, **HELPER)
def _before(ka, ja, kb, jb):
    """Heap order: the larger density (smaller key) first, then the lower job index."""
    return (ka < kb) | ((ka == kb) & (ja < jb))        # no branches


@njit(cache=True, **HELPER)
def _sift_down(hk, hj, i, n):
    """Move the entry at ``i`` down to its place (``_before``'s order), holding it aside
    instead of swapping at every level."""
    ki, ji = hk[i], hj[i]
    while True:
        m = 2 * i + 1
        if m >= n:
            break
        if m + 1 < n and _before(hk[m + 1], hj[m + 1], hk[m], hj[m]):
            m += 1
        if not _before(hk[m], hj[m], ki, ji):
            break
        hk[i], hj[i] = hk[m], hj[m]
        i = m
    hk[i], hj[i] = ki, ji


@njit(cache=True, **HELPER)
def _rank(j, lo, hi, assign, c, gpus, ctype, frozen, pinned, n_x, order, dens):
    """Sort job ``j``'s columns in ``order[lo[j]:hi[j]]`` by their move's gain per GPU
    added (best first, ties in column order; ``dens``: per column, -inf where the move
    gains nothing)."""
    for k in range(lo[j], hi[j]):
        dens[k] = _density(j, k, assign[j], c, gpus, ctype, frozen, pinned, n_x)
    for i in range(lo[j], hi[j]):              # insertion sort (a job has few columns), stable
        k = i
        p = i
        while p > lo[j] and dens[order[p - 1]] < dens[k]:
            order[p] = order[p - 1]
            p -= 1
        order[p] = k


@njit(cache=True, **HELPER)
def _live_end(j, lo, hi, assign, order, dens, ctype, U, cap, min_g):
    """The last position in job ``j``'s ranked columns of a move that could still fit
    while every type is closed (its gain positive, and what it adds to its type's
    capacity row below the least a column of that type uses); ``lo[j] - 1`` when none.
    Past it, a closed cluster has nothing for the job."""
    old = assign[j]
    end = lo[j] - 1
    for p in range(lo[j], hi[j]):
        k = order[p]
        r = cap[ctype[k]]
        if dens[k] > -np.inf and (r < 0 or U[k, r] - U[old, r] < min_g[ctype[k]]):
            end = p
    return end


@njit(cache=True, **HELPER)
def _all_closed(cap, min_g, ub, act):
    """Whether every GPU type is closed: its capacity row's slack below the least any of
    its columns uses of it (``cap[t]``: that row's index among the coupling rows, -1 when
    unknown, which keeps the type open; ``min_g[t]``: ``type_min_usage``). Then no
    column of a job that holds no GPUs fits."""
    for t in range(cap.shape[0]):
        r = cap[t]
        if r < 0 or ub[r] - act[r] + EPS >= min_g[t]:
            return False
    return True


@njit(cache=True, **HELPER)
def _next_fit(j, hi, assign, start, running0, gpus, ctype, U, ub, act, order, dens, ptr, cap, min_g, live):
    """Job ``j``'s best move that fits now, from its pointer on: columns passed over do
    not fit (slack only shrinks in expand, but for sideways moves) and are not looked at
    again until the job moves. -1 when none is left. Two short cuts that skip only moves
    that would not fit (so the result is the same): the destination type's capacity row
    is checked first, and while every type is closed a job is passed over whole once its
    pointer is past ``live[j]`` (``_live_end``; a queued job's is before its first)."""
    old = assign[j]
    if ptr[j] < hi[j] and ptr[j] > live[j] and _all_closed(cap, min_g, ub, act):
        ptr[j] = hi[j]
        return -1
    while ptr[j] < hi[j]:
        k = order[ptr[j]]
        if dens[k] == -np.inf:
            break
        r = cap[ctype[k]]
        if r >= 0 and U[k, r] - U[old, r] > ub[r] - act[r] + EPS:
            ptr[j] += 1
            continue
        if _move_fits(j, k, assign, start, running0, gpus, U, ub, act):
            return k
        ptr[j] += 1
    ptr[j] = hi[j]
    return -1


@njit(cache=True)
def type_min_usage(ctype, U, cap):
    """Per GPU type ``t``, the least any of its columns puts on its capacity row
    ``cap[t]`` (inf for a type with no columns or no known row): a queued job's column of
    a type whose slack is below this cannot fit."""
    out = np.full(cap.shape[0], np.inf)
    for k in range(ctype.shape[0]):
        t = ctype[k]
        if t >= 0 and cap[t] >= 0 and U[k, cap[t]] < out[t]:
            out[t] = U[k, cap[t]]
    return out


@njit(cache=True)
def dense_usage(indptr, indices, data, rows, n_x, U):
    """``U[k, i]`` = the CSR matrix's entry (``rows[i]``, ``k``) for the choice columns
    ``k < n_x`` (``U`` zeroed by the caller; entries summed, as a canonical CSR holds each
    once)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for p in range(indptr[r], indptr[r + 1]):
            k = indices[p]
            if k < n_x:
                U[k, i] += data[p]


@njit(cache=True)
def expand(lo, hi, assign, start, running0, frozen, pinned, c, gpus, ctype, U, ub, act, counts,
           order, dens, ranked, cap, min_g, live):
    """The expand step: every job's best move that fits, in one heap (one entry per job),
    best gain per GPU added first. The top move is taken if it still fits (other moves
    took slack since); either way the job's next move that fits replaces its entry, so a
    job's next move (growing what it was just given) competes with the other jobs' first
    moves. A move found not to fit is not looked at again in the step (slack only
    shrinks here, but for sideways moves) until its job moves. Ends when no job has a
    move that fits.

    ``order``/``dens`` hold each job's ranked columns across calls; ``ranked[j]`` is the
    column job ``j`` was ranked from (-1: never), so a second expand re-ranks only the
    jobs that moved since (a ranking depends on nothing else)."""
    n_jobs = lo.shape[0]
    n_x = U.shape[0] - 1
    d = np.empty(ub.shape[0])
    ptr = lo.copy()
    hk = np.empty(n_jobs)                      # heap: key (-density) and job; the move is order[ptr[job]]
    hj = np.empty(n_jobs, dtype=np.int64)
    n = 0
    for j in range(n_jobs):
        if ranked[j] != assign[j]:
            _rank(j, lo, hi, assign, c, gpus, ctype, frozen, pinned, n_x, order, dens)
            live[j] = _live_end(j, lo, hi, assign, order, dens, ctype, U, cap, min_g)
            ranked[j] = assign[j]
        k = _next_fit(j, hi, assign, start, running0, gpus, ctype, U, ub, act, order, dens, ptr, cap, min_g, live)
        if k >= 0:
            hk[n], hj[n] = -dens[k], j
            n += 1
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(hk, hj, i, n)
    while n:
        j = hj[0]
        k = order[ptr[j]]
        if _move_fits(j, k, assign, start, running0, gpus, U, ub, act):
            _delta(j, k, assign, start, running0, gpus, U, d)
            act += d
            assign[j] = k
            counts[0] += 1
            _rank(j, lo, hi, assign, c, gpus, ctype, frozen, pinned, n_x, order, dens)
            live[j] = _live_end(j, lo, hi, assign, order, dens, ctype, U, cap, min_g)
            ranked[j] = k
            ptr[j] = lo[j]
        else:
            ptr[j] += 1
        k = _next_fit(j, hi, assign, start, running0, gpus, ctype, U, ub, act, order, dens, ptr, cap, min_g, live)
        if k >= 0:                             # the job's next move replaces its entry
            hk[0] = -dens[k]
        else:                                  # none: the last entry takes the top
            n -= 1
            hk[0], hj[0] = hk[n], hj[n]
        _sift_down(hk, hj, 0, n)


@njit(cache=True)
def balance(lo, hi, assign, start, running0, frozen, pinned, c, gpus, ctype, U, ub, act, counts):
    """The balance step. Receivers: each job's best open move, best gain per GPU first.
    Donors: each placed, non-frozen job's cheapest way to free GPUs of its type (a column
    of the same type with fewer GPUs, or stopping unless pinned), by value lost per GPU
    freed. A receiver whose move does not fit takes donors of its destination type,
    cheapest first (at most ``MAX_DONORS_EXAMINED``, skipping those that free no row it
    lacks), while their losses stay below its gain; the exchange is made when it then
    fits. Every job moves at most once here. Stops after ``BALANCE_PATIENCE`` receivers
    in a row found no exchange that pays. Returns whether anything moved."""
    n_x = U.shape[0] - 1
    n_jobs = lo.shape[0]
    R = U.shape[1]
    # receivers, best density first (ties: lower job index)
    r_j = np.empty(n_jobs, dtype=np.int64)
    r_k = np.empty(n_jobs, dtype=np.int64)
    r_d = np.empty(n_jobs)
    nr = 0
    for j in range(n_jobs):
        k, dens = _best(j, lo, hi, assign, c, gpus, ctype, frozen, pinned, n_x)
        if k >= 0:
            r_j[nr], r_k[nr], r_d[nr] = j, k, dens
            nr += 1
    if nr == 0:
        return False
    order = np.argsort(-r_d[:nr], kind="mergesort")
    r_j, r_k, r_d = r_j[:nr][order], r_k[:nr][order], r_d[:nr][order]
    # donors: per placed, non-frozen job its cheapest way to free GPUs of its type
    d_j = np.empty(n_jobs, dtype=np.int64)
    d_k = np.empty(n_jobs, dtype=np.int64)
    d_loss = np.empty(n_jobs)
    d_per = np.empty(n_jobs)
    nd = 0
    for j in range(n_jobs):
        cur = assign[j]
        if cur == n_x or frozen[j]:
            continue
        bk, bper, bfreed = -1, np.inf, 0.0
        for k in range(lo[j], hi[j]):
            if ctype[k] != ctype[cur] or gpus[k] >= gpus[cur]:
                continue
            freed = gpus[cur] - gpus[k]
            per = (c[cur] - c[k]) / freed
            if per < bper or (per == bper and freed > bfreed):
                bk, bper, bfreed = k, per, freed
        if not pinned[j]:                       # stopping: a pinned job keeps running
            freed = gpus[cur]
            per = c[cur] / freed
            if per < bper or (per == bper and freed > bfreed):
                bk, bper, bfreed = n_x, per, freed
        if bk >= 0:
            d_j[nd], d_k[nd], d_loss[nd], d_per[nd] = j, bk, c[cur] - c[bk], bper
            nd += 1
    if nd == 0:
        return False
    order = np.argsort(d_per[:nd], kind="mergesort")
    d_j, d_k, d_loss, d_per = d_j[:nd][order], d_k[:nd][order], d_loss[:nd][order], d_per[:nd][order]
    # row changes, from the assignment at the start of the step (every job moves at most once)
    # (computed when first needed: a job's row changes are read only while it has not
    # moved in this step, so its assignment is still the one at the start)
    rcv = np.empty(R + 2)
    don_D = np.empty((nd, R + 2))
    don_known = np.zeros(nd, dtype=np.bool_)
    dtype = np.empty(nd, dtype=np.int64)
    for i in range(nd):
        dtype[i] = ctype[assign[d_j[i]]]
    # donors by GPU type, cheapest first: pool[t] = donor indices of type t, front[t] its first unused
    n_types = int(ctype.max()) + 1
    counts_t = np.zeros(n_types + 1, dtype=np.int64)
    for i in range(nd):
        counts_t[dtype[i] + 1] += 1
    starts = np.cumsum(counts_t)
    fill = starts[:-1].copy()
    pool = np.empty(nd, dtype=np.int64)
    for i in range(nd):
        pool[fill[dtype[i]]] = i
        fill[dtype[i]] += 1
    front = starts[:-1].copy()
    end = starts[1:]
    used = np.zeros(n_jobs, dtype=np.bool_)
    need = np.empty(R + 2)
    take = np.empty(MAX_DONORS_EXAMINED, dtype=np.int64)
    moved = False
    misses = 0
    for i in range(nr):
        if misses >= BALANCE_PATIENCE:
            break
        j, gain, t = r_j[i], c[r_k[i]] - c[assign[r_j[i]]], ctype[r_k[i]]
        if pinned[j] and assign[j] == n_x:
            gain = np.inf
        while front[t] < end[t] and used[d_j[pool[front[t]]]]:
            front[t] += 1                          # drop used donors from the front
        if used[j] or front[t] == end[t] or r_d[i] <= d_per[pool[front[t]]]:
            continue                               # no donor of its type is cheap enough
        _delta(j, r_k[i], assign, start, running0, gpus, U, rcv)
        for r in range(R + 2):
            need[r] = act[r] + rcv[r] - ub[r]
        if np.all(need <= EPS):
            act += rcv
            assign[j] = r_k[i]
            counts[1] += 1
            used[j] = True
            moved = True
            continue
        misses += 1
        if need[R] > EPS or need[R + 1] > EPS:
            continue                               # the move budget is spent
        lost = 0.0
        n_take = 0
        for p in range(front[t], min(front[t] + MAX_DONORS_EXAMINED, end[t])):
            dn = pool[p]
            if used[d_j[dn]] or d_j[dn] == j:
                continue
            if not don_known[dn]:
                _delta(d_j[dn], d_k[dn], assign, start, running0, gpus, U, don_D[dn])
                don_known[dn] = True
            helps = False
            for r in range(R):
                if need[r] > EPS and don_D[dn, r] < -EPS:
                    helps = True
                    break
            if not helps:
                continue
            if lost + d_loss[dn] >= gain:
                break
            take[n_take] = dn
            n_take += 1
            lost += d_loss[dn]
            need += don_D[dn]
            lacking = False
            for r in range(R):
                if need[r] > EPS:
                    lacking = True
                    break
            if not lacking:
                break
        if n_take and np.all(need <= EPS) and lost < gain:
            act += rcv
            assign[j] = r_k[i]
            used[j] = True
            for q in range(n_take):
                dn = take[q]
                act += don_D[dn]
                assign[d_j[dn]] = d_k[dn]
                used[d_j[dn]] = True
            counts[1] += 1 + n_take
            moved = True
            misses = 0
    return moved


def warm_up() -> float:
    """Load (or compile, the first time on a machine: about ten seconds; cached under
    ``__pycache__`` after that) the kernels, on a one-job problem; returns the seconds it
    took. Once per process: the first search of a run pays it otherwise."""
    import time
    t0 = time.perf_counter()
    one = np.zeros(1, dtype=np.int64)
    args = (one, one + 1, one + 1, one + 1, np.zeros(1, dtype=np.bool_), np.zeros(1, dtype=np.bool_),
            np.zeros(1, dtype=np.bool_), np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([0, -1]),
            np.array([[1.0], [0.0]]), np.ones(3), np.zeros(3), np.zeros(2, dtype=np.int64))
    U, cap = args[10], np.zeros(1, dtype=np.int64)
    dense_usage(np.array([0, 1]), one, np.ones(1), one, 1, U)
    expand(*args, np.zeros(1, dtype=np.int64), np.zeros(1), np.full(1, -1, dtype=np.int64), cap,
           type_min_usage(args[9], U, cap), np.zeros(1, dtype=np.int64))
    balance(*args)
    for queued_all in (True, False):
        neighbour_columns(one, one - 1, one, one, one, one, False, queued_all, one, np.empty(1, dtype=np.int64))
    return time.perf_counter() - t0

