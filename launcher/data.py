"""Deterministic training data: the global batch of step ``k`` is a pure function of
(seed, k), whatever the plan, so losses are comparable across plans and a resumed run
reads exactly the batches an uninterrupted run would have read.

Every source's ``global_batch(step, batch)`` returns ``(inputs, targets)``:
- ``SyntheticTokens``: sequences from a seeded sparse Markov chain over the vocabulary
  (each token has ``branching`` likely successors), so there is structure to learn and
  the loss falls within a few steps;
- ``TextFileTokens``: a local file read as bytes (token = byte value modulo vocabulary);
  each sample is a window at a seeded random offset;
- ``SyntheticImages`` (Wide-ResNet): a seeded coarse template image per class (4x4
  cells, upsampled) plus Gaussian noise, labelled with its class.

A token sample is ``seq_len + 1`` tokens: inputs are the first ``seq_len``, targets the last.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from instances.errors import InputError

STEP_SEED_STRIDE = 1_000_003          # step k draws from seed * stride + k (distinct streams)
TEMPLATE_CELLS = 4                    # class templates are 4x4 patterns, upsampled: the class survives pooling


@dataclass(frozen=True)
class SyntheticTokens:
    vocab_size: int
    seq_len: int
    seed: int
    branching: int = 4                # likely successors per token
    noise: float = 0.1                # probability of a uniformly random next token

    def __post_init__(self):
        if self.vocab_size < 2 or self.seq_len < 1 or self.branching < 1 or not 0 <= self.noise <= 1:
            raise InputError("vocab_size >= 2, seq_len >= 1, branching >= 1, 0 <= noise <= 1",
                             field="data")

    def _table(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, self.vocab_size, (self.vocab_size, self.branching), generator=g)

    def global_batch(self, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of step ``step`` (0-based) from ``[batch, seq_len + 1]``
        int64 tokens."""
        table = self._table()
        g = torch.Generator().manual_seed(self.seed * STEP_SEED_STRIDE + step + 1)
        out = torch.empty(batch, self.seq_len + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, self.vocab_size, (batch,), generator=g)
        choice = torch.randint(0, self.branching, (batch, self.seq_len), generator=g)
        rand = torch.randint(0, self.vocab_size, (batch, self.seq_len), generator=g)
        flip = torch.rand(batch, self.seq_len, generator=g) < self.noise
        for t in range(self.seq_len):
            nxt = table[out[:, t], choice[:, t]]
            out[:, t + 1] = torch.where(flip[:, t], rand[:, t], nxt)
        return split(out)


@dataclass(frozen=True)
class TextFileTokens:
    path: str
    vocab_size: int
    seq_len: int
    seed: int

    def __post_init__(self):
        p = Path(self.path)
        if not p.is_file():
            raise InputError("data file not found", file=self.path, field="data_path")
        if p.stat().st_size < self.seq_len + 2:
            raise InputError(f"data file holds fewer than seq_len + 2 = {self.seq_len + 2} bytes",
                             file=self.path, field="data_path")

    def global_batch(self, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        raw = torch.frombuffer(bytearray(Path(self.path).read_bytes()), dtype=torch.uint8).long()
        tokens = raw % self.vocab_size
        g = torch.Generator().manual_seed(self.seed * STEP_SEED_STRIDE + step + 1)
        starts = torch.randint(0, tokens.numel() - self.seq_len - 1, (batch,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        return split(tokens[idx])


@dataclass(frozen=True)
class SyntheticImages:
    num_classes: int
    image_size: int
    seed: int
    noise: float = 1.0                # standard deviation of the noise around a class template

    def __post_init__(self):
        if self.num_classes < 2 or self.image_size < 1 or not self.noise >= 0:
            raise InputError("num_classes >= 2, image_size >= 1, noise >= 0", field="data")

    def global_batch(self, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``[batch, 3, size, size]`` float32 and their class labels ``[batch]``."""
        size = self.image_size
        coarse = torch.randn(self.num_classes, 3, TEMPLATE_CELLS, TEMPLATE_CELLS,
                             generator=torch.Generator().manual_seed(self.seed))
        templates = F.interpolate(coarse, size=(size, size), mode="nearest")
        g = torch.Generator().manual_seed(self.seed * STEP_SEED_STRIDE + step + 1)
        labels = torch.randint(0, self.num_classes, (batch,), generator=g)
        return templates[labels] + self.noise * torch.randn(batch, 3, size, size, generator=g), labels


def make_source(arch, seed: int, data_path: str | None):
    """The data source for catalog model ``arch``: tokens for transformers (synthetic, or
    ``data_path`` read as bytes), synthetic labelled images for Wide-ResNet."""
    if not arch.is_transformer:
        if data_path:
            raise InputError(f"model {arch.name} trains on synthetic images; a data file is for "
                             f"token models", file=data_path, field="data_path")
        return SyntheticImages(arch.num_classes, arch.image_size, seed)
    if data_path:
        return TextFileTokens(data_path, arch.vocab_size, arch.seq_len, seed)
    return SyntheticTokens(arch.vocab_size, arch.seq_len, seed)


def split(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of a ``[B, seq_len + 1]`` token batch."""
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def dp_shard(batch: tuple[torch.Tensor, ...], dp: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
    """The contiguous slice of the global batch's tensors (inputs, targets) that
    data-parallel rank ``dp_rank`` trains on."""
    per = batch[0].shape[0] // dp
    return tuple(t[dp_rank * per:(dp_rank + 1) * per] for t in batch)
