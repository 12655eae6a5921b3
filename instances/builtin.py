"""Named built-in instances: a cluster, a job list, a truth oracle and a round clock.

- ``demo``: 48 GPUs of two types (4 nodes x 8 A100-40GB, 8 nodes x 2 A40) and 40
  synthetic jobs of the Arena models, short enough to simulate in seconds.
- ``arena-philly`` / ``arena-venus`` / ``arena-pai``: Arena's 1,280-GPU simulated cluster
  (``sim_cluster_spec.json``), the matching trace with iterations divided by 5 and
  deadline slack multiplied by 5 (as in the published runs), the table oracle, rounds
  of 300 s and a horizon of 2,000 rounds.
- ``arena-overloaded``: a synthetic overload — the first 600 jobs of ``arena-philly`` on
  Arena's cluster cut to 192 GPUs (48 of each type, node sizes kept); same clock.
- ``synthetic-N``: ``synthetic_cluster(N, seed)`` and N synthetic jobs arriving about
  one per ``300 * 1000 / N`` seconds (all within about 1,000 rounds), horizon 2,000.

``get_instance(name, seed)`` builds one (cached per (name, seed)); ``list_instances()``
describes them without building any.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable

from .cluster import ClusterSpec, NodeGroup, load_cluster
from .errors import InputError
from .jobs import Job
from .oracle import Oracle, TableOracle, make_oracle


@dataclass(frozen=True)
class Instance:
    name: str
    description: str
    cluster: ClusterSpec
    jobs: tuple[Job, ...]
    oracle: Oracle
    round_interval_s: float = 300.0
    horizon_rounds: int | None = None

    def __post_init__(self):
        if not self.round_interval_s > 0:
            raise ValueError(f"instance {self.name}: round_interval_s must be > 0")
        if self.horizon_rounds is not None and self.horizon_rounds < 1:
            raise ValueError(f"instance {self.name}: horizon_rounds must be >= 1 or None")
        ids = set()
        by_type = self.cluster.gpus_by_type()
        for j in self.jobs:
            if j.job_id in ids:
                raise InputError(f"instance {self.name}: duplicate job id {j.job_id!r}", field="job_id")
            ids.add(j.job_id)
            if j.requested_gpus is not None:
                cap = by_type.get(j.requested_gpu_type, self.cluster.num_gpus) if j.requested_gpu_type \
                    else self.cluster.num_gpus
                if j.requested_gpus > cap:
                    raise InputError(f"instance {self.name}: job {j.job_id!r} needs {j.requested_gpus} GPUs, "
                                     f"more than the cluster's {cap}", field="requested_gpus")

    @property
    def horizon_s(self) -> float | None:
        return None if self.horizon_rounds is None else self.horizon_rounds * self.round_interval_s


@dataclass(frozen=True)
class InstanceInfo:
    name: str
    description: str
    num_gpus: int
    num_jobs: int
    round_interval_s: float = 300.0
    horizon_rounds: int | None = None


ARENA_ITERATION_DIVISOR = 5
ARENA_DEADLINE_SLACK_FACTOR = 5.0
ARENA_ROUND_INTERVAL_S = 300.0
ARENA_HORIZON_ROUNDS = 2000
SYNTHETIC_MAX_GPUS = 1_000_000
SYNTHETIC_ARRIVAL_WINDOW_S = 300.0 * 1000       # synthetic jobs arrive within ~1,000 rounds
DEMO_NUM_JOBS = 40
DEMO_ROUND_INTERVAL_S = 300.0
DEMO_HORIZON_ROUNDS = 200
SYNTHETIC_ROUND_INTERVAL_S = 300.0


@lru_cache(maxsize=1)
def arena_cluster() -> ClusterSpec:
    with resources.as_file(resources.files("instances").joinpath("data/arena/sim_cluster_spec.json")) as p:
        spec = load_cluster(p)
    return ClusterSpec(spec.groups, "arena-sim-1280")


def demo_cluster() -> ClusterSpec:
    return ClusterSpec((NodeGroup("a100-40gb", 4, 8), NodeGroup("a40", 8, 2)), "demo-48")


def _arena(trace: str) -> Callable[[int, Oracle], Instance]:
    def build(seed: int, oracle: Oracle) -> Instance:
        from .traces import load_bundled_trace
        cluster = arena_cluster()
        jobs = load_bundled_trace(trace, cluster=cluster, iteration_divisor=ARENA_ITERATION_DIVISOR,
                                  deadline_slack_factor=ARENA_DEADLINE_SLACK_FACTOR)
        return Instance(trace, _DESCRIPTIONS[trace], cluster, jobs, oracle,
                        ARENA_ROUND_INTERVAL_S, ARENA_HORIZON_ROUNDS)
    return build


OVERLOADED_JOBS = 600
OVERLOADED_NODES = {"a100-40gb": 12, "v100-32gb": 3, "a40": 24, "a10": 24}      # 48 GPUs of each type


def overloaded_cluster() -> ClusterSpec:
    """Arena's cluster cut to 192 GPUs, 48 of each type, node sizes kept."""
    groups = tuple(dataclasses.replace(g, num_nodes=OVERLOADED_NODES[g.gpu_type]) for g in arena_cluster().groups)
    return ClusterSpec(groups, "arena-overloaded-192")


