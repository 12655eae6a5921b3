"""A Slurm cluster on this host to try ``arena serve --slurm`` on, kept until Ctrl-C.

    sudo .venv/bin/python scripts/slurm_test_cluster.py                 # n1, n2: 2 fake a100 GPUs each; n3: CPUs
    sudo .venv/bin/python scripts/slurm_test_cluster.py --gpu-nodes 4 --gpus 1 --cpu-nodes 0

The cluster the tests start (``tests/slurm_cluster.py``): one ``slurmctld``, one
``slurmd`` per node and a ``munged`` of its own, all on this host under one folder, with
free ports, in partition ``arena``. The GPUs are fake (character devices Slurm schedules;
the ranks train on the CPU). It prints the ``SLURM_CONF`` to export and the command that
serves on it, then waits; Ctrl-C (or SIGTERM) cancels the jobs left, stops every daemon
it started and removes the folder. Needs root (slurmd runs the jobs as their user) and
Debian's ``slurmctld slurmd slurm-client munge``.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.slurm_cluster import NodeDef, started_cluster, unavailable  # noqa: E402

READY = "cluster ready"                  # the line a caller waits for


def nodes(gpu_nodes: int, gpus: int, cpu_nodes: int, gpu_type: str) -> tuple[NodeDef, ...]:
    return (tuple(NodeDef(f"n{i + 1}", gpus=gpus, gpu_type=gpu_type) for i in range(gpu_nodes))
            + tuple(NodeDef(f"n{gpu_nodes + i + 1}") for i in range(cpu_nodes)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-nodes", type=int, default=2, help="nodes with fake GPUs (default 2)")
    p.add_argument("--gpus", type=int, default=2, help="fake GPUs per GPU node (default 2)")
    p.add_argument("--cpu-nodes", type=int, default=1, help="nodes with CPUs only (default 1)")
    p.add_argument("--gpu-type", default="a100", help="the GPUs' GRES type (default a100)")
    a = p.parse_args(argv)
    if not (0 <= a.gpu_nodes <= 16 and 0 <= a.cpu_nodes <= 16 and 1 <= a.gpus <= 8 and a.gpu_nodes + a.cpu_nodes):
        p.error("--gpu-nodes and --cpu-nodes: 0-16 each, at least one node in all; --gpus: 1-8")
    why = unavailable()
    if why:
        print(f"slurm_test_cluster: {why}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with started_cluster(nodes(a.gpu_nodes, a.gpus, a.cpu_nodes, a.gpu_type)) as c:
        print(f"{READY}: {c.name} in {c.startup_s:.1f} s, folder {c.root}\n{c.run('sinfo').stdout}\n"
              f"export SLURM_CONF={c.conf}\n"
              f"arena serve --slurm --slurm-conf {c.conf} --work-dir {c.root}/arena/work "
              f"--db {c.root}/arena/state.db\n"
              "Ctrl-C stops the cluster (and removes its folder).", flush=True)
        while not stop.wait(1.0):
            dead = sorted(k for k, proc in c.procs.items() if proc.poll() is not None)
            if dead:
                print(f"Slurm daemon(s) {', '.join(dead)} exited:\n{c.log_tails()}", file=sys.stderr)
                return 1
    print("cluster stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
