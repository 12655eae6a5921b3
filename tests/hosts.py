"""Test hosts: network namespaces on one bridge, each a "host" with its own address, its own
host name and its own daemons, for the tests (and ``bench/``) that cross a network.

Each host is a network namespace joined to a bridge by a veth pair, with an address of a
``/24`` private subnet chosen free on this machine (the bridge, in the root namespace,
holds ``.1``: the service runs there, as on a head node; host ``i`` holds ``.1{i}``).
Its daemons run in that namespace and in a UTS namespace of their own, so that the host
has its own host name (``arena-<tag>-h<i>``), and in a mount namespace of their own,
where the fixture's ``hosts`` file is bound over ``/etc/hosts``: on the hosts (not here)
the hosts' names and ``names`` aliases resolve to their addresses, as a cluster's hosts
file or DNS would have them. Everything else of the file system is this one's. The
processes the daemons start inherit all three. The daemons:

- ``sshd`` listening on the host's address only, root by key (a key pair made for this
  fixture; nothing of the machine's ssh configuration is read or changed), so that
  Hydra's ``mpiexec`` launches ranks there over ``ssh`` (``launch_env``: the ssh client
  Hydra runs, with the fixture's key);
- optionally any other daemon (``spawn``: ``slurmd``).

The file system is shared, as a cluster's shared file system would be: a host sees the
same folders as this process. Only the hosts' addresses, the bridge's and loopback carry
traffic. ``cut(host)`` takes a host's link down (its processes keep running, cut off),
``restore(host)`` brings it back; ``stop_daemon``/``spawn`` stop and start its daemons.

Names and the subnet are unique per fixture (a random tag), so two pytest workers each
build their own at once. ``stop()`` kills every process left in the namespaces (ranks
included) and every daemon by its pid, then removes the namespaces and the bridge; a
fixture whose process died without stopping is swept by the next ``start`` (its owner
file names a dead pid). Needs root and ``ip`` (iproute2), ``sshd`` (openssh-server),
``ssh``, ``ssh-keygen``, ``unshare``, ``nsenter`` and ``mount``; ``unavailable()`` says in one
line why not.

Run alone (``python -m tests.hosts``) it builds two hosts, prints their start-up time and
what each says its host name and address are, and removes them.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

TOOLS = ("ip", "sshd", "ssh", "ssh-keygen", "unshare", "nsenter", "mount")
SBIN_PATH = ":/usr/sbin:/sbin"
START_TIMEOUT_S = 30.0
OWNERS = Path("/tmp/arena-test-hosts")          # one file per fixture: its tag -> the pid that built it


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + SBIN_PATH)


def unavailable() -> str | None:
    """Why test hosts cannot be built here (one line), or None."""
    if os.geteuid() != 0:
        return "the test hosts need root (network namespaces, sshd); run scripts/test.sh as root"
    missing = [t for t in TOOLS if _which(t) is None]
    if missing:
        return (f"no {', '.join(missing)} on this machine: apt-get install iproute2 openssh-server "
                f"openssh-client util-linux (scripts/test.sh does as root)")
    return None


def _run(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    exe = _which(cmd[0]) or cmd[0]
    out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks this machine has routes or addresses in (a test subnet avoids them)."""
    nets = []
    for cmd in (("ip", "-4", "-o", "addr", "show"), ("ip", "-4", "route", "show", "table", "all")):
        for line in _run(*cmd, check=False).stdout.splitlines():
            for word in line.split():
                try:
                    net = ipaddress.ip_network(word, strict=False)
                except ValueError:
                    continue
                if isinstance(net, ipaddress.IPv4Network):
                    nets.append(net)            # (a bare address: its /32)
    return nets


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 inside 10.0.0.0/8 that overlaps nothing this machine routes or holds."""
    used = used_networks()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randrange(16, 250)}.{rng.randrange(0, 256)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.0.0.0/8 for the test hosts")


@dataclass(frozen=True)
class Host:
    index: int                  # 1, 2, ...
    netns: str                  # its network namespace
    hostname: str               # its own host name (resolves nowhere)
    addr: str                   # its address on the bridge
    link: str                   # the bridge's end of its veth pair (cut: link down)


@dataclass
class TestHosts:
    n: int
    root: Path                                  # keys, configurations, logs
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    names: dict[int, str] = field(default_factory=dict)  # host index -> another name it resolves by (a Slurm node)
    hosts: list[Host] = field(default_factory=list)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    subnet: ipaddress.IPv4Network | None = None
    startup_s: float | None = None

    __test__ = False                            # (not a pytest test class)

    def __post_init__(self):
        self.root = Path(self.root)
        if not 1 <= self.n <= 9:
            raise ValueError(f"1 to 9 test hosts, got {self.n}")

    # --- names -------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"ab{self.tag}"

    @property
    def gateway(self) -> str:
        """The bridge's address: this process's (the service's) address on the hosts' network."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def ssh(self) -> Path:
        """The ssh client Hydra runs (``launch_env``): this fixture's key, no known-hosts file."""
        return self.root / "ssh"

    def launch_env(self) -> dict[str, str]:
        """What a process that starts ``mpiexec`` over these hosts adds to its environment."""
        return {"HYDRA_LAUNCHER_EXEC": str(self.ssh)}

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    # --- start ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> "TestHosts":
        t0 = time.monotonic()
        sweep_dead_fixtures()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log").mkdir(exist_ok=True)
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.tag).write_text(f"{os.getpid()} {self.n}\n")
        try:
            self.subnet = free_subnet(random.Random(secrets.randbits(32)))
            self._network()
            self._ssh_keys()
            for h in self.hosts:
                self.start_sshd(h)
            self.wait_ssh(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _network(self) -> None:
        assert self.subnet is not None
        prefix = self.subnet.prefixlen
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.n + 1):
            h = Host(i, f"arena-{self.tag}-h{i}", f"arena-{self.tag}-h{i}", str(self.subnet.network_address + 10 + i),
                     f"av{self.tag}{i}")
            _run("ip", "netns", "add", h.netns)
            self.hosts.append(h)
            _run("ip", "link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            _run("ip", "link", "set", h.link, "master", self.bridge)
            _run("ip", "link", "set", h.link, "up")
            _run("ip", "netns", "exec", h.netns, "ip", "addr", "add", f"{h.addr}/{prefix}", "dev", "eth0")
            _run("ip", "netns", "exec", h.netns, "ip", "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", h.netns, "ip", "link", "set", "lo", "up")
        lines = ["127.0.0.1 localhost", f"{self.gateway} {socket.gethostname()}"]
        lines += [f"{h.addr} {h.hostname} {self.names.get(h.index, '')}".rstrip() for h in self.hosts]
        (self.root / "hosts").write_text("\n".join(lines) + "\n")

    def _ssh_keys(self) -> None:
        r = self.root
        for key in ("host_key", "client_key"):
            if not (r / key).exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"arena-test-hosts-{self.tag}",
                     "-f", str(r / key))
        shutil.copy(r / "client_key.pub", r / "authorized_keys")
        self.ssh.write_text(
            "#!/bin/sh\n# the ssh client Hydra runs to start its proxies on the test hosts (tests/hosts.py)\n"
            f"exec {_which('ssh')} -F none -i {r / 'client_key'} -o IdentitiesOnly=yes -o BatchMode=yes "
            "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
            "-o ConnectTimeout=5 -o ServerAliveInterval=2 -o ServerAliveCountMax=3 \"$@\"\n")
        self.ssh.chmod(0o755)
        Path("/run/sshd").mkdir(exist_ok=True)          # sshd's privilege separation folder (Debian's)

    def spawn(self, h: Host, key: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` on host ``h`` (its network namespace, its host name, its hosts file),
        logging to ``log/<key>.out``; kept under ``key`` for ``stop_daemon`` and ``stop``."""
        log = open(self.root / "log" / f"{key}.out", "ab")
        inner = f"mount --bind {self.root / 'hosts'} /etc/hosts && hostname {h.hostname} && exec \"$@\""
        try:
            p = subprocess.Popen([_which("nsenter") or "nsenter", f"--net=/run/netns/{h.netns}",
                                  _which("unshare") or "unshare", "--uts", "--mount", "sh", "-c", inner, "sh", *cmd],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env if env is not None else os.environ.copy(), start_new_session=True)
        finally:
            log.close()
        self.procs[key] = p
        return p

    def start_sshd(self, h: Host) -> None:
        conf = self.root / f"sshd-h{h.index}.conf"
        conf.write_text("\n".join([
            f"ListenAddress {h.addr}", "Port 22", f"HostKey {self.root / 'host_key'}",
            f"PidFile {self.root / f'sshd-h{h.index}.pid'}", f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PrintMotd no", "PrintLastLog no", "ClientAliveInterval 2",
            "ClientAliveCountMax 3", ""]))
        self.spawn(h, f"sshd-h{h.index}", [_which("sshd") or "sshd", "-D", "-e", "-f", str(conf)])

    def wait_ssh(self, timeout_s: float = START_TIMEOUT_S, hosts: list[Host] | None = None) -> None:
        """Until ``ssh HOST hostname`` answers with the host's name on every host (bounded)."""
        deadline = time.monotonic() + timeout_s
        for h in hosts or self.hosts:
            while True:
                p = self.procs.get(f"sshd-h{h.index}")
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"sshd of {h.hostname} exited ({p.returncode}):\n{self.log_tails()}")
                out = subprocess.run([str(self.ssh), h.addr, "hostname"], capture_output=True, text=True,
                                     timeout=15)
                if out.returncode == 0 and out.stdout.strip() == h.hostname:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no ssh to {h.hostname} ({h.addr}) after {timeout_s:.0f} s: "
                                       f"{out.stderr.strip()}\n{self.log_tails()}")
                time.sleep(0.1)

    def log_tails(self, lines: int = 10) -> str:
        return log_tails(self.root / "log", lines)

    # --- faults --------------------------------------------------------------------------------
    def cut(self, h: Host) -> None:
        """Take the host's link down: nothing reaches it or leaves it; its processes run on."""
        _run("ip", "link", "set", h.link, "down")

    def restore(self, h: Host) -> None:
        _run("ip", "link", "set", h.link, "up")

    def stop_daemon(self, key: str) -> None:
        """Stop the daemon kept under ``key`` (SIGTERM, then SIGKILL after 5 s)."""
        p = self.procs.pop(key, None)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def pids_in(self, h: Host) -> list[int]:
        """Every process in the host's network namespace (daemons, ranks, ssh sessions)."""
        out = _run("ip", "netns", "pids", h.netns, check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    # --- stop ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kill every process in the namespaces and every daemon started, then remove the
        namespaces and the bridge (the veth pairs go with their namespaces)."""
        for key in list(self.procs):
            p = self.procs.pop(key)
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        remove_fixture(self.tag, [h.netns for h in self.hosts])
        self.hosts.clear()

    def __enter__(self) -> "TestHosts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def log_tails(folder: Path, lines: int) -> str:
    """The last ``lines`` of every log in ``folder``, each under its name."""
    out = []
    for p in sorted(folder.glob("*")):
        text = p.read_text(errors="replace").splitlines()[-lines:]
        if text:
            out.append(f"--- {p.name}\n" + "\n".join(text))
    return "\n".join(out)


def remove_fixture(tag: str, namespaces: list[str]) -> None:
    """Kill what runs in ``namespaces``, delete them and the fixture's bridge and owner file."""
    for ns in namespaces:
        for _ in range(50):                     # (bounded: a process may be forking as we kill)
            pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", f"ab{tag}", check=False)
    (OWNERS / tag).unlink(missing_ok=True)


def sweep_dead_fixtures() -> None:
    """Remove the namespaces and bridges of fixtures whose process died without stopping."""
    if not OWNERS.is_dir():
        return
    for owner in OWNERS.iterdir():
        try:
            pid, n = (int(x) for x in owner.read_text().split())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue                            # its process still runs: not ours to remove
        except ProcessLookupError:
            pass
        remove_fixture(owner.name, [f"arena-{owner.name}-h{i}" for i in range(1, n + 1)])


@contextlib.contextmanager
def started_hosts(n: int = 2) -> Iterator[TestHosts]:
    """``n`` test hosts in a fresh folder under /tmp, started; on exit (a failed start
    included) everything is stopped and removed."""
    root = Path(tempfile.mkdtemp(prefix="arena-hosts-", dir="/tmp"))
    hosts = TestHosts(n, root)
    try:
        hosts.start()
        yield hosts
    finally:
        hosts.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    why = unavailable()
    if why:
        raise SystemExit(f"hosts: {why}")
    with started_hosts(2) as th:
        print(f"{th.n} hosts up in {th.startup_s:.2f} s on {th.subnet} (bridge {th.bridge} at {th.gateway})")
        for h in th.hosts:
            out = subprocess.run([str(th.ssh), h.addr, "hostname; ip -4 -o addr show eth0"], capture_output=True,
                                 text=True, timeout=15)
            print(f"  {h.addr}: {' '.join(out.stdout.split())}")
