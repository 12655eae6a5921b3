"""Instances from the Sia artifact: ``sia:<trace>/<workload>`` (e.g. ``sia:philly/workload-1``)
read from the artifact's directory (``--sia-artifact DIR``, instances/sia_artifact.py).

The cluster is the artifact's simulated one (``simulator_config.py``: the paper's 6 x 4
T4 ``aws``, 2 x 8 A100 ``dgx-ext`` and 3 x 8 RTX 2080 Ti ``rtx`` nodes, 64 GPUs), the jobs
are ``GoodputJob``s (instances/goodput.py), the truth is ``GoodputOracle``, rounds are
60 s (Sia's scheduling interval in ``run_experiment.sh``) and there is no horizon: a run
goes until every job has finished (the artifact's simulator stops there too).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .builtin import Instance
from .cluster import ClusterSpec, NodeGroup
from .errors import InputError
from .goodput import GoodputOracle, SiaWorld, build_jobs
from .sia_artifact import artifact_root, list_traces, list_workloads, load_artifact

SIA_PREFIX = "sia:"
SIA_ROUND_INTERVAL_S = 60.0


def is_sia_name(name: str | None) -> bool:
    return bool(name) and str(name).startswith(SIA_PREFIX)


@lru_cache(maxsize=4)
def sia_world(root: Path) -> SiaWorld:
    return SiaWorld(load_artifact(root))


def sia_cluster(world: SiaWorld) -> ClusterSpec:
    cfg = world.config
    groups = tuple(NodeGroup(world.types[c], cfg.nodes[c], cfg.gpus_per_node[c]) for c in cfg.nodes)
    return ClusterSpec(groups, "sia-" + "-".join(f"{cfg.nodes[c]}x{cfg.gpus_per_node[c]}{c}" for c in cfg.nodes))


def load_sia_instance(name: str, artifact: str | Path | None) -> Instance:
    """The instance ``sia:<trace>/<workload>`` of the artifact at ``artifact``."""
    if not is_sia_name(name):
        raise InputError(f"not a Sia artifact instance name: {name!r} (sia:TRACE/WORKLOAD)", field="--instance")
    if artifact is None:
        raise InputError(f"instance {name!r} is read from the Sia artifact: give --sia-artifact DIR "
                         "(docs/sia-artifact.md)", field="--sia-artifact")
    root = artifact_root(artifact)
    workload = name[len(SIA_PREFIX):]
    world = sia_world(root)
    jobs = build_jobs(world, workload)
    return Instance(name, f"Sia artifact workload {workload} on its {sia_cluster(world).num_gpus}-GPU cluster",
                    sia_cluster(world), jobs, GoodputOracle(world), SIA_ROUND_INTERVAL_S, None)


def sia_instance_names(artifact: str | Path) -> list[str]:
    """Every ``sia:<trace>/<workload>`` of the artifact."""
    root = artifact_root(artifact)
    return [SIA_PREFIX + w for t in list_traces(root) for w in list_workloads(root, t)]
