"""A Slurm cluster as the scheduler sees it: nodes, their GPUs and state, read from Slurm.

``discover`` asks the controller (``scontrol ping``), the partitions (``scontrol -o show
partition``) and the nodes: ``sinfo --json`` (Slurm's OpenAPI v0.0.38 form in 22.05), or,
where a Slurm build has no JSON serializer, the one-line text form ``scontrol -o -d show
nodes``; both parse to the same ``SlurmNode`` records (name, partitions, base state and
flags, CPUs and GPUs with how many are allocated, the drain or down reason). It returns a
``SlurmView``: the ``ClusterSpec`` the engine schedules on (one node group per GPU type and
count, hosts = Slurm node names; a node without GPU GRES offers its CPUs as slots of type
``cpu``, as ``--local-slots`` does) and the availability of every node (out of service:
down, drained or draining, failing, not responding, powered down; GPUs or CPUs allocated to
Slurm jobs).

Slurm's GRES type names map to the GPU catalog's types (``instances/gpus.py``) through one
table: ``instances/data/slurm/gpu_types.json`` (names sites use and those NVML
auto-detection gives, e.g. ``nvidia_a100-sxm4-80gb``), extended or overridden by the
operator's own JSON object (``{"GRES type": "catalog type"}``, ``load_gpu_type_table``); a
type the table lacks but the catalog knows (``a100-80gb``, or an alias) maps to itself, and
GPUs with no type (``gpu:2``) map through the table's key ``untyped``. A GPU type that maps
nowhere is an ``InputError`` naming the type, the node and how to extend the table.

Jobs: ``list_jobs`` reads this user's jobs from ``squeue`` (text form with a fixed format:
cheap enough to poll, and, unlike ``squeue --json``, which answers "Unspecified error" with
exit status 0 when the controller is down, it fails in a way we can report) and
``accounted_job`` an ended job from ``sacct`` where accounting is enabled.

Every failure is an ``InputError`` naming what: no Slurm command on PATH, the controller
down, a command that timed out, an unknown partition, malformed output.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .cluster import ClusterSpec, NodeGroup, read_json_file
from .errors import InputError
from .gpus import GPU_TYPES, canonical_gpu_name
from .paths import check_input_file

DEFAULT_TIMEOUT_S = 30.0
UNTYPED = "untyped"                      # the table's key for GPUs with no GRES type (``gpu:2``)
GPU_TYPES_RESOURCE = "data/slurm/gpu_types.json"
GPU_TYPES_FLAG = "--slurm-gpu-types"     # the operator's table (a JSON file)
CPU_TYPE = "cpu"                         # a node without GPU GRES: its CPUs are slots of this type

# Base states and flags (upper case, as ``scontrol`` prints them) that take a node out of
# service for new work: nothing new is placed there and what runs there moves off.
OUT_OF_SERVICE_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN", "ERROR"})
OUT_OF_SERVICE_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "NOT_RESPONDING",
                                  "MAINTENANCE", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP",
                                  "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG", "INVAL"})
# sinfo's one-character suffixes on a state (``idle*``): the flag each stands for
STATE_SUFFIXES = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                  "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                  "-": "PLANNED"}
# a job state after which nothing of the job runs any more
ENDED_JOB_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                              "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


# --- running Slurm's commands ---------------------------------------------------------------
class SlurmCommandError(InputError):
    """A Slurm command that failed; ``message`` is Slurm's own last error line."""

    def __init__(self, reason: str, message: str, *, field: str | None = "--slurm"):
        super().__init__(reason, field=field)
        self.message = message


