"""Typed loaders for the measured tables of the Arena artifact (bundled under
``instances/data/arena``).

- ``measured_iter_times.csv``: iteration times of the best adaptive-parallel plan the
  Arena authors found, per (model, global batch, GPU type, nodes, GPUs per node);
  an empty ``iter_time_s`` means the job did not fit in memory.
- ``dp_mem.json``: per (model, size, global batch), the memory (GB) used under pure data
  parallelism on 1, 2, 4, 8 and 16 GPUs; ``-1`` means out of memory.

Names are canonicalised: Arena's ``bert`` family is our ``gpt``, ``a100`` is
``a100-40gb`` and ``v100`` is ``v100-32gb`` (instances.gpus.ALIASES).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import InputError
from .gpus import canonical_gpu_name
from .models import canonical_model_name
from .structured import loads_json

GB = 10**9
ITER_TIMES_COLUMNS = ("model", "size", "global_batch", "gpu_type", "num_nodes", "gpus_per_node",
                      "iter_time_s")
DP_MEMORY_GPU_COUNTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class MeasuredIterTime:
    """One measured row; ``iter_time_s is None``: out of memory."""
    model: str              # canonical catalog name, e.g. "gpt__1.3B"
    global_batch: int
    gpu_type: str           # canonical catalog name, e.g. "a100-40gb"
    num_nodes: int
    gpus_per_node: int
    iter_time_s: float | None

    def __post_init__(self):
        if self.global_batch < 1 or self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"measured row {self}: batch, nodes and GPUs per node must be >= 1")
        if self.iter_time_s is not None and not (math.isfinite(self.iter_time_s) and self.iter_time_s > 0):
            raise ValueError(f"measured row {self}: iter_time_s must be a positive finite number or None")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def key(self) -> tuple[str, int, str, int, int]:
        return (self.model, self.global_batch, self.gpu_type, self.num_nodes, self.gpus_per_node)

    @property
    def feasible(self) -> bool:
        return self.iter_time_s is not None


@dataclass(frozen=True)
class DpMemory:
    """Memory under pure data parallelism for one (model, global batch)."""
    model: str
    global_batch: int
    memory_bytes_by_gpus: tuple[tuple[int, float | None], ...]   # (GPU count, bytes or None = OOM)

    def memory_bytes(self, num_gpus: int) -> float | None:
        for n, m in self.memory_bytes_by_gpus:
            if n == num_gpus:
                return m
        raise KeyError(f"{self.model} batch {self.global_batch}: no data-parallel memory for {num_gpus} GPUs")


def _data_path(name: str):
    return resources.files("instances").joinpath(f"data/arena/{name}")


def _read_text(path, label: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", file=label) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text: {e.reason}", file=label) from None


def parse_measured_iter_times(text: str, label: str) -> tuple[MeasuredIterTime, ...]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise InputError("empty file", file=label, line=1)
    header = [h.strip() for h in header]
    missing = [c for c in ITER_TIMES_COLUMNS if c not in header]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", file=label, line=1, field=missing[0])
    idx = {c: header.index(c) for c in ITER_TIMES_COLUMNS}
    rows: list[MeasuredIterTime] = []
    seen: dict[tuple, int] = {}
    for lineno, rec in enumerate(reader, start=2):
        if not rec or all(not x.strip() for x in rec):
            continue
        if len(rec) != len(header):
            raise InputError(f"expected {len(header)} fields, got {len(rec)}", file=label, line=lineno)
        get = lambda c: rec[idx[c]].strip()  # noqa: E731
        try:
            model = canonical_model_name(f"{get('model')}__{get('size')}")
        except InputError as e:
            raise InputError(e.reason, file=label, line=lineno, field="model") from None
        try:
            gpu = canonical_gpu_name(get("gpu_type"))
        except InputError as e:
            raise InputError(e.reason, file=label, line=lineno, field="gpu_type") from None
        ints = {}
        for c in ("global_batch", "num_nodes", "gpus_per_node"):
            try:
                ints[c] = int(get(c))
            except ValueError:
                raise InputError(f"not an integer: {get(c)!r}", file=label, line=lineno, field=c) from None
            if ints[c] < 1:
                raise InputError(f"must be >= 1, got {ints[c]}", file=label, line=lineno, field=c)
        raw_t = get("iter_time_s")
        t: float | None = None
        if raw_t:
            try:
                t = float(raw_t)
            except ValueError:
                raise InputError(f"not a number: {raw_t!r}", file=label, line=lineno, field="iter_time_s") from None
            if not (math.isfinite(t) and t > 0):
                raise InputError(f"must be a positive finite time, got {raw_t!r}", file=label, line=lineno,
                                 field="iter_time_s")
        row = MeasuredIterTime(model, ints["global_batch"], gpu, ints["num_nodes"], ints["gpus_per_node"], t)
        if row.key in seen:
            raise InputError(f"duplicate measurement of {row.key} (first on line {seen[row.key]})",
                             file=label, line=lineno)
        seen[row.key] = lineno
        rows.append(row)
    return tuple(rows)


@lru_cache(maxsize=8)
def _load_iter_times_cached(path: str | None) -> tuple[MeasuredIterTime, ...]:
    if path is None:
        src, label = _data_path("measured_iter_times.csv"), "instances/data/arena/measured_iter_times.csv"
    else:
        src, label = Path(path), path
    return parse_measured_iter_times(_read_text(src, label), label)


def load_measured_iter_times(path: str | Path | None = None) -> tuple[MeasuredIterTime, ...]:
    """The measured iteration-time table (the bundled Arena one by default)."""
    return _load_iter_times_cached(None if path is None else str(path))


def parse_dp_memory(text: str, label: str) -> dict[tuple[str, int], DpMemory]:
    raw = loads_json(text, file=label)
    if isinstance(raw, list) and len(raw) == 1:
        raw = raw[0]
    if not isinstance(raw, dict):
        raise InputError("expected an object {model_size_batch: [5 numbers]}", file=label)
    out: dict[tuple[str, int], DpMemory] = {}
    for key, values in raw.items():
        stem, _, batch = key.rpartition("_")
        family, _, size = stem.rpartition("_")
        try:
            model = canonical_model_name(f"{family}__{size}")
            b = int(batch)
        except (InputError, ValueError):
            raise InputError(f"key {key!r} is not <model>_<size>_<batch> of a known model",
                             file=label, field=key) from None
        if not isinstance(values, list) or len(values) != len(DP_MEMORY_GPU_COUNTS) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise InputError(f"expected {len(DP_MEMORY_GPU_COUNTS)} numbers", file=label, field=key)
        mem = tuple((n, None if v < 0 else float(v) * GB) for n, v in zip(DP_MEMORY_GPU_COUNTS, values))
        out[(model, b)] = DpMemory(model, b, mem)
    return out


@lru_cache(maxsize=8)
def _load_dp_cached(path: str | None) -> dict[tuple[str, int], DpMemory]:
    if path is None:
        src, label = _data_path("dp_mem.json"), "instances/data/arena/dp_mem.json"
    else:
        src, label = Path(path), path
    return parse_dp_memory(_read_text(src, label), label)


def load_dp_memory(path: str | Path | None = None) -> dict[tuple[str, int], DpMemory]:
    """Pure data-parallel memory per (canonical model, global batch); a fresh dict each call."""
    return dict(_load_dp_cached(None if path is None else str(path)))
