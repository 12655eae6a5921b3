"""Invariants asserted every simulated round.

- no GPU holds two jobs, and ownership agrees with each running job's allocation;
- capacities: every allocation uses GPUs that exist, of its grid's type, on as many
  distinct nodes as its shape says with the same count on each;
- the clock is monotone;
- every submitted job is accounted for: queued, running, held, finished or failed — none lost;
- iterations never decrease.
"""
from __future__ import annotations

from .state import EngineState, JobStatus


class InvariantViolation(AssertionError):
    pass


def check_invariants(state: EngineState, now_s: float, prev_now_s: float | None,
                     prev_iterations: dict[str, float] | None = None, *, gpus: bool = True) -> None:
    """Raise ``InvariantViolation`` naming the first broken invariant.

    ``gpus=False`` skips the GPU-level checks (ownership, shapes, capacities), which the
    simulator does when no GPU changed hands since they last passed.
    """
    if prev_now_s is not None and now_s < prev_now_s:
        raise InvariantViolation(f"clock moved backwards: {prev_now_s} -> {now_s}")
    if gpus:
        _check_gpus(state)
    _check_accounting(state, prev_iterations, full=gpus)


def _check_gpus(state: EngineState) -> None:
    cl = state.cluster
    owner, nodes = cl.owner, cl.nodes
    seen: dict[tuple[int, int], str] = {}
    for jid, r in state.running.items():
        if r.status is not JobStatus.RUNNING or r.alloc is None:
            raise InvariantViolation(f"job {jid} in the running set with status {r.status.value}")
        a = r.alloc
        gpus = a.gpus
        on = [n for n, _ in gpus]
        per_node = {n: on.count(n) for n in set(on)}
        for n in per_node:
            if not 0 <= n < len(nodes):
                raise InvariantViolation(f"job {jid} holds a GPU on non-existent node {n}")
            if nodes[n].gpu_type != a.grid.gpu_type:
                raise InvariantViolation(f"job {jid} holds {nodes[n].gpu_type} GPUs on node {n} for grid {a.grid}")
        try:
            if min(i for _, i in gpus) < 0:
                raise IndexError
            owners = [owner[n][i] for n, i in gpus]
        except IndexError:
            raise InvariantViolation(f"job {jid} holds a non-existent GPU: {gpus}") from None
        if owners.count(jid) != len(gpus):
            g = next(g for g, o in zip(gpus, owners) if o != jid)
            raise InvariantViolation(f"GPU {g} of job {jid} is recorded as owned by {owner[g[0]][g[1]]}")
        before = len(seen)
        seen.update(dict.fromkeys(gpus, jid))
        if len(seen) != before + len(gpus):
            raise InvariantViolation(f"job {jid} holds a GPU twice or shares one: {gpus}")
        if not cl.unavailable.isdisjoint(per_node):
            raise InvariantViolation(f"job {jid} runs on unavailable node(s) {sorted(cl.unavailable & set(per_node))}")
        sh = a.grid.shape
        if len(per_node) != sh.num_nodes or any(c != sh.gpus_per_node for c in per_node.values()):
            raise InvariantViolation(f"job {jid}: GPUs {a.gpus} do not match shape {sh}")
    busy_per_node = [len(row) - row.count(None) for row in cl.owner]   # C-speed counts
    if any(b + f != n.num_gpus for b, f, n in zip(busy_per_node, cl.free_count, cl.nodes)):
        n = next(i for i, (b, f, nd) in enumerate(zip(busy_per_node, cl.free_count, cl.nodes))
                 if b + f != nd.num_gpus)
        raise InvariantViolation(f"node {n}: {busy_per_node[n]} busy + {cl.free_count[n]} free != "
                                 f"{cl.nodes[n].num_gpus} GPUs")
    owned = sum(busy_per_node)
    if owned != len(seen):
        # every held GPU is owned by its holder (checked above), so an excess is a stray owner
        stray = next(((n, i) for n, row in enumerate(cl.owner) for i, o in enumerate(row)
                      if o is not None and (n, i) not in seen), None)
        raise InvariantViolation(f"{owned} GPUs owned but {len(seen)} held by running jobs "
                                 f"(e.g. GPU {stray} owned by {cl.owner[stray[0]][stray[1]] if stray else '?'})")


def _check_accounting(state: EngineState, prev_iterations: dict[str, float] | None, full: bool) -> None:
    submitted = state.submitted_count
    accounted = (len(state.queued) + len(state.running) + len(state.held) + len(state.finished_ids)
                 + len(state.failed_ids))
    if submitted != accounted:
        raise InvariantViolation(f"{submitted} jobs submitted but {accounted} queued/running/held/finished/failed")
    for jid in (state.queued if full else ()):
        if state.jobs[jid].status is not JobStatus.QUEUED:
            raise InvariantViolation(f"job {jid} in the queue with status {state.jobs[jid].status.value}")
    for jid, r in state.held.items():
        if r.status is not JobStatus.HELD or r.alloc is not None:
            raise InvariantViolation(f"job {jid} held with status {r.status.value} and allocation {r.alloc}")
    if prev_iterations is not None:
        for jid, it in prev_iterations.items():
            if state.jobs[jid].iterations_done < it - 1e-9:
                raise InvariantViolation(f"job {jid}: iterations decreased {it} -> {state.jobs[jid].iterations_done}")
