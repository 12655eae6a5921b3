"""What the status page's poll (``GET /api/state``) and ``GET /api/jobs`` cost with many
jobs that trained for a while.

A state database with ``--jobs`` finished jobs, each with one launch whose run folder
holds ``--steps`` result lines (what the ranks write: step, loss, time), in a temporary
folder. Timed, in one process, with every job listed (``?ended=N`` = all): the state
view on a fresh ``LossLog`` (the first poll after a start: every file parsed), then on
the same log again (every later poll: only what was appended is read; nothing was);
then, on the warm log, the page's default view (every job not ended and the 50 last
ended) and the jobs list. Prints the figures and the first poll over a later one.

    PYTHONPATH=. .venv/bin/python bench/bench_views.py [--jobs 200] [--steps 2000] [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(folder: Path, jobs: int, steps: int):
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    store = Store(str(folder / "state.db"))
    spec = JobSpec.from_dict({"name": "bench", "model": "tiny-gpt__2L", "global_batch": 8, "steps": steps})
    for i in range(jobs):
        jid = store.jobs.submit(spec)
        gen = store.launches.record_intent(jid, {"dp": 1, "tp": 1, "pp": 1}, [f"0:{i % 8}"])
        store.launches.mark(jid, gen, "started", pid_info={"pid": 1})
        store.jobs.set_status(jid, "running", "bench")
        run = folder / str(jid) / f"launch_{gen}"
        run.mkdir(parents=True)
        with open(run / "results.jsonl", "w") as f:
            for s in range(1, steps + 1):
                f.write(json.dumps({"step": s, "loss": 5.0 - s / steps, "iteration_time_s": 0.1, "time": s * 0.1})
                        + "\n")
        store.launches.mark(jid, gen, "finished")
        store.jobs.set_status(jid, "finished", "bench")
    return store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.jobs < 1 or args.steps < 1 or args.repeat < 1:
        ap.error("--jobs, --steps and --repeat must be >= 1")
    from engine.service.losses import LossLog
    from engine.service.views import jobs_view, state_view
    from instances.cluster import ClusterSpec, NodeGroup
    cluster = ClusterSpec((NodeGroup("cpu", 1, 8),), "bench-8")
    out: dict = {"jobs": args.jobs, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        store = build(folder, args.jobs, args.steps)
        print(f"built {args.jobs} jobs x {args.steps} steps in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

        def timed(fn) -> tuple[float, object]:
            t = time.perf_counter()
            res = fn()
            return time.perf_counter() - t, res

        first, later, default, listing = [], [], [], []
        size = 0
        for _ in range(args.repeat):
            log = LossLog()
            t, view = timed(lambda: state_view(store, tmp, cluster, losses=log, ended=args.jobs))
            first.append(t)
            size = len(json.dumps(view))
            later.append(timed(lambda: state_view(store, tmp, cluster, losses=log, ended=args.jobs))[0])
            default.append(timed(lambda: state_view(store, tmp, cluster, losses=log))[0])
            listing.append(timed(lambda: jobs_view(store, tmp, store.jobs.rows(), losses=log))[0])
        store.close()
    med = statistics.median
    out.update(state_first_poll_s=med(first), state_later_poll_s=med(later), state_default_view_s=med(default),
               jobs_list_s=med(listing), state_bytes_every_job=size, first_over_later=med(first) / med(later))
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
