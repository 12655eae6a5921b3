"""Plain torch model definitions built from the model catalog (no parallelism here).

``Transformer`` is a pre-norm decoder in three flavours: GPT (LayerNorm, learned positions,
GELU MLP, biases), Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
attention, no biases, untied head) and MoE (GPT with a top-k mixture of GELU experts in
every layer, ``MoE``). ``WideResNet`` is the catalog's convolutional family.
Parallelism is applied from outside: ``parallelize.py`` shards the attention and MLP
projections (tensor) and wraps the model (data); ``pipeline.py`` keeps one stage's
layers. For that:

- decoder layers (Wide-ResNet blocks) live in a ``ModuleDict`` keyed by their global
  index, so a pipeline stage that keeps layers 2..3 still names them ``layers.2`` /
  ``layers.3``: parameter names are identical across plans and
  ``torch.distributed.checkpoint`` reshards by name;
- the query/key/value projections are separate linears, so a column-wise split gives
  every tensor rank whole heads, and attention infers its local head count from shapes;
- the modules a model names in ``FIRST_STAGE`` / ``LAST_STAGE`` (embeddings / final norm
  and head; stem / classifier) may be ``None`` (a pipeline stage that does not hold them
  passes hidden states or feature maps through).

Approximation: the GPT output head is *not* tied to the token embedding (the catalog's
GPT counts tied embeddings). Tying would need a gradient all-reduce between the first and
last pipeline stage; untied weights add ``vocab_size * hidden_size`` parameters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from instances.arch import ModelArch
from instances.errors import InputError
from instances.models import get_model

from .validate import check_supported

INIT_STD = 0.02                       # normal init of linear and embedding weights
NORM_EPS = 1e-5
EXPERT_PAD_BUCKETS = 16               # MoE: an expert's token count is padded up to a multiple of
                                      # 1/16 of its balanced load (few shapes, little padding)
ROPE_THETA = 10000.0                  # rotary embedding base (Llama)
GROUP_NORM_GROUPS = 32                # Wide-ResNet: at most this many groups per GroupNorm,
GROUP_NORM_MIN_CHANNELS = 8           # with at least this many channels per group (one channel per
                                      # group is instance norm: it erases a 1x1 map and channel means)


def _rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)       # [seq, head_dim/2]
    return ang.cos(), ang.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of ``x`` ``[b, s, heads, head_dim]``."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s_ = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    return torch.stack((x1 * c - x2 * s_, x1 * s_ + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Causal multi-head attention; grouped-query (fewer key/value heads) and rotary
    positions for Llama, biases and no rotation for GPT."""

    def __init__(self, arch: ModelArch):
        super().__init__()
        h, llama = arch.hidden_size, arch.base_family == "llama"
        self.head_dim = h // arch.num_heads
        kv = arch.kv_heads * self.head_dim
        self.wq = nn.Linear(h, h, bias=not llama)
        self.wk = nn.Linear(h, kv, bias=not llama)
        self.wv = nn.Linear(h, kv, bias=not llama)
        self.wo = nn.Linear(h, h, bias=not llama)
        self.rope = llama
        if llama:
            cos, sin = _rope_tables(arch.seq_len, self.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the local head count (divided by the tensor degree when column-sharded)
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        if self.rope:
            q, k = (_apply_rope(t, self.rope_cos, self.rope_sin) for t in (q, k))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if k.shape[1] != q.shape[1]:                       # grouped-query: share kv heads
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """GELU MLP (GPT)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    """Gated SiLU MLP without biases (Llama)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def expert_rows(routed: int, tokens: int, top_k: int, experts: int) -> int:
    """Rows an MoE expert computes for ``routed`` of a step's ``tokens`` tokens: ``routed``
    rounded up to a multiple of the granule ``ceil(top_k * tokens / (experts *
    EXPERT_PAD_BUCKETS))`` — a 1/16 of an expert's load under balanced routing — at least
    one granule and at most ``tokens``."""
    granule = max(1, -(-top_k * tokens // (experts * EXPERT_PAD_BUCKETS)))
    return min(tokens, max(1, -(-routed // granule)) * granule)


class MoE(nn.Module):
    """GShard-style mixture of GELU experts (the catalog's ``moe`` family): a linear router
    without bias, softmax over the experts, each token sent to its ``top_k`` experts with
    the top-k probabilities renormalised to sum to one as weights.

    Approximations, stated: *dropless* routing (no expert capacity, no dropped tokens —
    GShard caps each expert at a capacity factor) and no auxiliary load-balancing loss.
    Every expert runs on every step, on the (possibly empty) set of tokens routed to it, so
    that every parameter takes part in every backward pass: data-parallel wrappers see no
    unused parameters and tensor-parallel ranks, which route identically, call the same
    collectives. An expert's token count is padded up to a multiple of a granule, 1/16
    (``EXPERT_PAD_BUCKETS``) of its load under balanced routing (``expert_rows``), with zero
    tokens of weight zero — the result is unchanged, and the shapes come from a small set,
    so that DTensor's sharding cache hits under tensor parallelism (with a new shape every
    step, tiny-moe on tp=2 ran 0.233 s a step; padded, 0.079 s). The padding adds less
    than a granule per expert. Padding to the next power of two, as before, computed up to
    twice an expert's tokens, and at balanced routing (a power of two for the tiny models)
    whether it did flipped with a token or two: the experts' work per routed token ranged
    from 1.25x to 1.75x between steps, and between the profiler's timing and the run.
    Experts are replicated over data-parallel ranks (no expert parallelism)."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise InputError(f"top_k={top_k} must be in [1, num_experts={num_experts}]", field="top_k")
        self.top_k = top_k
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, ffn) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = (weight / weight.sum(dim=-1, keepdim=True)).to(x.dtype)
        n = tokens.shape[0]
        padded = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])     # row n: a zero token
        out = torch.zeros_like(padded)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            size = expert_rows(len(rows), n, self.top_k, len(self.experts))
            idx = torch.full((size,), n, dtype=rows.dtype, device=rows.device)
            idx[:len(rows)] = rows
            w = weight.new_zeros(size, 1)
            w[:len(rows), 0] = weight[rows, slot]
            out = out.index_add(0, idx, expert(padded[idx]) * w)
        return out[:n].view_as(x)


def _norm(arch: ModelArch) -> nn.Module:
    if arch.base_family == "llama":
        return nn.RMSNorm(arch.hidden_size, eps=NORM_EPS)
    return nn.LayerNorm(arch.hidden_size, eps=NORM_EPS)


class Block(nn.Module):
    def __init__(self, arch: ModelArch):
        super().__init__()
        self.ln1 = _norm(arch)
        self.attn = Attention(arch)
        self.ln2 = _norm(arch)
        if arch.base_family == "moe":
            self.mlp = MoE(arch.hidden_size, arch.ffn, arch.num_experts, arch.top_k)
        else:
            self.mlp = (SwiGLU if arch.base_family == "llama" else MLP)(arch.hidden_size, arch.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Pre-norm decoder: GPT (LayerNorm, learned positions, GELU) or Llama (RMSNorm,
    rotary positions, SwiGLU, grouped-query attention, untied head)."""
    FIRST_STAGE = ("tok_embeddings", "pos_embeddings")     # held by the first pipeline stage only
    LAST_STAGE = ("norm", "output")                        # held by the last pipeline stage only

    def __init__(self, arch: ModelArch):
        super().__init__()
        self.arch = arch
        h = arch.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(arch.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = (
            None if arch.base_family == "llama" else nn.Embedding(arch.seq_len, h))
        self.layers = nn.ModuleDict({str(i): Block(arch) for i in range(arch.num_layers)})
        self.norm: nn.Module | None = _norm(arch)
        self.output: nn.Linear | None = nn.Linear(h, arch.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=INIT_STD)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[batch, seq]`` (first stage) or hidden states ``[batch, seq, hidden]``;
        returns logits ``[batch, seq, vocab]`` (last stage) or hidden states."""
        if self.tok_embeddings is not None:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                x = x + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with the largest group count <= ``GROUP_NORM_GROUPS`` that divides ``channels``
    and leaves at least ``GROUP_NORM_MIN_CHANNELS`` channels per group (else one group)."""
    groups = max(g for g in range(1, GROUP_NORM_GROUPS + 1)
                 if channels % g == 0 and (g == 1 or channels // g >= GROUP_NORM_MIN_CHANNELS))
    return nn.GroupNorm(groups, channels, eps=NORM_EPS)


class Bottleneck(nn.Module):
    """The catalog's Wide-ResNet block (``instances.models._wide_resnet_layers``): 1x1
    ``cin -> filters``, 3x3 ``filters -> wide`` (strided), 1x1 ``wide -> cout``, each
    followed by ``group_norm``; a 1x1 projection shortcut when ``shortcut``, else the
    identity where the shapes agree (a tensor shard timed by the profiler may not)."""

    def __init__(self, cin: int, filters: int, wide: int, cout: int, stride: int, *, shortcut: bool):
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(cin, filters, 1, bias=False), group_norm(filters)
        self.c2, self.n2 = nn.Conv2d(filters, wide, 3, stride, 1, bias=False), group_norm(wide)
        self.c3, self.n3 = nn.Conv2d(wide, cout, 1, bias=False), group_norm(cout)
        self.proj = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), group_norm(cout))
                     if shortcut else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.n1(self.c1(x)))
        y = F.relu(self.n2(self.c2(y)))
        y = self.n3(self.c3(y))
        if self.proj is not None:
            y = y + self.proj(x)
        elif y.shape == x.shape:
            y = y + x
        return F.relu(y)


def conv_stem(channels: int) -> nn.Sequential:
    """The catalog's Wide-ResNet stem: 7x7 stride-2 convolution of the RGB image,
    ``group_norm``, ReLU, 3x3 stride-2 max-pool."""
    return nn.Sequential(nn.Conv2d(3, channels, 7, 2, 3, bias=False), group_norm(channels), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1))


def has_shortcut(cin: int, cout: int, stride: int) -> bool:
    """Whether a catalog bottleneck changes shape and so needs a projection shortcut."""
    return cin != cout or stride != 1


class WideResNet(nn.Module):
    """Wide-ResNet as the catalog describes it: a 7x7 stride-2 convolution + norm + ReLU +
    3x3 max-pool stem, the bottleneck blocks of ``_wide_resnet_layers`` (ResNet-50/101
    layout, widened 3x3 convolutions), global average pooling and a linear classifier.

    Approximation, stated: GroupNorm replaces BatchNorm. Batch statistics would make the
    loss depend on how a step's batch is split (data-parallel shards, micro-batches), so
    every plan would train a different model; with GroupNorm every plan trains the same
    one (the parameter count is the catalog's: 2 per channel either way)."""
    FIRST_STAGE = ("stem",)
    LAST_STAGE = ("classifier",)

    def __init__(self, arch: ModelArch):
        super().__init__()
        self.arch = arch
        c0 = arch.num_channels
        self.stem: nn.Sequential | None = conv_stem(c0)
        blocks = {}
        for i, spec in enumerate(arch.layers()[1:-1]):
            cin, filters, wide, cout, _, stride, _ = spec.signature
            blocks[str(i)] = Bottleneck(cin, filters, wide, cout, stride, shortcut=has_shortcut(cin, cout, stride))
        self.layers = nn.ModuleDict(blocks)
        cin, classes, _ = arch.layers()[-1].signature
        self.classifier: nn.Linear | None = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[batch, 3, size, size]`` (first stage) or feature maps; returns logits
        ``[batch, classes]`` (last stage) or feature maps."""
        if self.stem is not None:
            x = self.stem(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.classifier is not None:
            x = self.classifier(x.mean(dim=(2, 3)))
        return x


def build_model(model: str, seed: int) -> Transformer | WideResNet:
    """The full model, initialised deterministically from ``seed`` on the CPU in float32
    (every rank builds the same weights; parallelism then keeps each rank's part)."""
    arch = get_model(model)
    check_supported(arch)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return Transformer(arch) if arch.is_transformer else WideResNet(arch)
    finally:
        torch.random.set_rng_state(gen_state)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over a (micro-)batch: next-token logits ``[batch, seq, vocab]``
    or class logits ``[batch, classes]``."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
