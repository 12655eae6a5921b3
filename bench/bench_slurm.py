"""Measure what Slurm adds to a launch and to a move: the same job through the local
``MpiExecutor`` (mpiexec on this host) and through ``SlurmExecutor`` on a Slurm cluster.

    python bench/bench_slurm.py --reps 3 --json > results/slurm.json
    python bench/bench_slurm.py --slurm-conf /etc/slurm/slurm.conf --nodes n1,n2   # an existing cluster

Without ``--slurm-conf`` it starts the test cluster of tests/slurm_cluster.py (three
slurmd on this host, needs root and Debian's Slurm) and stops it at the end. Per
repetition and executor, one job (tiny-gpt__2L, two ranks, one per node on Slurm):

1. launch dp=2: seconds from ``launch`` to the first step (and, on Slurm, from ``sbatch``
   to the ranks' processes starting, from the ``ready`` event);
2. after a few steps, a move to pp=2 on the same ranks, device to device (on Slurm inside
   the running job); then a move to dp=2 elsewhere through storage (Slurm: both ranks on
   the second node, a new batch job; locally: a stop and a relaunch on this host). Each
   move's seconds from its request to the first step after it (``move_records``'s
   ``total_s``), with its parts.

Progress goes to stderr; ``--json`` prints only the JSON result on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from estimators.base import Plan  # noqa: E402
from instances.grid import Grid, Shape  # noqa: E402
from instances.jobs import Job  # noqa: E402
from instances.slurm import SlurmCommands, discover  # noqa: E402
from launcher.launch import read_events, read_results  # noqa: E402
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig  # noqa: E402
from launcher.slurm_executor import SlurmExecutor, SlurmExecutorConfig  # noqa: E402

MODEL = "tiny-gpt__2L"
DP2 = Plan(pp=1, dp=2, tp=1, stage_layers=(4,))
PP2 = Plan(pp=2, dp=1, tp=1, stage_layers=(2, 2), microbatches=2)


class Alloc:                                  # structurally engine.core.allocation.Allocation
    def __init__(self, gpu_type: str, placed: tuple[tuple[int, int], ...], pp: int = 1):
        nodes = sorted({n for n, _ in placed})
        self.grid = Grid(Shape(gpu_type, len(nodes), len(placed) // len(nodes)), pp=pp)
        self.gpus = placed


def say(msg: str) -> None:
    print(f"bench_slurm: {msg}", file=sys.stderr, flush=True)


def wait_steps(ex, job_id: str, n: int, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while len(read_results(ex.run_dir(job_id))) < n:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{job_id}: fewer than {n} steps after {timeout_s} s")
        p = ex.progress(job_id)
        if p.failed or p.finished:
            raise RuntimeError(f"{job_id}: the run ended early: {p.failed or 'finished'}")
        time.sleep(0.05)


def _launch_tail(ex, job_id: str) -> str:
    try:
        return (Path(ex.run_dir(job_id)) / "stderr.log").read_text(errors="replace")[-1500:]
    except (KeyError, OSError):
        return ""


def one_run(ex, kind: str, rep: int, allocs: dict, steps_between: int) -> dict:
    job = Job(f"{kind}{rep}", MODEL, 8, 10_000, 0.0)
    t0 = time.time()
    ex.launch(job, allocs["start"], DP2, ex.now_s())
    wait_steps(ex, job.job_id, 1)
    first = read_results(ex.run_dir(job.job_id))[0]["time"]
    ready = next(e for e in read_events(ex.run_dir(job.job_id)) if e["event"] == "ready")
    out = {"executor": kind, "rep": rep, "launch_to_first_step_s": first - t0,
           "launch_to_ranks_started_s": ready["time"] - ready["init_s"] - t0, "rank_init_s": ready["init_s"]}
    wait_steps(ex, job.job_id, steps_between)
    ex.reconfigure(job.job_id, allocs["d2d"], PP2, ex.now_s())              # same ranks: device to device
    n = len(read_results(ex.run_dir(job.job_id)))
    wait_steps(ex, job.job_id, n + steps_between)
    if kind == "local":
        ex.config = replace(ex.config, move_path="storage")    # this move through storage, as on Slurm
    ex.reconfigure(job.job_id, allocs["storage"], DP2, ex.now_s())
    wait_steps(ex, job.job_id, steps_between)
    if kind == "local":
        ex.config = replace(ex.config, move_path="d2d")
    deadline = time.monotonic() + 60
    while any(m["total_s"] is None for m in ex.move_records(job.job_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    moves = ex.move_records(job.job_id)
    ex.stop(job.job_id, ex.now_s())
    for m in moves:
        key = "d2d" if m["path"] == "d2d" else "storage"
        out[f"{key}_move_s"] = m["total_s"]
        out[f"{key}_move_parts"] = {k: m.get(k) for k in ("drain_stop_s", "state_s", "startup_s", "first_step_s",
                                                          "other_s")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps-between", type=int, default=6)
    ap.add_argument("--slurm-conf", default=None, help="an existing cluster's slurm.conf (default: start one here)")
    ap.add_argument("--nodes", default="n1,n2", help="two GPU nodes of the cluster (comma-separated)")
    ap.add_argument("--partition", default=None)
    ap.add_argument("--work-dir", default=None, help="shared work folder (default: a temporary one)")
    ap.add_argument("--launchers", default="mpiexec",
                    help="how Slurm launches start their ranks, comma-separated: mpiexec (Hydra), srun (--mpi=pmi2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    cluster = None
    if args.slurm_conf is None:
        from tests.slurm_cluster import SlurmCluster, unavailable
        why = unavailable()
        if why:
            print(f"bench_slurm: error: {why}", file=sys.stderr)
            return 2
        cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="arena-slurm-", dir="/tmp"))).start()
        say(f"started Slurm cluster {cluster.name} in {cluster.startup_s:.2f} s")
        conf = str(cluster.conf)
    else:
        conf = args.slurm_conf
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-slurm-"))
    rows = []
    try:
        view = discover(SlurmCommands(conf), args.partition)
        ids = {name: i for i, name in view.node_names().items()}
        a, b = (ids[n] for n in args.nodes.split(","))
        gtype = view.node(args.nodes.split(",")[0]).gpu_type
        base = dict(checkpoint_every=0, checkpoint_interval_s=0, stop_timeout_s=60)
        executors: dict = {"local": MpiExecutor(MpiExecutorConfig(work_dir=str(work / "local"), **base))}
        for launcher in args.launchers.split(","):
            executors[f"slurm-{launcher}"] = SlurmExecutor(
                MpiExecutorConfig(work_dir=str(work / launcher), **base),
                SlurmExecutorConfig(nodes=view.node_names(), gres=view.launch_gres(), conf=conf, launcher=launcher,
                                    partition=args.partition, tag="bench", poll_s=0.5))
        on_slurm = {"start": Alloc(gtype, ((a, 0), (b, 0))), "d2d": Alloc(gtype, ((a, 0), (b, 0)), pp=2),
                    "storage": Alloc(gtype, ((b, 0), (b, 1)))}
        local = {"start": Alloc("cpu", ((0, 0), (0, 1))), "d2d": Alloc("cpu", ((0, 0), (0, 1)), pp=2),
                 "storage": Alloc("cpu", ((0, 0), (0, 1)))}
        for rep in range(args.reps):
            for kind, ex in executors.items():
                try:
                    row = one_run(ex, kind, rep, local if kind == "local" else on_slurm, args.steps_between)
                except RuntimeError as e:           # a launch that failed: counted, not measured
                    jid = f"{kind}{rep}"
                    err = _launch_tail(ex, jid)
                    say(f"{kind} rep {rep}: {e}\n{err}")
                    rows.append({"executor": kind, "rep": rep, "failed": str(e)[:500], "stderr_tail": err})
                    ex.close()                      # nothing of it left holding nodes
                    continue
                say(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()
                                if not isinstance(v, dict)}))
                rows.append(row)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for kind in dict.fromkeys(r["executor"] for r in rows):
        mine = [r for r in rows if r["executor"] == kind and "failed" not in r]
        failed = sum(1 for r in rows if r["executor"] == kind and "failed" in r)
        if not mine:
            summary[kind] = {"failed_runs": failed}
            continue
        stats = {k: {"median": statistics.median(r[k] for r in mine), "min": min(r[k] for r in mine),
                     "max": max(r[k] for r in mine)}
                 for k in ("launch_to_first_step_s", "launch_to_ranks_started_s", "rank_init_s", "d2d_move_s",
                           "storage_move_s") if all(k in r for r in mine)}
        summary[kind] = {"failed_runs": failed, **stats}
    result = {"model": MODEL, "reps": args.reps, "host": platform.node(), "cpus": os.cpu_count(),
              "load_avg_at_end": os.getloadavg(), "commit": commit, "summary": summary, "runs": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for kind, s in summary.items():
            print(f"{kind:14s} failed runs: {s['failed_runs']}")
            for k, v in s.items():
                if not isinstance(v, dict):
                    continue
                print(f"{kind:14s} {k:28s} median {v['median']:7.2f}  min {v['min']:7.2f}  max {v['max']:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
