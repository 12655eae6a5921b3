"""Small hand-built clusters, jobs, oracles and scripted policies for the engine tests."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core.context import Decisions
from instances.cluster import ClusterSpec, NodeGroup
from instances.grid import Grid, Shape
from instances.jobs import Job


class LinearOracle:
    """Iteration time = work_s / GPUs (perfect scaling); shapes in ``infeasible`` -> None."""

    def __init__(self, work_s: float = 10.0, infeasible=(), per_job: dict | None = None):
        self.work_s, self.infeasible, self.per_job = work_s, set(infeasible), per_job or {}
        self.calls = 0

    def true_iteration_time(self, job, shape):
        self.calls += 1
        if (job.job_id, shape) in self.infeasible or shape in self.infeasible or job.job_id in self.infeasible:
            return None
        return self.per_job.get(job.job_id, self.work_s) / shape.num_gpus


@dataclass
class Inst:
    name: str
    cluster: ClusterSpec
    jobs: tuple
    oracle: object
    round_interval_s: float = 300.0
    horizon_rounds: int | None = 50
    description: str = ""


def cluster(*groups) -> ClusterSpec:
    return ClusterSpec(tuple(NodeGroup(*g) for g in groups), "test")


def job(jid: str, arrival: float, iters: int, gpus: int | None = None, gtype: str | None = "a100",
        batch: int = 8) -> Job:
    return Job(jid, "gpt__1.3B", batch, iters, arrival, requested_gpu_type=gtype if gpus else None,
               requested_gpus=gpus)


def grid(gtype: str, nodes: int, per_node: int, pp: int = 1) -> Grid:
    from instances.gpus import canonical_gpu_name
    return Grid(Shape(canonical_gpu_name(gtype), nodes, per_node), pp)


@dataclass
class ScriptedPolicy:
    """Calls ``rule(ctx) -> {job_id: Grid}`` each round and records what it saw."""
    rule: object
    name: str = "scripted"
    seen: list = field(default_factory=list)

    def decide(self, ctx):
        self.seen.append(ctx)
        return Decisions(dict(self.rule(ctx)))


def wait_until(pred, timeout_s: float = 180.0, what: str = "condition", poll_s: float = 0.5):
    """``pred()``'s first truthy value, polled every ``poll_s``; an AssertionError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")
