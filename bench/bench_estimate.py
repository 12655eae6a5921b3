"""Estimation speed for a 10,000-GPU synthetic scheduling round.

Jobs x candidate grids are estimated cold (fresh performance model: planner tables and
estimate cache empty) and then warm (the same round again: every estimate is a cache
hit, as in the next scheduling round). Uses instances.generator.synthetic_cluster /
synthetic_jobs when they exist; otherwise builds a 10,000-GPU cluster of the Arena GPU
types and draws jobs from the catalog models with a seeded RNG.

    .venv/bin/python bench/bench_estimate.py [--jobs 1000] [--gpus 10000] [--perf analytic] [--seed 0] [--json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from instances.cluster import ClusterSpec, NodeGroup  # noqa: E402
from instances.jobs import Job  # noqa: E402

MODELS = ("gpt__350M", "gpt__760M", "gpt__1.3B", "gpt__2.6B", "gpt__6.7B", "moe__690M", "moe__1.3B", "moe__2.4B",
          "moe__10B", "wide_resnet__500M", "wide_resnet__1B", "wide_resnet__2B", "llama__7B")
BATCHES = (128, 256, 512)


def build_round(num_jobs: int, num_gpus: int, seed: int):
    try:
        from instances.generator import synthetic_cluster, synthetic_jobs  # type: ignore
        cluster = synthetic_cluster(num_gpus=num_gpus, seed=seed)
        jobs = list(synthetic_jobs(num_jobs, seed=seed))
        return cluster, jobs, "instances.generator"
    except (ImportError, TypeError):
        pass
    quarter = num_gpus // 4
    cluster = ClusterSpec((NodeGroup("a100", quarter // 4, 4), NodeGroup("v100", quarter // 16, 16),
                           NodeGroup("a40", quarter // 2, 2), NodeGroup("a10", quarter // 2, 2)), "synthetic-10k")
    rng = random.Random(seed)
    jobs = [Job(f"j{i}", rng.choice(MODELS), rng.choice(BATCHES), 100, 0.0) for i in range(num_jobs)]
    return cluster, jobs, "bench fallback"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--perf", default="analytic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from estimators import make_performance_model
    from estimators.grids import candidate_grids
    cluster, jobs, origin = build_round(args.jobs, args.gpus, args.seed)
    perf = make_performance_model(args.perf)
    planner = getattr(perf, "planner", None) or getattr(getattr(perf, "analytic", None), "planner", None)
    t0 = time.perf_counter()
    pairs = [(j, g) for j in jobs for g in candidate_grids(j, cluster, max_gpus=16, planner=planner)]
    t_grids = time.perf_counter() - t0
    t0 = time.perf_counter()
    for j, g in pairs:
        perf.estimate(j, g)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for j, g in pairs:
        perf.estimate(j, g)
    warm = time.perf_counter() - t0
    out = {"cluster_gpus": cluster.num_gpus, "jobs": len(jobs), "job_source": origin, "estimates": len(pairs),
           "distinct_model_batch": len({(j.model, j.global_batch) for j in jobs}), "perf": perf.name,
           "grid_enumeration_s": t_grids, "cold_s": cold, "warm_s": warm,
           "cold_estimates_per_s": len(pairs) / cold if cold else None,
           "warm_estimates_per_s": len(pairs) / warm if warm else None}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['jobs']} jobs ({origin}), {out['cluster_gpus']} GPUs, {out['estimates']} job x grid estimates "
              f"({out['distinct_model_batch']} distinct model x batch), perf {out['perf']}")
        print(f"  grid enumeration (with memory pruning): {t_grids:.2f} s")
        print(f"  cold: {cold:.2f} s = {out['cold_estimates_per_s']:.0f} estimates/s")
        print(f"  warm: {warm:.3f} s = {out['warm_estimates_per_s']:.0f} estimates/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
