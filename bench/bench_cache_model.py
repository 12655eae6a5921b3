"""Does the profiler's cache model explain a whole step? One process, interleaved.

For each model: every distinct layer is timed as the profiler times it
(``profiler.time_layer``: cold after the profiler's cache flush, warm repeated at once,
and its working set), and a real forward + backward of the launcher's whole model on one
rank at the same batch is timed in the same process, round after round, so that the
host's load drifts over all of them alike. Reported per round and as the median over the
rounds: the whole step over the sum of the cold layer times (what the estimate charged
before the cache model), over the sum of the warm ones, and over the cache model's
prediction (``local_accuracy.cache_hit`` of the step's working set). Nothing is fitted:
a prediction / step ratio near 1 on a model says the cache model explains its step.

    PYTHONPATH=. .venv/bin/python bench/bench_cache_model.py tiny-wide_resnet__50 tiny-moe__2L \
        [--batch 8] [--rounds 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def measure(model: str, batch: int, rounds: int, steps: int = 5) -> dict:
    import torch

    from estimators.evaluation.local_accuracy import cache_hit
    from estimators.profiler import ProfilerConfig, build_layer, time_layer
    from instances.models import get_model
    from launcher.model import build_model, loss_fn
    torch.set_num_threads(1)
    torch.manual_seed(0)
    arch = get_model(model)
    cfg = ProfilerConfig(micro_batches=(batch,), tp_degrees=(1,), repeats=3)
    specs = arch.layers()
    first = {}
    for i, s in enumerate(specs):
        first.setdefault((s.kind, tuple(s.signature)), i)
    layers = {k: build_layer(arch, i, 1, "float32") for k, i in first.items()}
    full = build_model(model, 0)
    if arch.is_transformer:
        x = torch.randint(0, arch.vocab_size, (batch, arch.seq_len))
        target = x
    else:
        x = torch.randn(batch, 3, arch.image_size, arch.image_size)
        target = torch.randint(0, specs[-1].signature[1], (batch,))
    out = []
    for _ in range(rounds):
        t = {k: time_layer(mod, make, batch, cfg, "cpu") for k, (mod, make) in layers.items()}
        per = [t[(s.kind, tuple(s.signature))] for s in specs]
        cold = sum(p.fwd_s + p.bwd_s for p in per)
        warm = sum(p.warm_fwd_s + p.warm_bwd_s for p in per)
        ws = sum(2 * p.param_bytes + p.saved_bytes for p in per)
        hit = cache_hit(ws, cfg.flush_cache_mib * 2**20)
        predicted = cold - hit * (cold - warm)
        step_s = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            loss_fn(full(x), target).backward()
            step_s.append(time.perf_counter() - t0)
            full.zero_grad(set_to_none=True)
        step = statistics.median(step_s[1:])
        out.append({"step_s": step, "cold_sum_s": cold, "warm_sum_s": warm, "predicted_s": predicted,
                    "working_set_mib": ws / 2**20, "cache_hit": hit, "load_1min": os.getloadavg()[0]})
    med = {k: statistics.median(r[k] / r["step_s"] for r in out) for k in ("cold_sum_s", "warm_sum_s", "predicted_s")}
    return {"model": model, "batch": batch, "rounds": out,
            "median_over_step": {"cold": med["cold_sum_s"], "warm": med["warm_sum_s"], "predicted": med["predicted_s"]},
            "working_set_mib": out[0]["working_set_mib"], "cache_hit": out[0]["cache_hit"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = []
    for m in a.models:
        print(f"{m} ...", file=sys.stderr, flush=True)
        res.append(measure(m, a.batch, a.rounds))
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for r in res:
        m = r["median_over_step"]
        loads = " ".join(f"{x['load_1min']:.1f}" for x in r["rounds"])
        print(f"{r['model']}: working set {r['working_set_mib']:.1f} MiB, cache hit {r['cache_hit']:.2f}; "
              f"over the whole step (median of {len(r['rounds'])} rounds): cold layers {m['cold']:.2f}, "
              f"warm {m['warm']:.2f}, cache model {m['predicted']:.2f} (load {loads})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
