"""Which slices of a job's training state change owner when it moves between two
(dp, tp, pp) layouts: the exact per-tensor plan the launcher's device-to-device move
carries out, and a closed-form approximation the engine prices moves with.

Rank positions are the launcher's: rank = (d * pp + p) * tp + t (``launcher.dist``). A
move keeps the first ``kept`` positions on the same processes (devices): a rank that holds
a slice in both layouts keeps it; every other slice the new layout needs is sent from a
rank of the old layout that holds it. This module is pure (no torch): tensors are given
by name and shape.

**Exact plan** (``layout`` + ``transfer_plan``). Where a tensor lives under a plan, as
the launcher builds it:

- pipeline: ``layers.<i>.*`` on the stage whose layer range holds ``i``
  (``pipeline.stage_ranges``), the model's first-stage modules (embeddings / stem) on
  stage 0, its last-stage modules (final norm, head / classifier) on stage ``pp - 1``;
- tensor: a column-wise projection's weight and bias split on dim 0, a row-wise one's
  weight on dim 1 (bias replicated), over the ``tp`` ranks; everything else replicated;
- data: replicated over the ``dp`` ranks under DDP (``tp == pp == 1``); under FSDP2
  (``dp > 1`` with ``tp > 1`` or ``pp > 1``) the rank's (tensor-local) slice split again on
  dim 0 in ``torch.chunk`` pieces (the last may be short or empty).

Each moved piece carries the parameter slice and Adam's two moments for it (three
float32 values per element) plus Adam's step count (one float32): ``STATE_COPIES`` and
``STEP_BYTES``.

**Approximation** (``changed_owner_bytes``, for pricing): *uniform layers, every tensor
fully split*. The state is a cube of ``state_bytes``: pipeline stage ``p`` holds the
slab ``[p/pp, (p+1)/pp)`` of the layers axis, tensor rank ``t`` the slab ``[t/tp,
(t+1)/tp)`` of a second axis, and under FSDP2 data rank ``d`` the slab ``[d/dp,
(d+1)/dp)`` of a third (DDP: all of it). It ignores that embeddings, norms and biases are
replicated over tensor ranks, that stages hold whole layers and that the embedding and
head sit on the end stages. ``tests/test_reshard_plan.py`` bounds its error against the
exact plan on the tiny catalog models.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Mapping, Sequence

from .pipeline import stage_ranges

STATE_COPIES = 3          # parameter + Adam exp_avg + exp_avg_sq per element
ELEMENT_BYTES = 4         # float32 (the launcher trains in float32)
STEP_BYTES = 4            # Adam's per-parameter step count (a float32 scalar)

Region = tuple[tuple[int, int], ...]       # (start, length) per dimension; () for a scalar


def _chunk(n: int, k: int, i: int) -> tuple[int, int]:
    """``torch.chunk(n, k)[i]`` as (start, length); empty past the last real chunk."""
    c = -(-n // k) if n else 0
    lo = min(n, i * c)
    return lo, max(0, min(n, lo + c) - lo)


def coords(rank: int, plan: tuple[int, int, int]) -> tuple[int, int, int]:
    """(d, p, t) of a rank position under plan (dp, tp, pp)."""
    dp, tp, pp = plan
    return rank // (tp * pp), (rank // tp) % pp, rank % tp


def uses_fsdp(plan: tuple[int, int, int]) -> bool:
    dp, tp, pp = plan
    return dp > 1 and (tp > 1 or pp > 1)


@dataclass(frozen=True)
class ModelLayout:
    """What the layout needs to know of a model: tensor shapes by name, decoder-layer
    count, the first/last-stage module names, the tensor-parallel styles
    (``parallelize.tp_plan``: submodule name inside a layer -> "colwise"/"rowwise")."""
    shapes: Mapping[str, tuple[int, ...]]
    num_layers: int
    first_stage: tuple[str, ...]
    last_stage: tuple[str, ...]
    tp_styles: Mapping[str, str]

    def stage(self, name: str, pp: int, stage_layers: Sequence[int] = ()) -> int:
        head = name.split(".", 1)[0]
        if head == "layers":
            i = int(name.split(".")[1])
            return next(s for s, (lo, hi) in enumerate(stage_ranges(self.num_layers, pp, tuple(stage_layers)))
                        if lo <= i < hi)
        if head in self.first_stage:
            return 0
        if head in self.last_stage:
            return pp - 1
        raise ValueError(f"tensor {name!r} is in no pipeline stage")

    def tp_dim(self, name: str) -> int | None:
        """The dimension tensor parallelism splits ``name`` on, or None (replicated)."""
        parts = name.split(".")
        if parts[0] != "layers" or len(parts) < 4:
            return None
        module, leaf = ".".join(parts[2:-1]), parts[-1]
        style = self.tp_styles.get(module)
        if style == "colwise":
            return 0
        if style == "rowwise" and leaf == "weight":
            return 1
        return None


def layout(model: ModelLayout, plan: tuple[int, int, int], stage_layers: Sequence[int] = ()
           ) -> list[dict[str, Region]]:
    """Per rank position of ``plan`` (dp, tp, pp): tensor name -> the region it holds
    (non-empty regions only)."""
    dp, tp, pp = plan
    fsdp = uses_fsdp(plan)
    out: list[dict[str, Region]] = []
    for r in range(dp * tp * pp):
        d, p, t = coords(r, plan)
        held: dict[str, Region] = {}
        for name, shape in model.shapes.items():
            if model.stage(name, pp, stage_layers) != p:
                continue
            reg = [(0, n) for n in shape]
            k = model.tp_dim(name)
            if k is not None and tp > 1:
                lo, n = _chunk(shape[k], tp, t)
                reg[k] = (lo, n)
            if fsdp and reg:
                lo0, n0 = reg[0]
                lo, n = _chunk(n0, dp, d)
                reg[0] = (lo0 + lo, n)
            if all(n > 0 for _, n in reg):
                held[name] = tuple(reg)
        out.append(held)
    return out


@dataclass(frozen=True)
class Piece:
    """One slice of one tensor sent from old rank position ``src`` to new rank position
    ``dst`` (``src == dst``: kept in place, nothing sent)."""
    name: str
    src: int
    dst: int
    region: Region

    @property
    def numel(self) -> int:
        out = 1
        for _, n in self.region:
            out *= n
        return out

    @property
    def nbytes(self) -> int:
        return self.numel * STATE_COPIES * ELEMENT_BYTES + STEP_BYTES


def _intersect(a: Region, b: Region) -> Region | None:
    out = []
    for (a0, an), (b0, bn) in zip(a, b):
        lo, hi = max(a0, b0), min(a0 + an, b0 + bn)
        if hi <= lo:
            return None
        out.append((lo, hi - lo))
    return tuple(out)


def contains(outer: Region, inner: Region) -> bool:
    """Whether region ``inner`` lies within ``outer`` (per dimension: offset, length)."""
    return all(o0 <= i0 and i0 + i_n <= o0 + on for (o0, on), (i0, i_n) in zip(outer, inner))


def transfer_plan(old: Sequence[Mapping[str, Region]], new: Sequence[Mapping[str, Region]],
                  kept: int | None = None) -> list[Piece]:
    """The pieces that give every new rank position its regions, from the old ranks'
    holdings. Positions below ``kept`` (default: every position both layouts have) are
    the same process in both. A region is cut on every boundary of the old regions that
    overlap it; each cell comes from the destination itself when it held it, otherwise
    from the holder nearest after it in rank order (spreading replicated sources), and
    cells from one source adjacent along the last axis are merged into one box."""
    if kept is None:
        kept = min(len(old), len(new))
    pieces: list[Piece] = []
    for dst, needs in enumerate(new):
        for name, want in needs.items():
            holders = [(src, _intersect(h[name], want)) for src, h in enumerate(old) if name in h]
            holders = [(s, reg) for s, reg in holders if reg is not None]
            cuts = [sorted({want[k][0], want[k][0] + want[k][1]}
                           | {x for _, reg in holders for x in (reg[k][0], reg[k][0] + reg[k][1])})
                    for k in range(len(want))]
            cells = [tuple((lo, hi - lo) for lo, hi in cell)
                     for cell in product(*[list(zip(c[:-1], c[1:])) for c in cuts])]
            by_src: dict[int, list[Region]] = {}
            for cell in cells:
                srcs = [s for s, reg in holders if contains(reg, cell)]
                if not srcs:
                    raise ValueError(f"no old rank holds {name} {cell}")
                if dst < kept and dst in srcs:
                    src = dst
                else:
                    src = min(srcs, key=lambda s: (s - dst) % max(len(old), len(new), 1))
                by_src.setdefault(src, []).append(cell)
            for src, regs in by_src.items():
                pieces.extend(Piece(name, src, dst, reg) for reg in _merge(regs))
    return pieces


def _merge(regs: list[Region]) -> list[Region]:
    """Merge boxes that are adjacent along their last dimension and equal elsewhere."""
    out: list[Region] = []
    for reg in sorted(regs):
        if out and reg and out[-1][:-1] == reg[:-1] and out[-1][-1][0] + out[-1][-1][1] == reg[-1][0]:
            lo, n = out[-1][-1]
            out[-1] = out[-1][:-1] + ((lo, n + reg[-1][1]),)
        else:
            out.append(reg)
    return out


def moved_bytes(pieces: Sequence[Piece]) -> int:
    """Bytes that change owner (pieces whose source is not their destination)."""
    return sum(p.nbytes for p in pieces if p.src != p.dst)


def state_bytes(model: ModelLayout) -> int:
    """Bytes of one copy of the training state (parameters + two Adam moments + steps)."""
    total = 0
    for shape in model.shapes.values():
        n = 1
        for s in shape:
            n *= s
        total += n * STATE_COPIES * ELEMENT_BYTES + STEP_BYTES
    return total


def _box(rank: int, plan: tuple[int, int, int]) -> tuple[tuple[float, float], ...]:
    dp, tp, pp = plan
    d, p, t = coords(rank, plan)
    fsdp = (d / dp, (d + 1) / dp) if uses_fsdp(plan) else (0.0, 1.0)
    return (p / pp, (p + 1) / pp), (t / tp, (t + 1) / tp), fsdp


def _vol(box) -> float:
    out = 1.0
    for lo, hi in box:
        out *= max(0.0, hi - lo)
    return out


def changed_owner_bytes(state_bytes: float, old: tuple[int, int, int], new: tuple[int, int, int],
                        kept_ranks: int) -> float:
    """Bytes that change owner when a job with ``state_bytes`` of training state (one
    copy: parameters + optimizer state) moves from layout ``old`` = (dp, tp, pp) to
    ``new``, the first ``kept_ranks`` rank positions staying on the same devices.
    Approximation: uniform layers, every tensor fully split (see the module doc)."""
    for name, lay in (("old", old), ("new", new)):
        if len(lay) != 3 or any(not isinstance(x, int) or x < 1 for x in lay):
            raise ValueError(f"{name} must be (dp, tp, pp) positive integers, got {lay!r}")
    if state_bytes < 0 or kept_ranks < 0:
        raise ValueError("state_bytes and kept_ranks must be >= 0")
    n_old, n_new = old[0] * old[1] * old[2], new[0] * new[1] * new[2]
    kept = min(kept_ranks, n_old, n_new)
    total = 0.0
    for r in range(n_new):
        need = _box(r, new)
        have = 0.0
        if r < kept:
            o = _box(r, old)
            have = _vol(tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(need, o)))
        total += _vol(need) - have
    return total * state_bytes
