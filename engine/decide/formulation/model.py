"""The per-round optimization model as plain sparse arrays.

One model per round: maximize ``c @ v`` subject to ``row_lb <= A @ v <= row_ub`` and
``col_lb <= v <= col_ub``. The first ``n_x`` variables are the binary choices
x[j, g] (job j runs on candidate column g); any further variables are continuous
(objective terms such as fairness add them). Arrays are numpy / scipy.sparse so that a
model for thousands of jobs is built in milliseconds and handed to HiGHS without a
modelling layer; the other backends translate from the same arrays.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

INF = float("inf")


class Prefixed(Sequence[str]):
    """Names ``prefix + str(id)``, made when read (a round has thousands of job rows and
    reads a handful of names: the Lagrangian keys its warm prices by row name)."""

    def __init__(self, prefix: str, ids: Sequence):
        self.prefix, self.ids = prefix, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):                       # type: ignore[override]
        if isinstance(i, slice):
            return [f"{self.prefix}{x}" for x in self.ids[i]]
        return f"{self.prefix}{self.ids[i]}"


class RowNames(Sequence[str]):
    """The concatenation of the builder's name chunks, read-only."""

    def __init__(self, chunks: Sequence[Sequence[str]]):
        self._chunks = tuple(chunks)
        self._ends = []
        n = 0
        for ch in self._chunks:
            n += len(ch)
            self._ends.append(n)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i):                       # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("row name index out of range")
        c = bisect.bisect_right(self._ends, i)
        return self._chunks[c][i - (self._ends[c - 1] if c else 0)]


@dataclass(frozen=True, eq=False)
class MilpModel:
    """A maximization MILP in array form. Treat the arrays as read-only."""
    c: np.ndarray                 # objective coefficients, one per variable
    col_lb: np.ndarray
    col_ub: np.ndarray
    integral: np.ndarray          # bool per variable
    A: sp.csr_matrix              # rows x variables
    row_lb: np.ndarray
    row_ub: np.ndarray
    row_names: Sequence[str]
    n_x: int                      # the first n_x variables are the binary choices
    col_job: np.ndarray           # job index of each choice variable (length n_x)
    n_jobs: int
    offset: float = 0.0           # constant added to the objective
    extra_names: tuple[str, ...] = ()   # the continuous variables' names, as the objective terms gave them
    job_rows: np.ndarray | None = None   # indices of the one-grid-per-job rows, when known
    capacity_rows: np.ndarray | None = None   # per GPU type, the index of its capacity row (-1: none), when known

    def __post_init__(self):
        n = len(self.c)
        for name in ("col_lb", "col_ub", "integral"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"model: {name} has {len(getattr(self, name))} entries for {n} variables")
        if self.A.shape != (len(self.row_lb), n) or len(self.row_ub) != len(self.row_lb):
            raise ValueError(f"model: A is {self.A.shape}, rows {len(self.row_lb)}, variables {n}")
        if len(self.row_names) != len(self.row_lb):
            raise ValueError("model: one name per row")
        if len(self.extra_names) not in (0, n - self.n_x):
            raise ValueError("model: one name per continuous variable, or none")
        if len(self.col_job) != self.n_x or self.n_x > n:
            raise ValueError("model: col_job must have n_x entries")
        if not np.all(np.isfinite(self.c)):
            raise ValueError("model: objective coefficients must be finite")

    @property
    def n_vars(self) -> int:
        return len(self.c)

    @property
    def n_rows(self) -> int:
        return len(self.row_lb)

    def names(self) -> tuple[str, ...]:
        """Every variable's name: ``x<i>`` for the choices (i in this model), then the
        continuous variables' own names (``y<i>`` where none were given)."""
        extra = self.extra_names or tuple(f"y{i}" for i in range(self.n_vars - self.n_x))
        return tuple(f"x{i}" for i in range(self.n_x)) + extra

    def objective_value(self, v: np.ndarray) -> float:
        return float(self.c @ v + self.offset)

    def violation(self, v: np.ndarray) -> float:
        """Largest violation of any row or bound by ``v`` (0 when feasible)."""
        act = self.A @ v
        worst = 0.0
        if len(act):
            worst = max(worst, float(np.max(np.maximum(self.row_lb - act, 0.0))),
                        float(np.max(np.maximum(act - self.row_ub, 0.0))))
        worst = max(worst, float(np.max(np.maximum(self.col_lb - v, 0.0), initial=0.0)),
                    float(np.max(np.maximum(v - self.col_ub, 0.0), initial=0.0)))
        ints = v[self.integral]
        if len(ints):
            worst = max(worst, float(np.max(np.abs(ints - np.round(ints)))))
        return worst

    def selected(self, v: np.ndarray) -> np.ndarray:
        """Indices of the choice variables set to 1."""
        return np.flatnonzero(v[: self.n_x] > 0.5)