@dataclass(frozen=True)
class SlurmCommands:
    """How to run Slurm's client commands: the ``slurm.conf`` they read (``SLURM_CONF``;
    None: Slurm's own default, or ``SLURM_CONF`` as set) and how long one may take."""
    conf: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise InputError(f"must be a number of seconds > 0, got {self.timeout_s!r}", field="timeout_s")
        if self.conf is not None:           # (Slurm's commands retry a missing one for 60 s)
            check_input_file(self.conf, "--slurm-conf")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def path(self, name: str) -> str:
        """The command ``name`` on PATH, or an ``InputError`` saying it is not there."""
        found = shutil.which(name)
        if not found:
            raise InputError(f"no Slurm command {name!r} on PATH: run on a host with Slurm's client commands "
                             f"(Debian: apt-get install slurm-client) and the cluster's slurm.conf",
                             field="--slurm")
        return found

    def run(self, *args: str, quiet_errors: Iterable[str] = ()) -> str:
        """Run a Slurm command; its standard output. An ``InputError`` naming the command and
        Slurm's own message when it fails (the controller not answering says so), unless the
        message holds one of ``quiet_errors`` (then the output so far, often empty)."""
        cmd = [self.path(args[0]), *args[1:]]
        shown = " ".join(args)
        try:
            out = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=self.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"`{shown}` did not answer within {self.timeout_s:g} s (is the Slurm controller "
                                    f"reachable? SLURM_CONF={self.env().get('SLURM_CONF', '(Slurm default)')})",
                                    f"{args[0]} did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            raise InputError(f"cannot run `{shown}`: {e.strerror or e}", field="--slurm") from None
        if out.returncode != 0:
            msg = _last_error(out.stderr) or _last_error(out.stdout) or f"exit status {out.returncode}"
            if any(q in (out.stderr + out.stdout) for q in quiet_errors):
                return out.stdout
            if "Unable to contact slurm controller" in msg or "Zero Bytes were transmitted" in msg:
                raise SlurmCommandError(f"the Slurm controller does not answer (`{shown}`: {msg})", msg)
            raise SlurmCommandError(f"`{shown}` failed: {msg}", msg)
        return out.stdout

    def ping(self) -> None:
        """An ``InputError`` unless the controller answers (``scontrol ping``: quick even when
        it is down, where other commands retry for about ``MessageTimeout`` seconds)."""
        cmd = [self.path("scontrol"), "ping"]
        try:
            out = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=self.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InputError(f"`scontrol ping` did not answer within {self.timeout_s:g} s", field="--slurm") from None
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0 or "is UP" not in text:
            first = next((line for line in text.splitlines() if line.strip() and "*" not in line), text)
            raise InputError(f"the Slurm controller does not answer (`scontrol ping`: {first.strip()}); start "
                             f"slurmctld or point SLURM_CONF at the cluster's slurm.conf", field="--slurm")


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errs = [line for line in lines if "error" in line.lower() or "fatal" in line.lower()]
    return (errs or lines or [""])[-1]


# --- GRES type table -----------------------------------------------------------------------------
def builtin_gpu_type_table() -> dict[str, str]:
    return json.loads(resources.files("instances").joinpath(GPU_TYPES_RESOURCE).read_text())


