"""What the API, ``arena status`` and the status page show, read from the state store
(and, for live progress and losses, from the files the ranks write in the work folder).

Every status, plan and GPU shown comes from the database; progress (steps, iteration
time, loss) from the job's ``progress.json`` and each launch's ``results.jsonl``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from instances.cluster import ClusterSpec
from launcher.launch import tail
from launcher.telemetry import read_progress

from .losses import LossLog, merged
from .store import ACTIVE_LAUNCH, TERMINAL, HistoryRow, JobRow, LaunchRow, RoundRow, Store

LOSS_POINTS = 200                 # at most about this many points of a loss curve in a job view
STATE_CURVE_POINTS = 60           # ... in each row of the page's table (a sparkline 160 px wide)
STATE_ENDED_JOBS = 50             # the page lists every job not ended and this many of the last to end
MAX_LOG_CHARS = 1_000_000         # /api/jobs/{id}/logs?chars=N, arena logs --chars: at most this many
MAX_ROUNDS_SHOWN = 1000           # /api/rounds?last=N, arena rounds --last: at most this many
MOVING = "moving"                 # a launch's reason while its job moves (engine/service/journal.py, release)
RATE_WINDOW_S = 30.0              # a job's samples/s: over the steps of its last this many seconds


def launch_dir(work_dir: str, launch: LaunchRow) -> Path:
    """The run folder a launch ran in: the one it recorded (a device-to-device move
    continues in its predecessor's), else ``launch_<generation>``."""
    recorded = (launch.pid_info or {}).get("run_dir")
    return Path(recorded) if recorded else Path(work_dir) / str(launch.job_id) / f"launch_{launch.generation}"


def run_dirs(work_dir: str, launches: list[LaunchRow]) -> list[tuple[int, Path]]:
    """(generation that started it, folder) per run folder, in launch order: launches that
    continued a folder device to device add none."""
    out: list[tuple[int, Path]] = []
    for lch in launches:
        d = launch_dir(work_dir, lch)
        if not out or out[-1][1] != d:
            out.append((lch.generation, d))
    return out


def loss_curve(work_dir: str, launches: list[LaunchRow], losses: LossLog | None = None,
               max_points: int | None = None) -> list[dict]:
    """(step, loss, time, launch) of every step trained, over all launches in order; a step
    trained again after a restart from an earlier checkpoint replaces the lost one.
    ``max_points``: thinned to about that many (every k-th point and the last)."""
    steps, loss, times, launch = merged(losses or LossLog(), run_dirs(work_dir, launches))
    idx = _thin(len(steps), max_points) if max_points is not None else range(len(steps))
    return [{"step": int(steps[i]), "loss": float(loss[i]),
             "time": None if math.isnan(times[i]) else float(times[i]), "launch": int(launch[i])} for i in idx]


@dataclass(frozen=True)
class Latest:
    """The latest steps a job's launches wrote (``latest_steps``)."""
    loss: float | None = None           # of the latest step
    step: int | None = None             # that step
    rate: float | None = None           # steps per second over the window (wall clock), None: fewer than 2 steps
    window_s: float | None = None       # the time the rate is measured over (at most RATE_WINDOW_S)


def latest_steps(work_dir: str, launches: list[LaunchRow], losses: LossLog | None = None,
                 window_s: float = RATE_WINDOW_S) -> Latest:
    """The loss of the latest step trained, and the rate of the steps of the ``window_s``
    seconds before it, on the wall clock (each step's ``time`` in ``results.jsonl``: pauses,
    checkpoints and ``--step-delay`` included), from the newest launch with results only."""
    log = losses or LossLog()
    for _, d in reversed(run_dirs(work_dir, launches)):
        steps, loss, times = log.points(d)
        if not len(loss):
            continue
        latest = Latest(float(loss[-1]), int(steps[-1]))
        t_last = times[-1]
        if math.isnan(t_last):
            return latest
        first = int(np.searchsorted(times, t_last - window_s, side="left"))    # (times only grow in a file)
        span = float(t_last - times[first])
        if span <= 0 or steps[-1] <= steps[first]:
            return latest
        return Latest(latest.loss, latest.step, float(steps[-1] - steps[first]) / span, span)
    return Latest()


def _thin(n: int, k: int) -> list[int]:
    """Indices of at most about ``k`` of ``n`` points: every stride-th and the last."""
    if n <= k:
        return list(range(n))
    stride = math.ceil(n / k)
    return list(range(0, n, stride)) + ([n - 1] if (n - 1) % stride else [])


@dataclass(frozen=True)
class Room:
    """What a queued job's wait is judged against: per GPU type, the GPUs free now (on
    nodes in service, held by no active launch) and those on drained nodes."""
    cluster: str
    free: dict[str, int]
    drained: dict[str, int]

    @classmethod
    def read(cls, store: Store, cluster: ClusterSpec) -> Room:
        held = {g for lch in store.launches.active() for g in lch.gpus}
        out = store.nodes.drained()
        free: dict[str, int] = {}
        drained: dict[str, int] = {}
        for n in cluster.nodes():
            free.setdefault(n.gpu_type, 0)
            drained.setdefault(n.gpu_type, 0)
            if n.node_id in out:
                drained[n.gpu_type] += n.num_gpus
            else:
                free[n.gpu_type] += sum(f"{n.node_id}:{i}" not in held for i in range(n.num_gpus))
        return cls(cluster.name, free, drained)


@dataclass(frozen=True)
class Pending:
    """What a job view reads of other jobs, read once for a list of views: the jobs with a
    cancel or a hold requested and not carried out, the status of every job, the last
    round, and (given the cluster, with a job queued) the room left."""
    cancel: frozenset[int]
    hold: frozenset[int]
    status: dict[int, str]
    last_round: RoundRow | None = None
    room: Room | None = None

    @classmethod
    def read(cls, store: Store, rows: list[JobRow], cluster: ClusterSpec | None = None) -> Pending:
        last = store.rounds.rows(last=1)
        room = Room.read(store, cluster) if cluster is not None and any(r.status == "queued" for r in rows) else None
        return cls(frozenset(store.jobs.cancel_requests()), frozenset(j for j, _ in store.jobs.hold_requests()),
                   {r.id: r.status for r in rows}, last[0] if last else None, room)

    def statuses(self, store: Store, ids) -> dict[int, str]:
        """Status of each of ``ids`` (read from the store for one not in the list)."""
        ids = [int(i) for i in ids]
        missing = [i for i in ids if i not in self.status]
        found = store.jobs.statuses(missing) if missing else {}
        return {i: self.status[i] if i in self.status else found[i] for i in ids if i in self.status or i in found}


def job_view(store: Store, work_dir: str, job_id: int, *, losses: LossLog | None = None,
             curve_points: int = LOSS_POINTS, cluster: ClusterSpec | None = None) -> dict:
    """One job's view (``cluster``: the service's, for why a queued job waits)."""
    row = store.jobs.get(job_id)
    return _job_view(store, work_dir, row, Pending.read(store, [row], cluster), losses or LossLog(), curve_points)


def jobs_view(store: Store, work_dir: str, rows: list[JobRow], *, losses: LossLog | None = None,
              curve_points: int = 0, cluster: ClusterSpec | None = None) -> list[dict]:
    """Views of ``rows`` (``curve_points``: points of each loss curve; 0: none)."""
    pending = Pending.read(store, rows, cluster)
    log = losses or LossLog()
    return [_job_view(store, work_dir, r, pending, log, curve_points) for r in rows]


def _job_view(store: Store, work_dir: str, row: JobRow, pending: Pending, losses: LossLog,
              curve_points: int) -> dict:
    job_id = row.id
    launches = store.launches.rows(job_id)
    history = store.jobs.history(job_id)
    prog = read_progress(Path(work_dir) / str(job_id) / "progress.json") or {}
    latest = latest_steps(work_dir, launches, losses)
    current = next((lch for lch in reversed(launches) if lch.state in ("intent", "started")), None)
    last = launches[-1] if launches else None
    shown = current or last
    spec = row.spec
    it = prog.get("iteration_time_s")
    # time in each status, from the history (the current status up to its last change: now)
    in_state: dict[str, float] = {}
    for a, b in zip(history, history[1:]):
        in_state[a.to_status] = in_state.get(a.to_status, 0.0) + (b.at - a.at)
    moves = sum(1 for lch in launches if MOVING in lch.reason)
    failures = sum(1 for lch in launches if lch.state == "failed")
    after = list(spec.get("after") or ())
    waiting_for = sorted(d for d, st in pending.statuses(store, after).items() if st != "finished") \
        if row.status == "queued" else []
    moving = moving_now(row, launches, prog, pending.last_round)
    return {
        "id": row.id, "name": row.name, "status": row.status,
        "state": MOVING if moving else row.status, "moving": moving, "submitted_by": row.submitted_by,
        "model": spec["model"],
        "global_batch": spec["global_batch"], "steps": spec["steps"], "priority": spec["priority"],
        "submitted_at": row.submitted_at, "updated_at": row.updated_at,
        "progress": {"iterations_done": prog.get("iterations_done"), "status": prog.get("status"),
                     "last_checkpoint_step": prog.get("last_checkpoint_step"), "iteration_time_s": it,
                     # while it runs: over its last steps on the wall clock, not one step's compute time
                     "throughput_samples_per_s": spec["global_batch"] * latest.rate
                     if current is not None and latest.rate else None,
                     "throughput_window_s": latest.window_s if current is not None and latest.rate else None},
        "plan": shown.plan if shown else None,
        "slurm_job_id": (current.pid_info or {}).get("slurm_job_id") if current else None,
        "gpus": list(current.gpus) if current else [],
        "launch": {"generation": last.generation, "state": last.state, "reason": last.reason} if last else None,
        "launches": len(launches), "moves": moves, "failed_launches": failures,
        "time_in_status_s": in_state,
        "history": [{"from": h.from_status, "to": h.to_status, "reason": h.reason, "at": h.at} for h in history],
        "move_ledger": [{**m, "summary": move_summary(m)} for m in store.moves.rows(job_id)],
        "loss": latest.loss, "loss_step": latest.step,
        "loss_curve": loss_curve(work_dir, launches, losses, curve_points) if curve_points else [],
        "cancel_requested": row.id in pending.cancel,
        "hold_requested": row.id in pending.hold,
        "after": after,
        "waiting_for": waiting_for,
        "waits": None if moving else wait_reason(row, history, waiting_for, pending),
        "smaller": smaller_reason(row, current, pending),
    }


def round_note(job_id: int, pending: Pending) -> str | None:
    """Why the last decided round gave the job fewer GPUs than it asked for, or none
    (engine/service/why.py), if it said."""
    last = pending.last_round
    return None if last is None else (last.decisions.get("why") or {}).get(str(job_id))


def smaller_reason(row: JobRow, current: LaunchRow | None, pending: Pending) -> str | None:
    """Why a running job runs on fewer GPUs than it asked for (None for any other job)."""
    asked = row.spec.get("gpus")
    if row.status != "running" or current is None or not asked or len(current.gpus) >= asked:
        return None
    note = round_note(row.id, pending)
    return (f"runs on {len(current.gpus)} of the {asked} GPUs it asked for: "
            + (note or "the last round did not say why (it decided nothing new for it)"))


SLURM_NOT_STARTED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
PENDING = "pending"               # a running job whose Slurm batch job has not started its ranks (mark_slurm_jobs)


def mark_slurm_jobs(jobs: list[dict], states: dict[int, dict]) -> list[dict]:
    """Job views (``job_view``, ``jobs_view``) with Slurm's side of their current launch
    (``states``: Slurm job id -> its state and reason, as ``squeue`` has them now): each
    such job gets ``slurm`` (``{"job_id", "state", "reason"}``), and one the database calls
    running while Slurm has not started its batch job yet (PENDING behind a node still
    COMPLETING, CONFIGURING ...) is shown ``pending``, not running."""
    for j in jobs:
        sid = j.get("slurm_job_id")
        st = states.get(sid) if sid is not None else None
        if st is None:
            continue
        j["slurm"] = {"job_id": sid, **st}
        if j["status"] == "running" and st["state"] in SLURM_NOT_STARTED:
            j["state"] = PENDING
    return jobs


def moving_now(row: JobRow, launches: list[LaunchRow], progress: dict, last_round: RoundRow | None) -> dict | None:
    """A queued job in the middle of a move (its last launch ended "moving", no round
    since: the move that round decided is being carried out): how (``path``), since when,
    and whether its ranks still train (a device-to-device move: until they move). None
    for any other job (the store calls it queued)."""
    if row.status != "queued" or not launches:
        return None
    last = launches[-1]
    if last.state in ACTIVE_LAUNCH or not last.reason.startswith(MOVING):
        return None
    if last_round is not None and last_round.at > last.updated_at:       # a later round: the move is over
        return None
    d2d = last.reason.startswith(f"{MOVING} (device to device)")
    training = d2d and progress.get("status") == "running"
    if d2d and not training:                                          # its ranks stopped (a restart)
        return None
    return {"path": "device to device" if d2d else "through storage", "since": last.updated_at,
            "ranks_training": training}


def wait_reason(row: JobRow, history: list[HistoryRow], waiting_for: list[int], pending: Pending) -> str | None:
    """Why a queued job is not running (None for any other job), from what the store
    knows: a cancel or hold requested, jobs it runs after, no round since it was queued,
    a failed run's backoff, the GPUs free now against what it asks for, or else the last
    round's decision not to place it."""
    if row.status != "queued":
        return None
    if row.id in pending.cancel:
        return "cancel requested: it is cancelled at the next round"
    if row.id in pending.hold:
        return "hold requested: it is set aside at the next round"
    if waiting_for:
        ids = ", ".join(map(str, waiting_for))
        return (f"runs after job {ids}, not finished yet" if len(waiting_for) == 1
                else f"runs after jobs {ids}, not all finished yet")
    changes = [h for h in history if h.from_status != h.to_status]
    queued_at = changes[-1].at if changes else row.submitted_at
    failed = bool(changes) and changes[-1].reason.startswith("run failed")
    backoff = ("its last run failed: it is offered to the policy again after the failure backoff "
               "(--failure-backoff, doubling with each failure)")
    last, room = pending.last_round, pending.room
    if last is None or last.at < queued_at:
        return "waits for the next round" + (f"; {backoff}" if failed else "")
    if failed:
        return backoff
    if room is None:
        return f"not placed by round {last.idx}"
    want, ask = row.spec.get("gpu_type"), row.spec.get("gpus")
    if want is not None and want not in room.free:
        return f"asks for {want} GPUs, which cluster {room.cluster!r} lacks (it has {', '.join(sorted(room.free))})"
    types = [want] if want is not None else sorted(room.free)
    free, off = sum(room.free[t] for t in types), sum(room.drained[t] for t in types)

    def gpus(n: int) -> str:
        return f"{n} {want + ' ' if want is not None else ''}GPU{'s' * (n != 1)}"
    drained = f"; {off} on drained nodes" if off else ""
    if ask is not None and free < ask:
        return f"no room: it asks for {gpus(ask)}, {free} free now{drained}"
    if free == 0:
        return f"no room: every {want + ' ' if want is not None else ''}GPU in service is held by other jobs{drained}"
    note = round_note(row.id, pending)
    return (f"not placed by round {last.idx} with {gpus(free)} free now: "
            + (note or "the policy chose other jobs' grids, or none of its grids fits the free GPUs"))


def move_summary(m: dict) -> dict:
    """A move-ledger row (``Store.moves``) in numbers and words: what the decision
    expected of it (its estimated rate after over before), what it made (iterations per
    second after it over the rate measured before, once it ended) and whether it paid for
    itself. The one computation behind ``arena status ID`` and the page."""
    expected_x = (m["est_rate_after"] / m["est_rate_before"]
                  if m.get("est_rate_before") and m.get("est_rate_after") is not None else None)
    rate = m.get("rate_before") or 0.0
    made_x = None
    if m.get("ended_at") is not None:
        span = m["ended_at"] - m["at"]
        if rate and span > 0:
            made_x = m["iterations_after"] / span / rate
            made = f"made {made_x:.2f}x the rate before until {m['end_reason']}"
        else:
            made = f"ended: {m['end_reason']}"
    else:
        made = "still there"
    paid_back_s = m.get("paid_back_s")
    if not rate:
        payback = ""                      # no rate measured before: nothing to pay back against
    elif paid_back_s is not None:
        payback = f"paid for itself after {paid_back_s:.0f} s"
    else:
        payback = "has not paid for itself" + (" yet" if m.get("ended_at") is None else "")
    expected = f"expected {expected_x:.2f}x" if expected_x is not None else "no estimate"
    price = f"priced {m['price_s']:.0f} s down" if m.get("price_s") is not None else ""
    kind = " (forced off a drained node)" if m.get("forced") else ""
    text = (f"{m['from_grid']} -> {m['to_grid']}{kind}: {expected}{', ' + price if price else ''}; {made}"
            + (f"; {payback}" if payback else ""))
    return {"expected_x": expected_x, "made_x": made_x, "paid_back_s": paid_back_s, "expected": expected,
            "price": price, "made": made, "payback": payback, "text": text}


def cluster_view(store: Store, cluster: ClusterSpec) -> dict:
    """Every GPU of the cluster with the job whose active launch holds it (database)."""
    owner: dict[str, int] = {}
    for lch in store.launches.active():
        for g in lch.gpus:
            owner[g] = lch.job_id
    drained = store.nodes.drained()
    nodes = []
    for n in cluster.nodes():
        out = drained.get(n.node_id)
        nodes.append({"node": n.node_id, "host": n.host, "gpu_type": n.gpu_type,
                      "drained": None if out is None else {"reason": out[0], "at": out[1]},
                      "gpus": [{"gpu": f"{n.node_id}:{i}", "job": owner.get(f"{n.node_id}:{i}")}
                               for i in range(n.num_gpus)]})
    return {"name": cluster.name, "nodes": nodes, "gpus_by_type": cluster.gpus_by_type()}


def metrics_text(store: Store, cluster: ClusterSpec, policy: str, liveness: dict | None = None,
                 node_failures: dict[int, int] | None = None) -> str:
    """The service's state in Prometheus' text exposition format (version 0.0.4): what an
    operator's monitoring scrapes and alerts on (a service whose rounds stopped, jobs
    failing, nodes drained)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {float(value)!r}" if lab else f"{name} {float(value)!r}")

    metric("arena_jobs", "gauge", "Jobs by status.",
           [({"status": s}, n) for s, n in store.jobs.status_counts().items()])
    held: dict[str, int] = dict.fromkeys(cluster.gpus_by_type(), 0)
    for lch in store.launches.active():
        t = str(lch.plan.get("gpu_type", "unknown"))
        held[t] = held.get(t, 0) + len(lch.gpus)
    metric("arena_gpus", "gauge", "GPUs of the cluster, by type.",
           [({"gpu_type": t}, n) for t, n in cluster.gpus_by_type().items()])
    metric("arena_gpus_held", "gauge", "GPUs held by active launches, by type.",
           [({"gpu_type": t}, n) for t, n in held.items()])
    drained = store.nodes.drained()
    nodes = cluster.nodes()
    metric("arena_nodes_drained", "gauge", "Nodes out of service (arena drain).", [({}, len(drained))])
    metric("arena_gpus_drained", "gauge", "GPUs on drained nodes.",
           [({}, sum(n.num_gpus for n in nodes if n.node_id in drained))])
    if node_failures is not None:
        metric("arena_node_failed_jobs", "gauge", "Different jobs whose runs failed on the node within "
               "--failure-window (the service drains it at --drain-after-failures).",
               [({"node": n.node_id}, node_failures.get(n.node_id, 0)) for n in nodes])
    moves = store.moves.counts()
    metric("arena_moves_total", "counter",
           "Moves of running jobs: decided by the policy, or forced off a drained node.",
           [({"kind": "decided"}, moves["decided"]), ({"kind": "forced"}, moves["forced"])])
    metric("arena_moves_giving_way_total", "counter",
           "Decided moves the performance model expected to slow the job (it gave GPUs up for others).",
           [({}, moves["giving_way"])])
    metric("arena_moves_judged_total", "counter",
           "Decided moves expected to speed the job up, with a measured rate before (judged for payback).",
           [({}, moves["judged"])])
    metric("arena_moves_paid_back_total", "counter",
           "Of the judged moves, those that have paid for themselves (progress since >= staying's).",
           [({}, moves["paid_back"])])
    shadow = store.rounds.shadow_counts()          # (no series at all without a shadow policy)
    for name, key, help_ in () if not shadow else (
            ("arena_shadow_rounds_total", "rounds", "Rounds in which the shadow policy was asked beside the policy."),
            ("arena_shadow_rounds_agreeing_total", "agreeing",
             "Of those, rounds in which it gave every job the same grid as the policy."),
            ("arena_shadow_rounds_failed_total", "failed", "Rounds in which the shadow policy raised."),
            ("arena_shadow_jobs_compared_total", "jobs", "Jobs compared over those rounds (one per job per round)."),
            ("arena_shadow_jobs_disagreeing_total", "disagreeing",
             "Of those, jobs the shadow policy would have given another grid or left waiting.")):
        metric(name, "counter", help_, [({"shadow_policy": p}, c[key]) for p, c in shadow.items()])
    last = store.rounds.rows(last=1)
    metric("arena_rounds", "counter", "Scheduling rounds decided so far.",
           [({"policy": policy}, last[0].idx if last else 0)])
    if last:
        metric("arena_last_round_timestamp_seconds", "gauge", "When the last round was decided (Unix time).",
               [({}, last[0].at)])
        metric("arena_last_round_solve_seconds", "gauge", "The last round's decision time.",
               [({}, last[0].solve_time_s)])
    if liveness is not None:
        metric("arena_scheduler_phase_seconds", "gauge", "Seconds the scheduler thread has been in its phase "
               "(idle: since its last poll).", [({"phase": liveness["phase"]}, liveness["since_s"])])
        metric("arena_scheduler_stalled", "gauge", "1 when that is longer than --stall-after.",
               [({}, int(liveness["stalled"]))])
    return "\n".join(lines) + "\n"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def rounds_view(store: Store, last: int = 20) -> list[dict]:
    return [{"index": r.idx, "at": r.at, "policy": r.policy, "trigger": r.trigger, "objective": r.objective,
             "gap": r.gap, "solve_time_s": r.solve_time_s, "decisions": r.decisions}
            for r in store.rounds.rows(last=last)]


def state_view(store: Store, work_dir: str, cluster: ClusterSpec, *, losses: LossLog | None = None,
               ended: int = STATE_ENDED_JOBS) -> dict:
    """What the page shows: the cluster, every job that has not ended and the ``ended``
    that ended last (``ended_total`` counts them all), the queue and the last rounds."""
    rows, ended_total = store.jobs.page(ended)
    jobs = jobs_view(store, work_dir, rows, losses=losses, curve_points=STATE_CURVE_POINTS, cluster=cluster)
    return {"cluster": cluster_view(store, cluster), "jobs": jobs,
            "queue": [j["id"] for j in jobs if j["state"] == "queued"],
            "ended_total": ended_total, "ended_shown": sum(1 for r in rows if r.status in TERMINAL),
            "rate_window_s": RATE_WINDOW_S,
            "rounds": rounds_view(store, 10)}


def job_logs(store: Store, work_dir: str, job_id: int, chars: int = 20_000) -> dict:
    """The latest launch's mpiexec output (stdout and stderr tails)."""
    launches = store.launches.rows(job_id)
    if not launches:
        return {"id": job_id, "launch": None, "stdout": "", "stderr": ""}
    d = launch_dir(work_dir, launches[-1])
    return {"id": job_id, "launch": launches[-1].generation, "stdout": tail(d / "stdout.log", chars),
            "stderr": tail(d / "stderr.log", chars)}
