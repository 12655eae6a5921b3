"""Start a training job's ranks with ``mpiexec`` (the MPICH wheel's Hydra, found next to
the running interpreter) and read back what they wrote.

A launch has a run directory holding ``config.json`` (the ``TrainConfig`` every rank
reads), ``stdout.log`` / ``stderr.log`` of mpiexec, and what rank 0 writes: per-step
``results.jsonl``, ``events.jsonl`` (ready, load, save, stop...), ``pids/rank<r>``.
A run directory used again keeps the earlier launch's files under ``previous/<n>/``
(each launch's results start empty, so its steps are counted right).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from instances.errors import InputError
from instances.paths import check_regular_file

from . import netaddr
from .config import TrainConfig
from .d2d import MOVE_FILE
from .worker import CHECKPOINT_FILE, EVENTS_FILE, EXITS_DIR, PIDS_DIR, RESULTS_FILE, STOP_FILE

RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
LAUNCH_FILES = ("results.jsonl", "events.jsonl", "progress.json", "stdout.log", "stderr.log")
PREVIOUS_DIR = "previous"
# MPICH's (Hydra's) failure banner and exit-code line: the launcher reports a failure in
# one line of its own, so the echo to the terminal leaves these out (the logs keep them)
MPICH_NOISE = re.compile(r"^(=+|=   .*|YOUR APPLICATION TERMINATED.*|This typically refers to a problem.*|"
                         r"Please see the FAQ page.*|\[mpiexec@[^]]*\] Exit codes:.*)$")
# Hydra's exit codes: "[mpiexec@HOST] Exit codes: [host1] 0,0" and, over several hosts, one more line per host
EXIT_CODES = re.compile(r"Exit codes: (.*(?:\n\[[^]@:]*\] [-\d,]*)*)$", re.M)


def mpiexec_path() -> str:
    """``mpiexec`` beside ``sys.executable`` (the venv's MPICH wheel), else on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        raise InputError("no mpiexec next to the Python interpreter or on PATH "
                         "(install the 'mpich' wheel)", field="mpiexec")
    return found


def hostfile_hosts(path: str | os.PathLike) -> list[tuple[str, int]]:
    """Hosts and slots of an MPICH hostfile (``host[:slots]`` per line, # comments)."""
    out = []
    check_regular_file(path, "hostfile")            # (a pipe would never end)
    try:
        text = Path(path).read_bytes().decode("utf-8")      # (as written: no newline translation)
        lines = text.splitlines()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError("hostfile not found", file=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a folder, not a hostfile", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start}); expected a hostfile", file=str(path)) from None
    except OSError as e:
        raise InputError(f"cannot read the hostfile: {e.strerror or e}", file=str(path)) from None
    lone_cr = text.replace("\r\n", "\n").find("\r")
    if lone_cr >= 0:                        # (read as lines here, but mpiexec reads the file itself)
        raise InputError("a line ends with a lone carriage return (old Mac line endings), which mpiexec cannot "
                         "read: end lines with \\n", file=str(path),
                         line=text.replace("\r\n", "\n")[:lone_cr].count("\n") + 1)
    for i, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = line.partition(":")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            raise InputError(f"slots must be an integer, got {slots!r}", file=str(path), line=i,
                             field="slots") from None
        if n < 1:
            raise InputError("slots must be >= 1", file=str(path), line=i, field="slots")
        out.append((host.strip(), n))
    if not out:
        raise InputError("hostfile lists no host", file=str(path))
    return out


def hostfile_addrs(hostfile: str | os.PathLike) -> tuple[tuple[str, str], ...]:
    """(host, address) of every host of ``hostfile``, resolved here (``TrainConfig.host_addrs``)."""
    return tuple((h, netaddr.address_of(h)) for h in dict(hostfile_hosts(hostfile)))


def mpiexec_args(n: int, hostfile: str | os.PathLike | None) -> list[str]:
    """``mpiexec`` and its options for ``n`` ranks, over ``hostfile`` where given.
    ``-print-all-exitcodes``: Hydra prints every rank's exit status (post-mortem of a
    failure). ``-localhost``: the address Hydra's proxies on the hosts connect back to, this
    host's on the way to the first host (Hydra's own default is this host's name, which
    may resolve to 127.0.0.1)."""
    cmd = [mpiexec_path(), "-print-all-exitcodes", "-n", str(n)]
    if hostfile:
        cmd += ["-f", str(hostfile), "-localhost", netaddr.source_address(hostfile_hosts(hostfile)[0][0])]
    return cmd


