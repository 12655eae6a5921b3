"""How an executor holds one launch's ranks while they run: the seam between what every
executor does alike (``MpiExecutor``'s progress files, move records, stop with a
checkpoint, failures, out-of-memory verdicts) and how the ranks were started.

``LocalRun``: ``mpiexec`` on this host (or over a hostfile), a child process in its own
session. ``DetachedRun``: an ``mpiexec`` that an earlier process of this host started
(a service restarted after a crash takes its launches over), found by the pid and start
time the run folder keeps (``write_launcher``, ``read_launcher``).
``launcher.slurm_executor.SlurmRun``: one Slurm batch job whose ranks ``srun`` starts.
All answer the same few questions, ``subprocess.Popen``-like where Popen has the word:
has it ended and with what status (``poll``, ``wait``, ``returncode``), ask the ranks to
checkpoint and exit (``request_stop``), end them at once (``kill``), say in words how the
run ended (``describe_end``), and since when its ranks run (``running_since``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from . import launch as _launch

LAUNCHER_FILE = "launcher.json"          # in the run folder: this host's processes that run the launch
NO_EXIT_CODES = -1                       # a detached mpiexec ended without printing its ranks' exit codes


class RunHandle(Protocol):
    @property
    def pid(self) -> int | None:
        """The local launcher process (mpiexec), None when there is none here."""

    @property
    def returncode(self) -> int | None:
        """The exit status, once ended."""

    @property
    def running_since(self) -> float | None:
        """``time.time()`` from which the run holds its resources and its ranks start (None
        while it waits for them, e.g. a Slurm job still pending): the executor's stall
        watch (``MpiExecutorConfig.run_stall_s``) counts from there."""

    def poll(self) -> int | None:
        """The run's exit status once it has ended, else None."""

    def wait(self, timeout: float | None = None) -> int:
        """Until it ended (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""

    def request_stop(self) -> None:
        """SIGTERM to every rank: they checkpoint at the end of the current step and exit."""

    def kill(self) -> None:
        """End every rank now (no checkpoint)."""

    def describe_end(self, returncode: int) -> str:
        """How the run ended, in words, for a failure message."""


class LocalRun:
    """``mpiexec`` started by this process (``launch.start``), in its own session; ``log``:
    the prefix of its log files in the run folder (``stdout.log``, ``stderr.log``; ranks that
    a move started: ``join_<n>.stdout.log`` ...)."""

    def __init__(self, popen: subprocess.Popen, run_dir: str | os.PathLike, log: str = ""):
        self.popen = popen
        self.run_dir = Path(run_dir)
        self.log = log
        self.running_since: float | None = time.time()

    @property
    def stderr_log(self) -> Path:
        return self.run_dir / (f"{self.log}.stderr.log" if self.log else "stderr.log")

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout=timeout)

    def request_stop(self) -> None:
        try:
            os.kill(self.popen.pid, signal.SIGTERM)        # mpiexec forwards it to every rank
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        _launch.kill_job(self.popen, self.run_dir, signal.SIGKILL)

    def describe_end(self, returncode: int) -> str:
        return f"mpiexec exited with status {returncode}"


def wait_polling(run, timeout: float | None, what: str, poll_s: float = 0.1) -> int:
    """``run.poll()`` every ``poll_s`` until it gives an exit status (a handle that is not
    this process's child cannot be waited for); ``subprocess.TimeoutExpired`` naming
    ``what`` after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (rc := run.poll()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(what, timeout or 0)
        time.sleep(poll_s)
    return rc


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc), None when it is gone: with
    the pid, it names one process (a pid reused later has another start time)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_launcher(run_dir: str | os.PathLike, proc: LocalRun, joiner_pids: list[int]) -> None:
    """Record in the run folder the launch's ``mpiexec`` on this host (pid, start time, log
    prefix) and those of processes that joined it in a move (replaced atomically)."""
    rec = {"pid": proc.pid, "start": process_start(proc.pid), "log": proc.log,
           "joiners": [[p, process_start(p)] for p in joiner_pids]}
    path = Path(run_dir) / LAUNCHER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def read_launcher(run_dir: str | os.PathLike) -> dict | None:
    try:
        rec = json.loads((Path(run_dir) / LAUNCHER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("pid"), int) else None


class DetachedRun:
    """An ``mpiexec`` of this host that an earlier process started (``pid`` with its start
    time ``start``): not this process's child, so its end is seen from ``/proc`` and its exit
    status read from Hydra's exit-code lines in its log (``log`` prefix, as ``LocalRun``);
    ``NO_EXIT_CODES`` when it printed none (killed)."""

    def __init__(self, run_dir: str | os.PathLike, pid: int, start: int | None, log: str = ""):
        self.run_dir, self.pid, self.start, self.log = Path(run_dir), pid, start, log
        self.returncode: int | None = None
        self.running_since: float | None = time.time()

    @property
    def stderr_log(self) -> Path:
        return self.run_dir / (f"{self.log}.stderr.log" if self.log else "stderr.log")

    def alive(self) -> bool:
        start = process_start(self.pid)
        return start is not None and start == self.start and _launch.alive(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None and not self.alive():
            codes = _launch.rank_exit_codes(self.run_dir, f"{self.log}.stdout.log" if self.log else "stdout.log")
            bad = [c for c in codes.values() if c != 0]
            self.returncode = (bad[0] if bad else 0) if codes else NO_EXIT_CODES
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return wait_polling(self, timeout, f"mpiexec {self.pid}")

    def request_stop(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.alive():
            _launch.kill_job(self, self.run_dir, signal.SIGKILL)

    def describe_end(self, returncode: int) -> str:
        if returncode == NO_EXIT_CODES:
            return f"mpiexec (pid {self.pid}, taken over after a restart) ended without its ranks' exit codes"
        return f"mpiexec (pid {self.pid}, taken over after a restart) ended; a rank's exit status {returncode}"
