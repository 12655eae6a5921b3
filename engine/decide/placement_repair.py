"""Placement with repair for the optimizing policies: the grids a policy chose from a
round's columns (``RoundData``) placed by the engine's placement (``engine.core.placement``);
a grid that does not fit moves its job to its best smaller column, else the job waits."""
from __future__ import annotations

import numpy as np

from engine.core.allocation import GpuId
from engine.core.context import RoundContext
from engine.core.placement import Placer

from .formulation.round_data import RoundData

MAX_PLACEMENT_REPAIRS = 4       # rounds of "shrink the jobs that did not fit, place again"


def place_with_repair(placers: dict[int, Placer], ctx: RoundContext, data: RoundData, col_value: np.ndarray,
                      chosen: dict[int, int]) -> tuple[dict[int, int], dict[str, tuple[GpuId, ...]], int, list[str]]:
    """Place the chosen grids with the engine's placement; a job whose grid does not
    fit (the model's node-shape rows do not see which GPUs running jobs keep, nor that
    a multi-node job needs distinct nodes) moves to its best smaller column, else
    waits. ``chosen`` maps a job's row in ``data`` to its chosen column; ``col_value``
    ranks a job's alternative columns (-inf: not an alternative); ``placers`` caches a
    Placer per cluster.
    Returns (chosen, pinned GPUs, repairs, dropped job ids)."""
    key = id(ctx.cluster)
    placer = placers.get(key)
    if placer is None:
        placer = placers[key] = Placer(ctx.cluster)
    current = {v.job_id: v.current for v in ctx.jobs if v.current is not None}
    index = {jid: j for j, jid in enumerate(data.job_ids)}
    chosen = dict(chosen)
    repairs, dropped = 0, []
    c = col_value
    for _ in range(MAX_PLACEMENT_REPAIRS):
        requests = {data.job_ids[j]: data.grids[k] for j, k in chosen.items()}
        res = placer.place(requests, current, unavailable=ctx.unavailable_nodes)
        if not res.failed:
            break
        for jid in res.failed:
            j = index[jid]
            k = chosen.pop(j)
            lo, hi = np.searchsorted(data.col_job, [j, j + 1])
            alts = [a for a in range(lo, hi) if data.col_gpus[a] < data.col_gpus[k] and c[a] > -np.inf]
            if alts:
                chosen[j] = max(alts, key=lambda a: c[a])
                repairs += 1
            else:
                dropped.append(jid)
    else:
        requests = {data.job_ids[j]: data.grids[k] for j, k in chosen.items()}
        res = placer.place(requests, current, unavailable=ctx.unavailable_nodes)
        for jid in res.failed:
            chosen.pop(index[jid], None)
            dropped.append(jid)
        res = placer.place({data.job_ids[j]: data.grids[k] for j, k in chosen.items()}, current,
                           unavailable=ctx.unavailable_nodes)
    placements = {jid: a.gpus for jid, a in res.allocations.items()}
    return chosen, placements, repairs, dropped
