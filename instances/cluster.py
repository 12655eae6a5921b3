"""Cluster specs: node groups of one GPU type each, and the network between them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .errors import InputError
from .gpus import canonical_gpu_name, get_gpu
from .grid import Shape, pow2_upto
from .paths import check_regular_file
from .structured import loads_json

SCHEMA_VERSION = 1

# The most GPUs a cluster may have in all. The engine keeps state per GPU (and walks it every
# round), so a typo such as "num_nodes": 100000000 would run for minutes before any error; the
# project measures clusters of up to 10,240 GPUs, and this leaves a hundredfold margin.
MAX_CLUSTER_GPUS = 1 << 20              # 1,048,576


@dataclass(frozen=True)
class NodeGroup:
    gpu_type: str                       # canonical catalog name
    num_nodes: int
    gpus_per_node: int
    nodes_per_switch: int | None = None # None: one switch for the whole group
    inter_node_bw_bytes_per_s: float | None = None  # None: the GPU catalog's typical figure
    hosts: tuple[str, ...] | None = None  # the live service: host name of each node (None: simulation)

    def __post_init__(self):
        object.__setattr__(self, "gpu_type", canonical_gpu_name(self.gpu_type))
        if self.hosts is not None:
            hosts = tuple(self.hosts)
            if len(hosts) != self.num_nodes or not all(isinstance(h, str) and h.strip() for h in hosts):
                raise InputError(f"node group {self.gpu_type}: hosts must list one host name per node "
                                 f"({self.num_nodes}), got {list(hosts)!r}", field="hosts")
            object.__setattr__(self, "hosts", hosts)
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise InputError(f"node group {self.gpu_type}: num_nodes and gpus_per_node must be >= 1",
                             field="num_nodes")
        if self.nodes_per_switch is not None and self.nodes_per_switch < 1:
            raise InputError(f"node group {self.gpu_type}: nodes_per_switch must be >= 1", field="nodes_per_switch")
        bw = self.inter_node_bw_bytes_per_s
        if bw is not None and not (isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0):
            raise InputError(f"node group {self.gpu_type}: must be a finite number > 0, got {bw!r}",
                             field="inter_node_bw_bytes_per_s")

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
    host: str | None = None # the live service's host for this node


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[NodeGroup, ...]
    name: str = "cluster"

    def __post_init__(self):
        if not self.groups:
            raise InputError("a cluster needs at least one node group", field="node_groups")

    # derived tables, built once per spec on first use (a spec is immutable); left out of
    # equality, hashing and pickles
    _CACHES = ("_nodes", "_node_of_host", "_num_gpus", "_gpus_by_type", "_sizes", "_hash")

    def __hash__(self) -> int:                  # a spec keys caches every round: hashed once
        return self._cached("_hash", lambda: hash((self.groups, self.name)))

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHES}

    def _cached(self, key: str, build):
        v = self.__dict__.get(key)
        if v is None:
            v = build()
            object.__setattr__(self, key, v)
        return v

    def nodes(self) -> tuple[Node, ...]:
        """Every node, in group order (``node_id`` 0, 1, ...); linear in the nodes, built once."""
        return self._cached("_nodes", self._build_nodes)

    def _build_nodes(self) -> tuple[Node, ...]:
        out, nid, sw = [], 0, 0
        for gi, g in enumerate(self.groups):
            per = g.nodes_per_switch or g.num_nodes
            hosts = g.hosts
            for i in range(g.num_nodes):
                out.append(Node(nid, g.gpu_type, g.gpus_per_node, sw + i // per, gi,
                                None if hosts is None else hosts[i]))
                nid += 1
            sw += -(-g.num_nodes // per)
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        return self._cached("_num_gpus", lambda: sum(g.num_nodes * g.gpus_per_node for g in self.groups))

    def _hosts(self) -> dict[str, list[int]]:
        """Host name -> the ids of the nodes it names (built once: looking a name up is O(1))."""
        def build():
            out: dict[str, list[int]] = {}
            for n in self.nodes():
                if n.host is not None:
                    out.setdefault(n.host, []).append(n.node_id)
            return out
        return self._cached("_node_of_host", build)

    def node_id(self, name: str | int, *, field: str = "node") -> int:
        """A node named by its id (0-based, in group order, as ``nodes()`` lists them) or
        by its host name; an ``InputError`` naming ``field`` otherwise."""
        nodes = self.nodes()
        if isinstance(name, int) and not isinstance(name, bool):
            key: str | int = name
        elif isinstance(name, str) and name.strip().isascii() and name.strip().isdigit():
            key = int(name.strip()) if len(name.strip()) <= 18 else -1     # (no cluster has 10**18 nodes)
        else:
            key = str(name).strip()
            hit = self._hosts().get(key, [])
            if len(hit) == 1:
                return hit[0]
            if hit:
                raise InputError(f"host {key!r} names nodes {hit} of cluster {self.name!r}: give a node id",
                                 field=field)
        if isinstance(key, int) and 0 <= key < len(nodes):
            return key
        hosts = list(self._hosts())
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:80] + "..."
        raise InputError(f"no node {shown} in cluster {self.name!r}: give a node id 0-{len(nodes) - 1}"
                         + (f" or a host name ({', '.join(hosts[:6])}{', ...' if len(hosts) > 6 else ''})"
                            if hosts else ""), field=field)

    def gpus_by_type(self) -> dict[str, int]:
        """GPUs per type (a fresh dict)."""
        def build():
            out: dict[str, int] = {}
            for g in self.groups:
                out[g.gpu_type] = out.get(g.gpu_type, 0) + g.num_nodes * g.gpus_per_node
            return out
        return dict(self._cached("_gpus_by_type", build))

    def _node_sizes(self) -> dict[str, dict[int, int]]:
        """Per GPU type, nodes per GPUs-per-node (built once)."""
        def build():
            out: dict[str, dict[int, int]] = {}
            for g in self.groups:
                d = out.setdefault(g.gpu_type, {})
                d[g.gpus_per_node] = d.get(g.gpus_per_node, 0) + g.num_nodes
            return out
        return self._cached("_sizes", build)

    def max_gpus_per_node(self, gpu_type: str) -> int:
        return max(self._node_sizes().get(gpu_type, {0: 0}))

    def shapes(self, counts: Iterable[int]) -> list[Shape]:
        """Every shape with a GPU count in ``counts`` and power-of-two GPUs per node that the
        cluster has the nodes for, by GPU type (by name), count (in the order given), then
        GPUs per node (ascending): the shapes of the engine's candidate grids."""
        nodes_by_size = self._node_sizes()
        out = []
        for gtype in sorted(nodes_by_size):
            sizes = nodes_by_size[gtype]
            for count in counts:
                for gpn in pow2_upto(max(sizes)):
                    if count % gpn == 0 and sum(n for s, n in sizes.items() if s >= gpn) >= count // gpn:
                        out.append(Shape(gtype, count // gpn, gpn))
        return out

    def fewest_nodes_shape(self, gpu_type: str, num_gpus: int) -> Shape | None:
        """``num_gpus`` GPUs of ``gpu_type`` on the fewest nodes, equal GPUs on each (what
        ``fcfs`` runs a request on); None when the cluster has no such shape."""
        per_node = self.max_gpus_per_node(gpu_type)
        if per_node == 0:
            return None
        nodes_of_type = sum(self._node_sizes()[gpu_type].values())
        for k in range(1, num_gpus + 1):
            if num_gpus % k == 0 and num_gpus // k <= per_node:
                return Shape(gpu_type, k, num_gpus // k) if k <= nodes_of_type else None
        return None

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "name": self.name,
                "node_groups": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(g).items()
                                 if v is not None} for g in self.groups]}


