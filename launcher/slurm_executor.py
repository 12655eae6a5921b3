"""``SlurmExecutor``: the engine's Executor protocol carried out as Slurm jobs.

Everything an executor does with a launch's files (progress, move records, stop with a
checkpoint, failures, out-of-memory verdicts, device-to-device moves) is ``MpiExecutor``'s;
this file says only how a launch's ranks start, end and are signalled on Slurm
(``SlurmRun``, a ``launcher.run_handle.RunHandle``), plus what only Slurm has: taking over
the jobs a crashed service left running (``find_running``, ``adopt``).

- **Launch**: one batch job (``sbatch --parsable``) on exactly the nodes of the placement
  (``--nodelist`` with ``--nodes``, ``--ntasks-per-node`` = ranks per node,
  ``--gres=gpu[:TYPE]:N`` where the nodes have GPU GRES; ``--partition``, ``--account``
  and the operator's extra options), named ``arena.<tag>.<job>.<launch>`` with a comment
  ``arena tag=<tag> job=<job> launch=<n>``, logging into the run folder. Its script runs
  the ranks with MPICH's ``mpiexec`` (Hydra, which sees the Slurm allocation and starts
  one proxy per node with ``srun``; the same launcher and PMI as ``MpiExecutor``), or,
  with ``launcher="srun"``, ``srun --mpi=pmi2 --kill-on-bad-exit=1`` (Slurm's own PMI-2:
  4 of about 27 launches here died in ``MPI_Init``, MPICH's business card garbled on its
  way through Slurm's PMI-2 server or its shared-memory bootstrap failing; hence Hydra by
  default). The script records the launcher's exit status in ``slurm_exit``.
- **State**: one ``squeue`` for all of the executor's jobs at most every ``poll_s``
  seconds (sooner once a launch's ``slurm_exit`` appears); a job Slurm no longer lists is
  looked up in ``sacct`` where accounting is enabled. After a ``squeue`` that failed, the
  next poll asks ``scontrol ping`` first (quick even when the controller is down, where
  ``squeue`` retries for about ``MessageTimeout`` seconds and would hold up every poll).
  While Slurm does not answer (the controller down), a launch runs on as far as the
  executor knows (``slurm_error`` says why), stop and kill say nothing (the ``stop`` file
  still reaches the ranks), and a launch whose script wrote its exit status ends
  ``EXIT_GRACE_S`` later.
- **Stop**: the ``stop`` file in the (shared) run folder: rank 0 reads it at every step
  and all ranks agree on it, so they checkpoint at the end of the step and exit (what
  SIGTERM would do; with ``launcher="srun"`` a ``scancel --signal=TERM`` goes to the
  ranks too); a launch still pending is cancelled. After ``stop_timeout_s``, ``scancel
  --signal=KILL --full`` and ``scancel``.
- **A run Slurm ended** (an outside ``scancel``, time limit, node failure, preemption)
  that did not finish training is a failed run, whose reason names the Slurm state; the
  job resumes from its last checkpoint at the next launch.
- **Moves**: through storage (stop with a checkpoint, a new batch job on the new nodes,
  which reshards the checkpoint) unless the new allocation keeps the job's Slurm
  allocation (the same nodes, the same ranks on each): then device to device inside the
  running job (``launcher.d2d``; the ranks' process group is already made over TCP).
  Moves that change nodes or rank counts would need the running job's ranks and a second
  Slurm job in one process group and the old job's nodes handed back part by part: not
  done (docs/slurm.md).
- **Re-adoption**: ``find_running`` lists the service's jobs Slurm still runs (by the tag
  in their name and comment); ``adopt(job, alloc, plan, launch_index)`` takes one over in
  this executor without touching it (progress, stop and moves work as for a launch of its
  own), or, when it ended while nobody watched, accounts it from Slurm and the run folder
  as finished or failed.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import quote, unquote

from instances.allocation import Allocation
from instances.errors import InputError
from instances.jobs import Job
from instances.plan import Plan
from instances.slurm import SlurmCommandError, SlurmCommands, SlurmJob, accounted_job, list_jobs, natural_key

from . import launch as _launch
from .config import ParallelPlan, TrainConfig
from .mpi_executor import LaunchedJob, LaunchedJobProgress, MpiExecutor, MpiExecutorConfig
from .run_handle import wait_polling
from .worker import STOP_FILE

EXIT_FILE = "slurm_exit"                 # in the run folder: the rank launcher's exit status, written by the script
JOB_ID_FILE = "slurm_job_id"             # in the run folder: the launch's Slurm job id
SCRIPT_FILE = "slurm_job.sh"
NO_EXIT_STATUS = -1                      # the batch script ended without writing its status (killed)
EXIT_GRACE_S = 10.0                      # after slurm_exit appears, how long Slurm may still list the job running
LAUNCHERS = ("mpiexec", "srun")         # how the batch script starts the ranks
MPI_PLUGINS = ("pmi2", "pmix")           # srun --mpi, with launcher="srun"
# sbatch options the executor sets itself: an operator's --slurm-opt may not set them
OWN_OPTIONS = frozenset({"nodelist", "w", "nodes", "N", "ntasks", "n", "ntasks-per-node", "gres", "job-name", "J",
                         "comment", "output", "o", "error", "e", "open-mode", "chdir", "D", "parsable", "wrap",
                         "partition", "p", "account", "A"})
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_OPTION = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)(?:=(.*))?$")
_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.-]+$")


class SlurmRefused(InputError):
    """sbatch refused a launch. ``transient``: Slurm did not answer (the controller down):
    not a verdict on the job or its shape, unlike a refusal of the request itself."""

    def __init__(self, reason: str, *, transient: bool):
        super().__init__(reason, field="sbatch")
        self.transient = transient


@dataclass(frozen=True)
class SlurmExecutorConfig:
    """Where and how launches go on Slurm. ``nodes`` and ``gres`` come from discovery
    (``instances.slurm.SlurmView.node_names()`` / ``launch_gres()``)."""
    nodes: Mapping[int, str]                    # engine node id -> Slurm node name
    gres: Mapping[str, str | None] = field(default_factory=dict)  # Slurm node -> "gpu:TYPE"/"gpu"; None: CPU slots
    tag: str = "arena"                          # this service's mark in job names and comments
    partition: str | None = None
    account: str | None = None
    options: tuple[str, ...] = ()               # extra sbatch options, "KEY=VALUE" or "KEY" (--slurm-opt)
    conf: str | None = None                     # SLURM_CONF for every Slurm command; None: Slurm's default
    command_timeout_s: float = 30.0
    launcher: str = "mpiexec"                   # "mpiexec": MPICH's Hydra in the allocation; "srun": srun --mpi
    mpi: str = "pmi2"                           # srun --mpi, with launcher="srun"
    poll_s: float = 1.0                         # squeue at most this often

    def __post_init__(self):
        if not _TAG.match(self.tag):
            raise InputError(f"must be 1-40 letters, digits, '_' or '-', got {self.tag!r}", field="--slurm-tag")
        for name, v in (("--partition", self.partition), ("--account", self.account)):
            if v is not None and not _NAME_CHARS.match(v):
                raise InputError(f"must be a Slurm name (letters, digits, '_', '.', '-'), got {v!r}", field=name)
        for opt in self.options:
            m = _OPTION.match(opt.removeprefix("--")) if isinstance(opt, str) else None
            if not m:
                raise InputError(f"must be KEY=VALUE or KEY (an sbatch option without its dashes), got {opt!r}",
                                 field="--slurm-opt")
            if m.group(1) in OWN_OPTIONS:
                raise InputError(f"{opt!r}: the executor sets --{m.group(1)} itself (placement, names, logs); "
                                 f"use --partition/--account for those", field="--slurm-opt")
        if self.launcher not in LAUNCHERS:
            raise InputError(f"must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}", field="launcher")
        if self.mpi not in MPI_PLUGINS:
            raise InputError(f"must be one of {', '.join(MPI_PLUGINS)}, got {self.mpi!r}", field="mpi")
        if not self.poll_s > 0:
            raise InputError("must be > 0", field="poll_s")
        bad = [n for n in self.nodes.values() if not isinstance(n, str) or not _NAME_CHARS.match(n)]
        if bad:
            raise InputError(f"not Slurm node names: {bad[:3]}", field="nodes")

    def sbatch_options(self) -> list[str]:
        out = [f"--partition={self.partition}"] if self.partition else []
        out += [f"--account={self.account}"] if self.account else []
        return out + [f"--{o.removeprefix('--')}" for o in self.options]


@dataclass(frozen=True)
class SlurmLaunch:
    """A launch of this service found in Slurm (``find_running``)."""
    job_id: str                                 # the arena job
    launch_index: int
    slurm_job_id: int
    state: str


def job_name(tag: str, job_id: str, launch_index: int) -> str:
    return f"arena.{tag}.{quote(str(job_id), safe='')}.{launch_index}"


def job_comment(tag: str, job_id: str, launch_index: int) -> str:
    return f"arena tag={tag} job={quote(str(job_id), safe='')} launch={launch_index}"


def parse_launch(job: SlurmJob, tag: str) -> tuple[str, int] | None:
    """(arena job id, launch index) of one of this service's Slurm jobs (by its comment, else
    its name), None for any other job."""
    kv = dict(p.split("=", 1) for p in job.comment.split() if "=" in p) if job.comment.startswith("arena ") else {}
    if kv.get("tag") == tag and "job" in kv and kv.get("launch", "").isdigit():
        return unquote(kv["job"]), int(kv["launch"])
    parts = job.name.split(".")
    if len(parts) == 4 and parts[0] == "arena" and parts[1] == tag and parts[3].isdigit():
        return unquote(parts[2]), int(parts[3])
    return None


class SlurmRun:
    """One launch as a Slurm batch job (``launcher.run_handle.RunHandle``)."""

    pid: int | None = None                  # no launcher process here

    def __init__(self, ex: "SlurmExecutor", slurm_job_id: int, run_dir: str, submitted_at: float):
        self.ex, self.slurm_job_id, self.run_dir = ex, int(slurm_job_id), Path(run_dir)
        self.submitted_at = submitted_at        # time.time() of sbatch; 0 for an adopted job
        self.returncode: int | None = None
        self.running_since: float | None = None     # time.time() of the first squeue that showed it running
        self.state = "PENDING"                  # Slurm's, as last read
        self.reason = ""
        self._exit_seen: float | None = None

    def _exit_status(self) -> int | None:
        try:
            return int((self.run_dir / EXIT_FILE).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        rc = self._exit_status()
        if rc is not None and self._exit_seen is None:
            self._exit_seen = time.monotonic()
        exited = self._exit_seen is not None and time.monotonic() - self._exit_seen > EXIT_GRACE_S
        try:
            job = self.ex._slurm_job(self.slurm_job_id, fresh=rc is not None, after=self.submitted_at)
            if job is None:
                job = self.ex._accounted(self.slurm_job_id)
                if job is None:
                    self.state, self.reason = "unknown to Slurm", ""
        except InputError as e:         # Slurm not answering: the job runs on as far as we know
            self.ex.slurm_error = e.reason
            if not exited:
                return None
            job, self.state, self.reason = None, "unknown", f"Slurm did not answer: {e.reason}"
        if job is not None:
            self.state, self.reason = job.state, job.reason
            if job.state == "RUNNING" and self.running_since is None:
                self.running_since = time.time()
            if not job.ended and not exited:
                return None
        self.returncode = NO_EXIT_STATUS if rc is None else rc
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return wait_polling(self, timeout, f"slurm job {self.slurm_job_id}")

    def request_stop(self) -> None:
        """The ``stop`` file (written first by the executor) asks the ranks to checkpoint and
        exit; here a pending job is cancelled, and under ``srun`` the ranks get SIGTERM too."""
        try:
            job = self.ex._slurm_job(self.slurm_job_id, fresh=True, after=self.submitted_at)
            if job is not None and job.state == "PENDING":      # nothing started: nothing to checkpoint
                self.ex._scancel(self.slurm_job_id)
            elif self.ex.slurm.launcher == "srun":
                self.ex._scancel("--signal=TERM", self.slurm_job_id)
        except InputError as e:
            self.ex.slurm_error = e.reason

    def kill(self) -> None:
        try:
            self.ex._scancel("--signal=KILL", "--full", self.slurm_job_id)
            self.ex._scancel(self.slurm_job_id)
        except InputError as e:
            self.ex.slurm_error = e.reason

    def describe_end(self, returncode: int) -> str:
        how = f"Slurm job {self.slurm_job_id} ended {self.state}"
        if self.reason and self.reason not in ("None", "(null)"):
            how += f" ({self.reason})"
        if returncode == NO_EXIT_STATUS:
            return how + f", its batch script killed before it saw {self.ex.slurm.launcher} end"
        return how + f", {self.ex.slurm.launcher} exit status {returncode}"


class SlurmExecutor(MpiExecutor):
    def __init__(self, config: MpiExecutorConfig, slurm: SlurmExecutorConfig):
        if config.node_hosts:
            raise InputError("a Slurm executor places ranks by Slurm node name (SlurmExecutorConfig.nodes); "
                             "leave node_hosts empty", field="node_hosts")
        super().__init__(config)
        self.slurm = slurm
        self.commands = SlurmCommands(slurm.conf, slurm.command_timeout_s)
        for name in ("sbatch", "squeue", "scancel"):          # before any launch: a clear error now
            self.commands.path(name)
        self._snapshot: dict[int, SlurmJob] = {}
        self._snapshot_at = 0.0                 # time.time() of the last squeue
        # the last squeue failed (the controller away): until ``scontrol ping`` answers again, no
        # squeue (each retries for about MessageTimeout seconds, which would hold up every poll)
        self._unanswered = False
        self._layout: dict[str, dict[str, int]] = {}    # job -> Slurm node -> ranks of its current launch
        self.slurm_error: str | None = None     # the last Slurm command that failed while jobs ran (to log)

    # --- starting a launch -------------------------------------------------------------------
    def _placement(self, alloc) -> dict[str, int]:
        """Slurm node name -> ranks, for an allocation (engine node ids)."""
        per: dict[str, int] = {}
        for node, _ in alloc.gpus:
            if node not in self.slurm.nodes:
                raise InputError(f"node {node} has no Slurm node name (known: {dict(self.slurm.nodes)})",
                                 field="nodes")
            name = self.slurm.nodes[node]
            per[name] = per.get(name, 0) + 1
        return per

    def _start_run(self, job: Job, cfg: TrainConfig, hostfile: str | None, alloc: Allocation) -> SlurmRun:
        per = self._placement(alloc)
        counts = set(per.values())
        if len(counts) != 1:
            raise InputError(f"job {job.job_id}: Slurm starts the same number of ranks on every node; this "
                             f"placement has {per}", field="placement")
        k = counts.pop()
        names = sorted(per, key=natural_key)
        gres = {self.slurm.gres.get(n) for n in names}
        if len(gres) != 1:
            raise InputError(f"job {job.job_id}: nodes {names} do not all have the same GPU GRES ({gres})",
                             field="placement")
        gres_name = gres.pop()
        run_dir = Path(cfg.run_dir)
        config_path = _launch.prepare_run_dir(cfg)
        for stale in (EXIT_FILE, JOB_ID_FILE):
            (run_dir / stale).unlink(missing_ok=True)
        index = int(run_dir.name.removeprefix("launch_")) if run_dir.name.removeprefix("launch_").isdigit() else 0
        script = run_dir / SCRIPT_FILE
        script.write_text(self._script(cfg, config_path, k))
        args = ["sbatch", "--parsable", f"--job-name={job_name(self.slurm.tag, job.job_id, index)}",
                f"--comment={job_comment(self.slurm.tag, job.job_id, index)}",
                f"--nodes={len(names)}", f"--nodelist={','.join(names)}", f"--ntasks-per-node={k}",
                f"--output={run_dir / 'stdout.log'}", f"--error={run_dir / 'stderr.log'}", "--open-mode=append",
                f"--chdir={run_dir}", *([f"--gres={gres_name}:{k}"] if gres_name else []),
                *self.slurm.sbatch_options(), str(script)]
        submitted = time.time()
        try:
            out = self.commands.run(*args)
        except SlurmCommandError as e:
            down = "controller does not answer" in e.reason or "did not answer" in e.reason
            what = "the Slurm controller does not answer: " if down else ""
            raise SlurmRefused(f"Slurm refused the launch of job {job.job_id} on {','.join(names)}: {what}{e.message}",
                               transient=down) from None
        try:
            slurm_id = int(out.strip().split(";")[0])
        except ValueError:
            raise InputError(f"sbatch --parsable printed {out.strip()[:80]!r}, not a job id", field="sbatch") from None
        (run_dir / JOB_ID_FILE).write_text(f"{slurm_id}\n")
        self._layout[job.job_id] = per
        return SlurmRun(self, slurm_id, str(run_dir), submitted)

    def _script(self, cfg: TrainConfig, config_path: Path, ranks_per_node: int) -> str:
        q = shlex.quote
        env = " ".join(f"{k}={q(v)}" for k, v in _launch.RANK_ENV.items())
        exit_file = Path(cfg.run_dir) / EXIT_FILE
        return "\n".join([
            "#!/bin/bash",
            f"# arena launch in {cfg.run_dir} (written by launcher/slurm_executor.py)",
            f"export {env}",
            f"export PYTHONPATH={q(_launch.REPO_ROOT)}${{PYTHONPATH:+:$PYTHONPATH}}",
            self._rank_launcher(cfg, ranks_per_node) + f" {q(sys.executable)} -m launcher.worker {q(str(config_path))}",
            "rc=$?",
            f"echo $rc > {q(str(exit_file))}.tmp && mv -f {q(str(exit_file))}.tmp {q(str(exit_file))}",
            "exit $rc", ""])

    def _rank_launcher(self, cfg: TrainConfig, ranks_per_node: int) -> str:
        if self.slurm.launcher == "srun":
            return f"srun --mpi={self.slurm.mpi} --kill-on-bad-exit=1 --ntasks-per-node={ranks_per_node}"
        # Hydra reads the nodes from the allocation and starts its proxies there with srun
        return (f"{shlex.quote(_launch.mpiexec_path())} -print-all-exitcodes -n {cfg.plan.world_size} "
                f"-ppn {ranks_per_node}")

    # --- Slurm state ------------------------------------------------------------------------------
    def _slurm_job(self, slurm_job_id: int, *, fresh: bool = False, after: float = 0.0) -> SlurmJob | None:
        """The job as the last ``squeue`` saw it; a new ``squeue`` (for every job of this
        executor still running) when that is older than ``poll_s``, than ``after``, or ``fresh``."""
        age = time.time() - self._snapshot_at
        if fresh and age > 0.2 or age > self.slurm.poll_s or self._snapshot_at < after:
            ids = {slurm_job_id}
            for st in self._jobs.values():
                if isinstance(st.proc, SlurmRun) and st.proc.returncode is None:
                    ids.add(st.proc.slurm_job_id)
            self._snapshot_at = time.time()     # (also when squeue fails: asked again after poll_s)
            if self._unanswered:
                self.commands.ping()            # quick, and an InputError while the controller is away
            try:
                self._snapshot = list_jobs(self.commands, ids)
            except SlurmCommandError:
                self._unanswered = True
                raise
            finally:
                self._snapshot_at = time.time()
            self._unanswered = False
        return self._snapshot.get(slurm_job_id)

    def _reachable(self) -> bool:
        """Not while the last ``squeue`` failed (the controller away: ``scancel`` would retry
        for about ``MessageTimeout`` seconds and then fail)."""
        return not self._unanswered

    def _accounted(self, slurm_job_id: int) -> SlurmJob | None:
        job = list_jobs(self.commands, [slurm_job_id]).get(slurm_job_id)
        return job if job is not None else accounted_job(self.commands, slurm_job_id)

    def _scancel(self, *args) -> None:
        self.commands.run("scancel", *map(str, args), quiet_errors=("Invalid job id", "already completing",
                                                                     "Job/step already"))

    # --- moves ------------------------------------------------------------------------------------
    def _can_move_d2d(self, st: LaunchedJob, target: Allocation | None = None) -> bool:
        """Device to device only inside the running Slurm job: ``target`` keeps its
        allocation (the same Slurm nodes with the same ranks on each)."""
        if target is None or self.config.move_path != "d2d" or st.proc is None or st.stopping:
            return False
        try:
            same = self._placement(target) == self._layout.get(st.job.job_id)
        except InputError:
            return False
        return same and st.proc.poll() is None

    # --- re-adoption ----------------------------------------------------------------------------
    def find_running(self) -> list[SlurmLaunch]:
        """This service's launches Slurm still has pending or running (by the tag in their
        comment or name), oldest first."""
        out = []
        for j in list_jobs(self.commands).values():
            mine = parse_launch(j, self.slurm.tag)
            if mine is not None and not j.ended:
                out.append(SlurmLaunch(mine[0], mine[1], j.job_id, j.state))
        return sorted(out, key=lambda launch: launch.slurm_job_id)

    def adopt(self, job: Job, alloc: Allocation, plan: Plan | ParallelPlan | None,
              launch_index: int) -> LaunchedJobProgress | None:
        """Take over launch ``launch_index`` of ``job`` (on ``alloc`` with ``plan``, as the
        caller recorded it) that an earlier executor started: no relaunch, nothing stopped;
        its progress is read on, and stop and moves work as for a launch of this executor's
        own. A launch that ended meanwhile is accounted from Slurm and the run folder
        (finished, or failed with Slurm's state) and reported by the next ``advance``. None
        when Slurm and the run folder know no such launch."""
        self._check_not_running(job)
        cfg, _ = self._config_for(job, alloc, plan, launch_index=launch_index)
        run_dir = Path(cfg.run_dir)
        found = [r for r in self.find_running() if r.job_id == str(job.job_id) and r.launch_index == launch_index]
        if found:
            slurm_id = found[-1].slurm_job_id
        else:
            try:
                slurm_id = int((run_dir / JOB_ID_FILE).read_text().strip())
            except (FileNotFoundError, ValueError):
                return None
        if not (run_dir / "config.json").is_file():
            return None
        self._layout[job.job_id] = self._placement(alloc)
        return self._adopted(job, alloc, cfg, None, SlurmRun(self, slurm_id, str(run_dir), 0.0), launch_index)

    def _found(self, run_dir: str | Path) -> SlurmLaunch | None:
        """The launch Slurm still runs for run folder ``<work>/<job>/launch_<n>``, if any."""
        run_dir = Path(run_dir)
        index = run_dir.name.removeprefix("launch_")
        if not index.isdigit():
            return None
        found = [r for r in self.find_running() if r.job_id == run_dir.parent.name and r.launch_index == int(index)]
        return found[-1] if found else None

    def left_running(self, run_dir: str) -> bool:
        """Whether Slurm still runs (or has pending) the launch of ``run_dir`` that an
        earlier process submitted."""
        return self._found(run_dir) is not None

    def stop_left(self, run_dir: str, pid: int | None = None, timeout_s: float = 60.0) -> bool:
        """Stop the Slurm job of a launch an earlier process submitted (``pid`` is unused
        here): the ``stop`` file asks its ranks to checkpoint and exit (a pending job is
        cancelled at once); after ``timeout_s``, ``scancel``. True when it ended on request."""
        found = self._found(run_dir)
        return True if found is None else self.stop_found(found, run_dir, timeout_s)

    def stop_found(self, launch: SlurmLaunch, run_dir: str | Path, timeout_s: float) -> bool:
        """Stop one launch ``find_running`` listed (see ``stop_left``)."""
        run = SlurmRun(self, launch.slurm_job_id, str(run_dir), 0.0)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / STOP_FILE).write_text("stop requested after a service restart\n")
        run.request_stop()
        try:
            run.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            run.kill()
            return False

    def stop_unknown(self, keep: set[tuple[str, int]], timeout_s: float) -> list[tuple[SlurmLaunch, bool]]:
        """Stop every launch of this service's tag Slurm still runs except those in ``keep``
        ((job, launch index) pairs: the launches the caller has taken over); each as
        ``stop_left`` does. Returns the launches stopped, each with whether it ended on request."""
        out = []
        for launch in self.find_running():
            if (launch.job_id, launch.launch_index) in keep:
                continue
            run_dir = Path(self.config.work_dir) / launch.job_id / f"launch_{launch.launch_index}"
            out.append((launch, self.stop_found(launch, run_dir, timeout_s)))
        return out

    def slurm_job_id(self, job_id: str) -> int | None:
        """The Slurm job of the job's current launch (None before any)."""
        proc = self._job(job_id).proc
        return proc.slurm_job_id if isinstance(proc, SlurmRun) else None