def load_gpu_type_table(path: str | os.PathLike | None = None,
                        extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The GRES type table: the built-in one, then the operator's JSON file ``path`` (an
    object ``{"GRES type": "catalog GPU type"}``), then ``extra``; later entries win. Keys
    are compared without case; every value must be a catalog GPU type (or alias)."""
    table = {k.lower(): canonical_gpu_name(v) for k, v in builtin_gpu_type_table().items()}
    sources: list[tuple[str | None, Mapping]] = []
    if path is not None:
        raw = read_json_file(Path(path), "GRES type table")
        if not isinstance(raw, dict):
            raise InputError('must be a JSON object {"GRES type": "catalog GPU type", ...}', file=str(path),
                             field=GPU_TYPES_FLAG)
        sources.append((str(path), raw))
    if extra:
        sources.append((None, extra))
    for file, mapping in sources:
        for k, v in mapping.items():
            if not isinstance(k, str) or not k.strip():
                raise InputError(f"a GRES type must be a non-empty name, got {k!r}", file=file, field=GPU_TYPES_FLAG)
            if not isinstance(v, str):
                raise InputError(f"GRES type {k!r}: must map to a catalog GPU type name, got {v!r}", file=file,
                                 field=GPU_TYPES_FLAG)
            try:
                table[k.strip().lower()] = canonical_gpu_name(v)
                if table[k.strip().lower()] == CPU_TYPE:
                    raise InputError("cpu")
            except InputError:
                raise InputError(f"GRES type {k!r} maps to {v!r}, which is not a catalog GPU type; known: "
                                 f"{', '.join(sorted(t for t in GPU_TYPES if t != CPU_TYPE))}", file=file,
                                 field=GPU_TYPES_FLAG) from None
    return table


def catalog_type(gres_type: str | None, node: str, table: Mapping[str, str]) -> str:
    """The catalog GPU type of GRES type ``gres_type`` (None: GPUs without a type) on ``node``."""
    key = UNTYPED if gres_type is None else gres_type.strip().lower()
    if key in table:
        return table[key]
    if gres_type is not None:
        try:
            return canonical_gpu_name(gres_type)
        except InputError:
            pass
    shown = f"gpu:{gres_type}" if gres_type is not None else "gpu (no type)"
    raise InputError(f"node {node}: Slurm GRES {shown} is not in the GRES type table; map it to a catalog GPU "
                     f"type in a JSON file given with {GPU_TYPES_FLAG} FILE, e.g. "
                     f"{{\"{UNTYPED if gres_type is None else gres_type}\": \"a100-80gb\"}} "
                     f"(catalog types: {', '.join(sorted(t for t in GPU_TYPES if t != CPU_TYPE))})",
                     field=GPU_TYPES_FLAG)


# --- parsing ----------------------------------------------------------------------------------------
_GRES_ITEM = re.compile(r"^gpu(?::([^:()]+))?:(\d+)(?:\(.*\))?$")


def parse_gres(text: str | None, *, where: str = "gres") -> list[tuple[str | None, int]]:
    """(type or None, count) of every GPU entry of a GRES string: ``gpu:a100:2``,
    ``gpu:a100:2(S:0-1)``, ``gpu:2``, ``gpu:a100:1(IDX:0)``, several comma-separated, other
    GRES (``mps:100``) left out; ``(null)``/``N/A``/empty: none."""
    if text is None:
        return []
    text = text.strip()
    if text in ("", "(null)", "N/A", "none"):
        return []
    out = []
    for item in _split_top(text):
        item = item.strip()
        name = item.split(":", 1)[0].split("(", 1)[0]
        if name != "gpu":
            continue
        m = _GRES_ITEM.match(item)
        if not m:
            raise InputError(f"cannot read the GPU GRES {item!r} (expected gpu:TYPE:COUNT or gpu:COUNT)",
                             field=where)
        out.append((m.group(1), int(m.group(2))))
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (``gpu:a100:2(IDX:0,1),mps:100``)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s for s in out if s.strip()]


def parse_state(state: str, flags: Iterable[str] = ()) -> tuple[str, tuple[str, ...]]:
    """(base state, flags), upper case: ``IDLE+DRAIN`` -> (IDLE, (DRAIN,)); ``down*`` ->
    (DOWN, (NOT_RESPONDING,)); JSON's ``"idle"`` with ``["DRAIN"]`` the same."""
    parts = [p for p in state.strip().split("+") if p]
    if not parts:
        raise InputError(f"empty node state {state!r}", field="state")
    out_flags = [f.upper() for f in flags]
    base = parts[0]
    while base and base[-1] in STATE_SUFFIXES:
        out_flags.append(STATE_SUFFIXES[base[-1]])
        base = base[:-1]
    for p in parts[1:]:
        while p and p[-1] in STATE_SUFFIXES:
            out_flags.append(STATE_SUFFIXES[p[-1]])
            p = p[:-1]
        out_flags.append(p.upper())
    return base.upper(), tuple(dict.fromkeys(out_flags))


