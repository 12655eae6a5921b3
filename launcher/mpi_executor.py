"""``MpiExecutor``: the engine's Executor protocol (engine/core/executor.py) carried out with real
MPI-launched torch jobs. It satisfies the protocol structurally and does not import the
engine; ``progress`` returns ``LaunchedJobProgress``, field-for-field the engine's
``JobProgress``.

Per job, under ``work_dir/<job_id>/``: ``checkpoints/`` (shared by all launches of the
job, so a relaunch on another plan reshards from the last checkpoint), ``progress.json``
(written by rank 0), and one run directory per launch (``launch_<n>/``).

- ``launch``: validates the plan against the allocation (rank count, divisibility,
  memory on the allocation's GPU type), then starts mpiexec; ranks resume from the job's
  last checkpoint. A Wide-ResNet plan's tensor ranks run as data ranks (the launcher has
  no tensor-parallel convolution; same ranks, same training).
- ``stop``: asks the ranks to checkpoint and exit (SIGTERM, which mpiexec forwards, plus a
  ``stop`` file for ranks on other hosts), waits up to ``stop_timeout_s``, then kills the
  process group and every rank it recorded.
- ``release`` + ``reconfigure`` (a move): with ``move_path="d2d"`` (default) and a running
  job on this host, device to device (``launcher.d2d``): the running ranks stop at a step
  boundary, send the state slices whose owner changes to their new owners, rebuild on
  the new plan and continue (growing: new processes join; shrinking: surplus ranks
  park). Otherwise, or when that move fails or is refused: stop with a checkpoint, then
  launch the new plan (the load reshards). Every move's parts (drain, state movement
  and bytes, start-up, first step, warm-up, total) are in ``move_records``; its total
  (request to first new step) is the reconfiguration time and, times the GPUs, the
  GPU-seconds lost.
- ``advance``: polls until the executor's clock reaches ``until_s`` (or, by default,
  until a job finishes or fails) and returns the jobs that finished or failed. A dead
  rank makes mpiexec exit (gloo raises on the survivors within seconds), which the next
  poll reports as a failure naming the exit status and the ranks' last error line.
- A launch whose ranks ran out of memory (``out_of_memory``: torch's CUDA
  ``OutOfMemoryError``, CPU allocation failures, Python's ``MemoryError``, the launcher's
  own memory check) is a measured infeasible shape: its failure says "out of memory"
  and ``runs_on(job, shape)`` is False from then on, so the engine does not propose that
  shape for that job again and does not count the run as a failure.

The clock: ``now_s`` = ``config.epoch_s`` + wall seconds since the executor was built.
Allocations map to hosts through ``config.node_hosts`` (node id -> host name); with no
mapping every rank runs on this host.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Shape
from instances.jobs import Job
from instances.models import get_model
from instances.plan import Plan

from . import d2d, move_record, netaddr
from . import launch as _launch
from .checkpoint import latest_checkpoint
from .config import MOVE_PATHS, OptimizerConfig, ParallelPlan, TrainConfig
from .run_handle import DetachedRun, LocalRun, RunHandle, read_launcher, write_launcher
from .telemetry import NONFINITE, read_progress, write_progress
from .validate import validate
from .worker import CURRENT_FILE, STOP_FILE


@dataclass(frozen=True)
class MpiExecutorConfig:
    work_dir: str
    telemetry_store: str | None = None          # None: measured runs are not recorded
    checkpoint_every: int = 50                  # steps between periodic checkpoints (0: none)
    checkpoint_interval_s: float = 60.0         # and at least this often, in seconds of training (0: none)
    stop_timeout_s: float = 60.0                # checkpoint-and-exit deadline before SIGKILL
    poll_interval_s: float = 0.2
    return_on_event: bool = True                # advance() returns when a job finishes/fails
    node_hosts: Mapping[int, str] = field(default_factory=dict)
    memory_device: str | None = None            # GPU type for the memory check; None: the allocation's
    device: str = "auto"
    seed: int = 0
    step_delay_s: float = 0.0                   # tests: slow tiny jobs down
    epoch_s: float = 0.0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    move_path: str = "d2d"                      # "d2d": device-to-device moves where possible; "storage"
    move_timeout_s: float = 300.0               # a d2d move not done by then falls back to storage
    data_roots: tuple[str, ...] | None = None   # jobs' data files must lie in these folders (checked at every
                                                # launch and by the ranks; launcher/datafile.py); None: anywhere
    # a running launch whose ranks write nothing (no step, progress or event) for this long, start-up
    # included, is killed and ends as a failed run (_watch_stall); None: never
    run_stall_s: float | None = None

    def __post_init__(self):
        if not self.work_dir:
            raise InputError("must be a directory path", field="work_dir")
        if self.move_path not in MOVE_PATHS:
            raise InputError(f"must be one of {', '.join(MOVE_PATHS)}, got {self.move_path!r}", field="move_path")
        if not self.move_timeout_s > 0:
            raise InputError("must be > 0", field="move_timeout_s")
        if self.run_stall_s is not None and not self.run_stall_s > 0:
            raise InputError(f"must be > 0 seconds (or None: never), got {self.run_stall_s!r}", field="run_stall_s")
        if self.checkpoint_every < 0 or not self.stop_timeout_s > 0 or not self.poll_interval_s > 0:
            raise InputError("checkpoint_every >= 0, stop_timeout_s > 0, poll_interval_s > 0",
                             field="executor")


@dataclass(frozen=True)
class LaunchedJobProgress:
    """Same fields as ``engine.core.executor.JobProgress``."""
    job_id: str
    iterations_done: float
    running: bool
    finished: bool = False
    finished_at_s: float | None = None
    failed: str | None = None
    final: bool = False
    last_checkpoint_iteration: float = 0.0
    measured_iteration_time_s: float | None = None
    measured_iterations: float = 0.0
    wall_iteration_time_s: float | None = None
    launch_lost_gpu_s: float = 0.0
    reconfig_lost_gpu_s: float = 0.0


@dataclass(frozen=True)
class LaunchedTotals:
    """Same fields as ``engine.core.executor.ExecutorTotals``."""
    samples_done: float
    reconfig_lost_gpu_s: float


OUT_OF_MEMORY_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "MemoryError", "can't allocate memory",
                         "does not fit in memory")


def out_of_memory(text: str | None) -> bool:
    """Whether a failed launch's error output says a rank ran out of memory (torch's
    ``OutOfMemoryError``, the CPU allocator's "can't allocate memory", ``MemoryError``, or
    the launcher's own "does not fit in memory" check)."""
    return bool(text) and any(m in text for m in OUT_OF_MEMORY_MARKERS)


