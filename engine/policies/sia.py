"""``sia`` baseline (Jayaram Subramanya et al., SOSP'23), as the Arena comparison
configured it: an elastic goodput ILP over GPU types and counts, data-parallel-only
estimates with a data-parallel memory check, and a restart factor that penalises
reallocations.

What it simplifies: Sia's goodput couples throughput with statistical efficiency
(batch-size adaptation); the traces fix each job's global batch, so goodput is
throughput here. Its objective sum_j (goodput_j / goodput_j(min config)) is the
``throughput`` term with ``reference="smallest"``; every job that can run gets a
bonus (Sia's ILP schedules every job it can); the restart factor is the
``reconfig`` term with a fixed per-move cost (``reconfig.per_move``, default 0.25 of a
round) on top of the shared cost model's downtime. Sia's bootstrapping profiler is
replaced by the estimator's DP-only estimates.
"""
from __future__ import annotations

from ..context import Decisions, RoundContext
from ..formulation.decide import dp_only_performance_model, make_decider
from ..policy import register_policy

DEFAULT_WEIGHTS = {"throughput": 1.0, "queue": 1.0, "reconfig": 1.0}
DEFAULT_OPTIONS = {"throughput.reference": "smallest", "reconfig.per_move": 0.25}


class SiaPolicy:
    name = "sia"

    def __init__(self, **config):
        merged = dict(DEFAULT_OPTIONS)
        for k, v in config.items():
            merged[k] = v
        for k in DEFAULT_OPTIONS:          # defaults of a term switched off by the user go too
            term = k.split(".", 1)[0]
            if str(config.get(f"w_{term}", "1")) in ("0", "0.0") and k not in config:
                merged.pop(k)
        self.decider, _ = make_decider(self.name, merged, DEFAULT_WEIGHTS, dp_only=True)
        self._perf_cache: dict = {}

    def decide(self, ctx: RoundContext) -> Decisions:
        return self.decider.decide(ctx, dp_only_performance_model(ctx.perf, self._perf_cache))


@register_policy("sia")
def make_sia(**config) -> SiaPolicy:
    return SiaPolicy(**config)
