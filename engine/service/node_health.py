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
nodes counts on each. The service also stores each counted failure (``node_failures``,
schema v9) and, after a restart, counts the ones still within the window again, so a
restart does not give a bad node a fresh allowance. The scheduler thread records; the
API's thread reads ``counts`` for ``/metrics`` (a lock keeps the two apart).
"""
from __future__ import annotations

import threading
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
        self._lock = threading.Lock()

    def record(self, nodes: Iterable[int], job_id: str, at: float) -> list[int]:
        """A run of ``job_id`` on ``nodes`` failed at ``at``. Returns the nodes that reach
        the threshold with it (each once, until ``cleared``)."""
        if not self.threshold:
            return []
        with self._lock:
            return self._record(nodes, job_id, at)

    def _record(self, nodes: Iterable[int], job_id: str, at: float) -> list[int]:
        out = []
        for node in sorted(set(nodes)):
            ev = self._events.setdefault(node, deque())
            ev.append((at, job_id))
            while ev and ev[0][0] < at - self.window_s:
                ev.popleft()
            if node not in self._flagged and len(self._jobs(node)) >= self.threshold:
                self._flagged.add(node)
                out.append(node)
        return out

    def jobs(self, node: int) -> list[str]:
        """The different jobs whose runs failed on ``node`` within the window (as of its
        last failure), in order."""
        with self._lock:
            return self._jobs(node)

    def _jobs(self, node: int, since: float = -float("inf")) -> list[str]:
        return list(dict.fromkeys(j for at, j in self._events.get(node, ()) if at >= since))

    def counts(self, now: float) -> dict[int, int]:
        """Per node with failures, the different jobs whose runs failed on it within the
        window before ``now``."""
        with self._lock:
            return {node: n for node in self._events if (n := len(self._jobs(node, now - self.window_s)))}

    def cleared(self, node: int) -> None:
        """The node is back in service: its count starts again."""
        with self._lock:
            self._events.pop(node, None)
            self._flagged.discard(node)