def build_command(cfg: TrainConfig, config_path: str | os.PathLike, hostfile: str | None = None) -> list[str]:
    return mpiexec_args(cfg.plan.world_size, hostfile) + [sys.executable, "-m", "launcher.worker", str(config_path)]


def prepare_run_dir(cfg: TrainConfig) -> Path:
    """Make the run directory ready for a launch: an earlier launch's files archived, stale
    control files removed, the run's ``config.json`` written (its path returned)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    archive_previous_launch(run_dir)
    for stale in (STOP_FILE, CHECKPOINT_FILE, MOVE_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    for stale in [*run_dir.glob("move_*.json"), *run_dir.glob("rendezvous_*.json")]:   # an earlier launch's moves
        stale.unlink(missing_ok=True)
    for d in (run_dir / PIDS_DIR, run_dir / EXITS_DIR, *(p for p in run_dir.glob("join_*") if p.is_dir())):
        shutil.rmtree(d, ignore_errors=True)
    config_path = run_dir / "config.json"
    cfg.write(config_path)
    return config_path


def rank_env(hostfile: str | os.PathLike | None = None) -> dict[str, str]:
    """The environment ranks run in: this one, one thread per rank, and the repository on
    ``PYTHONPATH`` (so ``python -m launcher.worker`` imports this tree). Without ``hostfile``
    (every rank on this host) MPI's own traffic stays on the loopback interface (MPICH's UCX
    would otherwise listen on every interface); over hosts the ranks choose their
    interface (``dist.host_address``)."""
    env = {**os.environ, **RANK_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    if not hostfile:
        env.setdefault("UCX_NET_DEVICES", "lo")
    return env


def start(cfg: TrainConfig, hostfile: str | None = None, *, echo: bool = False) -> subprocess.Popen:
    """Write the run's config and start mpiexec in its own session (so it can be signalled
    as a group). ``echo``: stream rank output to this process's stdout/stderr instead of the
    run directory's log files. Over ``hostfile``, the ranks' host addresses are resolved
    here first where ``cfg`` lacks them (``TrainConfig.host_addrs``)."""
    if hostfile and not cfg.host_addrs:
        cfg = replace(cfg, host_addrs=hostfile_addrs(hostfile))
    run_dir = Path(cfg.run_dir)
    config_path = prepare_run_dir(cfg)
    env = rank_env(hostfile)
    if echo:
        out, err = None, None
    else:
        out = open(run_dir / "stdout.log", "ab")
        err = open(run_dir / "stderr.log", "ab")
    try:
        return subprocess.Popen(build_command(cfg, config_path, hostfile), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    finally:
        for f in (out, err):
            if f is not None:
                f.close()


def start_joiners(cfg: TrainConfig, move_path: str | os.PathLike, offset: int, count: int,
                  generation: int, hostfile: str | None = None) -> subprocess.Popen:
    """Start ``count`` processes that join a running job's device-to-device move at rank
    positions ``offset ..`` (``launcher.worker MOVE.json --join OFFSET``; over ``hostfile``
    where given), logging to ``join_<generation>.stdout.log`` / ``.stderr.log`` in the run
    directory."""
    run_dir = Path(cfg.run_dir)
    env = rank_env(hostfile)
    cmd = mpiexec_args(count, hostfile) + [sys.executable, "-m", "launcher.worker", str(move_path), "--join",
                                           str(offset)]
    out = open(run_dir / f"join_{generation}.stdout.log", "ab")
    err = open(run_dir / f"join_{generation}.stderr.log", "ab")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    finally:
        out.close()
        err.close()


def archive_previous_launch(run_dir: str | os.PathLike) -> Path | None:
    """Move an earlier launch's files into ``previous/<n>/``; the folder moved to, or None."""
    run_dir = Path(run_dir)
    found = [run_dir / f for f in LAUNCH_FILES if (run_dir / f).exists()]
    if not found:
        return None
    n = 1 + sum(1 for _ in (run_dir / PREVIOUS_DIR).glob("*")) if (run_dir / PREVIOUS_DIR).is_dir() else 1
    dest = run_dir / PREVIOUS_DIR / str(n)
    dest.mkdir(parents=True)
    for f in found:
        f.rename(dest / f.name)
    return dest


class LogEcho:
    """Copy a launch's ``stdout.log`` / ``stderr.log`` to this process's stdout / stderr as
    they grow, without MPICH's failure banner (``MPICH_NOISE``)."""

    def __init__(self, run_dir: str | os.PathLike, poll_s: float = 0.1):
        self.paths = ((Path(run_dir) / "stdout.log", sys.stdout), (Path(run_dir) / "stderr.log", sys.stderr))
        self.offsets = [0, 0]
        self.poll_s = poll_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "LogEcho":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._copy(final=True)

    def _loop(self) -> None:
        while not self.done.wait(self.poll_s):
            self._copy()

    def _copy(self, final: bool = False) -> None:
        for i, (path, stream) in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = len(data) if final else data.rfind(b"\n") + 1     # whole lines only, until the end
            if end <= 0:
                continue
            self.offsets[i] += end
            lines = data[:end].decode(errors="replace").splitlines()
            text = "".join(line + "\n" for line in lines if not MPICH_NOISE.match(line.strip()))
            if text:
                stream.write(text)
                stream.flush()


