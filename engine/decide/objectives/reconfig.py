"""Reconfiguration penalty: work lost while a moved job is down.

For a running job and a column other than its current grid, the coefficient is
-speedup(j, g) * min(1, cost_s / round_interval_s): the fraction of this round's
(normalized) work lost to the downtime priced by the simulator's ReconfigCostModel
(``RoundData.col_reconfig_s``). With ``horizon_rounds`` > 1 the loss is amortized
over that many rounds of expected residence (a move that pays off later is allowed).

``per_move`` adds a fixed cost per move of a running job, in rounds of the job's
reference throughput: a damping knob (estimates are not truth, so a move that looks
marginally better often is not); 0 turns it off.

``preemption`` (default True) charges stopping a running job the resume it will cost
later (``RoundData.resume_s``, priced by the same cost model: under ``realistic`` a
resume reads the state back from storage): every column of a running job gets that
loss as a bonus, so not scheduling it (a preemption) is what pays it.

``hysteresis`` (default 0.05) charges a move of a running job that fraction of its
current column's normalized throughput: a move must beat staying by that margin (part of
the stability rule every optimizing policy applies, engine/decide/stability.py); 0 turns it off.

``give_way`` (default 0: off) judges a move that makes a running job slower (it gives
up GPUs so that others can start or grow) for the whole cluster: it charges that
multiple of the job's loss in normalized throughput once more, so the others' gain must
beat the job's loss by that margin, not merely match it — a job shrunk now tends to be
grown back later, a second move the round cannot see.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import register_term


@register_term("reconfig")
@dataclass(frozen=True)
class ReconfigPenalty:
    horizon_rounds: float = 1.0
    per_move: float = 0.0
    hysteresis: float = 0.05
    give_way: float = 0.0
    preemption: bool = True
    columnwise: ClassVar[bool] = True     # a running job's current column is always kept

    def __post_init__(self):
        if not self.horizon_rounds > 0:
            raise ValueError("reconfig.horizon_rounds must be > 0")
        if not self.per_move >= 0:
            raise ValueError("reconfig.per_move must be >= 0")
        if not 0 <= self.hysteresis < 1:
            raise ValueError("reconfig.hysteresis must be in [0, 1)")
        if not (math.isfinite(self.give_way) and self.give_way >= 0):
            raise ValueError("reconfig.give_way must be a finite number >= 0")
        if not isinstance(self.preemption, bool):
            raise ValueError("reconfig.preemption must be true or false")

    def apply(self, data, builder, weight: float) -> None:
        lost = np.minimum(1.0, data.col_reconfig_s / (data.round_interval_s * self.horizon_rounds))
        coef = data.speedup * lost
        if self.per_move > 0 or self.hysteresis > 0 or self.give_way > 0:
            cur = data.current_col[data.col_job]
            moved = (cur >= 0) & (cur != np.arange(data.n_cols))
            coef = coef + self.per_move * moved
            now = data.speedup[np.maximum(cur, 0)]
            if self.hysteresis > 0:
                coef = coef + self.hysteresis * moved * now
            if self.give_way > 0:
                coef = coef + self.give_way * moved * np.maximum(0.0, now - data.speedup)
        if self.preemption and data.resume_s is not None and len(data.resume_s):
            cur = data.current_col
            run = cur >= 0
            stop_loss = np.zeros(data.n_jobs)
            stop_loss[run] = (data.speedup[cur[run]]
                              * np.minimum(1.0, data.resume_s[run] / (data.round_interval_s * self.horizon_rounds)))
            coef = coef - stop_loss[data.col_job]          # subtracted from the penalty: a bonus to keep running
        builder.add_x_objective(-weight * coef)
