"""Importer for the Sia (SOSP'23) authors' simulator artifact, read from a directory.

The artifact (GitHub ``siasosp23/artifacts``, directory ``sia-simulator/``) has no
licence file, so nothing of it is bundled here: the user fetches it and names the
directory (``--sia-artifact DIR``; docs/sia-artifact.md). ``DIR`` is either the
``sia-simulator/`` folder or the repository root holding it. What is read:

- ``simulator_config.py``: the simulated cluster (``cluster_nnodes``: nodes per GPU
  "cluster" such as ``aws``, ``dgx-ext``, ``rtx``; ``cluster_ngpus_per_node``;
  ``cluster_max_physical_nnodes``), the per-application calibration ``SLOWDOWNS`` and
  Sia's defaults (``sia_default_p_val``, ``sia_default_lambda_n``,
  ``sia_default_lambda_a``, ``sia_goodput_clip_val``). Module-level assignments of
  literal values only, read with ``ast`` (nothing of the file is executed); the last
  assignment of a name wins, as when Python runs it, and a last assignment that is not a
  literal (``10**12``, ``dict(...)``), or code that changes a name read, is refused
  rather than passed over for an earlier one.
- ``applications.py``: per application and cluster, the keyword settings of its
  ``Application(...)`` entry in ``APPLICATIONS`` (``max_epochs``, ``num_stages`` ...), and
  the per-application constants the class sets by name (``rescale_time``: the restart
  time of a job, and any ``if self.name == ... [and cluster_suffix == ...]`` override
  such as ``max_local_bsz``). Read with ``ast`` too.
- ``sia.py``: Sia's restart penalty per job-name prefix (``get_restart_penalty``), the
  price its policy puts on a restart (its "restart factor").
- ``traces/<application>/``: ``placements-<cluster>.csv``
  (``placement,local_bsz,step_time,sync_time``: measured step and all-reduce time per
  placement, a placement being the GPUs used on each node written as digits, e.g. 44)
  and ``scalability-<cluster>.csv`` (``num_nodes,num_replicas,local_bsz,step_time,
  sync_time``): the throughput profiles per GPU type; ``validation-<batch>.csv``
  (``progress,iteration,metric,grad_sqr,grad_var``, one row per epoch): the
  validation and gradient-statistics curves from which statistical efficiency follows.
- ``workloads/<trace>/<name>.csv`` (``name,time,application,num_replicas,batch_size``):
  the job lists (``philly``, ``saturn``, ``newtrace``, ``scale/...``).

Every file is checked as it is read; a missing or bad one is an ``InputError`` naming
the file, the line and the field; a pipe, a device or a symbolic-link loop in place of a
file is refused without reading it. Every number is held to a bound
(``instances/limits.py``): the simulated cluster to ``MAX_CLUSTER_GPUS``, batches to
``MAX_GLOBAL_BATCH``, progress to ``MAX_ITERATIONS``, and ``Range`` bounds on the
slowdowns, restart times, step times, gradient statistics and Sia's defaults (the same
as the ``--policy-opt`` that overrides each). The GPU "clusters" map to catalog GPU types by
``SIA_GPU_TYPES``. Pipeline-parallel applications (``PMPApplication``, ``gpt_pmp``) are
not imported; a workload that uses one is refused with that reason.
"""
from __future__ import annotations

import ast
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .cluster import MAX_CLUSTER_GPUS
from .csv_rows import CsvRows, read_text
from .errors import InputError
from .gpus import canonical_gpu_name
from .jobs import MAX_GLOBAL_BATCH, MAX_ITERATIONS
from .limits import (
    GRADIENT_STAT,
    RESTART_S,
    SIA_CLIP,
    SIA_LAMBDA_N,
    SIA_P,
    SIA_SLOWDOWN,
    STEP_TIME_S,
    SYNC_TIME_S,
    Range,
    check_sia_pair,
    show_number,
)

# The artifact's GPU "clusters" (simulator_config.py) and our catalog's types.
SIA_GPU_TYPES = {"aws": "t4", "dgx": "a100-40gb", "dgx-ext": "a100-40gb", "rtx": "rtx-2080ti",
                 "azure": "v100-32gb"}
