"""What building a large cluster costs: its JSON read (``load_cluster``), the engine's
state (``engine.core.state.ClusterState``) and the placer (``engine.core.placement.Placer``), for
``n`` and ``4 n`` nodes, laid out two ways: one group of ``n`` one-GPU nodes, and ``n``
one-node groups (the worst case for the per-group work). A linear build takes about 4x as
long at ``4 n``; a quadratic one (``nodes_by_type`` by tuple concatenation took 20 s at
125,000 nodes) about 16x. The default ``n`` makes ``4 n`` the documented limit
(``instances.cluster.MAX_CLUSTER_GPUS``, 1,048,576 GPUs). Prints seconds per step and
the 4n/n ratio of the totals.

    PYTHONPATH=. .venv/bin/python bench/bench_cluster_build.py [--nodes 262144] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def build(n: int, layout: str, folder: Path) -> dict[str, float]:
    from engine.core.placement import Placer
    from engine.core.state import ClusterState
    from instances.cluster import load_cluster
    groups = ([{"gpu_type": "a100", "num_nodes": n, "gpus_per_node": 1}] if layout == "one group"
              else [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 1}] * n)
    path = folder / f"{layout.replace(' ', '-')}-{n}.json"
    path.write_text(json.dumps({"node_groups": groups}))
    out: dict[str, float] = {}
    t = time.perf_counter()
    spec = load_cluster(path)
    out["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    state = ClusterState(spec)
    out["state_s"] = time.perf_counter() - t
    t = time.perf_counter()
    Placer(spec)
    out["placer_s"] = time.perf_counter() - t
    assert len(state.nodes) == n
    out["total_s"] = sum(out.values())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=262_144, help="n (default 262,144: 4n is the GPU limit)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for layout in ("one group", "one group per node"):
            small = build(args.nodes, layout, Path(d))
            large = build(4 * args.nodes, layout, Path(d))
            rows.append({"layout": layout, "n": args.nodes, "small": small, "large": large,
                         "ratio_4n_over_n": large["total_s"] / small["total_s"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'layout':<20} {'nodes':>9} {'load s':>7} {'state s':>8} {'placer s':>9} {'total s':>8}")
    for r in rows:
        for size, f in ((r["n"], r["small"]), (4 * r["n"], r["large"])):
            print(f"{r['layout']:<20} {size:>9,} {f['load_s']:>7.2f} {f['state_s']:>8.2f} {f['placer_s']:>9.2f} "
                  f"{f['total_s']:>8.2f}")
        print(f"{'':<20} 4n/n total: {r['ratio_4n_over_n']:.2f} (linear: about 4; quadratic: about 16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