@dataclass(frozen=True)
class SlurmNode:
    """One Slurm node as read at one moment."""
    name: str
    partitions: tuple[str, ...]
    state: str                          # base state, upper case (IDLE, MIXED, ALLOCATED, DOWN ...)
    flags: tuple[str, ...]              # DRAIN, FAIL, NOT_RESPONDING ...
    cpus: int
    cpus_alloc: int
    gres_type: str | None               # Slurm's GPU type name (None: untyped or no GPU)
    gpus: int                           # GPU GRES count (0: a CPU-only node)
    gpus_alloc: int
    gpu_type: str                       # catalog type ("cpu" for a node without GPUs)
    reason: str = ""

    @property
    def slots(self) -> int:
        """What the engine schedules on this node: its GPUs, or its CPUs when it has none."""
        return self.gpus if self.gpus else self.cpus

    @property
    def slots_alloc(self) -> int:
        """Slots held by Slurm jobs (any: the caller subtracts its own)."""
        return self.gpus_alloc if self.gpus else self.cpus_alloc

    @property
    def out_of_service(self) -> str | None:
        """Why nothing new may run here (``down``, ``drained: maint``...), None when in service."""
        bad = [f for f in self.flags if f in OUT_OF_SERVICE_FLAGS]
        if self.state not in OUT_OF_SERVICE_STATES and not bad:
            return None
        busy = self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags
        words = [self.state.lower()] if self.state in OUT_OF_SERVICE_STATES else []
        words += [("draining" if busy else "drained") if f == "DRAIN" else
                  "failing" if f == "FAIL" else f.lower().replace("_", " ") for f in bad]
        return ", ".join(dict.fromkeys(words)) + (f" ({self.reason})" if self.reason else "")

    @property
    def registering(self) -> bool:
        """State UNKNOWN and nothing else wrong: what a node shows after the controller
        restarted until its slurmd registers again (not a verdict on the node)."""
        return self.state == "UNKNOWN" and not any(f in OUT_OF_SERVICE_FLAGS for f in self.flags if
                                                   f != "NOT_RESPONDING")

    @property
    def sinfo_state(self) -> str:
        """The state as ``sinfo -o %T`` prints it (``idle``, ``mixed``, ``drained``,
        ``draining``, ``down*`` ...)."""
        busy = self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags
        if "FAIL" in self.flags:
            word = "failing" if busy else "fail"
        elif "DRAIN" in self.flags and self.state not in ("DOWN", "ERROR"):
            word = "draining" if busy else "drained"
        elif "MAINTENANCE" in self.flags and self.state not in ("ALLOCATED", "MIXED"):
            word = "maint"
        elif "COMPLETING" in self.flags:
            word = "completing"
        else:
            word = self.state.lower()
        marks = {"NOT_RESPONDING": "*", "POWERED_DOWN": "~", "POWERING_UP": "#", "POWERING_DOWN": "%"}
        return word + "".join(m for f, m in marks.items() if f in self.flags)

    @property
    def launch_gres(self) -> str | None:
        """The ``--gres`` name a job asks this node's GPUs by (``gpu:a100``, ``gpu``), None without GPUs."""
        if not self.gpus:
            return None
        return f"gpu:{self.gres_type}" if self.gres_type else "gpu"


def _node(name: str, partitions, state: str, flags, cpus, cpus_alloc, gres: str | None, gres_used: str | None,
          reason: str, table: Mapping[str, str]) -> SlurmNode:
    where = f"node {name}"
    have = parse_gres(gres, where=f"{where} gres")
    used = parse_gres(gres_used, where=f"{where} gres_used")
    types = sorted({t or "" for t, n in have if n})
    if len(types) > 1:
        raise InputError(f"node {name} has GPUs of several GRES types ({', '.join(types)}): arena schedules one "
                         f"GPU type per node; split the node's GRES or leave it out of the partition",
                         field="gres")
    gpus = sum(n for _, n in have)
    gres_type = next((t for t, n in have if n), None)
    base, fl = parse_state(state, flags)
    try:
        cpus_i, alloc_i = int(cpus), int(cpus_alloc or 0)
    except (TypeError, ValueError):
        raise InputError(f"node {name}: CPU counts {cpus!r}/{cpus_alloc!r} are not integers", field="cpus") from None
    return SlurmNode(name=name, partitions=tuple(partitions), state=base, flags=fl, cpus=cpus_i,
                     cpus_alloc=alloc_i, gres_type=gres_type, gpus=gpus, gpus_alloc=sum(n for _, n in used),
                     gpu_type=catalog_type(gres_type, name, table) if gpus else CPU_TYPE,
                     reason=(reason or "").strip())


