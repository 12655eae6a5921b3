"""Measure real launcher moves: each move kind, device to device and through storage, with
bytes moved and seconds per part (``launcher.move_record``), then calibrate the move-cost
model (``estimators.move_cost``) and report its error on held-out moves.

    python bench/bench_moves.py --json > results/moves.json
    python bench/bench_moves.py --models tiny-gpt__2L --reps 1 --write-calibration

One job per (model, path, repetition) runs through ``MpiExecutor`` on this host and
moves, ``--steps-between`` steps apart: dp=2 -> pp=2 -> dp=2 -> tp=2 -> pp=2 ->
dp=2,pp=2 (grow x2) -> pp=2 (shrink /2), i.e. dp->pp, pp->dp, dp->tp, tp->pp, grow x2,
shrink /2 (Wide-ResNet: no tensor parallelism, so dp->pp, pp->dp, grow, shrink).
Progress goes to stderr; ``--json`` prints only the JSON result on stdout.
``--write-calibration`` writes the fit and its held-out errors, with provenance, to
``instances/data/launcher/move_cost_measured.json``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from instances.errors import InputError  # noqa: E402
from instances.paths import check_output_file  # noqa: E402

TINY = ("tiny-gpt__2L", "tiny-gpt__4L", "tiny-llama__4L", "tiny-moe__2L", "tiny-wide_resnet__50")
# (plan, micro-batches) in order; the job starts on the first
CHAIN = (("dp=2", 1), ("pp=2", 2), ("dp=2", 1), ("tp=2", 1), ("pp=2", 2), ("dp=2,pp=2", 2), ("pp=2", 2))
CHAIN_NO_TP = (("dp=2", 1), ("pp=2", 2), ("dp=2", 1), ("pp=2", 2), ("dp=2,pp=2", 2), ("pp=2", 2))
CALIBRATION = ROOT / "instances" / "data" / "launcher" / "move_cost_measured.json"


def log(msg: str) -> None:
    print(f"[bench-moves] {msg}", file=sys.stderr, flush=True)


class _Alloc:                       # structurally engine.core.allocation.Allocation
    def __init__(self, n: int):
        from instances.grid import Grid, Shape
        self.grid = Grid(Shape("cpu", 1, n), pp=1)
        self.gpus = tuple((0, i) for i in range(n))


def run_chain(model: str, path: str, rep: int, steps_between: int, batch: int, work: Path,
              timeout_s: float) -> list[dict]:
    """One job through every move of the chain; its move records."""
    from instances.jobs import Job
    from instances.models import get_model
    from launcher.config import ParallelPlan
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig

    chain = CHAIN if get_model(model).is_transformer else CHAIN_NO_TP
    plans = [ParallelPlan.parse(p, microbatches=mb) for p, mb in chain]
    steps = steps_between * len(plans) + 1
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(work), checkpoint_every=0, checkpoint_interval_s=0,
                                       move_path=path, stop_timeout_s=max(60.0, timeout_s / 4)))
    job_id = f"{Path(model).stem}-{path}-{rep}"
    t_end = time.monotonic() + timeout_s
    with ex:
        ex.launch(Job(job_id, model, batch, steps, 0.0), _Alloc(plans[0].world_size), plans[0], 0.0)
        for i, p in enumerate(plans[1:], 1):
            while ex.progress(job_id).iterations_done < steps_between * i:
                if time.monotonic() > t_end or ex.progress(job_id).failed:
                    raise RuntimeError(f"{job_id}: no progress ({ex.progress(job_id).failed})")
                time.sleep(0.02)
            ex.reconfigure(job_id, _Alloc(p.world_size), p, 0.0)
            rec = ex.move_records(job_id)[-1]
            log(f"{job_id}: move {i} {rec['kind']} by {rec['path']}")
        while not (ex.progress(job_id).finished or ex.progress(job_id).failed):
            if time.monotonic() > t_end:
                raise RuntimeError(f"{job_id}: not finished in {timeout_s} s")
            time.sleep(0.2)
        if ex.progress(job_id).failed:
            raise RuntimeError(f"{job_id}: {ex.progress(job_id).failed}")
        recs = ex.move_records(job_id)
    return [{"model": model, "rep": rep, **r} for r in recs]


def summarize(records: list[dict]) -> list[dict]:
    """Median per (model, kind, path) of bytes and seconds per part."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["model"], r["kind"], r["path"]), []).append(r)
    out = []
    for (model, kind, path), rs in groups.items():
        row = {"model": model, "kind": kind, "path": path, "n": len(rs)}
        for k in ("bytes_moved", "drain_stop_s", "state_s", "startup_s", "first_step_s", "warmup_s", "total_s"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(TINY), help="comma-separated models (catalog names or "
                    "config.json paths)")
    ap.add_argument("--paths", default="d2d,storage")
    ap.add_argument("--reps", type=int, default=2, help="jobs per (model, path); held-out split by repetition")
    ap.add_argument("--steps-between", type=int, default=12, help="steps between moves (warm-up needs 6 after a move)")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    ap.add_argument("--records", default=None, help="comma-separated earlier outputs of this script (or JSON "
                    "lists of records) whose records are added before fitting")
    ap.add_argument("--out", default=None, help="write the JSON result here too")
    ap.add_argument("--write-calibration", action="store_true",
                    help=f"write the fit to {CALIBRATION.relative_to(ROOT)}")
    ap.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    try:
        from instances.models import canonical_model_name
        for m in models:
            canonical_model_name(m)
        bad = [p for p in paths if p not in ("d2d", "storage")]
        if bad or not paths:
            raise InputError(f"paths must be d2d and/or storage, got {args.paths!r}", field="--paths")
        if args.reps < 1 or args.steps_between < 2:
            raise InputError("--reps >= 1 and --steps-between >= 2", field="--reps")
        if not models and not args.records:
            raise InputError("nothing to measure or fit", field="--models")
        if args.out:
            check_output_file(args.out, "--out")
        earlier, inputs = [], []
        for f in filter(None, (args.records or "").split(",")):
            try:
                d = json.loads(Path(f).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise InputError(f"cannot read records: {e}", file=f, field="--records") from None
            earlier += d["records"] if isinstance(d, dict) else d
            if isinstance(d, dict) and "provenance" in d:
                inputs.append(d["provenance"])
    except InputError as e:
        print(f"bench_moves: {e}", file=sys.stderr)
        return 2
    records: list[dict] = list(earlier)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="arena-bench-moves-") as tmp:
        for model in models:
            for rep in range(args.reps):
                for path in paths:
                    log(f"{model} {path} rep {rep} (load average {os.getloadavg()[0]:.2f})")
                    records += run_chain(model, path, rep, args.steps_between, args.global_batch,
                                         Path(tmp) / f"{Path(model).stem}-{path}-{rep}", args.timeout)
    from estimators.move_cost import fit, held_out

    result = {"provenance": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
                                        f"{platform.system()} {platform.release()}",
                             "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
                             "command": " ".join(["python", "bench/bench_moves.py", *(argv or sys.argv[1:])]),
                             "wall_s": round(time.time() - t0, 1),
                             **({"records_measured_by": inputs} if inputs else {})},
              "summary": summarize(records), "records": records}
    result["params"] = fit(records).to_json()
    reps = {r.get("rep", 0) for r in records}
    if len(reps) > 1:
        result["held_out"] = held_out(records)
    if args.write_calibration:
        CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
        CALIBRATION.write_text(json.dumps({"params": result["params"], "provenance": result["provenance"],
                                           "held_out": result.get("held_out"), "summary": result["summary"]},
                                          indent=1) + "\n")
        log(f"wrote {CALIBRATION}")
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        print(text)
    else:
        for row in result["summary"]:
            print(json.dumps(row))
        if "held_out" in result:
            print(json.dumps(result["held_out"]["per_kind"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
