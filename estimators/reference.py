"""The Arena measured table and DP-memory table, as rows the estimators use.

A thin view over ``instances.measurements`` (the one loader of the bundled data, with
file/line/field validation): ``MeasuredRow`` is its ``MeasuredIterTime``; the DP-memory
table is flattened to one ``DpMemRow`` per (model, batch, GPU count).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from instances.measurements import MeasuredIterTime as MeasuredRow
from instances.measurements import load_dp_memory as _load_dp_memory
from instances.measurements import load_measured_iter_times

__all__ = ["MeasuredRow", "DpMemRow", "load_measured", "load_dp_memory"]


def load_measured(path: str | Path | None = None) -> list[MeasuredRow]:
    return list(load_measured_iter_times(path))


@dataclass(frozen=True)
class DpMemRow:
    model: str
    global_batch: int
    num_gpus: int
    memory_bytes: float | None       # None: out of memory


def load_dp_memory(path: str | Path | None = None) -> list[DpMemRow]:
    """Arena's pure data-parallel memory table, one row per GPU count (bytes; None = OOM)."""
    return [DpMemRow(v.model, v.global_batch, n, b) for v in _load_dp_memory(path).values()
            for n, b in v.memory_bytes_by_gpus]