def nodes_from_sinfo_json(text: str, table: Mapping[str, str], partition: str | None = None) -> list[SlurmNode]:
    """Nodes of ``sinfo --json`` (OpenAPI v0.0.38, Slurm 22.05). Its ``errors`` (the
    controller down gives "Unspecified error" with exit status 0) are an ``InputError``.
    ``partition``: only that partition's nodes (the others' GRES are not read: a GPU type
    the table lacks elsewhere on the cluster is no error here)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"`sinfo --json` did not print JSON ({e.msg} at line {e.lineno})", field="sinfo") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise InputError("`sinfo --json` printed no 'nodes' list", field="sinfo")
    errs = [e for e in raw.get("errors") or [] if isinstance(e, dict)]
    if errs:
        shown = "; ".join(f"{e.get('error') or e.get('description')} (errno {e.get('errno', e.get('error_number'))})"
                          for e in errs[:3])
        raise InputError(f"`sinfo --json` reported: {shown} (is the Slurm controller up?)", field="--slurm")
    out = []
    for i, n in enumerate(raw["nodes"]):
        try:
            if partition is not None and partition not in (n.get("partitions") or []):
                continue
            out.append(_node(n["name"], n.get("partitions") or [], n["state"], n.get("state_flags") or [],
                             n["cpus"], n.get("alloc_cpus"), n.get("gres"), n.get("gres_used"), n.get("reason", ""),
                             table))
        except (KeyError, TypeError, AttributeError) as e:
            raise InputError(f"`sinfo --json` node {i}: missing or malformed {e}", field="sinfo") from None
    return out


_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line (values may hold spaces: ``OS=Linux
    6.1 #1 SMP``, ``Reason=maint x [root@...]``)."""
    ms = list(_KEY.finditer(line))
    return {m.group(1): line[m.end(): ms[i + 1].start() if i + 1 < len(ms) else len(line)].strip()
            for i, m in enumerate(ms)}


