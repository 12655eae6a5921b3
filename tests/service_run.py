"""One ``arena serve`` run that a module's scenario drives (``tests/test_service_slurm.py``,
``tests/test_service_hosts.py``): the service process on a free port, its client, the
jobs submitted by name, and what the scenario saw; the readings every scenario takes."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

from engine.service.client import Client
from engine.service.scenario import ServiceProcess, free_port
from engine.service.store import Store
from launcher.telemetry import read_progress


class ServiceRun:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = Client(self.url, timeout_s=10.0)
        self.ids: dict[str, int] = {}
        self.seen: dict = {}
        self.sp: ServiceProcess | None = None

    def args(self) -> list[str]:
        """``arena serve``'s options for this run."""
        raise NotImplementedError

    def start(self) -> None:
        self.sp = ServiceProcess(self.args(), self.tmp / "serve.log", self.url)
        self.sp.start()
        self.sp.wait_healthy(120)

    def log(self) -> str:
        return (self.tmp / "serve.log").read_text(errors="replace")

    def submit(self, spec: dict) -> None:
        self.ids[spec["name"]] = int(self.client.post("/api/jobs", spec, key=f"t:{spec['name']}")["id"])

    # --- reading -----------------------------------------------------------------------------
    def store(self) -> Store:
        return Store(str(self.tmp / "state.db"), readonly=True)

    def launches(self, name: str):
        with self.store() as st:
            return st.launches.rows(self.ids[name])

    def steps(self, name: str) -> int:
        p = read_progress(self.tmp / "work" / str(self.ids[name]) / "progress.json") or {}
        return int(p.get("iterations_done") or 0)

    def status(self, name: str) -> str:
        with self.store() as st:
            return st.jobs.get(self.ids[name]).status

    def arena_nodes(self, *flags: str) -> str:
        """``arena nodes`` (in this process: the CLI's client path) printed."""
        from engine.cli.main import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["nodes", *flags, "--url", self.url]) == 0
        return out.getvalue()