SIA_CONFIG_FILE = "simulator_config.py"
SIA_APPLICATIONS_FILE = "applications.py"
SIA_POLICY_FILE = "sia.py"
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_REQUIRED_CONFIG = ("cluster_nnodes", "cluster_ngpus_per_node", "cluster_max_physical_nnodes", "SLOWDOWNS")
_SIA_PARAMS = ("sia_default_p_val", "sia_default_lambda_n", "sia_default_lambda_a", "sia_goodput_clip_val")
# Sia's own values of its policy's defaults (the artifact's simulator_config.py), used when
# the file leaves one out; each read from the file is held to the bound of the option that
# overrides it (instances/limits.py), lambda_a (not read by our policy) to being finite
SIA_DEFAULTS = {"sia_default_p_val": -0.5, "sia_default_lambda_n": 1.1, "sia_goodput_clip_val": 3000.0}
SIA_PARAM_BOUNDS = {"sia_default_p_val": SIA_P, "sia_default_lambda_n": SIA_LAMBDA_N, "sia_goodput_clip_val": SIA_CLIP}
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
MAX_PLACEMENT_DIGIT = 9            # a placement's digits: GPUs per node, one digit each
MAX_PLACEMENT_NODES = 18           # digits of a placement id: it is kept as a 64-bit integer (the artifact's: <= 16)
MAX_NAME_PART = 255                # a workload name's part is a file name (NAME_MAX)
BATCH = Range(1, MAX_GLOBAL_BATCH, "a batch size: a thousand times the largest measured batch", integer=True)
PROGRESS = Range(0.0, MAX_ITERATIONS, "progress, in the initial batch's iterations (instances.jobs.MAX_ITERATIONS)")
GPU_COUNT = Range(1, MAX_CLUSTER_GPUS, "nodes or replicas of a cluster (instances.cluster.MAX_CLUSTER_GPUS)",
                  integer=True)


@dataclass(frozen=True)
class SiaConfig:
    """``simulator_config.py``: the cluster and Sia's defaults."""
    nodes: dict[str, int]                     # GPU cluster -> nodes simulated
    gpus_per_node: dict[str, int]             # GPU cluster -> GPUs per node
    max_physical_nodes: dict[str, int]        # GPU cluster -> nodes profiled at most
    slowdowns: dict[str, float]               # application -> calibration slowdown (goodput / it)
    sia_params: dict[str, float]              # sia_default_p_val, ... (those present)

    def gpu_type(self, cluster: str) -> str:
        return SIA_GPU_TYPES[cluster]


@dataclass(frozen=True)
class AppSettings:
    """One application's settings in ``applications.py`` for one GPU cluster."""
    max_epochs: int | None = None
    num_stages: int = 1
    init_batch_size: int | None = None
    max_batch_size: int | None = None
    min_local_bsz: int | None = None
    max_local_bsz: int | None = None
    target_metric: float | None = None
    rescale_time_s: float = 30.0              # restart time (the class default: 30 s)


@dataclass(frozen=True, eq=False)
class ThroughputProfile:
    """One application's measured step times on one GPU cluster."""
    file: str
    placement: np.ndarray          # placement id (digits = GPUs per node), per row
    num_nodes: np.ndarray
    num_replicas: np.ndarray
    local_bsz: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray
    scal_file: str
    scal_nodes: np.ndarray
    scal_replicas: np.ndarray
    scal_local_bsz: np.ndarray
    scal_step_time: np.ndarray
    scal_sync_time: np.ndarray


@dataclass(frozen=True, eq=False)
class ValidationCurve:
    """One validation run at a fixed batch size: one row per epoch."""
    batch_size: int
    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


@dataclass(frozen=True, eq=False)
class SiaApplication:
    """An application's profiles (per GPU cluster) and validation curves."""
    name: str
    settings: dict[str, AppSettings]                 # per GPU cluster
    profiles: dict[str, ThroughputProfile]           # per GPU cluster
    validation: tuple[ValidationCurve, ...]          # by batch size


@dataclass(frozen=True)
class WorkloadRow:
    name: str
    time_s: float
    application: str
    num_replicas: int
    batch_size: int
    line: int


@dataclass(frozen=True, eq=False)
class SiaArtifact:
    root: Path                                       # the sia-simulator folder
    config: SiaConfig
    applications: dict[str, SiaApplication]          # only those a workload read so far uses
    restart_penalty_s: dict[str, float]              # job-name prefix -> Sia's restart penalty
    restart_penalty_default_s: float
    app_settings: dict[str, dict[str, AppSettings]] = field(default_factory=dict)

    def workload_path(self, name: str) -> Path:
        return workload_path(self.root, name)

    def restart_penalty(self, job_name: str) -> float:
        """Sia's restart penalty for a job (``get_restart_penalty``: by the first matching
        substring of the job name, in the file's order)."""
        for key, v in self.restart_penalty_s.items():
            if key in job_name:
                return v
        return self.restart_penalty_default_s


# -- locating the artifact ------------------------------------------------------------