def nodes_from_scontrol(text: str, table: Mapping[str, str], partition: str | None = None) -> list[SlurmNode]:
    """Nodes of ``scontrol -o -d show nodes`` (one line per node); ``partition``: only
    that partition's nodes (as ``nodes_from_sinfo_json``)."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        kv = parse_key_values(line)
        try:
            parts = [] if kv.get("Partitions", "") in ("", "(null)") else kv["Partitions"].split(",")
            if partition is not None and partition not in parts:
                continue
            reason = re.sub(r"\s*\[[^]]*\]\s*$", "", kv.get("Reason", ""))      # "[user@time]"
            out.append(_node(kv["NodeName"], parts, kv["State"], (), kv.get("CPUTot") or kv["CPUEfctv"],
                             kv.get("CPUAlloc"), kv.get("Gres"), kv.get("GresUsed"), reason, table))
        except KeyError as e:
            raise InputError(f"`scontrol show nodes` line {i}: no {e.args[0]}", field="scontrol") from None
    return out


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    state: str                          # UP, DOWN, DRAIN, INACTIVE
    default: bool


def partitions_from_scontrol(text: str) -> dict[str, SlurmPartition]:
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = parse_key_values(line)
        if "PartitionName" not in kv:
            raise InputError(f"`scontrol show partition`: a line without PartitionName: {line[:80]!r}",
                             field="scontrol")
        out[kv["PartitionName"]] = SlurmPartition(kv["PartitionName"], kv.get("State", "UP").upper(),
                                                  kv.get("Default", "NO").upper() == "YES")
    return out


def natural_key(name: str) -> tuple:
    """n2 before n10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# --- the view -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmView:
    """The nodes of one partition at one moment, and the cluster spec they make."""
    partition: str
    nodes: tuple[SlurmNode, ...]          # in node-id order of ``spec()``
    source: str                           # "sinfo --json" or "scontrol -o -d show nodes"

    def spec(self) -> ClusterSpec:
        """One node group per run of nodes of one (GPU type, slots per node) in ``nodes``'
        order (``discover``: one group per kind, in node-name order, unless an earlier order
        puts nodes the partition gained after the known ones); hosts are the Slurm node names."""
        groups: list[tuple[tuple[str, int], list[str]]] = []
        for n in self.nodes:
            if not groups or groups[-1][0] != (n.gpu_type, n.slots):
                groups.append(((n.gpu_type, n.slots), []))
            groups[-1][1].append(n.name)
        return ClusterSpec(tuple(NodeGroup(t, len(names), slots, hosts=tuple(names))
                                 for (t, slots), names in groups), f"slurm-{self.partition}")

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def node_names(self) -> dict[int, str]:
        """Node id (as ``spec().nodes()`` numbers them) -> Slurm node name."""
        return {n.node_id: n.host for n in self.spec().nodes() if n.host is not None}

    def launch_gres(self) -> dict[str, str | None]:
        """Slurm node name -> the ``--gres`` name its GPUs are asked by (None: CPU slots)."""
        return {n.name: n.launch_gres for n in self.nodes}

    def out_of_service(self) -> dict[str, str]:
        """Slurm node name -> why it is out of service, for the nodes that are."""
        return {n.name: why for n in self.nodes if (why := n.out_of_service) is not None}

    def unusable_slots(self, own: Mapping[str, int] | None = None) -> dict[str, int]:
        """Slurm node name -> slots held by Slurm jobs other than ours (``own``: slots our
        launches hold per node), for the nodes where some are: capacity the round cannot use."""
        own = own or {}
        return {n.name: k for n in self.nodes if (k := max(0, n.slots_alloc - own.get(n.name, 0)))}

    def availability(self, spec: ClusterSpec, own: Mapping[str, int] | None = None) -> "NodeAvailability":
        """This reading against the cluster ``spec`` the engine schedules on (read earlier):
        by node id, the nodes out of service and why (Slurm's state; a node Slurm no longer
        lists in the partition; a node whose GPUs changed), the slots other jobs hold, and
        the partition's nodes the spec lacks."""
        by_name = {n.name: n for n in self.nodes}
        out: dict[int, str] = {}
        unusable: dict[int, int] = {}
        held = self.unusable_slots(own)
        for node in spec.nodes():
            now = by_name.get(node.host or "")
            if now is None:
                out[node.node_id] = f"no longer in Slurm partition {self.partition!r}"
            elif (now.gpu_type, now.slots) != (node.gpu_type, node.num_gpus):
                out[node.node_id] = (f"its slots changed in Slurm ({node.num_gpus} x {node.gpu_type} -> {now.slots} "
                                     f"x {now.gpu_type}); a restart takes the new shape")
            elif now.out_of_service is not None:
                out[node.node_id] = now.out_of_service
            if now is not None and now.name in held:
                unusable[node.node_id] = held[now.name]
        known = {n.host for n in spec.nodes()}
        return NodeAvailability(out, unusable, tuple(n.name for n in self.nodes if n.name not in known))


@dataclass(frozen=True)
class NodeAvailability:
    """One Slurm reading against the engine's cluster (``SlurmView.availability``)."""
    out_of_service: dict[int, str]        # node id -> why nothing may run there now
    unusable_slots: dict[int, int]        # node id -> slots Slurm jobs not ours hold
    new_nodes: tuple[str, ...]            # Slurm nodes of the partition the cluster spec lacks


