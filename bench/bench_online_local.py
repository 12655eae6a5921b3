"""Online profiling with real launcher runs on this machine (mpiexec, gloo, CPU ranks).

A tiny catalog model is trained by ``MpiExecutor`` on each of a few plans (grids of
``cpu`` ranks). While a run goes, its progress is read as the round loop reads it and
handed to ``OnlineFeed`` once the launcher reports ``--iterations`` measured iterations
(the warm-up step excluded); the run then continues, and its later steps are that grid's
held-out truth. Afterwards, for every observed grid, a fresh ``online`` model that saw
only that grid's first measured iterations estimates its own grid and every other plan;
each estimate is compared with the other run's measured mean iteration time (all its
steps after the warm-up; for its own grid: the steps after the observed ones). The base
model's error on the same pairs is printed alongside. ``--passes`` repeats every run and
reports each pair's median over the passes.

    PYTHONPATH=. .venv/bin/python bench/bench_online_local.py [--model tiny-gpt__4L] \
        [--iterations 20] [--later 20] [--batch 8] [--passes 3] [--base analytic|local-runtime] [--json]

``--base local-runtime``: before each pass the model is profiled into a fresh store and
the launcher's runtime terms are measured (``LocalRuntimeModel``, about 20 s); that base
counts as calibrated on this device.

The host is shared (2 cores): run-to-run drift is part of what the figures show.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from engine.core.allocation import Allocation
from engine.core.online_feed import OnlineFeed
from estimators import make_performance_model
from estimators.online import OnlineModel
from instances.grid import Grid, Shape
from instances.jobs import Job
from launcher.launch import read_results
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig

GRIDS = (Grid(Shape("cpu", 1, 1), 1), Grid(Shape("cpu", 1, 2), 1), Grid(Shape("cpu", 1, 2), 2))
JOB_ID = "local"


def run_plan(base, job: Job, grid: Grid, iterations: int, work: str, calibrated=None, timeout_s: float = 600.0):
    """Run ``job`` on ``grid`` (the base model's proxy plan); returns (the online model fed
    after ``iterations`` measured iterations, per-step times after the warm-up step)."""
    online = OnlineModel(base=base, calibrated_types=calibrated)
    feed = OnlineFeed(online)
    s = grid.shape
    alloc = Allocation(grid, tuple((0, i) for i in range(s.num_gpus)))
    plan = base.estimate(job, grid).plan
    ex = MpiExecutor(MpiExecutorConfig(work_dir=work, checkpoint_every=0, checkpoint_interval_s=0.0))
    ex.launch(job, alloc, plan, 0.0)
    fed = False
    t0 = time.monotonic()
    try:
        while True:
            p = ex.progress(job.job_id)
            if not fed and p.measured_iterations >= iterations:
                feed.report(job, alloc, p)
                fed = True
            if p.failed:
                raise RuntimeError(f"run on {grid} failed: {p.failed}")
            if not p.running and p.finished:
                break
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"run on {grid} did not finish in {timeout_s} s")
            time.sleep(0.05)
        steps = [r["iteration_time_s"] for r in sorted(read_results(ex.run_dir(job.job_id)), key=lambda r: r["step"])]
    finally:
        ex.close()
    if not fed:
        raise RuntimeError(f"run on {grid} ended before {iterations} measured iterations were reported")
    return online, steps[1:]


NUMBERS = ("truth_s", "online_s", "online_err", "base_s", "base_err", "observed_mean_s")


def compare(job: Job, base, runs: dict, iterations: int) -> list[dict]:
    """Every (observed grid, estimated grid) pair of one pass of runs."""
    out = []
    for g_obs, (online, steps_obs) in runs.items():
        for g, (_, steps) in runs.items():
            own = g == g_obs
            truth = statistics.fmean(steps[iterations:] if own else steps)
            est = online.estimate(job, g).iteration_time_s
            b = base.estimate(job, g).iteration_time_s
            out.append({"observed": str(g_obs), "estimated": str(g), "own": own, "truth_s": truth,
                        "online_s": est, "online_err": est / truth - 1, "base_s": b, "base_err": b / truth - 1,
                        "observed_mean_s": statistics.fmean(steps_obs[:iterations])})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-gpt__4L")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20, help="measured iterations fed before estimating")
    ap.add_argument("--later", type=int, default=20, help="further steps per run: the own grid's held-out truth")
    ap.add_argument("--base", default="analytic",
                    help="the online model's base: a performance model kind (analytic: catalog specs), or "
                         "local-runtime: this host profiled into a fresh store and the launcher's runtime terms "
                         "measured at 1 and 2 ranks first (estimators/evaluation/local_accuracy.py)")
    ap.add_argument("--passes", type=int, default=1, help="repeat every run; per pair, the median over passes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.iterations < 1 or a.later < 1 or a.passes < 1:
        ap.error("--iterations, --later and --passes must be >= 1")
    job = Job(JOB_ID, a.model, a.batch, 1 + a.iterations + a.later, 0.0)
    return _run(a, job)


def _base(a, job: Job, store_dir: str):
    """(base model, the GPU types whose base estimates are calibrated: None for the default)."""
    if a.base != "local-runtime":
        return make_performance_model(a.base), None
    from estimators.compose import micro_batch_size
    from estimators.evaluation.local_accuracy import LocalRuntimeModel, profile_local_runtime
    from estimators.profile_store import ProfileStore
    t = time.perf_counter()
    mbs = {micro_batch_size(job.global_batch, g.shape.num_gpus // g.pp, 4 if g.pp > 1 else 1) for g in GRIDS} \
        | {micro_batch_size(job.global_batch, 1, 4 if g.pp > 1 else 1) for g in GRIDS}
    rt = profile_local_runtime(job.model, job.global_batch, {g.shape.num_gpus for g in GRIDS}, ProfileStore(store_dir),
                               micro_batches=mbs)
    print(f"  profiled {job.model} and the runtime terms at {sorted(rt.terms)} ranks: "
          f"{time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return LocalRuntimeModel(rt), frozenset({rt.device})    # profiled just before: calibrated on this device


def _run(a, job: Job) -> int:
    passes = []
    for k in range(a.passes):
        runs = {}
        with tempfile.TemporaryDirectory(prefix="arena-online-profile-") as store_dir:   # a fresh profile per pass
            base, calibrated = _base(a, job, store_dir)
            for g in GRIDS:
                with tempfile.TemporaryDirectory(prefix="arena-online-") as work:
                    t = time.perf_counter()
                    runs[g] = run_plan(base, job, g, a.iterations, work, calibrated)
                    print(f"  pass {k + 1}: ran {g}: {len(runs[g][1])} timed steps, {time.perf_counter() - t:.0f} s",
                          file=sys.stderr, flush=True)
            passes.append(compare(job, base, runs, a.iterations))
    out = [{**p0, **{f: statistics.median(p[i][f] for p in passes) for f in NUMBERS}, "passes": a.passes}
           for i, p0 in enumerate(passes[0])]
    if a.json:
        print(json.dumps({"model": a.model, "batch": a.batch, "iterations": a.iterations, "passes": a.passes,
                          "pairs": out}, indent=1))
        return 0
    print(f"{a.model} batch {a.batch}: online({a.base}) after {a.iterations} measured iterations vs real runs "
          f"(median over {a.passes} pass(es))")
    print(f"{'observed on':<18} {'estimated for':<18} {'truth s':>8} {'online s':>9} {'error':>7} {'base s':>8} "
          f"{'base err':>8}")
    for r in out:
        print(f"{r['observed']:<18} {r['estimated']:<18} {r['truth_s']:>8.4f} {r['online_s']:>9.4f} "
              f"{r['online_err']:>+7.1%} {r['base_s']:>8.4f} {r['base_err']:>+8.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