def _overloaded(seed: int, oracle: Oracle) -> Instance:
    from .traces import load_bundled_trace
    cluster = overloaded_cluster()
    jobs = load_bundled_trace("arena-philly", cluster=cluster, iteration_divisor=ARENA_ITERATION_DIVISOR,
                              deadline_slack_factor=ARENA_DEADLINE_SLACK_FACTOR)
    jobs = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))[:OVERLOADED_JOBS]
    return Instance("arena-overloaded", _DESCRIPTIONS["arena-overloaded"], cluster, tuple(jobs), oracle,
                    ARENA_ROUND_INTERVAL_S, ARENA_HORIZON_ROUNDS)


def _demo(seed: int, oracle: Oracle) -> Instance:
    from .generator import SyntheticJobsConfig, synthetic_jobs
    cluster = demo_cluster()
    cfg = SyntheticJobsConfig(mean_interarrival_s=90.0, duration_median_s=2400.0, duration_sigma=0.7,
                              max_duration_s=4 * 3600.0)
    jobs = synthetic_jobs(DEMO_NUM_JOBS, seed, cluster=cluster, oracle=TableOracle(), config=cfg)
    return Instance("demo", _DESCRIPTIONS["demo"], cluster, jobs, oracle, DEMO_ROUND_INTERVAL_S, DEMO_HORIZON_ROUNDS)


def synthetic_num_jobs(num_gpus: int) -> int:
    return num_gpus


def _synthetic(num_gpus: int, seed: int, oracle: Oracle) -> Instance:
    from .generator import SyntheticJobsConfig, synthetic_cluster, synthetic_jobs
    cluster = synthetic_cluster(num_gpus, seed)
    n = synthetic_num_jobs(num_gpus)
    cfg = SyntheticJobsConfig(mean_interarrival_s=SYNTHETIC_ARRIVAL_WINDOW_S / n)
    jobs = synthetic_jobs(n, seed, cluster=cluster, oracle=TableOracle(), config=cfg)
    return Instance(f"synthetic-{num_gpus}", _synthetic_description(num_gpus), cluster, jobs, oracle,
                    SYNTHETIC_ROUND_INTERVAL_S, ARENA_HORIZON_ROUNDS)


_DESCRIPTIONS = {
    "demo": "48 GPUs (32 A100-40GB + 16 A40), 40 synthetic jobs of the Arena models; simulates in seconds",
    "arena-philly": "Arena's 1,280-GPU cluster, Philly-arrival trace (iterations /5, deadline slack x5)",
    "arena-venus": "Arena's 1,280-GPU cluster, Helios Venus-arrival trace (iterations /5, deadline slack x5)",
    "arena-pai": "Arena's 1,280-GPU cluster, Alibaba PAI-arrival trace (iterations /5, deadline slack x5)",
    "arena-overloaded": "synthetic overload: the first 600 Philly-arrival jobs of arena-philly on Arena's cluster "
                        "cut to 192 GPUs (48 per type)",
}
_BUILDERS: dict[str, Callable[[int, Oracle], Instance]] = {
    "demo": _demo,
    "arena-philly": _arena("arena-philly"),
    "arena-venus": _arena("arena-venus"),
    "arena-pai": _arena("arena-pai"),
    "arena-overloaded": _overloaded,
}
SYNTHETIC_EXAMPLES = (1024, 10240)
_SYNTHETIC = re.compile(r"synthetic-([1-9][0-9]*)")


