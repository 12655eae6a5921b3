"""Fixtures shared between test modules."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reference_losses() -> dict:
    """Uninterrupted-training loss trajectories, shared by the service tests that run the
    same workload (``engine.service.scenario.loss_deviation``'s ``references``)."""
    return {}


def pytest_collection_modifyitems(config, items):
    """The long multi-process tests (marked ``slow``) run first, in their collected order.
    ``scripts/test.sh`` runs the suite on every core (pytest-xdist, ``--dist worksteal``):
    started first, the long tests no longer end the run alone on one worker while the
    other waits (the order of the tests is otherwise kept; no test depends on it)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
