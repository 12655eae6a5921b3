"""Round data + objective -> MILP arrays.

Rows:
- one per job: sum_g x[j, g] <= 1 (== 1 for jobs pinned by config);
- node shape, per GPU type t and level l in {1, 2, 4, ..., node size}, on the GPUs the
  running jobs hold where they are (``RoundData.held``): sum over t's columns with
  m >= l GPUs per node of (n_nodes * m / l) * x, plus for each running job of type t
  its current column times the l-blocks its GPUs give back when it leaves (``gain``)
  <= the l-blocks on the GPUs no running job holds plus every such gain. A job that
  stays keeps its GPUs; one that moves, shrinks, grows or stops gives its blocks back
  (counted low, never high, when several leave one node). Level 1 is the plain capacity
  row. For power-of-two shapes these rows are exactly the condition for packing every
  chosen single-node chunk into the GPUs left, largest first, except that a multi-node
  job's chunks must also sit on distinct nodes: the round's placement asks the policy
  to decide again without a column it cannot map (``Decisions.refine``). Without
  ``held`` (synthetic rounds), the rows count the whole capacity as free;
- optionally (``max_moves``, the stability rule's cluster-wide budget): the columns of
  running jobs other than their current one, summed, <= max_moves — at most that many
  running jobs move (a preemption is not a column, so it is not counted here);
- whatever the objective terms add.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..same_inputs import kept, same
from .model import MilpModel, ModelBuilder, Prefixed
from .round_data import RoundData

if TYPE_CHECKING:
    from ..objectives.base import Objective


def add_job_rows(data: RoundData, builder: ModelBuilder, pinned: frozenset[str] = frozenset(),
                 columns: np.ndarray | None = None) -> None:
    """One row per job; ``columns`` (optional) limits the entries written to those columns."""
    lb = np.array([1.0 if jid in pinned else 0.0 for jid in data.job_ids]) if pinned else np.zeros(data.n_jobs)
    cols = np.arange(data.n_cols) if columns is None else np.asarray(columns, dtype=np.int64)
    builder.job_rows = builder.add_rows(data.col_job[cols], cols, np.ones(len(cols)), lb, 1.0,
                                        Prefixed("job_", data.job_ids))


def add_shape_rows(data: RoundData, builder: ModelBuilder, columns: np.ndarray | None = None) -> None:
    """The node-shape rows; ``columns`` (optional) limits the entries written to those
    columns. Each type's level-1 row (its plain capacity) is recorded in
    ``builder.capacity_rows``."""
    cap = data.capacity
    rows, cols, vals, ub, names = [], [], [], [], []
    level1 = np.full(len(cap.types), -1, dtype=np.int64)
    r = 0
    sub = columns is not None
    at = np.asarray(columns, dtype=np.int64) if sub else None
    col_type = data.col_type[at] if sub else data.col_type
    col_gpn = data.col_gpn[at] if sub else data.col_gpn
    gpus = np.asarray(data.col_gpus[at] if sub else data.col_gpus, dtype=float)
    at_least = {lvl: col_gpn >= lvl for lvl in sorted(set().union(*cap.levels)) if lvl > 1}
    held = data.held
    stay = np.zeros(len(col_type), dtype=bool)
    if held is not None:
        col_index = at if at is not None else np.arange(data.n_cols)
        owner = data.col_job[col_index]
        stay = (data.current_col[owner] == col_index) & (held.job_type[owner] >= 0)
        stay_job = owner[stay]
        stay_type = held.job_type[stay_job]
    for ti, t in enumerate(cap.types):
        of_type = col_type == ti
        for li, lvl in enumerate(cap.levels[ti]):
            idx = np.flatnonzero((of_type & at_least[lvl] if lvl > 1 else of_type) & ~stay)
            cols.append(at[idx] if at is not None else idx)
            rows.append(np.full(len(idx), r))
            vals.append(gpus[idx] / lvl)
            if held is None:
                ub.append(cap.blocks[ti][li])
            else:
                # the running jobs of this type: each gives back its gain when it leaves
                mine = held.job_type == ti
                ub.append(held.free_blocks[ti][li] + int(held.gain[mine, li].sum()))
                on = np.flatnonzero(stay)[stay_type == ti]
                g = held.gain[stay_job[stay_type == ti], li].astype(float)
                cols.append(at[on] if at is not None else on)
                rows.append(np.full(len(on), r))
                vals.append(g)
            names.append(f"cap_{t}_l{lvl}")
            if lvl == 1:
                level1[ti] = r
            r += 1
    base = builder.n_rows
    builder.add_rows(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), -np.inf,
                     np.array(ub, dtype=float), names)
    builder.capacity_rows = np.where(level1 >= 0, level1 + base, -1)


def add_move_budget_row(data: RoundData, builder: ModelBuilder, max_moves: int,
                        columns: np.ndarray | None = None) -> None:
    """At most ``max_moves`` running jobs take a column other than their current one.
    Non-negative coefficients and an upper bound: the Lagrangian path still applies."""
    base = np.arange(data.n_cols) if columns is None else np.asarray(columns, dtype=np.int64)
    cur = data.current_col[data.col_job[base]]
    sel = base[(cur >= 0) & (cur != base)]
    builder.add_rows(np.zeros(len(sel), dtype=np.int64), sel, np.ones(len(sel)), -np.inf,
                     np.array([float(max_moves)]), ["move_budget"])


class RowsMemo:
    """The last round's rows before the objective terms (job rows, node-shape rows, the
    move budget row) and, when the terms added neither rows nor variables, its model:
    ``build_model`` takes them as they are when the next round's inputs to them — the
    capacity, the jobs and their columns' types and shapes, pinned jobs, the restricted
    and fixed columns, the move budget — are equal element for element (most rounds:
    only the objective changed). Kept by a policy, like ``RoundDataCache``."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.rows: ModelBuilder | None = None       # a builder holding only the rows
        self.model: MilpModel | None = None         # built from them with no term's rows or variables

    def builder(self, key: tuple) -> ModelBuilder | None:
        """A builder with the remembered rows when ``key`` is the remembered one."""
        if self.rows is None or not same(self.key, key):
            return None
        return self.rows.with_rows()

    def remember(self, key: tuple, rows: ModelBuilder) -> None:
        self.key, self.rows, self.model = kept(key), rows.with_rows(), None


