"""Estimates against real torch runs on this machine.

A tiny model (default ``LOCAL_MODEL``; any the launcher trains: GPT, Llama, MoE, and
Wide-ResNet without tensor plans) is trained with real multi-rank torch jobs
(``launcher.api.run_training``: mpiexec, gloo on CPU) under data, tensor and pipeline
splits at world sizes 1 and 2; the
measured iteration time (median over the steps after ``skip`` warm-up steps, by default
``MEASURE_SKIP`` of ``MEASURE_STEPS``) is compared
with the analytic estimate of the same plan, whose layer and link costs come from the
profile store (the model is profiled first if the store lacks it). The estimate models
the launcher's runtime, not the Arena runtime of the defaults (``launcher_runtime``): no
activation recomputation, a plain gradient all-reduce (no sharded optimizer update), Adam
for every family, embeddings and output head whole on every tensor rank.

Measured runtime terms (``profile_runtime_terms``, separate micro-benchmarks, never the
reported runs), with the job's rank count of gloo processes: the launcher's per-step work
outside the model (input pipeline, zero_grad, control all-reduce: ``step_overhead_s``);
for tensor parallelism one decoder layer of the launcher's own model under torch
``parallelize_module`` (DTensor) against the profiler's plain sharded layer, alone and
with every rank computing at once (every rank fed the same input, as tensor parallelism
has it; Wide-ResNet: its first block, without the DTensor part). From them: ``tp_layer_overhead_*_s`` (DTensor time
beyond the sharded compute and the modelled all-reduces) and the per-rank contention of
concurrent ranks (``ContendedTimer``). For pipeline parallelism, the launcher's 1F1B
schedule over the job's ranks as stages that only scale their input (``_pipeline_probe``):
from its step time, ``pp_pass_overhead_s``, the schedule's dispatch per stage and
micro-batch pass beyond the modelled sends (``pipeline_pass_overhead_s``). And Adam's
step over the launcher's tensor-parallel (DTensor) parameters against plain tensors of
the same shapes (``_optimizer_probe``): ``tp_optimizer_overhead_s``. Collectives
come from the store's per-operation tables (``timing.ProfiledComm``), and on CPU the
gradient all-reduce is not overlapped (``launcher_runtime(cpu=True)``).

The cache (``CacheTimer``, an approximation, named so): the profiler times every layer
after writing ``flush_bytes`` of other data (cold) and again at once (warm), and measures
the layer's working set (parameters, gradients, what autograd saves, the input). In a
real step the data a layer touched is followed, before its next use, by the rest of the
rank's step: its working set ``W`` (``step_working_set``: parameters and gradients of
the rank's largest stage, plus its saved activations per micro-batch in flight). The
profile's cold time is what ``flush_bytes`` of intervening traffic leaves; none leaves
the warm time; in between, the model takes the fraction ``1 - W / flush_bytes`` of the
cold-to-warm gap (``cache_hit``: 0 when the step's working set is at least the flush).
Nothing in it is fitted: ``W`` is measured by the profiler, ``flush_bytes`` is the
profiler's own setting. It is reported next to the estimate, not in it
(``estimated_cache_s``, from the same profile: a paired comparison), until it is
validated on a quiet host: its premise, a step's data surviving in the core's cache, fails
when other processes share the core (measured under load, it made Wide-ResNet worse;
docs/estimators.md).

The host's speed drifts between profiling and the runs (this 2-core host is shared):
``against_local`` profiles into a fresh temporary store by default, and the CLI repeats
the whole pass (``--passes``) and reports each plan's median error
(``summarize_passes``). Re-timing a reference layer before each run to correct for the
drift was tried and dropped: a few-millisecond probe on this host swung by up to 4.6x
and made the estimates worse.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from instances.errors import InputError
from instances.gpus import get_gpu
from instances.models import get_model
from instances.plan import Plan

from ..analytic import AnalyticModel
from ..base import Estimate
from ..config import EfficiencyConfig, MemoryConfig
from ..planner import Planner, PlanResult
from ..profile_store import ProfileStore

DEFAULT_PLANS = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 4))     # dp, tp, pp, microbatches
BLOCK_KINDS = ("decoder", "moe_decoder", "bottleneck")   # repeated layers: the runtime terms' probes
PROBE_MICROBATCHES = 4                        # the pipeline probe's micro-batches (the default pp plan's)
LOCAL_MODEL = "tiny-gpt__4L"                  # the default model of the comparison
# The measured window: the estimate is of a step in steady state. A tensor-parallel MoE run
# keeps meeting new expert sizes, so DTensor sharding-propagation cache misses (about 5 ms
# each here), for its first steps: counted by bench/bench_tp_warmup.py, 129 misses over
# steps 2-9 of tiny-moe__2L and 139 of the Mixtral config, then 0-10 per ten steps; a dense
# model misses only in its first step.
MEASURE_STEPS, MEASURE_SKIP = 30, 10


def launcher_runtime(eff: EfficiencyConfig | None = None, mem: MemoryConfig | None = None, *,
                     cpu: bool = False) -> tuple[EfficiencyConfig, MemoryConfig]:
    """The estimator config of the torch launcher (launcher/worker.py): torch.optim.Adam on
    every family, no activation recomputation, DDP-style gradient all-reduce. With ``cpu``
    (gloo on CPU ranks, one compute thread per rank) the all-reduce is not overlapped with
    backward: gloo sums the gradients on the same cores the ranks compute on, so there is
    no idle engine to hide it on (on GPUs NCCL runs beside the compute kernels)."""
    base = eff or EfficiencyConfig()
    eff = replace(base, recompute_activations=False, dp_sharded_optimizer=False, tp_replicated_embedding_head=True,
                  dp_overlap=base.dp_overlap and not cpu)
    mem = replace(mem or MemoryConfig(), optimizer="adam", optimizer_by_family=())
    return eff, mem


@dataclass(frozen=True)
class ContendedTimer:
    """``inner``'s layer and optimizer times stretched by ``factor``: the measured per-rank
    compute slowdown when all of a job's ranks compute at once on this host
    (``RuntimeTerms.contention``; 1 where every rank has its own core or GPU)."""
    inner: object
    factor: float

    @property
    def source(self) -> str:
        return self.inner.source

    def times(self, cost, gpu, dtype):
        f, b = self.inner.times(cost, gpu, dtype)
        return f * self.factor, b * self.factor

    def profiled(self, cost, gpu, dtype) -> bool:
        return self.inner.profiled(cost, gpu, dtype)

    def optimizer_s(self, params, gpu, dtype) -> float:
        return self.inner.optimizer_s(params, gpu, dtype) * self.factor


@dataclass(frozen=True)
class MicroBatchTimer:
    """``inner`` (a ``ProfiledTimer``), except that a layer profiled at several micro-batch
    sizes uses the achieved FLOP/s measured at the size nearest (in ratio) to the one it
    runs, not the largest profiled one: on this CPU a decoder layer at 8 samples runs
    markedly faster per FLOP than at 2, and the launcher's plans run 2 to 8."""
    inner: object
    rates_by_mb: dict          # (kind, signature, dtype, tp) -> {micro_batch: (fwd, bwd) FLOP/s}

    @classmethod
    def from_store(cls, inner, store: ProfileStore, device: str) -> "MicroBatchTimer":
        rates: dict = {}
        for r in store.layer_records(device):
            rates.setdefault((r.kind, tuple(r.signature), r.dtype, r.tp), {})[r.micro_batch] = (
                r.fwd_flops_per_s, r.bwd_flops_per_s)
        return cls(inner, rates)

    @property
    def source(self) -> str:
        return self.inner.source

    def times(self, cost, gpu, dtype):
        by_mb = self.rates_by_mb.get((cost.kind, tuple(cost.signature), dtype, cost.tp))
        if not by_mb or gpu.name != self.inner.device:
            return self.inner.times(cost, gpu, dtype)
        mb = min(by_mb, key=lambda k: abs(math.log(k / cost.micro_batch)))
        fwd_rate, bwd_rate = by_mb[mb]
        eff = self.inner.fallback.eff
        return (cost.fwd_flops / fwd_rate + eff.layer_overhead_s,
                cost.bwd_flops / bwd_rate + eff.layer_overhead_s)

    def profiled(self, cost, gpu, dtype) -> bool:
        return self.inner.profiled(cost, gpu, dtype)

    def optimizer_s(self, params, gpu, dtype) -> float:
        return self.inner.optimizer_s(params, gpu, dtype)


