"""OR-Tools CP-SAT.

CP-SAT solves integer programs only, so the model is scaled:
- objective: coefficients times K = OBJECTIVE_RESOLUTION / max|c|, rounded to integers
  (the relative error per coefficient is at most 0.5 / OBJECTIVE_RESOLUTION of the
  largest coefficient); the objective, bound and gap reported are recomputed in the
  model's own units from the solution (bound divided by K);
- rows whose coefficients are all integers are kept exactly (job rows, node-shape rows,
  quotas); other rows are multiplied by ROW_SCALE and rounded, their right-hand side
  rounded inwards (an approximation, only for rows that terms such as fairness add);
- continuous variables become integers in units of 1 / VAR_SCALE.

Parameters: time limit, relative gap, worker count (SolverOptions.threads), random
seed; ``cpsat_tuned`` turns presolve off and sets linearization level 2 (measured
faster on these models than the defaults). The hint becomes CP-SAT's solution hint.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .base import Solution, SolverOptions, register_backend
from .greedy import complete, greedy_solution

OBJECTIVE_RESOLUTION = 1e6
ROW_SCALE = 1000
VAR_SCALE = 1000


@register_backend("cpsat")
@dataclass(frozen=True)
class CpSat:
    options: SolverOptions = SolverOptions()
    name: str = "cpsat"

    def available(self) -> bool:
        try:
            from ortools.sat.python import cp_model  # noqa: F401
            return True
        except ImportError:
            return False

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        from ortools.sat.python import cp_model
        t0 = time.perf_counter()
        cp = cp_model.CpModel()
        n_x = model.n_x
        xs = [cp.new_bool_var(f"x{i}") for i in range(n_x)]
        ys = []
        for i in range(n_x, model.n_vars):
            lb, ub = model.col_lb[i], model.col_ub[i]
            if not (math.isfinite(lb) and math.isfinite(ub)):
                raise ValueError("CP-SAT needs finite bounds on continuous variables")
            ys.append(cp.new_int_var(math.ceil(lb * VAR_SCALE), math.floor(ub * VAR_SCALE), f"y{i}"))
        allv = xs + ys
        var_scale = np.ones(model.n_vars)
        var_scale[n_x:] = 1.0 / VAR_SCALE
        A = model.A.tocsr()
        for r in range(model.n_rows):
            lo, hi = A.indptr[r], A.indptr[r + 1]
            idx, val = A.indices[lo:hi], A.data[lo:hi] * var_scale[A.indices[lo:hi]]
            exact = np.all(idx < n_x) and np.allclose(val, np.round(val))
            s = 1 if exact else ROW_SCALE
            coef = np.round(val * s).astype(np.int64).tolist()
            expr = cp_model.LinearExpr.weighted_sum([allv[i] for i in idx.tolist()], coef)
            rlb, rub = model.row_lb[r], model.row_ub[r]
            if math.isfinite(rub):
                cp.add(expr <= math.floor(rub * s + 1e-9))
            if math.isfinite(rlb):
                cp.add(expr >= math.ceil(rlb * s - 1e-9))
        cmax = float(np.abs(model.c * var_scale).max(initial=0.0)) or 1.0
        K = OBJECTIVE_RESOLUTION / cmax
        obj = np.round(model.c * var_scale * K).astype(np.int64)
        nz = np.flatnonzero(obj)
        cp.maximize(cp_model.LinearExpr.weighted_sum([allv[i] for i in nz.tolist()], obj[nz].tolist()))
        if hint is not None:
            for i, v in enumerate(np.asarray(hint[:n_x]).tolist()):
                cp.add_hint(xs[i], bool(v > 0.5))
        build = time.perf_counter() - t0
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = float(max(time_limit_s - build, 0.01))
        p.relative_gap_limit = float(rel_gap)
        p.num_workers = int(self.options.threads)
        p.random_seed = int(self.options.seed)
        if self.options.cpsat_tuned:
            p.cp_model_presolve = False
            p.linearization_level = 2
        t1 = time.perf_counter()
        st = solver.solve(cp)
        if st == cp_model.INFEASIBLE:
            return greedy_solution(model, backend=self.name, status="infeasible", build_time_s=build,
                                   message="CP-SAT: infeasible; greedy decision over capacity rows")
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return greedy_solution(model, backend=self.name, status="fallback", build_time_s=build,
                                   message=f"CP-SAT: {solver.status_name(st)} without incumbent; greedy decision")
        x = np.array([solver.boolean_value(v) for v in xs], dtype=float)
        v, ok = complete(model, x)
        bound = float(solver.best_objective_bound) / K
        return Solution.of(model, v, bound, rel_gap=rel_gap, proved=st == cp_model.OPTIMAL, build_time_s=build,
                           solve_time_s=time.perf_counter() - t1, backend=self.name,
                           message=f"CP-SAT {solver.status_name(st)}")