class ModelBuilder:
    """Accumulates objective coefficients, extra variables and rows, then freezes them.

    Objective terms call ``add_x_objective``, ``add_var`` and ``add_rows``; the
    formulation calls ``build``.
    """

    def __init__(self, n_x: int, col_job: np.ndarray, n_jobs: int):
        self.n_x = int(n_x)
        self.col_job = np.asarray(col_job, dtype=np.int64)
        self.n_jobs = int(n_jobs)
        self.c_x = np.zeros(self.n_x)
        self._var_lb: list[float] = []
        self._var_ub: list[float] = []
        self._var_obj: list[float] = []
        self._var_names: list[str] = []
        self._rows_r: list[np.ndarray] = []
        self._rows_c: list[np.ndarray] = []
        self._rows_v: list[np.ndarray] = []
        self._row_lb: list[np.ndarray] = []
        self._row_ub: list[np.ndarray] = []
        self._row_names: list[Sequence[str]] = []      # chunks, one per add_rows
        self._n_rows = 0
        self.offset = 0.0
        self.job_rows: np.ndarray | None = None
        self.capacity_rows: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return self._n_rows

    @property
    def has_extras(self) -> bool:
        """Whether continuous variables were added."""
        return bool(self._var_lb)

    def with_rows(self) -> ModelBuilder:
        """A new builder over the same choice variables with this one's rows (and
        job and capacity row indices), and neither objective nor continuous variables.
        The row arrays are shared: treat them as read-only."""
        b = ModelBuilder(self.n_x, self.col_job, self.n_jobs)
        b._rows_r, b._rows_c, b._rows_v = list(self._rows_r), list(self._rows_c), list(self._rows_v)
        b._row_lb, b._row_ub, b._row_names = list(self._row_lb), list(self._row_ub), list(self._row_names)
        b._n_rows, b.job_rows, b.capacity_rows = self._n_rows, self.job_rows, self.capacity_rows
        return b

    def add_x_objective(self, coeffs: np.ndarray) -> None:
        coeffs = np.asarray(coeffs, dtype=float)
        if coeffs.shape != (self.n_x,):
            raise ValueError(f"objective coefficients: expected {self.n_x}, got {coeffs.shape}")
        if not np.all(np.isfinite(coeffs)):
            raise ValueError("objective coefficients must be finite")
        self.c_x += coeffs

    def add_var(self, lb: float, ub: float, obj: float, name: str) -> int:
        """A continuous variable; returns its index in the model's variable vector."""
        self._var_lb.append(float(lb))
        self._var_ub.append(float(ub))
        self._var_obj.append(float(obj))
        self._var_names.append(name)
        return self.n_x + len(self._var_lb) - 1

    def add_vars(self, lb: np.ndarray, ub: np.ndarray, obj: np.ndarray, prefix: str) -> np.ndarray:
        lb, ub, obj = (np.broadcast_to(np.asarray(a, dtype=float), np.shape(lb)) for a in (lb, ub, obj))
        start = self.n_x + len(self._var_lb)
        self._var_lb.extend(lb.tolist())
        self._var_ub.extend(ub.tolist())
        self._var_obj.extend(obj.tolist())
        self._var_names.extend(f"{prefix}{i}" for i in range(len(lb)))
        return np.arange(start, start + len(lb))

    def add_rows(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                 lb: np.ndarray | float, ub: np.ndarray | float, names: Sequence[str]) -> np.ndarray:
        """Add ``len(names)`` rows given in COO form with row indices local (0..k-1).

        Returns the global indices of the new rows.
        """
        k = len(names)
        lb = np.broadcast_to(np.asarray(lb, dtype=float), (k,)).copy()
        ub = np.broadcast_to(np.asarray(ub, dtype=float), (k,)).copy()
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= k):
            raise ValueError("add_rows: local row index out of range")
        base = self.n_rows
        self._rows_r.append(rows + base)
        self._rows_c.append(np.asarray(cols, dtype=np.int64))
        self._rows_v.append(np.asarray(vals, dtype=float))
        self._row_lb.append(lb)
        self._row_ub.append(ub)
        self._row_names.append(names)
        self._n_rows += k
        return np.arange(base, base + k)

    def build(self, columns: np.ndarray | None = None, fixed: np.ndarray | None = None) -> MilpModel:
        """Freeze the model. ``columns`` (sorted choice-variable indices) restricts it to
        those choice variables: the result's ``c`` and ``A`` are exactly the full model's
        restricted to them (every other choice variable fixed at 0), so a decision over
        the restricted model has the same objective value and row activities in the
        full one. Extra (continuous) variables are kept. ``fixed`` (choice-variable
        indices outside ``columns``) are fixed at 1: their row activities move to the
        row bounds and their objective to the offset."""
        n_extra = len(self._var_lb)
        fixed_act = None
        keep = None
        if columns is not None:
            keep = np.asarray(columns, dtype=np.int64)
            if len(keep) and (np.any(np.diff(keep) <= 0) or keep[0] < 0 or keep[-1] >= self.n_x):
                raise ValueError("build: columns must be sorted, distinct choice-variable indices")
        is_fixed = None
        if fixed is not None and len(fixed):
            fixed = np.asarray(fixed, dtype=np.int64)
            if fixed.min() < 0 or fixed.max() >= self.n_x:
                raise ValueError("build: fixed variables must be choice-variable indices")
            is_fixed = np.zeros(self.n_x + n_extra, dtype=bool)
            is_fixed[fixed] = True
            if columns is None or is_fixed[keep].any():
                raise ValueError("build: fixed variables must lie outside the given columns")
        c, offset = self._objective(keep, fixed)
        n_x = self.n_x if keep is None else len(keep)
        n = n_x + n_extra
        col_lb = np.concatenate([np.zeros(n_x), np.asarray(self._var_lb, dtype=float)])
        col_ub = np.concatenate([np.ones(n_x), np.asarray(self._var_ub, dtype=float)])
        integral = np.concatenate([np.ones(n_x, dtype=bool), np.zeros(n_extra, dtype=bool)])
        m = self.n_rows
        if self._rows_r:
            r = np.concatenate(self._rows_r)
            cc = np.concatenate(self._rows_c)
            v = np.concatenate(self._rows_v)
        else:
            r = cc = np.zeros(0, dtype=np.int64)
            v = np.zeros(0)
        if len(cc) and (cc.min() < 0 or cc.max() >= self.n_x + n_extra):
            raise ValueError("a row refers to a variable that does not exist")
        if is_fixed is not None:
            hit = is_fixed[cc]
            fixed_act = np.bincount(r[hit], weights=v[hit], minlength=self.n_rows)
        if keep is not None:
            new_index = np.full(self.n_x, -1, dtype=np.int64)
            new_index[keep] = np.arange(n_x)
            is_x = cc < self.n_x
            mapped = np.where(is_x, new_index[np.minimum(cc, self.n_x - 1)], cc - self.n_x + n_x)
            ok = mapped >= 0
            r, cc, v = r[ok], mapped[ok], v[ok]
        if len(r) and np.all(r[1:] >= r[:-1]):          # rows already in order (the usual case): CSR directly
            indptr = np.zeros(m + 1, dtype=np.int64)
            np.cumsum(np.bincount(r, minlength=m), out=indptr[1:])
            A = sp.csr_matrix((v, cc, indptr), shape=(m, n))
        else:
            A = sp.csr_matrix((v, (r, cc)), shape=(m, n))
        A.sum_duplicates()
        row_lb = np.concatenate(self._row_lb) if self._row_lb else np.zeros(0)
        row_ub = np.concatenate(self._row_ub) if self._row_ub else np.zeros(0)
        if fixed_act is not None:
            row_lb = row_lb - fixed_act
            row_ub = row_ub - fixed_act
        col_job = self.col_job if keep is None else self.col_job[keep]
        return MilpModel(c=c, col_lb=col_lb, col_ub=col_ub, integral=integral, A=A,
                         row_lb=row_lb, row_ub=row_ub, row_names=RowNames(self._row_names),
                         n_x=n_x, col_job=col_job, n_jobs=self.n_jobs,
                         offset=offset, extra_names=tuple(self._var_names), job_rows=self.job_rows,
                         capacity_rows=self.capacity_rows)

    def build_like(self, like: MilpModel, columns: np.ndarray | None = None,
                   fixed: np.ndarray | None = None) -> MilpModel:
        """``build(columns, fixed)`` when ``like`` was built by ``build(columns, fixed)``
        from equal rows, with the same (checked) ``columns`` and ``fixed`` and no
        continuous variables, as this builder: ``like``'s matrix, bounds and names, this
        builder's objective."""
        if self._var_lb or like.n_vars != like.n_x:
            raise ValueError("build_like: only for models without continuous variables")
        keep = None if columns is None else np.asarray(columns, dtype=np.int64)
        fixed = None if fixed is None or not len(fixed) else np.asarray(fixed, dtype=np.int64)
        c, offset = self._objective(keep, fixed)
        return dataclasses.replace(like, c=c, offset=offset)

    def _objective(self, keep: np.ndarray | None, fixed: np.ndarray | None) -> tuple[np.ndarray, float]:
        """The model's objective coefficients over the kept choice variables and the
        continuous ones, and its offset (with the ``fixed`` columns' coefficients)."""
        offset = self.offset if fixed is None or not len(fixed) else self.offset + float(self.c_x[fixed].sum())
        c_x = self.c_x if keep is None else self.c_x[keep]
        return np.concatenate([c_x, np.asarray(self._var_obj, dtype=float)]), offset
