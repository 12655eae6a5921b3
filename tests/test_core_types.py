"""Shared value objects: shapes, grids, allocations, plans, and the policy registry."""
import pytest

from engine.core.allocation import Allocation
from engine.core.policy import make_policy, policy_names
from estimators.base import Plan
from instances.errors import InputError
from instances.grid import Grid, Shape


def test_grid_counts_and_validation():
    g = Grid(Shape("a100-40gb", 2, 4), pp=2)
    assert g.num_gpus == 8 and g.gpu_type == "a100-40gb"
    assert str(g) == "a100-40gb:2x4:pp2"
    with pytest.raises(ValueError):
        Grid(Shape("a100-40gb", 1, 4), pp=3)       # 3 stages cannot split 4 GPUs evenly
    with pytest.raises(ValueError):
        Shape("a100-40gb", 0, 4)


def test_allocation_must_match_grid():
    g = Grid(Shape("a10", 1, 2))
    Allocation(g, ((0, 0), (0, 1)))
    with pytest.raises(ValueError):
        Allocation(g, ((0, 0),))


def test_plan_validation():
    p = Plan(pp=2, dp=2, tp=1, stage_layers=(3, 3), microbatches=4)
    assert p.num_gpus == 4
    with pytest.raises(ValueError):
        Plan(pp=2, dp=1, tp=1, stage_layers=(6,))
    with pytest.raises(ValueError):
        Plan(pp=1, dp=1, tp=1, stage_layers=(6,), schedule="zigzag")


def test_unknown_policy_is_named():
    with pytest.raises(InputError, match="unknown policy 'nope'; known: .*arena"):
        make_policy("nope")
    assert isinstance(policy_names(), list)


def test_shapes_and_grids_hash_as_their_fields_and_pickle_without_the_kept_hash():
    import copy
    import dataclasses
    import pickle
    g = Grid(Shape("a100", 2, 4), 2)
    assert hash(g) == hash((Shape("a100-40gb", 2, 4), 2)) and hash(g.shape) == hash(("a100-40gb", 2, 4))
    assert {g: 1}[Grid(Shape("a100-40gb", 2, 4), 2)] == 1
    for twin in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert "_hash" not in twin.__dict__ and "_hash" not in twin.shape.__dict__   # a new process rehashes
    assert hash(dataclasses.replace(g, pp=4)) == hash((g.shape, 4))
    assert pickle.loads(pickle.dumps(g)) == g and dataclasses.asdict(g) == {
        "shape": {"gpu_type": "a100-40gb", "num_nodes": 2, "gpus_per_node": 4}, "pp": 2}
