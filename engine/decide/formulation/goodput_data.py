"""Round data for the Sia artifact's goodput jobs (instances/goodput.py): the same
``RoundData`` the optimizing policies build their model from, with one column per job
and candidate shape (every GPU type, 1, 2, 4 ... GPUs on one node, then whole nodes, up
to ``max_gpus``), valued by the job's goodput there at its current epoch with the batch
it would choose (``estimators.goodput.GoodputModel``), in ``B0``-equivalent samples per
second; every column carries the adaptive ``BatchPlan`` as its plan. Remaining work is
remaining progress, so the terms that read remaining time (``jct``) see the time left
at the estimated goodput. A job's current shape is always a column.
"""
from __future__ import annotations

import math

import numpy as np

from engine.core.context import RoundContext
from instances.goodput import ADAPTIVE, GoodputJob
from instances.grid import Grid, Shape

from .round_data import Capacity, RoundData, _reference_throughput, held_capacity


def candidate_shapes(ctx: RoundContext, max_gpus: int) -> list[Shape]:
    shapes = []
    cap = Capacity.from_cluster(ctx.cluster, ctx.unavailable_nodes)
    for t, mx in zip(cap.types, cap.max_gpus_per_node):
        nodes = sum(g.num_nodes for g in ctx.cluster.groups if g.gpu_type == t)
        g = 1
        while g <= mx:
            for k in range(1, nodes + 1):
                if k * g <= max_gpus and (k == 1 or g == mx):
                    shapes.append(Shape(t, k, g))
            g *= 2
    return shapes


def build_goodput_round_data(ctx: RoundContext, perf, max_gpus: int, *, held: bool = True) -> RoundData:
    cap = Capacity.from_cluster(ctx.cluster, ctx.unavailable_nodes)
    type_index = {t: i for i, t in enumerate(cap.types)}
    shapes = candidate_shapes(ctx, max_gpus)
    job_ids, rem, gb, cur_col, running, queued, deadline, prio, tenants, req_g, req_t = ([] for _ in range(11))
    attained, arrival, resume, ref, jobs, unschedulable, current = [], [], [], [], [], [], []
    col_job, col_type, col_nodes, col_gpn, col_thr, col_rc = [], [], [], [], [], []
    grids: list[Grid] = []
    for view in ctx.jobs:
        job = view.job
        assert isinstance(job, GoodputJob)
        progress = max(0.0, job.num_iterations - float(view.remaining_iterations))
        mine = list(shapes)
        cur = view.current.grid if view.current is not None else None
        if cur is not None and cur.shape not in mine:
            mine.append(cur.shape)
        thr, keep = [], []
        for s in mine:
            seg = perf.goodput(job, s, progress, ADAPTIVE)
            if seg is not None and seg.seconds_per_unit > 0:
                thr.append(job.global_batch / seg.seconds_per_unit)
                keep.append(s)
        if not keep:
            unschedulable.append(job.job_id)
            continue
        j = len(job_ids)
        first = len(col_job)
        current_k = -1
        thr_of = {}
        for s, t in zip(keep, thr):
            g = Grid(s) if cur is None or cur.shape != s else cur
            if cur is not None and g == cur:
                current_k = len(col_job)
            col_job.append(j)
            col_type.append(type_index[s.gpu_type])
            col_nodes.append(s.num_nodes)
            col_gpn.append(s.gpus_per_node)
            col_thr.append(t)
            rc = ctx.reconfig.cost_to_grid_s(job, view.current, g, resumed=view.current is None
                                             and view.attained_gpu_s > 0) if ctx.reconfig is not None else 0.0
            col_rc.append(float(rc))
            grids.append(g)
            thr_of[(s.gpu_type, s.num_nodes, s.gpus_per_node)] = t
        assert len(col_job) > first
        job_ids.append(job.job_id)
        jobs.append(job)
        rem.append(max(float(view.remaining_iterations), 0.0))
        gb.append(float(job.global_batch))
        cur_col.append(current_k)
        current.append(view.current)
        running.append(view.current is not None)
        queued.append(float(view.queued_s))
        deadline.append(math.inf)
        prio.append(float(job.priority))
        tenants.append(job.tenant)
        req_g.append(int(job.requested_gpus or 0))
        req_t.append(None)
        attained.append(float(view.attained_gpu_s))
        arrival.append(float(job.arrival_s))
        resume.append(float(ctx.reconfig.cost_to_grid_s(job, None, cur, resumed=True))
                      if ctx.reconfig is not None and cur is not None else 0.0)
        ref.append(_reference_throughput(job, thr_of))

    def arr(x, dtype=float):
        a = np.array(x, dtype=dtype)
        a.setflags(write=False)
        return a
    return RoundData(
        now_s=float(ctx.now_s), round_interval_s=float(ctx.round_interval_s), capacity=cap,
        job_ids=tuple(job_ids), remaining_iterations=arr(rem), ref_throughput=arr(ref), global_batch=arr(gb),
        current_col=arr(cur_col, np.int64), running=arr(running, bool), queued_s=arr(queued), deadline_s=arr(deadline),
        priority=arr(prio), tenants=tuple(tenants), requested_gpus=arr(req_g, np.int64), requested_type=tuple(req_t),
        col_job=arr(col_job, np.int64), col_type=arr(col_type, np.int64), col_nodes=arr(col_nodes, np.int64),
        col_gpn=arr(col_gpn, np.int64), col_pp=arr([1] * len(col_job), np.int64), col_throughput=arr(col_thr),
        col_reconfig_s=arr(col_rc), grids=tuple(grids), plans=tuple([ADAPTIVE] * len(grids)),
        unschedulable=tuple(unschedulable), jobs=tuple(jobs), attained_gpu_s=arr(attained), arrival_s=arr(arrival),
        resume_s=arr(resume), held=held_capacity(cap, ctx.cluster, ctx.unavailable_nodes, current) if held else None)
