"""HiGHS through highspy, straight from the model arrays (no modelling layer).

Backends:
- ``highs``: the MILP (branch and cut). Presolve is off by default (measured faster on
  these models: few rows, many binaries); warm start from the hint.
- ``highs-lp``: the LP relaxation, then rounding (columns by LP value) and a greedy
  fill; the LP optimum is a proved bound, so the gap is proved too.
- ``highs-auto``: ``highs-lp`` first; if its proved gap exceeds ``rel_gap``, the MILP
  with the rounded solution as warm start for the time left. Default for ``arena``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .base import GAP_TOLERANCE, Solution, SolverOptions, register_backend, relative_gap
from .greedy import _Structure, complete, greedy_select, greedy_solution, orders
from .highs_api import new_highs, to_highs_lp

_INF = float("inf")


def _new_highs(options: SolverOptions, time_limit_s: float):
    h = new_highs(int(options.threads))
    h.setOptionValue("random_seed", int(options.seed))
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    return h


def solve_lp(model, options: SolverOptions, time_limit_s: float):
    """LP relaxation: (status string, values or None, objective without offset, row duals)."""
    import highspy
    h = _new_highs(options, time_limit_s)
    h.setOptionValue("presolve", "off")          # measured faster on these LPs
    h.passModel(to_highs_lp(model, relax=True))
    h.run()
    st = h.getModelStatus()
    if st == highspy.HighsModelStatus.kOptimal:
        sol = h.getSolution()
        v = np.array(sol.col_value)
        return "optimal", v, float(model.c @ v), np.array(sol.row_dual)
    if st == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, -_INF, None
    return "unfinished", None, _INF, None


def round_lp(model, v_lp: np.ndarray, structure=None) -> np.ndarray:
    """Columns in decreasing LP value (ties by objective), then the greedy orders."""
    s = structure or _Structure(model)
    xl = v_lp[: model.n_x]
    c = model.c[: model.n_x]
    frac_order = np.lexsort((-c, -xl))
    frac_order = frac_order[(xl[frac_order] > 1e-6) & (xl[frac_order] < 1 - 1e-6)]
    # columns at 1 in the LP fit together on every row without continuous variables
    # (all such rows are <= rows with non-negative activity from the others)
    x0 = (xl >= 1 - 1e-6).astype(float)
    if s.checked.all() and not len(s.lb_rows) and (model.A.data >= 0).all():
        pass
    else:
        x0 = None
    best, best_val = None, -_INF
    for fill in orders(model, s):
        x = greedy_select(model, np.concatenate([frac_order, fill]), structure=s, x0=x0)
        v, ok = complete(model, x)
        val = float(model.c @ v)
        if ok and val > best_val:
            best, best_val = v, val
    return best


def lp_round_solve(model, options, time_limit_s, rel_gap, name, build_time_s=0.0) -> Solution:
    t0 = time.perf_counter()
    st, v_lp, bound, _ = solve_lp(model, options, time_limit_s)
    if st == "infeasible":
        return greedy_solution(model, backend=name, status="infeasible", build_time_s=build_time_s,
                               message="LP relaxation infeasible; greedy decision over capacity rows")
    if v_lp is None:
        return greedy_solution(model, backend=name, status="fallback", build_time_s=build_time_s,
                               message=f"LP did not finish in {time_limit_s:.3g} s; greedy decision")
    v = round_lp(model, v_lp)
    if v is None:
        return greedy_solution(model, backend=name, status="fallback", bound=bound, build_time_s=build_time_s,
                               message="rounding found no feasible point; greedy decision")
    return Solution.of(model, v, bound, rel_gap=rel_gap, build_time_s=build_time_s,
                       solve_time_s=time.perf_counter() - t0, backend=name,
                       message="LP relaxation + rounding + greedy fill")


def milp_solve(model, options, time_limit_s, rel_gap, hint, name, build_time_s=0.0) -> Solution:
    import highspy
    t0 = time.perf_counter()
    h = _new_highs(options, time_limit_s)
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("presolve", "on" if options.presolve else "off")
    h.passModel(to_highs_lp(model))
    if hint is not None:
        v0, ok = complete(model, np.asarray(hint[: model.n_x], dtype=float))
        if ok:
            sol = highspy.HighsSolution()
            sol.col_value = v0
            sol.value_valid = True
            h.setSolution(sol)
    h.run()
    st = h.getModelStatus()
    info = h.getInfo()
    if st == highspy.HighsModelStatus.kInfeasible:
        return greedy_solution(model, backend=name, status="infeasible", build_time_s=build_time_s,
                               message="MILP infeasible; greedy decision over capacity rows")
    has = info.primal_solution_status == 2          # kSolutionStatusFeasible
    bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else _INF
    if not has:
        return greedy_solution(model, backend=name, status="fallback", bound=bound, build_time_s=build_time_s,
                               message=f"no incumbent ({h.modelStatusToString(st)}); greedy decision")
    v = np.array(h.getSolution().col_value)
    v[: model.n_x] = np.round(v[: model.n_x])
    return Solution.of(model, v, bound, rel_gap=rel_gap, proved=st == highspy.HighsModelStatus.kOptimal,
                       build_time_s=build_time_s, solve_time_s=time.perf_counter() - t0, backend=name,
                       message=h.modelStatusToString(st), extra={"mip_nodes": int(info.mip_node_count)})


def _available() -> bool:
    try:
        import highspy  # noqa: F401
        return True
    except ImportError:
        return False


@register_backend("highs")
@dataclass(frozen=True)
class HighsMilp:
    options: SolverOptions = SolverOptions()
    name: str = "highs"

    def available(self) -> bool:
        return _available()

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        return milp_solve(model, self.options, time_limit_s, rel_gap, hint, self.name)


@register_backend("highs-lp")
@dataclass(frozen=True)
class HighsLpRound:
    options: SolverOptions = SolverOptions()
    name: str = "highs-lp"

    def available(self) -> bool:
        return _available()

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        return lp_round_solve(model, self.options, time_limit_s, rel_gap, self.name)


@register_backend("highs-auto")
@dataclass(frozen=True)
class HighsAuto:
    options: SolverOptions = SolverOptions()
    name: str = "highs-auto"

    def available(self) -> bool:
        return _available()

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        t0 = time.perf_counter()
        first = lp_round_solve(model, self.options, time_limit_s, rel_gap, self.name)
        if first.status in ("optimal", "infeasible"):
            return first
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0.01:
            return first
        start = first.values[: model.n_x] if first.status != "fallback" else hint
        second = milp_solve(model, self.options, left, rel_gap, start, self.name)
        best = second if second.objective >= first.objective or second.status == "infeasible" else first
        bound = min(first.bound, second.bound)
        val = best.objective - model.offset
        status = "optimal" if relative_gap(val, bound) <= rel_gap + GAP_TOLERANCE else best.status
        return Solution.of(model, best.values, bound, value=val, status=status,
                           solve_time_s=time.perf_counter() - t0, backend=self.name,
                           message=f"LP rounding gap {first.gap:.4f}; then MILP: {second.message}")