@dataclass
class LaunchedJob:
    """What the executor keeps of one job across its launches (and a subclass's, e.g.
    ``SlurmExecutor``)."""
    job: Job
    cfg: TrainConfig
    hostfile: str | None
    proc: RunHandle | None = None               # the current launch's ranks (``launcher.run_handle``)
    launches: int = 0
    stopping: bool = False
    finished: bool = False
    failed: str | None = None
    final: bool = False                         # the failure recurs on any retry (a non-finite loss)
    ended_at_s: float | None = None
    reported: bool = False
    released_at: float | None = None            # wall time a move's stop was requested (``release``)
    reconfiguration_s: list[float] = field(default_factory=list)
    gpus: int = 0                               # of the current (or last) launch
    shape: Shape | None = None                  # of the current (or last) launch's allocation
    launch_started: float | None = None         # wall time of a launch from the queue, until its first step
    launch_lost_gpu_s: float = 0.0              # GPU-seconds from a launch to its first step
    reconfig_lost_gpu_s: float = 0.0            # GPU-seconds from a move's stop request to its first step
    steps_seen: float = 0.0                     # the last progress read (to count steps trained)
    steps_trained: float = 0.0                  # steps computed over all launches (lost ones included)
    steps_final: bool = True                    # the current launch's steps are all counted (it ended)
    joiners: list = field(default_factory=list)  # mpiexec of processes that joined a d2d move (grow)
    leaving: list = field(default_factory=list)  # run handles of ranks that moved the job to other hosts, exiting
    host_slots: tuple = ()                      # ((host, ranks), ...) of the current launch over hosts
    move_generation: int = 0                    # d2d moves requested in the current launch
    moves: list[dict] = field(default_factory=list)     # move records (launcher.move_record)
    stalled: str | None = None                  # why the current launch was killed as stalled (_watch_stall)
    stall_kill_at: float | None = None          # time.time() of the last kill of a stalled launch
    open_moves: list[dict] = field(default_factory=list)  # records still waiting for their first steps
    released_path: str | None = None            # how the pending release will move ("d2d"/"storage")
    last_stop: dict | None = None               # plan, run dir and exit time of the last stop


