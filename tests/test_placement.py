"""Placement: property-based (hypothesis) and hand-made cases."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.allocation import Allocation
from engine.core.placement import Placer
from instances.cluster import ClusterSpec, NodeGroup
from instances.grid import Grid, Shape

TYPES = ("a100-40gb", "a40")


@st.composite
def scenarios(draw):
    groups = []
    for t in draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3)):
        groups.append(NodeGroup(t, draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 4, 8])),
                                draw(st.sampled_from([None, 1, 2]))))
    spec = ClusterSpec(tuple(groups))
    placer = Placer(spec)
    types = sorted({g.gpu_type for g in groups})

    def shape():
        t = draw(st.sampled_from(types))
        m = draw(st.sampled_from([1, 2, 4, 8]))
        return Shape(t, draw(st.integers(1, 3)), m)

    # current allocations: whatever an earlier round placed from an empty cluster
    n_cur = draw(st.integers(0, 6))
    first = {f"j{i}": Grid(shape()) for i in range(n_cur)}
    current = dict(placer.place(first, {}).allocations)
    # this round: each current job keeps its grid, changes it, or stops; new jobs arrive
    requests = {}
    for jid, a in current.items():
        action = draw(st.sampled_from(["keep", "keep-pp", "change", "stop"]))
        if action == "keep":
            requests[jid] = a.grid
        elif action == "keep-pp" and a.grid.num_gpus % 2 == 0:
            requests[jid] = Grid(a.grid.shape, 2)
        elif action == "change":
            requests[jid] = Grid(shape())
    for i in range(draw(st.integers(0, 6))):
        requests[f"n{i}"] = Grid(shape())
    return spec, placer, current, requests


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_placement_properties(sc):
    spec, placer, current, requests = sc
    res = placer.place(requests, current)
    nodes = spec.nodes()
    used = set()
    assert set(res.allocations) | set(res.failed) == set(requests)
    assert not set(res.allocations) & set(res.failed)
    for jid, a in res.allocations.items():
        assert a.grid == requests[jid]
        per_node = {}
        for n, i in a.gpus:
            assert 0 <= i < nodes[n].num_gpus                      # never exceeds a node
            assert nodes[n].gpu_type == a.grid.gpu_type             # right type
            assert (n, i) not in used                                # never double-books
            used.add((n, i))
            per_node[n] = per_node.get(n, 0) + 1
        assert len(per_node) == a.grid.shape.num_nodes               # matches the shape
        assert all(c == a.grid.shape.gpus_per_node for c in per_node.values())
        assert list(a.gpus) == sorted(a.gpus)
        cur = current.get(jid)
        if cur is not None and cur.grid.shape == a.grid.shape:
            assert a.gpus == cur.gpus                                # unchanged grid keeps its GPUs
    for jid in res.failed:                                           # a failure is a real misfit
        assert jid not in current or current[jid].grid.shape != requests[jid].shape


def _spec(*groups):
    return ClusterSpec(tuple(NodeGroup(*g) for g in groups))


def test_compact_and_best_fit():
    spec = _spec(("a100", 3, 4))
    p = Placer(spec)
    held = Allocation(Grid(Shape("a100-40gb", 1, 2)), ((1, 0), (1, 1)))
    res = p.place({"k": held.grid, "x": Grid(Shape("a100-40gb", 1, 2)), "y": Grid(Shape("a100-40gb", 1, 4))},
                  {"k": held})
    assert res.allocations["k"].gpus == held.gpus
    assert res.allocations["x"].nodes == (1,)        # best fit: the half-used node
    assert len(res.allocations["y"].nodes) == 1      # a 1x4 shape takes one whole node
    assert not res.failed


def test_move_prefers_overlap_with_held_gpus():
    spec = _spec(("a100", 2, 4))
    p = Placer(spec)
    old = Allocation(Grid(Shape("a100-40gb", 1, 2)), ((1, 2), (1, 3)))
    res = p.place({"a": Grid(Shape("a100-40gb", 1, 4))}, {"a": old})
    assert res.allocations["a"].gpus == tuple((1, i) for i in range(4))   # superset of what it held
    res = p.place({"a": Grid(Shape("a100-40gb", 1, 1))}, {"a": old})
    assert res.allocations["a"].gpus == ((1, 2),)                          # subset


def test_multi_node_shape_prefers_one_switch():
    spec = _spec(("a100", 4, 4, 2))          # switches: nodes {0,1} and {2,3}
    p = Placer(spec)
    busy = Allocation(Grid(Shape("a100-40gb", 1, 4)), tuple((0, i) for i in range(4)))
    res = p.place({"b": busy.grid, "m": Grid(Shape("a100-40gb", 2, 4))}, {"b": busy})
    assert res.allocations["m"].nodes == (2, 3)


def test_repair_reorders_this_rounds_jobs():
    # Node 0 has 2 free GPUs (a kept job holds the others), node 1 has 4. In the policy's
    # order, x (1x2) takes node 0 by best fit; y (2x1) then needs two nodes and fails
    # until the repair places y first (one GPU on each node) and x on node 1.
    spec = _spec(("a100", 2, 4))
    p = Placer(spec)
    kept = Allocation(Grid(Shape("a100-40gb", 1, 2)), ((0, 0), (0, 1)))
    res = p.place({"k": kept.grid, "x": Grid(Shape("a100-40gb", 1, 2)), "y": Grid(Shape("a100-40gb", 2, 1))},
                  {"k": kept})
    assert not res.failed and res.repaired == 1
    assert res.allocations["y"].nodes == (0, 1) and res.allocations["x"].nodes == (1,)


def test_impossible_shape_fails_and_pins():
    spec = _spec(("a100", 1, 4), ("a40", 1, 2))
    p = Placer(spec)
    res = p.place({"big": Grid(Shape("a40", 1, 4)), "ok": Grid(Shape("a100-40gb", 1, 2))}, {})
    assert res.failed == ("big",) and "ok" in res.allocations
    pin = ((0, 2), (0, 3))
    res = p.place({"p": Grid(Shape("a100-40gb", 1, 2))}, {}, {"p": pin})
    assert res.allocations["p"].gpus == pin and not res.pins_rejected
    res = p.place({"p": Grid(Shape("a100-40gb", 1, 2))}, {}, {"p": ((0, 0), (1, 0))})   # wrong type
    assert res.pins_rejected == ("p",) and len(res.allocations["p"].gpus) == 2


def test_pins_are_checked_gpu_by_gpu():
    spec = _spec(("a100", 2, 4), ("a40", 1, 2))
    p = Placer(spec)
    grid = Grid(Shape("a100-40gb", 1, 2))
    held = Allocation(Grid(Shape("a100-40gb", 1, 1)), ((0, 1),))
    bad = {
        "negative index": ((0, -1), (0, 0)),
        "index past the node": ((0, 3), (0, 4)),
        "a GPU twice (one GPU short)": ((0, 2), (0, 2)),
        "unknown node": ((5, 0), (5, 1)),
        "two nodes for a one-node shape": ((0, 2), (1, 2)),
        "another type's node": ((2, 0), (2, 1)),
        "a GPU a kept job holds": ((0, 1), (0, 2)),
    }
    for why, pin in bad.items():
        res = p.place({"p": grid, "k": held.grid}, {"k": held}, {"p": pin})
        assert res.pins_rejected == ("p",), why
        assert res.allocations["k"].gpus == held.gpus
        assert (0, 1) not in res.allocations["p"].gpus, why              # placed normally, not on k's GPU
    res = p.place({"p": grid, "k": held.grid}, {"k": held}, {"p": ((0, 3), (0, 2), (0, 3))})
    assert not res.pins_rejected and res.allocations["p"].gpus == ((0, 2), (0, 3))   # sorted, each once


def test_a_job_pinned_to_its_own_gpus_keeps_them_sorted():
    """Pinned to the very tuple it holds (what a policy passes back): kept as is when the
    tuple is in the placer's form, put in that form when it is not."""
    p = Placer(_spec(("a100", 1, 4)))
    grid = Grid(Shape("a100-40gb", 1, 2))
    for gpus in (((0, 1), (0, 3)), ((0, 3), (0, 1))):
        cur = Allocation(grid, gpus)
        assert cur.gpus_canonical == (gpus == ((0, 1), (0, 3)))
        res = p.place({"j": grid}, {"j": cur}, {"j": cur.gpus})
        assert not res.pins_rejected and res.allocations["j"].gpus == ((0, 1), (0, 3))
        assert (res.allocations["j"] is cur) == cur.gpus_canonical
    twice = Allocation(Grid(Shape("a100-40gb", 1, 1)), ((0, 2),))
    assert twice.gpus_canonical and not Allocation(grid, ((0, 2), (0, 2))).gpus_canonical


def test_a_move_takes_its_own_gpus_then_the_lowest_free():
    spec = _spec(("a100", 1, 8))
    p = Placer(spec)
    other = Allocation(Grid(Shape("a100-40gb", 1, 2)), ((0, 0), (0, 2)))
    mine = Allocation(Grid(Shape("a100-40gb", 1, 2)), ((0, 5), (0, 7)))
    res = p.place({"o": other.grid, "m": Grid(Shape("a100-40gb", 1, 4))}, {"o": other, "m": mine})
    assert res.allocations["m"].gpus == ((0, 1), (0, 3), (0, 5), (0, 7))
    free = p.empty_free_map(frozenset({0}))
    assert p.choose(free, Shape("a100-40gb", 1, 1)) is None                 # its only node is out of service