@dataclass(frozen=True)
class CacheTimer:
    """``inner``'s layer times moved from the profile's cold-cache time towards its warm
    one by ``hit`` (module doc): ``t = cold x (1 - hit x (1 - warm / cold))``, with the
    warm/cold ratio of the record at the micro-batch nearest the one the layer runs.
    Layers without warm records keep ``inner``'s time."""
    inner: object
    warm_ratio: dict       # (kind, signature, dtype, tp) -> {micro_batch: (fwd warm/cold, bwd warm/cold)}
    hit: float

    @classmethod
    def from_store(cls, inner, store: ProfileStore, device: str, hit: float) -> "CacheTimer":
        ratios: dict = {}
        for r in store.layer_records(device):
            if r.warm_fwd_s is not None and r.fwd_s > 0 and r.bwd_s > 0:
                ratios.setdefault((r.kind, tuple(r.signature), r.dtype, r.tp), {})[r.micro_batch] = (
                    r.warm_fwd_s / r.fwd_s, r.warm_bwd_s / r.bwd_s)
        return cls(inner, ratios, hit)

    @property
    def source(self) -> str:
        return self.inner.source

    def times(self, cost, gpu, dtype):
        f, b = self.inner.times(cost, gpu, dtype)
        by_mb = self.warm_ratio.get((cost.kind, tuple(cost.signature), dtype, cost.tp))
        if not by_mb or self.hit <= 0:
            return f, b
        rf, rb = by_mb[min(by_mb, key=lambda k: abs(math.log(k / cost.micro_batch)))]
        return f * (1 - self.hit * (1 - rf)), b * (1 - self.hit * (1 - rb))

    def profiled(self, cost, gpu, dtype) -> bool:
        return self.inner.profiled(cost, gpu, dtype)

    def optimizer_s(self, params, gpu, dtype) -> float:
        return self.inner.optimizer_s(params, gpu, dtype)