class MpiExecutor:
    def __init__(self, config: MpiExecutorConfig | None = None, **kwargs):
        """``MpiExecutor(MpiExecutorConfig(work_dir=...))`` or ``MpiExecutor(work_dir=...)``."""
        if config is None:
            config = MpiExecutorConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either a MpiExecutorConfig or its fields as keywords, not both")
        self.config = config
        self._t0 = time.monotonic()
        self._jobs: dict[str, LaunchedJob] = {}
        self._job_options: dict[str, dict] = {}
        self._out_of_memory: set[tuple[str, Shape | None]] = set()    # (job id, shape) whose launch ran out of memory
        self._unreachable: frozenset[str] = frozenset()     # hosts the caller finds unreachable (set_unreachable)
        Path(config.work_dir).mkdir(parents=True, exist_ok=True)

    # --- clock -------------------------------------------------------------------------
    def now_s(self) -> float:
        return self.config.epoch_s + time.monotonic() - self._t0

    # --- protocol ------------------------------------------------------------------------
    def launch(self, job: Job, alloc: Allocation, plan: Plan | ParallelPlan | None, now_s: float, *,
               launch_index: int | None = None) -> None:
        """Start ``job``; ``launch_index`` names its run directory (``launch_<n>``; default:
        the next one after those already in the job's folder, so a new executor over an
        old work folder never reuses one)."""
        st = self._jobs.get(job.job_id)
        if st is not None and st.proc is not None and st.proc.poll() is None:
            raise RuntimeError(f"job {job.job_id} is already running")
        if launch_index is None:
            launch_index = self.next_launch_index(job.job_id)
        cfg, hostfile = self._config_for(job, alloc, plan, launch_index=launch_index)
        device_type = self.config.memory_device or alloc.grid.gpu_type
        validate(cfg, ranks=alloc.grid.num_gpus, device_type=device_type)
        if st is None:
            st = self._jobs[job.job_id] = LaunchedJob(job, cfg, hostfile)
        # the fence first: from here on no rank of an earlier launch of the job saves a checkpoint
        # or writes its progress (ranks cut off that train on, launcher.worker), so the checkpoint
        # this launch resumes from is the latest one now, whatever the progress file last said
        Path(cfg.progress_path).parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(Path(cfg.progress_path).parent / CURRENT_FILE, Path(cfg.run_dir).name)
        prev = read_progress(cfg.progress_path) or {}
        found = latest_checkpoint(cfg.checkpoint_dir)
        ck = found[0] if found is not None else prev.get("last_checkpoint_step")
        write_progress(cfg.progress_path, status="starting", iterations_done=ck or 0, steps_total=cfg.steps,
                       last_checkpoint_step=ck, iteration_time_s=None)
        st.cfg, st.hostfile, st.host_slots = cfg, hostfile, self._host_slots(alloc)
        st.stopping, st.finished, st.failed, st.ended_at_s, st.reported = False, False, None, None, False
        st.final = False
        st.shape = alloc.grid.shape
        st.gpus, st.launch_started, st.steps_seen = alloc.grid.num_gpus, time.time(), float(ck or 0)
        st.steps_final = False
        st.joiners, st.move_generation = [], 0
        st.stalled, st.stall_kill_at = None, None
        st.proc = self._start_run(job, cfg, hostfile, alloc)
        st.launches += 1
        self._record_launcher(st)

    def _start_run(self, job: Job, cfg: TrainConfig, hostfile: str | None, alloc: Allocation) -> RunHandle:
        """Start the ranks of one launch (here: mpiexec on this host or over ``hostfile``)."""
        return LocalRun(_launch.start(cfg, hostfile), cfg.run_dir)

    def _record_launcher(self, st: LaunchedJob) -> None:
        """Keep in the run folder which processes of this host run the launch (``run_handle.
        write_launcher``), for a restarted service to take it over (``adopt``)."""
        if isinstance(st.proc, (LocalRun, DetachedRun)):
            write_launcher(st.cfg.run_dir, st.proc, [p.pid for p in st.joiners])

    def stop(self, job_id: str, now_s: float) -> None:
        st = self._job(job_id)
        if st.proc is None or st.proc.poll() is not None:
            self._poll(st)
            return
        st.stopping = True
        (Path(st.cfg.run_dir) / STOP_FILE).write_text("stop requested by the executor\n")
        st.proc.request_stop()                          # SIGTERM to every rank
        # ranks on a host the caller finds unreachable can hear neither: killed at once (the job
        # resumes from its last checkpoint; if they train on, cut off, the next launch fences them)
        cut = bool({h for h, _ in st.host_slots} & self._unreachable)
        try:
            st.proc.wait(timeout=0 if cut else self.config.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self._kill(st)
            st.proc.wait()
        self._wait_joiners(st)
        st.ended_at_s = self.now_s()
        st.last_stop = {"plan": _plan3(st.cfg.plan), "run_dir": st.cfg.run_dir, "exited_at": time.time()}
        prog = read_progress(st.cfg.progress_path) or {}
        if prog.get("status") not in ("stopped", "finished"):     # a run that completed stays finished
            ck = prog.get("last_checkpoint_step") or 0
            write_progress(st.cfg.progress_path, status="stopped", iterations_done=ck,
                           steps_total=st.cfg.steps, last_checkpoint_step=prog.get("last_checkpoint_step"),
                           iteration_time_s=prog.get("iteration_time_s"))

    def release(self, job_id: str, now_s: float, *, target: Allocation | None = None) -> None:
        """First half of a move, on the path ``released_path`` then names. ``"storage"``:
        stopped with a checkpoint (frees the GPUs for other movers). ``"d2d"``
        (``move_path="d2d"``, a running job on this host): nothing stops yet; the ranks
        keep training until ``reconfigure`` moves them (on one host nothing binds a rank
        to the GPUs the allocation named). ``target``: the allocation the job moves to,
        where the caller knows it (an executor whose device-to-device moves depend on it
        reads it)."""
        st = self._job(job_id)
        t0 = time.time()
        if self._can_move_d2d(st, target):
            st.released_path = "d2d"
        else:
            self.stop(job_id, now_s)
            st.released_path = "storage"
        st.released_at = t0

    def released_path(self, job_id: str) -> str | None:
        """How the job's pending move will go (``"d2d"``/``"storage"``), None if none is pending."""
        st = self._job(job_id)
        return st.released_path if st.released_at is not None else None

    def reconfigure(self, job_id: str, alloc: Allocation, plan: Plan | ParallelPlan | None, now_s: float, *,
                    launch_index: int | None = None) -> None:
        """Second half of a move (or the whole move without a ``release``): device to
        device where possible, else (or when that fails) stop with a checkpoint and relaunch
        the new plan from storage (in run folder ``launch_<launch_index>``, default the
        next). A device-to-device move continues in the launch's run folder. Each move's
        parts go to ``move_records``."""
        st = self._job(job_id)
        if st.released_at is None:
            self.release(job_id, now_s, target=alloc)
        t0, st.released_at = st.released_at, None
        path, reason = "storage", None
        if st.released_path == "d2d":
            reason, began = self._move_d2d(st, alloc, plan, t0) if self._can_move_d2d(st, alloc) else \
                ("the job ended before the move", True)
            if reason is None:
                return
            path = "storage-fallback"
            if began:
                self._end_failed_move(st)
            else:                               # nothing moved yet: the ranks trained on; stop with a checkpoint
                self.stop(job_id, now_s)
        self.launch(st.job, alloc, plan, now_s, launch_index=launch_index)
        self._count_as_move(job_id, t0, path=path, reason=reason)

    def _count_as_move(self, job_id: str, stop_requested_at: float, *, path: str = "storage",
                       reason: str | None = None) -> None:
        """The job's current launch continues a move whose stop was requested at
        ``stop_requested_at`` (wall time): its time to the first step is a reconfiguration,
        recorded with its parts (``move_records``)."""
        st = self._job(job_id)
        st.launch_started = None
        stop = st.last_stop or {}
        save = next((e for e in reversed(_launch.read_events(stop["run_dir"])) if e["event"] == "save"),
                    None) if stop else None
        rec = move_record.storage_record(stop.get("plan", _plan3(st.cfg.plan)), _plan3(st.cfg.plan),
                                         requested_at=stop_requested_at,
                                         exited_at=stop.get("exited_at", stop_requested_at),
                                         save=save if save and save.get("why") in ("stop", "move_refused") else None,
                                         path=path, reason=reason)
        rec["_run_dir"], rec["_gpus"] = st.cfg.run_dir, st.gpus
        st.moves.append(rec)
        st.open_moves.append(rec)

    def move_records(self, job_id: str) -> list[dict]:
        """Every move of the job so far with its parts (``launcher.move_record``); the last
        one's first step, total and warm-up fill in as its steps run."""
        st = self._job(job_id)
        self._poll(st)
        return [{k: v for k, v in r.items() if not k.startswith("_")} for r in st.moves]

    def progress(self, job_id: str) -> LaunchedJobProgress:
        st = self._job(job_id)
        self._poll(st)
        prog = read_progress(st.cfg.progress_path) or {}
        running = st.proc is not None and st.proc.poll() is None
        done = prog.get("iterations_done") or 0
        if not running and not st.finished:
            done = prog.get("last_checkpoint_step") or 0      # what survives the stop/failure
        return LaunchedJobProgress(
            job_id=job_id, iterations_done=float(done), running=running, finished=st.finished,
            finished_at_s=st.ended_at_s if (st.finished or st.failed) else None, failed=st.failed, final=st.final,
            last_checkpoint_iteration=float(prog.get("last_checkpoint_step") or 0),
            measured_iteration_time_s=prog.get("mean_iteration_time_s") or prog.get("iteration_time_s"),
            measured_iterations=float(prog.get("measured_iterations") or 0),
            wall_iteration_time_s=prog.get("wall_iteration_time_s"),
            launch_lost_gpu_s=st.launch_lost_gpu_s, reconfig_lost_gpu_s=st.reconfig_lost_gpu_s)

    def runs_on(self, job, shape) -> bool:
        """False once a launch of ``job`` on ``shape`` ran out of memory."""
        return (job.job_id, shape) not in self._out_of_memory

    def totals(self) -> LaunchedTotals:
        """Samples computed by every launch so far (from the jobs' progress files, lost
        steps included) and GPU-seconds spent in measured moves."""
        samples = lost = 0.0
        for st in self._jobs.values():
            self._poll(st)
            samples += st.steps_trained * st.job.global_batch
            lost += st.reconfig_lost_gpu_s
        return LaunchedTotals(samples, lost)

    def next_launch_index(self, job_id: str) -> int:
        """One past the highest ``launch_<n>`` folder of the job (0 for a new job)."""
        job_dir = Path(self.config.work_dir) / job_id
        used = [int(p.name.removeprefix("launch_")) for p in job_dir.glob("launch_*")
                if p.name.removeprefix("launch_").isdigit()] if job_dir.is_dir() else []
        st = self._jobs.get(job_id)
        return max([st.launches if st else 0] + [n + 1 for n in used])

    def has_events(self) -> bool:
        """Whether a job finished or failed since ``advance`` last reported (it stays to report)."""
        for st in self._jobs.values():
            self._poll(st)
            if (st.finished or st.failed) and not st.reported:
                return True
        return False

    def advance(self, until_s: float) -> list[LaunchedJobProgress]:
        out: list[LaunchedJobProgress] = []
        while True:
            for jid, st in self._jobs.items():
                self._poll(st)
                if (st.finished or st.failed) and not st.reported:
                    st.reported = True
                    out.append(self.progress(jid))
            if self.now_s() >= until_s or (out and self.config.return_on_event):
                return out
            time.sleep(min(self.config.poll_interval_s, max(0.0, until_s - self.now_s())))

    # --- extras ---------------------------------------------------------------------------
    def reconfiguration_times_s(self, job_id: str) -> list[float]:
        """Measured stop + checkpoint + relaunch + reshard + first step, per reconfiguration."""
        st = self._job(job_id)
        self._poll(st)
        return list(st.reconfiguration_s)

    def set_job_options(self, job_id: str, *, seed: int | None = None, data_path: str | None = None) -> None:
        """Training options of one job (its seed and data file) for all its launches;
        default: the executor's seed and synthetic data."""
        self._job_options[job_id] = {k: v for k, v in (("seed", seed), ("data_path", data_path)) if v is not None}

    def job(self, job_id: str):
        """The job as it was launched."""
        return self._job(job_id).job

    def process(self, job_id: str) -> RunHandle | None:
        """The ranks of the job's current launch (None before any): ``.pid`` is mpiexec's."""
        return self._job(job_id).proc

    def run_dir(self, job_id: str) -> str:
        return self._job(job_id).cfg.run_dir

    def checkpoint_dir(self, job_id: str) -> str:
        return self._job(job_id).cfg.checkpoint_dir

    # --- launches an earlier process left (a restarted service) -----------------------------
    def left_running(self, run_dir: str) -> bool:
        """Whether ranks of the launch in ``run_dir``, started by an earlier process, still
        run (here: its mpiexec the run folder records, or recorded rank pids alive on this host)."""
        return self._left_launcher(run_dir) is not None or bool(_launch.live_rank_pids(run_dir))

    def stop_left(self, run_dir: str, pid: int | None, timeout_s: float) -> bool:
        """Stop the ranks of a launch an earlier process started (``pid``: its mpiexec, where
        recorded; else the one the run folder records): asked to checkpoint and exit (mpiexec
        forwards SIGTERM to the ranks on every host; the ``stop`` file reaches them through
        the shared folder), killed after ``timeout_s``. True when they exited on request."""
        left = self._left_launcher(run_dir)
        return _launch.stop_detached(run_dir, pid or (left.pid if left is not None else None), timeout_s)

    @staticmethod
    def _left_launcher(run_dir: str | Path) -> DetachedRun | None:
        """The launch's mpiexec the run folder records (``launcher.json``), if it still runs."""
        rec = read_launcher(run_dir)
        if rec is None:
            return None
        run = DetachedRun(run_dir, rec["pid"], rec.get("start"), rec.get("log") or "")
        return run if run.alive() else None

    def adopt(self, job: Job, alloc: Allocation, plan: Plan | ParallelPlan | None,
              launch_index: int) -> LaunchedJobProgress | None:
        """Take over launch ``launch_index`` of ``job`` (on ``alloc`` with ``plan``, as the
        caller recorded it) that an earlier process of this host started (a service
        restarted after a crash): its mpiexec, and those of processes that joined it in a
        move, found by the pid and start time its run folder records (``launcher.json``),
        are watched from here without being touched: no relaunch; its ranks train on, on
        every host; progress, stop and moves work as for a launch of this executor's own. A
        launch that ended meanwhile is accounted from its run folder (finished, or failed
        with its ranks' exit codes) and reported by the next ``advance``. None when the run
        folder records no such launch."""
        self._check_not_running(job)
        cfg, hostfile = self._config_for(job, alloc, plan, launch_index=launch_index)
        rec = read_launcher(cfg.run_dir)
        if rec is None or not (Path(cfg.run_dir) / "config.json").is_file():
            return None
        run_dir = cfg.run_dir
        proc = DetachedRun(run_dir, rec["pid"], rec.get("start"), rec.get("log") or "")
        joiners = [DetachedRun(run_dir, p, start, "") for p, start in rec.get("joiners") or []]
        if rec.get("log"):                          # the job moved to other hosts: the hostfile of that move
            hostfile = str(Path(run_dir) / f"hostfile_move_{rec['log'].removeprefix('join_')}")
        return self._adopted(job, alloc, cfg, hostfile, proc, launch_index, joiners)

    def _check_not_running(self, job: Job) -> None:
        held = self._jobs[job.job_id].proc if job.job_id in self._jobs else None
        if held is not None and held.poll() is None:
            raise RuntimeError(f"job {job.job_id} is already running in this executor")

    def _adopted(self, job: Job, alloc: Allocation, cfg: TrainConfig, hostfile: str | None, proc: RunHandle,
                 launch_index: int, joiners: list | None = None) -> LaunchedJobProgress:
        """Keep ``proc`` (a launch an earlier process started, in ``cfg.run_dir``) as the
        job's current launch, its progress read on from its run folder (``adopt``)."""
        run_dir = Path(cfg.run_dir)
        st = self._jobs.get(job.job_id)
        if st is None:
            st = self._jobs[job.job_id] = LaunchedJob(job, cfg, hostfile)
        prog = read_progress(cfg.progress_path or "") or {}
        st.cfg, st.hostfile, st.shape, st.gpus = cfg, hostfile, alloc.grid.shape, alloc.grid.num_gpus
        st.host_slots = self._host_slots(alloc)
        st.stopping, st.finished, st.failed, st.final, st.ended_at_s, st.reported = False, False, None, False, None, \
            False
        st.launches = max(st.launches, launch_index + 1)
        st.steps_seen, st.steps_final = float(prog.get("iterations_done") or 0), False
        st.launch_started = None if _launch.read_results(run_dir) else time.time()
        st.joiners, st.leaving, st.stalled, st.stall_kill_at = list(joiners or []), [], None, None
        st.move_generation = max([int(e.get("generation") or 0) for e in _launch.read_events(run_dir)
                                  if e.get("event") in ("moved", "move_refused")] + [0])
        st.proc = proc
        self._poll(st)
        return self.progress(job.job_id)

    def request_checkpoint(self, job_id: str) -> None:
        """Ask a running job to checkpoint at the end of its current step and continue."""
        st = self._job(job_id)
        (Path(st.cfg.run_dir) / "checkpoint").write_text("checkpoint requested\n")

    def close(self) -> None:
        """Kill every job still running (no checkpoint)."""
        for st in self._jobs.values():
            if st.proc is not None and any(p.poll() is None for p in [st.proc, *st.joiners, *st.leaving]):
                self._kill(st)
                for p in [st.proc, *st.joiners, *st.leaving]:
                    p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def launched_job(self, job_id: str) -> LaunchedJob:
        """What the executor keeps of ``job_id`` (its launches, moves, failure); ``KeyError``
        if it never launched it."""
        return self._job(job_id)

    # --- internals ------------------------------------------------------------------------
    def _job(self, job_id: str) -> LaunchedJob:
        if job_id not in self._jobs:
            raise KeyError(f"job {job_id!r} was never launched by this executor")
        return self._jobs[job_id]

    def _kill(self, st: LaunchedJob) -> None:
        """SIGKILL to every process of the job (its launch, processes that joined a move, and
        ranks that moved it to other hosts and are still leaving: their mpiexec's group only,
        the run folder's pids being the new ranks')."""
        if st.proc is not None:
            st.proc.kill()
        for p in st.joiners:
            _launch.kill_job(p, st.cfg.run_dir, signal.SIGKILL)
        for p in st.leaving:
            if p.poll() is None and p.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

    def _wait_joiners(self, st: LaunchedJob) -> None:
        """Processes that joined a move end with the job (same last step); kill stragglers."""
        for p in st.joiners:
            try:
                p.wait(timeout=self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _launch.kill_job(p, st.cfg.run_dir, signal.SIGKILL)
                p.wait()

    # --- device-to-device moves ------------------------------------------------------------
    def set_unreachable(self, hosts: frozenset[str]) -> None:
        """The hosts that the caller finds unreachable now (``engine/service/host_watch.py``):
        no device-to-device move starts from or to them (both ends must talk); such a job
        moves through storage (a stop, then the ranks that cannot be reached are killed)."""
        self._unreachable = frozenset(hosts)

    def _can_move_d2d(self, st: LaunchedJob, target: Allocation | None = None) -> bool:
        """Whether a move of ``st`` (to ``target``, where known) can go device to device: here,
        a running job (on this host, or over hosts with ``node_hosts``, all of them reachable)."""
        if self._unreachable:
            ends = {h for h, _ in st.host_slots}
            if target is not None:
                with contextlib.suppress(InputError):
                    ends |= {h for h, _ in self._host_slots(target)}
            if ends & self._unreachable:
                return False
        return (self.config.move_path == "d2d" and (bool(self.config.node_hosts) or st.hostfile is None)
                and st.proc is not None and st.proc.poll() is None and not st.stopping
                and all(p.poll() is None for p in st.joiners))

    def _move_d2d(self, st: LaunchedJob, alloc: Allocation, plan: Plan | ParallelPlan | None,
                  t0: float) -> tuple[str | None, bool]:
        """Ask the running ranks to move to ``plan`` device to device (``launcher.d2d``):
        in place, or to new processes on the allocation's hosts when they differ from the
        job's (a relocation). (None, True) when done, else (why not, whether the move
        began: the caller falls back to storage, stopping with a checkpoint when it did not)."""
        gen = st.move_generation + 1
        cfg, hostfile = self._config_for(st.job, alloc, plan, launch_index=0, run_dir=st.cfg.run_dir,
                                         hostfile_name=f"hostfile_move_{gen}")
        validate(cfg, ranks=alloc.grid.num_gpus, device_type=self.config.memory_device or alloc.grid.gpu_type)
        if cfg.model != st.cfg.model:
            return "a different model", False
        st.move_generation = gen
        old = st.cfg.plan
        slots = self._host_slots(alloc)
        relocate = bool(self.config.node_hosts) and slots != st.host_slots
        req = d2d.MoveRequest(gen, t0, _plan3(old), old.stage_layers, cfg.to_json(), relocate)
        run_dir = Path(st.cfg.run_dir)
        grow = cfg.plan.world_size - old.world_size
        joiners = None
        if relocate or grow > 0:     # new processes start now: their start-up overlaps the training or the drain
            move_path = run_dir / f"move_{gen}.json"
            req.write(move_path)
            count = cfg.plan.world_size if relocate else grow
            joiners = _launch.start_joiners(cfg, move_path, old.world_size, count, gen,
                                            hostfile if relocate else None)
            st.joiners.append(joiners)
            self._record_launcher(st)
            if relocate and (why := self._wait_ready(st, joiners, gen, count, hostfile)) is not None:
                _launch.kill_job(joiners, run_dir, signal.SIGKILL)
                joiners.wait()
                st.joiners.remove(joiners)
                self._record_launcher(st)
                return why, False
        req.write(run_dir / d2d.MOVE_FILE)
        deadline = time.monotonic() + self.config.move_timeout_s
        while True:
            ev = next((e for e in reversed(_launch.read_events(run_dir))
                       if e.get("generation") == gen and e["event"] in ("moved", "move_refused")), None)
            if ev is not None and ev["event"] == "moved":
                break
            if ev is not None:
                return f"refused by the ranks: {ev.get('reason')}", True
            dead = [p.returncode for p in [st.proc, *st.joiners] if p.poll() is not None]
            if dead and not (relocate and st.proc.returncode == 0):     # (the old ranks leave once moved)
                return f"a process of the move exited (status {dead[0]}) before the move was done", True
            if time.monotonic() > deadline:
                return f"not done after {self.config.move_timeout_s} s", True
            time.sleep(0.05)
        if relocate:                        # the job now runs in the processes it moved to
            assert joiners is not None
            st.joiners.remove(joiners)
            st.leaving.append(st.proc)
            st.proc = LocalRun(joiners, run_dir, log=f"join_{gen}")
            st.hostfile, st.host_slots = hostfile, slots
            self._record_launcher(st)
        st.cfg, st.gpus = cfg, alloc.grid.num_gpus
        rec = {**move_record.d2d_record(ev, t0), "_run_dir": st.cfg.run_dir, "_gpus": st.gpus}
        st.moves.append(rec)
        st.open_moves.append(rec)
        st.launch_started = None
        return None, True

    def _wait_ready(self, st: LaunchedJob, joiners, gen: int, count: int, hostfile: str | None) -> str | None:
        """Until the ``count`` processes a relocation started are up and waiting for the move
        (bounded by ``move_timeout_s``); None when they are, else why not."""
        run_dir = Path(st.cfg.run_dir)
        hosts = ", ".join(h for h, _ in _launch.hostfile_hosts(hostfile)) if hostfile else "this host"
        deadline = time.monotonic() + self.config.move_timeout_s
        while d2d.ready_count(run_dir, gen) < count:
            if joiners.poll() is not None:
                err = _launch.tail(run_dir / f"join_{gen}.stderr.log", 2000).strip().splitlines()
                return (f"the new processes on {hosts} exited (status {joiners.returncode}) before they were up"
                        + (f": {err[-1][:300]}" if err else ""))
            if st.proc is None or st.proc.poll() is not None:
                return "the job's ranks exited before the move"
            if time.monotonic() > deadline:
                return f"the new processes on {hosts} were not up after {self.config.move_timeout_s:g} s"
            time.sleep(0.05)
        return None

    def _end_failed_move(self, st: LaunchedJob) -> None:
        """After a d2d move that failed or was refused: every process of the job gone (a
        refusal saved a checkpoint and exits by itself; a failure is torn down by Hydra
        inside one mpiexec; what is left is killed, at once when a process of the move has
        already exited: the others wait for it in a collective, which gloo does not end
        when a peer under another mpiexec dies), the progress at the last checkpoint, which
        the relaunch resumes from. Not a job failure: the move falls back."""
        st.stopping = True
        if all(p.poll() is None for p in [st.proc, *st.joiners]):
            try:
                st.proc.wait(timeout=self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if any(p.poll() is None for p in [st.proc, *st.joiners]):
            self._kill(st)
        for p in [st.proc, *st.joiners]:
            p.wait()
        self._poll(st)
        prog = read_progress(st.cfg.progress_path) or {}
        write_progress(st.cfg.progress_path, status="stopped", iterations_done=prog.get("last_checkpoint_step") or 0,
                       steps_total=st.cfg.steps, last_checkpoint_step=prog.get("last_checkpoint_step"),
                       iteration_time_s=prog.get("iteration_time_s"))
        st.last_stop = {"plan": _plan3(st.cfg.plan), "run_dir": st.cfg.run_dir, "exited_at": time.time()}

    def _fill_moves(self, st: LaunchedJob) -> None:
        """First step, total and warm-up of moves whose steps ran (each from the results of
        its own launch, after it and before the next move)."""
        results: dict[str, list[dict]] = {}
        for rec in list(st.open_moves):
            run_dir = rec["_run_dir"]
            res = results.setdefault(run_dir, _launch.read_results(run_dir))
            nxt = next((m["requested_at"] for m in st.moves if m["requested_at"] > rec["requested_at"]), None)
            after = rec["ready_at"] if rec["path"] == "d2d" else rec["requested_at"]
            mine = [r for r in res if r["time"] > after and (nxt is None or r["time"] < nxt)]
            if not mine:
                continue
            if rec["path"] != "d2d" and rec["startup_s"] is None:
                ev = _launch.read_events(run_dir)
                move_record.add_relaunch(rec, next((e for e in ev if e["event"] == "load"), None),
                                         next((e for e in ev if e["event"] == "ready"), None))
            counted = rec["total_s"] is not None
            if move_record.finish(rec, mine) or nxt is not None:
                st.open_moves.remove(rec)
            if not counted:                     # the move's time to its first step: lost GPU time
                st.reconfiguration_s.append(rec["total_s"])
                st.reconfig_lost_gpu_s += rec["total_s"] * rec["_gpus"]

    def _poll(self, st: LaunchedJob) -> None:
        if st.leaving:                          # ranks that moved the job to other hosts: gone once they exit
            st.leaving = [p for p in st.leaving if p.poll() is None]
        if st.open_moves:
            self._fill_moves(st)
        if st.launch_started is not None:
            res = _launch.read_results(st.cfg.run_dir)
            if res:
                st.launch_lost_gpu_s += max(0.0, res[0]["time"] - st.launch_started) * st.gpus
                st.launch_started = None
        if not st.steps_final and st.proc is not None:
            ended = st.proc.poll() is not None          # read once more after the launch ended
            seen = float((read_progress(st.cfg.progress_path) or {}).get("iterations_done") or 0)
            if seen > st.steps_seen:
                st.steps_trained += seen - st.steps_seen
            st.steps_seen = seen
            st.steps_final = ended
        if st.proc is None or st.stopping or st.finished or st.failed:
            return
        rc = st.proc.poll()
        if rc is None:
            self._watch_stall(st)
            return
        st.ended_at_s = self.now_s()
        prog = read_progress(st.cfg.progress_path) or {}
        if rc == 0 and prog.get("status") == "finished":
            st.finished = True
            return
        if prog.get("status") == NONFINITE:          # the worker stopped itself, saying why
            st.failed, st.final = f"non-finite training: {prog.get('reason')}", True
            write_progress(st.cfg.progress_path, status="failed",
                           iterations_done=prog.get("last_checkpoint_step") or 0, steps_total=st.cfg.steps,
                           last_checkpoint_step=prog.get("last_checkpoint_step"),
                           iteration_time_s=prog.get("iteration_time_s"), reason=st.failed)
            return
        err = _launch.tail(getattr(st.proc, "stderr_log", Path(st.cfg.run_dir) / "stderr.log"),
                           4000).strip().splitlines()
        last = next((l for l in reversed(err) if "rank failed" in l or "Error" in l), err[-1] if err else "")
        oom = out_of_memory("\n".join(err))
        if oom:
            self._out_of_memory.add((st.job.job_id, st.shape))
        st.failed = ("out of memory: " if oom else "") + (f"{st.stalled}; " if st.stalled else "") + (
            f"{st.proc.describe_end(rc)} (progress status {prog.get('status')!r}; ranks that did "
            f"not reach the end of training: {_launch.ranks_not_done(st.cfg.run_dir)}): {last[:300]}")
        write_progress(st.cfg.progress_path, status="failed",
                       iterations_done=prog.get("last_checkpoint_step") or 0, steps_total=st.cfg.steps,
                       last_checkpoint_step=prog.get("last_checkpoint_step"),
                       iteration_time_s=prog.get("iteration_time_s"), reason=st.failed)

    def train_config(self, job: Job, alloc: Allocation, plan: Plan | ParallelPlan | None = None) -> TrainConfig:
        """The training configuration a first launch of ``job`` on ``alloc`` under ``plan``
        would start (None: the allocation's data ranks), without launching it: the plan as
        the launcher runs it (a Wide-ResNet's tensor ranks become data ranks), the job's
        folders, the executor's options. With ``node_hosts`` it writes the launch's
        hostfile, as a launch does."""
        return self._config_for(job, alloc, plan, launch_index=0)[0]

    def _reachable(self) -> bool:
        """Whether a kill can reach the ranks now (here: always)."""
        return True

    def _watch_stall(self, st: LaunchedJob) -> None:
        """A running launch whose ranks have written nothing (no step, progress or event:
        ``launch.last_sign_of_life``) for ``run_stall_s`` since it started running (start-up
        included: ranks that never start, e.g. Hydra's ``mpiexec`` waiting for proxies its
        ``srun`` failed to start, never write anything) is killed; it then ends as a failed
        run (``stalled`` in its reason) and the job resumes from its last checkpoint. A kill
        that did not end it is repeated every ``stop_timeout_s``; none while the ranks cannot
        be reached (``_reachable``: Slurm not answering)."""
        limit = self.config.run_stall_s
        since = st.proc.running_since if st.proc is not None else None
        if limit is None or since is None or st.stopping or not self._reachable():
            return
        now = time.time()
        if st.stalled is None:
            alive = max(since, _launch.last_sign_of_life(st.cfg.run_dir, st.cfg.progress_path) or since)
            if now - alive <= limit:
                return
            wrote = "nothing since it started running" if alive == since else \
                f"nothing for {now - alive:.0f} s"
            st.stalled = (f"stalled: its ranks wrote {wrote} (no step, progress or event for more than "
                          f"{limit:g} s), so it was killed")
        elif st.stall_kill_at is not None and now - st.stall_kill_at < self.config.stop_timeout_s:
            return
        st.stall_kill_at = now
        self._kill(st)

    def _host_slots(self, alloc: Allocation) -> tuple[tuple[str, int], ...]:
        """((host, ranks), ...) of an allocation in node order (() without ``node_hosts``)."""
        if not self.config.node_hosts:
            return ()
        nodes = sorted({n for n, _ in alloc.gpus})
        missing = [n for n in nodes if n not in self.config.node_hosts]
        if missing:
            raise InputError(f"no host name for nodes {missing}", field="node_hosts")
        return tuple((self.config.node_hosts[n], sum(1 for m, _ in alloc.gpus if m == n)) for n in nodes)

    def _config_for(self, job: Job, alloc: Allocation, plan: Plan | ParallelPlan | None,
                    launch_index: int, *, run_dir: str | None = None,
                    hostfile_name: str = "hostfile") -> tuple[TrainConfig, str | None]:
        """The launch's config (in run folder ``launch_<launch_index>``, or ``run_dir``) and,
        with ``node_hosts``, its hostfile (written there as ``hostfile_name``)."""
        job_dir = Path(self.config.work_dir) / job.job_id
        run_path = Path(run_dir) if run_dir else job_dir / f"launch_{launch_index}"
        if plan is None:
            pp = alloc.grid.pp
            plan = ParallelPlan(dp=alloc.grid.num_gpus // pp, tp=1, pp=pp, microbatches=pp)
        pplan = ParallelPlan.from_plan(plan)
        if pplan.tp > 1 and not get_model(job.model).is_transformer:
            # the launcher splits Wide-ResNet over data and pipeline ranks only: the tensor
            # ranks of the scheduler's plan become data ranks (same ranks, same training)
            pplan = replace(pplan, dp=pplan.dp * pplan.tp, tp=1)
        nodes = tuple(sorted({n for n, _ in alloc.gpus}))
        hostfile, slots = None, self._host_slots(alloc)
        if slots:
            run_path.mkdir(parents=True, exist_ok=True)
            hostfile = str(run_path / hostfile_name)
            Path(hostfile).write_text("".join(f"{h}:{k}\n" for h, k in slots))
        cfg = TrainConfig(
            model=job.model, plan=pplan, steps=int(job.num_iterations), global_batch=int(job.global_batch),
            seed=self._job_options.get(job.job_id, {}).get("seed", self.config.seed),
            data_path=self._job_options.get(job.job_id, {}).get("data_path"), data_roots=self.config.data_roots,
            checkpoint_dir=str(job_dir / "checkpoints"),
            checkpoint_every=self.config.checkpoint_every,
            checkpoint_interval_s=self.config.checkpoint_interval_s, run_dir=str(run_path),
            progress_path=str(job_dir / "progress.json"), telemetry_store=self.config.telemetry_store,
            device=self.config.device, gpu_type=alloc.grid.gpu_type, num_nodes=len(nodes),
            gpus_per_node=alloc.grid.shape.gpus_per_node, optimizer=self.config.optimizer,
            step_delay_s=self.config.step_delay_s,
            host_addrs=tuple((h, netaddr.address_of(h)) for h, _ in slots))
        return cfg, hostfile


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _plan3(plan) -> tuple[int, int, int]:
    return (plan.dp, plan.tp, plan.pp)
