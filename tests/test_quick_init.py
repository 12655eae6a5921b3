"""``quick_init`` builds the same frozen objects as the dataclass's own ``__init__``."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.allocation import Allocation
from engine.core.context import ChangeHistory, JobView
from engine.core.executor import JobProgress
from engine.core.quick_init import quick_init
from instances.grid import Grid, Shape

GRID = Grid(Shape("a100", 1, 2), pp=1)


def _reference(cls, values: dict):
    """What the generated ``__init__`` does: each field through ``object.__setattr__``."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        object.__setattr__(obj, f.name, values[f.name] if f.name in values else f.default)
    if hasattr(cls, "__post_init__"):
        obj.__post_init__()
    return obj


values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=3))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_quick_init_builds_what_the_dataclass_init_builds(data):
    for cls in (JobProgress, JobView, ChangeHistory):
        fields = dataclasses.fields(cls)
        required = [f for f in fields if f.default is dataclasses.MISSING]
        optional = [f for f in fields if f.default is not dataclasses.MISSING]
        chosen = data.draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []
        kw = {f.name: data.draw(values) for f in required + chosen}
        positional = data.draw(st.integers(0, len(required)))
        args = [kw.pop(f.name) for f in required[:positional]]
        obj = cls(*args, **kw)
        ref = _reference(cls, {**dict(zip((f.name for f in required), args)), **kw})
        assert vars(obj) == vars(ref) and obj == ref and repr(obj) == repr(ref)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, fields[0].name, 1)


def test_quick_init_keeps_post_init_replace_and_argument_errors():
    a = Allocation(GRID, ((0, 0), (0, 1)))
    assert a == _reference(Allocation, {"grid": GRID, "gpus": ((0, 0), (0, 1))}) and hash(a)
    with pytest.raises(ValueError, match="holds 1 GPUs"):          # __post_init__ still runs
        Allocation(GRID, ((0, 0),))
    with pytest.raises(ValueError, match="holds 1 GPUs"):
        dataclasses.replace(a, gpus=((0, 0),))
    p = JobProgress("j", 3.0, True)
    assert dataclasses.replace(p, running=False) == JobProgress("j", 3.0, False)
    with pytest.raises(TypeError):
        JobProgress("j", 3.0)                        # a required field missing
    with pytest.raises(TypeError):
        JobProgress("j", 3.0, True, nonsense=1)      # an unknown one
    with pytest.raises(TypeError):
        JobProgress("j", 3.0, True, running=False)   # one given twice


def test_quick_init_refuses_what_it_does_not_handle():
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slots:
        x: int

    for cls in (Mutable, Factory, Slots):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)
