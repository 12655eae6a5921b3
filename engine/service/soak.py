"""A soak of ``arena serve`` under load, watched from outside as a user and an operator
would: the service on a two-node local cluster (real torch jobs, real mpiexec, real
SQLite), clients submitting, repeating submissions with their idempotency keys,
cancelling, holding and releasing through the HTTP API, and the service SIGKILLed at
random moments and started again at once. ``bench/service_soak.py`` prints its report;
``tests/test_service_soak.py`` runs a short form and asserts the zero targets.

What it measures (``SoakReport``), each from outside the service:

- **jobs lost**: every submission the service accepted (an id answered for its key) must
  end finished, cancelled (a cancel was accepted) or held (a hold was accepted and not
  released), none missing from the database, failed, or still queued or running when the
  run settles: after the clients and the kills are done, it waits while jobs keep settling,
  and ends when every job has or none has for ``settle_stall_s`` (a stuck job);
- **duplicate submissions**: every answer for one key names the same job, including two
  sends of one key at the same moment from two threads, and the database holds one job
  per key;
- **steps lost beyond a checkpoint**: a launch of a job resumes from the last checkpoint
  its earlier launches saved (``scenario.resumes``), and a finished job trained every
  step 1..N; steps trained again since a checkpoint are counted, not a violation;
- **duplicate runs**: the process table, sampled every ``sample_every_s``, never shows
  ranks (``launcher.worker`` processes) of two launch folders of one job alive at once
  (a device-to-device move continues in its folder, so its joining ranks are not two
  launches); no rank outlives the service's shutdown;
- **restarts**: each restart is answered without a refusal (the service lock is freed by
  the kernel when its holder dies); seconds from the kill to a healthy answer;
- **rounds per minute** (the ``rounds`` table) and **API latency** per route kind
  (submit; read: a job's status or a list; change: cancel, hold, release): p50, p99, max
  of the answered requests; 5xx answers and requests unanswered while the service was up
  are violations.

Everything is bounded: the service runs with ``--stop-after``, every wait has a deadline,
and the run raises ``TimeoutError`` past ``timeout_s``.
"""
from __future__ import annotations

import math
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .client import Client, NoAnswer, Refused
from .scenario import TERMINAL, ServiceProcess, free_port, resumes, step_losses, steps_lost
from .store import Store

ROUTE_KINDS = ("submit", "read", "change")
SETTLED = frozenset(TERMINAL) | {"held"}      # a job that will not change without a user's request


@dataclass(frozen=True)
class SoakConfig:
    """One soak run. The defaults are the full soak (``bench/service_soak.py``); the test
    passes small numbers."""
    submissions: int = 200               # distinct jobs submitted, over every client
    clients: int = 8                     # concurrent clients (threads), each with its own seeded behaviour
    kills: int = 10                      # SIGKILLs of the service, at seeded random moments
    seed: int = 1
    slots: int = 3                       # per node (--local-slots)
    nodes: int = 2                       # --local-nodes
    model: str = "tiny-gpt__2L"
    global_batch: int = 8
    steps: tuple[int, int] = (20, 60)    # each job's steps, drawn in this range
    step_delay_s: float = 0.1            # --step-delay: a step lasts at least this long
    checkpoint_interval_s: float = 3.0   # --checkpoint-interval
    round_interval_s: float = 10.0       # --round-interval
    submit_window_s: float = 360.0       # each client spreads its submissions over this
    kill_window: tuple[float, float] = (0.05, 1.25)   # kills within these fractions of submit_window_s
    repeat_share: float = 0.15           # submissions sent again later with the same key
    twin_share: float = 0.05             # submissions sent twice at once, from two threads, same key
    cancel_share: float = 0.10           # submissions cancelled later
    hold_share: float = 0.10             # submissions held later ...
    release_share: float = 0.5           # ... of which this share released later
    act_after_s: tuple[float, float] = (1.0, 40.0)   # a repeat, cancel or hold comes this long after its submission
    read_every_s: tuple[float, float] = (0.5, 3.0)   # each client reads a status or a list this often
    sample_every_s: float = 0.25         # the process table's sampling period
    settle_stall_s: float = 180.0        # after the clients and kills: jobs not settled when none has for this long
    startup_timeout_s: float = 120.0     # a (re)start answers /api/health within this
    request_timeout_s: float = 30.0      # a request unanswered this long while the service is up: a hang
    timeout_s: float = 3600.0            # the whole run
    stop_timeout_s: float = 20.0         # --stop-timeout

    def serve_args(self, tmp: Path, port: int) -> list[str]:
        """``arena serve`` options (state and work under ``tmp``). Jobs last seconds, so the
        stability rule is scaled to them as in the end-to-end demo (``scenario.demo_serve_args``)."""
        return ["--local-slots", str(self.slots), "--local-nodes", str(self.nodes), "--policy", "arena",
                "--db", str(tmp / "state.db"), "--work-dir", str(tmp / "work"), "--port", str(port),
                "--round-interval", f"{self.round_interval_s:g}",
                "--checkpoint-interval", f"{self.checkpoint_interval_s:g}",
                "--step-delay", f"{self.step_delay_s:g}", "--stop-timeout", f"{self.stop_timeout_s:g}",
                "--policy-opt", "max_moves_per_hour=0", "--policy-opt", "payback_max_s=30",
                "--stop-after", f"{self.timeout_s:g}"]


