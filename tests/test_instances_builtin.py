"""Built-in instances and the synthetic generator."""

import pytest

from instances.builtin import Instance, get_instance, list_instances
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.generator import SyntheticJobsConfig, synthetic_cluster, synthetic_jobs
from instances.grid import Shape
from instances.jobs import Job
from instances.oracle import Oracle, TableOracle
from instances.traces import compact_shape


def test_list_instances_is_cheap_and_consistent():
    infos = {i.name: i for i in list_instances()}
    assert {"demo", "arena-philly", "arena-venus", "arena-pai", "synthetic-1024", "synthetic-10240"} <= set(infos)
    assert (infos["arena-philly"].num_gpus, infos["arena-philly"].num_jobs) == (1280, 1938)
    for name in ("demo", "arena-pai", "synthetic-1024"):
        inst = get_instance(name)
        assert (inst.cluster.num_gpus, len(inst.jobs)) == (infos[name].num_gpus, infos[name].num_jobs)
        assert (inst.round_interval_s, inst.horizon_rounds) == \
            (infos[name].round_interval_s, infos[name].horizon_rounds)


def test_arena_philly():
    inst = get_instance("arena-philly")
    assert isinstance(inst, Instance) and isinstance(inst.oracle, Oracle)
    assert inst.cluster.num_gpus == 1280 and len(inst.jobs) == 1938
    assert inst.round_interval_s == 300.0 and inst.horizon_rounds == 2000
    # iterations divided by 5 and deadline slack multiplied by 5, like the published runs
    first = inst.jobs[0]
    assert first.job_id == "f043f272-f7a0-6861-353c-30479e8fffc1"
    assert first.num_iterations == 119965 // 5 and first.deadline_s == (1956739 - 1945645) * 5
    # about 986 jobs arrive within the 2,000 rounds (data/README.md)
    in_window = sum(j.arrival_s < inst.horizon_s for j in inst.jobs)
    assert 950 <= in_window <= 1000
    assert get_instance("arena-venus").cluster == inst.cluster and len(get_instance("arena-pai").jobs) == 125


def test_demo_is_small_and_feasible():
    inst = get_instance("demo")
    assert 32 <= inst.cluster.num_gpus <= 64 and len(inst.cluster.gpus_by_type()) == 2
    assert 20 <= len(inst.jobs) <= 60
    for j in inst.jobs:
        shape = compact_shape(j.requested_gpu_type, j.requested_gpus,
                              inst.cluster.max_gpus_per_node(j.requested_gpu_type))
        t = inst.oracle.true_iteration_time(j, shape)
        assert t is not None
        assert j.num_iterations * t < 5 * 3600      # short jobs: simulates in seconds
    assert get_instance("demo", seed=1).jobs != inst.jobs


def test_unknown_and_bad_names():
    with pytest.raises(InputError, match="known: .*arena-philly.*demo"):
        get_instance("nope")
    for bad in ("synthetic-0", "synthetic-abc", "synthetic--5", "synthetic-012", "synthetic-"):
        with pytest.raises(InputError, match="synthetic-N"):
            get_instance(bad)


def test_job_larger_than_cluster_is_an_error_naming_the_job():
    cluster = ClusterSpec((NodeGroup("a40", 2, 2),))
    with pytest.raises(InputError, match="job 'huge'"):
        Instance("x", "", cluster, (Job("huge", "gpt__1.3B", 128, 1, 0.0, requested_gpus=8),), TableOracle())


def test_synthetic_cluster_exact_size_deterministic_and_mixed():
    for n in (1, 7, 48, 1000, 1024, 10240):
        c = synthetic_cluster(n, seed=3)
        assert c.num_gpus == n
        assert c == synthetic_cluster(n, seed=3)
        assert "cpu" not in c.gpus_by_type()
    big = synthetic_cluster(10240, seed=0)
    assert len(big.gpus_by_type()) >= 2
    assert synthetic_cluster(10240, seed=1) != big
    with pytest.raises(InputError):
        synthetic_cluster(0, seed=0)


def test_synthetic_jobs_are_valid_and_deterministic():
    cluster = synthetic_cluster(256, seed=5)
    oracle = TableOracle()
    jobs = synthetic_jobs(300, seed=5, cluster=cluster, oracle=oracle)
    assert jobs == synthetic_jobs(300, seed=5, cluster=cluster, oracle=oracle)
    assert jobs != synthetic_jobs(300, seed=6, cluster=cluster, oracle=oracle)
    assert len({j.job_id for j in jobs}) == 300
    by_type = cluster.gpus_by_type()
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))
    deadlines = sum(j.deadline_s is not None for j in jobs)
    assert 0.15 * 300 < deadlines < 0.45 * 300
    for j in jobs:
        assert j.requested_gpus <= by_type[j.requested_gpu_type]
        shape = compact_shape(j.requested_gpu_type, j.requested_gpus, cluster.max_gpus_per_node(j.requested_gpu_type))
        t = oracle.true_iteration_time(j, shape)
        assert t is not None
        dur = j.num_iterations * t
        assert dur <= 7 * 24 * 3600 * 1.01 + t
    with pytest.raises(InputError):
        SyntheticJobsConfig(deadline_fraction=2)


def test_generator_scales_to_10k():
    # Speed is measured by bench/bench_oracle.py and `arena instances`, not asserted here.
    cluster = synthetic_cluster(10240, seed=0)
    jobs = synthetic_jobs(10000, seed=0, cluster=cluster)
    assert len(jobs) == 10000 and cluster.num_gpus == 10240
    assert len({j.job_id for j in jobs}) == 10000


def test_oracle_choice_and_noise():
    from instances.oracle import ArenaRuleOracle
    base = get_instance("demo")
    arena = get_instance("demo", oracle="arena-rule")
    noisy = get_instance("demo", noise_std=0.1)
    assert isinstance(arena.oracle, ArenaRuleOracle) and arena.jobs == base.jobs == noisy.jobs
    shape = Shape("a40", 2, 2)
    j = next(j for j in base.jobs if base.oracle.true_iteration_time(j, shape) is not None)
    assert noisy.oracle.true_iteration_time(j, shape) != base.oracle.true_iteration_time(j, shape)
    with pytest.raises(InputError, match="unknown oracle"):
        get_instance("demo", oracle="psychic")
    with pytest.raises(InputError):
        get_instance("demo", noise_std=-1.0)
