"""How ``arena bench policies`` (and ``--seeds``) spreads its runs over processes: rank r
of K runs policies r, r+K, ... and rank 0 gathers the rows (``policy_runs.policy_bench``).

- **MPI** (``mpiexec -n K``, or ``srun --mpi=pmi2 -n K``: the process manager's PMI
  variables are set): ``mpi4py``'s ``COMM_WORLD``.
- **Slurm tasks without MPI** (``srun -n K`` where Slurm starts no PMI server, its
  ``MpiDefault=none``): ``SLURM_PROCID`` of ``SLURM_STEP_NUM_TASKS`` (set in a job step
  only; not in a batch script, whose ``SLURM_NTASKS`` is the allocation's). The tasks
  gather through files in a folder of the current directory, which every task sees on a
  cluster's shared file system: ``.arena-tasks/<job>.<step>/``, removed by rank 0 at the
  end (and ``.arena-tasks/`` when empty). A task that fails writes a mark there, so rank 0 stops waiting and says which;
  one killed outright writes nothing: run ``srun --kill-on-bad-exit=1`` so that Slurm ends
  the step's other tasks with it.
- Otherwise one process runs everything (``None``).

``comm()`` returns either of the first two as an object with mpi4py's ``Get_rank``,
``Get_size`` and ``gather(obj, root=0)`` (root only), or None.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

PMI_VARIABLES = ("PMI_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
TASKS_DIR = ".arena-tasks"          # in the current directory: the Slurm tasks' gathering folder
GATHER_POLL_S = 0.2


class TaskFailed(RuntimeError):
    """Another Slurm task ended without handing its rows over."""


class SlurmTasks:
    """The ``comm`` of ``srun -n K`` without MPI: rank and size from Slurm, ``gather``
    through JSON files in ``folder`` (each gather its own number, so ``--seeds``' several
    gathers do not mix)."""

    def __init__(self, rank: int, size: int, folder: Path):
        self.rank, self.size, self.folder = rank, size, folder
        self._gathers = 0
        self.folder.mkdir(parents=True, exist_ok=True)
        atexit.register(self.at_exit)
        self._done = False

    def Get_rank(self) -> int:                     # noqa: N802  (mpi4py's names)
        return self.rank

    def Get_size(self) -> int:                     # noqa: N802
        return self.size

    def _write(self, name: str, obj: Any) -> None:
        tmp = self.folder / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(obj, default=str))
        tmp.replace(self.folder / name)             # whole or absent to the reader

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on rank ``root`` (0), None on the others."""
        if root != 0:
            raise ValueError("only root 0 is supported")
        n = self._gathers
        self._gathers += 1
        if self.rank != 0:
            self._write(f"gather-{n}-rank-{self.rank}.json", obj)
            return None
        out: list = [obj]
        for r in range(1, self.size):
            path = self.folder / f"gather-{n}-rank-{r}.json"
            while not path.exists():
                if (self.folder / f"failed-rank-{r}").exists():
                    why = (self.folder / f"failed-rank-{r}").read_text().strip()
                    raise TaskFailed(f"Slurm task {r} of {self.size} ended without its rows ({why}); see its "
                                     f"output")
                time.sleep(GATHER_POLL_S)
            out.append(json.loads(path.read_text()))
        return out

    def finish(self) -> None:
        """This rank is done: rank 0 removes the folder (every other rank has written its
        last rows before it got them)."""
        self._done = True
        if self.rank == 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            try:
                self.folder.parent.rmdir()          # .arena-tasks/, when no other run uses it
            except OSError:
                pass

    def at_exit(self) -> None:
        """Registered with ``atexit``: a task other than 0 that exits before ``finish``
        leaves a mark in the folder, so that task 0's next ``gather`` fails with
        ``TaskFailed`` naming it instead of waiting for its rows."""
        if not self._done and self.rank != 0:
            try:
                (self.folder / f"failed-rank-{self.rank}").write_text("it exited before it was done\n")
            except OSError:
                pass


def comm(env: dict[str, str] | None = None):
    """The processes to spread over (module doc): mpi4py's ``COMM_WORLD`` under a PMI, a
    ``SlurmTasks`` in an ``srun`` step of several tasks without one, else None."""
    env = os.environ if env is None else env
    if any(v in env for v in PMI_VARIABLES):
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        return world if world.Get_size() > 1 else None
    size = int(env.get("SLURM_STEP_NUM_TASKS") or 1)
    if size > 1 and "SLURM_PROCID" in env:
        step = f"{env.get('SLURM_JOB_ID', 'job')}.{env.get('SLURM_STEP_ID', 'step')}"
        return SlurmTasks(int(env["SLURM_PROCID"]), size, Path.cwd() / TASKS_DIR / step)
    return None


def finish(c) -> None:
    """End of the run for this process (a ``SlurmTasks`` cleans its folder; MPI: nothing)."""
    if isinstance(c, SlurmTasks):
        c.finish()
