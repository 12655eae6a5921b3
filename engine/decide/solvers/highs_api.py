"""A silent, thread-safe way to build HiGHS problems from the model arrays: what the
HiGHS backends, the greedy completion and the Lagrangian's master problem share."""
from __future__ import annotations

import numpy as np

_INF = float("inf")


def to_highs_lp(model, *, relax: bool = False, col_lb=None, col_ub=None, row_lb=None, with_offset: bool = False):
    import highspy
    lp = highspy.HighsLp()
    A = model.A.tocsc()
    lp.num_col_ = model.n_vars
    lp.num_row_ = model.n_rows
    lp.col_cost_ = np.asarray(model.c, dtype=float)
    lp.col_lower_ = np.asarray(model.col_lb if col_lb is None else col_lb, dtype=float)
    lp.col_upper_ = np.asarray(model.col_ub if col_ub is None else col_ub, dtype=float)
    lp.row_lower_ = np.asarray(model.row_lb if row_lb is None else row_lb, dtype=float)
    if with_offset:
        lp.offset_ = float(model.offset)
    lp.row_upper_ = np.asarray(model.row_ub, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(float)
    lp.a_matrix_.num_col_ = model.n_vars
    lp.a_matrix_.num_row_ = model.n_rows
    lp.sense_ = highspy.ObjSense.kMaximize
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in model.integral]
    return lp


_SCHEDULER_THREADS: list = [None]     # thread count HiGHS's global scheduler was started with
_BANNER_SHOWN: list = [False]         # HiGHS prints its banner at the process's first Highs() only


def _highs_without_banner(highspy):
    """``highspy.Highs()``, with the version and copyright banner that HiGHS's C++ code
    prints on the process's stdout at its first construction discarded: stdout carries
    tables and ``--json`` output, and stderr is for progress (``--quiet`` means quiet).
    After that first construction stdout is left alone (redirecting it costs more than
    a small round's solve)."""
    if _BANNER_SHOWN[0]:
        return highspy.Highs()
    _BANNER_SHOWN[0] = True
    import os
    import sys
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                 # no stdout file descriptor: nothing to protect
        return highspy.Highs()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def reuse_highs(h, threads: int = 1):
    """``h`` emptied for another model (its options kept), or a ``new_highs`` when there is
    none or HiGHS's scheduler has since been restarted with another thread count.
    Constructing a Highs costs more than a small cutting-plane solve."""
    if h is None or _SCHEDULER_THREADS[0] != threads:
        return new_highs(threads)
    h.clearModel()
    return h


def claim_scheduler(threads: int) -> None:
    """Before any HiGHS run in this process with ``threads`` threads, ours or PuLP's:
    HiGHS runs one global thread scheduler per process and refuses a run whose
    ``threads`` differs from the count it was started with (the run ends with model
    status "Not Set"), so a change of thread count restarts the scheduler first."""
    import highspy
    if _SCHEDULER_THREADS[0] not in (None, threads):
        highspy.Highs.resetGlobalScheduler(True)
    _SCHEDULER_THREADS[0] = threads


def restart_scheduler() -> None:
    """Restart HiGHS's global thread scheduler, as a fresh process has it: the next HiGHS
    run, ours (``claim_scheduler``) or another library's such as PuLP's, starts it with
    its own thread count."""
    import highspy
    highspy.Highs.resetGlobalScheduler(True)
    _SCHEDULER_THREADS[0] = None


def new_highs(threads: int = 1):
    """A silent Highs instance for ``threads`` threads (``claim_scheduler``)."""
    import highspy
    claim_scheduler(threads)
    h = _highs_without_banner(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    return h
