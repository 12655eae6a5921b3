"""Overhead of one round of the live service with 50 queued jobs.

    python bench/bench_service_round.py [--jobs 50] [--slots 4] [--repeat 5]

Builds the service (SQLite store, journaled MPI executor, ``arena`` policy on a local
cluster of ``--slots`` CPU slots), submits ``--jobs`` tiny jobs to the store, and times
rounds through ``Service.step``: the first round adopts every submission, decides and
launches what fits (real mpiexec processes); the next rounds decide again with those
jobs running. Printed per round: wall time of the whole round, of the policy's decision
(context -> decisions), and of carrying it out with its journal (the rest). Every launch
is stopped (with a checkpoint) at the end.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5, help="rounds after the first (default 5)")
    a = p.parse_args(argv)

    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from estimators import make_performance_model
    from instances.cluster import ClusterSpec, NodeGroup

    cluster = ClusterSpec((NodeGroup("cpu", 1, a.slots),), f"local-{a.slots}")
    with tempfile.TemporaryDirectory(prefix="arena-bench-service-") as tmp:
        cfg = ServiceConfig(db_path=str(Path(tmp) / "state.db"), work_dir=str(Path(tmp) / "work"),
                            round_interval_s=60.0, stop_timeout_s=60.0)
        svc = Service(cluster, make_policy("arena"), make_performance_model("analytic"), ReconfigCostModel(), cfg,
                      log=lambda m: None)
        models = ("tiny-gpt__2L", "tiny-llama__4L", "tiny-moe__2L")
        for i in range(a.jobs):
            svc.store.submit(JobSpec(f"j{i}", models[i % len(models)], 8, 1000))
        svc.recover()
        rows = []
        try:
            for k in range(1 + a.repeat):
                t0 = time.perf_counter()
                rec = svc.step(time.time())
                total = time.perf_counter() - t0
                rows.append((k, total, rec.decision_time_s, total - rec.decision_time_s, rec.launches,
                             len(svc.loop.state.queued)))
                print(f"round {k}: {total * 1000:8.1f} ms (decide {rec.decision_time_s * 1000:7.1f} ms, carry out + "
                      f"journal {(total - rec.decision_time_s) * 1000:7.1f} ms), launches {rec.launches}, "
                      f"queued {len(svc.loop.state.queued)}", file=sys.stderr)
                time.sleep(0.5)
        finally:
            svc.shutdown()
        later = rows[1:]
        print(f"{a.jobs} jobs on {a.slots} slots: first round {rows[0][1] * 1000:.1f} ms "
              f"(decide {rows[0][2] * 1000:.1f}, carry out {rows[0][3] * 1000:.1f}, {rows[0][4]} launches); "
              f"later rounds median {statistics.median(r[1] for r in later) * 1000:.1f} ms "
              f"(decide {statistics.median(r[2] for r in later) * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
