"""Importing this module registers the built-in objective terms."""
from . import deadline, fairness, jct, las, queue, quota, reconfig, throughput  # noqa: F401
