"""Resource shapes and grids: the shared vocabulary of estimators and engine.

A ``Shape`` is a set of GPUs of one type: ``num_nodes`` nodes with ``gpus_per_node``
GPUs each. A ``Grid`` is a shape plus a pipeline depth: one shard of the joint
scheduling x parallelism space (the planner searches only inside it).
"""
from __future__ import annotations

from dataclasses import dataclass

from .gpus import canonical_gpu_name


@dataclass(frozen=True, order=True)
class Shape:
    gpu_type: str          # canonical catalog name (aliases such as "a100" are resolved)
    num_nodes: int
    gpus_per_node: int

    def __post_init__(self):
        object.__setattr__(self, "gpu_type", canonical_gpu_name(self.gpu_type))
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"shape needs at least one node and one GPU per node, got {self}")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True, order=True)
class Grid:
    shape: Shape
    pp: int = 1            # pipeline stages

    def __post_init__(self):
        if self.pp < 1 or self.shape.num_gpus % self.pp:
            raise ValueError(f"pipeline depth {self.pp} must divide the grid's {self.shape.num_gpus} GPUs")

    @property
    def gpu_type(self) -> str:
        return self.shape.gpu_type

    @property
    def num_gpus(self) -> int:
        return self.shape.num_gpus

    def __str__(self) -> str:
        s = self.shape
        return f"{s.gpu_type}:{s.num_nodes}x{s.gpus_per_node}:pp{self.pp}"
