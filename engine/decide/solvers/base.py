"""The solver seam: ``SolverBackend.solve(model, time_limit_s, hint=None, rel_gap=...)``.

Every backend returns a ``Solution`` and never raises for solver trouble: a time-out
returns the best incumbent (status "feasible"), no incumbent falls back to the greedy
decision (status "fallback"), an infeasible model returns the greedy decision over
the capacity rows (status "infeasible"), and a backend that is not installed raises
``BackendUnavailable`` at call time, naming what is missing.

Gaps are relative to the objective without its constant offset (sum of the chosen
variables' coefficients): gap = (bound - value) / max(|bound|, |value|, 1e-9).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from instances.errors import InputError
from instances.limits import available_cores
from instances.registry import Registry

if TYPE_CHECKING:
    from ..formulation.model import MilpModel

STATUSES = ("optimal", "feasible", "fallback", "infeasible", "error")
GAP_TOLERANCE = 1e-9            # a gap this far above rel_gap still counts as proved


class BackendUnavailable(RuntimeError):
    """The backend's solver is not installed here."""


@dataclass(frozen=True, eq=False)
class Solution:
    status: str                  # one of STATUSES; "optimal" = proved within the requested gap
    values: np.ndarray           # one value per model variable
    objective: float             # c @ values + offset
    bound: float                 # proved upper bound on c @ v (offset excluded); inf if none
    gap: float                   # relative, offset excluded; inf if no bound
    build_time_s: float
    solve_time_s: float
    backend: str
    message: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown solution status {self.status!r}")

    @classmethod
    def of(cls, model: "MilpModel", values: np.ndarray, bound: float, *, backend: str, solve_time_s: float,
           build_time_s: float = 0.0, rel_gap: float | None = None, proved: bool = False,
           status: str | None = None, value: float | None = None, message: str = "",
           extra: dict | None = None) -> "Solution":
        """The one way a backend reports a solution: ``value`` (offset excluded) defaults to
        ``c @ values``; the gap follows from value and bound; the status, unless given, is
        "optimal" when the solver ``proved`` it or the gap is within ``rel_gap`` (1e-9
        tolerance), else "feasible"."""
        if value is None:
            value = float(model.c @ values)
        gap = relative_gap(value, bound)
        if status is None:
            if rel_gap is None:
                raise ValueError("Solution.of needs a status or rel_gap")
            status = "optimal" if (proved or gap <= rel_gap + GAP_TOLERANCE) else "feasible"
        return cls(status=status, values=values, objective=value + model.offset, bound=bound, gap=gap,
                   build_time_s=build_time_s, solve_time_s=solve_time_s, backend=backend, message=message,
                   extra=extra or {})

    def selected(self, n_x: int) -> np.ndarray:
        return np.flatnonzero(self.values[:n_x] > 0.5)


def relative_gap(value: float, bound: float) -> float:
    if not np.isfinite(bound):
        return float("inf")
    return max(0.0, (bound - value) / max(abs(bound), abs(value), 1e-9))


class SolverBackend(Protocol):
    name: str

    def solve(self, model: "MilpModel", time_limit_s: float, hint: np.ndarray | None = None,
              rel_gap: float = 0.01) -> Solution: ...


MAX_SOLVER_SEED = 2**31 - 1             # the solvers take a 32-bit signed seed


@dataclass(frozen=True)
class SolverOptions:
    """Knobs shared by the backends (each reads the ones it supports). ``threads`` is at
    most the cores present (``available_cores``): every backend (HiGHS, CP-SAT's workers,
    SCIP, CBC) is given it as is, and more threads than cores only slows a solver down
    (HiGHS given 99,999 aborted after a minute and 800 MB)."""
    threads: int = 1
    seed: int = 0
    presolve: bool = False          # HiGHS MILP: presolve off was faster on these models
    cpsat_tuned: bool = True        # CP-SAT: no presolve, linearization level 2

    def __post_init__(self):
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise InputError(f"threads must be an integer >= 1, got {self.threads!r}", field="threads")
        cores = available_cores()
        if self.threads > cores:
            raise InputError(f"threads must be at most the {cores} CPU core(s) this process may use "
                             f"(os.sched_getaffinity), got {self.threads}", field="threads")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SOLVER_SEED:
            raise InputError(f"seed must be an integer in [0, {MAX_SOLVER_SEED}], got {self.seed!r}", field="seed")


BACKENDS: Registry[Callable[..., SolverBackend]] = Registry("solver backend", package="engine.decide.solvers",
                                                           field="backend")
register_backend = BACKENDS.register
backend_names = BACKENDS.names


def make_backend(name: str, options: SolverOptions | None = None) -> SolverBackend:
    """A backend by registered name (every module of engine/decide/solvers is discovered; solver
    packages are imported only inside ``solve``/``available``, so every backend is listed
    even where its solver is missing)."""
    return BACKENDS.get(name)(options or SolverOptions())


def available_backends() -> list[str]:
    """Backends whose solver is installed here."""
    out = []
    for n in backend_names():
        b = make_backend(n)
        ok = getattr(b, "available", lambda: True)()
        if ok:
            out.append(n)
    return out
