"""Off Slurm, with hosts (a cluster JSON whose node groups name ``hosts``): whether each host
can be reached, read by the service itself.

A thread connects to every host's ssh port (``ServiceConfig.host_check_port``, 22: what
Hydra's ``mpiexec`` starts the ranks through) every ``host_check_interval_s`` seconds,
all hosts at once, each connection bounded by that interval. A host none of whose
connections succeeded for ``host_down_after_s`` seconds is out of service (``out_of_service``:
node -> why, e.g. ``host 10.0.0.12 unreachable: no answer on port 22 for 6 s (timed out)``):
the service moves its jobs off at the next round (through storage: device-to-device moves
need both ends, ``MpiExecutor.set_unreachable``) and offers its GPUs to no job until the
first connection that succeeds again. Nothing is sent but the TCP handshake (the
connection is closed at once). ``peek`` is what ``arena nodes`` and the page show.
"""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


class HostWatch:
    def __init__(self, hosts: dict[int, str], *, port: int, interval_s: float, down_after_s: float,
                 log: Callable[[str], None] = lambda m: None):
        """``hosts``: node id -> host name (several nodes may share a host)."""
        self.hosts, self.port, self.interval_s, self.down_after_s, self.log = hosts, port, interval_s, \
            down_after_s, log
        now = time.time()
        names = sorted(set(hosts.values()))
        self.answered_at: dict[str, float] = dict.fromkeys(names, now)   # (in service until shown otherwise)
        self.error: dict[str, str] = {}
        self.down: dict[str, str] = {}            # host -> why it is out of service
        self.version = 0                          # changes whenever a host goes out or comes back
        self.checked_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=min(16, len(names)) or 1, thread_name_prefix="host-watch")
        self._thread = threading.Thread(target=self._loop, name="host-watch", daemon=True)

    def start(self) -> "HostWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- reading ------------------------------------------------------------------------------
    def _probe(self, host: str) -> str | None:
        """None when ``host`` accepts a TCP connection on the port, else why not."""
        try:
            with socket.create_connection((host, self.port), timeout=self.interval_s):
                return None
        except OSError as e:
            return "timed out" if isinstance(e, (socket.timeout, TimeoutError)) else (e.strerror or str(e))

    def check(self) -> None:
        """Probe every host once (all at once) and update who is out of service."""
        names = list(self.answered_at)
        errors = dict(zip(names, self._pool.map(self._probe, names)))
        now = time.time()
        with self._lock:
            self.checked_at = now
            for h, err in errors.items():
                if err is None:
                    self.answered_at[h] = now
                    self.error.pop(h, None)
                    if self.down.pop(h, None) is not None:
                        self.version += 1
                        self.log(f"host {h} answers again on port {self.port}: back in service")
                    continue
                self.error[h] = err
                silent = now - self.answered_at[h]
                if silent >= self.down_after_s:
                    why = f"host {h} unreachable: no answer on port {self.port} for {silent:.0f} s ({err})"
                    if h not in self.down:
                        self.version += 1
                        self.log(f"{why}: out of service until it answers")
                    self.down[h] = why

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.check()
            except Exception as e:                  # (a probe never raises; keep watching whatever happens)
                self.log(f"host watch: {e!r}")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    # --- what the service and the operator read -----------------------------------------------
    def unreachable(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.down)

    def out_of_service(self) -> dict[int, str]:
        """Node -> why, for every node whose host is out of service."""
        with self._lock:
            return {n: self.down[h] for n, h in self.hosts.items() if h in self.down}

    def peek(self) -> dict:
        """Per node: its host, whether it answered the last probe, since when it answers
        (or not), why it is out of service (None: in service)."""
        with self._lock:
            nodes = {n: {"host": h, "answers": h not in self.error, "answered_at": self.answered_at[h],
                         "error": self.error.get(h), "out_of_service": self.down.get(h)}
                     for n, h in self.hosts.items()}
            return {"port": self.port, "interval_s": self.interval_s, "down_after_s": self.down_after_s,
                    "checked_at": self.checked_at, "nodes": nodes}
