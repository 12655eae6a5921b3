"""The ``group`` correction of the learned model: the median log error of similar rows.

A regressor with scikit-learn's ``fit(X, y)`` / ``predict(X)`` over the learned model's
feature rows (``learned.FEATURES``), for the target ``log(measured / analytic)``. A row's
correction is the median target of the training rows that share its most specific group
with at least ``min_rows`` rows, the groups tried from the most to the least specific
(``LEVELS``):

1. family, GPU type, node shape (nodes x GPUs per node);
2. family, GPU type, GPU count;
3. family, GPU count;
4. GPU type, node shape;
5. family;

and 0 (the analytic estimate unchanged) when none has enough rows. The median is shrunk
toward 0 by ``n / (n + shrink)`` for a group of ``n`` rows, so a group of two counts half.
``TYPE_LEVELS`` (family and GPU type only) is the ``type_level`` correction: one factor
per family on each GPU type, the same for every shape, batch and model of the family
there, so it ranks the shapes of one GPU type exactly as the analytic model does and
corrects only the level between types (``learned-level``, docs/estimators.md "Grid
choice").
A GPU type is known to the features by its catalog specs (peak FLOP/s, memory and link
bandwidths, memory size, PCIe flag): two types with the same specs share a group.

Why: the analytic model's remaining error is systematic per GPU type and shape, and per
family (docs/estimators.md, "the scale oracle"); a group median carries that over to a
model the training rows do not contain, where boosted trees over 30 features pick up
per-row noise. It is one of ``learned.AUTO_CANDIDATES``, chosen (or not) by the same
nested cross-validation as the others.
"""
from __future__ import annotations

import numpy as np

_GPU = ("log_peak_flops", "log_mem_bw", "log_intra_bw", "log_inter_bw", "gpu_mem_gib", "pcie")
_SHAPE = ("num_nodes", "gpus_per_node")
LEVELS: tuple[tuple[str, ...], ...] = (
    ("family",) + _GPU + _SHAPE,
    ("family",) + _GPU + ("num_gpus",),
    ("family", "num_gpus"),
    _GPU + _SHAPE,
    ("family",),
)
TYPE_LEVELS: tuple[tuple[str, ...], ...] = (("family",) + _GPU,)
MIN_ROWS = 2
SHRINK = 2.0


class GroupMedianCorrection:
    """See the module doc. ``features``: the names of ``X``'s columns (``learned.FEATURES``;
    the family is its ``fam_*`` one-hot columns)."""

    def __init__(self, features: tuple[str, ...], *, levels: tuple[tuple[str, ...], ...] = LEVELS,
                 min_rows: int = MIN_ROWS, shrink: float = SHRINK):
        if not isinstance(min_rows, int) or min_rows < 1:
            raise ValueError(f"min_rows must be a positive integer, got {min_rows!r}")
        if not shrink >= 0:
            raise ValueError(f"shrink must be >= 0, got {shrink!r}")
        index = {f: i for i, f in enumerate(features)}
        fam = [i for f, i in index.items() if f.startswith("fam_")]
        if not levels or not all(levels):
            raise ValueError("group correction: levels must be a non-empty list of non-empty groups")
        missing = {f for level in levels for f in level if f != "family"} - set(index)
        if missing or not fam:
            raise ValueError(f"group correction: features lack {sorted(missing) or 'a family'}")
        self.levels = tuple(tuple(level) for level in levels)
        self._cols = [[c for f in level for c in (fam if f == "family" else [index[f]])] for level in self.levels]
        self.min_rows, self.shrink = min_rows, float(shrink)
        self.tables: list[dict[tuple, float]] = []

    def _key(self, row: np.ndarray, level: int) -> tuple:
        return tuple(np.round(row[self._cols[level]], 9).tolist())

    def fit(self, X, y) -> "GroupMedianCorrection":
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        self.tables = []
        for level in range(len(self.levels)):
            groups: dict[tuple, list[float]] = {}
            for row, t in zip(X, y):
                groups.setdefault(self._key(row, level), []).append(float(t))
            self.tables.append({k: float(np.median(v)) * len(v) / (len(v) + self.shrink)
                                for k, v in groups.items() if len(v) >= self.min_rows})
        return self

    def predict(self, X) -> np.ndarray:
        if not self.tables:
            raise ValueError("group correction: fit it first")
        out = np.zeros(len(X))
        for i, row in enumerate(np.asarray(X, dtype=float)):
            for level, table in enumerate(self.tables):
                v = table.get(self._key(row, level))
                if v is not None:
                    out[i] = v
                    break
        return out
