"""What the store's table groups share: the connection and its write transactions
(``Table``), the state-machine reads several groups check inside a transaction, and how
values are written (JSON, finite numbers, id lists under SQLite's parameter limit)."""
from __future__ import annotations

import json
import math
import sqlite3
from contextlib import AbstractContextManager
from typing import Callable, Iterable, Iterator

from instances.errors import InputError

from .rules import StaleGeneration


class Table:
    """A group of the state database's tables over the store's connection. ``_tx()``
    opens one write transaction holding the write lock and yields the time of the change
    (``Store._tx``); every method that changes state is one such transaction."""

    def __init__(self, conn: sqlite3.Connection, tx: Callable[[], AbstractContextManager[float]]):
        self.conn, self._tx = conn, tx

    def _history(self, job_id: int, frm: str | None, to: str, reason: str, now: float) -> None:
        self.conn.execute("INSERT INTO job_history(job_id, from_status, to_status, reason, at) VALUES (?, ?, ?, ?, ?)",
                          (job_id, frm, to, str(reason), now))

    def _job_status(self, job_id: int) -> str:
        row = self.conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise InputError(f"no job {job_id!r}", field="job_id")
        return row[0]

    def _latest_launch(self, job_id: int) -> tuple[int, str] | None:
        return self.conn.execute("SELECT generation, state FROM launches WHERE job_id = ? "
                                 "ORDER BY generation DESC LIMIT 1", (job_id,)).fetchone()

    def _current_launch_state(self, job_id: int, generation: int) -> str:
        """The state of ``generation`` if it is the job's latest launch, else ``StaleGeneration``."""
        latest = self._latest_launch(job_id)
        if latest is None or not isinstance(generation, int) or generation > latest[0] or generation < 1:
            self._job_status(job_id)                      # an unknown job says so
            raise InputError(f"job {job_id} has no launch {generation!r}", field="generation")
        if generation != latest[0]:
            raise StaleGeneration(f"job {job_id}: launch {generation} is not the latest ({latest[0]})")
        return latest[1]


def id_chunks(ids: Iterable[int], size: int = 900) -> Iterator[tuple[list[int], str]]:
    """Distinct ids in ascending order, in parts under SQLite's limit on a statement's
    parameters (999 before 3.32), each with its ``?, ?, ...`` placeholders."""
    want = sorted({int(i) for i in ids})
    for k in range(0, len(want), size):
        part = want[k:k + size]
        yield part, ", ".join("?" * len(part))


def dumps_json(value, field: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InputError(f"not storable as JSON: {e}", field=field) from None


def finite(value, field: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:                           # an integer past float's range
        ok = False
    if not ok:
        raise InputError(f"must be a finite number, got {value!r}", field=field)
    return float(value)
