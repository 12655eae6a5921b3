"""``auto``: the fastest path that proves the requested gap, escalating when it does not.

1. warm Lagrangian prices + rounding (``lagrangian``; proved gap from L(lambda));
2. if the gap is still above ``rel_gap``: the LP relaxation + rounding (``highs-lp``);
3. if still above: the HiGHS MILP warm-started from the best so far, for the time left.
The best solution found and the tightest bound are returned. The default of ``arena``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .base import Solution, SolverOptions, register_backend
from .highs import lp_round_solve, milp_solve
from .lagrangian import LagrangianBackend


@register_backend("auto")
@dataclass
class AutoBackend:
    options: SolverOptions = SolverOptions()
    name: str = "auto"
    _lagr: LagrangianBackend = field(default=None, repr=False)

    def __post_init__(self):
        if self._lagr is None:
            self._lagr = LagrangianBackend(self.options)

    def available(self) -> bool:
        return True

    def solve(self, model, time_limit_s: float = 10.0, hint=None, rel_gap: float = 0.01) -> Solution:
        t0 = time.perf_counter()
        steps = []
        tries: list[Solution] = []
        if self._lagr.applies_to(model):
            tries.append(self._lagr.solve(model, time_limit_s * 0.3, hint, rel_gap))
            steps.append(f"lagrangian gap {tries[-1].gap:.4f}")
        if not tries or tries[-1].status not in ("optimal", "infeasible"):
            left = time_limit_s - (time.perf_counter() - t0)
            tries.append(lp_round_solve(model, self.options, max(left * 0.5, 0.05), rel_gap, self.name))
            steps.append(f"lp-round gap {tries[-1].gap:.4f}")
        if tries[-1].status not in ("optimal", "infeasible"):
            left = time_limit_s - (time.perf_counter() - t0)
            best = max(tries, key=lambda s: s.objective)
            start = best.values[: model.n_x] if best.status != "fallback" else hint
            if left > 0.05:
                tries.append(milp_solve(model, self.options, left, rel_gap, start, self.name))
                steps.append(f"milp: {tries[-1].message} gap {tries[-1].gap:.4f}")
        if tries[-1].status == "infeasible":
            return tries[-1]
        best = max(tries, key=lambda s: (s.status != "fallback", s.objective))
        bound = min(s.bound for s in tries)
        return Solution.of(model, best.values, bound, value=best.objective - model.offset, rel_gap=rel_gap,
                           status="fallback" if best.status == "fallback" else None,
                           solve_time_s=time.perf_counter() - t0, backend=self.name,
                           message="; ".join(steps), extra={"steps": len(tries)})
