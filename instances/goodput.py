"""Adaptive-batch jobs measured in goodput (Pollux, OSDI'21), and their truth oracle built
from the Sia artifact's profiles (instances/sia_artifact.py).

A ``GoodputJob`` makes *progress*, not iterations: each iteration at global batch ``B``
adds the statistical-efficiency gain ``(var + sqr) / (var / s + sqr)`` with ``s = B /
B0`` (``B0`` the application's initial batch, the smallest validated one; ``sqr`` and
``var`` the gradient's squared norm and variance, read from the validation curves at
``B`` and the current epoch) — Pollux's scale-invariant iterations. Its rate, the
*goodput*, is ``gain / iteration time``; the artifact's calibration factor
(``1 / SLOWDOWNS[app]``) scales it. The job is done when its progress reaches the end of
its last epoch (``max_epochs`` of ``applications.py``; epoch ``e`` ends at the smallest
progress any validation curve reaches at its ``e``-th row). For the engine a goodput job
is a ``Job`` whose ``num_iterations`` counts progress units and whose ``global_batch``
is ``B0``, so "samples per second" are ``B0``-equivalent samples per second of goodput.

The iteration time on a placement (GPUs per node) at per-GPU batch ``b`` with ``a``
gradient-accumulation steps is ``step + a * (step - sync)`` from the profiles: the
placement's own rows interpolated linearly in ``b`` when it was measured, else a linear
interpolation over (nodes, replicas, per-GPU batch) of the placement means and the
scalability rows (SciPy's ``LinearNDInterpolator``, as the artifact does). Outside the
profiled range a configuration is infeasible.

Batch size: a job either keeps a fixed global batch (``BatchPlan(fixed=B)``: the
workload's, as Gavel's "TunedJobs" run) or adapts it (``BatchPlan()``, the default):
at every start and epoch it takes, of 50 geometrically spaced batches between
``max(B0, min per-GPU batch x replicas)`` and the application's largest, the one with
the highest true goodput (Pollux's rule; per-GPU batch split into accumulation steps
past the placement's largest profiled one, then capped by memory: the largest per-GPU
batch profiled at that replica count). Policies may narrow the range
(``BatchPlan(low, high)``). The artifact's jobs choose with their *fitted* model of
throughput and the gradient statistics they last measured; this oracle's jobs choose
with the true ones (a named difference, docs/sia-artifact.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .errors import InputError
from .grid import Shape
from .jobs import MAX_GLOBAL_BATCH, MAX_ITERATIONS, Job
from .limits import check_time
from .plan import BatchPlan
from .sia_artifact import SiaApplication, SiaArtifact, SiaConfig, application, gpu_types, load_workload

EPS = 1e-8                          # the artifact's tolerance for ceil of a batch split
BATCH_CANDIDATES = 50               # Pollux's batch-size search: points of the geometric range
MAX_INTERP_NODES = 16               # the artifact interpolates with at most 16 nodes


ADAPTIVE = BatchPlan()


@dataclass(frozen=True)
class GoodputJob(Job):
    """A job of the Sia artifact: adaptive batch, progress measured in goodput (module
    doc). ``model`` is ``sia:<application>``; ``requested_gpus`` and ``requested_batch``
    are the workload's ``num_replicas`` and ``batch_size`` (what a rigid scheduler runs)."""
    application: str = ""
    requested_batch: int = 1
    max_batch: int = 1
    progress_target: float = 1.0    # progress at completion
    restart_s: float = 0.0          # the truth's restart time (applications.py rescale_time)
    restart_penalty_s: float = 0.0  # what Sia's policy charges a restart (sia.py)

    def __post_init__(self):        # not Job's: the model is an application, not a catalog model
        if not self.job_id or self.job_id != self.job_id.strip():
            raise InputError(f"job id {self.job_id!r} must be non-empty, without white space around it",
                             field="name")
        if not self.model.startswith("sia:") or not self.application:
            raise ValueError(f"goodput job {self.job_id}: model must be 'sia:<application>'")
        for f in ("global_batch", "requested_batch", "max_batch"):
            v = getattr(self, f)
            if not 1 <= v <= MAX_GLOBAL_BATCH:
                raise InputError(f"job {self.job_id}: {f} {v} is outside [1, {MAX_GLOBAL_BATCH:,}]", field=f)
        if not 1 <= self.num_iterations <= MAX_ITERATIONS:
            raise InputError(f"job {self.job_id}: progress target out of range", field="num_iterations")
        if not (math.isfinite(self.progress_target) and 0 < self.progress_target <= self.num_iterations):
            raise ValueError(f"job {self.job_id}: progress_target must be in (0, num_iterations]")
        check_time(self.arrival_s, field="time", what=f"job {self.job_id}: ")
        if self.requested_gpus is not None and self.requested_gpus < 1:
            raise ValueError(f"job {self.job_id}: requested_gpus must be >= 1")
        for f in ("restart_s", "restart_penalty_s"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"job {self.job_id}: {f} must be a finite number >= 0")

    @property
    def arch(self):                  # pragma: no cover - a clear error where a catalog model is needed
        raise InputError(f"job {self.job_id} is a Sia-artifact goodput job ({self.model}): it has no model "
                         "architecture; only goodput-aware estimates and the sia move costs apply", field="model")


