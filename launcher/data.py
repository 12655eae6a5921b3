"""Deterministic training data: the global batch of step ``k`` is a pure function of
(seed, k), whatever the plan, so losses are comparable across plans and a resumed run
reads exactly the batches an uninterrupted run would have read.

Every source's ``global_batch(step, batch)`` returns ``(inputs, targets)``:
- ``SyntheticTokens``: sequences from a seeded sparse Markov chain over the vocabulary
  (each token has ``branching`` likely successors), so there is structure to learn and
  the loss falls within a few steps;
- ``TextFileTokens``: a local file read as bytes (token = byte value modulo vocabulary);
  each sample is a window at a seeded random offset, read from the file opened once
  (launcher/datafile.py: what the file may hold, its checks);
- ``SyntheticImages`` (Wide-ResNet): a seeded coarse template image per class (4x4
  cells, upsampled) plus Gaussian noise, labelled with its class.

A token sample is ``seq_len + 1`` tokens: inputs are the first ``seq_len``, targets the last.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from instances.errors import InputError

from .datafile import min_data_bytes, open_data_file

STEP_SEED_STRIDE = 1_000_003          # step k draws from seed * stride + k (distinct streams)
SEED_SPACE = 2**64                    # torch's generator seeds: the stream's seed is taken modulo it


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step ``step``'s draws: seeded ``seed * STEP_SEED_STRIDE + step + 1``,
    modulo ``SEED_SPACE`` (the same streams as before for every seed below 2^64 / stride;
    a larger seed, up to ``instances.limits.MAX_SEED``, no longer overflows torch's seed
    in the rank)."""
    return torch.Generator().manual_seed((seed * STEP_SEED_STRIDE + step + 1) % SEED_SPACE)
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
        g = step_generator(self.seed, step)
        out = torch.empty(batch, self.seq_len + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, self.vocab_size, (batch,), generator=g)
        choice = torch.randint(0, self.branching, (batch, self.seq_len), generator=g)
        rand = torch.randint(0, self.vocab_size, (batch, self.seq_len), generator=g)
        flip = torch.rand(batch, self.seq_len, generator=g) < self.noise
        for t in range(self.seq_len):
            nxt = table[out[:, t], choice[:, t]]
            out[:, t + 1] = torch.where(flip[:, t], rand[:, t], nxt)
        return split(out)


class TextFileTokens:
    """Windows of a local file read as bytes (launcher/datafile.py: what it may hold and
    the checks made when it is opened). The file is opened once and each step reads only
    the windows it needs (``os.pread``: ``rows`` reads one data rank's part of the global
    batch), never the whole file; the batch of a step is the one the whole file read at
    every step gave (tests/test_launcher_unit.py checks them equal). Not a memory map: a
    file cut short under a running job then reads short, which is reported, where a map
    would kill the rank with SIGBUS."""

    def __init__(self, path: str, vocab_size: int, seq_len: int, seed: int, roots: tuple[str, ...] | None = None):
        self.path, self.vocab_size, self.seq_len, self.seed = path, vocab_size, seq_len, seed
        self._fd: int | None = None
        self._fd, self.size = open_data_file(path, min_bytes=min_data_bytes(seq_len), roots=roots,
                                             field="data_path")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()

    def starts(self, step: int, batch: int) -> torch.Tensor:
        """The ``batch`` window offsets of step ``step`` (the whole global batch's: data ranks
        draw the same and read their own)."""
        g = step_generator(self.seed, step)
        return torch.randint(0, self.size - self.seq_len - 1, (batch,), generator=g)

    def rows(self, step: int, batch: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of samples ``lo .. hi - 1`` of step ``step``'s global batch."""
        if self._fd is None:
            raise RuntimeError("data file closed")
        now = os.fstat(self._fd).st_size
        if now != self.size:
            raise InputError(f"the data file changed size during the run ({self.size} -> {now} bytes): the "
                             f"batches would no longer be this seed's; restore it", file=self.path, field="data_path")
        n = self.seq_len + 1
        parts = []
        for s in self.starts(step, batch)[lo:hi].tolist():
            part = os.pread(self._fd, n, s)
            if len(part) != n:
                raise InputError(f"read {len(part)} of {n} bytes at offset {s}: the data file changed during the "
                                 f"run", file=self.path, field="data_path")
            parts.append(part)
        raw = torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8) if parts else \
            torch.empty(0, dtype=torch.uint8)
        return split(raw.view(hi - lo, n).long() % self.vocab_size)

    def global_batch(self, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows(step, batch, 0, batch)


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
        g = step_generator(self.seed, step)
        labels = torch.randint(0, self.num_classes, (batch,), generator=g)
        return templates[labels] + self.noise * torch.randn(batch, 3, size, size, generator=g), labels


def make_source(arch, seed: int, data_path: str | None, roots: tuple[str, ...] | None = None):
    """The data source for catalog model ``arch``: tokens for transformers (synthetic, or
    ``data_path`` read as bytes, refused outside ``roots`` when given), synthetic labelled
    images for Wide-ResNet."""
    if not arch.is_transformer:
        if data_path:
            raise InputError(f"model {arch.name} trains on synthetic images; a data file is for "
                             f"token models", file=data_path, field="data_path")
        return SyntheticImages(arch.num_classes, arch.image_size, seed)
    if data_path:
        return TextFileTokens(data_path, arch.vocab_size, arch.seq_len, seed, roots)
    return SyntheticTokens(arch.vocab_size, arch.seq_len, seed)


def split(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of a ``[B, seq_len + 1]`` token batch."""
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def shard_batch(source, step: int, batch: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
    """Data-parallel rank ``dp_rank``'s part of step ``step``'s global batch (``dp_shard``
    of it); a data file's rank reads only its own windows."""
    if isinstance(source, TextFileTokens):
        per = batch // dp
        return source.rows(step, batch, dp_rank * per, (dp_rank + 1) * per)
    return dp_shard(source.global_batch(step, batch), dp, dp_rank)


def dp_shard(batch: tuple[torch.Tensor, ...], dp: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
    """The contiguous slice of the global batch's tensors (inputs, targets) that
    data-parallel rank ``dp_rank`` trains on."""
    per = batch[0].shape[0] // dp
    return tuple(t[dp_rank * per:(dp_rank + 1) * per] for t in batch)
