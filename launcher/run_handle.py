"""How an executor holds one launch's ranks while they run: the seam between what every
executor does alike (``MpiExecutor``'s progress files, move records, stop with a
checkpoint, failures, out-of-memory verdicts) and how the ranks were started.

``LocalRun``: ``mpiexec`` on this host (or over a hostfile), a child process in its own
session. ``launcher.slurm_executor.SlurmRun``: one Slurm batch job whose ranks ``srun``
starts. Both answer the same few questions, ``subprocess.Popen``-like where Popen has the
word: has it ended and with what status (``poll``, ``wait``, ``returncode``), ask the
ranks to checkpoint and exit (``request_stop``), end them at once (``kill``), and say in
words how the run ended (``describe_end``), and since when its ranks run (``running_since``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from . import launch as _launch


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
    """``mpiexec`` started by this process (``launch.start``), in its own session."""

    def __init__(self, popen: subprocess.Popen, run_dir: str | os.PathLike):
        self.popen = popen
        self.run_dir = Path(run_dir)
        self.running_since: float | None = time.time()

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