def is_goodput(job: Any) -> bool:
    return isinstance(job, GoodputJob)


def placement_of(shape: Shape) -> tuple[int, ...]:
    return (shape.gpus_per_node,) * shape.num_nodes


class AppCurves:
    """An application's validation curves: epochs, progress, gradient statistics."""

    def __init__(self, app: SiaApplication, max_epochs: int):
        self.name = app.name
        self.batches = np.array([c.batch_size for c in app.validation], dtype=np.int64)
        self.curves = app.validation
        self.init_batch = int(self.batches[0])
        self.max_batch = int(self.batches[-1])
        self.max_epochs = max_epochs
        n = max_epochs
        ends = np.min(np.stack([c.progress[:n] for c in app.validation]), axis=0)
        self.epoch_end = np.concatenate(([0.0], ends))      # epoch e spans [epoch_end[e], epoch_end[e+1])
        self.target = float(self.epoch_end[n])

    def epoch_of(self, progress: float) -> int:
        e = int(np.searchsorted(self.epoch_end, progress, side="right")) - 1
        return min(max(e, 0), self.max_epochs - 1)

    @lru_cache(maxsize=65536)
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(sqr, var) at ``batch``, linear between the validated batches around it."""
        b = self.batches
        if not b[0] <= batch <= b[-1]:
            raise ValueError(f"{self.name}: batch {batch} outside the validated {b[0]}..{b[-1]}")
        hi = int(np.searchsorted(b, batch, side="left"))
        lo = hi if b[hi] == batch else hi - 1
        c_lo, c_hi = self.curves[lo], self.curves[hi]
        if lo == hi:
            return float(c_lo.grad_sqr[epoch]), float(c_lo.grad_var[epoch])
        w = (batch - b[lo]) / (b[hi] - b[lo])
        return (float((1 - w) * c_lo.grad_sqr[epoch] + w * c_hi.grad_sqr[epoch]),
                float((1 - w) * c_lo.grad_var[epoch] + w * c_hi.grad_var[epoch]))

    def gain(self, batch: float, epoch: int) -> float:
        """Progress per iteration at ``batch`` in ``epoch`` (statistical efficiency x scale)."""
        sqr, var = self.grad_stats(batch, epoch)
        scale = batch / self.init_batch
        denom = var / scale + sqr
        return (var + sqr) / denom if denom > 0 else 1.0


class AppOnCluster:
    """One application on one GPU cluster: throughput from its profiles, the artifact's
    batch-splitting rules and its goodput."""

    def __init__(self, app: SiaApplication, cluster: str, curves: AppCurves, slowdown: float):
        s = app.settings[cluster]
        p = app.profiles[cluster]
        self.name, self.cluster, self.curves = app.name, cluster, curves
        self.profile = p
        self.init_batch = s.init_batch_size or curves.init_batch
        self.max_batch = s.max_batch_size or curves.max_batch
        self.min_local_bsz = s.min_local_bsz or int(p.local_bsz.min())
        self.max_local_bsz = s.max_local_bsz or int(p.local_bsz.max())
        self.calibration = 1.0 / slowdown
        self._by_placement: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for pid in np.unique(p.placement).tolist():
            m = p.placement == pid
            b, inv = np.unique(p.local_bsz[m], return_inverse=True)       # duplicates averaged
            st = np.bincount(inv, p.step_time[m]) / np.bincount(inv)
            sy = np.bincount(inv, p.sync_time[m]) / np.bincount(inv)
            self._by_placement[int(pid)] = (b.astype(float), st, sy)
        self._max_local_by_replicas: dict[int, int] = {}
        for r, b in zip(p.num_replicas.tolist(), p.local_bsz.tolist()):
            self._max_local_by_replicas[r] = max(self._max_local_by_replicas.get(r, 0), b)
        self._nd: Any = None
        self._memo: dict = {}

    def one_gpu_throughput(self) -> float:
        """Samples per second of one GPU at its largest profiled batch over its slowest step:
        the artifact's measure for projecting a job's goodput from one GPU type to another."""
        p = self.profile
        m = p.num_replicas == 1
        return float(p.local_bsz[m].max() / p.step_time[m].max()) if m.any() else 0.0

    @staticmethod
    def placement_id(placement: tuple[int, ...]) -> int:
        p = tuple(x for x in placement if x)
        p = min(p[i:] + p[:i] for i in range(len(p)))       # smallest rotation, as the artifact
        return int("".join(map(str, p)))

    def _interpolator(self):
        if self._nd is None:
            from scipy.interpolate import LinearNDInterpolator
            p = self.profile
            keys = np.stack([p.num_nodes, p.num_replicas, p.local_bsz], axis=1)
            uniq, inv = np.unique(keys, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            cnt = np.bincount(inv)
            mean = np.stack([np.bincount(inv, p.step_time) / cnt, np.bincount(inv, p.sync_time) / cnt], axis=1)
            pts = np.concatenate([uniq.astype(float),
                                  np.stack([p.scal_nodes, p.scal_replicas, p.scal_local_bsz], axis=1).astype(float)])
            vals = np.concatenate([mean, np.stack([p.scal_step_time, p.scal_sync_time], axis=1)])
            self._nd = LinearNDInterpolator(pts, vals)
        return self._nd

    def step_sync(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float] | None:
        """(step time, all-reduce time) of one iteration at ``local_bsz`` per GPU; None
        outside the profiles."""
        key = (placement, float(local_bsz))
        if key not in self._memo:
            self.prefetch(placement, [local_bsz])
        return self._memo[key]

    def prefetch(self, placement: tuple[int, ...], local_bszs) -> None:
        """``step_sync`` of several per-GPU batches on one placement, in one interpolation."""
        todo = sorted({float(b) for b in local_bszs if (placement, float(b)) not in self._memo})
        if not todo:
            return
        x = np.array(todo)
        pid = self.placement_id(placement)
        if pid in self._by_placement:
            b, st, sy = self._by_placement[pid]
            inside = (b[0] <= x) & (x <= b[-1])
            v = np.stack([np.interp(x, b, st), np.interp(x, b, sy)], axis=1)
        else:
            n = min(len([p for p in placement if p]), MAX_INTERP_NODES)
            pts = np.stack([np.full(len(x), n, dtype=float), np.full(len(x), sum(placement), dtype=float), x], axis=1)
            v = np.asarray(self._interpolator()(pts)).reshape(len(x), 2)
            inside = np.all(np.isfinite(v), axis=1)
        for i, b_ in enumerate(todo):
            ok = bool(inside[i]) and v[i, 0] > 0
            self._memo[(placement, b_)] = (float(v[i, 0]), float(v[i, 1])) if ok else None

    def max_local_for(self, placement: tuple[int, ...]) -> int | None:
        """The largest per-GPU batch profiled for ``placement`` (else for any profile with at
        least as many nodes and replicas)."""
        pid = self.placement_id(placement)
        if pid in self._by_placement:
            return int(self._by_placement[pid][0][-1])
        p = self.profile
        n, r = len(placement), sum(placement)
        m = (p.scal_nodes >= n) & (p.scal_replicas >= r)
        return int(p.scal_local_bsz[m].max()) if m.any() else None

    def _split(self, batch: float, replicas: int, max_local: int) -> tuple[int, int]:
        """(per-GPU batch per step, accumulation steps) for a global batch."""
        local = math.ceil(batch / replicas - EPS)
        accum = math.ceil(local / max_local - EPS) - 1
        if replicas == 1 and batch > self.init_batch + EPS:
            accum = max(1, accum)
        return math.ceil(local / (accum + 1) - EPS), accum

    def _cap(self, atomic: int, accum: int, replicas: int) -> int:
        cap = self._max_local_by_replicas.get(replicas)
        if cap is not None:
            atomic = min(atomic, cap)
        return min(atomic, int(self.max_batch / (replicas * (accum + 1))))

    def iteration_time(self, placement: tuple[int, ...], atomic: int, accum: int) -> float | None:
        ss = self.step_sync(placement, atomic)
        if ss is None:
            return None
        step, sync = ss
        return step + (step - sync) * accum

    def rate(self, placement: tuple[int, ...], atomic: int, accum: int, epoch: int) -> float | None:
        """Progress per second (goodput, calibrated) of a configuration; None: infeasible."""
        t = self.iteration_time(placement, atomic, accum)
        if t is None or not t > 0:
            return None
        batch = sum(placement) * atomic * (accum + 1)
        if not self.curves.batches[0] <= batch <= self.curves.batches[-1]:
            return None
        return self.curves.gain(batch, epoch) / t * self.calibration

    def configure(self, placement: tuple[int, ...], plan: BatchPlan, epoch: int) -> tuple[int, int] | None:
        """(per-GPU batch, accumulation steps) the job runs ``placement`` with (module doc)."""
        key = ("cfg", placement, plan, epoch)
        if key in self._memo:
            return self._memo[key]
        r = sum(placement)
        max_local = self.max_local_for(placement)
        got: tuple[int, int] | None = None
        if max_local is not None and max_local >= 1:
            if plan.fixed is not None:
                atomic, accum = self._split(plan.fixed, r, max_local)
                atomic = self._cap(atomic, accum, r)
                got = (atomic, accum) if atomic >= 1 else None
            else:
                got = self._best_batch(placement, plan, epoch, r, max_local)
        self._memo[key] = got
        return got

    def _best_batch(self, placement, plan: BatchPlan, epoch: int, r: int, max_local: int) -> tuple[int, int] | None:
        lo = max(self.init_batch, self.min_local_bsz * r, plan.low or 0)
        hi = min(self.max_batch, plan.high or self.max_batch)
        if lo > hi and plan.high is not None and lo <= self.max_batch:
            hi = lo                     # a cap below the smallest batch: the smallest (as the artifact's policy)
        if lo > hi:
            return None
        best, best_rate = None, 0.0
        configs = []
        for batch in np.geomspace(lo, hi, BATCH_CANDIDATES) if hi > lo else [float(lo)]:
            atomic, accum = self._split(float(batch), r, max_local)
            if not self.min_local_bsz <= atomic <= max_local:
                continue
            atomic = self._cap(atomic, accum, r)
            if atomic >= 1:
                configs.append((atomic, accum))
        self.prefetch(placement, [a for a, _ in configs])
        for atomic, accum in configs:
            rate = self.rate(placement, atomic, accum, epoch)
            if rate is not None and rate > best_rate:
                best, best_rate = (atomic, accum), rate
        return best


@dataclass(frozen=True)
class Segment:
    """A stretch of a goodput job's run at one rate: until ``end_progress`` (the end of its
    epoch, or of the job) it advances ``1 / seconds_per_unit`` progress units a second at
    global batch ``batch``."""
    seconds_per_unit: float
    end_progress: float
    batch: int
    atomic: int
    accum: int


class SiaWorld:
    """The artifact's applications on the simulated cluster's GPU types: what the truth
    oracle and the goodput-aware estimates both read."""

    def __init__(self, artifact: SiaArtifact):
        self.artifact = artifact
        self.config: SiaConfig = artifact.config
        self.types = gpu_types(artifact.config)                 # GPU cluster -> GPU type
        self.cluster_of = {t: c for c, t in self.types.items()}
        self._curves: dict[str, AppCurves] = {}
        self._apps: dict[tuple[str, str], AppOnCluster] = {}

    def curves(self, app: str) -> AppCurves:
        if app not in self._curves:
            a = application(self.artifact, app)
            epochs = {s.max_epochs for s in a.settings.values()}
            n = min(len(c.progress) for c in a.validation)
            m = min(e for e in epochs if e is not None) if any(e is not None for e in epochs) else n
            self._curves[app] = AppCurves(a, m)
        return self._curves[app]

    def on(self, app: str, gpu_type: str) -> AppOnCluster | None:
        """``app`` on a GPU type (None: a type the artifact's cluster does not simulate)."""
        cluster = self.cluster_of.get(gpu_type)
        if cluster is None:
            return None
        key = (app, cluster)
        if key not in self._apps:
            self._apps[key] = AppOnCluster(application(self.artifact, app), cluster, self.curves(app),
                                           self.config.slowdowns[app])
        return self._apps[key]

    def segment(self, job: GoodputJob, shape: Shape, progress: float, plan: BatchPlan | None) -> Segment | None:
        """The rate of ``job`` on ``shape`` from ``progress`` (module doc); None: it cannot run there."""
        return self.on_placement(job, shape.gpu_type, placement_of(shape), progress, plan)

    def on_placement(self, job: GoodputJob, gpu_type: str, placement: tuple[int, ...], progress: float,
                     plan: BatchPlan | None) -> Segment | None:
        """``segment`` for any placement (GPUs per node, not necessarily equal)."""
        app = self.on(job.application, gpu_type)
        if app is None:
            return None
        curves = app.curves
        epoch = curves.epoch_of(progress)
        cfg = app.configure(placement, plan or ADAPTIVE, epoch)
        if cfg is None:
            return None
        rate = app.rate(placement, cfg[0], cfg[1], epoch)
        if rate is None or not rate > 0:
            return None
        end = min(float(curves.epoch_end[epoch + 1]), job.progress_target)
        return Segment(1.0 / rate, end, sum(placement) * cfg[0] * (cfg[1] + 1), cfg[0], cfg[1])


class GoodputOracle:
    """The simulator's truth for goodput jobs (``SimExecutor`` asks ``segment``)."""

    training_runtime = "sia"        # the artifact's measured runs (only goodput-aware estimates apply)

    def __init__(self, world: SiaWorld):
        self.world = world

    def segment(self, job: Job, shape: Shape, progress: float, plan: Any = None) -> Segment | None:
        if not isinstance(job, GoodputJob):
            raise TypeError(f"job {job.job_id} is not a goodput job; the Sia artifact's oracle runs only its own")
        return self.world.segment(job, shape, progress, plan if isinstance(plan, BatchPlan) else None)

    def true_iteration_time(self, job: Job, shape: Shape) -> float | None:
        """Seconds per progress unit at the job's start, adaptive batch (None: infeasible)."""
        seg = self.segment(job, shape, 0.0)
        return None if seg is None else seg.seconds_per_unit

    def run_time(self, job: Job, shape: Shape) -> float | None:
        """Seconds to run the whole job on ``shape`` from its start, adapting its batch, no
        restart (None: it cannot run there): a lower bound on its JCT there."""
        t, progress = 0.0, 0.0
        target = job.progress_target if isinstance(job, GoodputJob) else float(job.num_iterations)
        while progress < target - 1e-9:
            seg = self.segment(job, shape, progress)
            if seg is None or not seg.end_progress > progress:
                return None
            t += (seg.end_progress - progress) * seg.seconds_per_unit
            progress = seg.end_progress
        return t


def build_jobs(world: SiaWorld, workload: str) -> tuple[GoodputJob, ...]:
    rows = load_workload(world.artifact, workload)
    jobs = []
    for r in rows:
        curves = world.curves(r.application)
        s = next(iter(world.artifact.applications[r.application].settings.values()))
        jobs.append(GoodputJob(
            job_id=r.name, model=f"sia:{r.application}", global_batch=curves.init_batch,
            num_iterations=max(1, math.ceil(curves.target)), arrival_s=r.time_s, requested_gpus=r.num_replicas,
            application=r.application, requested_batch=r.batch_size, max_batch=curves.max_batch,
            progress_target=curves.target, restart_s=s.rescale_time_s,
            restart_penalty_s=world.artifact.restart_penalty(r.name)))
    return tuple(jobs)