def step_working_set(arch, plan: Plan, micro_batch: int, store: ProfileStore, device: str) -> float:
    """Bytes one rank's training step touches, from the profiler's working-set records:
    for each stage, its layers' parameters and gradients plus their saved activations
    times the micro-batches it holds at once (1F1B: ``min(m, pp - stage)``; pp = 1: one);
    the largest stage's. Layer records at the plan's tensor degree, else at tp = 1 (the
    launcher keeps embeddings and head whole), at the micro-batch nearest the plan's; a
    layer the store has no record of (the embedding: no FLOPs, not stored) counts its
    catalog parameters and activations (``layers.layer_costs``) instead."""
    from ..layers import layer_costs
    recs: dict = {}
    for r in store.layer_records(device):
        if r.param_bytes is not None:
            recs.setdefault((r.kind, tuple(r.signature), r.tp), {})[r.micro_batch] = (r.param_bytes, r.saved_bytes)
    catalog = layer_costs(arch, micro_batch=micro_batch, tp=1)
    layers, lo, worst = arch.layers(), 0, 0.0
    for i, n in enumerate(plan.stage_layers):
        held = 1 if plan.pp == 1 else min(plan.microbatches, plan.pp - i)
        total = 0.0
        for j in range(lo, lo + n):
            spec = layers[j]
            by_mb = recs.get((spec.kind, tuple(spec.signature), plan.tp)) or recs.get(
                (spec.kind, tuple(spec.signature), 1))
            if by_mb:
                params, saved = by_mb[min(by_mb, key=lambda k: abs(math.log(k / micro_batch)))]
            else:
                params, saved = catalog[j].params * arch.dtype_bytes, catalog[j].activation_bytes
            total += 2 * params + held * saved
        worst = max(worst, total)
        lo += n
    return worst


def cache_hit(working_set_bytes: float | None, flush_bytes: float) -> float:
    """The fraction of the cold-to-warm gap a step recovers (module doc)."""
    if working_set_bytes is None or flush_bytes <= 0:
        return 0.0
    return max(0.0, 1.0 - working_set_bytes / flush_bytes)


@dataclass(frozen=True)
class LocalResult:
    dp: int
    tp: int
    pp: int
    microbatches: int
    measured_s: float | None
    estimated_s: float
    error: str = ""
    estimated_cache_s: float | None = None        # the same estimate with CacheTimer
    working_set_bytes: float | None = None
    cache_hit: float = 0.0

    @property
    def rel_error(self) -> float | None:
        return None if self.measured_s is None else self.estimated_s / self.measured_s - 1

    @property
    def rel_error_cache(self) -> float | None:
        if self.measured_s is None or self.estimated_cache_s is None:
            return None
        return self.estimated_cache_s / self.measured_s - 1


