"""The service's state in SQLite (stdlib ``sqlite3``): jobs and their status history,
launches (one generation number per launch of a job), rounds and their decisions,
measured iteration and reconfiguration times, checkpoints.

Crash safety rests on three rules:

- every method that changes state is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``,
  ``synchronous=FULL``), committed before it returns: the caller writes the intent, then
  acts, then records the outcome, so after a crash the database tells what was decided
  and what is known to have happened (a launch in state ``intent`` may or may not have
  started; its pids say which);
- the rules of the state machine are checked inside that transaction (job status
  transitions; one active launch per job; only a job's latest launch generation may
  change launch state or record checkpoints: a late message from an old launch is
  refused with ``StaleGeneration``);
- a GPU can be in only one active launch: a partial unique index enforces it in the
  database itself.

Concurrency: WAL journal; one writer process (the service), any number of readers in
other processes (``Store(path, readonly=True)``, e.g. the CLI) that see only committed
state and do not block the writer.

Schema versions live in ``PRAGMA user_version`` (schema.py: ``MIGRATIONS[i]`` takes a
database from version ``i`` to ``i + 1``, and a new database is built by running all of
them, so the path from any older version is the code that builds every database).

The package, by table group: ``store.py`` (``Store``: the connection, its transactions,
backup, the consistency check), ``jobs.py``, ``launches.py``, ``nodes.py``, ``rounds.py``,
``moves.py`` (one class each, ``Store.jobs`` ...), ``table.py`` (what the groups share),
``rules.py`` (the state machine), ``rows.py`` (typed rows), ``schema.py``.
"""
from .rows import CheckpointRow, HistoryRow, JobRow, LaunchRow, MeasurementRow, RoundRow
from .rules import (
    ACTIVE_LAUNCH,
    JOB_STATUSES,
    LAUNCH_STATES,
    LAUNCH_TRANSITIONS,
    MAX_KEY_CHARS,
    TERMINAL,
    TRANSITIONS,
    StaleGeneration,
    StateConflict,
)
from .schema import MIGRATIONS, SCHEMA_VERSION, migrate
from .store import BUSY_TIMEOUT_MS, Store, check_state_file

__all__ = ["ACTIVE_LAUNCH", "BUSY_TIMEOUT_MS", "JOB_STATUSES", "LAUNCH_STATES", "LAUNCH_TRANSITIONS", "MAX_KEY_CHARS",
           "MIGRATIONS", "SCHEMA_VERSION", "TERMINAL", "TRANSITIONS", "CheckpointRow", "HistoryRow", "JobRow",
           "LaunchRow", "MeasurementRow", "RoundRow", "StaleGeneration", "StateConflict", "Store", "check_state_file",
           "migrate"]
