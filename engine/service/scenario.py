"""A scripted end-to-end run of ``arena serve``: start the service as its own process,
submit jobs at given times through the HTTP API, optionally kill the service (SIGKILL)
at named fault points or random moments and start it again, wait until every job has
ended, and report per job what happened. The end-to-end and crash tests use it, and
``bench/service_e2e.py`` prints its report for the docs.

Everything is bounded: every wait has a deadline, the service is started with
``--stop-after`` and killed if it outlives the run.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from launcher.launch import read_events, read_results

from .client import Client, NoAnswer
from .store import Store
from .views import loss_curve, run_dirs

TERMINAL = ("finished", "failed", "cancelled")


@dataclass(frozen=True)
class Submission:
    at_s: float                     # seconds after the run starts
    job: dict                       # JobSpec fields


REPO = Path(__file__).resolve().parents[2]
LOSS_TOL = 1e-4          # max |loss - uninterrupted loss| over every step (resharding reorders float sums)
# The crash schedule (``ARENA_FAULT`` per start), ordered so that each point is likely to
# come up while jobs still run: launch intents while the jobs arrive, then a move, then the
# first recorded round after that restart (recovery decides at once), then a kill at a
# random moment soon after the next start. Which comes when depends on the policy's
# decisions, hence on measured timings; when the jobs end first, the workload is submitted
# again (``CRASH_REPEATS``) rather than the run ending with a fault untested.
CRASH_FAULTS = ("after-launch-intent:2", "mid-move:1", "after-round-recorded:1", "random")
CRASH_RANDOM_WINDOW_S = (1.0, 4.0)    # the random kill: this long after its start (seeded)
CRASH_REPEATS = 2                     # workload resubmissions allowed for faults still to come


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PORT_DRAW_SPAN = 12000          # scenario ports are drawn from this many ports below that range


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a service started right after and started
    again on it after each kill. Drawn below the kernel's ephemeral range: a port the
    system hands out itself (a bind to port 0 — the launched jobs' rendezvous stores — or an
    outgoing connection, such as the scenario's own requests) could be taken by any of
    those before the service binds it or between its restarts; one below the range is
    taken only by a process that asks for that very number."""
    import random
    import socket
    try:
        low = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768                                     # Linux's default lower bound
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(max(1024, low - PORT_DRAW_SPAN), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free TCP port on 127.0.0.1 below the ephemeral range (from {low})")


def demo_jobs() -> list[Submission]:
    """Five jobs of three families (GPT, the llama config.json example twice, MoE), 6 s
    apart: the end-to-end and crash tests' workload."""
    cfg = str(REPO / "examples" / "models" / "tiny-llama-config.json")
    return [
        Submission(0, {"name": "gpt-a", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 120}),
        Submission(6, {"name": "llama-cfg", "model": cfg, "global_batch": 8, "steps": 60}),
        Submission(12, {"name": "moe-a", "model": "tiny-moe__2L", "global_batch": 8, "steps": 40}),
        Submission(18, {"name": "gpt-b", "model": "tiny-gpt__2L", "global_batch": 16, "steps": 50}),
        Submission(24, {"name": "llama-b", "model": cfg, "global_batch": 8, "steps": 40, "seed": 3}),
    ]


def demo_serve_args(tmp: Path, port: int) -> list[str]:
    """``arena serve`` options of the demo run (state and work under ``tmp``). Its jobs last
    seconds, not hours, so the stability rule is scaled to them: no per-hour move limit,
    and a shrink that will never pay for itself is held 30 s instead of an hour. ``sia-ap``,
    with the same stability scale, is asked beside it every round as a shadow policy
    (compared, never carried out). Jobs' files are read from the repository's example
    models (the llama jobs' config.json; the jobs have no data file)."""
    return ["--local-slots", "4", "--policy", "arena", "--db", str(tmp / "state.db"), "--work-dir",
            str(tmp / "work"), "--data-root", str(REPO / "examples" / "models"), "--port", str(port),
            "--round-interval", "60", "--checkpoint-interval", "5",
            "--policy-opt", "max_moves_per_hour=0", "--policy-opt", "payback_max_s=30",
            "--shadow-policy", "sia-ap", "--shadow-policy-opt", "max_moves_per_hour=0",
            "--shadow-policy-opt", "payback_max_s=30",
            "--stop-timeout", "60", "--reconfig-opt", "replan_per_gpu_s=2", "--reconfig-opt", "replan_cap_s=8",
            "--stop-after", "900"]


def loss_deviation(db_path: str, work_dir: str, submissions: list[Submission], ids: dict[str, int],
                   references: dict | None = None) -> dict:
    """Per job: the largest |loss - loss of the same job trained uninterrupted in one
    process| over every step (``launcher.reference.train_reference``). The reference
    trajectories are kept in ``references`` (a dict the caller may share between runs of
    the same workload), keyed by the submitted model, steps, batch and seed: a resubmitted
    job is not trained again."""
    from launcher.reference import train_reference
    refs = {} if references is None else references
    out = {}
    with Store(db_path, readonly=True) as st:
        for sub in submissions:
            spec = sub.job
            jid = ids[spec["name"]]
            got = step_losses(work_dir, jid, st)
            if sorted(got) != list(range(1, spec["steps"] + 1)):
                raise AssertionError(f"{spec['name']}: trained steps {sorted(got)[:3]}...{sorted(got)[-3:]}")
            key = (spec["model"], spec["steps"], spec["global_batch"], spec.get("seed", 0))
            if key not in refs:
                refs[key] = train_reference(st.jobs.get(jid).spec["model"], steps=spec["steps"],
                                            global_batch=spec["global_batch"], seed=spec.get("seed", 0))
            ref = refs[key]
            out[spec["name"]] = max(abs(got[i + 1] - ref[i]) for i in range(spec["steps"]))
    return out


@dataclass
class ServiceProcess:
    """``arena serve`` in a child process (its own session, so a kill reaches it alone)."""
    args: list[str]
    log_path: Path
    url: str
    fault: str | None = None
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("ARENA_FAULT", None)
        if self.fault:
            env["ARENA_FAULT"] = self.fault
        repo = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start (fault {self.fault}) at {time.strftime('%H:%M:%S')} ===\n".encode())
            self.proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", *self.args],
                                         stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = Client(self.url, timeout_s=2.0)
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"arena serve exited ({self.proc.returncode}) before answering; "
                                   f"log: {self.log_path}")
            try:
                client.get("/api/health")
                return
            except NoAnswer:
                time.sleep(0.3)
        raise TimeoutError(f"arena serve did not answer within {timeout_s} s; log: {self.log_path}")

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 120.0) -> int:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else 0