@dataclass(frozen=True)
class LocalRuntime:
    """The estimate of the launcher's runs of one model at one global batch on this host
    (module doc): the profiled planner (layers per micro-batch size, collectives), the
    launcher's runtime config, the runtime terms measured per rank count, and the cache
    model's inputs read from the store once (the layers' warm/cold ratios, the flush)."""
    arch: object
    global_batch: int
    device: str
    gpu: object
    planner: Planner
    efficiency: EfficiencyConfig
    terms: dict                     # rank count -> RuntimeTerms
    store: ProfileStore
    cache: CacheTimer               # over planner.timer, hit 0
    flush_bytes: float

    def plan(self, dp: int, tp: int, pp: int, microbatches: int) -> Plan:
        """The plan the launcher runs for this layout (the planner's stage split; the
        launcher replicates MoE experts)."""
        return Plan(pp, dp, tp, self.planner.split(self.arch, self.gpu, pp), microbatches, "1f1b", ep=1)

    def cache_hit(self, plan: Plan) -> tuple[float, float]:
        """(the step's working set in bytes, the cache model's hit fraction) for ``plan``."""
        from ..compose import micro_batch_size
        ws = step_working_set(self.arch, plan, micro_batch_size(self.global_batch, plan.dp, plan.microbatches),
                              self.store, self.device)
        return ws, cache_hit(ws, self.flush_bytes)

    def evaluate(self, plan: Plan, hit: float = 0.0) -> PlanResult:
        """``plan``'s estimate with its rank count's runtime terms (``hit``: the cache
        model's hit fraction; 0, the default, is the cold profile)."""
        ranks = plan.dp * plan.tp * plan.pp
        t = self.terms.get(ranks)
        if t is None:
            raise InputError(f"no runtime terms measured at {ranks} ranks (measured: {sorted(self.terms)})",
                             field="plans")
        e = replace(self.efficiency, step_overhead_s=t.step_overhead_s)
        if plan.tp > 1 and plan.tp == ranks:      # the DTensor overhead is measured at tp = ranks only
            e = replace(e, tp_layer_overhead_fwd_s=t.tp_overhead_s[0], tp_layer_overhead_bwd_s=t.tp_overhead_s[1],
                        tp_optimizer_overhead_s=t.tp_optimizer_overhead_s)
        if plan.pp > 1 and plan.pp == ranks:      # the pipeline probe runs ranks stages
            e = replace(e, pp_pass_overhead_s=t.pp_pass_overhead_s)
        planner = Planner(replace(self.planner.cfg, efficiency=e),
                          ContendedTimer(replace(self.cache, hit=hit), t.contention), self.planner.comm)
        return planner.evaluate(self.arch, plan, global_batch=self.global_batch, gpu=self.gpu, gpus_per_node=ranks)


def profile_local_runtime(model: str, global_batch: int, ranks, store: ProfileStore,
                          profile_repeats: int = 9, micro_batches=()) -> LocalRuntime:
    """Profile ``model``'s layers (what ``store`` lacks; at micro-batch 1 and
    ``micro_batches``) and the collectives into ``store``, and measure the runtime terms
    at every rank count in ``ranks``."""
    from ..profiler import ProfilerConfig, local_device, profile_collectives, profile_layers
    arch = get_model(model)
    device, _ = local_device()
    if not store.collective_records(device):
        profile_collectives(group_sizes=(2,), store=store)
    profile_layers(arch, store=store,            # reuses what the store already holds
                   cfg=ProfilerConfig(micro_batches=tuple(sorted({1, *micro_batches})), repeats=profile_repeats))
    eff, mem = launcher_runtime(cpu=device == "cpu")
    gpu = get_gpu(device)
    base = AnalyticModel(profile_store=store, profile_device=device, efficiency=eff, memory=mem).planner
    if hasattr(base.timer, "flops_per_s"):       # a ProfiledTimer: rates per micro-batch size
        base = Planner(base.cfg, MicroBatchTimer.from_store(base.timer, store, device), base.comm)
    terms = {r: profile_runtime_terms(model, ranks=r, micro_batch=global_batch, comm=base.comm, gpu=gpu)
             for r in sorted(set(ranks))}
    flush = max((r.flush_bytes for r in store.layer_records(device)), default=0.0)
    return LocalRuntime(arch, global_batch, device, gpu, base, eff, terms, store,
                        CacheTimer.from_store(base.timer, store, device, 0.0), flush)


