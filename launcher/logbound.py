"""Keep an append-only JSON-lines log bounded: the profile store's
``measured_runs.jsonl`` gains a record per step of every run and would grow without end.

``bound_jsonl(path, max_bytes)``: when the file is larger than ``max_bytes``, it is
rewritten (atomically: write + rename) with its newest whole lines that fit in half of
it, so it is trimmed rarely and the newest measurements -- what the estimators learn
from -- are kept. The launcher calls it once per launch, before training (rank 0).
A line another process appends between the read and the rename is lost: an accepted
approximation for a log of repeated measurements.
"""
from __future__ import annotations

import os
from pathlib import Path

MEASURED_RUNS_MAX_BYTES = 16 * 2**20       # ~45,000 measured-run records of ~370 bytes


def bound_jsonl(path: str | os.PathLike, max_bytes: int = MEASURED_RUNS_MAX_BYTES) -> int:
    """Trim ``path`` to its newest lines (at most ``max_bytes // 2`` bytes) when it exceeds
    ``max_bytes``; returns the number of lines dropped (0: nothing to do)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    path = Path(path)
    try:
        if path.stat().st_size <= max_bytes:
            return 0
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    if lines and not lines[-1].endswith(b"\n"):
        lines.pop()                     # a line being written right now
    kept, size = [], 0
    for line in reversed(lines):
        if size + len(line) > max_bytes // 2:
            break
        kept.append(line)
        size += len(line)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(b"".join(reversed(kept)))
    os.replace(tmp, path)
    return len(lines) - len(kept)