@dataclass
class RunResult:
    ids: dict[str, int]                               # job name -> id
    submitted: list[Submission] = field(default_factory=list)   # every job submitted (repeats included)
    kills: list[str] = field(default_factory=list)    # what each kill interrupted
    unfired: list[str] = field(default_factory=list)  # faults and kills the run ended before
    starts: int = 0
    wall_s: float = 0.0


def run_scenario(serve_args: list[str], url: str, log_path: Path, submissions: list[Submission], *,
                 faults: tuple[str, ...] = (), random_kills: int = 0, seed: int = 0,
                 timeout_s: float = 600.0, startup_timeout_s: float = 120.0,
                 progress=None, random_window_s: tuple[float, float] = (2.0, 12.0),
                 repeats: int = 0, until: Callable[[], str | None] | None = None) -> RunResult:
    """Run the scenario to the end (every job ended) or raise ``TimeoutError``.

    ``faults``: ``ARENA_FAULT`` values for the successive starts of the service (a start
    whose fault fires is followed by a new start); ``"random"`` among them: that start is
    SIGKILLed at a random moment (``random_window_s`` after it, seeded). ``random_kills``:
    after the faults, this many more random SIGKILLs.

    ``repeats``: when every job has ended but faults or kills are still to come (they
    wait for a move, a launch or a round that the policy's decisions, which depend on
    measured timings, did not bring in time), or ``until()`` names something the run
    has yet to show, submit the workload again, up to this many times (names suffixed
    ``-r1``, ``-r2``...; offsets from the moment of resubmission). ``RunResult.submitted``
    lists every job submitted; ``unfired`` what never came (``until``'s last answer
    included)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    origin = t0                          # submission offsets count from here
    say = progress or (lambda m: None)
    pending = sorted(submissions, key=lambda s: s.at_s)
    ids: dict[str, int] = {}
    result = RunResult(ids)
    repeats_done = 0
    faults_left = list(faults)
    kills_left = random_kills + faults_left.count("random")
    faults_left_named = [f for f in faults_left if f != "random"]
    client = Client(url, timeout_s=10.0)
    random_now = [False]          # this start is to be killed at a random moment

    def start() -> ServiceProcess:
        fault = faults_left.pop(0) if faults_left else None
        random_now[0] = fault == "random"
        if random_now[0]:
            fault = None
        elif fault is not None:
            faults_left_named.remove(fault)
        sp = ServiceProcess(serve_args, log_path, url, fault)
        sp.start()
        try:
            sp.wait_healthy(startup_timeout_s)
        except RuntimeError:
            if not (fault and sp.proc.returncode == -signal.SIGKILL):
                raise
            # its fault fired while it was starting (recovery and the first round are fast)
        result.starts += 1
        say(f"service started ({'fault ' + fault if fault else 'no fault'})")
        return sp

    sp = start()
    kill_at = None
    try:
        while True:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"scenario not finished within {timeout_s} s; log: {log_path}")
            if not sp.alive():
                result.kills.append(sp.fault or "unexpected exit")
                say(f"service died ({sp.fault or 'exit ' + str(sp.proc.returncode)}); starting it again")
                if sp.fault is None:
                    raise RuntimeError(f"arena serve exited on its own ({sp.proc.returncode}); log: {log_path}")
                sp = start()
                kill_at = None
                continue
            if kill_at is None and not sp.fault and kills_left > 0 and (random_now[0] or not faults_left):
                kill_at = now + rng.uniform(*random_window_s)
            if kill_at is not None and now >= kill_at:
                sp.kill()
                kills_left -= 1
                result.kills.append("random")
                say("service killed at a random moment; starting it again")
                sp = start()
                kill_at = None
                continue
            while pending and now - origin >= pending[0].at_s:
                sub = pending[0]
                try:
                    # keyed by name: a submission the service stored but did not answer, sent
                    # again after the restart, gives back the job it stored
                    ans = client.post("/api/jobs", sub.job, key=f"scenario:{sub.job['name']}")
                except NoAnswer:
                    break                              # down: submit after the restart
                ids[sub.job["name"]] = int(ans["id"])
                result.submitted.append(sub)
                pending.pop(0)
                say(f"submitted {sub.job['name']} as job {ans['id']}")
            if not pending:
                try:
                    jobs = client.get("/api/jobs")
                except NoAnswer:
                    jobs = None
                if jobs is not None and len(jobs) == len(ids) and all(j["status"] in TERMINAL for j in jobs):
                    unfired = ([sp.fault] if sp.fault else []) + faults_left_named + ["random"] * kills_left
                    missing = until() if until is not None else None
                    unfired += [missing] if missing else []
                    if unfired and repeats_done < repeats:
                        repeats_done += 1
                        origin = now
                        pending = [Submission(s.at_s, {**s.job, "name": f"{s.job['name']}-r{repeats_done}"})
                                   for s in sorted(submissions, key=lambda s: s.at_s)]
                        say(f"every job ended before {unfired}; submitting the workload again "
                            f"(repeat {repeats_done} of {repeats})")
                        continue
                    result.unfired = unfired
                    break
            time.sleep(0.5)
    finally:
        sp.terminate()
    result.wall_s = time.monotonic() - t0
    return result


# ------------------------------------------------------------------------------ reports
def _launch_dirs(work_dir: str, job_id: int, store: Store) -> list[Path]:
    return [d for _, d in run_dirs(work_dir, store.launches.rows(job_id))]


def step_losses(work_dir: str, job_id: int, store: Store) -> dict[int, float]:
    """Each step's loss as last trained (a step trained again after a restart replaces it)."""
    points = loss_curve(work_dir, store.launches.rows(job_id))
    return {p["step"]: p["loss"] for p in points}


