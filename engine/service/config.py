"""The live service's settings (``arena serve``'s options), validated: the one place
their defaults live. A light module (no torch; of the launcher only its config module), so the
command line reads its defaults without importing the daemon."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from instances.errors import InputError
from instances.limits import check_time
from instances.paths import real_path
from launcher.config import MOVE_PATHS

# arena serve --slurm: what to do with nodes the partition gains while the service runs
# (engine/service/slurm_nodes.py), and the least time between two in-place restarts for them
NEW_NODE_ACTIONS = ("restart", "ignore")
RESTART_GAP_S = 600.0


@dataclass(frozen=True)
class ServiceConfig:
    db_path: str
    work_dir: str
    round_interval_s: float = 60.0
    min_round_gap_s: float = 2.0
    poll_interval_s: float = 0.5
    max_failures: int = 3
    failure_backoff_s: float = 30.0
    stop_timeout_s: float = 60.0
    checkpoint_interval_s: float = 60.0      # every launch checkpoints at least this often
    checkpoint_every: int = 0                # and every this many steps (0: time-based only)
    step_delay_s: float = 0.0                # tests and demos: slow tiny jobs down
    stop_after_s: float | None = None        # safety bound: shut down (checkpointing) after this
    move_path: str = "d2d"                   # "d2d" where the launcher can, else storage; "storage": always
    keep_rounds: int = 100_000               # rounds kept in the database (older deleted; 0: all)
    keep_measurements: int = 10_080          # per job, newest iteration-time measurements kept (a week; 0: all)
    stall_after_s: float = 600.0             # /api/health says 503 when the scheduler made no step for this long
    drain_after_failures: int = 3            # drain a node where runs of this many different jobs failed
    failure_window_s: float = 3600.0         # within this long (node_health.py; 0 jobs: never drain)
    data_roots: tuple[str, ...] | None = None  # folders jobs' data (and config.json) may be read from; None:
                                               # the work folder. Stored resolved (links and .. followed)

    def __post_init__(self):
        for name in ("round_interval_s", "poll_interval_s", "stop_timeout_s", "stall_after_s",
                     "failure_window_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"must be a finite number > 0, got {v!r}", field=name)
        for name in ("min_round_gap_s", "failure_backoff_s", "checkpoint_interval_s", "step_delay_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=name)
        if not isinstance(self.max_failures, int) or self.max_failures < 1:
            raise InputError(f"must be an integer >= 1, got {self.max_failures!r}", field="max_failures")
        for name in ("keep_rounds", "keep_measurements"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"must be an integer >= 0 (0: keep all), got {v!r}", field=name)
        v = self.drain_after_failures
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InputError(f"must be an integer >= 0 (0: never drain a node), got {v!r}",
                             field="drain_after_failures")
        if self.move_path not in MOVE_PATHS:
            raise InputError(f"must be one of {', '.join(MOVE_PATHS)}, got {self.move_path!r}", field="move_path")
        if self.stop_after_s is not None and not self.stop_after_s > 0:
            raise InputError(f"must be > 0, got {self.stop_after_s!r}", field="stop_after_s")
        roots = (self.work_dir,) if self.data_roots is None else self.data_roots
        if isinstance(roots, str) or not isinstance(roots, (list, tuple)) or not roots or \
                not all(isinstance(r, str) and r and "\0" not in r for r in roots):
            raise InputError(f"must be one or more folders, got {self.data_roots!r}", field="data_roots")
        object.__setattr__(self, "data_roots", tuple(dict.fromkeys(real_path(r) for r in roots)))
        for f in fields(self):                  # every time and duration: within the bound on times
            if f.name.endswith("_s") and getattr(self, f.name) is not None:
                check_time(getattr(self, f.name), field=f.name)


def default(name: str):
    """The default of ``ServiceConfig.<name>``: what ``arena serve``'s flag shows and uses."""
    for f in fields(ServiceConfig):
        if f.name == name:
            return f.default
    raise KeyError(name)
