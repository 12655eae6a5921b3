"""``arena serve`` with the local executor against ``arena serve --slurm``: what an operator
sees of a launch, a move and a service restart.

    nice python bench/bench_slurm_service.py --reps 2 --json > results/slurm-service.json

Per repetition and mode (``local``: ``--local-slots 1 --local-nodes 3``, ranks by mpiexec
on this host, moves device to device where they can; ``local-storage``: the same with
``--move-path storage``; ``slurm``: ``--slurm`` on the test cluster of tests/slurm_cluster.py, three
one-GPU nodes on this host, needs root and Debian's Slurm), one service (policy fcfs,
rounds every 2 s, a checkpoint at least every 5 s, 0.2 s per step added) and two one-slot
jobs (tiny-gpt__2L, batch 8):

1. **submit -> first step**: from the client's POST of each job to the first step in its
   run folder (``results.jsonl``'s ``time``);
2. **move decision -> first step**: ``arena drain`` of job A's node; from the round that
   moved it (the move ledger's ``at``) to the first step of A's new launch (through
   storage; on Slurm a new batch job on another node); a device-to-device move (the same
   ranks train on): the executor's own ``move_total_s`` (release request -> first step
   after it; the release follows the decision at once);
3. **service restart**: ``kill -9`` of the service while both jobs train, then a restart;
   per job: steps trained twice (``engine.service.scenario.steps_lost``: those past the
   checkpoint a relaunch resumed from), launches added, and the seconds without a step
   (the largest gap between two consecutive steps from the last step before the kill
   on; the ranks of a taken-over Slurm job train on while no service runs).

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.service.client import Client  # noqa: E402
from engine.service.scenario import ServiceProcess, free_port, steps_lost  # noqa: E402
from engine.service.store import Store  # noqa: E402
from engine.service.views import run_dirs  # noqa: E402
from launcher.launch import read_results  # noqa: E402

JOB = {"model": "tiny-gpt__2L", "global_batch": 8, "steps": 400, "gpus": 1}
STEPS_BEFORE = 8              # steps each job makes before the drain, and again before the kill


def say(msg: str) -> None:
    print(f"bench_slurm_service: {msg}", file=sys.stderr, flush=True)


def wait_for(pred, what: str, timeout_s: float = 300.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")


class Bench:
    def __init__(self, mode: str, tmp: Path, conf: str | None):
        self.mode, self.tmp = mode, tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        where = ["--slurm", "--slurm-conf", conf, "--slurm-tag", "bench"] if mode == "slurm" else \
            ["--local-slots", "1", "--local-nodes", "3"]
        if mode == "local-storage":
            where += ["--move-path", "storage"]
        self.args = where + ["--policy", "fcfs", "--db", str(tmp / "state.db"), "--work-dir", str(tmp / "work"),
                             "--port", str(self.port), "--round-interval", "2", "--checkpoint-interval", "5",
                             "--step-delay", "0.2", "--stop-timeout", "60", "--stop-after", "900"]
        self.client = Client(self.url, timeout_s=10.0)
        self.sp: ServiceProcess | None = None

    def start(self) -> None:
        self.sp = ServiceProcess(self.args, self.tmp / "serve.log", self.url)
        self.sp.start()
        self.sp.wait_healthy(180)

    def store(self) -> Store:
        return Store(str(self.tmp / "state.db"), readonly=True)

    def steps(self, jid: int) -> list[dict]:
        """Every step record of every launch of the job, in launch order."""
        with self.store() as st:
            launches = st.launches.rows(jid)
        return [r for _, d in run_dirs(str(self.tmp / "work"), launches) for r in read_results(d)]

    def latest(self, jid: int):
        with self.store() as st:
            ls = st.launches.rows(jid)
        return ls[-1] if ls else None


def one_run(mode: str, rep: int, conf: str | None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-slurm-service-{mode}-"))
    b = Bench(mode, tmp, conf)
    out: dict = {"mode": mode, "rep": rep}
    try:
        b.start()
        ids, submitted = {}, {}
        for name in ("a", "b"):
            submitted[name] = time.time()
            ids[name] = int(b.client.post("/api/jobs", {"name": name, **JOB})["id"])
        for name, jid in ids.items():
            wait_for(lambda: b.steps(jid), f"job {name}'s first step")
        out["submit_to_first_step_s"] = [b.steps(jid)[0]["time"] - submitted[n] for n, jid in ids.items()]
        wait_for(lambda: all(len(b.steps(j)) >= STEPS_BEFORE for j in ids.values()), "steps before the drain")

        # a move: drain job a's node; the fcfs round moves it to the free node
        a = ids["a"]
        gen = b.latest(a).generation
        node = int(b.latest(a).gpus[0].split(":")[0])
        b.client.post(f"/api/nodes/{node}/drain", {"reason": "bench"})
        moved = wait_for(lambda: (lch := b.latest(a)) and lch.generation > gen and lch.state == "started" and lch,
                         "job a moved")
        with b.store() as st:
            decided = st.moves.rows(a)[-1]["at"]
            how = next(h.reason for h in st.jobs.history(a) if h.reason.startswith(f"launch {moved.generation} on "))
        out["move_path"] = "device to device" if how.endswith("moved device to device") else "storage"
        if out["move_path"] == "storage":         # the new launch's own folder: its first step
            first = wait_for(lambda: read_results(moved.pid_info["run_dir"]), "a step after the move")[0]
            out["move_decision_to_first_step_s"] = first["time"] - decided
        else:                                     # the same ranks train on: the executor's own record below
            out["move_decision_to_first_step_s"] = None
        b.client.post(f"/api/nodes/{node}/undrain", {})

        # a service restart
        n0 = {j: len(b.steps(j)) for j in ids.values()}
        wait_for(lambda: all(len(b.steps(j)) >= n0[j] + STEPS_BEFORE for j in ids.values()), "steps before the kill")
        launches = {j: b.latest(j).generation for j in ids.values()}
        killed_at = time.time()
        b.sp.kill()
        b.start()
        healthy_at = time.time()
        wait_for(lambda: all([r for r in b.steps(j) if r["time"] > healthy_at + 1] for j in ids.values()),
                 "steps after the restart")
        out["restart_s"] = healthy_at - killed_at
        out["restart"] = {}
        with b.store() as st:
            for name, j in ids.items():
                times = [r["time"] for r in b.steps(j)]
                last_before = max(t for t in times if t <= killed_at)
                around = [t for t in times if t >= last_before]
                out["restart"][name] = {"steps_lost": steps_lost(str(tmp / "work"), j, st),
                                        "launches_added": b.latest(j).generation - launches[j],
                                        "longest_gap_without_a_step_s": max(y - x for x, y in zip(around,
                                                                                                   around[1:]))}
        with b.store() as st:           # the executor's own figure, where a round has recorded it by now
            m = [x.reconfig for x in st.launches.measurements(a) if "move_total_s" in x.reconfig]
        out["move_total_s"] = m[0]["move_total_s"] if m else None
        if out["move_decision_to_first_step_s"] is None:
            out["move_decision_to_first_step_s"] = out["move_total_s"]
        b.sp.terminate()
        return out
    finally:
        if b.sp is not None:
            b.sp.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


def summary(rows: list[dict]) -> dict:
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode and "failed" not in r]

        def stat(values):
            values = [v for v in values if v is not None]
            return {"median": statistics.median(values), "min": min(values), "max": max(values),
                    "n": len(values)} if values else None
        out[mode] = {
            "failed_runs": sum(1 for r in rows if r["mode"] == mode and "failed" in r),
            "submit_to_first_step_s": stat([v for r in mine for v in r["submit_to_first_step_s"]]),
            "move_decision_to_first_step_s": stat([r["move_decision_to_first_step_s"] for r in mine]),
            "move_total_s": stat([r["move_total_s"] for r in mine]),
            "restart_s": stat([r["restart_s"] for r in mine]),
            "steps_lost_per_job_at_restart": stat([j["steps_lost"] for r in mine for j in r["restart"].values()]),
            "launches_added_per_job_at_restart": stat([j["launches_added"] for r in mine
                                                       for j in r["restart"].values()]),
            "longest_gap_without_a_step_s": stat([j["longest_gap_without_a_step_s"] for r in mine
                                                  for j in r["restart"].values()]),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--modes", default="local,local-storage,slurm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    modes = args.modes.split(",")
    cluster = None
    if "slurm" in modes:
        from tests.slurm_cluster import NodeDef, SlurmCluster, unavailable
        why = unavailable()
        if why:
            print(f"bench_slurm_service: error: {why}", file=sys.stderr)
            return 2
        cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="arena-slurm-", dir="/tmp")),
                               nodes=tuple(NodeDef(f"n{i}", gpus=1) for i in (1, 2, 3))).start()
        say(f"started Slurm cluster {cluster.name} in {cluster.startup_s:.2f} s")
    rows = []
    loads = []
    try:
        for rep in range(args.reps):
            for mode in modes:
                try:
                    row = one_run(mode, rep, str(cluster.conf) if cluster else None)
                except (RuntimeError, TimeoutError) as e:
                    say(f"{mode} rep {rep}: {e}")
                    rows.append({"mode": mode, "rep": rep, "failed": str(e)[:500]})
                    if cluster is not None:
                        cluster.cancel_all_jobs()
                    continue
                loads.append(os.getloadavg()[0])
                say(json.dumps(row))
                rows.append(row)
                if cluster is not None:
                    cluster.cancel_all_jobs()
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
    result = {"job": JOB, "reps": args.reps, "host": platform.node(), "cpus": os.cpu_count(),
              "load_avg_1min_after_each_run": loads, "commit": commit, "summary": summary(rows), "runs": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for mode, s in result["summary"].items():
            print(f"{mode:6s} failed runs: {s['failed_runs']}")
            for k, v in s.items():
                if isinstance(v, dict):
                    print(f"{mode:6s} {k:36s} median {v['median']:7.2f}  min {v['min']:7.2f}  max {v['max']:7.2f}"
                          f"  (n={v['n']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
