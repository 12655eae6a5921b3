"""The service's executor: the launcher's ``MpiExecutor`` with every effect journaled in
the state store, so that a restart can tell what happened.

- a launch commits its intent (plan, GPUs, the next generation number) before mpiexec
  starts, then ``started`` with mpiexec's pid and run folder, then the job ``running``;
- a stop asks the ranks to checkpoint and exit (grace period, then kill), then records
  the checkpoint, ends the launch and puts the job back to ``queued``;
- a move is journaled as the end of the job's launch (``release``) followed by a new
  launch (``reconfigure``), whose intent comes after the move's ledger entry is stored
  (``before_move``: a crash between them leaves no move the ledger does not have).
  Device to device where the launcher can (one host, a running
  job): the ranks keep training through ``release`` and move their state in place; the
  new launch record continues in the same run folder, with the same mpiexec. Otherwise
  (or when the device-to-device move fails) a stop with a checkpoint and a relaunch that
  reshards from it. A crash between the two halves leaves a queued job: its checkpoint,
  and any ranks still training, which the restart asks to checkpoint and stop (nothing
  half-moved is trained on);
- a launch the launcher refuses before starting (the plan does not fit the allocation's
  memory, ...) is journaled as failed and reported to the round loop as a failed run;
  the job does not get that shape again; nor does it after a launch that ran out of
  memory (``MpiExecutor.runs_on``). A launch refused for the job's data file
  (``DataFileRefused``: gone, changed, outside the data roots) is reported as a final
  failure: the job fails for good with the reason;
- checkpoints and measured iteration times are recorded as the loop reads progress.

Job ids in the round loop are the store's job ids as strings. The generation number of a
launch names its run folder (``<work>/<job>/launch_<generation>``), except after a
device-to-device move, which continues in its predecessor's folder; the folder each
launch ran in is recorded with it (``pid_info["run_dir"]``, ``views.run_dirs``).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from engine.core.executor import ExecutorTotals, JobProgress
from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Shape
from instances.jobs import Job
from instances.plan import Plan
from launcher.datafile import DataFileRefused
from launcher.mpi_executor import MpiExecutor

from .store import StateConflict, Store

Fault = Callable[[str], None]            # test hook: called at named points (see daemon.FaultPoints)
MEASURE_EVERY_S = 60.0                   # a running job's iteration time is stored at most this often


def gpu_names(alloc: Allocation) -> list[str]:
    return [f"{n}:{i}" for n, i in alloc.gpus]


def plan_record(alloc: Allocation, plan: Plan | None) -> dict:
    g = alloc.grid
    rec: dict[str, Any] = {"gpu_type": g.gpu_type, "nodes": g.shape.num_nodes, "gpus_per_node": g.shape.gpus_per_node,
                           "pp": g.pp, "grid": str(g)}
    if plan is not None:
        rec.update(dp=plan.dp, tp=plan.tp, pp=plan.pp, microbatches=plan.microbatches,
                   stage_layers=list(plan.stage_layers))
    else:
        rec.update(dp=g.num_gpus // g.pp, tp=1, microbatches=g.pp)
    return rec


class JournaledExecutor:
    def __init__(self, mpi: MpiExecutor, store: Store, fault: Fault | None = None,
                 beat: Callable[[], None] | None = None, keep_measurements: int = 0,
                 before_move: Callable[[], None] | None = None, log: Callable[[str], None] | None = None):
        self.mpi, self.store = mpi, store
        self.log = log or (lambda message: None)     # the service's log (a fallback to storage is logged)
        self.before_move = before_move or (lambda: None)   # stores the move ledger's new entry (the service)
        self.keep_measurements = keep_measurements     # per job, newest iteration times kept (0: all)
        self.fault = fault or (lambda point: None)
        self.beat = beat or (lambda: None)            # each effect is a sign of life (Service.liveness)
        self.generation: dict[str, int] = {}          # job -> its current launch's generation
        self._refused: list[JobProgress] = []         # launches refused before starting
        self._infeasible: set[tuple[str, Shape]] = set()
        self._checkpoint_seen: dict[str, float] = {}
        self._measured_at: dict[str, float] = {}
        self._moves_recorded: dict[str, int] = {}     # job -> measured moves already in the store
        self.stop_reasons: dict[str, str] = {}         # job -> why its next stop happens (history)

    # -- effects -------------------------------------------------------------------
    def launch(self, job: Job, alloc: Allocation, plan: Any, now_s: float) -> None:
        self.beat()
        self._start(job.job_id, alloc, plan, now_s,
                    lambda gen: self.mpi.launch(job, alloc, plan, now_s, launch_index=gen))

    def _start(self, job_id: str, alloc: Allocation, plan: Any, now_s: float, start: Callable[[int], None],
               how: Callable[[], str] = lambda: "") -> None:
        """Journal a launch (intent, then started, then the job running) around ``start``
        (called with the new generation): a fresh launch, or the second half of a move
        (``how`` then says how it moved, for the job's history)."""
        jid = int(job_id)
        gen = self.store.launches.record_intent(jid, plan_record(alloc, plan), gpu_names(alloc))
        self.generation[job_id] = gen
        self.fault("after-launch-intent")
        try:
            start(gen)
        except InputError as e:                       # refused before anything started
            try:                                      # a refused device-to-device move: its ranks checkpoint
                self.mpi.stop(job_id, now_s)
                self._record_checkpoint(job_id, self.mpi.progress(job_id))
            except KeyError:                          # never launched: nothing runs
                pass
            self.store.launches.mark(jid, gen, "failed", reason=f"refused before start: {e}")
            data = isinstance(e, DataFileRefused)     # the job's data file, not the shape: no shape would do
            # Slurm did not answer (``SlurmRefused.transient``): no verdict on the job or its shape
            if not data and not getattr(e, "transient", False):
                self._infeasible.add((job_id, alloc.grid.shape))
            self._refused.append(JobProgress(job_id, self.mpi_iterations(job_id), False,
                                             finished_at_s=now_s, failed=f"launch refused: {e}", final=data,
                                             last_checkpoint_iteration=self.mpi_iterations(job_id)))
            return
        self.store.launches.mark(jid, gen, "started", pid_info=self._pid_info(job_id))
        self.store.jobs.set_status(jid, "running", f"launch {gen} on {alloc.grid}{how()}")

    def _pid_info(self, job_id: str) -> dict:
        """What a restart needs to find the launch's ranks: mpiexec's pid (local), the run
        folder, and the Slurm job id (on Slurm)."""
        proc = self.mpi.process(job_id)
        info: dict[str, Any] = {"pid": proc.pid if proc else None, "run_dir": self.mpi.run_dir(job_id)}
        slurm_id = getattr(proc, "slurm_job_id", None)
        if slurm_id is not None:
            info["slurm_job_id"] = int(slurm_id)
        return info

    def adopt(self, job: Job, alloc: Allocation, plan: Any, launch_index: int, generation: int) -> JobProgress | None:
        """Take over the store's active launch ``generation`` of ``job``, which runs in run
        folder ``launch_<launch_index>`` (``AdoptingExecutor.adopt``; a restarted service).
        Its checkpoint is recorded; None when the executor knows no such launch."""
        p = self.mpi.adopt(job, alloc, plan, launch_index)
        if p is None:
            return None
        self.generation[job.job_id] = generation
        self._record_checkpoint(job.job_id, p)
        return JobProgress(**p.__dict__)

    def stop(self, job_id: str, now_s: float, reason: str | None = None) -> None:
        """``reason``: for the job's history; else the one the service left in
        ``stop_reasons`` for this job (e.g. its node was drained), else "preempted"."""
        self.beat()
        self.mpi.stop(job_id, now_s)
        self._journal_stop(job_id, reason or self.stop_reasons.pop(job_id, "preempted"))

    def _journal_stop(self, job_id: str, reason: str, *, in_place: bool = False) -> None:
        """The store's side of a stop: the checkpoint, the launch ended, the job queued.
        ``in_place``: the first half of a device-to-device move (the ranks keep training
        until ``reconfigure``; a restart before it finds them and stops them)."""
        p = self.mpi.progress(job_id)
        jid, gen = int(job_id), self.generation[job_id]
        self._record_checkpoint(job_id, p)
        ck = int(p.last_checkpoint_iteration)
        what = "ranks keep training until the move" if in_place else f"stopped with a checkpoint at step {ck}"
        if self.store.launches.rows(jid)[-1].state in ("intent", "started"):
            self.store.launches.mark(jid, gen, "finished", reason=f"{reason}: {what}")
        if self.store.jobs.get(jid).status == "running":
            self.store.jobs.set_status(jid, "queued", f"{reason} (resumes from step {ck})" if not in_place
                                  else f"{reason} ({what})")

    def release(self, job_id: str, now_s: float, *, target: Allocation | None = None) -> None:
        """First half of a move, journaled. Through storage: a stop with a checkpoint (a
        crash before the relaunch leaves a queued job with its checkpoint). Device to
        device: the launch ends in the store (its GPUs are free for other movers) while
        its ranks keep training; a crash before ``reconfigure`` leaves a queued job whose
        ranks the restart asks to checkpoint and stop."""
        self.beat()
        self.mpi.release(job_id, now_s, target=target)
        d2d = self.mpi.released_path(job_id) == "d2d"
        self._journal_stop(job_id, "moving (device to device)" if d2d else "moving", in_place=d2d)
        self.fault("mid-move")

    def reconfigure(self, job_id: str, alloc: Allocation, plan: Any, now_s: float) -> None:
        """Second half of a move, journaled like a launch: device to device in the same run
        folder where the launcher can (else, or when that fails, a relaunch from the
        checkpoint in ``launch_<generation>``)."""
        self.beat()
        if self.mpi.released_path(job_id) is None:
            self.release(job_id, now_s, target=alloc)
        self.before_move()
        self._start(job_id, alloc, plan, now_s,
                    lambda gen: self.mpi.reconfigure(job_id, alloc, plan, now_s, launch_index=gen),
                    how=lambda: self._how_moved(job_id))

    def _how_moved(self, job_id: str) -> str:
        """How the job's last move went, for its history (a fallback names its reason)."""
        recs = self.mpi.move_records(job_id)
        rec = recs[-1] if recs else {}
        if rec.get("path") == "d2d":
            return ", moved device to device"
        if rec.get("path") == "storage-fallback":
            self.log(f"job {job_id}: moved through storage, not device to device: {rec.get('reason')}")
            return f", moved through storage (not device to device: {rec.get('reason')})"
        return ", moved through storage"

    # -- observations --------------------------------------------------------------
    def progress(self, job_id: str) -> JobProgress:
        p = self.mpi.progress(job_id)
        self._record_checkpoint(job_id, p)
        self._record_moves(job_id)
        it = p.measured_iteration_time_s
        if it is not None and p.running and time.monotonic() - self._measured_at.get(job_id, -1e9) >= MEASURE_EVERY_S:
            self._measured_at[job_id] = time.monotonic()
            self.store.launches.record_measurement(int(job_id), self.generation[job_id], iteration_time_s=float(it),
                                          step=int(p.iterations_done), keep=self.keep_measurements)
        return JobProgress(**p.__dict__)

    def advance(self, until_s: float) -> list[JobProgress]:
        """What finished or failed since the last call, journaled; a launch already ended in
        the store (one a restart took over after it had ended, and accounted then) is not
        reported again: the round loop never had it."""
        out = []
        for p in (JobProgress(**q.__dict__) for q in self.mpi.advance(until_s)):
            jid, gen = int(p.job_id), self.generation[p.job_id]
            self._record_checkpoint(p.job_id, p)
            self._record_moves(p.job_id)
            if self._launch_state(jid, gen) not in ("intent", "started"):
                continue                  # already ended in the store (a launch a restart accounted)
            out.append(p)
            if p.finished:
                self.store.launches.mark(jid, gen, "finished", reason="training finished")
            else:
                self.store.launches.mark(jid, gen, "failed", reason=str(p.failed)[:2000])
        refused, self._refused = self._refused, []
        return out + refused

    def has_refused(self) -> bool:
        """A launch was refused since the last ``advance`` (a round should follow)."""
        return bool(self._refused)

    def runs_on(self, job: Job, shape: Shape) -> bool:
        """False for a shape refused before launch or whose launch ran out of memory."""
        return (job.job_id, shape) not in self._infeasible and self.mpi.runs_on(job, shape)

    def totals(self) -> ExecutorTotals:
        t = self.mpi.totals()
        return ExecutorTotals(t.samples_done, t.reconfig_lost_gpu_s)

    # -- helpers -------------------------------------------------------------------
    def _launch_state(self, jid: int, generation: int) -> str | None:
        return next((lch.state for lch in reversed(self.store.launches.rows(jid)) if lch.generation == generation),
                    None)

    def mpi_iterations(self, job_id: str) -> float:
        try:
            return self.mpi.progress(job_id).last_checkpoint_iteration
        except KeyError:
            return 0.0

    def _record_moves(self, job_id: str) -> None:
        """Each move's measured parts (device to device or not, bytes moved, drain, state
        movement and total: stop request to the first step after it), once, on the launch
        that completed it."""
        recs = self.mpi.move_records(job_id)
        done = self._moves_recorded.get(job_id, 0)
        while done < len(recs) and (recs[done]["total_s"] is not None or done + 1 < len(recs)):
            r = recs[done]                    # (a move that never reached a step before the next: none)
            if r["total_s"] is not None:
                self.store.launches.record_measurement(int(job_id), self.generation[job_id], reconfig={
                    "move_total_s": r["total_s"], "device_to_device": float(r["path"] == "d2d"),
                    "bytes_moved": r["bytes_moved"], "state_s": r["state_s"], "drain_stop_s": r["drain_stop_s"]})
            done += 1
        self._moves_recorded[job_id] = done

    def _record_checkpoint(self, job_id: str, p: Any) -> None:
        step = float(p.last_checkpoint_iteration or 0)
        if step > self._checkpoint_seen.get(job_id, 0.0) and job_id in self.generation:
            self._checkpoint_seen[job_id] = step
            try:
                self.store.launches.record_checkpoint(int(job_id), self.generation[job_id], int(step),
                                             self.mpi.checkpoint_dir(job_id))
            except (InputError, StateConflict):
                pass                              # a checkpoint of an older launch: already on record
