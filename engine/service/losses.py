"""Loss curves of the service's jobs, read from each run folder's ``results.jsonl`` (one
line per step the ranks trained) and kept between requests.

The status page polls every job's curve every two seconds; parsing every file again for
each poll cost 2.7 s for 200 jobs of 2,000 steps (``bench/bench_views.py``). A
``LossLog`` parses each file once and then only the lines appended since (complete lines:
a line being written is read at the next call), keeps the points in compact arrays, and
forgets the least recently read files beyond ``max_points`` points in all. A file that
shrank or was replaced is read again from its start. Reading stops at the first line
that is not JSON, as ``launcher.launch.read_jsonl`` does.
"""
from __future__ import annotations

import json
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from launcher.launch import RESULTS_FILE

MAX_POINTS = 2_000_000            # points kept in all (24 bytes each), least recently read files forgotten first


@dataclass
class _File:
    ident: tuple[int, int]                 # (device, inode): a replaced file is read again
    offset: int = 0                        # bytes consumed (up to the last complete line)
    stuck: bool = False                    # a complete line that is not JSON: nothing after it is read
    steps: array = field(default_factory=lambda: array("q"))
    losses: array = field(default_factory=lambda: array("d"))
    times: array = field(default_factory=lambda: array("d"))   # nan: the line had no time


class LossLog:
    """Per run folder: (steps, losses, times) of the lines with a step and a loss."""

    def __init__(self, max_points: int = MAX_POINTS):
        if max_points < 0:
            raise ValueError(f"max_points must be >= 0, got {max_points}")
        self.max_points = max_points
        self._files: OrderedDict[str, _File] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()      # the API answers requests on a pool of threads

    def points(self, run_dir: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the folder's steps, losses and times (nan where the line had none)."""
        path = str(Path(run_dir) / RESULTS_FILE)
        with self._lock:
            f = self._update(path)
            if f is None:
                return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
            out = (np.array(f.steps, dtype=np.int64), np.array(f.losses), np.array(f.times))
            self._forget()
        return out

    @property
    def points_held(self) -> int:
        """The points kept now, over all files: at most ``max_points``, unless the file
        read last alone holds more."""
        with self._lock:
            return self._held

    @property
    def files_held(self) -> tuple[str, ...]:
        """The results files whose points are kept, least recently read first (forgotten
        first)."""
        with self._lock:
            return tuple(self._files)

    def _update(self, path: str) -> _File | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._drop(path)
            return None
        ident = (st.st_dev, st.st_ino)
        f = self._files.get(path)
        if f is None or f.ident != ident or st.st_size < f.offset:
            self._drop(path)
            f = _File(ident)
            self._files[path] = f
        self._files.move_to_end(path)
        if f.stuck or st.st_size == f.offset:
            return f
        with open(path, "rb") as fh:
            fh.seek(f.offset)
            chunk = fh.read(st.st_size - f.offset)
        end = chunk.rfind(b"\n") + 1                # complete lines only
        consumed = 0
        for line in chunk[:end].splitlines(keepends=True):
            text = line.strip()
            if text:
                try:
                    r = json.loads(text)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    f.stuck = True
                    break
                if isinstance(r, dict) and "step" in r and "loss" in r:
                    t = r.get("time")
                    f.steps.append(int(r["step"]))
                    f.losses.append(float(r["loss"]))
                    f.times.append(float(t) if t is not None else float("nan"))
                    self._held += 1
            consumed += len(line)
        f.offset += consumed
        return f

    def _drop(self, path: str) -> None:
        f = self._files.pop(path, None)
        if f is not None:
            self._held -= len(f.steps)

    def _forget(self) -> None:
        while self._held > self.max_points and len(self._files) > 1:
            self._drop(next(iter(self._files)))


def merged(log: LossLog, dirs: list[tuple[int, Path]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, losses, times, launch) over the run folders in launch order, by step; a step
    trained again after a restart from an earlier checkpoint replaces the earlier one."""
    parts = [(log.points(d), g) for g, d in dirs]
    parts = [(p, g) for p, g in parts if len(p[0])]
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    steps = np.concatenate([p[0] for p, _ in parts])
    losses = np.concatenate([p[1] for p, _ in parts])
    times = np.concatenate([p[2] for p, _ in parts])
    launch = np.concatenate([np.full(len(p[0]), g, dtype=np.int64) for p, g in parts])
    # the last occurrence of each step wins: unique over the reversed order, then sorted by step
    _, first_rev = np.unique(steps[::-1], return_index=True)
    keep = len(steps) - 1 - first_rev
    return steps[keep], losses[keep], times[keep], launch[keep]