def discover(commands: SlurmCommands | None = None, partition: str | None = None,
             table: Mapping[str, str] | None = None, form: str = "auto", order: Sequence[str] = ()) -> SlurmView:
    """Read the nodes of ``partition`` (None: Slurm's default partition) from Slurm.
    ``form``: ``json`` (``sinfo --json``), ``text`` (``scontrol -o -d show nodes``) or
    ``auto`` (JSON where this Slurm prints it, else text). ``order``: the node names of an
    earlier cluster in node-id order (``spec_order``)."""
    if form not in ("auto", "json", "text"):
        raise InputError(f"must be auto, json or text, got {form!r}", field="form")
    commands = commands or SlurmCommands()
    table = load_gpu_type_table() if table is None else table
    commands.ping()
    parts = partitions_from_scontrol(commands.run("scontrol", "-o", "show", "partition"))
    if not parts:
        raise InputError("Slurm has no partition", field="--partition")
    if partition is None:
        default = [p for p in parts.values() if p.default]
        if not default:
            raise InputError(f"Slurm has no default partition: give one with --partition "
                             f"(partitions: {', '.join(sorted(parts))})", field="--partition")
        partition = default[0].name
    if partition not in parts:
        raise InputError(f"unknown Slurm partition {partition!r}; partitions: {', '.join(sorted(parts))}",
                         field="--partition")
    if parts[partition].state not in ("UP",):
        raise InputError(f"Slurm partition {partition!r} is {parts[partition].state} (no job starts there)",
                         field="--partition")
    nodes: list[SlurmNode] | None = None
    source = "scontrol -o -d show nodes"
    if form in ("auto", "json"):
        text = commands.run("sinfo", "--json") if form == "json" else _try_json(commands)
        if text is not None:
            nodes, source = nodes_from_sinfo_json(text, table, partition), "sinfo --json"
    if nodes is None:
        nodes = nodes_from_scontrol(commands.run("scontrol", "-o", "-d", "show", "nodes"), table, partition)
    mine = sorted((n for n in nodes if partition in n.partitions), key=lambda n: natural_key(n.name))
    if not mine:
        raise InputError(f"Slurm partition {partition!r} has no nodes", field="--partition")
    rank = {name: i for i, name in enumerate(spec_order(mine, order))}
    return SlurmView(partition, tuple(sorted(mine, key=lambda n: rank[n.name])), source)


def spec_order(nodes: list[SlurmNode], order: Sequence[str] = ()) -> list[str]:
    """The node names of ``nodes`` (in node-name order) in node-id order: grouped by
    (GPU type, slots per node). With ``order`` (an earlier cluster's node names in node-id
    order, every one of them still in ``nodes``): that order, the others appended after it
    the same way, so that the known nodes keep their node ids (a service restarted after
    its partition gained nodes re-adopts its launches on the nodes they run on). A node of
    ``order`` that is gone: the plain order."""
    def grouped(ns: list[SlurmNode]) -> list[str]:
        groups: dict[tuple[str, int], list[str]] = {}
        for n in ns:
            groups.setdefault((n.gpu_type, n.slots), []).append(n.name)
        return [name for names in groups.values() for name in names]
    names = {n.name for n in nodes}
    if not order or not set(order) <= names or len(set(order)) != len(order):
        return grouped(nodes)
    known = set(order)
    return [*order, *grouped([n for n in nodes if n.name not in known])]


def _try_json(commands: SlurmCommands) -> str | None:
    """``sinfo --json``'s output, or None where this Slurm has no JSON form (an older
    release, or a build without the JSON serializer plugin)."""
    try:
        text = commands.run("sinfo", "--json")
    except InputError as e:
        if "controller does not answer" in e.reason or "did not answer" in e.reason:
            raise
        return None
    return text if text.lstrip().startswith("{") else None


# --- jobs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    state: str                            # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL ...
    reason: str                           # squeue's reason (None, Resources, ...), or the end's
    name: str
    nodes: str                            # Slurm's node list expression
    comment: str
    exit_code: str = ""                   # sacct's "status:signal", where known

    @property
    def ended(self) -> bool:
        return self.state in ENDED_JOB_STATES


SQUEUE_FORMAT = "%i|%T|%r|%j|%N|%k"       # the comment last: it may hold anything


