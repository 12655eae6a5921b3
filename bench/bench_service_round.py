"""Overhead of one round of the live service with 50, 1,000 and 10,000 queued jobs.

    python bench/bench_service_round.py [--jobs 50 1000 10000] [--slots 4] [--repeat 5]
                                        [--policy-opt KEY=VALUE ...] [--json]

For each queue size: builds the service (SQLite store, journaled MPI executor, ``arena``
policy on a local cluster of ``--slots`` CPU slots), stores that many tiny jobs, starts
the service on them (recovery adopts every queued job), then times rounds through
``Service.step``: the first round decides and launches what fits (real mpiexec
processes); before each of the next ``--repeat`` rounds one more job is submitted, so the
round adopts it and decides again with every other job still queued. Each round is
split into its parts (``Service.round_parts``): adopt/store (the executor polled, the
store's requests read and carried out, submissions adopted), decide (the policy), record
(the decision committed), carry out (context, placement, stops and launches with their
journal, invariants; the move ledger stored). Also timed: storing the jobs, the
recovery that adopts them, and the check the idle loop makes every poll
(``Service.due``): the first poll after the last round, and the median of the next five
(the store unchanged). Every launch is stopped (with a checkpoint) at the end.
Progress on stderr; the table (or ``--json``) on stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODELS = ("tiny-gpt__2L", "tiny-llama__4L", "tiny-moe__2L")
PARTS = ("adopt_s", "decide_s", "record_s", "carry_s")


def bench(n_jobs: int, slots: int, repeat: int, policy_opts: dict) -> dict:
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from estimators import make_performance_model
    from instances.cluster import ClusterSpec, NodeGroup

    cluster = ClusterSpec((NodeGroup("cpu", 1, slots),), f"local-{slots}")
    out: dict = {"jobs": n_jobs, "slots": slots}
    with tempfile.TemporaryDirectory(prefix="arena-bench-service-") as tmp:
        cfg = ServiceConfig(db_path=str(Path(tmp) / "state.db"), work_dir=str(Path(tmp) / "work"),
                            round_interval_s=60.0, stop_timeout_s=60.0)
        svc = Service(cluster, make_policy("arena", **policy_opts), make_performance_model("analytic"),
                      ReconfigCostModel(), cfg,
                      log=lambda m: None)
        t0 = time.perf_counter()
        for i in range(n_jobs):
            svc.store.jobs.submit(JobSpec(f"j{i}", MODELS[i % len(MODELS)], 8, 1000))
        out["store_jobs_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        svc.recover()
        out["recover_s"] = time.perf_counter() - t0
        print(f"{n_jobs} jobs: stored in {out['store_jobs_s']:.1f} s, adopted by recovery in {out['recover_s']:.2f} s",
              file=sys.stderr, flush=True)
        rounds = []
        try:
            for k in range(1 + repeat):
                if k:
                    svc.store.jobs.submit(JobSpec(f"new{k}", MODELS[k % len(MODELS)], 8, 1000))
                t0 = time.perf_counter()
                rec = svc.step(time.time())
                total = time.perf_counter() - t0
                parts = dict(svc.round_parts)
                rounds.append({"round": k, "total_s": total, **parts, "launches": rec.launches,
                               "queued": len(svc.loop.state.queued), "running": len(svc.loop.state.running)})
                print(f"  round {k}: {total * 1000:8.1f} ms = " + ", ".join(
                    f"{p.removesuffix('_s')} {parts[p] * 1000:.1f}" for p in PARTS)
                    + f" ms; launches {rec.launches}, queued {len(svc.loop.state.queued)}", file=sys.stderr, flush=True)
                time.sleep(0.5)
            polls = []                          # past the rounds' minimum gap: every check is made
            for _ in range(6):
                now = time.time() + svc.cfg.min_round_gap_s     # past the gap since the last round
                t0 = time.perf_counter()
                svc.due(now)
                polls.append(time.perf_counter() - t0)
            out["idle_poll_first_s"], out["idle_poll_s"] = polls[0], statistics.median(polls[1:])
        finally:
            svc.shutdown()
    out["first"] = rounds[0]
    later = rounds[1:]
    out["later_median"] = {k: statistics.median(r[k] for r in later) for k in ("total_s", *PARTS)} if later else None
    out["rounds"] = rounds
    return out


def table(results: list[dict]) -> str:
    head = (f"{'queued':>7}  {'store s':>7}  {'recover s':>9}  {'round':<12} {'total ms':>9} {'adopt':>8} "
            f"{'decide':>8} {'record':>8} {'carry':>8}  {'idle poll ms: first, next':>25}")
    lines = [head, "-" * len(head)]
    for r in results:
        for i, (label, row) in enumerate((("first", r["first"]), ("later median", r["later_median"]))):
            if row is None:
                continue
            pre = (f"{r['jobs']:>7}  {r['store_jobs_s']:>7.1f}  {r['recover_s']:>9.2f}  " if i == 0
                   else f"{'':>7}  {'':>7}  {'':>9}  ")
            lines.append(pre + f"{label:<12} {row['total_s'] * 1000:>9.1f} " + " ".join(
                f"{row[p] * 1000:>8.1f}" for p in PARTS)
                + (f"  {r['idle_poll_first_s'] * 1000:>18.1f}, {r['idle_poll_s'] * 1000:>4.1f}" if i == 0 else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[50, 1000, 10000], metavar="N",
                   help="queue sizes (default 50 1000 10000)")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5, help="rounds after the first (default 5)")
    p.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the arena policy (repeatable), e.g. max_queued=1000")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if any(n < 1 for n in a.jobs) or a.slots < 1 or a.repeat < 1:
        p.error("--jobs, --slots and --repeat must be >= 1")
    from engine.cli.commands.simulate import parse_options
    opts = parse_options(a.policy_opt, "--policy-opt")
    results = [bench(n, a.slots, a.repeat, opts) for n in a.jobs]
    print(json.dumps(results, indent=1) if a.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
