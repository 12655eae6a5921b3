"""A model's architecture and its per-layer decomposition: the one place parameters,
FLOPs and activation sizes come from (the estimators build on ``ModelArch.layers()``).
The catalog of named models is ``instances.models``; a user's own model from a
``config.json`` is ``instances.hf_config``.

Families:
- ``gpt``: GPT-style decoder stack (Arena's artifact calls this family ``bert``; the
  importers map ``bert__X`` to ``gpt__X``). Megatron layout, tied embeddings.
- ``moe``: GShard-style decoder in which every layer's MLP is a mixture of experts
  (top-2 gating). That every layer holds experts is inferred from the artifact's sizes
  (moe 1.3B: 16 layers x (4h^2 + 16 experts x 8h^2) + embeddings = 1.27B).
- ``wide_resnet``: bottleneck Wide-ResNet as Alpa defines it (the artifact's source):
  stage filters ``num_channels * 2**i``; each bottleneck is 1x1 conv to ``filters``,
  3x3 conv to ``filters * width_factor`` (the only widened conv), 1x1 conv to
  ``filters * 4``. The artifact's size labels are labels; derived counts are close
  (500M derives to 0.50B, 6.8B to 6.73B, 13B to 12.6B).
- ``llama``: Llama-style decoder (RMSNorm, SwiGLU MLP, grouped-query attention,
  untied head).

FLOPs count multiply-adds as 2 FLOPs; ``fwd_flops`` is per sample (one sequence or one
image) in the forward pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a model, per sample, unsharded (tensor degree 1)."""
    kind: str                 # "embedding", "decoder", "moe_decoder", "head", "conv_stem", "bottleneck", "classifier"
    params: int
    fwd_flops: float          # forward FLOPs per sample
    activation_bytes: float   # activations kept for backward, per sample
    output_bytes: float       # boundary tensor handed to the next layer, per sample
    signature: tuple = ()     # shape signature: layers with equal (kind, signature) cost the same


@dataclass(frozen=True)
class ModelArch:
    family: str
    size: str
    dtype: str = "float16"
    # transformer fields
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0          # 0: same as num_heads
    ffn_hidden_size: int = 0       # 0: 4 * hidden_size
    seq_len: int = 0
    vocab_size: int = 0
    num_experts: int = 0
    top_k: int = 2
    expert_group_size: int = 0
    tied_embeddings: bool = True
    # wide-resnet fields
    width_factor: int = 0
    num_channels: int = 0
    image_size: int = 0
    num_classes: int = 0
    depth: int = 0                 # 50 or 101
    source: str = ""               # absolute path of the config.json it was read from; "" for the catalog

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"model {self.name}: unknown dtype {self.dtype!r}")
        if self.is_transformer:
            for f in ("num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size"):
                if getattr(self, f) <= 0:
                    raise ValueError(f"model {self.name}: field {f} must be positive")
            if self.hidden_size % self.num_heads:
                raise ValueError(f"model {self.name}: hidden_size not divisible by num_heads")
        elif self.base_family == "wide_resnet":
            if self.depth not in _RESNET_BLOCKS:
                raise ValueError(f"model {self.name}: depth must be one of {sorted(_RESNET_BLOCKS)}")

    @property
    def name(self) -> str:
        """The catalog key ``family__size``, or the path of the file the model was read from:
        either way ``get_model(arch.name)`` gives the model back."""
        return self.source or f"{self.family}__{self.size}"

    @property
    def is_transformer(self) -> bool:
        return self.family in ("gpt", "moe", "llama", "tiny-gpt", "tiny-moe", "tiny-llama")

    @property
    def base_family(self) -> str:
        return self.family.removeprefix("tiny-")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @cached_property
    def _layers(self) -> tuple[LayerSpec, ...]:
        if self.is_transformer:
            return _transformer_layers(self)
        return _wide_resnet_layers(self)

    def layers(self) -> tuple[LayerSpec, ...]:
        return self._layers

    @property
    def num_blocks(self) -> int:
        """The repeated layers between the first and the last: decoder layers, or
        Wide-ResNet bottleneck blocks (what pipeline stages split)."""
        return len(self._layers) - 2

    @cached_property
    def param_count(self) -> int:
        return sum(l.params for l in self._layers)

    @cached_property
    def fwd_flops_per_sample(self) -> float:
        return sum(l.fwd_flops for l in self._layers)

    @property
    def train_flops_per_sample(self) -> float:
        """Forward + backward (backward = 2x forward), no recomputation."""
        return 3.0 * self.fwd_flops_per_sample

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len if self.is_transformer else 1

    @property
    def fwd_flops_per_token(self) -> float:
        return self.fwd_flops_per_sample / self.tokens_per_sample


