"""The Arena measured table and DP-memory table, as rows the estimators use.

Uses ``instances.measurements`` (the instances area's loader) when it is present, and
otherwise reads ``measured_iter_times.csv`` / ``dp_mem.json`` itself (same validation:
bad rows raise InputError naming file, line and field).
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from instances.errors import InputError
from instances.gpus import canonical_gpu_name
from instances.models import canonical_model_name

DEFAULT_DIR = Path(os.environ.get("ARENA_DATA_DIR", "/work/shared/data/arena"))


@dataclass(frozen=True)
class MeasuredRow:
    model: str
    global_batch: int
    gpu_type: str
    num_nodes: int
    gpus_per_node: int
    iter_time_s: float | None        # None: did not fit in memory

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


def _from_instances(rows) -> list[MeasuredRow]:
    out = []
    for r in rows:
        get = (lambda k: r[k]) if isinstance(r, dict) else (lambda k: getattr(r, k))
        out.append(MeasuredRow(get("model"), int(get("global_batch")), get("gpu_type"), int(get("num_nodes")),
                               int(get("gpus_per_node")), get("iter_time_s")))
    return out


def load_measured(path: str | Path | None = None) -> list[MeasuredRow]:
    if path is None:
        try:
            from instances.measurements import load_measured_iter_times  # type: ignore
        except ImportError:
            pass
        else:
            return _from_instances(load_measured_iter_times())
        path = DEFAULT_DIR / "measured_iter_times.csv"
    path = Path(path)
    if not path.exists():
        raise InputError("measured table not found (set ARENA_DATA_DIR)", file=str(path))
    out = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for line, r in enumerate(reader, start=2):
            try:
                model = canonical_model_name(f"{r['model']}__{r['size']}")
            except InputError as e:
                raise InputError(e.reason, file=str(path), line=line, field="model") from None
            try:
                gpu = canonical_gpu_name(r["gpu_type"])
            except InputError as e:
                raise InputError(e.reason, file=str(path), line=line, field="gpu_type") from None
            vals = {}
            for k in ("global_batch", "num_nodes", "gpus_per_node"):
                try:
                    vals[k] = int(r[k])
                    if vals[k] < 1:
                        raise ValueError
                except (TypeError, ValueError):
                    raise InputError(f"must be a positive integer, got {r[k]!r}", file=str(path), line=line,
                                     field=k) from None
            t = (r.get("iter_time_s") or "").strip()
            try:
                it = float(t) if t else None
                if it is not None and not it > 0:
                    raise ValueError
            except ValueError:
                raise InputError(f"must be a positive number or empty, got {t!r}", file=str(path), line=line,
                                 field="iter_time_s") from None
            out.append(MeasuredRow(model, vals["global_batch"], gpu, vals["num_nodes"], vals["gpus_per_node"], it))
    return out


DP_MEM_GPU_COUNTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class DpMemRow:
    model: str
    global_batch: int
    num_gpus: int
    memory_bytes: float | None       # None: out of memory


def load_dp_memory(path: str | Path | None = None) -> list[DpMemRow]:
    """Arena's pure data-parallel memory table (GB in the file; bytes here; -1 = OOM)."""
    if path is None:
        try:
            from instances.measurements import load_dp_memory as _load  # type: ignore
        except ImportError:
            pass
        else:
            return [DpMemRow(v.model, v.global_batch, n, b) for v in _load().values()
                    for n, b in v.memory_bytes_by_gpus]
    path = Path(path) if path is not None else DEFAULT_DIR / "dp_mem.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError("dp memory table not found", file=str(path)) from None
    if isinstance(raw, list):
        raw = raw[0]
    out = []
    for key, vals in raw.items():
        name, _, batch = key.rpartition("_")
        fam, _, size = name.rpartition("_")
        try:
            model = canonical_model_name(f"{fam}__{size}")
        except InputError as e:
            raise InputError(e.reason, file=str(path), field=key) from None
        if not isinstance(vals, list) or len(vals) != len(DP_MEM_GPU_COUNTS):
            raise InputError(f"expected {len(DP_MEM_GPU_COUNTS)} numbers", file=str(path), field=key)
        for n, v in zip(DP_MEM_GPU_COUNTS, vals):
            out.append(DpMemRow(model, int(batch), n, None if v < 0 else float(v) * 1e9))
    return out
