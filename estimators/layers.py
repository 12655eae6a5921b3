"""Per-layer costs of a model on one rank: FLOPs, bytes moved, parameters, activations,
and tensor-parallel collective volume, forward and backward.

Single source: ``ModelArch.layers()`` (instances/models.py) gives every layer per sample,
unsharded. This module shards it by the tensor-parallel degree ``tp`` (Megatron layout)
and scales it by the micro-batch size. Sequence length and dtype are changed by deriving
the architecture again (``dataclasses.replace(arch, seq_len=..., dtype=...)``), so every
quantity stays derived from the catalog.

Tensor-parallel sharding rules (per rank):
- decoder / moe_decoder: FLOPs and parameters / tp (attention heads and MLP columns are
  split; the few layer-norm/bias parameters are counted as split too, <0.1% error).
  Activations follow Korthikanti et al. 2022 without sequence parallelism:
  ``s*h*(10 + 24/t + 5*a*s/(h*t))`` bytes at fp16 per sample (the model catalog's figure
  is the t=1 case). Collectives: 2 all-reduces of ``b*s*h`` elements forward (after
  attention and after the MLP), 2 backward (their conjugates).
- embedding: vocabulary-parallel; parameters / tp, 1 all-reduce of ``b*s*h`` forward.
- moe_decoder, expert parallelism: the experts are also spread over ``ep`` data-parallel
  ranks (``expert_parallel_degree``; GShard/Alpa style), so a rank holds
  ``expert_params / ep`` of them; tokens reach their experts by 2 all-to-alls forward
  and 2 backward of ``b*s*h*top_k`` elements over the data-parallel group.
- head: vocabulary-parallel logits; FLOPs, parameters and logits / tp; 1 all-reduce of
  ``b*s*h`` backward (the input's gradient) and a small forward all-reduce for the
  parallel cross-entropy (3 fp32 numbers per token).
- Wide-ResNet conv_stem / bottleneck / classifier: output channels split (Alpa-style
  channel sharding); FLOPs, parameters, activations / tp; 1 all-reduce of the layer's
  output forward, 1 backward. This is an approximation of what a conv shard needs.

Bytes moved (for the roofline's memory roof), per pass: forward reads the rank's weights
and writes the activations it keeps plus its output; backward moves twice that (reads
activations and weights, writes weight and input gradients).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from instances.arch import DTYPE_BYTES, LayerSpec, ModelArch

TRANSFORMER_KINDS = ("decoder", "moe_decoder")
CONV_KINDS = ("conv_stem", "bottleneck", "classifier")


@dataclass(frozen=True)
class LayerCost:
    """Cost of one layer on one tensor-parallel rank for one micro-batch."""
    kind: str
    signature: tuple
    micro_batch: int
    tp: int
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float                 # memory traffic of the forward pass
    bwd_bytes: float
    params: float                    # parameters held by this rank
    param_bytes: float
    activation_bytes: float          # kept for backward, this micro-batch, this rank
    output_bytes: float              # boundary tensor to the next layer (full, not sharded)
    tp_allreduce_bytes: float        # size of one tensor-parallel all-reduce message
    tp_allreduces_fwd: int
    tp_allreduces_bwd: int
    tp_small_allreduce_bytes: float = 0.0   # e.g. parallel cross-entropy statistics (forward)
    expert_params: float = 0.0       # of ``params``: expert weights (MoE), split further by expert parallelism
    a2a_bytes: float = 0.0           # MoE: tokens dispatched by this rank per all-to-all (2 fwd, 2 bwd)

    def rank_params(self, ep: int = 1) -> float:
        """Parameters held by one rank when experts are spread over ``ep`` ranks."""
        return self.params - self.expert_params * (1 - 1 / ep)

    @property
    def tp_comm_bytes_fwd(self) -> float:
        return self.tp_allreduce_bytes * self.tp_allreduces_fwd + self.tp_small_allreduce_bytes

    @property
    def tp_comm_bytes_bwd(self) -> float:
        return self.tp_allreduce_bytes * self.tp_allreduces_bwd


def _unit_cost(arch: ModelArch, spec: LayerSpec, tp: int, backward_ratio: float) -> LayerCost:
    """Per-sample (micro_batch=1) cost of ``spec`` on one of ``tp`` ranks."""
    b = arch.dtype_bytes
    params = spec.params / tp
    act = spec.activation_bytes
    fwd_flops = spec.fwd_flops / tp
    ar_bytes, n_fwd, n_bwd, small = 0.0, 0, 0, 0.0
    expert, a2a = 0.0, 0.0
    if spec.kind in TRANSFORMER_KINDS:
        s, h, a = arch.seq_len, arch.hidden_size, arch.num_heads
        sharded = s * h * (24 + 5 * a * s / h) * (b / 2)
        if spec.kind == "moe_decoder":
            sharded += s * h * b * 2 * (arch.top_k - 1) * 2
            expert = arch.num_experts * (2 * h * arch.ffn + arch.ffn + h) / tp
            a2a = float(s * h * b * arch.top_k)
        act = act - sharded * (1 - 1 / tp)
        if tp > 1:
            ar_bytes, n_fwd, n_bwd = float(s * h * b), 2, 2
    elif spec.kind == "embedding":
        if tp > 1:
            ar_bytes, n_fwd = float(arch.seq_len * arch.hidden_size * b), 1
    elif spec.kind == "head":
        s, h, V = arch.seq_len, arch.hidden_size, arch.vocab_size
        act = s * V * 4 / tp + s * h * b
        if tp > 1:
            ar_bytes, n_bwd, small = float(s * h * b), 1, float(3 * s * 4)
    elif spec.kind in CONV_KINDS:
        act = act / tp
        if tp > 1:
            ar_bytes, n_fwd, n_bwd = float(spec.output_bytes), 1, 1
    else:
        raise ValueError(f"no sharding rule for layer kind {spec.kind!r}")
    param_bytes = params * b
    fwd_bytes = param_bytes + act + spec.output_bytes
    return LayerCost(spec.kind, spec.signature, 1, tp, fwd_flops, backward_ratio * fwd_flops,
                     fwd_bytes, 2.0 * fwd_bytes, params, param_bytes, act, spec.output_bytes,
                     ar_bytes, n_fwd, n_bwd, small, expert, a2a)


@lru_cache(maxsize=4096)
def _unit_costs(arch: ModelArch, tp: int, backward_ratio: float) -> tuple[LayerCost, ...]:
    return tuple(_unit_cost(arch, spec, tp, backward_ratio) for spec in arch.layers())


def scale(c: LayerCost, micro_batch: int) -> LayerCost:
    """The per-sample cost ``c`` at ``micro_batch`` samples (parameters do not scale)."""
    k = micro_batch / c.micro_batch
    return replace(c, micro_batch=micro_batch, fwd_flops=c.fwd_flops * k, bwd_flops=c.bwd_flops * k,
                   fwd_bytes=c.param_bytes + (c.fwd_bytes - c.param_bytes) * k,
                   bwd_bytes=2 * c.param_bytes + (c.bwd_bytes - 2 * c.param_bytes) * k,
                   activation_bytes=c.activation_bytes * k, output_bytes=c.output_bytes * k,
                   tp_allreduce_bytes=c.tp_allreduce_bytes * k,
                   tp_small_allreduce_bytes=c.tp_small_allreduce_bytes * k, a2a_bytes=c.a2a_bytes * k)


def derive_arch(arch: ModelArch, *, seq_len: int | None = None, dtype: str | None = None) -> ModelArch:
    """``arch`` with another sequence length or dtype (everything re-derived)."""
    changes = {}
    if seq_len is not None and seq_len != arch.seq_len:
        if not arch.is_transformer:
            raise ValueError(f"model {arch.name} has no sequence length")
        changes["seq_len"] = seq_len
    if dtype is not None and dtype != arch.dtype:
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        changes["dtype"] = dtype
    return replace(arch, **changes) if changes else arch


def layer_costs(arch: ModelArch, *, micro_batch: int = 1, tp: int = 1, seq_len: int | None = None,
                dtype: str | None = None, backward_ratio: float = 2.0) -> tuple[LayerCost, ...]:
    """Every layer's cost on one of ``tp`` tensor-parallel ranks for one micro-batch."""
    if micro_batch < 1 or tp < 1:
        raise ValueError(f"micro_batch and tp must be >= 1, got {micro_batch}, {tp}")
    arch = derive_arch(arch, seq_len=seq_len, dtype=dtype)
    return _layer_costs(arch, micro_batch, tp, backward_ratio)