class LocalRuntimeModel:
    """A ``PerformanceModel`` over a ``LocalRuntime``: what a user who profiled this host
    (``arena profile``) and measured the launcher's runtime terms would decide with. A job
    of the runtime's model and global batch on a grid of the runtime's device gets the
    fastest of the launcher's layouts whose runtime terms were measured: data parallel
    within each stage, or (one stage, transformers) tensor parallel over all ranks; with
    more than one stage, ``pipeline_microbatches`` micro-batches. Its ``plan_result``
    gives the chosen plan's breakdown (the online model's communication share). It has
    no registered kind: it is built from a measured ``LocalRuntime``, not by name."""

    def __init__(self, runtime: LocalRuntime, pipeline_microbatches: int = 4):
        self.runtime = runtime
        self.pipeline_microbatches = int(pipeline_microbatches)
        self.name = f"local-runtime({runtime.device})"
        self.analytic = self                    # plan_result, for OnlineModel's communication share
        self._plans: dict = {}

    def plan_result(self, job, grid) -> PlanResult | None:
        """The fastest feasible layout's result on ``grid`` (None when none runs)."""
        rt = self.runtime
        if job.arch.name != rt.arch.name or job.global_batch != rt.global_batch:
            raise InputError(f"this local runtime was measured for {rt.arch.name} at global batch "
                             f"{rt.global_batch}, not {job.model} at {job.global_batch}", field="job")
        if grid.gpu_type != rt.device:
            raise InputError(f"this local runtime was measured on {rt.device}, not {grid.gpu_type}", field="grid")
        if grid not in self._plans:
            ranks, pp = grid.shape.num_gpus, grid.pp
            per_stage = ranks // pp
            m = self.pipeline_microbatches if pp > 1 else 1
            tps = [1] + ([ranks] if pp == 1 and ranks > 1 and rt.arch.is_transformer else [])
            best = None
            for tp in tps:
                dp = per_stage // tp
                if ranks not in rt.terms or rt.global_batch % (dp * m) or pp > rt.arch.num_layers:
                    continue
                r = rt.evaluate(rt.plan(dp, tp, pp, m))
                if r.feasible and (best is None or r.iteration_time_s < best.iteration_time_s):
                    best = r
            self._plans[grid] = best
        return self._plans[grid]

    def estimate(self, job, grid) -> Estimate:
        r = self.plan_result(job, grid)
        if r is None:
            return Estimate(math.inf, 0.0, 0.0, None, False, self.name, ("no measured layout runs here",))
        t = r.iteration_time_s
        return Estimate(t, job.global_batch / t, r.memory.peak_bytes, r.plan, True, self.name)


def against_local(*, model: str = LOCAL_MODEL, global_batch: int = 8, steps: int = MEASURE_STEPS,
                  skip: int = MEASURE_SKIP,
                  plans=DEFAULT_PLANS, store: ProfileStore | None = None,
                  timeout_s: float = 180, profile_repeats: int = 9) -> list[LocalResult]:
    """Profile (what ``store`` lacks), measure the runtime terms, then run every plan and
    compare. ``store`` None: a temporary store, so that the profiles are taken just before
    the runs (this host's speed drifts with its load; an old store's rates are stale)."""
    if not get_model(model).is_transformer:      # the launcher has no tensor-parallel convolution
        plans = tuple(p for p in plans if p[1] == 1)
    if not plans:
        raise InputError(f"no plan of {model} to compare", field="plans")
    if store is None:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="arena-local-profile-") as tmp:
            return against_local(model=model, global_batch=global_batch, steps=steps, skip=skip, plans=plans,
                                 store=ProfileStore(tmp), timeout_s=timeout_s, profile_repeats=profile_repeats)
    from launcher.api import run_training

    from ..compose import micro_batch_size
    rt = profile_local_runtime(model, global_batch, [dp * tp * pp for dp, tp, pp, _ in plans], store,
                               profile_repeats, [micro_batch_size(global_batch, dp, m) for dp, _, _, m in plans])
    out = []
    for dp, tp, pp, m in plans:
        plan = rt.plan(dp, tp, pp, m)
        ws, hit = rt.cache_hit(plan)
        est = {h: rt.evaluate(plan, h).iteration_time_s for h in {0.0, hit}}
        r = run_training(model, dp, tp, pp, steps=steps, microbatches=m, global_batch=global_batch,
                         timeout_s=timeout_s, stage_layers=plan.stage_layers)
        times = list(r.iteration_times_s)[skip:]
        meta = dict(estimated_cache_s=est[hit], working_set_bytes=ws, cache_hit=hit)
        if not r.ok or not times:
            out.append(LocalResult(dp, tp, pp, m, None, est[0.0], f"run failed (rc {r.returncode}): "
                                   f"{r.output_tail[-200:]}", **meta))
            continue
        out.append(LocalResult(dp, tp, pp, m, statistics.median(times), est[0.0], **meta))
    return out


