"""A plan: the parallel layout inside a grid (``Plan``). A value the estimators choose,
the engine decides with and the launcher runs, so it lives below all three."""
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