@lru_cache(maxsize=1024)          # about 0.5 kB a layer: 16 kB for a 34-layer GPT
def _layer_costs(arch: ModelArch, micro_batch: int, tp: int, backward_ratio: float) -> tuple[LayerCost, ...]:
    """``layer_costs`` once per (architecture, micro-batch, tp): a replay's planner asks for
    the same ones for every data-parallel degree and GPU type (the costs are frozen). The
    first 400 rounds of the `arena` philly replay, where new estimates dominate: 7.9 s
    before, 6.7–6.9 s after (two alternated runs each; same decisions); over the whole
    every-round replay the gain is within this host's noise."""
    units = _unit_costs(arch, tp, backward_ratio)
    if micro_batch == 1:
        return units
    return tuple(scale(c, micro_batch) for c in units)


def expert_parallel_degree(arch: ModelArch, dp: int, max_ep: int | None = None) -> int:
    """GShard-style expert parallelism along the data-parallel axis: the experts of a MoE
    layer are spread over the largest power of two dividing ``dp``, at most the expert
    count and at most ``max_ep`` (the composition passes the data-parallel ranks that share
    a node, so the all-to-alls stay on the intra-node link); 1 for dense models."""
    if arch.num_experts <= 1:
        return 1
    cap = arch.num_experts if max_ep is None else min(arch.num_experts, max(1, max_ep))
    ep = 1
    while dp % (ep * 2) == 0 and ep * 2 <= cap:
        ep *= 2
    return ep


def max_useful_tp(arch: ModelArch) -> int:
    """Largest tensor-parallel degree the architecture can be split by (heads / channels)."""
    if arch.is_transformer:
        return arch.kv_heads if arch.base_family == "llama" else arch.num_heads
    return arch.num_channels