def _synthetic_description(n: int) -> str:
    return f"synthetic mixed-type cluster of {n} GPUs, {synthetic_num_jobs(n)} synthetic jobs (synthetic-N: any N)"


def instance_names() -> list[str]:
    return sorted(_BUILDERS) + [f"synthetic-{n}" for n in SYNTHETIC_EXAMPLES]


@lru_cache(maxsize=16)
def get_instance(name: str, seed: int = 0, oracle: str = "table", noise_std: float = 0.0) -> Instance:
    """The built-in instance ``name`` (see the module docstring); deterministic by seed.

    ``oracle`` names the truth oracle (``instances.oracle.ORACLES``: ``table``, ours, or
    ``arena-rule``, the artifact's extrapolation rule, for faithful replays);
    ``noise_std`` adds the oracle's seeded multiplicative noise. The jobs of synthetic
    instances are always generated with the noiseless ``table`` oracle, so they do not
    depend on these two choices."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"seed must be an integer, got {seed!r}", field="seed")
    truth = make_oracle(oracle, seed=seed, noise_std=noise_std)
    if name in _BUILDERS:
        return _BUILDERS[name](seed, truth)
    m = _SYNTHETIC.fullmatch(name)
    if m:
        n = int(m.group(1))
        if n > SYNTHETIC_MAX_GPUS:
            raise InputError(f"synthetic-N: N must be at most {SYNTHETIC_MAX_GPUS}, got {n}", field="name")
        return _synthetic(n, seed, truth)
    if name.startswith("synthetic"):
        raise InputError(f"bad synthetic instance name {name!r}: use synthetic-N with N a positive "
                         f"integer GPU count, e.g. synthetic-1024", field="name")
    raise InputError(f"unknown instance {name!r}; known: {', '.join(instance_names())} "
                     f"(synthetic-N for any N GPUs)", field="name")


def _count_rows(trace: str) -> int:
    from .traces import bundled_trace_text
    text, _ = bundled_trace_text(trace)
    return sum(1 for line in text.splitlines()[1:] if line.strip())


def list_instances() -> list[InstanceInfo]:
    """Name, description, GPUs and jobs of each built-in instance, without building any."""
    return list(_instance_infos())


@lru_cache(maxsize=1)
def _instance_infos() -> tuple[InstanceInfo, ...]:
    out = [InstanceInfo("demo", _DESCRIPTIONS["demo"], demo_cluster().num_gpus, DEMO_NUM_JOBS,
                        DEMO_ROUND_INTERVAL_S, DEMO_HORIZON_ROUNDS)]
    for trace in ("arena-philly", "arena-venus", "arena-pai"):
        out.append(InstanceInfo(trace, _DESCRIPTIONS[trace], arena_cluster().num_gpus, _count_rows(trace),
                                ARENA_ROUND_INTERVAL_S, ARENA_HORIZON_ROUNDS))
    out.append(InstanceInfo("arena-overloaded", _DESCRIPTIONS["arena-overloaded"], overloaded_cluster().num_gpus,
                            min(OVERLOADED_JOBS, _count_rows("arena-philly")), ARENA_ROUND_INTERVAL_S,
                            ARENA_HORIZON_ROUNDS))
    for n in SYNTHETIC_EXAMPLES:
        out.append(InstanceInfo(f"synthetic-{n}", _synthetic_description(n), n, synthetic_num_jobs(n),
                                SYNTHETIC_ROUND_INTERVAL_S, ARENA_HORIZON_ROUNDS))
    return tuple(out)
