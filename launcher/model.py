"""Plain torch model definitions built from the model catalog (no parallelism here).

``GPT`` is a pre-LayerNorm GPT-style decoder (learned positions, GELU MLP, causal
attention). Parallelism is applied from outside: ``parallelize.py`` shards the
attention and MLP projections (tensor) and wraps the model (data); ``pipeline.py``
keeps one stage's layers. For that:

- decoder layers live in a ``ModuleDict`` keyed by their global index, so a pipeline
  stage that keeps layers 2..3 still names them ``layers.2`` / ``layers.3``: parameter
  names are identical across plans and ``torch.distributed.checkpoint`` reshards by name;
- the query/key/value projections are separate linears, so a column-wise split gives
  every tensor rank whole heads, and attention infers its local head count from shapes;
- ``tok_embeddings``, ``pos_embeddings``, ``norm`` and ``output`` may be ``None`` (a
  pipeline stage that does not hold them passes hidden states through).

Approximation: the output head is *not* tied to the token embedding (the catalog's GPT
counts tied embeddings). Tying would need a gradient all-reduce between the first and
last pipeline stage; untied weights add ``vocab_size * hidden_size`` parameters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from instances.errors import InputError
from instances.models import ModelArch, get_model

SUPPORTED_FAMILIES = ("gpt", "tiny-gpt")
INIT_STD = 0.02                       # normal init of linear and embedding weights
LAYER_NORM_EPS = 1e-5


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.head_dim = hidden // num_heads
        self.wq = nn.Linear(hidden, hidden)
        self.wk = nn.Linear(hidden, hidden)
        self.wv = nn.Linear(hidden, hidden)
        self.wo = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the local head count (num_heads / tensor degree when wq/wk/wv are column-sharded)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, num_heads: int, ffn: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.attn = Attention(hidden, num_heads)
        self.ln2 = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, arch: ModelArch):
        super().__init__()
        self.arch = arch
        h = arch.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(arch.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(arch.seq_len, h)
        self.layers = nn.ModuleDict({str(i): Block(h, arch.num_heads, arch.ffn)
                                     for i in range(arch.num_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(h, eps=LAYER_NORM_EPS)
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
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_embeddings(x) + self.pos_embeddings(pos)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def check_supported(arch: ModelArch) -> None:
    if arch.family not in SUPPORTED_FAMILIES:
        raise InputError(f"the launcher trains the GPT families {', '.join(SUPPORTED_FAMILIES)}; "
                         f"model {arch.name} is family {arch.family!r}", field="model")


def build_model(model: str, seed: int) -> GPT:
    """The full model, initialised deterministically from ``seed`` on the CPU in float32
    (every rank builds the same weights; parallelism then keeps each rank's part)."""
    arch = get_model(model)
    check_supported(arch)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return GPT(arch)
    finally:
        torch.random.set_rng_state(gen_state)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over a (micro-)batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