def artifact_root(path: str | Path, field: str = "--sia-artifact") -> Path:
    """The ``sia-simulator`` folder of the artifact at ``path`` (the folder itself or the
    repository root holding it); an ``InputError`` naming ``field`` otherwise."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError("does not exist (fetch the Sia artifact first: docs/sia-artifact.md)", file=str(p),
                         field=field)
    if not p.is_dir():
        raise InputError("is not a directory (give the artifact's folder)", file=str(p), field=field)
    for cand in (p, p / "sia-simulator"):
        # (lexists: a pipe or a link loop in place of the file is the reader's to refuse, by name)
        if os.path.lexists(cand / SIA_CONFIG_FILE) and (cand / "traces").is_dir():
            return cand.resolve()
    raise InputError(f"is not the Sia artifact: no {SIA_CONFIG_FILE} and traces/ in it or in its sia-simulator/ "
                     "folder", file=str(p), field=field)


def workload_path(root: Path, name: str) -> Path:
    """``workloads/<name>.csv`` under ``root``; ``name`` like ``philly/workload-1``."""
    parts = name.split("/")
    if not name or any(not _NAME.fullmatch(s) or s in (".", "..") for s in parts):
        raise InputError(f"bad Sia workload name {show_text(name)}: use TRACE/WORKLOAD, e.g. philly/workload-1",
                         field="--instance")
    if any(len(s) + 4 > MAX_NAME_PART for s in parts):
        raise InputError(f"bad Sia workload name {show_text(name)}: a part of it is longer than a file name may be "
                         f"({MAX_NAME_PART - 4} characters)", field="--instance")
    p = root / "workloads" / (name if name.endswith(".csv") else name + ".csv")
    try:
        there = os.path.lexists(p)          # (a pipe or a link loop there: the reader refuses it by name)
    except OSError as e:
        raise InputError(f"cannot look for the workload: {e.strerror or e}", file=str(p), field="--instance") from None
    if not there:
        near = sorted(q.relative_to(root / "workloads").with_suffix("").as_posix()
                      for q in (root / "workloads" / parts[0]).glob("*.csv")) if len(parts) > 1 else []
        hint = f"; in {parts[0]}/: {', '.join(near[:12])}{' ...' if len(near) > 12 else ''}" if near else \
            f"; traces: {', '.join(list_traces(root)) or '(none)'}"
        raise InputError(f"no Sia workload {name!r}{hint}", file=str(p), field="--instance")
    return p


def show_text(s: str, limit: int = 80) -> str:
    """``s`` quoted, its middle cut when long (a 5,000-character name is not echoed)."""
    return repr(s) if len(s) <= limit else f"{s[:limit // 2]!r}...{s[-limit // 4:]!r} ({len(s):,} characters)"


def list_traces(root: Path) -> list[str]:
    w = root / "workloads"
    return sorted(q.name for q in w.iterdir() if q.is_dir()) if w.is_dir() else []


def list_workloads(root: Path, trace: str) -> list[str]:
    """``trace/workload-N`` names of one trace folder, in numeric order."""
    d = root / "workloads" / trace
    if not d.is_dir():
        raise InputError(f"no Sia trace folder {trace!r}; traces: {', '.join(list_traces(root)) or '(none)'}",
                         file=str(d), field="--instance")

    def key(q: Path):
        m = re.search(r"(\d+)$", q.stem)
        return (q.stem[: m.start()] if m else q.stem, int(m.group(1)) if m else -1)
    return [f"{trace}/{q.stem}" for q in sorted(d.glob("*.csv"), key=key)]


# -- Python settings files, read with ast ---------------------------------------------

def _parse_python(path: Path) -> ast.Module:
    text = read_text(path, "Python settings")
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise InputError(f"not valid Python: {e.msg}", file=str(path), line=e.lineno) from None
    except (ValueError, RecursionError, MemoryError) as e:      # a NUL byte; nesting past the parser's stack
        raise InputError(f"not valid Python: {type(e).__name__}: {e}", file=str(path)) from None


class NotLiteral:
    """What the importer cannot read without running the file: a name's last assignment
    that is not a literal, or code that changes it (``what``)."""

    def __init__(self, what: str):
        self.what = what


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return NotLiteral("a value computed when Python runs the file")


def _changed_names(node: ast.AST) -> list[tuple[str, int, str]]:
    """(name, line, how) for every module-level name that code in ``node`` (a statement
    other than ``NAME = value``) assigns or changes: in a block, by augmented or item
    assignment, by a method call (``SLOWDOWNS.update(...)``); functions and classes are
    not run at import and are not looked into."""
    out = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        targets: list[ast.AST] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, (ast.AugAssign, ast.NamedExpr, ast.For, ast.AsyncFor, ast.comprehension)) or \
                (isinstance(n, ast.AnnAssign) and n.value is not None):
            targets = [n.target]
        elif isinstance(n, ast.Delete):
            targets = list(n.targets)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
            out.append((n.func.value.id, n.lineno, f"a call of {n.func.value.id}.{n.func.attr}(...)"))
        while targets:
            tg = targets.pop()
            if isinstance(tg, (ast.Tuple, ast.List)):
                targets.extend(tg.elts)
                continue
            if isinstance(tg, ast.Starred):
                targets.append(tg.value)
                continue
            while isinstance(tg, (ast.Subscript, ast.Attribute)):
                tg = tg.value
            if isinstance(tg, ast.Name):
                out.append((tg.id, getattr(n, "lineno", 0), "an assignment the importer does not read"))
        todo.extend(ast.iter_child_nodes(n))
    return out


def _literals(tree: ast.Module) -> dict[str, tuple[Any, int]]:
    """Module-level ``NAME = literal`` assignments: name -> (value, line); the last wins.
    A name whose last assignment is not a literal, or that other code changes, maps to a
    ``NotLiteral`` (refused where the name is read: an earlier literal would be wrong)."""
    out: dict[str, tuple[Any, int]] = {}
    for node in tree.body:
        names = [tg.id for tg in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(tg, ast.Name)]
        plain = isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and names and \
            len(names) == len(getattr(node, "targets", [None]))
        if plain:
            value = _literal(node.value)            # type: ignore[arg-type]
            for name in names:
                out[name] = (value, node.lineno)
            continue
        for name, line, how in _changed_names(node):
            out[name] = (NotLiteral(how), line)
    return out


def _read(lit: dict[str, tuple[Any, int]], name: str, path: Path) -> tuple[Any, int]:
    """``lit[name]``, refused when the importer cannot know its value without running the file."""
    value, line = lit[name]
    if isinstance(value, NotLiteral):
        raise InputError(f"its last assignment is {value.what}: the importer reads literal values only (nothing of "
                         "the file is run), and an earlier one would not be the value the artifact runs with",
                         file=str(path), line=line, field=name)
    return value, line


def _count_map(value: Any, path: Path, line: int, name: str, minimum: int = 1) -> dict[str, int]:
    if not isinstance(value, dict) or not value:
        raise InputError("must be a non-empty dict of cluster name -> count", file=str(path), line=line, field=name)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise InputError(f"entry {k!r}: {v!r} is not an integer >= {minimum}", file=str(path), line=line,
                             field=name)
        out[k] = v
    return out


def load_config(root: Path) -> SiaConfig:
    path = root / SIA_CONFIG_FILE
    lit = _literals(_parse_python(path))
    for name in _REQUIRED_CONFIG:
        if name not in lit:
            raise InputError("missing (a module-level assignment of a literal dict)", file=str(path), field=name)
    nodes = _count_map(*_read(lit, "cluster_nnodes", path), path, "cluster_nnodes")
    per_node = _count_map(*_read(lit, "cluster_ngpus_per_node", path), path, "cluster_ngpus_per_node")
    phys = _count_map(*_read(lit, "cluster_max_physical_nnodes", path), path, "cluster_max_physical_nnodes")
    for c in nodes:
        line = lit["cluster_nnodes"][1]
        if c not in SIA_GPU_TYPES:
            raise InputError(f"GPU cluster {c!r} has no GPU type in our catalog; known: "
                             f"{', '.join(sorted(SIA_GPU_TYPES))}", file=str(path), line=line, field="cluster_nnodes")
        for name, table in (("cluster_ngpus_per_node", per_node), ("cluster_max_physical_nnodes", phys)):
            if c not in table:
                raise InputError(f"no entry for GPU cluster {c!r} (simulated in cluster_nnodes)", file=str(path),
                                 line=lit[name][1], field=name)
        if per_node[c] > MAX_PLACEMENT_DIGIT:
            raise InputError(f"{per_node[c]} GPUs per node in {c!r}: placements write GPUs per node as one "
                             f"digit, at most {MAX_PLACEMENT_DIGIT}", file=str(path),
                             line=lit["cluster_ngpus_per_node"][1], field="cluster_ngpus_per_node")
    types = [SIA_GPU_TYPES[c] for c in nodes]
    if len(set(types)) != len(types):
        raise InputError(f"two simulated GPU clusters map to one GPU type ({dict(zip(nodes, types))})",
                         file=str(path), line=lit["cluster_nnodes"][1], field="cluster_nnodes")
    total = sum(n * per_node[c] for c, n in nodes.items())
    if total > MAX_CLUSTER_GPUS:
        raise InputError(f"the simulated cluster would have {total:,} GPUs, more than the {MAX_CLUSTER_GPUS:,} "
                         "supported (instances.cluster.MAX_CLUSTER_GPUS)", file=str(path),
                         line=lit["cluster_nnodes"][1], field="cluster_nnodes")
    raw_slow, line = _read(lit, "SLOWDOWNS", path)
    if not isinstance(raw_slow, dict):
        raise InputError("must be a dict of application -> slowdown", file=str(path), line=line, field="SLOWDOWNS")
    slow = {}
    for k, v in raw_slow.items():
        if not isinstance(k, str):
            raise InputError(f"entry {k!r}: an application name is a string", file=str(path), line=line,
                             field="SLOWDOWNS")
        slow[k] = SIA_SLOWDOWN.check(v, file=str(path), line=line, field="SLOWDOWNS", what=f"entry {k!r}: ")
    params = {}
    for name in _SIA_PARAMS:
        if name in lit:
            v, line = _read(lit, name, path)
            bound = SIA_PARAM_BOUNDS.get(name, Range(-math.inf, math.inf))
            params[name] = bound.check(v, file=str(path), line=line, field=name)
    p_val = params.get("sia_default_p_val", SIA_DEFAULTS["sia_default_p_val"])
    lam = params.get("sia_default_lambda_n", SIA_DEFAULTS["sia_default_lambda_n"])
    pair = "sia_default_lambda_n" if "sia_default_lambda_n" in lit else "sia_default_p_val"
    if pair in lit:
        check_sia_pair(p_val, lam, file=str(path), line=lit[pair][1], field=pair)
    return SiaConfig(nodes, per_node, phys, slow, params)


_SETTING_KEYS = {f for f in AppSettings.__dataclass_fields__ if f != "rescale_time_s"}


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _trace_dir_name(call: ast.Call) -> str | None:
    """``os.path.join(TRACES_DIR, "bert")`` or ``"traces/bert"``: the last string part."""
    if not call.args:
        return None
    a = call.args[0]
    strings = [n.value for n in ast.walk(a) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return Path(strings[-1]).name if strings else None


_OVERRIDES = ("rescale_time", "max_local_bsz", "min_local_bsz", "max_batch_size", "init_batch_size")


def _name_overrides(tree: ast.Module) -> dict[tuple[str, str | None], dict[str, tuple[Any, int]]]:
    """``if self.name == "A" [and cluster_suffix == "C"]: self.X = literal`` (elif chains
    included), and a chain's final ``else: self.X = literal`` as the default (app None):
    (value, line) per attribute; an attribute the importer reads (``_OVERRIDES``) set to
    something that is not a literal maps to a ``NotLiteral`` (refused where it is read)."""
    out: dict[tuple[str, str | None], dict[str, tuple[Any, int]]] = {}

    def cond(test: ast.AST) -> tuple[str, str | None] | None:
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        app = cluster = None
        for p in parts:
            if not (isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], ast.Eq)
                    and isinstance(p.comparators[0], ast.Constant) and isinstance(p.comparators[0].value, str)):
                return None
            left = p.left
            if isinstance(left, ast.Attribute) and left.attr == "name":
                app = p.comparators[0].value
            elif isinstance(left, ast.Name) and left.id == "cluster_suffix":
                cluster = p.comparators[0].value
            else:
                return None
        return (app, cluster) if app is not None else None

    def assigns(body: list[ast.stmt]) -> dict[str, tuple[Any, int]]:
        got = {}
        for s in body:
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute):
                value = _literal(s.value)
                if not isinstance(value, NotLiteral) or s.targets[0].attr in _OVERRIDES:
                    got[s.targets[0].attr] = (value, s.lineno)
        return got

    seen: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or id(node) in seen:
            continue
        cur: ast.If | None = node
        while cur is not None:
            seen.add(id(cur))
            key = cond(cur.test)
            if key is None:
                break
            got = assigns(cur.body)
            if got:
                out.setdefault((key[0], key[1]), {}).update(got)
            if len(cur.orelse) == 1 and isinstance(cur.orelse[0], ast.If):
                cur = cur.orelse[0]
            else:
                default = assigns(cur.orelse)
                if default:
                    for attr, v in default.items():
                        out.setdefault(("", None), {}).setdefault(attr, v)
                cur = None
    return out


def load_app_settings(root: Path) -> dict[str, dict[str, AppSettings]]:
    """application -> GPU cluster -> settings, from ``applications.py``."""
    path = root / SIA_APPLICATIONS_FILE
    tree = _parse_python(path)
    table = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "APPLICATIONS"
                                                for t in node.targets):
            table = node
    if table is None or not isinstance(table.value, ast.Dict):
        raise InputError("no APPLICATIONS = {cluster: {application: Application(...)}} table", file=str(path),
                         field="APPLICATIONS")
    overrides = _name_overrides(tree)
    default_restart = overrides.get(("", None), {}).get("rescale_time", (AppSettings.rescale_time_s, None))
    out: dict[str, dict[str, AppSettings]] = {}
    for ck, cv in zip(table.value.keys, table.value.values):
        if not (isinstance(ck, ast.Constant) and isinstance(ck.value, str) and isinstance(cv, ast.Dict)):
            raise InputError("APPLICATIONS must map cluster names to dicts", file=str(path),
                             line=getattr(ck, "lineno", None), field="APPLICATIONS")
        cluster = ck.value
        for ak, av in zip(cv.keys, cv.values):
            kind = _call_name(av)
            if not (isinstance(ak, ast.Constant) and isinstance(ak.value, str)) or kind is None:
                raise InputError("an entry is not \"name\": Application(...)", file=str(path),
                                 line=getattr(av, "lineno", None), field=f"APPLICATIONS[{cluster!r}]")
            assert isinstance(av, ast.Call)
            app = _trace_dir_name(av) or ak.value
            kw: dict[str, Any] = {}
            for k in av.keywords:
                if k.arg in _SETTING_KEYS:
                    try:
                        kw[k.arg] = ast.literal_eval(k.value)
                    except (ValueError, TypeError, SyntaxError):
                        raise InputError(f"{k.arg} is not a literal", file=str(path), line=k.value.lineno,
                                         field=f"APPLICATIONS[{cluster!r}][{ak.value!r}]") from None
            if kind == "PMPApplication" and "num_stages" not in kw:
                kw["num_stages"] = 2
            own = {**overrides.get((app, None), {}), **overrides.get((app, cluster), {})}
            restart, restart_line = own.get("rescale_time", default_restart)
            lines = {}
            for attr in ("max_local_bsz", "min_local_bsz", "max_batch_size", "init_batch_size"):
                if attr in own and attr not in kw:
                    kw[attr], lines[attr] = own[attr]
            for attr, (v, line) in [*((a, own[a]) for a in lines), ("rescale_time", (restart, restart_line))]:
                if isinstance(v, NotLiteral):
                    raise InputError(f"self.{attr} of {app!r} is {v.what}: the importer reads literal values only",
                                     file=str(path), line=line, field=attr)
            restart_s = RESTART_S.check(restart, file=str(path), line=restart_line, field="rescale_time",
                                        what=f"rescale_time of {app!r}: ")
            try:
                s = AppSettings(**kw, rescale_time_s=restart_s)
            except TypeError as e:
                raise InputError(str(e), file=str(path), line=av.lineno, field=f"APPLICATIONS[{cluster!r}]") from None
            for f in ("max_epochs", "max_batch_size", "init_batch_size", "min_local_bsz", "max_local_bsz"):
                v = getattr(s, f)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                    raise InputError(f"{f} must be a positive integer, got {show_number(v)}", file=str(path),
                                     line=lines.get(f, av.lineno), field=f"APPLICATIONS[{cluster!r}][{ak.value!r}]")
                if v is not None:
                    (Range(1, MAX_ITERATIONS, integer=True) if f == "max_epochs" else BATCH).check(
                        v, file=str(path), line=lines.get(f, av.lineno), what=f"{f} ",
                        field=f"APPLICATIONS[{cluster!r}][{ak.value!r}]")
            out.setdefault(app, {})[cluster] = s
    return out


def load_restart_penalties(root: Path) -> tuple[dict[str, float], float]:
    """``get_restart_penalty`` of ``sia.py``: (substring -> seconds in order, default)."""
    path = root / SIA_POLICY_FILE
    tree = _parse_python(path)
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_restart_penalty"),
              None)
    if fn is None:
        raise InputError("no get_restart_penalty function", file=str(path), field="get_restart_penalty")
    table: dict[str, float] = {}
    default = None

    def value(body: list[ast.stmt]) -> int | float | None:
        for s in body:
            if isinstance(s, ast.Return) and isinstance(s.value, ast.Constant) \
                    and isinstance(s.value.value, (int, float)) and not isinstance(s.value.value, bool):
                return s.value.value            # (checked against RESTART_S where it is kept)
        return None

    for node in fn.body:
        cur: Any = node
        while isinstance(cur, ast.If):
            t = cur.test
            if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.In)
                    and isinstance(t.left, ast.Constant) and isinstance(t.left.value, str)):
                raise InputError("get_restart_penalty: expected `if \"name\" in jobname: return N` branches",
                                 file=str(path), line=cur.lineno, field="get_restart_penalty")
            v = value(cur.body)
            if v is None:
                raise InputError("a branch does not return a number", file=str(path), line=cur.lineno,
                                 field="get_restart_penalty")
            table.setdefault(t.left.value, RESTART_S.check(v, file=str(path), line=cur.lineno,
                                                           field="get_restart_penalty",
                                                           what=f"the penalty of {t.left.value!r}: "))
            if len(cur.orelse) == 1 and isinstance(cur.orelse[0], ast.If):
                cur = cur.orelse[0]
            else:
                default = value(cur.orelse) if cur.orelse else default
                cur = None
        if isinstance(node, ast.Return):
            default = value([node])
    if default is None:
        raise InputError("no default return value", file=str(path), line=fn.lineno, field="get_restart_penalty")
    return table, RESTART_S.check(default, file=str(path), line=fn.lineno, field="get_restart_penalty",
                                  what="the default penalty: ")


# -- CSV profiles -----------------------------------------------------------------------

def _csv(path: Path, columns: tuple[str, ...], what: str) -> CsvRows:
    return CsvRows(read_text(path, what), str(path), columns)


def _placement_id(rows: CsvRows, rec, line: int) -> tuple[int, int, int]:
    s = rows.raw(rec, "placement").strip()
    if s.endswith(".0"):
        s = s[:-2]
    if not s.isdigit() or s.startswith("0"):
        raise rows.err(line, "placement", f"not a placement (GPUs per node as digits 1-9, e.g. 44): {show_text(s)}")
    if len(s) > MAX_PLACEMENT_NODES:
        raise rows.err(line, "placement", f"a placement over {len(s):,} nodes: at most {MAX_PLACEMENT_NODES} (one "
                                          "digit per node; the artifact's span at most 16)")
    digits = [int(c) for c in s]
    if 0 in digits:
        raise rows.err(line, "placement", f"a node with 0 GPUs in placement {s!r}")
    return int(s), len(digits), sum(digits)


def load_profile(app_dir: Path, cluster: str) -> ThroughputProfile:
    pf = app_dir / f"placements-{cluster}.csv"
    sf = app_dir / f"scalability-{cluster}.csv"
    rows = _csv(pf, PLACEMENT_COLUMNS, "placements profile")
    pl: list[tuple] = []
    for line, rec in rows:
        pid, n, r = _placement_id(rows, rec, line)
        b = rows.bounded(rec, line, "local_bsz", BATCH)
        st = rows.bounded(rec, line, "step_time", STEP_TIME_S)
        sy = rows.bounded(rec, line, "sync_time", SYNC_TIME_S)
        pl.append((pid, n, r, b, st, sy))
    if not pl:
        raise InputError("no rows", file=str(pf))
    srows = _csv(sf, SCALABILITY_COLUMNS, "scalability profile")
    sc: list[tuple] = []
    for line, rec in srows:
        n = srows.bounded(rec, line, "num_nodes", GPU_COUNT)
        r = srows.bounded(rec, line, "num_replicas", GPU_COUNT)
        if r < n:
            raise srows.err(line, "num_replicas", f"{r} replicas on {n} nodes: fewer than one per node")
        b = srows.bounded(rec, line, "local_bsz", BATCH)
        st = srows.bounded(rec, line, "step_time", STEP_TIME_S)
        sy = srows.bounded(rec, line, "sync_time", SYNC_TIME_S)
        sc.append((n, r, b, st, sy))
    p = np.array(pl, dtype=float)
    s = np.array(sc, dtype=float).reshape(-1, 5)
    pids = np.array([row[0] for row in pl], dtype=np.int64)      # (exact: not through a float)
    return ThroughputProfile(str(pf), pids, p[:, 1].astype(np.int64), p[:, 2].astype(np.int64),
                             p[:, 3].astype(np.int64), p[:, 4], p[:, 5], str(sf), s[:, 0].astype(np.int64),
                             s[:, 1].astype(np.int64), s[:, 2].astype(np.int64), s[:, 3], s[:, 4])


def load_validation(app_dir: Path) -> tuple[ValidationCurve, ...]:
    curves = []
    for path in sorted(app_dir.glob("validation-*.csv")):
        m = re.fullmatch(r"validation-(\d+)\.csv", path.name)
        if not m:
            raise InputError("validation file names are validation-<batch size>.csv", file=str(path))
        batch = BATCH.check(m.group(1), file=str(path), field="batch size", what="the batch size its name gives ")
        rows = _csv(path, VALIDATION_COLUMNS, "validation curve")
        data = []
        for line, rec in rows:
            data.append((rows.bounded(rec, line, "progress", PROGRESS),
                         rows.float(rec, line, "iteration", minimum=0.0),
                         rows.float(rec, line, "metric", minimum=None),
                         rows.bounded(rec, line, "grad_sqr", GRADIENT_STAT),
                         rows.bounded(rec, line, "grad_var", GRADIENT_STAT)))
            if not data[-1][0] > (data[-2][0] if len(data) > 1 else 0.0):
                raise rows.err(line, "progress", "must increase from one epoch to the next (and be above 0 at the "
                                                 "first: an epoch's end is the progress its row gives)")
        if not data:
            raise InputError("no rows (one per epoch)", file=str(path))
        a = np.array(data, dtype=float)
        curves.append(ValidationCurve(int(batch), a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]))
    if not curves:
        raise InputError("no validation-<batch size>.csv curves", file=str(app_dir))
    curves.sort(key=lambda c: c.batch_size)
    return tuple(curves)


def load_application(root: Path, name: str, settings: dict[str, AppSettings],
                     clusters: list[str]) -> SiaApplication:
    app_dir = root / "traces" / name
    if not app_dir.is_dir():
        raise InputError(f"no profiles for application {name!r}", file=str(app_dir))
    profiles = {c: load_profile(app_dir, c) for c in clusters}
    validation = load_validation(app_dir)
    n_epochs = min(len(c.progress) for c in validation)
    for c in clusters:
        s = settings[c]
        if s.max_epochs is not None and s.max_epochs > n_epochs:
            raise InputError(f"max_epochs {s.max_epochs} of {name!r} on {c!r} exceeds the {n_epochs} epochs its "
                             "validation curves hold", file=str(app_dir / "validation-*.csv"), field="max_epochs")
        # the artifact asserts it (applications.py): no configuration could run the job
        max_batch = s.max_batch_size or validation[-1].batch_size
        min_local = s.min_local_bsz or int(profiles[c].local_bsz.min())
        if max_batch < min_local:
            raise InputError(f"{name!r} on {c!r}: its largest batch {max_batch} is below its smallest per-GPU batch "
                             f"{min_local}, so no configuration could run it (the artifact asserts max_batch_size >= "
                             "min_local_bsz)", file=str(root / SIA_APPLICATIONS_FILE), field="max_batch_size")
    return SiaApplication(name, {c: settings[c] for c in clusters}, profiles, validation)


# -- the artifact ---------------------------------------------------------------------

@lru_cache(maxsize=4)
def _load(root: Path) -> SiaArtifact:
    config = load_config(root)
    settings = load_app_settings(root)
    penalties, default = load_restart_penalties(root)
    return SiaArtifact(root, config, {}, penalties, default, settings)


def load_artifact(path: str | Path) -> SiaArtifact:
    """The artifact at ``path`` (its config and settings; applications load on demand,
    ``application``)."""
    return _load(artifact_root(path))


def forget_loaded() -> None:
    """Forget the artifacts read so far: the next ``load_artifact`` of each reads its
    files again (after they were edited in place)."""
    _load.cache_clear()


def application(art: SiaArtifact, name: str) -> SiaApplication:
    """Application ``name``'s profiles on the simulated GPU clusters (read once)."""
    if name not in art.applications:
        if name not in art.app_settings:
            raise InputError(f"application {name!r} is not in APPLICATIONS; known: "
                             f"{', '.join(sorted(art.app_settings))}", file=str(art.root / SIA_APPLICATIONS_FILE),
                             field="application")
        clusters = list(art.config.nodes)
        missing = [c for c in clusters if c not in art.app_settings[name]]
        if missing:
            raise InputError(f"application {name!r} has no entry for GPU cluster(s) {', '.join(missing)}",
                             file=str(art.root / SIA_APPLICATIONS_FILE), field="APPLICATIONS")
        if any(art.app_settings[name][c].num_stages > 1 for c in clusters):
            raise InputError(f"application {name!r} is pipeline-parallel (PMPApplication): not supported by this "
                             "importer", file=str(art.root / SIA_APPLICATIONS_FILE), field="application")
        if name not in art.config.slowdowns:
            raise InputError(f"no calibration slowdown for application {name!r}",
                             file=str(art.root / SIA_CONFIG_FILE), field="SLOWDOWNS")
        art.applications[name] = load_application(art.root, name, art.app_settings[name], clusters)
    return art.applications[name]


