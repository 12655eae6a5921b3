"""Every knob of the estimators in one validated, immutable place.

Hardware specs (peak FLOP/s, memory, bandwidths) live in ``instances/gpus.py``; model
shapes in ``instances/models.py``. What lives here is how much of those specs a real
training step achieves (efficiency factors), what the training runtime does
(recomputation, sharded optimizer update, optimizer per family), the memory accounting
rules, and the planner's search limits. The defaults describe the project's torch
launcher; ``arena_runtime()`` gives the runtime of the Arena artifact that produced the
measured table. The six fitted constants (compute efficiency of transformer, MoE and
convolution layers; memory, intra- and inter-node bandwidth efficiency) were set by
``estimators.evaluation.calibrate.fit_efficiency`` on the Arena measured table (all four GPU types)
under ``arena_runtime()``; latencies and overheads are typical values, not fitted.
``arena estimate accuracy --refit-analytic`` reports the leave-one-GPU-type-out refit, so
that the in-sample effect of these few global constants is visible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from instances.errors import InputError
from instances.memory_rule import (
    ARENA_GRID_MEMORY_MARGIN,
    GRID_MEMORY_MARGIN,
    OPTIMIZERS,
    RUNTIME_RESERVE_BYTES,
    USABLE_MEMORY_FRACTION,
    state_bytes_per_param,
)

# Layer kinds of instances.models.LayerSpec.
ROOFLINE_COMBINES = ("max", "sum")
LAYER_KINDS = ("embedding", "decoder", "moe_decoder", "head", "conv_stem", "bottleneck", "classifier")


def _check_fraction(name: str, v: float, *, upper: float = 1.0) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 < v <= upper):
        raise InputError(f"must be in (0, {upper}], got {v!r}", field=name)


def _check_nonneg(name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0.0):
        raise InputError(f"must be a finite number >= 0, got {v!r}", field=name)


@dataclass(frozen=True)
class EfficiencyConfig:
    """Achieved fractions of catalog peaks, and fixed overheads.

    ``kind_compute_efficiency``: achieved fraction of the dtype's peak FLOP/s for each
    layer kind (the roofline's compute roof). ``memory_bw_efficiency``: achieved fraction
    of HBM bandwidth (memory roof). ``intra_bw_efficiency`` / ``inter_bw_efficiency``:
    achieved fraction of the catalog's intra-/inter-node link bandwidth in collectives.
    """
    # fitted by calibrate.fit_efficiency on the 318 measured Arena rows under arena_runtime()
    # (max roofline, no TF32, GA10x fp32 GEMM rate; 150 Powell evaluations, mean squared log
    # error 0.037)
    kind_compute_efficiency: tuple[tuple[str, float], ...] = (
        ("embedding", 0.495), ("decoder", 0.495), ("moe_decoder", 0.311), ("head", 0.495),
        ("conv_stem", 0.422), ("bottleneck", 0.422), ("classifier", 0.422))
    memory_bw_efficiency: float = 0.166
    intra_bw_efficiency: float = 0.0608
    inter_bw_efficiency: float = 0.0285    # fitted: the testbed's inter-node links were far below NIC spec
    collective_latency_s: float = 30e-6       # per ring step
    layer_overhead_s: float = 40e-6           # kernel launches etc. per layer per micro-batch pass
    half_efficiency_flops: float = 0.0        # a layer pass of this many FLOPs reaches half its kind's
                                              # efficiency (small GEMMs run slower); 0: size-independent
    backward_flops_ratio: float = 2.0         # backward = 2x forward FLOPs
    recompute_activations: bool = False       # backward re-runs the forward (adds 1x fwd); see arena_runtime()
    dp_sharded_optimizer: bool = False        # the optimizer update is sharded over data-parallel ranks:
                                              # gradients reduce-scattered, each rank updates 1/dp of the
                                              # parameters, updated weights all-gathered (Alpa
                                              # prefer_reduce_scatter, ZeRO-1/2 style); see arena_runtime()
    dp_overlap: bool = True                   # gradient all-reduce overlapped with backward
    dp_overlap_fraction: float = 0.8          # at most this share of the all-reduce hides under backward
    optimizer_traffic_bytes_per_param: float = 32.0   # Adam, mixed precision: read/write of states+master+grad
    roofline_combine: str = "max"             # "max": one fused kernel per layer, max(compute, memory);
                                              # "sum": matmul/conv kernels and memory-bound elementwise
                                              # kernels (norms, activations) run one after another
    tp_replicated_embedding_head: bool = False  # under tensor parallelism the embeddings and output head stay
                                              # whole on every tensor rank (the torch launcher,
                                              # launcher/parallelize.py) instead of vocabulary-parallel
    step_overhead_s: float = 0.0              # fixed time per iteration outside the layers and the optimizer
                                              # (input pipeline, zero_grad, control all-reduce); measured
                                              # for the launcher by local_accuracy.profile_runtime_terms
    tp_layer_overhead_fwd_s: float = 0.0      # extra time per decoder layer pass under tp > 1 beyond its
    tp_layer_overhead_bwd_s: float = 0.0      # sharded compute and modelled all-reduces (DTensor dispatch);
                                              # measured by local_accuracy.profile_runtime_terms
    tp_optimizer_overhead_s: float = 0.0      # extra optimizer-step time per iteration under tp > 1 (Adam over
                                              # DTensor parameters: dispatch per tensor op); measured by
                                              # local_accuracy.profile_runtime_terms
    pp_pass_overhead_s: float = 0.0           # extra time per stage per micro-batch pass (forward or backward)
                                              # under pp > 1 beyond its layers and modelled sends (the pipeline
                                              # schedule's dispatch); measured by local_accuracy.profile_runtime_terms
    allow_tf32: bool = False                  # fp32 matmuls/convs run on TF32 tensor cores where the GPU has
                                              # them. Off: the Arena table contradicts it (Wide-ResNet fp32 runs
                                              # only 1.37x faster on A100 than on V100; see docs/estimators.md)

    def __post_init__(self):
        kinds = dict(self.kind_compute_efficiency)
        if len(kinds) != len(self.kind_compute_efficiency):
            raise InputError("duplicate layer kind", field="kind_compute_efficiency")
        for k, v in kinds.items():
            if k not in LAYER_KINDS:
                raise InputError(f"unknown layer kind {k!r}; known: {', '.join(LAYER_KINDS)}",
                                 field="kind_compute_efficiency")
            _check_fraction(f"kind_compute_efficiency[{k}]", v)
        missing = set(LAYER_KINDS) - set(kinds)
        if missing:
            raise InputError(f"missing layer kinds {sorted(missing)}", field="kind_compute_efficiency")
        for n in ("memory_bw_efficiency", "intra_bw_efficiency", "inter_bw_efficiency"):
            _check_fraction(n, getattr(self, n))
        _check_fraction("dp_overlap_fraction", self.dp_overlap_fraction)
        for n in ("collective_latency_s", "layer_overhead_s", "optimizer_traffic_bytes_per_param",
                  "half_efficiency_flops", "step_overhead_s", "tp_layer_overhead_fwd_s", "tp_layer_overhead_bwd_s",
                  "tp_optimizer_overhead_s", "pp_pass_overhead_s"):
            _check_nonneg(n, getattr(self, n))
        if self.roofline_combine not in ROOFLINE_COMBINES:
            raise InputError(f"unknown roofline combine {self.roofline_combine!r}; known: "
                             f"{', '.join(ROOFLINE_COMBINES)}", field="roofline_combine")
        for n in ("allow_tf32", "recompute_activations", "dp_sharded_optimizer", "dp_overlap",
                  "tp_replicated_embedding_head"):
            if not isinstance(getattr(self, n), bool):
                raise InputError(f"must be true or false, got {getattr(self, n)!r}", field=n)
        if not self.backward_flops_ratio > 0:
            raise InputError("must be > 0", field="backward_flops_ratio")

    def compute_efficiency(self, kind: str) -> float:
        return dict(self.kind_compute_efficiency)[kind]

    def compute_peak_flops(self, gpu, dtype: str) -> float:
        """The compute roof's peak for ``dtype`` on ``gpu``: fp32 matmuls/convs use the TF32
        tensor-core peak when ``allow_tf32`` and the GPU has one (catalog ``tf32_flops``)."""
        if dtype in ("float32", "fp32"):
            return gpu.fp32_matmul_flops(self.allow_tf32)
        return gpu.peak_flops(dtype)

    def with_kind_efficiency(self, **kinds: float) -> "EfficiencyConfig":
        d = dict(self.kind_compute_efficiency)
        d.update(kinds)
        return replace(self, kind_compute_efficiency=tuple(sorted(d.items())))


@dataclass(frozen=True)
class MemoryConfig:
    """Per-rank memory accounting (bytes per parameter by role; reserves). The defaults and
    the bytes per parameter are the project's one memory rule (``instances.memory_rule``):
    mixed precision Adam (fp16/bf16 models): weights 2 + grads 2 + fp32 master 4 + Adam
    m 4 + v 4 = 16 bytes/param; pure fp32 models: weights 4 + grads 4 + m 4 + v 4 = 16.
    """
    optimizer: str = "adam"                  # "adam" or "sgd" (momentum), for families not listed below
    optimizer_by_family: tuple[tuple[str, str], ...] = ()   # family -> optimizer; see arena_runtime()
    framework_reserve_bytes: float = RUNTIME_RESERVE_BYTES   # CUDA context, allocator slack, workspaces
    usable_fraction: float = USABLE_MEMORY_FRACTION         # of the GPU's memory a plan may fill
    grid_margin: float = GRID_MEMORY_MARGIN   # a grid (not pure DP) is kept when its lowest-memory plan
                                              # x this fits (instances.memory_rule; arena_runtime() sets it)
    recompute_layer_peak: bool = True        # with activation recomputation, a layer's backward holds
                                              # that layer's full activations (Korthikanti et al.); False:
                                              # only the kept layer inputs (see arena_runtime())

    def __post_init__(self):
        for fam, opt in (("*", self.optimizer),) + tuple(self.optimizer_by_family):
            if opt not in OPTIMIZERS:
                raise InputError(f"unknown optimizer {opt!r} for {fam}; known: {', '.join(OPTIMIZERS)}",
                                 field="optimizer_by_family" if fam != "*" else "optimizer")
        if len(dict(self.optimizer_by_family)) != len(self.optimizer_by_family):
            raise InputError("duplicate family", field="optimizer_by_family")
        _check_nonneg("framework_reserve_bytes", self.framework_reserve_bytes)
        _check_fraction("usable_fraction", self.usable_fraction)
        if not (isinstance(self.grid_margin, (int, float)) and 1.0 <= self.grid_margin < float("inf")):
            raise InputError(f"must be a number >= 1, got {self.grid_margin!r}", field="grid_margin")
        if not isinstance(self.recompute_layer_peak, bool):
            raise InputError(f"must be true or false, got {self.recompute_layer_peak!r}", field="recompute_layer_peak")

    def optimizer_for(self, family: str | None) -> str:
        return dict(self.optimizer_by_family).get(family, self.optimizer)

    def state_bytes_per_param(self, dtype_bytes: int, family: str | None = None, shard: int = 1) -> float:
        """Weights + grads + optimizer state bytes per parameter (``instances.memory_rule``);
        the optimizer part (fp32 master copy for 16-bit models, Adam m and v or SGD
        momentum) divided by ``shard`` when the update is sharded over that many
        data-parallel ranks."""
        return state_bytes_per_param(dtype_bytes, self.optimizer_for(family), shard)


@dataclass(frozen=True)
class PlannerConfig:
    """Search limits of the planner and the proxy plan's rules."""
    max_exhaustive_splits: int = 3000        # enumerate all stage splits when there are at most this many
    split_perturbation: int = 2              # otherwise: balanced split with boundaries moved by up to +-this
    max_microbatches: int = 64
    proxy_microbatches_per_stage: int = 4    # proxy: m >= this * pp (bubble <= 1/(m/pp))
    proxy_microbatch_candidates: int = 3     # proxy: also 2x and 4x that count
    tp_within_node_only: bool = True         # proxy keeps tensor parallelism inside a node
    max_tp: int = 8
    dp_only_grad_accumulation: bool = True   # pure data-parallel plans may accumulate gradients over
                                              # micro-batches (the launcher's DDP no_sync does); False: one
                                              # micro-batch of the whole per-GPU batch (see arena_runtime())

    def __post_init__(self):
        for n in ("max_exhaustive_splits", "max_microbatches", "proxy_microbatches_per_stage",
                  "proxy_microbatch_candidates", "max_tp"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"must be a positive integer, got {v!r}", field=n)
        if not isinstance(self.split_perturbation, int) or self.split_perturbation < 0:
            raise InputError("must be an integer >= 0", field="split_perturbation")
        if not isinstance(self.dp_only_grad_accumulation, bool):
            raise InputError(f"must be true or false, got {self.dp_only_grad_accumulation!r}",
                             field="dp_only_grad_accumulation")


@dataclass(frozen=True)
class EstimatorConfig:
    efficiency: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)


