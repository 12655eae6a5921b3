"""How long does a tensor-parallel run take to warm up? Two gloo ranks, one process each.

The launcher's model under ``apply_tp`` (DTensor projections) trains ``--steps`` steps of
the launcher's own data with Adam, as ``launcher/worker.py`` does. Rank 0 records each
step's time and how many operator calls missed DTensor's sharding-propagation cache
(counted where torch's C++ fast path falls back to Python:
``DTensor._op_dispatcher._propagate_op_sharding_dispatch_slow_path``, a private hook of
torch 2.13 — where it is gone, the bench says so and reports the times only). A miss means a shape the run
has not seen: the MoE pads each expert's tokens to one of a few sizes
(``launcher.model.expert_rows``), so new sizes keep turning up for a while as routing
varies. ``local_accuracy.MEASURE_SKIP`` is chosen from this; the summary gives the misses
and the median step time per window of steps.

    PYTHONPATH=. .venv/bin/python bench/bench_tp_warmup.py tiny-moe__2L tiny-gpt__4L [--steps 40] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

WINDOWS = ((0, 2), (2, 10), (10, 20), (20, None))


def _worker(rank: int, init_method: str, world: int, model: str, steps: int, batch: int, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from instances.models import get_model
    from launcher.data import make_source
    from launcher.model import build_model, loss_fn
    from launcher.parallelize import apply_tp

    torch.set_num_threads(1)                     # as launcher/worker.py
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    dispatcher = DTensor._op_dispatcher
    slow = getattr(dispatcher, "_propagate_op_sharding_dispatch_slow_path", None)
    misses = [0]
    if slow is not None:
        def counted(*args, **kwargs):
            misses[0] += 1
            return slow(*args, **kwargs)
        dispatcher._propagate_op_sharding_dispatch_slow_path = counted
    model_ = build_model(model, 0)
    apply_tp(model_, init_device_mesh("cpu", (world,)))
    opt = torch.optim.Adam(model_.parameters(), lr=1e-3)
    source = make_source(get_model(model), 0, None)
    rows = []
    for step in range(steps):
        x, y = source.global_batch(step, batch)
        before = misses[0]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model_(x), y).backward()
        opt.step()
        rows.append((time.perf_counter() - t0, misses[0] - before))
        dist.all_reduce(torch.zeros(1))          # the ranks step together, as the launcher's control all-reduce
    if rank == 0:
        queue.put({"rows": rows, "counted": slow is not None})
    dist.barrier()                               # run_spawned's ranks then skip torch's teardown


def measure(model: str, steps: int, batch: int) -> dict:
    import torch.multiprocessing as mp

    from estimators.profiler import run_spawned
    q = mp.get_context("spawn").SimpleQueue()
    run_spawned(_worker, (2, model, steps, batch, q), 2, 600.0, "tp warm-up bench")
    res = q.get()
    rows = res["rows"]
    windows = []
    for a, b in WINDOWS:
        part = rows[a:b]
        if part:
            windows.append({"steps": f"{a}-{(b or len(rows)) - 1}", "median_s": statistics.median(t for t, _ in part),
                            "misses": sum(m for _, m in part)})
    return {"model": model, "tp": 2, "batch": batch, "misses_counted": res["counted"],
            "step_s": [t for t, _ in rows], "misses": [m for _, m in rows], "windows": windows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steps < 21:
        ap.error("--steps must be at least 21 (the last window starts at step 20)")
    from instances.models import get_model
    for m in args.models:
        if not get_model(m).is_transformer:
            ap.error(f"{m}: the launcher has no tensor parallelism for this model")
    out = []
    for m in args.models:
        print(f"{m}: {args.steps} steps on 2 tensor-parallel ranks ...", file=sys.stderr, flush=True)
        out.append(measure(m, args.steps, args.batch))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in out:
        if not r["misses_counted"]:
            print(f"{r['model']}: this torch has no sharding-propagation slow path to count; times only")
        print(f"{r['model']} (tp 2, batch {r['batch']}): misses per step {r['misses']}")
        for w in r["windows"]:
            print(f"  steps {w['steps']:>6}: median step {w['median_s'] * 1e3:7.1f} ms, {w['misses']:>4} misses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