def list_jobs(commands: SlurmCommands, ids: Iterable[int] | None = None) -> dict[int, SlurmJob]:
    """This user's jobs Slurm still lists (pending, running, and ended ones until the
    controller forgets them, ``MinJobAge``), by job id; ``ids``: only those."""
    args = ["squeue", "--me", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
    if ids is not None:
        ids = sorted(set(int(i) for i in ids))
        if not ids:
            return {}
        args.append(f"--jobs={','.join(map(str, ids))}")
    text = commands.run(*args, quiet_errors=("Invalid job id",))
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", 5)
        if len(f) != 6 or not f[0].strip().isdigit():
            raise InputError(f"`squeue` printed a line not in the asked format: {line[:120]!r}", field="squeue")
        j = SlurmJob(int(f[0]), f[1].strip().upper(), f[2].strip(), f[3], f[4], "" if f[5] == "(null)" else f[5])
        out[j.job_id] = j
    return out


_HOST_RANGE = re.compile(r"([^,\[\]]*)(?:\[([^\]]*)\])?([^,\[\]]*)")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's node list expression as names: ``n[1-3,7],gpu01`` -> n1, n2, n3, n7, gpu01
    (zero padding kept: ``gpu[08-10]`` -> gpu08, gpu09, gpu10); ``(null)``/empty: none."""
    expr = (expr or "").strip()
    if expr in ("", "(null)", "None assigned"):
        return []
    out: list[str] = []
    for item in _split_top(expr.replace("[", "(").replace("]", ")")):
        item = item.replace("(", "[").replace(")", "]")
        m = _HOST_RANGE.fullmatch(item.strip())
        if not m:
            raise InputError(f"cannot read the node list {expr!r}", field="squeue")
        prefix, ranges, suffix = m.groups()
        if ranges is None:
            out.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise InputError(f"cannot read the node list {expr!r}", field="squeue")
            width = len(lo) if lo.startswith("0") else 0
            out += [f"{prefix}{str(i).zfill(width)}{suffix}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


@dataclass(frozen=True)
class JobSlots:
    """One of this user's jobs with what it holds on each of its nodes (``job_slots``)."""
    job: SlurmJob
    nodes: tuple[str, ...]                # its nodes, expanded
    gpus_per_node: int                    # GPU GRES it holds per node
    cpus_per_node: int


JOB_SLOTS_FORMAT = "%i|%T|%r|%j|%N|%D|%C|%b|%k"    # the comment last
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING",
                            "STAGE_OUT"})       # states in which a job holds its nodes' resources


def job_slots(commands: SlurmCommands) -> list[JobSlots]:
    """This user's jobs that hold resources now (running, completing ...), each with its
    nodes and the GPUs and CPUs it holds on each (``squeue``'s per-node GRES ``%b`` and
    CPUs ``%C`` over nodes ``%D``)."""
    text = commands.run("squeue", "--me", "--noheader", f"--states={','.join(sorted(HOLDING_STATES))}",
                        f"--format={JOB_SLOTS_FORMAT}")
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", 8)
        if len(f) != 9 or not f[0].strip().isdigit() or not f[5].strip().isdigit() or not f[6].strip().isdigit():
            raise InputError(f"`squeue` printed a line not in the asked format: {line[:120]!r}", field="squeue")
        job = SlurmJob(int(f[0]), f[1].strip().upper(), f[2].strip(), f[3], f[4], "" if f[8] == "(null)" else f[8])
        gres = re.sub(r"\bgres[:/]", "", f[7].strip())
        nodes = max(1, int(f[5]))
        out.append(JobSlots(job, tuple(expand_hostlist(f[4])), sum(n for _, n in parse_gres(gres, where="squeue %b")),
                            int(f[6]) // nodes))
    return out


def accounted_job(commands: SlurmCommands, job_id: int) -> SlurmJob | None:
    """An ended job from Slurm's accounting (``sacct``), None where accounting is disabled or
    does not know it."""
    try:
        text = commands.run("sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={int(job_id)}",
                            "--format=JobID,State,Reason,JobName,NodeList,ExitCode,Comment",
                            quiet_errors=("accounting storage is disabled",))
    except InputError as e:
        if "no Slurm command" in e.reason:
            return None
        raise
    for line in text.splitlines():
        f = line.split("|", 6)
        if len(f) == 7 and f[0].strip() == str(job_id):
            state = f[1].split()[0].upper() if f[1].strip() else "UNKNOWN"    # "CANCELLED by 0"
            return SlurmJob(int(job_id), state, f[2], f[3], f[4], f[6], f[5])
    return None
