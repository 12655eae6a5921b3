"""Checks for a machine with a CUDA GPU: the code paths written for GPUs and never run on the
CPU hosts the project is built on (docs/service.md, "what it has not been run on").

1. **layers**: the profiler times every distinct layer of ``tiny-gpt__4L`` on the GPU
   (``estimators.profiler.profile_layers``, float32 as the catalog's tiny models are, at
   micro-batches 1 and 2): every time must be finite and > 0, on the device the catalog
   names.
2. **plans**: one-GPU runs of ``tiny-gpt__4L`` and ``tiny-llama__4L`` by the launcher
   (mpiexec, one rank, CUDA; the process group is NCCL's) against the estimate of the same
   plan from that profile and the launcher's measured runtime terms
   (``estimators.evaluation.local_accuracy.against_local``, as ``arena estimate accuracy
   --against local`` does): each run must finish, and the estimate must be within
   ``--max-ratio`` of the median step time (after ``MEASURE_SKIP`` warm-up steps).
3. **nccl**: one process per visible GPU joins an NCCL process group and all-reduces a
   one on its GPU: every process must read the process count.

Prints one table (check, what, measured, expected, verdict) and exits 1 when a check
failed, 0 when all passed; a check that raises fails with the error. Without CUDA (torch
sees no GPU) it says so and exits 0: there is nothing to check on this machine.

    .venv/bin/python bench/gpu_check.py [--max-ratio 2] [--steps 30] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYER_MODEL = "tiny-gpt__4L"
PLAN_MODELS = ("tiny-gpt__4L", "tiny-llama__4L")
GLOBAL_BATCH = 8
NCCL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Row:
    check: str
    what: str
    measured: str
    expected: str
    ok: bool


def table(rows: list[Row]) -> str:
    """The rows as one plain-text table, a verdict per row."""
    head = ("check", "what", "measured", "expected", "verdict")
    body = [(r.check, r.what, r.measured, r.expected, "ok" if r.ok else "FAILED") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body])


def exit_code(rows: list[Row]) -> int:
    return 0 if rows and all(r.ok for r in rows) else 1


def check_layers(store) -> list[Row]:
    from estimators.profiler import ProfilerConfig, local_device, profile_layers
    from instances.models import get_model
    device, _ = local_device()
    res = profile_layers(get_model(LAYER_MODEL), store=store,
                         cfg=ProfilerConfig(micro_batches=(1, 2), tp_degrees=(1,), repeats=5))
    recs = res["records"]
    bad = [f"{r.kind} mb{r.micro_batch}" for r in recs
           if not (math.isfinite(r.fwd_s) and math.isfinite(r.bwd_s) and r.fwd_s > 0 and r.bwd_s > 0)]
    return [Row("layers", f"{LAYER_MODEL}: {len(recs)} layer timings on {res['device']}",
                f"{sum(r.fwd_s + r.bwd_s for r in recs if r.micro_batch == 1) * 1e3:.3f} ms fwd+bwd at mb 1"
                + (f"; not finite or 0: {', '.join(bad[:3])}" if bad else ""),
                f"every timing finite and > 0, device {device}", bool(recs) and not bad and res["device"] == device)]


def check_plans(store, steps: int, max_ratio: float) -> list[Row]:
    from estimators.evaluation.local_accuracy import MEASURE_SKIP, against_local
    rows = []
    for model in PLAN_MODELS:
        try:
            (r,) = against_local(model=model, global_batch=GLOBAL_BATCH, steps=steps,
                                 skip=min(MEASURE_SKIP, steps // 2), plans=((1, 1, 1, 1),), store=store)
        except Exception as e:                  # (one model's failure does not hide the other's verdict)
            rows.append(Row("plans", f"{model}, 1 GPU", f"error: {e!r}"[:160], "a run and an estimate", False))
            continue
        if r.measured_s is None:
            rows.append(Row("plans", f"{model}, 1 GPU", r.error[:160], "the run finishes", False))
            continue
        ratio = r.estimated_s / r.measured_s
        rows.append(Row("plans", f"{model}, 1 GPU, global batch {GLOBAL_BATCH}",
                        f"{r.measured_s * 1e3:.2f} ms/step; estimate {r.estimated_s * 1e3:.2f} ms ({ratio:.2f}x)",
                        f"estimate within {max_ratio:g}x", 1 / max_ratio <= ratio <= max_ratio))
    return rows


def _nccl_worker(rank: int, init_method: str, world: int, queue) -> None:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world)
    x = torch.ones(1, device=f"cuda:{rank}")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    version = torch.cuda.nccl.version()           # (a tuple, or an int in older torch)
    queue.put((rank, float(x.item()), ".".join(map(str, version)) if isinstance(version, tuple) else str(version)))
    dist.barrier()
    dist.destroy_process_group()


def check_nccl() -> list[Row]:
    import torch
    import torch.multiprocessing as mp

    from estimators.profiler import run_spawned
    world = torch.cuda.device_count()
    q = mp.get_context("spawn").SimpleQueue()
    run_spawned(_nccl_worker, (world, q), world, NCCL_TIMEOUT_S, "the NCCL check")
    got = sorted(q.get() for _ in range(world))
    sums = [s for _, s, _ in got]
    return [Row("nccl", f"all-reduce over {world} GPU(s), NCCL {got[0][2] if got else '?'}",
                f"sums {sums}", f"{float(world)} on every GPU", len(got) == world and all(s == world for s in sums))]


def run(steps: int, max_ratio: float) -> list[Row]:
    from estimators.profile_store import ProfileStore
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="arena-gpu-check-") as d:
        store = ProfileStore(d)
        for name, check in (("layers", lambda: check_layers(store)),
                            ("plans", lambda: check_plans(store, steps, max_ratio)), ("nccl", check_nccl)):
            try:
                rows += check()
            except Exception as e:              # a check that raises fails; the others still run
                rows.append(Row(name, "raised", f"{e!r}"[:200], "no error", False))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-ratio", type=float, default=2.0,
                    help="an estimate within this factor of the measured step time passes (default %(default)s)")
    ap.add_argument("--steps", type=int, default=30, help="training steps of each one-GPU run (default %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if not args.max_ratio >= 1 or args.steps < 4:
        ap.error("--max-ratio must be >= 1 and --steps >= 4")
    import torch
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__} sees none): nothing to check on this machine")
        return 0
    rows = run(args.steps, args.max_ratio)
    print(f"gpu_check on {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