def _rows_key(data: RoundData, pinned: frozenset[str], columns, fixed, max_moves) -> tuple:
    """What the rows before the objective terms are computed from (``RowsMemo``)."""
    held = data.held.key() if data.held is not None else (None, None, None)
    return (data.capacity, data.job_ids, pinned, max_moves, data.col_job, data.col_type, data.col_nodes,
            data.col_gpn, columns, fixed, data.current_col, *held)


def build_model(data: RoundData, objective: Objective, pinned: frozenset[str] = frozenset(),
                columns: np.ndarray | None = None, fixed: np.ndarray | None = None,
                max_moves: int | None = None, memo: RowsMemo | None = None) -> MilpModel:
    """The round's MILP: job rows, node-shape rows, then ``objective.apply``. With
    ``columns`` (sorted column indices of ``data``), the same model restricted to those
    columns: identical coefficients and rows, the other columns fixed at 0 (what the
    incremental search optimizes over; ``ModelBuilder.build``); ``fixed`` columns (outside
    ``columns``) are fixed at 1 — the stability rule's frozen jobs — their capacity taken
    from the rows and their value added to the offset, so the model keeps the form the
    fast Lagrangian path needs (no lower bounds on job rows). ``max_moves``: the move
    budget row (see the module doc). ``memo``: the last round's rows, taken as they are
    when their inputs are equal (``RowsMemo``; the model is the same either way)."""
    unknown = set(pinned) - set(data.job_ids) if pinned else set()      # (4,000 ids: 0.1 ms a round)
    known = frozenset(pinned) - unknown
    written = columns
    if fixed is not None and columns is not None:        # sorted, distinct: a mask is faster than union1d
        if len(fixed) and (np.min(fixed) < 0 or np.max(fixed) >= data.n_cols):
            raise ValueError("build: fixed variables must be choice-variable indices")
        mark = np.zeros(data.n_cols, dtype=bool)
        mark[columns] = True
        mark[fixed] = True
        written = np.flatnonzero(mark)
    key = _rows_key(data, known, columns, fixed, max_moves)
    builder = None if memo is None else memo.builder(key)
    if builder is None:
        builder = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
        add_job_rows(data, builder, known, written)
        add_shape_rows(data, builder, written)
        if max_moves is not None:
            add_move_budget_row(data, builder, max_moves, written)
        if memo is not None:
            memo.remember(key, builder)
    rows = builder.n_rows
    objective.apply(data, builder)
    if memo is None or builder.n_rows != rows or builder.has_extras:
        return builder.build(columns, fixed)
    if memo.model is None:
        memo.model = builder.build(columns, fixed)
        return memo.model
    return builder.build_like(memo.model, columns, fixed)


def hint_from_columns(model: MilpModel, cols) -> np.ndarray:
    """A 0/1 vector over the choice variables from selected column indices."""
    h = np.zeros(model.n_x)
    cols = np.asarray([c for c in cols if 0 <= c < model.n_x], dtype=np.int64)
    h[cols] = 1.0
    return h
