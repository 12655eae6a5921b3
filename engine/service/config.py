"""The live service's settings (``arena serve``'s options), validated: the one place
their defaults live. A light module (no torch; of the launcher only its config module), so the
command line reads its defaults without importing the daemon."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from instances.errors import InputError
from instances.limits import MAX_STORED_INTEGER, check_time, show_number
from instances.paths import real_path
from launcher.config import MOVE_PATHS

# arena serve --slurm: what to do with nodes the partition gains while the service runs
# (engine/service/slurm_nodes.py), and the least time between two in-place restarts for them
NEW_NODE_ACTIONS = ("restart", "ignore")
RESTART_GAP_S = 600.0


# folders no data root may be (nor, for the second set, lie in): the whole file system, and the
# system's own folders, whose files (keys, passwords, the kernel's views) a job could read
SYSTEM_FOLDERS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt",
                            "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var"})
SYSTEM_TREES = ("/boot", "/dev", "/etc", "/proc", "/run", "/sys")


def system_folder(real: str) -> str | None:
    """Why the resolved folder ``real`` may not be a data root (None: it may)."""
    if real in SYSTEM_FOLDERS:
        return "is the whole file system" if real == "/" else "is a system folder"
    inside = next((t for t in SYSTEM_TREES if real.startswith(t + "/")), None)
    return None if inside is None else f"lies in the system folder {inside}"


@dataclass(frozen=True)
class ServiceConfig:
    # The fields a flag of ``arena serve`` sets carry it (flag, help, metavar ...; engine/cli/flags.py
    # makes the arguments from them), in the order `arena serve --help` lists them.
    db_path: str = field(metadata={
        "flag": "--db", "default": ".arena/state.db", "metavar": "PATH",
        "help": "SQLite state database (default .arena/state.db under the working folder)"})
    work_dir: str = field(metadata={
        "flag": "--work-dir", "default": ".arena/work", "metavar": "DIR",
        "help": "jobs' checkpoints, logs and progress (default .arena/work)"})
    # folders jobs' data (and config.json) may be read from; None: the work folder. Stored resolved
    # (links and .. followed)
    data_roots: tuple[str, ...] | None = field(default=None, metadata={
        "flag": "--data-root", "action": "append", "metavar": "DIR",
        "help": "a folder jobs' data files and model config.json files may be read from (repeatable; "
                "default: the work folder); a path is checked with its links and '..' resolved, at "
                "submission and again at every launch; not / nor a system folder (/etc, /usr, /home ...)"})
    round_interval_s: float = field(default=60.0, metadata={
        "flag": "--round-interval", "metavar": "S",
        "help": "seconds between timer rounds (rounds also run on arrival, completion, failure; "
                "default %(default)s)"})
    # rounds kept in the database (older deleted; 0: all)
    keep_rounds: int = field(default=100_000, metadata={
        "flag": "--keep-rounds", "metavar": "N",
        "help": "rounds kept in the database, older ones deleted as new ones are recorded (the shadow "
                "policy's totals and every job's history are kept whole; 0: keep every round; "
                "default %(default)s)"})
    # per job, newest iteration-time measurements kept (a week; 0: all)
    keep_measurements: int = field(default=10_080, metadata={
        "flag": "--keep-measurements", "metavar": "N",
        "help": "per job, the newest iteration-time measurements kept in the database (one a minute at "
                "most while it runs; measured moves are all kept; 0: keep all; default %(default)s, a "
                "week at one a minute)"})
    # /api/health says 503 when the scheduler made no step for this long
    stall_after_s: float = field(default=600.0, metadata={
        "flag": "--stall-after", "metavar": "S",
        "help": "/api/health answers 503 (for a supervisor's liveness probe) once the scheduler has "
                "shown no sign of life (a poll, a round begun, a job launched, stopped, moved or "
                "recovered) for this long (default %(default)s)"})
    # a launch whose ranks write nothing this long is killed, a failed run (launcher/mpi_executor.py)
    launch_stall_after_s: float = field(default=600.0, metadata={
        "flag": "--launch-stall-after", "metavar": "S",
        "help": "a running launch whose ranks write nothing (no step, progress or event) for S seconds, "
                "start-up included, is killed and counted as a failed run; the job resumes from its last "
                "checkpoint (0: never; default %(default)s)"})
    # every launch checkpoints at least this often
    checkpoint_interval_s: float = field(default=60.0, metadata={
        "flag": "--checkpoint-interval", "metavar": "S",
        "help": "every launch checkpoints at least this often, in seconds of training "
                "(default %(default)s)"})
    # "d2d" where the launcher can, else storage; "storage": always
    move_path: str = field(default="d2d", metadata={
        "flag": "--move-path", "choices": MOVE_PATHS,
        "help": "how running jobs move: d2d = device to device where the launcher can (a running job "
                "on one host), else through a checkpoint; storage = always stop, checkpoint and "
                "relaunch (default %(default)s)"})
    stop_timeout_s: float = field(default=60.0, metadata={
        "flag": "--stop-timeout", "metavar": "S",
        "help": "grace period for ranks to checkpoint and exit before they are killed "
                "(default %(default)s)"})
    max_failures: int = field(default=3, metadata={
        "flag": "--max-failures", "metavar": "N",
        "help": "failed runs before a job is marked failed (default %(default)s)"})
    failure_backoff_s: float = field(default=30.0, metadata={
        "flag": "--failure-backoff", "metavar": "S",
        "help": "a job whose run failed waits S seconds before it is offered again, doubling with every "
                "failure (default %(default)s)"})
    # drain a node where runs of this many different jobs failed
    drain_after_failures: int = field(default=3, metadata={
        "flag": "--drain-after-failures", "metavar": "N",
        "help": "take a node out of service (as `arena drain` would, the jobs named in the reason) once "
                "runs of N different jobs have failed on it within --failure-window; never the last "
                "node in service; 0: never (default %(default)s)"})
    # within this long (node_health.py; 0 jobs: never drain)
    failure_window_s: float = field(default=3600.0, metadata={
        "flag": "--failure-window", "metavar": "S",
        "help": "the window of --drain-after-failures, in seconds (default %(default)s)"})
    # with hosts, off Slurm: each host's ssh port probed this often; out of service after no answer this long
    host_check_interval_s: float = field(default=2.0, metadata={
        "flag": "--host-check-interval", "metavar": "S",
        "help": "with a cluster JSON that names hosts (not --slurm): connect to every host's ssh port this "
                "often (each try bounded by S); 0: never (default %(default)s)"})
    host_down_after_s: float = field(default=10.0, metadata={
        "flag": "--host-down-after", "metavar": "S",
        "help": "a host that accepted no connection for S seconds is out of service until it answers again: "
                "its jobs move elsewhere from their last checkpoint (default %(default)s)"})
    host_check_port: int = field(default=22, metadata={
        "flag": "--host-check-port", "metavar": "PORT",
        "help": "the port --host-check-interval connects to (default %(default)s, ssh: what mpiexec "
                "starts ranks through)"})
    # (arena serve's --host, --port, --token and --tokens-file come here: not settings of this config)
    # safety bound: shut down (checkpointing) after this
    stop_after_s: float | None = field(default=None, metadata={
        "flag": "--stop-after", "metavar": "S",
        "help": "shut down (checkpointing every job) after S seconds: a bound for demos and tests"})
    # tests and demos: slow tiny jobs down
    step_delay_s: float = field(default=0.0, metadata={
        "flag": "--step-delay", "metavar": "S",
        "help": "sleep S seconds after every training step (demos: slow tiny jobs to watch them move)"})
    # set by no flag (the defaults hold)
    min_round_gap_s: float = 2.0
    poll_interval_s: float = 0.5
    checkpoint_every: int = 0                # every launch checkpoints every this many steps (0: time-based only)

    def __post_init__(self):
        for name in ("round_interval_s", "poll_interval_s", "stop_timeout_s", "stall_after_s",
                     "failure_window_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"must be a finite number > 0, got {v!r}", field=name)
        for name in ("min_round_gap_s", "failure_backoff_s", "checkpoint_interval_s", "step_delay_s",
                     "launch_stall_after_s", "host_check_interval_s", "host_down_after_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=name)
        if not isinstance(self.max_failures, int) or self.max_failures < 1:
            raise InputError(f"must be an integer >= 1, got {self.max_failures!r}", field="max_failures")
        for name in ("keep_rounds", "keep_measurements"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"must be an integer >= 0 (0: keep all), got {v!r}", field=name)
            if v > MAX_STORED_INTEGER:              # (the scheduler stopped on an OverflowError in SQL)
                raise InputError(f"must be at most {MAX_STORED_INTEGER:,} (SQLite's largest integer), got "
                                 f"{show_number(v)}", field=name)
        v = self.drain_after_failures
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InputError(f"must be an integer >= 0 (0: never drain a node), got {v!r}",
                             field="drain_after_failures")
        port = self.host_check_port
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise InputError(f"must be a TCP port (1-65535), got {port!r}", field="host_check_port")
        if self.move_path not in MOVE_PATHS:
            raise InputError(f"must be one of {', '.join(MOVE_PATHS)}, got {self.move_path!r}", field="move_path")
        if self.stop_after_s is not None and not self.stop_after_s > 0:
            raise InputError(f"must be > 0, got {self.stop_after_s!r}", field="stop_after_s")
        roots = (self.work_dir,) if self.data_roots is None else self.data_roots
        if isinstance(roots, str) or not isinstance(roots, (list, tuple)) or not roots or \
                not all(isinstance(r, str) and r and "\0" not in r for r in roots):
            raise InputError(f"must be one or more folders, got {self.data_roots!r}", field="data_roots")
        object.__setattr__(self, "data_roots", tuple(dict.fromkeys(real_path(r) for r in roots)))
        for r in self.data_roots:
            why = system_folder(r)
            if why:
                raise InputError(f"{r} {why}: every file in it would become submittable as a job's data (the "
                                 "service reads it with its own rights); give the folder that holds the data",
                                 field="data_roots")
        for f in fields(self):                  # every time and duration: within the bound on times
            if f.name.endswith("_s") and getattr(self, f.name) is not None:
                check_time(getattr(self, f.name), field=f.name)

