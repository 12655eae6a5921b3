"""Measure the launcher on this machine: iteration time per plan, and the reconfiguration
time of a running job (stop + checkpoint + relaunch + reshard + first step) with where it
goes, and how fast a dead rank is reported.

    python -m launcher.bench --out results/launcher_bench.json [--model tiny-gpt__2L]

A benchmark, not a test: it launches one job per plan plus one executor scenario.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

PLANS = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 2), (1, 1, 2, 4))   # dp, tp, pp, microbatches


def _median_iter(times: tuple[float, ...]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def bench_plans(model: str, steps: int, batch: int, work: Path) -> list[dict]:
    from .api import run_training

    out = []
    for dp, tp, pp, mb in PLANS:
        r = run_training(model, dp, tp, pp, steps=steps, microbatches=mb, global_batch=batch,
                         run_dir=work / f"plan_{dp}{tp}{pp}_{mb}", breakdown=False, timeout_s=300)
        ready = next((e for e in r.events if e["event"] == "ready"), {})
        out.append({"dp": dp, "tp": tp, "pp": pp, "microbatches": mb, "ok": r.ok,
                    "median_iteration_s": _median_iter(r.iteration_times_s) if r.ok else None,
                    "first_iteration_s": r.iteration_times_s[0] if r.iteration_times_s else None,
                    "startup_s": ready.get("init_s"), "wall_s": r.wall_time_s})
        print(json.dumps(out[-1]), flush=True)
    return out


def bench_reconfiguration(model: str, batch: int, work: Path) -> dict:
    from instances.grid import Grid, Shape
    from instances.jobs import Job

    from .launch import rank_pids, read_events, read_results
    from .mpi_executor import MpiExecutor, MpiExecutorConfig

    class _Alloc:                       # structurally engine.core.allocation.Allocation
        def __init__(self, pp):
            self.grid = Grid(Shape("cpu", 1, 2), pp=pp)
            self.gpus = ((0, 0), (0, 1))

    class _Plan:
        def __init__(self, dp, tp, pp, mb):
            self.dp, self.tp, self.pp, self.microbatches, self.schedule = dp, tp, pp, mb, "1f1b"

    job = Job("bench", model, batch, 100_000, 0.0)
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(work / "executor"), checkpoint_every=0))
    try:
        ex.launch(job, _Alloc(1), _Plan(2, 1, 1, 1), ex.now_s())
        _wait(lambda: ex.progress("bench").iterations_done >= 20)
        old_dir = ex.run_dir("bench")
        t0 = time.time()
        ex.stop("bench", ex.now_s())
        t_stop = time.time()
        ex.launch(job, _Alloc(2), _Plan(1, 1, 2, 2), ex.now_s())
        new_dir = ex.run_dir("bench")
        _wait(lambda: read_results(new_dir))
        t_first = read_results(new_dir)[0]["time"]
        old_ev, new_ev = read_events(old_dir), read_events(new_dir)
        save = next(e for e in old_ev if e["event"] == "save")
        ready = next(e for e in new_ev if e["event"] == "ready")
        load = next(e for e in new_ev if e["event"] == "load")
        recon = {"from": "dp=2", "to": "pp=2 (2 micro-batches)", "total_s": t_first - t0,
                 "stop_s": t_stop - t0,
                 "of_which_until_saved_s": save["time"] - t0,
                 "of_which_checkpoint_save_s": save["duration_s"],
                 "of_which_exit_after_save_s": t_stop - save["time"],
                 "relaunch_to_ready_s": ready["time"] - t_stop,
                 "of_which_worker_init_s": ready["init_s"],
                 "of_init_python_torch_import_s": ready["import_s"],
                 "of_init_mpi_rendezvous_mesh_s": ready["rendezvous_s"],
                 "of_which_checkpoint_load_reshard_s": load["duration_s"],
                 "first_step_s": t_first - ready["time"],
                 "resumed_at_step": load["step"]}
        # failure detection: kill rank 1 of the running job
        _wait(lambda: ex.progress("bench").running and rank_pids(new_dir).get(1)
              and read_results(new_dir)[-1]["step"] > load["step"] + 5)
        pid, _ = rank_pids(new_dir)[1]
        tk = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        ev = ex.advance(ex.now_s() + 60)
        recon["failure_detect_s"] = time.monotonic() - tk if ev and ev[0].failed else None
        print(json.dumps(recon), flush=True)
        return recon
    finally:
        ex.close()


def _wait(pred, timeout_s: float = 300.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gpt__2L")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="arena-launcher-bench-"))
    res = {"model": args.model, "global_batch": args.global_batch, "steps": args.steps,
           "cpu_count": os.cpu_count(), "plans": bench_plans(args.model, args.steps, args.global_batch, work),
           "reconfiguration": bench_reconfiguration(args.model, args.global_batch, work)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
