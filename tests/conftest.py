"""Fixtures shared between test modules."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reference_losses() -> dict:
    """Uninterrupted-training loss trajectories, shared by the service tests that run the
    same workload (``engine.service.scenario.loss_deviation``'s ``references``)."""
    return {}


# Test modules that go whole to one pytest-xdist worker (scripts/test.sh: ``--dist
# loadgroup``): their module-scoped scenario (a real Slurm cluster, a live service with
# real jobs) is then built once per run instead of once on each worker that gets a test.
# (xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9 no longer reads,
# so its ``xdist_group`` marks would not group anything; the scheduler below groups by
# module path.)
WHOLE_MODULES = frozenset({"tests/test_service_e2e.py", "tests/test_service_slurm.py", "tests/test_service_hosts.py"})


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``: xdist's scope scheduler with one work unit per
    ``WHOLE_MODULES`` module and one per test elsewhere. Units with more tests go out
    first (xdist's reorder), then the tests one by one in the order below."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WholeModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in WHOLE_MODULES else nodeid

    return WholeModules(config, log)


def pytest_collection_modifyitems(config, items):
    """The long multi-process tests (marked ``slow``) run first, in their collected order.
    ``scripts/test.sh`` runs the suite on every core (pytest-xdist, ``--dist loadgroup``,
    which sends the ``xdist_group`` modules first, each whole to one worker): started
    first, the long tests no longer end the run alone on one worker while the other
    waits (the order of the tests is otherwise kept; no test depends on it)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster on this host (``tests/slurm_cluster.py``): nodes n1 and n2 with two
    fake GPUs each (GRES ``gpu:a100:2``), n3 CPU-only, partition ``arena``; one per pytest
    process (each xdist worker its own: own munged, ports and folder), started on first
    use (about 1.5 s), stopped at the end. Skipped, saying why in one line, when not root
    or Slurm is not installed."""
    from tests.slurm_cluster import started_cluster, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    with started_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def test_hosts():
    """Four test hosts (``tests/hosts.py``): network namespaces on a bridge, each with its
    own address, host name and sshd; one per pytest process, built on first use (about
    1 s), removed at the end. Skipped, saying why in one line, when not root or sshd or
    iproute2 is missing."""
    from tests.hosts import started_hosts, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    with started_hosts(4) as hosts:
        yield hosts
