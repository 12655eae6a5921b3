"""The work folder against the state database, at recovery: what a database restored
from an older copy (``arena backup``) does not know.

The work folder holds one folder per job (``<work>/<job id>/``: ``progress.json``, the
checkpoints, one ``launch_<n>`` run folder per launch through storage; a device-to-device
move keeps training in its launch's folder, so folder numbers never run ahead of the
job's launches in the database). A copy of the database taken earlier knows fewer jobs
and fewer launches than the folder holds. Left alone, what it does not know would go
wrong twice: ranks of those launches would keep training beside the service's own, on
GPUs it gives to other jobs; and a name would be used twice: the next job submitted
gets the id of a job submitted after the copy (whose folder, checkpoints included, it
would then run in), the next launch of a job the number of a run folder that exists.

So, before anything else in recovery:

- a job folder whose id the database does not have, and a ``launch_<n>`` folder beyond
  its job's last launch in the database, are *unknown*;
- an unknown run folder's ranks still training are asked to checkpoint and stop (then
  killed after the grace period), as recovery does for the launches it knows;
- every unknown folder is moved, whole, to ``<work>/not-in-database/`` (named after the
  job, the launch and the time), where nothing reads it again: the operator keeps its
  logs and checkpoints, and may resubmit the job.

What a known job's folder holds besides (``progress.json``, the checkpoints) stays in
place: it is that job's progress, which recovery then resumes from, so a checkpoint
written after the copy is not lost.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from launcher.launch import live_rank_pids, stop_detached

ASIDE = "not-in-database"


def _launch_number(path: Path) -> int | None:
    n = path.name.removeprefix("launch_")
    return int(n) if path.name.startswith("launch_") and n.isdigit() else None


def unknown_folders(work_dir: Path, last_generation: dict[int, int]) -> list[tuple[int, int | None, Path]]:
    """(job id, launch number or None for a whole job folder, path) of every folder the
    database does not know; ``last_generation``: per job in the database, its latest
    launch (0: none)."""
    out: list[tuple[int, int | None, Path]] = []
    if not work_dir.is_dir():
        return out
    for jid, d in sorted((int(d.name), d) for d in work_dir.iterdir() if d.is_dir() and d.name.isdigit()):
        if jid not in last_generation:
            out.append((jid, None, d))
            continue
        runs = ((_launch_number(r), r) for r in d.iterdir() if r.is_dir())
        later = sorted((n, r) for n, r in runs if n is not None and n > last_generation[jid])
        out.extend((jid, n, r) for n, r in later)
    return out


def _local_running(run_dir: str | Path) -> bool:
    return bool(live_rank_pids(run_dir))


def set_aside_unknown(work_dir: str | Path, last_generation: dict[int, int], stop_timeout_s: float,
                      log: Callable[[str], None], alive: Callable[[], None] = lambda: None,
                      running: Callable[[str], bool] = _local_running,
                      stop: Callable[[str, int | None, float], bool] = stop_detached) -> list[Path]:
    """Stop the ranks of every unknown folder (module doc) and move it to
    ``<work>/not-in-database/``; returns the new paths. ``alive`` is called before each
    folder (a stop takes up to ``stop_timeout_s``). ``running(run_dir)`` and ``stop(run_dir,
    pid, timeout_s)``: how the executor finds and stops ranks an earlier process left
    (``MpiExecutor.left_running``/``stop_left``; default: local ranks, whose pids the run
    folder records; on Slurm, the launch's batch job found by the service's tag)."""
    work = Path(work_dir)
    found = unknown_folders(work, last_generation)
    if not found:
        return []
    aside = work / ASIDE
    aside.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for jid, n, path in found:
        alive()
        runs = [path] if n is not None else [r for r in path.iterdir() if r.is_dir() and _launch_number(r) is not None]
        stopped = []
        for r in runs:
            if running(str(r)):
                clean = stop(str(r), None, stop_timeout_s)
                stopped.append(f"{r.name} ({'checkpointed and stopped' if clean else 'killed after the grace period'})")
        what = f"job {jid}'s launch folder {path.name}" if n is not None else f"job folder {jid}"
        why = (f"beyond the job's last launch in the state database ({last_generation[jid]})" if n is not None
               else "of a job the state database does not have")
        target = aside / (f"{jid}-{path.name}-{stamp}" if n is not None else f"{jid}-{stamp}")
        k = 1
        while target.exists():
            target = target.with_name(f"{target.name}.{k}")
            k += 1
        path.rename(target)
        moved.append(target)
        log(f"{what} is {why} (a database restored from an older copy?)"
            + (f"; ranks still training: {', '.join(stopped)}" if stopped else "")
            + f"; moved to {target}" + ("; resubmit the job to run it again" if n is None else ""))
    return moved
