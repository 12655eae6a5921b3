"""Which columns of a round the incremental search may choose (its neighbourhood).

Vectorized over the round's columns (``RoundData``):

- a **running** job: its current column and its neighbours on the same GPU type with
  twice or half the GPUs (any node shape), the same GPU count in another node shape,
  and on another GPU type, in its most compact node shape (as many GPUs per node as the
  type's nodes allow: fewest nodes), the same GPU count (``other_type="same"``) or any
  count (``other_type="any"``: a move to a free type at the size it runs best on);
- a **queued** job: every column (``queued="all"``), or only those with at most its
  reference GPU count (the count it asked for, else its smallest; ``queued="small"``).

A different pipeline depth on the same shape is not a separate column: the round data
keeps one column per (job, GPU type, nodes, GPUs per node), the planner's best depth
(for a running job, its current depth on its current shape), so the full MILP does not
see it either; a depth change comes with a shape change.
"""
from __future__ import annotations

import numpy as np

from ..formulation.round_data import RoundData

QUEUED_CHOICES = ("all", "small")
OTHER_TYPE_CHOICES = ("same", "any")


def candidate_columns(data: RoundData, queued: str = "all", other_type: str = "same") -> np.ndarray:
    """Sorted column indices of ``data`` that the incremental search considers."""
    if queued not in QUEUED_CHOICES:
        raise ValueError(f"queued must be one of {QUEUED_CHOICES}, got {queued!r}")
    if other_type not in OTHER_TYPE_CHOICES:
        raise ValueError(f"other_type must be one of {OTHER_TYPE_CHOICES}, got {other_type!r}")
    if data.n_cols == 0:
        return np.zeros(0, dtype=np.int64)
    g = data.col_gpus
    if queued == "all":
        ref_g = np.zeros(0, dtype=np.int64)
    else:
        min_g = np.full(data.n_jobs, np.iinfo(np.int64).max)
        np.minimum.at(min_g, data.col_job, g)
        ref_g = np.where(data.requested_gpus > 0, np.maximum(data.requested_gpus, min_g), min_g).astype(np.int64)
    from .kernel import neighbour_columns  # compiled: one pass over the round's columns
    out = np.empty(data.n_cols, dtype=np.int64)
    col_job, current, gpus, col_type, gpn, max_gpn = (
        np.asarray(a, dtype=np.int64) for a in (data.col_job, data.current_col, g, data.col_type, data.col_gpn,
                                                data.capacity.max_gpus_per_node))
    n = neighbour_columns(col_job, current, gpus, col_type, gpn, max_gpn, other_type == "any", queued == "all",
                          ref_g, out)
    return out[:n].copy()