def resumes(work_dir: str, job_id: int, store: Store) -> list[tuple[int, int, int]]:
    """Per launch after the first that trained: (launch, step it resumed from, highest step
    saved by the earlier launches). Equal numbers: nothing lost past the last checkpoint."""
    out, saved = [], 0
    for d in _launch_dirs(work_dir, job_id, store):
        ev = read_events(d)
        ready = next((e for e in ev if e.get("event") == "ready"), None)
        if ready is not None and (saved or out or ready.get("start_step")):
            out.append((int(d.name.removeprefix("launch_")), int(ready.get("start_step", 0)), saved))
        saved = max([saved] + [int(e["step"]) for e in ev if e.get("event") == "save"])
    return out


def steps_lost(work_dir: str, job_id: int, store: Store) -> int:
    """Steps trained that a later launch trained again (lost to stops and failures)."""
    lost, last = 0, None
    for d in _launch_dirs(work_dir, job_id, store):
        res = read_results(d)
        if not res:
            continue
        if last is not None:
            lost += max(0, last - (int(res[0]["step"]) - 1))
        last = int(res[-1]["step"])
    return lost


def job_report(db_path: str, work_dir: str) -> list[dict]:
    """Per job: status, launches, moves, failed launches, steps lost, seconds in each
    status, final loss."""
    with Store(db_path, readonly=True) as st:
        out = []
        for row in st.jobs.rows():
            launches = st.launches.rows(row.id)
            hist = st.jobs.history(row.id)
            in_state: dict[str, float] = {}
            for a, b in zip(hist, hist[1:]):
                in_state[a.to_status] = in_state.get(a.to_status, 0.0) + b.at - a.at
            losses = step_losses(work_dir, row.id, st)
            out.append({"id": row.id, "name": row.name, "model": Path(row.spec["model"]).name,
                        "status": row.status, "steps": row.spec["steps"], "launches": len(launches),
                        "moves": sum(1 for lch in launches if "moving" in lch.reason),
                        "moves_d2d": sum(1 for lch in launches if "device to device" in lch.reason),
                        "failed_launches": sum(1 for lch in launches if lch.state == "failed"),
                        "plans": [f"dp{lch.plan.get('dp')}tp{lch.plan.get('tp')}pp{lch.plan.get('pp')}"
                                  for lch in launches],
                        "steps_lost": steps_lost(work_dir, row.id, st),
                        "moves_measured": [m.reconfig for m in st.launches.measurements(row.id)
                                           if "move_total_s" in m.reconfig],
                        "seconds_in": {k: round(v, 1) for k, v in in_state.items()},
                        "final_loss": losses[max(losses)] if losses else None})
        return out