def arena_runtime(cfg: EstimatorConfig | None = None) -> EstimatorConfig:
    """``cfg`` (default: the defaults) with the runtime facts of the Arena artifact, whose
    Alpa/JAX trainers produced the measured table (read from its trainer code): coarse-grained
    activation rematerialisation (``use_remat=True``), the optimizer update sharded over
    data-parallel ranks (``prefer_reduce_scatter=True``), AdamW with an fp32 master copy
    for GPT/MoE and SGD with Nesterov momentum for Wide-ResNet. Two more are inferred from
    its pure-DP memory table (``dp_mem.json``), not read from code: its data-parallel runs
    take the whole per-GPU batch in one micro-batch (no gradient accumulation), and XLA's
    rematerialised backward holds no full layer's activations beyond the kept inputs; with
    both, that table's fit/OOM split is matched on 157 of 180 runs instead of 130 (see
    docs/estimators.md), and the measured table's error is unchanged. The defaults instead
    describe the project's own torch launcher (Adam, no recomputation, gradient
    all-reduce). Efficiency factors are hardware properties and are shared by both. The
    grid memory margin (``ARENA_GRID_MEMORY_MARGIN``) is chosen on the measured table's
    out-of-memory rows (``instances.memory_rule``)."""
    cfg = cfg or EstimatorConfig()
    return replace(cfg, efficiency=replace(cfg.efficiency, recompute_activations=True, dp_sharded_optimizer=True),
                   memory=replace(cfg.memory, optimizer_by_family=(("wide_resnet", "sgd"),),
                                  recompute_layer_peak=False, grid_margin=ARENA_GRID_MEMORY_MARGIN),
                   planner=replace(cfg.planner, dp_only_grad_accumulation=False))


def config_to_dict(cfg) -> dict:
    out = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = config_to_dict(v) if hasattr(v, "__dataclass_fields__") else v
    return out
