"""A plan: the parallel layout inside a grid (``Plan``), or a goodput job's batch
(``BatchPlan``, the Sia artifact's adaptive-batch jobs, instances/goodput.py). A value the
estimators choose, the engine decides with and the launcher runs, so it lives below all
three. ``JobPlan`` is either: what a decision carries per job and an executor is given."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Full parallel layout inside a grid.

    ``stage_layers[i]`` is the number of consecutive model layers (``ModelArch.layers()``)
    on stage i; every stage runs ``dp`` x ``tp`` ranks (uniform stage shapes).
    """
    pp: int
    dp: int
    tp: int
    stage_layers: tuple[int, ...]
    microbatches: int = 1
    schedule: str = "1f1b"          # "gpipe" or "1f1b"
    ep: int = 0                     # MoE expert-parallel degree (divides dp); 0 = automatic (inside a node)

    def __post_init__(self):
        if min(self.pp, self.dp, self.tp, self.microbatches) < 1:
            raise ValueError(f"plan degrees must be >= 1: {self}")
        if len(self.stage_layers) != self.pp or min(self.stage_layers) < 1:
            raise ValueError(f"plan needs {self.pp} non-empty stages: {self}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}")
        if self.ep < 0 or (self.ep and self.dp % self.ep):
            raise ValueError(f"expert-parallel degree must divide dp (0 = automatic): {self}")

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.tp


@dataclass(frozen=True)
class BatchPlan:
    """A goodput job's batch for an allocation: ``fixed`` (the global batch, kept), or
    adaptive within [``low``, ``high``] (None: the application's own limits)."""
    fixed: int | None = None
    low: int | None = None
    high: int | None = None

    def __post_init__(self):
        for f in ("fixed", "low", "high"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"BatchPlan.{f} must be a positive integer or None, got {v!r}")
        if self.fixed is not None and (self.low is not None or self.high is not None):
            raise ValueError("BatchPlan: give a fixed batch or a range, not both")


JobPlan = Plan | BatchPlan