def format_moves(rows: list[dict]) -> str:
    """One line per move path: how many moves reached a step, their totals (stop request to
    the first step after) and bytes moved."""
    out = []
    for name, d2d in (("device to device", 1.0), ("through storage", 0.0)):
        ms = [m for r in rows for m in r["moves_measured"] if m.get("device_to_device", 0.0) == d2d]
        if ms:
            t = sorted(m["move_total_s"] for m in ms)
            b = sorted(m.get("bytes_moved", 0.0) / 1e6 for m in ms)
            out.append(f"moves {name}: {len(ms)}, total {t[0]:.2f}-{t[-1]:.2f} s, {b[0]:.1f}-{b[-1]:.1f} MB moved")
    return "\n".join(out) or "no move reached a step"


def format_shadow(db_path: str) -> str:
    """The shadow policy's agreement over the run (empty without one)."""
    from engine.core.shadow import counts_line
    with Store(db_path, readonly=True) as st:
        return "\n".join(counts_line(p, c) for p, c in st.rounds.shadow_counts().items())


def format_report(rows: list[dict]) -> str:
    lines = [f"{'job':<10} {'model':<26} {'status':<9} {'launches':>8} {'moves':>5} {'d2d':>3} {'lost':>5}  "
             f"{'queued s':>8} {'running s':>9}  plans"]
    for r in rows:
        s = r["seconds_in"]
        lines.append(f"{r['name']:<10} {r['model'][:26]:<26} {r['status']:<9} {r['launches']:>8} {r['moves']:>5} "
                     f"{r['moves_d2d']:>3} "
                     f"{r['steps_lost']:>5}  {s.get('queued', 0.0):>8.1f} {s.get('running', 0.0):>9.1f}  "
                     f"{' -> '.join(r['plans'])}")
    return "\n".join(lines)


def main(argv=None) -> int:           # pragma: no cover - a thin CLI over job_report
    import argparse
    p = argparse.ArgumentParser(description="Report per job of a service's state database.")
    p.add_argument("--db", required=True)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = job_report(a.db, a.work_dir)
    print(json.dumps(rows, indent=1) if a.json else format_report(rows))
    return 0