# ------------------------------------------------------------------------------ observation
@dataclass
class Request:
    kind: str                 # submit | read | change
    t0: float                 # monotonic
    t1: float
    outcome: str              # "ok", an HTTP status ("409"), or "unanswered"
    maybe_done: bool = False


class Downtime:
    """When the service was down (killed until healthy again), to excuse the requests that
    went unanswered then."""

    def __init__(self):
        self.spans: list[list[float]] = []          # [down at, up at (inf while down)]
        self.lock = threading.Lock()

    def down(self, at: float) -> None:
        with self.lock:
            self.spans.append([at, math.inf])

    def up(self, at: float) -> None:
        with self.lock:
            self.spans[-1][1] = at

    def overlaps(self, t0: float, t1: float) -> bool:
        with self.lock:
            return any(a <= t1 and t0 <= b for a, b in self.spans)


def worker_folders(work_dir: str) -> dict[int, set[str]]:
    """Per job, the launch folders whose ranks (``python -m launcher.worker FILE``, FILE in
    the folder: its config.json, or a move file for ranks joining a device-to-device move)
    are alive now, from the process table (zombies left out)."""
    root = str(Path(work_dir).resolve()) + os.sep
    out: dict[int, set[str]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"launcher.worker" not in args:
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue                      # gone meanwhile
        if state == "Z":
            continue
        i = args.index(b"launcher.worker")
        if i + 1 >= len(args):
            continue
        path = args[i + 1].decode(errors="replace")
        if not path.startswith(root):
            continue
        parts = path[len(root):].split(os.sep)
        if len(parts) >= 3 and parts[0].isdigit():
            out.setdefault(int(parts[0]), set()).add(os.sep.join(parts[:2]))
    return out


class RankSampler(threading.Thread):
    """Samples the process table: every moment one job had ranks of two launch folders
    alive, and each folder's first and last sighting."""

    def __init__(self, work_dir: str, every_s: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.work_dir, self.every_s = work_dir, every_s
        self.stop = threading.Event()
        self.samples = 0
        self.overlaps: list[dict] = []            # {at, job, folders}
        self.seen: dict[tuple[int, str], list[float]] = {}
        self.last: dict[int, set[str]] = {}

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.is_set():
            snap = worker_folders(self.work_dir)
            now = time.monotonic()
            self.samples += 1
            self.last = snap
            for job, folders in snap.items():
                for f in folders:
                    span = self.seen.setdefault((job, f), [now, now])
                    span[1] = now
                if len(folders) > 1:
                    self.overlaps.append({"at_s": round(now - t0, 2), "job": job, "folders": sorted(folders)})
            self.stop.wait(self.every_s)


# ------------------------------------------------------------------------------ clients
@dataclass
class KeyRecord:
    key: str
    body: dict
    client: int
    ids: list[int] = field(default_factory=list)          # every id answered for this key
    replayed: int = 0                                      # answers that said replayed
    cancel: bool = False                                   # a cancel was accepted
    holds: int = 0                                         # holds accepted ...
    releases: int = 0                                      # ... releases accepted after them
    hold_open: bool = False                                # the last accepted of those was a hold

    @property
    def id(self) -> int | None:
        return self.ids[0] if self.ids else None


class Ledger:
    """What the clients sent and were answered, shared by their threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys: dict[str, KeyRecord] = {}
        self.requests: list[Request] = []
        self.sent = {"submit": 0, "repeat": 0, "twin": 0, "cancel": 0, "hold": 0, "release": 0, "read": 0}

    def note(self, r: Request) -> None:
        with self.lock:
            self.requests.append(r)


class SoakClient(threading.Thread):
    """One client: its submissions at seeded moments over the window, each possibly
    repeated later (same key, same body), sent twice at once, cancelled, held and maybe
    released; between them, reads of a job's status or of a list. A request that gets no
    answer (the service is down) is sent again until one comes: a submission with its key,
    so a job stored but not answered is given back, never stored twice."""

    def __init__(self, index: int, n_jobs: int, cfg: SoakConfig, url: str, ledger: Ledger, origin: float,
                 deadline: float, stop: threading.Event):
        super().__init__(name=f"soak-client-{index}", daemon=True)
        self.index, self.cfg, self.ledger, self.origin, self.deadline, self.stop_event = \
            index, cfg, ledger, origin, deadline, stop
        self.client = Client(url, timeout_s=cfg.request_timeout_s)
        self.rng = random.Random(f"{cfg.seed}:{index}")
        self.error: BaseException | None = None
        self.plan = self._plan(n_jobs)

    def _plan(self, n: int) -> list[tuple[float, str, str]]:
        """(seconds after the start, action, key), in time order."""
        c, rng = self.cfg, self.rng
        out = []
        for k in range(n):
            key = f"soak:{c.seed}:c{self.index}:{k}"
            at = rng.uniform(0.0, c.submit_window_s)
            out.append((at, "twin" if rng.random() < c.twin_share else "submit", key))
            if rng.random() < c.repeat_share:
                out.append((at + rng.uniform(*c.act_after_s), "repeat", key))
            roll = rng.random()
            if roll < c.cancel_share:
                out.append((at + rng.uniform(*c.act_after_s), "cancel", key))
            elif roll < c.cancel_share + c.hold_share:
                hold_at = at + rng.uniform(*c.act_after_s)
                out.append((hold_at, "hold", key))
                if rng.random() < c.release_share:
                    out.append((hold_at + rng.uniform(*c.act_after_s), "release", key))
        return sorted(out)

    def body(self, key: str) -> dict:
        rng = random.Random(key)              # the same body whenever the key is sent
        name = key.split(":", 2)[2].replace(":", "-")
        return {"name": name, "model": self.cfg.model, "global_batch": self.cfg.global_batch,
                "steps": rng.randint(*self.cfg.steps), "seed": rng.randrange(1000)}

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:           # reported by the run, never lost in a thread
            self.error = e

    def _run(self) -> None:
        next_read = self.origin + self.rng.uniform(*self.cfg.read_every_s)
        for at, action, key in self.plan:
            while True:
                now = time.monotonic()
                if self.stop_event.is_set() or now > self.deadline:
                    return
                if now >= self.origin + at:
                    break
                if now >= next_read:
                    self._read()
                    next_read = time.monotonic() + self.rng.uniform(*self.cfg.read_every_s)
                else:
                    time.sleep(min(0.1, self.origin + at - now, max(0.0, next_read - now)))
            self._act(action, key)

    # each request, timed and noted
    def _send(self, kind: str, method: str, path: str, body=None, key: str | None = None):
        t0 = time.monotonic()
        try:
            if method == "GET":
                ans = self.client.get(path)
            else:
                ans = self.client.post(path, body, key=key)
        except NoAnswer as e:
            self.ledger.note(Request(kind, t0, time.monotonic(), "unanswered", e.maybe_done))
            raise
        except Refused as e:
            self.ledger.note(Request(kind, t0, time.monotonic(), str(e.status)))
            raise
        self.ledger.note(Request(kind, t0, time.monotonic(), "ok"))
        return ans

    def _until_answered(self, send: Callable[[], object]):
        """``send()`` again until the service answers (it is down for a restart meanwhile)."""
        while True:
            try:
                return send()
            except NoAnswer:
                if self.stop_event.is_set() or time.monotonic() > self.deadline:
                    raise
                time.sleep(0.5)

    def _submit(self, key: str) -> None:
        rec = self.ledger.keys[key]
        ans = self._until_answered(lambda: self._send("submit", "POST", "/api/jobs", rec.body, key))
        with self.ledger.lock:
            rec.ids.append(int(ans["id"]))
            rec.replayed += bool(ans.get("replayed"))

    def _act(self, action: str, key: str) -> None:
        led = self.ledger
        if action in ("submit", "twin"):
            with led.lock:
                led.keys[key] = KeyRecord(key, self.body(key), self.index)
                led.sent[action] += 1
            if action == "twin":               # the same key twice at once, from two threads
                other = threading.Thread(target=self._twin, args=(key,), daemon=True)
                other.start()
                self._submit(key)
                other.join(self.cfg.request_timeout_s * 4)
            else:
                self._submit(key)
            return
        rec = led.keys[key]
        if rec.id is None:                     # its submission never got through (the run ended)
            return
        with led.lock:
            led.sent[action] += 1
        if action == "repeat":
            self._submit(key)
            return
        path = f"/api/jobs/{rec.id}/{action}"
        body = {"reason": "soak"} if action == "hold" else None
        try:
            self._until_answered(lambda: self._send("change", "POST", path, body))
        except Refused as e:
            if e.status != 409:                # 409: it had ended (or was not held): a fine answer
                raise
            return
        with led.lock:
            if action == "cancel":
                rec.cancel = True
            elif action == "hold":
                rec.holds += 1
                rec.hold_open = True
            elif action == "release" and rec.hold_open:
                rec.releases += 1
                rec.hold_open = False

    def _twin(self, key: str) -> None:
        try:
            self._submit(key)
        except BaseException as e:
            self.error = self.error or e

    def _read(self) -> None:
        led = self.ledger
        with led.lock:
            mine = [r.id for r in led.keys.values() if r.client == self.index and r.id is not None]
            led.sent["read"] += 1
        roll = self.rng.random()
        if mine and roll < 0.6:
            path = f"/api/jobs/{self.rng.choice(mine)}"
        elif roll < 0.8:
            path = "/api/jobs?status=" + self.rng.choice(("queued", "running", "held"))
        else:
            path = "/api/jobs"
        try:
            self._send("read", "GET", path)
        except (NoAnswer, Refused):
            pass                               # noted; a read is not repeated


# ------------------------------------------------------------------------------ the run
@dataclass
class KillRecord:
    at_s: float                 # seconds after the start
    running_jobs: int           # jobs with live ranks when it was killed (the sampler's last look)
    restart_s: float            # from the kill to a healthy answer
    refused: list[str]          # starts that exited instead of answering (and why)


class Killer(threading.Thread):
    """SIGKILLs the service at the planned moments and starts it again at once."""

    def __init__(self, cfg: SoakConfig, serve_args: list[str], log_path: Path, url: str, origin: float,
                 at_s: list[float], downtime: Downtime, sampler: RankSampler, say: Callable[[str], None]):
        super().__init__(name="soak-killer", daemon=True)
        self.cfg, self.serve_args, self.log_path, self.url = cfg, serve_args, log_path, url
        self.origin, self.at_s, self.downtime, self.sampler, self.say = origin, at_s, downtime, sampler, say
        self.kills: list[KillRecord] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.sp: ServiceProcess | None = None

    def start_service(self) -> list[str]:
        """Start the service until it answers; the starts that exited instead (each a
        refusal: the lock still held, a port...) are returned with their exit codes."""
        refused = []
        for _ in range(3):
            sp = ServiceProcess(self.serve_args, self.log_path, self.url)
            sp.start()
            try:
                sp.wait_healthy(self.cfg.startup_timeout_s)
            except RuntimeError:
                refused.append(f"exit {sp.proc.returncode if sp.proc is not None else None}")
                continue
            with self.lock:
                self.sp = sp
            return refused
        raise RuntimeError(f"arena serve did not start again ({refused}); log: {self.log_path}")

    def run(self) -> None:
        try:
            for at in self.at_s:
                if self.stop.wait(max(0.0, self.origin + at - time.monotonic())):
                    return
                with self.lock:
                    sp = self.sp
                assert sp is not None                  # started by run_soak before this thread
                running = len(self.sampler.last)
                t_kill = time.monotonic()
                self.downtime.down(t_kill)
                sp.kill()
                refused = self.start_service()
                self.downtime.up(time.monotonic())
                rec = KillRecord(round(t_kill - self.origin, 1), running, round(time.monotonic() - t_kill, 2), refused)
                self.kills.append(rec)
                self.say(f"kill {len(self.kills)}/{len(self.at_s)} at {rec.at_s:.0f} s ({running} jobs had ranks "
                         f"running); answering again after {rec.restart_s:.1f} s"
                         + (f"; refused starts: {refused}" if refused else ""))
        except BaseException as e:
            self.error = e

    def terminate(self) -> int:
        with self.lock:
            sp = self.sp
        return sp.terminate(timeout_s=max(120.0, 4 * self.cfg.stop_timeout_s)) if sp is not None else 0


def kill_moments(cfg: SoakConfig) -> list[float]:
    """``cfg.kills`` seeded moments (seconds after the start), one drawn in each of as many
    equal slices of the kill window, so they spread over the run."""
    rng = random.Random(f"{cfg.seed}:kills")
    a, b = (f * cfg.submit_window_s for f in cfg.kill_window)
    width = (b - a) / max(1, cfg.kills)
    return [round(a + width * (i + rng.uniform(0.1, 0.9)), 2) for i in range(cfg.kills)]


@dataclass
class SoakRun:
    """What the run observed (``analyse`` turns it into the report)."""
    cfg: SoakConfig
    db: str
    work: str
    ledger: Ledger
    downtime: Downtime
    kills: list[KillRecord]
    planned_kills: int
    overlaps: list[dict]
    samples: int
    folders_seen: int
    unsettled: list[dict]              # jobs not settled at the deadline (id, status)
    ranks_left: dict[int, list[str]]   # ranks alive after the service's shutdown
    shutdown_rc: int
    started_wall: float
    ended_wall: float
    wall_s: float


def run_soak(cfg: SoakConfig, tmp: Path, progress: Callable[[str], None] | None = None) -> SoakRun:
    """Run the soak in ``tmp`` (state, work folder, the service's log ``serve.log``)."""
    say = progress or (lambda m: None)
    tmp = Path(tmp)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = cfg.serve_args(tmp, port)
    work = str((tmp / "work").resolve())
    ledger, downtime = Ledger(), Downtime()
    sampler = RankSampler(work, cfg.sample_every_s)
    t0 = time.monotonic()
    deadline = t0 + cfg.timeout_s
    started_wall = time.time()
    killer = Killer(cfg, args, tmp / "serve.log", url, t0, [], downtime, sampler, say)
    refused = killer.start_service()
    if refused:
        raise RuntimeError(f"arena serve did not start at first ({refused}); log: {tmp / 'serve.log'}")
    say(f"service up on {url} ({cfg.nodes} nodes x {cfg.slots} slots); {cfg.submissions} submissions from "
        f"{cfg.clients} clients over {cfg.submit_window_s:g} s, {cfg.kills} kills")
    origin = time.monotonic()
    killer.origin, killer.at_s = origin, kill_moments(cfg)
    stop = threading.Event()
    shares = [cfg.submissions // cfg.clients + (i < cfg.submissions % cfg.clients) for i in range(cfg.clients)]
    clients = [SoakClient(i, n, cfg, url, ledger, origin, deadline, stop) for i, n in enumerate(shares)]
    sampler.start()
    killer.start()
    for c in clients:
        c.start()
    unsettled: list[dict] = []
    rc = 0
    try:
        last_say = 0.0
        while any(c.is_alive() for c in clients) or killer.is_alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"soak not done within {cfg.timeout_s:g} s; log: {tmp / 'serve.log'}")
            if time.monotonic() - last_say >= 15:
                last_say = time.monotonic()
                with ledger.lock:
                    accepted = sum(1 for r in ledger.keys.values() if r.id is not None)
                say(f"{time.monotonic() - origin:5.0f} s: {accepted}/{cfg.submissions} submissions accepted, "
                    f"{len(killer.kills)}/{cfg.kills} kills, {len(sampler.last)} jobs with ranks running, "
                    f"{len(sampler.overlaps)} overlapping launches seen")
            time.sleep(0.5)
        threads: list[SoakClient | Killer] = [*clients, killer]
        for th in threads:
            if th.error is not None:
                raise RuntimeError(f"{th.name} failed: {type(th.error).__name__}: {th.error}") from th.error
        say(f"{time.monotonic() - origin:.0f} s: clients and kills done; waiting for every job to settle")
        unsettled = _settle(Client(url, timeout_s=cfg.request_timeout_s), deadline, cfg.settle_stall_s, say)
    finally:
        stop.set()
        killer.stop.set()
        rc = killer.terminate()
        sampler.stop.set()
        sampler.join(5)
    time.sleep(1.0)
    left = worker_folders(work)
    return SoakRun(cfg, str(tmp / "state.db"), work, ledger, downtime, killer.kills, cfg.kills,
                   sampler.overlaps, sampler.samples, len(sampler.seen), unsettled,
                   {j: sorted(f) for j, f in left.items()}, rc, started_wall, time.time(), time.monotonic() - t0)


def _settle(client: Client, deadline: float, stall_s: float, say: Callable[[str], None]) -> list[dict]:
    """Wait until every job is settled (ended, or held); those that are not when none has
    settled for ``stall_s``, or at ``deadline``."""
    jobs: list = []
    last, fewest, settled_at = 0.0, math.inf, time.monotonic()
    while time.monotonic() < deadline:
        try:
            jobs = client.get("/api/jobs")          # type: ignore[assignment]
        except NoAnswer:
            time.sleep(1.0)
            continue
        open_jobs = [j for j in jobs if j["status"] not in SETTLED]
        if not open_jobs:
            return []
        if len(open_jobs) < fewest:
            fewest, settled_at = len(open_jobs), time.monotonic()
        elif time.monotonic() - settled_at > stall_s:
            say(f"no job settled for {stall_s:g} s; {len(open_jobs)} not settled")
            break
        if time.monotonic() - last >= 15:
            last = time.monotonic()
            say(f"{len(open_jobs)} jobs not settled yet")
        time.sleep(1.0)
    return [{"id": j["id"], "status": j["status"]} for j in jobs if j["status"] not in SETTLED]


# ------------------------------------------------------------------------------ report
def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def analyse(run: SoakRun) -> dict:
    """The report: every figure, and ``violations`` (each target missed, named)."""
    led, cfg = run.ledger, run.cfg
    keys = list(led.keys.values())
    accepted = [r for r in keys if r.id is not None]
    mismatched = [{"key": r.key, "ids": sorted(set(r.ids))} for r in accepted if len(set(r.ids)) > 1]
    with Store(run.db, readonly=True) as st:
        rows = {row.id: row for row in st.jobs.rows()}
        problems = st.check()
        extra = sorted(set(rows) - {r.id for r in accepted})
        missing, failed, wrong_end, finished_short = [], [], [], []
        before_checkpoint, redone, moves, launches = [], 0, 0, 0
        for r in accepted:
            jid = r.ids[0]
            row = rows.get(jid)
            if row is None:
                missing.append(jid)
                continue
            allowed = {"finished"}
            if r.cancel:
                allowed.add("cancelled")
            if r.hold_open:
                allowed.add("held")
            if row.status == "failed":
                failed.append(jid)
            elif row.status in SETTLED and row.status not in allowed:
                wrong_end.append({"id": jid, "status": row.status, "allowed": sorted(allowed)})
            if row.status == "finished":
                trained = sorted(step_losses(run.work, jid, st))
                if trained != list(range(1, int(row.spec["steps"]) + 1)):
                    finished_short.append({"id": jid, "steps": int(row.spec["steps"]), "trained": len(trained)})
            for launch, start, saved in resumes(run.work, jid, st):
                if start < saved:
                    before_checkpoint.append({"id": jid, "launch": launch, "resumed_at": start, "saved": saved})
            redone += steps_lost(run.work, jid, st)
            lch = st.launches.rows(jid)
            launches += len(lch)
            moves += sum(1 for x in lch if "moving" in x.reason)
        rounds = [x for x in st.rounds.rows() if run.started_wall <= x.at <= run.ended_wall]
        statuses = {s: sum(1 for r in accepted if r.id in rows and rows[r.id].status == s)
                    for s in ("finished", "cancelled", "held", "failed", "queued", "running")}
    # rounds per minute: over whole minutes from the first round
    per_min: list[int] = []
    if rounds:
        t_first, t_last = rounds[0].at, rounds[-1].at
        for m in range(int((t_last - t_first) // 60)):
            per_min.append(sum(1 for x in rounds if t_first + 60 * m <= x.at < t_first + 60 * (m + 1)))
    span_min = max(1e-9, (run.ended_wall - run.started_wall) / 60)
    api: dict[str, dict] = {}
    codes: dict[str, int] = {}
    unanswered_up, server_errors = 0, 0
    for kind in ROUTE_KINDS:
        reqs = [q for q in led.requests if q.kind == kind]
        ok = [(q.t1 - q.t0) * 1000 for q in reqs if q.outcome not in ("unanswered",) and not q.outcome.startswith("5")]
        api[kind] = {"answered": len(ok), "p50_ms": round(_pct(ok, 0.5), 1) if ok else None,
                     "p99_ms": round(_pct(ok, 0.99), 1) if ok else None, "max_ms": round(max(ok), 1) if ok else None}
    for q in led.requests:
        codes[q.outcome] = codes.get(q.outcome, 0) + 1
        if q.outcome.startswith("5"):
            server_errors += 1
        if q.outcome == "unanswered" and not run.downtime.overlaps(q.t0, q.t1):
            unanswered_up += 1
    refused = [x for k in run.kills for x in k.refused]
    report = {
        "config": {**asdict(cfg), "steps": list(cfg.steps), "kill_window": list(cfg.kill_window)},
        "wall_s": round(run.wall_s, 1),
        "jobs": {"accepted": len(accepted), "in_database": len(rows), **statuses,
                 "missing": missing, "failed": failed, "unsettled": run.unsettled, "wrong_end": wrong_end,
                 "lost": len(missing) + len(failed) + len(run.unsettled) + len(wrong_end),
                 "launches": launches, "moves": moves},
        "submissions": {"keys": len(keys), "sent": dict(led.sent), "replayed_answers": sum(r.replayed for r in keys),
                        "ids_differing_for_one_key": mismatched, "jobs_without_a_key": extra},
        "steps": {"resumed_before_last_checkpoint": before_checkpoint, "finished_short": finished_short,
                  "redone_since_checkpoint": redone},
        "duplicate_runs": {"overlaps": run.overlaps[:20], "count": len(run.overlaps), "samples": run.samples,
                           "launch_folders_seen": run.folders_seen, "ranks_left_after_shutdown": run.ranks_left},
        "kills": {"planned": run.planned_kills, "done": len(run.kills),
                  "on_running_jobs": sum(1 for k in run.kills if k.running_jobs),
                  "running_jobs_hit": sum(k.running_jobs for k in run.kills),
                  "restart_s_max": max((k.restart_s for k in run.kills), default=None),
                  "restart_s_median": statistics.median(k.restart_s for k in run.kills) if run.kills else None,
                  "refused_starts": refused, "each": [asdict(k) for k in run.kills]},
        "rounds": {"total": len(rounds), "per_minute_mean": round(len(rounds) / span_min, 1),
                   "per_minute_min": min(per_min) if per_min else None, "per_minute": per_min},
        "api": {**api, "status_codes": codes, "server_errors": server_errors,
                "unanswered_while_up": unanswered_up},
        "database_check": problems[:20],
        "shutdown_rc": run.shutdown_rc,
    }
    report["violations"] = violations(report)
    return report


def violations(rep: dict) -> list[str]:
    """The zero targets missed, each named with its count."""
    out = []
    j, s, d = rep["jobs"], rep["submissions"], rep["duplicate_runs"]
    for name, n in (("jobs lost", j["lost"]),
                    ("ids differing for one key", len(s["ids_differing_for_one_key"])),
                    ("jobs stored without a key sent", len(s["jobs_without_a_key"])),
                    ("launches resumed before the last checkpoint",
                     len(rep["steps"]["resumed_before_last_checkpoint"])),
                    ("finished jobs that did not train every step", len(rep["steps"]["finished_short"])),
                    ("moments with two launches of one job running", d["count"]),
                    ("jobs with ranks left after shutdown", len(d["ranks_left_after_shutdown"])),
                    ("refused restarts", len(rep["kills"]["refused_starts"])),
                    ("kills not done", rep["kills"]["planned"] - rep["kills"]["done"]),
                    ("5xx answers", rep["api"]["server_errors"]),
                    ("requests unanswered while the service was up", rep["api"]["unanswered_while_up"]),
                    ("database check problems", len(rep["database_check"])),
                    ("shutdown exit code", 0 if rep["shutdown_rc"] == 0 else 1)):
        if n:
            out.append(f"{name}: {n}")
    return out


def format_report(rep: dict) -> str:
    j, k, a, r = rep["jobs"], rep["kills"], rep["api"], rep["rounds"]
    st, d, s = rep["steps"], rep["duplicate_runs"], rep["submissions"]
    c = rep["config"]
    rows = [
        ("jobs accepted (distinct keys answered)", f"{j['accepted']}", ""),
        ("  ended finished / cancelled / held", f"{j['finished']} / {j['cancelled']} / {j['held']}", ""),
        ("jobs lost (missing, failed, unsettled, wrong end)",
         f"{j['lost']} ({len(j['missing'])}, {len(j['failed'])}, {len(j['unsettled'])}, {len(j['wrong_end'])})", "0"),
        ("submissions sent: new / repeated / twin", f"{s['sent']['submit']} / {s['sent']['repeat']} / "
                                                   f"{s['sent']['twin']}", ""),
        ("answers replayed (same key, same job)", f"{s['replayed_answers']}", ""),
        ("keys answered with two ids; jobs without a key",
         f"{len(s['ids_differing_for_one_key'])}; {len(s['jobs_without_a_key'])}", "0; 0"),
        ("cancels / holds / releases sent", f"{s['sent']['cancel']} / {s['sent']['hold']} / {s['sent']['release']}",
         ""),
        ("launches / moves", f"{j['launches']} / {j['moves']}", ""),
        ("steps lost beyond the last checkpoint (launches)", f"{len(st['resumed_before_last_checkpoint'])}", "0"),
        ("finished jobs missing a step", f"{len(st['finished_short'])}", "0"),
        ("steps redone since a checkpoint (allowed)", f"{st['redone_since_checkpoint']}", ""),
        ("two launches of one job alive at once (samples)", f"{d['count']} (of {d['samples']})", "0"),
        ("jobs with ranks left after shutdown", f"{len(d['ranks_left_after_shutdown'])}", "0"),
        ("kills done (on running jobs; jobs hit)", f"{k['done']}/{k['planned']} ({k['on_running_jobs']}; "
                                                   f"{k['running_jobs_hit']})", f"{k['planned']}"),
        ("restart to healthy: median / max s", f"{_f(k['restart_s_median'])} / {_f(k['restart_s_max'])}", ""),
        ("refused restarts", f"{len(k['refused_starts'])}", "0"),
        ("rounds; per minute mean / lowest minute", f"{r['total']}; {r['per_minute_mean']} / {r['per_minute_min']}",
         ""),
    ]
    for kind in ROUTE_KINDS:
        x = a[kind]
        rows.append((f"API {kind}: answered, p50 / p99 / max ms",
                     f"{x['answered']}, {_f(x['p50_ms'])} / {_f(x['p99_ms'])} / {_f(x['max_ms'])}", ""))
    rows += [("5xx answers; unanswered while up", f"{a['server_errors']}; {a['unanswered_while_up']}", "0; 0"),
             ("database check problems", f"{len(rep['database_check'])}", "0")]
    w = max(len(x[0]) for x in rows)
    v = max(len(x[1]) for x in rows)
    lines = [f"soak: {c['submissions']} submissions, {c['clients']} clients, {c['kills']} kills, "
             f"{c['nodes']} nodes x {c['slots']} slots, seed {c['seed']}, wall {rep['wall_s']:.0f} s",
             f"{'':<{w}}  {'measured':>{v}}  target", f"{'-' * w}  {'-' * v}  ------"]
    lines += [f"{a_:<{w}}  {b:>{v}}  {t}" for a_, b, t in rows]
    lines.append("violations: " + ("; ".join(rep["violations"]) if rep["violations"] else "none"))
    return "\n".join(lines)


def _f(x) -> str:
    return "-" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def main_progress(m: str) -> None:           # pragma: no cover - the bench's stderr
    print(f"[soak {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)
