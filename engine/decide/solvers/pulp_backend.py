"""CBC, HiGHS and SCIP through PuLP (the portable modelling layer), and MPS/LP export.

PuLP builds the model in Python objects (about 50x slower than the array path), so
these backends are for cross-checking and portability, not for the fast path. Which
solvers PuLP can run is checked at call time: CBC is bundled with PuLP; SCIP needs a
``scip`` binary or PySCIPOpt (absent here: ``pulp-scip`` then raises
``BackendUnavailable`` saying so; the ``scip`` backend reaches SCIP through OR-Tools).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .base import BackendUnavailable, Solution, SolverOptions, register_backend
from .greedy import greedy_solution
from .highs_api import claim_scheduler


def to_pulp(model):
    import pulp
    prob = pulp.LpProblem("arena_round", pulp.LpMaximize)
    vs = []
    for i in range(model.n_vars):
        lb = model.col_lb[i] if math.isfinite(model.col_lb[i]) else None
        ub = model.col_ub[i] if math.isfinite(model.col_ub[i]) else None
        cat = pulp.LpBinary if (model.integral[i] and lb == 0 and ub == 1) else (
            pulp.LpInteger if model.integral[i] else pulp.LpContinuous)
        vs.append(pulp.LpVariable(f"v{i}", lb, ub, cat))
    nz = np.flatnonzero(model.c)
    prob += pulp.LpAffineExpression([(vs[i], float(model.c[i])) for i in nz.tolist()]) + model.offset
    A = model.A.tocsr()
    for r in range(model.n_rows):
        lo, hi = A.indptr[r], A.indptr[r + 1]
        expr = pulp.LpAffineExpression([(vs[i], float(a))
                                        for i, a in zip(A.indices[lo:hi].tolist(), A.data[lo:hi].tolist())])
        lb, ub = model.row_lb[r], model.row_ub[r]
        if math.isfinite(lb) and math.isfinite(ub) and lb == ub:
            prob += (expr == ub), f"r{r}"
            continue
        if math.isfinite(ub):
            prob += (expr <= ub), f"r{r}u"
        if math.isfinite(lb):
            prob += (expr >= lb), f"r{r}l"
    return prob, vs


def export_model(model, path: str | Path, fmt: str = "mps", via: str = "highs") -> Path:
    """Write the model (with its constant offset) as MPS or LP, through HiGHS (fast)
    or PuLP. HiGHS writes the maximization sense into the file (OBJSENSE); PuLP's MPS
    states it only in a comment line (``*SENSE:Maximize``), which other readers ignore,
    and both of PuLP's files lose the constant offset (as read back by HiGHS)."""
    path = Path(path)
    if fmt not in ("mps", "lp"):
        raise ValueError(f"unknown export format {fmt!r}")
    if via == "pulp":
        prob, _ = to_pulp(model)
        (prob.writeMPS if fmt == "mps" else prob.writeLP)(str(path))
        return path
    from .highs_api import new_highs, to_highs_lp
    h = new_highs()
    h.passModel(to_highs_lp(model, with_offset=True))
    h.writeModel(str(path))
    return path


_SOLVERS = {"pulp-cbc": "PULP_CBC_CMD", "pulp-highs": "HiGHS", "pulp-scip": "SCIP_CMD"}


def _make_solver(name: str, options: SolverOptions, time_limit_s: float, rel_gap: float, warm: bool):
    import pulp
    sid = _SOLVERS[name]
    if sid == "SCIP_CMD":
        for cand in ("SCIP_CMD", "SCIP_PY"):
            s = pulp.getSolver(cand, msg=False, timeLimit=time_limit_s, gapRel=rel_gap)
            if s.available():
                return s
        raise BackendUnavailable("backend 'pulp-scip': PuLP finds no SCIP here (no 'scip' binary on PATH, "
                                 "no PySCIPOpt); use the 'scip' backend (SCIP inside OR-Tools)")
    kwargs = dict(msg=False, timeLimit=time_limit_s, gapRel=rel_gap)
    if sid == "PULP_CBC_CMD":
        kwargs.update(threads=options.threads, warmStart=warm)
    elif sid == "HiGHS":        # in this process: HiGHS's one scheduler must run with our thread count
        kwargs.update(threads=options.threads)
    s = pulp.getSolver(sid, **kwargs)
    if not s.available():
        raise BackendUnavailable(f"backend {name!r}: PuLP solver {sid} is not available here")
    return s


def _pulp_available(name: str) -> bool:
    try:
        _make_solver(name, SolverOptions(), 1.0, 0.01, False)
        return True
    except (BackendUnavailable, ImportError):
        return False


def _solve(name, options, model, time_limit_s, hint, rel_gap) -> Solution:
    import pulp
    t0 = time.perf_counter()
    solver = _make_solver(name, options, time_limit_s, rel_gap, hint is not None)
    prob, vs = to_pulp(model)
    if hint is not None:
        for v, h in zip(vs[: model.n_x], np.asarray(hint[: model.n_x]).tolist()):
            v.setInitialValue(1 if h > 0.5 else 0)
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    if _SOLVERS[name] == "HiGHS":
        claim_scheduler(options.threads)
    prob.solve(solver)
    status = pulp.LpStatus[prob.status]
    if status == "Infeasible":
        return greedy_solution(model, backend=name, status="infeasible", build_time_s=build,
                               message="infeasible; greedy decision over capacity rows")
    vals = [v.value() for v in vs]
    if any(x is None for x in vals[: model.n_x]):
        return greedy_solution(model, backend=name, status="fallback", build_time_s=build,
                               message=f"PuLP status {status} without values; greedy decision")
    v = np.array([0.0 if x is None else float(x) for x in vals])
    v[: model.n_x] = np.round(v[: model.n_x])
    val = float(model.c @ v)
    if model.violation(v) > 1e-5:
        return greedy_solution(model, backend=name, status="fallback", build_time_s=build,
                               message=f"PuLP status {status}: solution violates the model; greedy decision")
    # PuLP exposes no dual bound: the gap is proved only when the solver reports optimality
    optimal = status == "Optimal" and getattr(prob, "sol_status", 1) == 1
    bound = val * (1 + rel_gap) if optimal else float("inf")
    return Solution.of(model, v, bound, value=val, status="optimal" if optimal else "feasible", build_time_s=build,
                       solve_time_s=time.perf_counter() - t1, backend=name,
                       message=f"PuLP {status} (sol_status {getattr(prob, 'sol_status', None)}); "
                               "bound = value x (1 + rel_gap) when optimal within the gap")


def _register(name: str):
    @register_backend(name)
    @dataclass(frozen=True)
    class _PulpBackend:
        options: SolverOptions = SolverOptions()

        @property
        def name(self) -> str:
            return name

        def available(self) -> bool:
            return _pulp_available(name)

        def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
            return _solve(name, self.options, model, time_limit_s, hint, rel_gap)

    _PulpBackend.__name__ = f"Pulp_{name.replace('-', '_')}"
    return _PulpBackend


for _n in _SOLVERS:
    _register(_n)
