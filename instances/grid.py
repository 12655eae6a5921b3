"""Resource shapes and grids: the shared vocabulary of estimators and engine.

A ``Shape`` is a set of GPUs of one type: ``num_nodes`` nodes with ``gpus_per_node``
GPUs each. A ``Grid`` is a shape plus a pipeline depth: one shard of the joint
scheduling x parallelism space (the planner searches only inside it).
"""
from __future__ import annotations

from dataclasses import dataclass

from .gpus import canonical_gpu_name


def pow2_upto(x: int) -> list[int]:
    """1, 2, 4, ... up to ``x`` (empty when ``x`` < 1)."""
    out, v = [], 1
    while v <= x:
        out.append(v)
        v *= 2
    return out


def _keep_hash(obj, fields: tuple) -> int:
    """Shapes and grids hash their fields once (they key every estimate memo, and the
    dataclass hash rebuilds the field tuples on every lookup)."""
    h = hash(fields)
    object.__setattr__(obj, "_hash", h)
    return h


def _state(obj) -> dict:
    """Pickled state without the cached hash (string hashes differ between processes)."""
    return {k: v for k, v in obj.__dict__.items() if k != "_hash"}


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

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        return h if h is not None else _keep_hash(self, (self.gpu_type, self.num_nodes, self.gpus_per_node))

    def __getstate__(self):
        return _state(self)


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

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        return h if h is not None else _keep_hash(self, (self.shape, self.pp))

    def __getstate__(self):
        return _state(self)

    def __str__(self) -> str:
        s = self.shape
        return f"{s.gpu_type}:{s.num_nodes}x{s.gpus_per_node}:pp{self.pp}"