def summarize_passes(passes: list[list[LocalResult]]) -> dict:
    """Per plan: the signed errors of every pass and their median; ``mape``: the mean over
    plans of the absolute median error; ``pass_mape``: each pass's own MAPE. Several passes
    (each profiling afresh) because this host's speed drifts between a pass's profiling
    and its runs: one pass's errors move together by up to ~15%."""
    plans: dict = {}
    for res in passes:
        for r in res:
            plans.setdefault((r.dp, r.tp, r.pp, r.microbatches), []).append(r)
    rows, meds, meds_c = [], [], []
    for (dp, tp, pp, m), rs in plans.items():
        errs, nc = [r.rel_error for r in rs], [r.rel_error_cache for r in rs]
        ok, ok_c = [e for e in errs if e is not None], [e for e in nc if e is not None]
        med = statistics.median(ok) if ok else None
        med_c = statistics.median(ok_c) if ok_c else None
        rows.append({"dp": dp, "tp": tp, "pp": pp, "microbatches": m, "errors": errs, "median_error": med,
                     "errors_cache": nc, "median_error_cache": med_c, "cache_hit": [r.cache_hit for r in rs],
                     "working_set_mib": [None if r.working_set_bytes is None else r.working_set_bytes / 2**20
                                         for r in rs]})
        if med is not None:
            meds.append(abs(med))
        if med_c is not None:
            meds_c.append(abs(med_c))
    pass_mape = []
    for res in passes:
        e = [abs(r.rel_error) for r in res if r.rel_error is not None]
        pass_mape.append(sum(e) / len(e) if e else None)
    return {"plans": rows, "mape": sum(meds) / len(meds) if meds else None, "pass_mape": pass_mape,
            "mape_cache": sum(meds_c) / len(meds_c) if meds_c else None, "pass_count": len(passes)}


# -- measured runtime terms of the launcher on this host --------------------------------
def _runtime_worker(rank: int, init_method: str, world: int, model: str, micro_batch: int, warmup: int,
                    repeats: int, queue):
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from launcher.data import dp_shard, make_source
    from launcher.model import build_model
    from launcher.parallelize import apply_tp

    from ..profiler import build_layer

    torch.set_num_threads(1)                    # as launcher/worker.py
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    arch = get_model(model)
    full = build_model(model, 0)
    source = make_source(arch, 0, None)

    def step_overhead(step: int) -> float:
        # the launcher's per-step work outside the model: its input pipeline, zero_grad and
        # the control all-reduce (loss and flags), as in launcher/worker.py
        t0 = time.perf_counter()
        dp_shard(source.global_batch(step, micro_batch), 1, 0)
        full.zero_grad(set_to_none=True)
        dist.all_reduce(torch.zeros(3))
        return time.perf_counter() - t0

    if world == 1:
        over = [step_overhead(i) for i in range(warmup + repeats)][warmup:]
        queue.put({"step_overhead": statistics.median(over)})
        dist.destroy_process_group()
        return
    index = next(i for i, spec in enumerate(arch.layers()) if spec.kind in BLOCK_KINDS)
    if arch.is_transformer:
        apply_tp(full, init_device_mesh("cpu", (world,)))
        dtensor_layer = next(iter(full.layers.values()))
        plain_layer, make = build_layer(arch, index, world, "float32")     # the profiler's sharded layer
    else:                                       # no tensor parallelism: contention only
        plain_layer, make = build_layer(arch, index, 1, "float32")
        dtensor_layer = plain_layer
    passes = sum(1 for spec in arch.layers() if spec.kind in BLOCK_KINDS)

    def timed(mod):
        # as many passes back to back as the model has decoder layers: a sample spans a
        # step's worth of layer work, so the host scheduler's sharing shows as in a step
        fs = bs = 0.0
        for k in range(passes):
            # the same input on every rank, as tensor parallelism has it (an MoE layer routes
            # by its input: different inputs would mean different collective sizes)
            torch.manual_seed(k)
            x = make(micro_batch)
            t0 = time.perf_counter()
            y = mod(x)
            t1 = time.perf_counter()
            y.sum().backward()
            t2 = time.perf_counter()
            mod.zero_grad(set_to_none=True)
            fs, bs = fs + t1 - t0, bs + t2 - t1
        return fs / passes, bs / passes

    samples = {"solo": [], "plain": [], "dtensor": [], "step_overhead": []}
    for it in range(warmup + repeats):
        dist.barrier()
        over = step_overhead(it)
        if rank == 0:                           # alone: the other ranks wait in the barrier
            solo = timed(plain_layer)
        dist.barrier()
        plain = timed(plain_layer)              # every rank at once
        dist.barrier()
        dt = timed(dtensor_layer)               # the launcher's layer (its all-reduces included)
        if it >= warmup:
            samples["step_overhead"].append((over, 0.0))
            samples["plain"].append(plain)
            samples["dtensor"].append(dt)
            if rank == 0:
                samples["solo"].append(solo)
    pipe = _pipeline_probe(rank, world, make, micro_batch, warmup, repeats)
    opt_s = _optimizer_probe(full, warmup, repeats) if arch.is_transformer else (0.0, 0.0)
    if rank == 0:
        out = {k: (statistics.median(f for f, _ in v), statistics.median(b for _, b in v))
               for k, v in samples.items()}
        out["step_overhead"] = out["step_overhead"][0]
        out["pipeline"] = pipe
        out["optimizer"] = opt_s
        queue.put(out)
    dist.barrier()                              # no rank tears gloo down while another still uses it
    dist.destroy_process_group()               # run_spawned's ranks then skip torch's teardown


