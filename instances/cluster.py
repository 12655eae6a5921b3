"""Cluster specs: node groups of one GPU type each, and the network between them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .gpus import canonical_gpu_name, get_gpu

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NodeGroup:
    gpu_type: str                       # canonical catalog name
    num_nodes: int
    gpus_per_node: int
    nodes_per_switch: int | None = None # None: one switch for the whole group
    inter_node_bw_bytes_per_s: float | None = None  # None: the GPU catalog's typical figure

    def __post_init__(self):
        object.__setattr__(self, "gpu_type", canonical_gpu_name(self.gpu_type))
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"node group {self.gpu_type}: num_nodes and gpus_per_node must be >= 1")
        if self.nodes_per_switch is not None and self.nodes_per_switch < 1:
            raise ValueError(f"node group {self.gpu_type}: nodes_per_switch must be >= 1")

    @property
    def inter_bw_bytes_per_s(self) -> float:
        return self.inter_node_bw_bytes_per_s or get_gpu(self.gpu_type).inter_node_bw_bytes_per_s


@dataclass(frozen=True)
class Node:
    node_id: int
    gpu_type: str
    num_gpus: int
    switch_id: int          # globally unique switch index
    group_index: int


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[NodeGroup, ...]
    name: str = "cluster"

    def __post_init__(self):
        if not self.groups:
            raise ValueError("a cluster needs at least one node group")

    def nodes(self) -> tuple[Node, ...]:
        out, nid, sw = [], 0, 0
        for gi, g in enumerate(self.groups):
            per = g.nodes_per_switch or g.num_nodes
            for i in range(g.num_nodes):
                out.append(Node(nid, g.gpu_type, g.gpus_per_node, sw + i // per, gi))
                nid += 1
            sw += -(-g.num_nodes // per)
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        return sum(g.num_nodes * g.gpus_per_node for g in self.groups)

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.gpu_type] = out.get(g.gpu_type, 0) + g.num_nodes * g.gpus_per_node
        return out

    def max_gpus_per_node(self, gpu_type: str) -> int:
        return max((g.gpus_per_node for g in self.groups if g.gpu_type == gpu_type), default=0)

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "name": self.name,
                "node_groups": [{k: v for k, v in vars(g).items() if v is not None} for g in self.groups]}


# Arena's simulated clusters give only a node count per type; GPUs per node are fixed by type.
ARENA_GPUS_PER_NODE = {"a100": 4, "v100": 16, "a40": 2, "a10": 2}


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load our cluster JSON or Arena's ``sim_cluster_spec.json`` (detected from content)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError("cluster file not found", file=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e.msg}", file=str(path), line=e.lineno) from None
    if isinstance(raw, list) and raw and isinstance(raw[0], dict) and "node_groups" not in raw[0]:
        return _from_arena(raw[0], path)
    if isinstance(raw, dict) and "node_groups" in raw:
        return _from_ours(raw, path)
    raise InputError("neither our cluster format (an object with 'node_groups') nor Arena's "
                     "(a list holding {gpu_type: {node_num}})", file=str(path))


def _from_ours(raw: dict, path: Path) -> ClusterSpec:
    ver = raw.get("schema_version", SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        raise InputError(f"unsupported schema_version {ver}", file=str(path), field="schema_version")
    groups = []
    for i, g in enumerate(raw["node_groups"]):
        where = f"node_groups[{i}]"
        if not isinstance(g, dict):
            raise InputError("must be an object", file=str(path), field=where)
        for f in ("gpu_type", "num_nodes", "gpus_per_node"):
            if f not in g:
                raise InputError("missing", file=str(path), field=f"{where}.{f}")
        for f in ("num_nodes", "gpus_per_node", "nodes_per_switch"):
            if f in g and (not isinstance(g[f], int) or isinstance(g[f], bool) or g[f] < 1):
                raise InputError(f"must be a positive integer, got {g[f]!r}", file=str(path), field=f"{where}.{f}")
        try:
            groups.append(NodeGroup(g["gpu_type"], g["num_nodes"], g["gpus_per_node"],
                                    g.get("nodes_per_switch"), g.get("inter_node_bw_bytes_per_s")))
        except InputError as e:
            raise InputError(e.reason, file=str(path), field=f"{where}.gpu_type") from None
    return ClusterSpec(tuple(groups), raw.get("name", path.stem))


def _from_arena(raw: dict, path: Path) -> ClusterSpec:
    groups = []
    for t, v in raw.items():
        if not isinstance(v, dict) or not isinstance(v.get("node_num"), int) or v["node_num"] < 0:
            raise InputError("expected {'node_num': non-negative integer}", file=str(path), field=t)
        if t.lower() not in ARENA_GPUS_PER_NODE:
            raise InputError(f"unknown GPU type {t!r} in Arena cluster spec", file=str(path), field=t)
        if v["node_num"]:
            groups.append(NodeGroup(t, v["node_num"], ARENA_GPUS_PER_NODE[t.lower()]))
    return ClusterSpec(tuple(groups), path.stem)