def _transformer_layers(m: ModelArch) -> tuple[LayerSpec, ...]:
    h, s, a, V, b = m.hidden_size, m.seq_len, m.num_heads, m.vocab_size, m.dtype_bytes
    head_dim = h // a
    kv_dim = m.kv_heads * head_dim
    llama = m.base_family == "llama"
    out = s * h * b
    layers = []
    emb_params = V * h + (0 if llama else s * h)        # token (+ learned position) embedding
    layers.append(LayerSpec("embedding", emb_params, 0.0, 0.0, out, (V, h, s, m.dtype)))
    attn_proj = h * (h + 2 * kv_dim) + h * h            # qkv + output projection weights
    attn_flops = 2 * s * attn_proj + 4 * s * s * h      # projections + QK^T and AV
    # Activation memory per layer, no recomputation (Korthikanti et al. 2022): s*h*(34 + 5*a*s/h) bytes at fp16.
    act = s * h * (34 + 5 * a * s / h) * (b / 2)
    if m.base_family == "moe":
        E, k = m.num_experts, m.top_k
        mlp_params = E * 2 * h * m.ffn + E * (m.ffn + h) + h * E
        mlp_flops = k * 2 * s * 2 * h * m.ffn + 2 * s * h * E
        params = attn_proj + 4 * h + mlp_params + 4 * h
        kind = "moe_decoder"
        act += s * h * b * 2 * (k - 1) * 2              # extra dispatched expert activations
        sig = (h, a, s, m.ffn, E, k, m.dtype)
    elif llama:
        mlp_params = 3 * h * m.ffn
        mlp_flops = 2 * s * mlp_params
        params = attn_proj + mlp_params + 2 * h
        kind = "decoder"
        sig = (h, a, m.kv_heads, s, m.ffn, "swiglu", m.dtype)
    else:
        mlp_params = 2 * h * m.ffn + m.ffn + h
        mlp_flops = 2 * s * 2 * h * m.ffn
        params = attn_proj + 4 * h + mlp_params + 4 * h  # + qkv/out biases (3h + h) and two layer norms
        kind = "decoder"
        sig = (h, a, s, m.ffn, "gelu", m.dtype)
    for _ in range(m.num_layers):
        layers.append(LayerSpec(kind, params, float(attn_flops + mlp_flops), float(act), out, sig))
    final_norm = h if llama else 2 * h                  # RMSNorm weight, or LayerNorm weight + bias
    head_params = (0 if m.tied_embeddings and not llama else V * h) + final_norm
    head_act = s * V * 4 + s * h * b                    # fp32 logits for the loss + final norm input
    layers.append(LayerSpec("head", head_params, float(2 * s * h * V), float(head_act), 4.0,
                            (V, h, s, m.dtype)))
    return tuple(layers)


_RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _conv(cin: int, cout: int, k: int, hw: int) -> tuple[int, float]:
    params = cin * cout * k * k
    return params, 2.0 * params * hw * hw


def _wide_resnet_layers(m: ModelArch) -> tuple[LayerSpec, ...]:
    b = m.dtype_bytes
    c0 = m.num_channels
    hw = m.image_size // 2
    layers = []
    p, f = _conv(3, c0, 7, hw)
    layers.append(LayerSpec("conv_stem", p + 2 * c0, f, float(c0 * hw * hw * b * 3),
                            float(c0 * (hw // 2) ** 2 * b), (c0, m.image_size, m.dtype)))
    hw //= 2                                             # max-pool
    cin = c0
    for stage, nblocks in enumerate(_RESNET_BLOCKS[m.depth]):
        filters = c0 * 2 ** stage
        wide, cout = filters * m.width_factor, filters * 4
        for i in range(nblocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            hw_out = hw // stride
            p1, f1 = _conv(cin, filters, 1, hw)            # 1x1 reduce
            p2, f2 = _conv(filters, wide, 3, hw_out)       # 3x3, widened, strided
            p3, f3 = _conv(wide, cout, 1, hw_out)          # 1x1 expand
            params = p1 + p2 + p3 + 2 * (filters + wide + cout)
            flops = f1 + f2 + f3
            if i == 0:
                ps, fs = _conv(cin, cout, 1, hw_out)
                params += ps + 2 * cout
                flops += fs
            # conv inputs, BN and ReLU outputs kept for backward
            act = b * (cin * hw * hw + 3 * filters * hw * hw + 3 * wide * hw_out ** 2 + 2 * cout * hw_out ** 2)
            layers.append(LayerSpec("bottleneck", params, flops, float(act), float(cout * hw_out ** 2 * b),
                                    (cin, filters, wide, cout, hw, stride, m.dtype)))
            cin, hw = cout, hw_out
    p = cin * m.num_classes + m.num_classes
    layers.append(LayerSpec("classifier", p, 2.0 * cin * m.num_classes, float(cin * b), 4.0,
                            (cin, m.num_classes, m.dtype)))
    return tuple(layers)