def _optimizer_probe(model, warmup: int, repeats: int) -> tuple[float, float]:
    """(median seconds of torch.optim.Adam's step over ``model``'s parameters — DTensors
    under tensor parallelism, as the launcher trains them —, the same over plain tensors
    of the same local shapes), interleaved. Gradients are zeros: Adam's work does not
    depend on their values."""
    import time

    import torch
    from torch import nn

    def local(p):
        return p.to_local() if hasattr(p, "to_local") else p

    sharded = list(model.parameters())
    plain = [nn.Parameter(local(p).detach().clone()) for p in sharded]
    opts = []
    for params in (sharded, plain):
        for p in params:
            p.grad = torch.zeros_like(p)
        opts.append(torch.optim.Adam(params))
    times: tuple[list, list] = ([], [])
    for it in range(warmup + repeats):
        for opt, out in zip(opts, times):
            t0 = time.perf_counter()
            opt.step()
            if it >= warmup:
                out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def _pipeline_probe(rank: int, world: int, make, micro_batch: int, warmup: int, repeats: int) -> dict:
    """The launcher's 1F1B schedule (``launcher.pipeline.build_schedule``) over ``world``
    stages that only scale their input, ``PROBE_MICROBATCHES`` micro-batches of the layer
    input's shape at ``micro_batch / PROBE_MICROBATCHES`` samples: what a pipeline step
    costs beyond its layers — the schedule's dispatch and its sends. Rank 0's median step
    time (its last backward ends the step), the micro-batch count and one send's bytes."""
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    from launcher.pipeline import build_schedule

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x * self.w

    m = PROBE_MICROBATCHES
    x = make(max(1, micro_batch // m) * m).detach()
    schedule = build_schedule(Scale(), rank, world, torch.device("cpu"), dist.group.WORLD, microbatches=m,
                              schedule="1f1b", loss_fn=lambda out, target: (out * target).sum())
    times = []
    for it in range(warmup + repeats):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=x, losses=[])
        else:
            schedule.step()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "microbatches": m,
            "send_bytes": float(x.numel() * x.element_size() / m)}


