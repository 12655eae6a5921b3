"""Launches of jobs and what they report (tables ``launches``, ``launch_gpus``,
``measurements``, ``checkpoints``): one table group of the service's store, over the
store's connection and its transactions."""
from __future__ import annotations

import json
import sqlite3

from instances.errors import InputError

from .rows import CheckpointRow, LaunchRow, MeasurementRow
from .rules import (
    ACTIVE_LAUNCH,
    LAUNCH_STATES,
    LAUNCH_TRANSITIONS,
    TERMINAL,
    StateConflict,
)
from .table import Table, dumps_json, finite


class LaunchTable(Table):
    """Launches, their GPUs, measurements and checkpoints; ``Store.launches``."""

    def record_intent(self, job_id: int, plan: dict, gpus: list[str] | tuple[str, ...]) -> int:
        """Before starting a launch: its plan and GPUs, state ``intent``. Returns the job's
        next generation number (1, 2, ...). Refused for a finished job, while the job has
        another active launch, or when a GPU is in another job's active launch."""
        gpus = tuple(gpus)
        if not gpus or not all(isinstance(g, str) and g for g in gpus) or len(set(gpus)) != len(gpus):
            raise InputError(f"a launch needs distinct GPU names, got {list(gpus)!r}", field="gpus")
        plan_json = dumps_json(plan, "plan")
        with self._tx() as now:
            status = self._job_status(job_id)
            if status in TERMINAL:
                raise StateConflict(f"job {job_id} is {status}")
            latest = self._latest_launch(job_id)
            if latest is not None and latest[1] in ACTIVE_LAUNCH:
                raise StateConflict(f"job {job_id}: launch {latest[0]} is still {latest[1]}")
            gen = 1 if latest is None else latest[0] + 1
            self.conn.execute("INSERT INTO launches(job_id, generation, plan, state, created_at, updated_at) "
                              "VALUES (?, ?, ?, 'intent', ?, ?)", (job_id, gen, plan_json, now, now))
            try:
                self.conn.executemany("INSERT INTO launch_gpus(job_id, generation, gpu, active) VALUES (?, ?, ?, 1)",
                                      [(job_id, gen, g) for g in gpus])
            except sqlite3.IntegrityError:
                busy = self.conn.execute(
                    f"SELECT gpu, job_id FROM launch_gpus WHERE active = 1 AND gpu IN ({','.join('?' * len(gpus))})",
                    gpus).fetchall()
                raise StateConflict(f"job {job_id}: GPUs in another active launch: "
                                    f"{', '.join(f'{g} (job {j})' for g, j in busy)}") from None
        return gen

    def mark(self, job_id: int, generation: int, state: str, *, pid_info: dict | None = None,
                    reason: str = "") -> None:
        """Record what happened to a launch (``LAUNCH_TRANSITIONS``); only the job's latest
        generation may. An ended launch frees its GPUs."""
        if state not in LAUNCH_STATES:
            raise InputError(f"unknown launch state {state!r}; known: {', '.join(LAUNCH_STATES)}", field="state")
        pid_json = None if pid_info is None else dumps_json(pid_info, "pid_info")
        with self._tx() as now:
            cur = self._current_launch_state(job_id, generation)
            if state not in LAUNCH_TRANSITIONS[cur]:
                raise StateConflict(f"job {job_id} launch {generation}: {cur} -> {state} is not allowed")
            self.conn.execute("UPDATE launches SET state = ?, pid_info = COALESCE(?, pid_info), reason = ?, "
                              "updated_at = ? WHERE job_id = ? AND generation = ?",
                              (state, pid_json, str(reason), now, job_id, generation))
            if state not in ACTIVE_LAUNCH:
                self.conn.execute("UPDATE launch_gpus SET active = 0 WHERE job_id = ? AND generation = ?",
                                  (job_id, generation))

    def rows(self, job_id: int | None = None, *, active_only: bool = False) -> list[LaunchRow]:
        where, args = [], []
        if job_id is not None:
            where.append("l.job_id = ?")
            args.append(job_id)
        if active_only:
            where.append("l.state IN ('intent', 'started')")
        q = ("SELECT l.job_id, l.generation, l.plan, l.state, l.pid_info, l.reason, l.created_at, l.updated_at, "
             "(SELECT json_group_array(gpu) FROM (SELECT gpu FROM launch_gpus g WHERE g.job_id = l.job_id AND "
             "g.generation = l.generation ORDER BY rowid)) FROM launches l"
             + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY l.job_id, l.generation")
        return [LaunchRow(j, g, json.loads(p), tuple(json.loads(gp)), st, None if pi is None else json.loads(pi),
                          r, c, u) for j, g, p, st, pi, r, c, u, gp in self.conn.execute(q, args)]

    def active(self) -> list[LaunchRow]:
        """Launches in state ``intent`` or ``started``: what a restarted service must look
        at (re-adopt if its processes live, else mark failed and relaunch)."""
        return self.rows(active_only=True)

    def last_generations(self) -> dict[int, int]:
        """Per job in the store, its latest launch generation (0: never launched)."""
        return {int(j): int(g) for j, g in self.conn.execute(
            "SELECT j.id, COALESCE(MAX(l.generation), 0) FROM jobs j LEFT JOIN launches l ON l.job_id = j.id "
            "GROUP BY j.id")}

    def record_measurement(self, job_id: int, generation: int, *, iteration_time_s: float | None = None,
                           reconfig: dict[str, float] | None = None, step: int | None = None,
                           keep: int = 0) -> None:
        """A measured iteration time and/or reconfiguration time parts (seconds) of one
        launch. Any launch of the job may report (a measurement names its launch).
        ``keep`` > 0: of the job's iteration-time measurements, only those among its
        ``keep`` newest measurements stay (older ones are deleted in the same
        transaction); measured moves (with reconfiguration parts) are always kept."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InputError(f"must be an integer >= 0, got {keep!r}", field="keep_measurements")
        parts = {str(k): finite(v, f"reconfig.{k}") for k, v in (reconfig or {}).items()}
        it = finite(iteration_time_s, "iteration_time_s", optional=True)
        if it is None and not parts:
            raise InputError("a measurement needs an iteration time or reconfiguration parts", field="iteration_time_s")
        with self._tx() as now:
            if self.conn.execute("SELECT 1 FROM launches WHERE job_id = ? AND generation = ?",
                                 (job_id, generation)).fetchone() is None:
                raise InputError(f"job {job_id} has no launch {generation!r}", field="generation")
            self.conn.execute("INSERT INTO measurements(job_id, generation, at, step, iteration_time_s, reconfig) "
                              "VALUES (?, ?, ?, ?, ?, ?)",
                              (job_id, generation, now, step, it, dumps_json(parts, "reconfig")))
            if keep and not parts:
                self.conn.execute(            # the cut-off from the (job_id, id) index alone
                    "DELETE FROM measurements WHERE job_id = ? AND reconfig = '{}' AND id <= "
                    "(SELECT id FROM measurements WHERE job_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (job_id, job_id, keep))

    def measurements(self, job_id: int) -> list[MeasurementRow]:
        return [MeasurementRow(j, g, a, s, it, json.loads(rc)) for j, g, a, s, it, rc in self.conn.execute(
            "SELECT job_id, generation, at, step, iteration_time_s, reconfig FROM measurements WHERE job_id = ? "
            "ORDER BY id", (job_id,))]

    def record_checkpoint(self, job_id: int, generation: int, step: int, path: str) -> None:
        """A completed checkpoint of the job's latest launch (an older launch's late report
        is refused: the job may have moved on from it). Reporting the same one again is a
        no-op; the same step at another path is refused."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"must be an integer >= 0, got {step!r}", field="step")
        with self._tx() as now:
            self._current_launch_state(job_id, generation)
            have = self.conn.execute("SELECT path FROM checkpoints WHERE job_id = ? AND generation = ? AND step = ?",
                                     (job_id, generation, step)).fetchone()
            if have is not None:                 # a repeated report: the same is a no-op
                if have[0] != str(path):
                    raise StateConflict(f"job {job_id} launch {generation}: step {step} already saved at {have[0]}")
                return
            self.conn.execute("INSERT INTO checkpoints(job_id, generation, step, path, at) VALUES (?, ?, ?, ?, ?)",
                              (job_id, generation, step, str(path), now))

    def checkpoints(self, job_id: int) -> list[CheckpointRow]:
        return [CheckpointRow(*r) for r in self.conn.execute(
            "SELECT job_id, generation, step, path, at FROM checkpoints WHERE job_id = ? ORDER BY step, id",
            (job_id,))]

    def latest_checkpoint(self, job_id: int) -> CheckpointRow | None:
        cps = self.checkpoints(job_id)
        return cps[-1] if cps else None
