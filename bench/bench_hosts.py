"""Across hosts, measured on the test hosts (``tests/hosts.py``: network namespaces on a
bridge, each with its own address, host name and sshd; needs root): the figures of
docs/results/2026-12-06-across-hosts.md.

- ``moves``: move decision -> first step after it (``MpiExecutor.reconfigure`` of a
  running one-rank job of ``tiny-gpt__2L``), and the longest time without a step around
  the move, on five paths: device to device on one host (in place; and growing to two
  ranks, a new process), device to device between two namespaces (new processes on the
  other host), through storage on one host and between two namespaces;
- ``across``: a job data-parallel over two hosts, off Slurm (mpiexec over ssh) and on
  Slurm (one slurmd per host), its losses against the one-process run;
- ``restart``: ``arena serve`` with a job on each of three hosts (and, to compare, the
  same on one host, ``--local-slots``), SIGKILLed and started again: launches added,
  steps trained twice, the longest time without a step of any job;
- ``cut``: ``arena serve`` with a job on one of three hosts whose link is taken down: time
  until the service has it out of service, until the job trains again elsewhere, steps
  trained twice (lost).

    sudo .venv/bin/python bench/bench_hosts.py [--repeats 3] [--only moves,across,restart,cut] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from instances.allocation import Allocation  # noqa: E402
from instances.grid import Grid, Shape  # noqa: E402
from instances.jobs import Job  # noqa: E402
from launcher.config import ParallelPlan  # noqa: E402
from launcher.launch import read_results  # noqa: E402
from tests.test_engine_helpers import wait_until  # noqa: E402

MODEL = "tiny-gpt__2L"
STEP_DELAY_S = 0.05


def on(*nodes: int, per: int = 1) -> Allocation:
    return Allocation(Grid(Shape("cpu", len(nodes), per)), tuple((n, i) for n in nodes for i in range(per)))


def wait_for(pred, what: str, timeout_s: float = 180.0, poll_s: float = 0.1):
    return wait_until(pred, timeout_s, what, poll_s)


def step_times(dirs) -> dict[int, float]:
    """Step -> the time it was recorded, the last launch's where steps were trained twice."""
    out: dict[int, float] = {}
    for d in dirs:
        out.update({r["step"]: r["time"] for r in read_results(d)})
    return out


def longest_gap(times: dict[int, float], after: float) -> float:
    """The longest time between two consecutive steps, counted from the last step before
    ``after`` (a wall time)."""
    ts = sorted(times.values())
    before = [t for t in ts if t <= after]
    ts = ([before[-1]] if before else []) + [t for t in ts if t > after]
    return max((b - a for a, b in zip(ts, ts[1:])), default=float("nan"))


# --- moves --------------------------------------------------------------------------------------------
PATHS = (  # name, hosts (None: one host), move path, from, to, new plan
    ("device to device, one host (in place)", False, "d2d", on(0), on(1), ParallelPlan(dp=1)),
    ("device to device, one host (grow to 2 ranks: a new process)", False, "d2d", on(0), on(0, 1),
     ParallelPlan(dp=2)),
    ("device to device, between two namespaces", True, "d2d", on(0), on(1), ParallelPlan(dp=1)),
    ("through storage, one host", False, "storage", on(0), on(1), ParallelPlan(dp=1)),
    ("through storage, between two namespaces", True, "storage", on(0), on(1), ParallelPlan(dp=1)),
)


def one_move(hosts, across: bool, path: str, src, dst, plan) -> dict:
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
    with tempfile.TemporaryDirectory(prefix="arena-bench-hosts-") as work:
        node_hosts = {i: h.addr for i, h in enumerate(hosts.hosts)} if across else {}
        ex = MpiExecutor(MpiExecutorConfig(work_dir=work, node_hosts=node_hosts, checkpoint_every=0,
                                           checkpoint_interval_s=0, step_delay_s=STEP_DELAY_S, move_path=path,
                                           stop_timeout_s=60))
        job = Job("m", MODEL, 8, 100_000, 0.0)
        try:
            ex.launch(job, src, ParallelPlan(dp=1), 0.0)
            wait_for(lambda: ex.progress("m").iterations_done >= 20, "the job training")
            t0 = time.time()
            ex.reconfigure("m", dst, plan, 0.0)
            at = ex.progress("m").iterations_done
            wait_for(lambda: ex.progress("m").iterations_done >= at + 10, "steps after the move")
            rec = ex.move_records("m")[-1]
            dirs = sorted({str(Path(work) / "m" / d) for d in os.listdir(Path(work) / "m") if d.startswith("launch_")})
            times = step_times(dirs)
            steady = statistics.median(b - a for a, b in zip(sorted(times.values())[:15], sorted(times.values())[1:16]))
            return {"path": rec["path"], "total_s": rec["total_s"], "gap_s": longest_gap(times, t0),
                    "step_s": steady, "bytes_moved": rec["bytes_moved"]}
        finally:
            ex.close()


