"""Estimates against real torch runs on this machine.

A tiny model is trained with real multi-rank torch jobs (``launcher.api.run_training``:
mpiexec, gloo on CPU) under data, tensor and pipeline splits at world sizes 1 and 2; the
measured iteration time (median over the steps after ``skip`` warm-up steps) is compared
with the analytic estimate of the same plan, whose layer and link costs come from the
profile store (the model is profiled first if the store lacks it). The estimate models
the launcher's runtime, not the Arena runtime of the defaults: no activation
recomputation, a plain gradient all-reduce (no sharded optimizer update), Adam for every
family (``launcher_runtime``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from instances.gpus import get_gpu
from instances.models import get_model

from .base import Plan
from .config import EfficiencyConfig, MemoryConfig
from .perf import AnalyticModel
from .profile_store import ProfileStore

DEFAULT_PLANS = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 4))     # dp, tp, pp, microbatches


def launcher_runtime(eff: EfficiencyConfig | None = None,
                     mem: MemoryConfig | None = None) -> tuple[EfficiencyConfig, MemoryConfig]:
    """The estimator config of the torch launcher (launcher/worker.py): torch.optim.Adam on
    every family, no activation recomputation, DDP-style gradient all-reduce."""
    eff = replace(eff or EfficiencyConfig(), recompute_activations=False, dp_sharded_optimizer=False)
    mem = replace(mem or MemoryConfig(), optimizer="adam", optimizer_by_family=())
    return eff, mem


@dataclass(frozen=True)
class LocalResult:
    dp: int
    tp: int
    pp: int
    microbatches: int
    measured_s: float | None
    estimated_s: float
    error: str = ""

    @property
    def rel_error(self) -> float | None:
        return None if self.measured_s is None else self.estimated_s / self.measured_s - 1


def against_local(*, model: str = "tiny-gpt__4L", global_batch: int = 8, steps: int = 8, skip: int = 2,
                  plans=DEFAULT_PLANS, store: ProfileStore | None = None, timeout_s: float = 180) -> list[LocalResult]:
    from launcher.api import run_training
    from .profiler import local_device, profile_collectives, profile_layers
    store = store or ProfileStore()
    arch = get_model(model)
    device, _ = local_device()
    if not store.collective_records(device):
        profile_collectives(group_sizes=(2,), store=store)
    profile_layers(arch, store=store)           # reuses what the store already holds
    eff, mem = launcher_runtime()
    perf = AnalyticModel(profile_store=store, profile_device=device, efficiency=eff, memory=mem)
    gpu = get_gpu(device)
    out = []
    for dp, tp, pp, m in plans:
        split = perf.planner.split(arch, gpu, pp)
        plan = Plan(pp, dp, tp, split, m, "1f1b")
        est = perf.planner.evaluate(arch, plan, global_batch=global_batch, gpu=gpu,
                                    gpus_per_node=dp * tp * pp).iteration_time_s
        r = run_training(model, dp, tp, pp, steps=steps, microbatches=m, global_batch=global_batch,
                         timeout_s=timeout_s, stage_layers=split)
        times = list(r.iteration_times_s)[skip:]
        if not r.ok or not times:
            out.append(LocalResult(dp, tp, pp, m, None, est, f"run failed (rc {r.returncode}): "
                                   f"{r.output_tail[-200:]}"))
            continue
        out.append(LocalResult(dp, tp, pp, m, statistics.median(times), est))
    return out
