"""A bounded, concave utility of each job's normalized speedup: Sia's objective
(Jayaram Subramanya et al., SOSP'23) as a term, with a move's price kept over the job's
expected stay and optional per-job weights.

Coefficient of x[j, g] = w_j * (bonus - v(j, g) ** p), with ``p < 0``:

- ``v(j, g)`` the column's speedup over the job's reference allocation (``reference``:
  ``smallest``, its fewest-GPU column, Sia's normalization, or ``requested``), times the
  share of work a move there keeps (below), at least ``1 / max_speedup`` so that
  ``v ** p`` stays finite;
- ``v ** p`` falls from 1 at the reference towards 0 as the speedup grows: the utility
  ``bonus - v ** p`` is concave and bounded by ``bonus``, so that giving a job more
  GPUs pays less and less, and running one more job pays ``bonus - 1`` at least
  (Sia: ``p = -0.5``, ``bonus = lambda_n = 1.1``);
- a running job's move to another column keeps ``1 - downtime / horizon`` of its speedup
  (at least 0), the horizon its age (``move_horizon="age"``: now - arrival, at least one
  round; on heavy-tailed lengths a job's expected remaining time grows with its age),
  one round (``round``), or moves are not priced here (``none``: the ``reconfig`` term
  may price them). Sia's restart factor plays this part in Sia;
- ``preemption`` (off by default): every column of a running job also carries the share
  of its current utility its resume would cost over that horizon, so leaving it out pays it;
- ``w_j``: 1 (``weight="none"``: Sia's objective); by attained service (``attained``),
  ``((A + tau) / (A_j + tau)) ** exponent``, ``A_j`` the GPU-seconds job j has received
  and ``A`` their mean over the round's jobs: knows no job's length; or by remaining work
  (``remaining``), ``(T_median / T_j) ** exponent``, ``T_j`` the job's remaining time at its
  reference throughput: clairvoyant. Clipped to ``[1 / max_factor, max_factor]``.

Not columnwise under ``reference="smallest"`` (the reference reads the job's other
columns), columnwise under ``requested``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .base import register_term
from .jct import median
from .throughput import smallest_speedup

MOVE_HORIZONS = ("age", "round", "none")
WEIGHTS = ("none", "attained", "remaining")


@register_term("utility")
@dataclass(frozen=True)
class BoundedUtility:
    p: float = -0.5
    bonus: float = 1.1
    reference: str = "smallest"
    weight: str = "none"
    exponent: float = 1.0
    tau_gpu_s: float = 3600.0
    max_factor: float = 100.0
    max_speedup: float = 1e4
    move_horizon: str = "age"
    preemption: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.p) and -10.0 <= self.p < 0.0):
            raise ValueError(f"utility.p must be in [-10, 0), got {self.p!r}")
        if not (math.isfinite(self.bonus) and self.bonus >= 0):
            raise ValueError(f"utility.bonus must be a finite number >= 0, got {self.bonus!r}")
        if self.reference not in ("requested", "smallest"):
            raise ValueError(f"utility.reference must be 'requested' or 'smallest', got {self.reference!r}")
        if self.weight not in WEIGHTS:
            raise ValueError(f"utility.weight must be one of {', '.join(WEIGHTS)}, got {self.weight!r}")
        if not (math.isfinite(self.exponent) and 0 <= self.exponent <= 10):
            raise ValueError(f"utility.exponent must be in [0, 10], got {self.exponent!r}")
        if not (math.isfinite(self.tau_gpu_s) and self.tau_gpu_s > 0):
            raise ValueError(f"utility.tau_gpu_s must be > 0, got {self.tau_gpu_s!r}")
        if not (math.isfinite(self.max_factor) and self.max_factor >= 1):
            raise ValueError(f"utility.max_factor must be >= 1, got {self.max_factor!r}")
        if not (math.isfinite(self.max_speedup) and self.max_speedup >= 1):
            raise ValueError(f"utility.max_speedup must be >= 1, got {self.max_speedup!r}")
        if not isinstance(self.preemption, bool):
            raise ValueError("utility.preemption must be true or false")
        if self.move_horizon not in MOVE_HORIZONS:
            raise ValueError(f"utility.move_horizon must be one of {', '.join(MOVE_HORIZONS)}, "
                             f"got {self.move_horizon!r}")

    @property
    def columnwise(self) -> bool:
        return self.reference == "requested"

    def weights(self, data) -> np.ndarray:
        """Per job, its weight (module doc; all 1 for ``weight="none"``)."""
        if self.weight == "none" or self.exponent == 0 or data.n_jobs == 0:
            return np.ones(data.n_jobs)
        if self.weight == "attained":
            att = data.attained_gpu_s if data.attained_gpu_s is not None else np.zeros(data.n_jobs)
            w = ((att.mean() + self.tau_gpu_s) / (att + self.tau_gpu_s)) ** self.exponent
        else:                                   # "remaining": knows each job's remaining work
            t = np.maximum(data.remaining_time_ref_s, 1e-9)
            w = (median(t) / t) ** self.exponent
        return np.clip(w, 1.0 / self.max_factor, self.max_factor)

    def horizon_s(self, data) -> np.ndarray:
        """Per job, how long it is expected to stay where it runs (``move_horizon``)."""
        if self.move_horizon == "age" and data.arrival_s is not None:
            return np.maximum(data.now_s - data.arrival_s, data.round_interval_s)
        return np.full(data.n_jobs, data.round_interval_s)

    def kept_share(self, data) -> np.ndarray:
        """Per column, the share of the job's work a move there keeps: 1 for a job's
        current column and for a queued job's columns; for a running job's other columns
        ``1 - downtime / horizon``, at least 0, the horizon being what the job is expected
        to stay: its age so far (``age``, now - arrival, at least one round: on
        heavy-tailed lengths a job's expected remaining time grows with its age) or one
        round (``round``); ``none``: every column 1."""
        share = np.ones(data.n_cols)
        if self.move_horizon == "none":
            return share
        cur = data.current_col[data.col_job]
        moved = (cur >= 0) & (cur != np.arange(data.n_cols))
        horizon = self.horizon_s(data)[data.col_job]
        share[moved] = np.maximum(0.0, 1.0 - data.col_reconfig_s[moved] / horizon[moved])
        return share

    def apply(self, data, builder, weight: float) -> None:
        if data.n_jobs == 0:
            return
        v = data.speedup if self.reference == "requested" else smallest_speedup(data)
        v = np.asarray(v, dtype=float) * self.kept_share(data)
        v = np.clip(v, 1.0 / self.max_speedup, self.max_speedup)
        w = self.weights(data)
        coef = w[data.col_job] * (self.bonus - v ** self.p)
        if self.preemption and self.move_horizon != "none" and data.resume_s is not None and len(data.resume_s):
            # stopping a running job forfeits the share of its current utility its resume
            # will cost: every column of the job gets it, so leaving it out pays it
            run = data.current_col >= 0
            cur = np.maximum(data.current_col, 0)
            keep = np.zeros(data.n_jobs)
            lost = np.minimum(1.0, data.resume_s / self.horizon_s(data))
            keep[run] = (np.maximum(coef[cur], 0.0) * lost)[run]
            coef = coef + keep[data.col_job]
        builder.add_x_objective(weight * coef)