def load_workload(art: SiaArtifact, name: str) -> list[WorkloadRow]:
    path = art.workload_path(name)
    rows = _csv(path, WORKLOAD_COLUMNS, "Sia workload")
    gpus = sum(n * art.config.gpus_per_node[c] for c, n in art.config.nodes.items())
    out: list[WorkloadRow] = []
    seen: set[str] = set()
    for line, rec in rows:
        jn = rows.raw(rec, "name").strip()
        if not jn:
            raise rows.err(line, "name", "empty job name")
        if jn in seen:
            raise rows.err(line, "name", f"duplicate job name {jn!r}")
        seen.add(jn)
        t = rows.time(rec, line, "time", minimum=0.0)
        app = rows.raw(rec, "application").strip()
        if app not in art.app_settings:
            raise rows.err(line, "application", f"unknown application {app!r}; known: "
                                                f"{', '.join(sorted(art.app_settings))}")
        try:
            application(art, app)
        except InputError as e:        # a profile's own error names its file; a refused application this line
            if e.file is not None and Path(e.file).name in (SIA_APPLICATIONS_FILE, SIA_CONFIG_FILE):
                raise InputError(f"{e.reason} ({Path(e.file).name})", file=str(path), line=line,
                                 field="application") from None
            raise
        r = int(rows.bounded(rec, line, "num_replicas", Range(1, gpus, f"the simulated cluster's {gpus} GPUs "
                                                                        f"({SIA_CONFIG_FILE})", integer=True)))
        b = int(rows.bounded(rec, line, "batch_size", BATCH))
        assert t is not None
        out.append(WorkloadRow(jn, t, app, r, b, line))
    if not out:
        raise InputError("no jobs", file=str(path))
    return out


def gpu_types(config: SiaConfig) -> dict[str, str]:
    """GPU cluster -> catalog GPU type (checked against the catalog)."""
    return {c: canonical_gpu_name(SIA_GPU_TYPES[c]) for c in config.nodes}