def moves(hosts, repeats: int) -> list[dict]:
    rows = []
    for name, across, path, src, dst, plan in PATHS:
        runs = [one_move(hosts, across, path, src, dst, plan) for _ in range(repeats)]
        rows.append({"path": name, "taken": sorted({r["path"] for r in runs}),
                     "total_s": [round(r["total_s"], 2) for r in runs],
                     "median_total_s": round(statistics.median(r["total_s"] for r in runs), 2),
                     "gap_s": [round(r["gap_s"], 2) for r in runs],
                     "median_gap_s": round(statistics.median(r["gap_s"] for r in runs), 2),
                     "step_s": round(statistics.median(r["step_s"] for r in runs), 3),
                     "bytes_moved": runs[0]["bytes_moved"]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


# --- a job across hosts ----------------------------------------------------------------------------
def across(hosts, steps: int = 30) -> list[dict]:
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
    from launcher.reference import train_reference
    ref = train_reference(MODEL, steps=steps, global_batch=8, seed=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="arena-bench-hosts-") as work:
        ex = MpiExecutor(MpiExecutorConfig(work_dir=work, node_hosts={i: h.addr for i, h in enumerate(hosts.hosts)}))
        job = Job("a", MODEL, 8, steps, 0.0)
        try:
            ex.launch(job, on(0, 1), ParallelPlan(dp=2), 0.0)
            wait_for(lambda: ex.advance(ex.now_s() + 1), "the job finished")
        finally:
            ex.close()
        got = {r["step"]: r["loss"] for r in read_results(Path(work) / "a" / "launch_0")}
        rows.append({"where": "off Slurm: mpiexec over ssh, 2 namespaces", "steps": len(got),
                     "max_loss_diff": max(abs(got[i + 1] - ref[i]) for i in range(steps))})
    from tests.slurm_cluster import NodeDef, started_cluster, unavailable
    if unavailable():
        rows.append({"where": "on Slurm", "skipped": unavailable()})
        return rows
    from instances.slurm import SlurmCommands, discover
    from launcher.slurm_executor import SlurmExecutor, SlurmExecutorConfig
    ssh = os.environ.pop("HYDRA_LAUNCHER_EXEC", None)     # (in a Slurm job Hydra starts its proxies with srun)
    with tempfile.TemporaryDirectory(prefix="arena-bench-hosts-") as work, \
            started_cluster((NodeDef("n1", cpus=2), NodeDef("n2", cpus=2)), hosts=hosts) as cluster:
        v = discover(SlurmCommands(str(cluster.conf)))
        ex = SlurmExecutor(MpiExecutorConfig(work_dir=work), SlurmExecutorConfig(
            nodes=v.node_names(), gres=v.launch_gres(), conf=str(cluster.conf), tag="bench", poll_s=0.5))
        try:
            ex.launch(job, on(0, 1), ParallelPlan(dp=2), 0.0)
            wait_for(lambda: ex.advance(ex.now_s() + 1), "the Slurm job finished")
        except AssertionError:
            run = Path(work) / "a" / "launch_0"
            logs = [f"--- {f}\n{(run / f).read_text()[-3000:]}" for f in ("stdout.log", "stderr.log")
                    if (run / f).exists()]
            print(cluster.log_tails(), *logs, sep="\n", file=sys.stderr)
            raise
        finally:
            ex.close()
            cluster.cancel_all_jobs()
        got = {r["step"]: r["loss"] for r in read_results(Path(work) / "a" / "launch_0")}
        rows.append({"where": "on Slurm: one slurmd per namespace, 2 nodes", "steps": len(got),
                     "max_loss_diff": max(abs(got[i + 1] - ref[i]) for i in range(steps))})
    if ssh is not None:
        os.environ["HYDRA_LAUNCHER_EXEC"] = ssh
    return rows


# --- the service: kill -9 and a host cut off ------------------------------------------------------------
class Service:
    def __init__(self, tmp: Path, args: list[str]):
        from engine.service.client import Client
        from engine.service.scenario import ServiceProcess, free_port
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = Client(self.url, timeout_s=10.0)
        self.sp = ServiceProcess([*args, "--policy", "fcfs", "--db", str(tmp / "state.db"), "--work-dir",
                                  str(tmp / "work"), "--port", str(self.port), "--round-interval", "2",
                                  "--step-delay", str(STEP_DELAY_S * 2), "--failure-backoff", "0",
                                  "--stop-after", "900"], tmp / "serve.log", self.url)
        self.ids: list[int] = []

    def start(self) -> None:
        self.sp.start()
        self.sp.wait_healthy(120)

    def submit(self, n: int, steps: int) -> None:
        for i in range(n):
            self.ids.append(int(self.client.post("/api/jobs", {"name": f"j{i}", "model": MODEL, "global_batch": 8,
                                                                "steps": steps, "gpus": 1, "gpu_type": "cpu"},
                                                 key=f"b{i}")["id"]))

    def launches(self, jid: int):
        from engine.service.store import Store
        with Store(str(self.tmp / "state.db"), readonly=True) as st:
            return st.launches.rows(jid)

    def steps(self, jid: int) -> int:
        from launcher.telemetry import read_progress
        return int((read_progress(self.tmp / "work" / str(jid) / "progress.json") or {}).get("iterations_done") or 0)

    def results(self, jid: int) -> list[list[dict]]:
        dirs = {(lch.pid_info or {}).get("run_dir") for lch in self.launches(jid)} - {None}
        return [read_results(d) for d in sorted(dirs)]

    def twice(self, jid: int) -> int:
        steps = [r["step"] for res in self.results(jid) for r in res]
        return len(steps) - len(set(steps))

    def log(self) -> str:
        return (self.tmp / "serve.log").read_text(errors="replace")


def restart(hosts, where: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="arena-bench-hosts-") as d:
        tmp = Path(d)
        if where == "hosts":
            (tmp / "cluster.json").write_text(json.dumps({"name": "hosts", "node_groups": [
                {"gpu_type": "cpu", "num_nodes": 3, "gpus_per_node": 1, "hosts": [h.addr for h in hosts.hosts[:3]]}]}))
            svc = Service(tmp, ["--cluster", str(tmp / "cluster.json")])
        else:
            svc = Service(tmp, ["--local-slots", "3"])
        svc.start()
        try:
            svc.submit(3, 100_000)
            wait_for(lambda: all(svc.steps(j) >= 10 for j in svc.ids), "three jobs training")
            before = {j: len(svc.launches(j)) for j in svc.ids}
            t_kill = time.time()
            svc.sp.kill()
            svc.start()
            wait_for(lambda: svc.log().count("taken over") + svc.log().count("was active at restart") >= 3,
                     "the restart's recovery")
            at = {j: svc.steps(j) for j in svc.ids}
            wait_for(lambda: all(svc.steps(j) >= at[j] + 10 for j in svc.ids), "the jobs training after the restart")
            gaps = [longest_gap({r["step"]: r["time"] for res in svc.results(j) for r in res}, t_kill)
                    for j in svc.ids]
            label = "3 namespaces (cluster JSON with hosts)" if where == "hosts" else "one host (--local-slots 3)"
            return {"where": label,
                    "jobs": 3, "launches_added": sum(len(svc.launches(j)) - before[j] for j in svc.ids),
                    "steps_trained_twice": sum(svc.twice(j) for j in svc.ids), "longest_gap_s": round(max(gaps), 2)}
        finally:
            svc.sp.terminate(120)


def cut(hosts, stop_timeout: int, down_after: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="arena-bench-hosts-") as d:
        tmp = Path(d)
        (tmp / "cluster.json").write_text(json.dumps({"name": "hosts", "node_groups": [
            {"gpu_type": "cpu", "num_nodes": 3, "gpus_per_node": 1, "hosts": [h.addr for h in hosts.hosts[:3]]}]}))
        svc = Service(tmp, ["--cluster", str(tmp / "cluster.json"), "--checkpoint-interval", "5",
                            "--stop-timeout", str(stop_timeout), "--host-down-after", str(down_after)])
        svc.start()
        try:
            svc.submit(1, 100_000)
            (jid,) = svc.ids
            wait_for(lambda: svc.steps(jid) >= 80, "the job training", 240)
            node = int(svc.launches(jid)[-1].gpus[0].split(":")[0])
            host = hosts.hosts[node]
            n = len(svc.launches(jid))
            t_cut = time.time()
            hosts.cut(host)
            try:
                wait_for(lambda: f"host {host.addr} unreachable" in svc.log(), "out of service", 120)
                t_out = time.time()
                wait_for(lambda: len(svc.launches(jid)) > n and svc.results(jid)[-1], "training elsewhere", 240)
                first = min(r["time"] for r in svc.results(jid)[-1])
            finally:
                hosts.restore(host)
            wait_for(lambda: f"host {host.addr} answers again" in svc.log(), "back in service", 60)
            return {"stop_timeout_s": stop_timeout, "host_down_after_s": down_after,
                    "out_of_service_after_s": round(t_out - t_cut, 1), "trains_again_after_s": round(first - t_cut, 1),
                    "steps_trained_twice": svc.twice(jid), "checkpoint_interval_s": 5}
        finally:
            svc.sp.terminate(120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="moves,across,restart,cut")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    from tests.hosts import started_hosts, unavailable
    why = unavailable()
    if why:
        print(f"bench_hosts: {why}", file=sys.stderr)
        return 2
    out: dict = {"host": os.uname().nodename, "cores": os.cpu_count(), "load_before": os.getloadavg()}
    with started_hosts(4) as hosts:
        os.environ.update(hosts.launch_env())
        parts = args.only.split(",")
        if "moves" in parts:
            out["moves"] = moves(hosts, args.repeats)
        if "across" in parts:
            out["across"] = across(hosts)
        if "restart" in parts:
            out["restart"] = [restart(hosts, "hosts"), restart(hosts, "local")]
        if "cut" in parts:
            out["cut"] = [cut(hosts, 10, 3.0), cut(hosts, 60, 10.0)]
    out["load_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
