"""How well estimates choose a grid: the decision quality the scheduler gets from them.

An estimate is judged by the shape it would pick, not by its error alone. For each group
of measured rows that the scheduler chooses among (``GROUPINGS``: the shapes of one GPU
type for a (model, global batch); the GPU types and shapes of the same GPU count; every
type and shape), the estimate's top-ranked row's *true* throughput over the group's true
best (``choice_quality``): 1.0 when it picks the best, 0.5 when its pick runs at half the
best. Throughput is total (samples/s) or per GPU (samples/s/GPU, what a shared cluster
trades). Also the Spearman rank correlation of estimated and true throughput inside
each group of at least three rows.

``suspect_pair`` and ``batch_suspects`` name table facts that no smooth model of the
runtime reproduces (superlinear speed-up from more GPUs of a type, more nodes faster than
one node at the same GPU count, more than twice the time at twice the batch), so that a
miss can be traced to the table rather than to the estimate.
Used by the accuracy report and by the learned model's choice-based selection.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

THROUGHPUTS = ("total", "per_gpu")
SUPERLINEAR_TOLERANCE = 0.10        # per-GPU throughput this much above the smaller shape's


@dataclass(frozen=True)
class ChoicePoint:
    model: str
    global_batch: int
    gpu_type: str
    num_nodes: int
    gpus_per_node: int
    measured_s: float
    estimated_s: float

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def shape(self) -> str:
        return f"{self.gpu_type} {self.num_nodes}x{self.gpus_per_node}"

    def throughput(self, seconds: float, kind: str) -> float:
        return self.global_batch / seconds / (self.num_gpus if kind == "per_gpu" else 1)


GROUPINGS = {
    "same GPU type": lambda p: (p.model, p.global_batch, p.gpu_type),
    "same GPU count": lambda p: (p.model, p.global_batch, p.num_gpus),
    "any GPU type": lambda p: (p.model, p.global_batch),
}


def point_from_row_id(row_id: str, measured_s: float, estimated_s: float) -> ChoicePoint | None:
    """A ``ChoicePoint`` from an Arena-table record id (``learned.table_row_id``:
    ``arena:<model>:<batch>:<type>:<nodes>x<gpus>``); None for other records."""
    parts = row_id.split(":")
    if len(parts) != 5 or parts[0] != "arena":
        return None
    nodes, gpn = parts[4].split("x")
    return ChoicePoint(parts[1], int(parts[2]), parts[3], int(nodes), int(gpn), measured_s, estimated_s)


def _spearman(a, b) -> float | None:
    from scipy.stats import spearmanr
    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


def batch_suspects(points) -> dict[ChoicePoint, str]:
    """Rows on which the table contradicts itself across batches, with why: the same model
    on the same shape takes more than 2 x (1 + ``SUPERLINEAR_TOLERANCE``) times as long at
    twice the batch (twice the samples at most doubles the work); both rows are named."""
    by_shape: dict[tuple, dict[int, ChoicePoint]] = defaultdict(dict)
    for p in points:
        by_shape[(p.model, p.gpu_type, p.num_nodes, p.gpus_per_node)][p.global_batch] = p
    out = {}
    for rows in by_shape.values():
        for b, lo in rows.items():
            hi = rows.get(2 * b)
            if hi is not None and hi.measured_s > 2 * (1 + SUPERLINEAR_TOLERANCE) * lo.measured_s:
                why = (f"batch superlinear: {lo.model} on {lo.shape} measured {hi.measured_s / lo.measured_s:.2f}x "
                       f"the time at batch {hi.global_batch} as at {b}")
                out[lo] = out[hi] = why
    return out


def suspect_pair(chosen: ChoicePoint, best: ChoicePoint) -> str | None:
    """Why the table itself contradicts a smooth runtime model on this pair, or None:
    ``superlinear`` when, on one GPU type, the shape with k times more GPUs is more than
    k x (1 + ``SUPERLINEAR_TOLERANCE``) times faster (with rematerialisation and a sharded
    optimizer nothing per GPU grows as GPUs are taken away, apart from memory pressure the
    table does not record); ``more nodes faster`` when, at the same type and GPU count,
    the shape over more nodes is faster by more than the tolerance (inter-node links are
    slower than intra-node ones on every catalog type)."""
    if chosen.gpu_type != best.gpu_type:
        return None
    small, large = sorted((chosen, best), key=lambda p: p.num_gpus)
    if large.num_gpus > small.num_gpus:
        k = large.num_gpus / small.num_gpus
        speedup = small.measured_s / large.measured_s
        if speedup > k * (1 + SUPERLINEAR_TOLERANCE):
            return (f"superlinear: {large.num_gpus / small.num_gpus:g}x the GPUs ({small.shape} -> {large.shape}) "
                    f"measured {speedup:.2f}x faster")
        return None
    few, many = sorted((chosen, best), key=lambda p: p.num_nodes)
    if many.num_nodes > few.num_nodes and few.measured_s > many.measured_s * (1 + SUPERLINEAR_TOLERANCE):
        return (f"more nodes faster: {many.shape} measured {few.measured_s / many.measured_s:.2f}x faster than "
                f"{few.shape} at the same GPU count")
    return None


def choice_quality(points, grouping: str = "same GPU type", throughput: str = "per_gpu", *,
                   miss_below: float = 0.9) -> dict:
    """Grid-choice quality of ``points`` (``ChoicePoint``) grouped by ``GROUPINGS[grouping]``
    (groups of at least two rows). Per group: the true ``throughput`` of the row the
    estimate ranks best over the true best (ties in the estimate: the first). Returns the
    mean, the worst (with its group), the fractions of groups at >= 90% and >= 95%, the
    mean Spearman correlation over groups of >= 3 rows, and every group under
    ``miss_below`` with the chosen and the best shape and the table's own contradiction
    on them (``suspect_pair``, then ``batch_suspects`` of either row), if any; ``clean``:
    the same over the groups with no ``suspect_pair`` and no ``batch_suspects`` row."""
    if throughput not in THROUGHPUTS:
        raise ValueError(f"throughput must be one of {THROUGHPUTS}, got {throughput!r}")
    key = GROUPINGS[grouping]
    points = list(points)
    groups = defaultdict(list)
    for p in points:
        groups[key(p)].append(p)
    batch_bad = batch_suspects(points)
    fractions, clean, rhos, misses = [], [], [], []
    worst = clean_worst = None
    for k in sorted(groups, key=str):
        ps = groups[k]
        if len(ps) < 2:
            continue
        true = [p.throughput(p.measured_s, throughput) for p in ps]
        est = [p.throughput(p.estimated_s, throughput) for p in ps]
        chosen, best = ps[int(np.argmax(est))], ps[int(np.argmax(true))]
        f = chosen.throughput(chosen.measured_s, throughput) / max(true)
        fractions.append(f)
        name = " ".join(str(x) for x in k)
        if worst is None or f < worst[0]:
            worst = (f, name)
        if not any(p in batch_bad for p in ps) and not any(suspect_pair(a, b) for i, a in enumerate(ps)
                                                           for b in ps[i + 1:]):
            clean.append(f)
            if clean_worst is None or f < clean_worst[0]:
                clean_worst = (f, name)
        if len(ps) >= 3:
            r = _spearman(true, est)
            if r is not None:
                rhos.append(r)
        if f < miss_below:
            misses.append({"group": name, "fraction": f, "chosen": chosen.shape, "best": best.shape,
                           "chosen_error": chosen.estimated_s / chosen.measured_s - 1,
                           "best_error": best.estimated_s / best.measured_s - 1,
                           "table_suspect": (suspect_pair(chosen, best) or batch_bad.get(chosen)
                                             or batch_bad.get(best))})
    fr, cl = np.array(fractions), np.array(clean)
    return {"groups": len(fractions), "mean": float(fr.mean()) if len(fr) else None,
            "worst": None if worst is None else {"fraction": worst[0], "group": worst[1]},
            "fraction_ge_90": float(np.mean(fr >= 0.9)) if len(fr) else None,
            "fraction_ge_95": float(np.mean(fr >= 0.95)) if len(fr) else None,
            "spearman_mean": float(np.mean(rhos)) if rhos else None, "spearman_groups": len(rhos),
            "clean": {"groups": len(cl), "mean": float(cl.mean()) if len(cl) else None,
                      "worst": None if clean_worst is None else {"fraction": clean_worst[0], "group": clean_worst[1]},
                      "fraction_ge_90": float(np.mean(cl >= 0.9)) if len(cl) else None},
            "misses": misses,
            "misses_table_suspect": sum(m["table_suspect"] is not None for m in misses)}


def choice_score(points) -> float | None:
    """One number for model selection: the mean choice fraction of per-GPU throughput over
    the same-GPU-type and the any-GPU-type groups (what the scheduler decides with)."""
    vals = [choice_quality(points, g, "per_gpu")["mean"] for g in ("same GPU type", "any GPU type")]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None
