"""Refuse a bad plan before anything is launched, with a message that says why.

Checks: the run's paths (checkpoint and run folders writable folders, not files; the
data file: launcher/datafile.py), the device (``cuda`` needs a GPU torch can see); the plan's rank
count against the ranks requested; tensor degree dividing heads,
hidden and MLP sizes; pipeline depth against the layer count; the batch split into
data-parallel shards and micro-batches; the schedule's micro-batch requirement; and a
memory estimate per rank (weights + gradients + Adam moments + activations in flight)
against the target device's memory from ``instances.gpus``.

The memory estimate is an approximation: parameters of the stage with the most
parameters, tensor-sharded parts divided by the tensor degree, everything in float32 as
the launcher trains (4 B weight + 4 B gradient + 8 B Adam moments per parameter), plus the
catalog's per-layer activation bytes (scaled to float32) for every micro-batch a stage
holds at once (GPipe: all of them; 1F1B: ``pp - stage`` at most), plus a fixed runtime
reserve, against a usable fraction of the device's memory. Bytes per parameter, reserve
and usable fraction are the project's one memory rule (``instances.memory_rule``), the
one the estimators and the scheduler use. It ignores allocator fragmentation and
temporary buffers beyond that reserve.
"""
from __future__ import annotations

from dataclasses import dataclass

from instances.arch import DTYPE_BYTES, ModelArch
from instances.errors import InputError
from instances.gpus import get_gpu
from instances.memory_rule import RUNTIME_RESERVE_BYTES, USABLE_MEMORY_FRACTION, state_bytes_per_param
from instances.models import get_model
from instances.paths import check_output_dir, check_output_file

from .config import TrainConfig
from .datafile import DataFileRefused, check_data_file, min_data_bytes
from .pipeline import stage_ranges

TRAIN_DTYPE_BYTES = DTYPE_BYTES["float32"]
BYTES_PER_PARAM = state_bytes_per_param(TRAIN_DTYPE_BYTES, "adam")   # weight + gradient + two Adam moments


@dataclass(frozen=True)
class MemoryEstimate:
    per_rank_bytes: float             # the largest over stages
    weights_and_optimizer_bytes: float
    activation_bytes: float
    device_memory_bytes: int
    device: str

    @property
    def fits(self) -> bool:
        return self.per_rank_bytes <= USABLE_MEMORY_FRACTION * self.device_memory_bytes


def estimate_memory(cfg: TrainConfig, device_type: str) -> MemoryEstimate:
    arch = get_model(cfg.model)
    plan = cfg.plan
    layers = arch.layers()
    emb, decoders, head = layers[0], layers[1:-1], layers[-1]
    # launcher.model does not tie the GPT/MoE head (the catalog counts it tied); Llama is untied
    # anyway, Wide-ResNet has none (vocab 0)
    untied_head = arch.vocab_size * arch.hidden_size if arch.tied_embeddings and arch.base_family != "llama" else 0
    micro = cfg.global_batch / (plan.dp * plan.microbatches)
    act_scale = TRAIN_DTYPE_BYTES / arch.dtype_bytes
    worst = (0.0, 0.0, 0.0)
    for i, (lo, hi) in enumerate(stage_ranges(arch.num_blocks, plan.pp, plan.stage_layers)):
        params = sum(d.params for d in decoders[lo:hi]) / plan.tp
        act = sum(d.activation_bytes for d in decoders[lo:hi]) / plan.tp
        if i == 0:
            params += emb.params
        if i == plan.pp - 1:
            params += head.params + untied_head
            act += head.activation_bytes
        in_flight = plan.microbatches if plan.schedule == "gpipe" or plan.pp == 1 else \
            min(plan.microbatches, plan.pp - i)
        state = params * BYTES_PER_PARAM
        acts = act * act_scale * micro * in_flight
        total = state + acts + RUNTIME_RESERVE_BYTES
        if total > worst[0]:
            worst = (total, state, acts)
    gpu = get_gpu(device_type)
    return MemoryEstimate(worst[0], worst[1], worst[2], gpu.memory_bytes, gpu.name)


def check_paths(cfg: TrainConfig) -> None:
    """Folders the ranks write and the file they read, checked here rather than inside the
    ranks after launch (or, for the checkpoint folder, at the first save)."""
    if cfg.checkpoint_dir:
        check_output_dir(cfg.checkpoint_dir, "checkpoint_dir")
    if cfg.run_dir:
        check_output_dir(cfg.run_dir, "run_dir")
    if cfg.telemetry_path:                      # (/dev/full or a pipe failed or hung in the ranks)
        check_output_file(cfg.telemetry_path, "telemetry_path", regular="every rank appends its steps to it")
    if cfg.telemetry_store:
        check_output_dir(cfg.telemetry_store, "telemetry_store")
    if cfg.data_path:
        check_data(cfg)


