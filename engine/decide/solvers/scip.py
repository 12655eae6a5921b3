"""SCIP (and CBC) through OR-Tools' linear solver wrapper (pywraplp), built from the
model arrays. Reports ``BackendUnavailable`` when this OR-Tools build lacks the solver."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .base import BackendUnavailable, Solution, SolverOptions, register_backend
from .greedy import greedy_solution


def _solve_pywraplp(solver_id: str, name: str, options, model, time_limit_s, hint, rel_gap) -> Solution:
    from ortools.linear_solver import pywraplp
    t0 = time.perf_counter()
    s = pywraplp.Solver.CreateSolver(solver_id)
    if s is None:
        raise BackendUnavailable(f"backend {name!r}: OR-Tools here has no {solver_id} solver")
    inf = s.infinity()
    vs = []
    for i in range(model.n_vars):
        lb = model.col_lb[i] if math.isfinite(model.col_lb[i]) else -inf
        ub = model.col_ub[i] if math.isfinite(model.col_ub[i]) else inf
        vs.append(s.IntVar(lb, ub, f"v{i}") if model.integral[i] else s.NumVar(lb, ub, f"v{i}"))
    A = model.A.tocsr()
    for r in range(model.n_rows):
        lb = model.row_lb[r] if math.isfinite(model.row_lb[r]) else -inf
        ub = model.row_ub[r] if math.isfinite(model.row_ub[r]) else inf
        ct = s.Constraint(lb, ub)
        for i, a in zip(A.indices[A.indptr[r]:A.indptr[r + 1]].tolist(), A.data[A.indptr[r]:A.indptr[r + 1]].tolist()):
            ct.SetCoefficient(vs[i], a)
    obj = s.Objective()
    for i in np.flatnonzero(model.c).tolist():
        obj.SetCoefficient(vs[i], float(model.c[i]))
    obj.SetMaximization()
    if hint is not None:
        s.SetHint(vs[: model.n_x], [float(v) for v in np.asarray(hint[: model.n_x])])
    s.SetTimeLimit(int(max(time_limit_s, 0.01) * 1000))
    s.SetNumThreads(int(options.threads))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, float(rel_gap))
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    st = s.Solve(params)
    if st == pywraplp.Solver.INFEASIBLE:
        return greedy_solution(model, backend=name, status="infeasible", build_time_s=build,
                               message=f"{solver_id}: infeasible; greedy decision over capacity rows")
    if st not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return greedy_solution(model, backend=name, status="fallback", build_time_s=build,
                               message=f"{solver_id}: no incumbent (status {st}); greedy decision")
    v = np.array([x.solution_value() for x in vs])
    v[: model.n_x] = np.round(v[: model.n_x])
    return Solution.of(model, v, float(obj.BestBound()), rel_gap=rel_gap, proved=st == pywraplp.Solver.OPTIMAL,
                       build_time_s=build, solve_time_s=time.perf_counter() - t1, backend=name,
                       message=f"{solver_id} status {st}")


def _has(solver_id: str) -> bool:
    try:
        from ortools.linear_solver import pywraplp
        return pywraplp.Solver.CreateSolver(solver_id) is not None
    except ImportError:
        return False


@register_backend("scip")
@dataclass(frozen=True)
class Scip:
    options: SolverOptions = SolverOptions()
    name: str = "scip"

    def available(self) -> bool:
        return _has("SCIP")

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        return _solve_pywraplp("SCIP", self.name, self.options, model, time_limit_s, hint, rel_gap)