def pipeline_pass_overhead_s(step_s: float, stages: int, microbatches: int, send_s: float) -> float:
    """The per-stage, per-pass overhead ``o`` for which the composition's 1F1B time of the
    probe (every stage's forward and backward ``o`` plus its modelled send) equals the
    measured ``step_s`` (0 when the sends alone already take that long). Bisection: the
    time grows with ``o``."""
    from ..compose import pipeline_time

    def t(o):
        fwd = [o + (send_s if i < stages - 1 else 0.0) for i in range(stages)]
        bwd = [o + (send_s if i > 0 else 0.0) for i in range(stages)]
        return pipeline_time(fwd, bwd, microbatches, "1f1b")

    if t(0.0) >= step_s:
        return 0.0
    lo, hi = 0.0, step_s
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t(mid) < step_s else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class RuntimeTerms:
    """Measured at ``ranks`` processes: the launcher's per-step work outside the model
    (``step_overhead_s``: input pipeline for ``micro_batch`` samples, zero_grad, the control
    all-reduce); and per decoder-layer pass (forward, backward) at ``micro_batch`` samples
    (ranks > 1 only): the profiler's plain sharded layer alone (``solo_s``) and
    with every rank computing at once (``concurrent_s``), the launcher's DTensor layer
    (``dtensor_s``, all ranks at once), and the all-reduce time the composition already
    charges for it (``modelled_allreduce_s``, from the profiled gloo fit); the pipeline
    probe's step time over ``ranks`` stages (``pp_probe_step_s``) with the per-stage,
    per-pass overhead derived from it (``pp_pass_overhead_s``, ``pipeline_pass_overhead_s``);
    and Adam's step over the launcher's tensor-parallel parameters and over plain copies
    (``optimizer_s``; transformers only)."""
    ranks: int
    micro_batch: int
    step_overhead_s: float
    solo_s: tuple[float, float] = (1.0, 1.0)              # ranks = 1: only the step overhead is measured
    concurrent_s: tuple[float, float] = (1.0, 1.0)
    dtensor_s: tuple[float, float] = (0.0, 0.0)
    modelled_allreduce_s: tuple[float, float] = (0.0, 0.0)
    pp_probe_step_s: float = 0.0
    pp_pass_overhead_s: float = 0.0
    optimizer_s: tuple[float, float] = (0.0, 0.0)       # Adam's step: DTensor parameters, plain copies

    @property
    def tp_optimizer_overhead_s(self) -> float:
        """Adam's step over the tensor-parallel (DTensor) parameters beyond the same step over
        plain tensors of the same shapes."""
        return max(0.0, self.optimizer_s[0] - self.optimizer_s[1])

    @property
    def contention(self) -> float:
        """Per-rank compute slowdown when ``ranks`` processes compute at once on this host
        (1 on a host with a free core per rank; about ``ranks`` when they time-share one)."""
        return max(1.0, sum(self.concurrent_s) / sum(self.solo_s))

    @property
    def tp_overhead_s(self) -> tuple[float, float]:
        """DTensor runtime overhead per layer pass beyond the sharded compute (at the same
        contention) and the modelled all-reduces."""
        return tuple(max(0.0, d - p - a) for d, p, a in
                     zip(self.dtensor_s, self.concurrent_s, self.modelled_allreduce_s))


def profile_runtime_terms(model: str, *, ranks: int, micro_batch: int, comm, gpu, warmup: int = 3,
                          repeats: int = 15, timeout_s: float = 120.0) -> RuntimeTerms:
    """Measure ``RuntimeTerms`` with ``ranks`` gloo processes (torch.multiprocessing spawn):
    one decoder layer of ``model`` as the launcher runs it under tensor parallelism (torch
    ``parallelize_module``) and the plain sharded layer the layer profiler times, alone
    and concurrently, interleaved so that all see the same host load."""
    import torch.multiprocessing as mp

    from ..layers import layer_costs
    from ..profiler import run_spawned
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    run_spawned(_runtime_worker, (ranks, model, micro_batch, warmup, repeats, q), ranks,
                timeout_s, "runtime-term profiling")
    res = q.get()
    if ranks == 1:
        return RuntimeTerms(1, micro_batch, res["step_overhead"])
    cost = next(c for c in layer_costs(get_model(model), micro_batch=micro_batch, tp=ranks) if c.kind in BLOCK_KINDS)
    ar = comm.allreduce_s(cost.tp_allreduce_bytes, ranks, gpu, "intra")
    pipe = res["pipeline"]
    over = pipeline_pass_overhead_s(pipe["step_s"], ranks, pipe["microbatches"],
                                    comm.p2p_s(pipe["send_bytes"], gpu, "intra"))
    return RuntimeTerms(ranks, micro_batch, res["step_overhead"], res["solo"], res["plain"], res["dtensor"],
                        (ar * cost.tp_allreduces_fwd, ar * cost.tp_allreduces_bwd), pipe["step_s"], over,
                        tuple(res["optimizer"]))