def check_data(cfg: TrainConfig) -> None:
    """The data file (launcher/datafile.py): for a token model, a regular readable file of
    one sample or more, within ``cfg.data_roots`` when they are given (``DataFileRefused``)."""
    arch = get_model(cfg.model)
    if not arch.is_transformer:
        raise DataFileRefused(f"model {arch.name} trains on synthetic images; a data file is for token models",
                              file=cfg.data_path, field="data")
    check_data_file(cfg.data_path, min_bytes=min_data_bytes(arch.seq_len), roots=cfg.data_roots, field="data")


SUPPORTED_FAMILIES = ("gpt", "tiny-gpt", "llama", "tiny-llama", "moe", "tiny-moe", "wide_resnet",
                      "tiny-wide_resnet")      # what launcher.model builds (kept here, free of torch)


def check_supported(arch: ModelArch) -> None:
    if arch.family not in SUPPORTED_FAMILIES:
        raise InputError(f"the launcher trains the families {', '.join(SUPPORTED_FAMILIES)}; "
                         f"model {arch.name} is family {arch.family!r}", field="model")


def check_device(cfg: TrainConfig) -> None:
    """``device="cuda"`` needs a CUDA GPU that torch sees here (imports torch only then)."""
    if cfg.device != "cuda":
        return
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise InputError("device 'cuda' asked for, but torch sees no CUDA GPU on this machine "
                         f"(torch {torch.__version__}, cuda available: {torch.cuda.is_available()}); "
                         "use --device cpu or auto", field="device")


def validate(cfg: TrainConfig, *, ranks: int | None = None, device_type: str = "cpu") -> MemoryEstimate:
    """Raise ``InputError`` naming the field at fault; return the memory estimate if all is well."""
    check_paths(cfg)
    check_device(cfg)
    arch = get_model(cfg.model)
    check_supported(arch)
    plan = cfg.plan
    if ranks is not None and ranks != plan.world_size:
        raise InputError(f"plan {plan} needs dp*tp*pp = {plan.world_size} ranks but {ranks} were "
                         f"requested", field="plan")
    if not arch.is_transformer and plan.tp > 1:
        raise InputError(f"the launcher splits model {arch.name} (Wide-ResNet) over data and pipeline "
                         f"ranks only, got tp={plan.tp}", field="plan.tp")
    for what, size in (("num_heads", arch.num_heads), ("num_kv_heads", arch.kv_heads),
                       ("hidden_size", arch.hidden_size), ("ffn", arch.ffn)):
        if arch.is_transformer and size % plan.tp:
            raise InputError(f"tensor degree tp={plan.tp} does not divide model {arch.name}'s "
                             f"{what}={size}", field="plan.tp")
    if plan.pp > arch.num_blocks:
        raise InputError(f"pipeline depth pp={plan.pp} exceeds model {arch.name}'s {arch.num_blocks} "
                         f"layers", field="plan.pp")
    if plan.stage_layers and sum(plan.stage_layers) != arch.num_blocks:
        raise InputError(f"stage_layers {plan.stage_layers} do not sum to {arch.num_blocks} layers",
                         field="plan.stage_layers")
    if cfg.global_batch % (plan.dp * plan.microbatches):
        raise InputError(f"global batch {cfg.global_batch} is not divisible by dp*microbatches = "
                         f"{plan.dp}*{plan.microbatches}", field="global_batch")
    if plan.pp > 1 and plan.schedule == "1f1b" and plan.microbatches < plan.pp:
        raise InputError(f"the 1F1B schedule needs at least pp={plan.pp} micro-batches, got "
                         f"{plan.microbatches} (raise --microbatches or use --schedule gpipe)",
                         field="microbatches")
    if cfg.num_nodes > plan.world_size or plan.world_size % cfg.num_nodes:
        raise InputError(f"{plan.world_size} ranks cannot spread evenly over {cfg.num_nodes} nodes",
                         field="num_nodes")
    mem = estimate_memory(cfg, device_type)
    if not mem.fits:
        raise InputError(f"plan {plan} does not fit in memory on {mem.device}: needs about "
                         f"{mem.per_rank_bytes / 2**30:.1f} GiB per rank (weights+grads+Adam "
                         f"{mem.weights_and_optimizer_bytes / 2**30:.1f} GiB, activations "
                         f"{mem.activation_bytes / 2**30:.1f} GiB), device has "
                         f"{mem.device_memory_bytes / 2**30:.1f} GiB "
                         f"(usable fraction {USABLE_MEMORY_FRACTION})", field="plan")
    return mem
