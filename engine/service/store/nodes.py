"""Nodes out of service and failed runs per node (tables ``drained_nodes``,
``node_failures``): one table group of the service's store, over the store's connection
and its transactions."""
from __future__ import annotations

from typing import Iterable

from instances.errors import InputError

from .table import Table


class NodeTable(Table):
    """Drained nodes and failed runs per node; ``Store.nodes``."""

    def drain(self, node: int, reason: str) -> bool:
        """Take a node out of service (its jobs are moved off by the scheduler); False if it
        already was (its first reason is kept)."""
        if not (isinstance(node, int) and not isinstance(node, bool) and node >= 0):
            raise InputError(f"a node id is an integer >= 0, got {node!r}", field="node")
        with self._tx() as now:
            cur = self.conn.execute("INSERT OR IGNORE INTO drained_nodes(node, reason, at) VALUES (?, ?, ?)",
                                    (node, str(reason)[:500], now))
        return cur.rowcount == 1

    def undrain(self, node: int) -> bool:
        """Return a node to service; False if it was not drained."""
        with self._tx():
            cur = self.conn.execute("DELETE FROM drained_nodes WHERE node = ?", (node,))
        return cur.rowcount == 1

    def drained(self) -> dict[int, tuple[str, float]]:
        """Drained nodes: node id -> (reason, when)."""
        rows = self.conn.execute("SELECT node, reason, at FROM drained_nodes ORDER BY node")
        return {n: (r, at) for n, r, at in rows}

    def record_failure(self, nodes: Iterable[int], job_id: int, at: float, forget_before: float) -> None:
        """A run of ``job_id`` failed on ``nodes`` at ``at``; failures before
        ``forget_before`` (outside the window) are deleted in the same transaction."""
        with self._tx():
            self.conn.execute("DELETE FROM node_failures WHERE at < ?", (float(forget_before),))
            self.conn.executemany("INSERT INTO node_failures(node, job_id, at) VALUES (?, ?, ?)",
                                  [(int(n), int(job_id), float(at)) for n in sorted(set(nodes))])

    def failures(self, since: float) -> list[tuple[int, int, float]]:
        """Failed runs at or after ``since``: (node, job id, when), oldest first."""
        return [(int(n), int(j), float(a)) for n, j, a in self.conn.execute(
            "SELECT node, job_id, at FROM node_failures WHERE at >= ? ORDER BY at, rowid", (float(since),))]

    def clear_failures(self, node: int) -> None:
        """The node's failed runs are forgotten (it is back in service)."""
        with self._tx():
            self.conn.execute("DELETE FROM node_failures WHERE node = ?", (int(node),))
