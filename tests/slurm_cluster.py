"""A real Slurm cluster of several nodes on this host, for the Slurm tests.

One ``slurmctld``, one ``slurmd -N NODE`` per node (each with its own port and spool
folder) and its own ``munged`` (own socket and key, ``AuthInfo=socket=PATH``), all under
one folder, with ports chosen free at start and a unique ``ClusterName``: two pytest-xdist
workers each run one at the same time without meeting. GPU nodes have fake GPUs: GRES
``gpu:TYPE:N`` backed by character devices made in the folder (``mknod``, clones of
``/dev/null``; Slurm refuses regular files, and ``Count=`` without ``File=`` leaves a node
INVAL). Nothing reads or writes the devices: the ranks train on CPU.

Needs root (slurmd runs jobs as their user) and Debian's ``slurmctld slurmd slurm-client
munge`` (``scripts/test.sh`` installs them); ``unavailable()`` says in one line why not.
``start()`` waits until ``sinfo`` shows every node idle (bounded; a failure names it and
shows the daemons' log tails); ``stop()`` cancels the jobs left, waits for them, then stops
every daemon it started by its pid (SIGTERM, then SIGKILL).

On test hosts (``hosts``: ``tests/hosts.py``'s network namespaces) node i's ``slurmd`` runs
on host i (its namespace and host name; ``NodeAddr`` its address) and the controller here,
reached at the bridge's address: a job across nodes then spans hosts.

Run alone (``python -m tests.slurm_cluster``) it starts a cluster, prints its start-up time
and ``sinfo``, and stops it.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from tests.hosts import TestHosts

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sinfo", "scontrol", "squeue", "sbatch", "srun", "scancel")
START_TIMEOUT_S = 60.0
STOP_JOBS_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class NodeDef:
    name: str
    cpus: int = 4
    gpus: int = 0                      # fake GPUs (GRES gpu:gpu_type:gpus); 0: a CPU-only node
    gpu_type: str | None = "a100"      # the GRES type name; None: untyped (gpu:N)
    partition: str | None = None       # None: the cluster's (default) partition; else a partition of its own name


DEFAULT_NODES = (NodeDef("n1", gpus=2), NodeDef("n2", gpus=2), NodeDef("n3"))


def unavailable() -> str | None:
    """Why a Slurm cluster cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd runs the jobs as their user); run scripts/test.sh as root"
    missing = [b for b in SLURM_BINARIES if not shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if missing:
        return (f"no {', '.join(missing)} on this machine: apt-get install slurmctld slurmd slurm-client munge "
                f"(scripts/test.sh does as root)")
    return None


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if not found:
        raise RuntimeError(f"no {name} on PATH")
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held together while chosen, so distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[NodeDef, ...] = DEFAULT_NODES
    partition: str = "arena"
    slurmd_timeout_s: int = 10         # a slurmd silent this long: the node is NOT_RESPONDING, then DOWN
    name: str = field(default_factory=lambda: f"t{secrets.token_hex(4)}")
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    startup_s: float | None = None
    hosts: "TestHosts | None" = None   # node i's slurmd on test host i + 1 (tests/hosts.py); None: all here

    def __post_init__(self):
        self.root = Path(self.root)

    # --- paths and environment -------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm commands for this cluster run in (``SLURM_CONF``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command (``sinfo``, ``scontrol`` ...) against this cluster, run in the
        cluster's folder (an ``sbatch`` writes its ``slurm-N.out`` there, not in the
        caller's working directory: two such files were once committed at the root)."""
        return subprocess.run([_which(args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout, cwd=self.root)

    # --- start ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> "SlurmCluster":
        t0 = time.monotonic()
        for attempt in range(2):            # a port taken between choosing and binding: once more
            self._write_config()
            self._start_daemons()
            try:
                self.wait_idle(timeout_s)
                break
            except RuntimeError:
                if attempt == 1 or "Address already in use" not in self.log_tails():
                    self.stop()
                    raise
                self.stop()
        self.startup_s = time.monotonic() - t0
        return self

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "log", "dev", "munge", *(f"spool/{n.name}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        for d in ("state", "log"):
            for f in (r / d).iterdir():
                f.unlink()
        os.chmod(r, 0o755)                  # munged: the socket's folder must be searchable by all
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(128))
            os.chmod(key, 0o600)
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        self.ports = {"slurmctld": ctld_port, **{n.name: p for n, p in zip(self.nodes, node_ports)}}
        gres_lines, dev = ["AutoDetect=off"], 0
        for n in self.nodes:
            if n.gpus:
                files = []
                for _ in range(n.gpus):
                    path = r / "dev" / f"gpu{dev}"
                    if not path.exists():
                        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))    # a character device (null)
                    files.append(str(path))
                    dev += 1
                typ = f" Type={n.gpu_type}" if n.gpu_type else ""
                gres_lines.append(f"NodeName={n.name} Name=gpu{typ} File={','.join(files)}")
        (r / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        ctld = "localhost" if self.hosts is None else f"{socket.gethostname()}({self.hosts.gateway})"
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={ctld}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'munge.sock'}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'spool'}/%n/slurmd.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            f"SlurmctldPort={ctld_port}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",   # the node lines' CPUs, not this host's cores
            "ReturnToService=2", f"SlurmdTimeout={self.slurmd_timeout_s}", "KillWait=5", "MinJobAge=600",
            "MpiDefault=none", "GresTypes=gpu", "JobAcctGatherType=jobacct_gather/none",
        ]
        for i, n in enumerate(self.nodes):
            gres = f" Gres=gpu:{n.gpu_type + ':' if n.gpu_type else ''}{n.gpus}" if n.gpus else ""
            where = "NodeHostname=localhost NodeAddr=127.0.0.1" if self.hosts is None else \
                f"NodeHostname={self.hosts.hosts[i].hostname} NodeAddr={self.hosts.hosts[i].addr}"
            lines.append(f"NodeName={n.name} {where} Port={self.ports[n.name]} "
                         f"CPUs={n.cpus} RealMemory=4000{gres} State=UNKNOWN")
        parts: dict[str, list[str]] = {}
        for n in self.nodes:
            parts.setdefault(n.partition or self.partition, []).append(n.name)
        for name, members in parts.items():
            default = "YES" if name == self.partition else "NO"
            lines.append(f"PartitionName={name} Nodes={','.join(members)} Default={default} MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, key: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{key}.out", "ab")
        try:
            self.procs[key] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def _start_daemons(self) -> None:
        m = self.root / "munge"
        self._spawn("munged", [_which("munged"), "-F", f"--socket={m / 'munge.sock'}", f"--key-file={m / 'munge.key'}",
                               f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}"])
        deadline = time.monotonic() + 10
        while not (m / "munge.sock").exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.log_tails()}")
            time.sleep(0.02)
        for n in self.nodes:
            self.start_slurmd(n.name)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])

    def start_slurmd(self, node: str) -> None:
        """Start (or restart) the slurmd of ``node`` (on its test host, with ``hosts``)."""
        cmd = [_which("slurmd"), "-D", "-N", node]
        if self.hosts is None:
            self._spawn(f"slurmd-{node}", cmd)
            return
        host = self.hosts.hosts[[n.name for n in self.nodes].index(node)]
        self.procs[f"slurmd-{node}"] = self.hosts.spawn(host, f"slurmd-{self.name}-{node}", cmd, env=self.env)

    def stop_slurmd(self, node: str) -> None:
        """Stop the slurmd of ``node`` (SIGKILL): to Slurm the node stops responding."""
        p = self.procs.pop(f"slurmd-{node}", None)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def node_states(self) -> dict[str, str]:
        """Node -> sinfo's long state (``idle``, ``mixed``, ``drained`` ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout_s: float = START_TIMEOUT_S, nodes: tuple[str, ...] | None = None) -> None:
        """Until ``sinfo`` shows every node (or ``nodes``) idle; RuntimeError with the logs after ``timeout_s``."""
        want = set(nodes or (n.name for n in self.nodes))
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"Slurm daemon(s) {dead} exited during start-up:\n{self.log_tails()}")
            try:
                states = self.node_states()
            except subprocess.TimeoutExpired:
                states = {}
            if want <= set(states) and all(states[n] == "idle" for n in want):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Slurm nodes not idle after {timeout_s:.0f} s (sinfo: {states or 'no answer'}):\n"
                           f"{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        from tests.hosts import log_tails
        return log_tails(self.root / "log", lines)

    # --- stop ------------------------------------------------------------------------------------
    def cancel_all_jobs(self, timeout_s: float = STOP_JOBS_TIMEOUT_S) -> None:
        """Cancel every job of the cluster and wait (bounded) until none is left running."""
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return
        self.run("scancel", "--full", "--user=root", check=False, timeout=10)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if not left:
                return
            self.run("scancel", "--signal=KILL", "--full", *left, check=False, timeout=10)
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel the jobs left, then stop every daemon this object started, by pid."""
        try:
            self.cancel_all_jobs()
        except (subprocess.SubprocessError, OSError):
            pass
        # slurmctld and every slurmd are asked together and given 10 s between them (one
        # at a time, a slurmd that waits out its timeout made the stop last a minute);
        # munged, which they authenticate through, last
        slurm = [p for k, p in self.procs.items() if k != "munged" and p.poll() is None]
        for p in slurm:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in slurm + [p for k, p in self.procs.items() if k == "munged"]:
            if p in slurm:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            elif p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    import tempfile

    why = unavailable()
    if why:
        raise SystemExit(f"slurm_cluster: {why}")
    with tempfile.TemporaryDirectory(prefix="arena-slurm-") as d, SlurmCluster(Path(d)) as c:
        print(f"cluster {c.name} up in {c.startup_s:.2f} s")
        print(c.run("sinfo").stdout)


@contextlib.contextmanager
def started_cluster(nodes: tuple[NodeDef, ...] = DEFAULT_NODES, hosts: "TestHosts | None" = None
                    ) -> Iterator[SlurmCluster]:
    """A ``SlurmCluster`` of ``nodes`` (on test ``hosts``, node i on host i + 1) in a fresh
    folder under /tmp (short: munged's socket path), started; on exit (a failed start
    included) its daemons are stopped and the folder removed."""
    root = Path(tempfile.mkdtemp(prefix="arena-slurm-", dir="/tmp"))
    cluster = SlurmCluster(root, nodes=nodes, hosts=hosts)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
