"""Which nodes to take out of service because runs keep failing on them.

A rank that dies, a collective that times out, mpiexec exiting non-zero: the service
counts such a failed run against the job (``--max-failures``). When the node is at
fault (a failing GPU, a bad driver, a full local disk), every job placed there fails in
turn and each spends its failures on it. So the service also counts failures per node:
once runs of ``threshold`` *different* jobs have failed on a node within ``window_s``
seconds, the node is drained (as ``arena drain`` would, with the jobs named in the
reason; ``arena undrain`` returns it). Distinct jobs, because one job failing again and
again on a healthy node is that job's problem, which its own failure count handles.

Not counted: a launch refused or out of memory for its shape (the job's shape, not the
node: ``MpiExecutor.runs_on``), and stops the service asked for. A run on several
nodes counts on each. The counts live in the service's memory: a restart starts them
afresh (a drain, once made, is in the database).
"""
from __future__ import annotations

from collections import deque
from typing import Iterable


class NodeHealth:
    """Failed runs per node within a sliding window. ``threshold`` 0 switches it off."""

    def __init__(self, threshold: int, window_s: float):
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ValueError(f"threshold must be an integer >= 0, got {threshold!r}")
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.threshold, self.window_s = threshold, float(window_s)
        self._events: dict[int, deque[tuple[float, str]]] = {}
        self._flagged: set[int] = set()

    def record(self, nodes: Iterable[int], job_id: str, at: float) -> list[int]:
        """A run of ``job_id`` on ``nodes`` failed at ``at``. Returns the nodes that reach
        the threshold with it (each once, until ``cleared``)."""
        if not self.threshold:
            return []
        out = []
        for node in sorted(set(nodes)):
            ev = self._events.setdefault(node, deque())
            ev.append((at, job_id))
            while ev and ev[0][0] < at - self.window_s:
                ev.popleft()
            if node not in self._flagged and len(self.jobs(node)) >= self.threshold:
                self._flagged.add(node)
                out.append(node)
        return out

    def jobs(self, node: int) -> list[str]:
        """The different jobs whose runs failed on ``node`` within the window, in order."""
        return list(dict.fromkeys(j for _, j in self._events.get(node, ())))

    def cleared(self, node: int) -> None:
        """The node is back in service: its count starts again."""
        self._events.pop(node, None)
        self._flagged.discard(node)
