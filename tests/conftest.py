"""Fixtures shared between test modules."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reference_losses() -> dict:
    """Uninterrupted-training loss trajectories, shared by the service tests that run the
    same workload (``engine.service.scenario.loss_deviation``'s ``references``)."""
    return {}
