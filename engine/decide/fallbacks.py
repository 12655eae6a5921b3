"""An optimizing policy's fallbacks (``Decisions.fallbacks``): for a job whose chosen
grid the round's placement cannot map to GPUs (engine/core/round_placement.py), its best
smaller column of the round (``RoundData``), ranked by the policy's own column values."""
from __future__ import annotations

import numpy as np

from instances.grid import Grid
from instances.plan import JobPlan

from .formulation.round_data import RoundData


class RankedColumns:
    """``smaller(job, than)``: among the job's columns with fewer GPUs than ``than``
    and a finite value in ``col_value`` (-inf: not an alternative, e.g. a column outside
    a restricted model), the one of highest value (ties: the first column)."""

    def __init__(self, data: RoundData, col_value: np.ndarray):
        self._data, self._value = data, col_value
        self._row = {jid: j for j, jid in enumerate(data.job_ids)}

    def smaller(self, job_id: str, than: Grid) -> tuple[Grid, JobPlan | None] | None:
        data, c = self._data, self._value
        j = self._row[job_id]
        lo, hi = np.searchsorted(data.col_job, [j, j + 1])
        alts = [a for a in range(lo, hi) if data.col_gpus[a] < than.num_gpus and c[a] > -np.inf]
        if not alts:
            return None
        best = max(alts, key=lambda a: c[a])
        grid = data.grids[best]
        assert grid is not None, "a column of a real round has a grid"
        return grid, data.plans[best]