def rank_exit_codes(run_dir: str | os.PathLike, log: str = "stdout.log") -> dict[int, int]:
    """Rank -> exit code from Hydra's ``-print-all-exitcodes`` lines in the run's ``log``
    (hosts in launch order, ranks numbered across them in that order); {} when absent."""
    m = EXIT_CODES.findall(tail(Path(run_dir) / log, 20000))
    if not m:
        return {}
    codes = [int(c) for c in re.findall(r"-?\d+", re.sub(r"\[[^]]*\]", " ", m[-1]))]
    return dict(enumerate(codes))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:      # a line being written right now
            break
    return out


def read_results(run_dir: str | os.PathLike) -> list[dict]:
    return read_jsonl(Path(run_dir) / RESULTS_FILE)


def read_events(run_dir: str | os.PathLike) -> list[dict]:
    return read_jsonl(Path(run_dir) / EVENTS_FILE)


def last_sign_of_life(run_dir: str | os.PathLike, progress_path: str | os.PathLike | None = None) -> float | None:
    """Latest modification time of what rank 0 writes once training starts and at every
    step and event (``results.jsonl``, ``events.jsonl``, the progress file: ``progress_path``,
    else the run folder's ``progress.json``); None before any (start-up: imports,
    rendezvous, checkpoint load)."""
    out = None
    for path in (Path(run_dir) / RESULTS_FILE, Path(run_dir) / EVENTS_FILE,
                 Path(progress_path) if progress_path else Path(run_dir) / "progress.json"):
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        out = mtime if out is None else max(out, mtime)
    return out


def rank_pids(run_dir: str | os.PathLike) -> dict[int, tuple[int, str]]:
    """Rank -> (pid, host) as the ranks recorded them."""
    out = {}
    d = Path(run_dir) / PIDS_DIR
    if d.is_dir():
        for p in d.iterdir():
            try:
                pid, host = p.read_text().split()
                out[int(p.name.removeprefix("rank"))] = (int(pid), host)
            except ValueError:
                continue
    return out


def ranks_not_done(run_dir: str | os.PathLike) -> list[int]:
    """Ranks that recorded their start but never left the training loop's end (killed, or
    failed before it): for a failed launch, which ranks to look at."""
    done = {p.name for p in (Path(run_dir) / EXITS_DIR).glob("rank*")}
    return sorted(r for r in rank_pids(run_dir) if f"rank{r}" not in done)


def tail(path: str | os.PathLike, chars: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""



def kill_job(proc, run_dir: str | os.PathLike, sig: int) -> None:
    """Send ``sig`` to mpiexec's process group (``proc.pid``: mpiexec, a session leader) and
    to every rank recorded on this host (Hydra starts each rank in its own process group,
    so the group alone misses them)."""
    import socket

    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    for pid, host in rank_pids(run_dir).values():
        if host == socket.gethostname():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def live_rank_pids(run_dir: str | os.PathLike) -> list[int]:
    """Ranks of the launch in ``run_dir`` still running on this host: recorded, alive, and
    still that launch's process (its command line names a file of the run folder, so a
    reused pid is not taken for a rank)."""
    import socket
    here, folder = socket.gethostname(), str(Path(run_dir))
    out = []
    for pid, host in rank_pids(run_dir).values():
        if host != here or not alive(pid):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if folder in cmd:
            out.append(pid)
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                        # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def stop_detached(run_dir: str | os.PathLike, mpiexec_pid: int | None, timeout_s: float) -> bool:
    """Stop a launch that this process did not start (a service restarted after a crash
    finds its ranks still training): ask them to checkpoint and exit (the ``stop`` file
    and SIGTERM), wait up to ``timeout_s`` for mpiexec and every rank recorded on this
    host, then SIGKILL what is left. True when everything exited on request."""
    import signal
    import socket
    import time

    run_dir = Path(run_dir)
    (run_dir / STOP_FILE).write_text("stop requested after a service restart\n")
    here = socket.gethostname()
    pids = [pid for pid, host in rank_pids(run_dir).values() if host == here]
    if mpiexec_pid:
        pids.append(int(mpiexec_pid))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return not left