# Arena's simulated clusters give only a node count per type; GPUs per node are fixed by type.
ARENA_GPUS_PER_NODE = {"a100": 4, "v100": 16, "a40": 2, "a10": 2}


GROUP_KEYS = ("gpu_type", "num_nodes", "gpus_per_node", "nodes_per_switch", "inter_node_bw_bytes_per_s", "hosts")
_GROUP_KEY_SET = frozenset(GROUP_KEYS)


def read_json_file(path: str | Path, what: str):
    """Parse a JSON file, with an ``InputError`` naming the file for every way it can be
    unreadable (missing, a folder, binary, not JSON)."""
    path = Path(path)
    check_regular_file(path, what)
    try:
        text = path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"{what} not found", file=str(path)) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, not a {what}", file=str(path)) from None
    except PermissionError:
        raise InputError(f"{what} is not readable (permission denied)", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start}); expected a JSON {what}", file=str(path)) from None
    except OSError as e:
        raise InputError(f"cannot read the {what}: {e.strerror or e}", file=str(path)) from None
    return loads_json(text, file=str(path))         # (a byte-order mark, as some editors write, is skipped)


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load our cluster JSON or Arena's ``sim_cluster_spec.json`` (detected from content).
    The formats are described in docs/instances.md."""
    path = Path(path)
    raw = read_json_file(path, "cluster file")
    if isinstance(raw, list) and raw and isinstance(raw[0], dict) and "node_groups" not in raw[0]:
        if len(raw) > 1:
            raise InputError(f"Arena's cluster spec is a list holding one object of {{gpu_type: {{node_num}}}}; "
                             f"this list has {len(raw)} entries (put every GPU type in the first object)",
                             file=str(path), field="[1]")
        return _from_arena(raw[0], path)
    if isinstance(raw, dict) and "node_groups" in raw:
        return _from_ours(raw, path)
    raise InputError("neither our cluster format (an object with 'node_groups') nor Arena's "
                     "(a list holding {gpu_type: {node_num}})", file=str(path))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


TOP_KEYS = ("schema_version", "name", "node_groups")


def _check_size(total: int, g: dict, path: Path, where: str) -> None:
    """Refuse a cluster past ``MAX_CLUSTER_GPUS`` GPUs, naming the larger factor of the
    group that takes it there."""
    if total > MAX_CLUSTER_GPUS:
        n, per = g["num_nodes"], g["gpus_per_node"]
        raise InputError(f"the cluster would have {total:,} GPUs, more than the {MAX_CLUSTER_GPUS:,} supported "
                         f"(this group: {n:,} nodes of {per:,} GPUs)", file=str(path),
                         field=f"{where}.{'num_nodes' if n >= per else 'gpus_per_node'}")


def _from_ours(raw: dict, path: Path) -> ClusterSpec:
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(TOP_KEYS)}",
                         file=str(path), field=unknown[0])
    ver = raw.get("schema_version", SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        raise InputError(f"unsupported schema_version {ver!r}; supported: {SCHEMA_VERSION}", file=str(path),
                         field="schema_version")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"must be a non-empty string, got {name!r}", file=str(path), field="name")
    if not isinstance(raw["node_groups"], list) or not raw["node_groups"]:
        raise InputError("must be a non-empty list of node groups (a cluster needs at least one)",
                         file=str(path), field="node_groups")
    groups, total, seen_hosts = [], 0, {}
    for i, g in enumerate(raw["node_groups"]):
        where = f"node_groups[{i}]"
        if not isinstance(g, dict):
            raise InputError("must be an object", file=str(path), field=where)
        unknown = [] if _GROUP_KEY_SET.issuperset(g) else sorted(set(g) - _GROUP_KEY_SET, key=str)
        if unknown:
            raise InputError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(GROUP_KEYS)}",
                             file=str(path), field=f"{where}.{unknown[0]}")
        for f in ("gpu_type", "num_nodes", "gpus_per_node"):
            if f not in g:
                raise InputError("missing", file=str(path), field=f"{where}.{f}")
        if not isinstance(g["gpu_type"], str):
            raise InputError(f"must be a GPU type name (a string), got {g['gpu_type']!r}", file=str(path),
                             field=f"{where}.gpu_type")
        for f in ("num_nodes", "gpus_per_node", "nodes_per_switch"):
            if f in g and (not _is_int(g[f]) or g[f] < 1):
                raise InputError(f"must be a positive integer, got {g[f]!r}", file=str(path), field=f"{where}.{f}")
        bw = g.get("inter_node_bw_bytes_per_s")
        if bw is not None and (not isinstance(bw, (int, float)) or isinstance(bw, bool)
                               or not math.isfinite(bw) or bw <= 0):
            raise InputError(f"must be a finite number of bytes/s > 0 (or absent for the GPU catalog's "
                             f"figure), got {bw!r}", file=str(path), field=f"{where}.inter_node_bw_bytes_per_s")
        hosts = g.get("hosts")
        if hosts is not None and not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)):
            raise InputError(f"must be a list of host names, one per node, got {hosts!r}", file=str(path),
                             field=f"{where}.hosts")
        total += g["num_nodes"] * g["gpus_per_node"]
        _check_size(total, g, path, where)
        for h in hosts or ():
            if h.strip() in seen_hosts:
                other = seen_hosts[h.strip()]
                also = "twice in this list" if other == where else f"also in {other}.hosts"
                raise InputError(f"duplicate host name {h.strip()!r} ({also}): each node needs its own host",
                                 file=str(path), field=f"{where}.hosts")
            if h.strip():
                seen_hosts[h.strip()] = where
        try:
            groups.append(NodeGroup(g["gpu_type"], g["num_nodes"], g["gpus_per_node"],
                                    g.get("nodes_per_switch"), None if bw is None else float(bw),
                                    None if hosts is None else tuple(hosts)))
        except InputError as e:
            raise InputError(e.reason, file=str(path), field=f"{where}.{e.field or 'gpu_type'}") from None
    return ClusterSpec(tuple(groups), name)


ARENA_KEYS = ("node_num",)


def _from_arena(raw: dict, path: Path) -> ClusterSpec:
    groups, total = [], 0
    for t, v in raw.items():
        if isinstance(v, dict) and set(v) - set(ARENA_KEYS):
            unknown = sorted(set(v) - set(ARENA_KEYS))
            raise InputError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(ARENA_KEYS)} "
                             "(Arena's format gives a node count per GPU type; for more, use our format with "
                             "'node_groups')", file=str(path), field=f"{t}.{unknown[0]}")
        if not isinstance(v, dict) or not _is_int(v.get("node_num")) or v["node_num"] < 0:
            raise InputError("expected {'node_num': non-negative integer}", file=str(path), field=t)
        if t.lower() not in ARENA_GPUS_PER_NODE:
            raise InputError(f"unknown GPU type {t!r} in Arena cluster spec; known: "
                             f"{', '.join(ARENA_GPUS_PER_NODE)}", file=str(path), field=t)
        total += v["node_num"] * ARENA_GPUS_PER_NODE[t.lower()]
        if total > MAX_CLUSTER_GPUS:
            raise InputError(f"the cluster would have {total:,} GPUs, more than the {MAX_CLUSTER_GPUS:,} supported",
                             file=str(path), field=f"{t}.node_num")
        if v["node_num"]:
            groups.append(NodeGroup(t, v["node_num"], ARENA_GPUS_PER_NODE[t.lower()]))
    if not groups:
        raise InputError("every GPU type has node_num 0: the cluster has no GPU", file=str(path),
                         field="node_num")
    return ClusterSpec(tuple(groups), path.stem)
