"""What the API, ``arena status`` and the status page show, read from the state store
(and, for live progress and losses, from the files the ranks write in the work folder).

Every status, plan and GPU shown comes from the database; progress (steps, iteration
time, loss) from the job's ``progress.json`` and each launch's ``results.jsonl``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from instances.cluster import ClusterSpec
from launcher.launch import tail
from launcher.telemetry import read_progress

from .losses import LossLog, merged
from .store import TERMINAL, JobRow, LaunchRow, Store

LOSS_POINTS = 200                 # at most about this many points of a loss curve in a job view
STATE_CURVE_POINTS = 60           # ... in each row of the page's table (a sparkline 160 px wide)
STATE_ENDED_JOBS = 50             # the page lists every job not ended and this many of the last to end


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


def last_loss(work_dir: str, launches: list[LaunchRow], losses: LossLog | None = None) -> float | None:
    """The loss of the latest step trained (only the newest launch with results is read)."""
    log = losses or LossLog()
    for _, d in reversed(run_dirs(work_dir, launches)):
        _, loss, _ = log.points(d)
        if len(loss):
            return float(loss[-1])
    return None


def _thin(n: int, k: int) -> list[int]:
    """Indices of at most about ``k`` of ``n`` points: every stride-th and the last."""
    if n <= k:
        return list(range(n))
    stride = math.ceil(n / k)
    return list(range(0, n, stride)) + ([n - 1] if (n - 1) % stride else [])


@dataclass(frozen=True)
class Pending:
    """What a job view reads of other jobs, read once for a list of views: the jobs with a
    cancel or a hold requested and not carried out, and the status of every job."""
    cancel: frozenset[int]
    hold: frozenset[int]
    status: dict[int, str]

    @classmethod
    def read(cls, store: Store, rows: list[JobRow]) -> Pending:
        return cls(frozenset(store.cancel_requests()), frozenset(j for j, _ in store.hold_requests()),
                   {r.id: r.status for r in rows})

    def statuses(self, store: Store, ids) -> dict[int, str]:
        """Status of each of ``ids`` (read from the store for one not in the list)."""
        ids = [int(i) for i in ids]
        missing = [i for i in ids if i not in self.status]
        found = store.statuses(missing) if missing else {}
        return {i: self.status[i] if i in self.status else found[i] for i in ids if i in self.status or i in found}


def job_view(store: Store, work_dir: str, job_id: int, *, losses: LossLog | None = None,
             curve_points: int = LOSS_POINTS) -> dict:
    row = store.job(job_id)
    return _job_view(store, work_dir, row, Pending.read(store, [row]), losses or LossLog(), curve_points)


def jobs_view(store: Store, work_dir: str, rows: list[JobRow], *, losses: LossLog | None = None,
              curve_points: int = 0) -> list[dict]:
    """Views of ``rows`` (``curve_points``: points of each loss curve; 0: none)."""
    pending = Pending.read(store, rows)
    log = losses or LossLog()
    return [_job_view(store, work_dir, r, pending, log, curve_points) for r in rows]


def _job_view(store: Store, work_dir: str, row: JobRow, pending: Pending, losses: LossLog,
              curve_points: int) -> dict:
    job_id = row.id
    launches = store.launches(job_id)
    history = store.history(job_id)
    prog = read_progress(Path(work_dir) / str(job_id) / "progress.json") or {}
    current = next((lch for lch in reversed(launches) if lch.state in ("intent", "started")), None)
    last = launches[-1] if launches else None
    shown = current or last
    spec = row.spec
    it = prog.get("iteration_time_s")
    # time in each status, from the history (the current status up to its last change: now)
    in_state: dict[str, float] = {}
    for a, b in zip(history, history[1:]):
        in_state[a.to_status] = in_state.get(a.to_status, 0.0) + (b.at - a.at)
    moves = sum(1 for lch in launches if "moving" in lch.reason)
    failures = sum(1 for lch in launches if lch.state == "failed")
    after = list(spec.get("after") or ())
    return {
        "id": row.id, "name": row.name, "status": row.status, "model": spec["model"],
        "global_batch": spec["global_batch"], "steps": spec["steps"], "priority": spec["priority"],
        "submitted_at": row.submitted_at, "updated_at": row.updated_at,
        "progress": {"iterations_done": prog.get("iterations_done"), "status": prog.get("status"),
                     "last_checkpoint_step": prog.get("last_checkpoint_step"), "iteration_time_s": it,
                     "throughput_samples_per_s": (spec["global_batch"] / it) if it else None},
        "plan": shown.plan if shown else None,
        "gpus": list(current.gpus) if current else [],
        "launch": {"generation": last.generation, "state": last.state, "reason": last.reason} if last else None,
        "launches": len(launches), "moves": moves, "failed_launches": failures,
        "time_in_status_s": in_state,
        "history": [{"from": h.from_status, "to": h.to_status, "reason": h.reason, "at": h.at} for h in history],
        "move_ledger": store.moves(job_id),
        "loss": last_loss(work_dir, launches, losses),
        "loss_curve": loss_curve(work_dir, launches, losses, curve_points) if curve_points else [],
        "cancel_requested": row.id in pending.cancel,
        "hold_requested": row.id in pending.hold,
        "after": after,
        "waiting_for": sorted(d for d, st in pending.statuses(store, after).items() if st != "finished")
        if row.status == "queued" else [],
    }


def cluster_view(store: Store, cluster: ClusterSpec) -> dict:
    """Every GPU of the cluster with the job whose active launch holds it (database)."""
    owner: dict[str, int] = {}
    for lch in store.running_launches():
        for g in lch.gpus:
            owner[g] = lch.job_id
    drained = store.drained()
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
           [({"status": s}, n) for s, n in store.status_counts().items()])
    held: dict[str, int] = dict.fromkeys(cluster.gpus_by_type(), 0)
    for lch in store.running_launches():
        t = str(lch.plan.get("gpu_type", "unknown"))
        held[t] = held.get(t, 0) + len(lch.gpus)
    metric("arena_gpus", "gauge", "GPUs of the cluster, by type.",
           [({"gpu_type": t}, n) for t, n in cluster.gpus_by_type().items()])
    metric("arena_gpus_held", "gauge", "GPUs held by active launches, by type.",
           [({"gpu_type": t}, n) for t, n in held.items()])
    drained = store.drained()
    nodes = cluster.nodes()
    metric("arena_nodes_drained", "gauge", "Nodes out of service (arena drain).", [({}, len(drained))])
    metric("arena_gpus_drained", "gauge", "GPUs on drained nodes.",
           [({}, sum(n.num_gpus for n in nodes if n.node_id in drained))])
    if node_failures is not None:
        metric("arena_node_failed_jobs", "gauge", "Different jobs whose runs failed on the node within "
               "--failure-window (the service drains it at --drain-after-failures).",
               [({"node": n.node_id}, node_failures.get(n.node_id, 0)) for n in nodes])
    moves = store.move_counts()
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
    shadow = store.shadow_counts()          # (no series at all without a shadow policy)
    for name, key, help_ in () if not shadow else (
            ("arena_shadow_rounds_total", "rounds", "Rounds in which the shadow policy was asked beside the policy."),
            ("arena_shadow_rounds_agreeing_total", "agreeing",
             "Of those, rounds in which it gave every job the same grid as the policy."),
            ("arena_shadow_rounds_failed_total", "failed", "Rounds in which the shadow policy raised."),
            ("arena_shadow_jobs_compared_total", "jobs", "Jobs compared over those rounds (one per job per round)."),
            ("arena_shadow_jobs_disagreeing_total", "disagreeing",
             "Of those, jobs the shadow policy would have given another grid or left waiting.")):
        metric(name, "counter", help_, [({"shadow_policy": p}, c[key]) for p, c in shadow.items()])
    last = store.rounds(last=1)
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
            for r in store.rounds(last=last)]


def state_view(store: Store, work_dir: str, cluster: ClusterSpec, *, losses: LossLog | None = None,
               ended: int = STATE_ENDED_JOBS) -> dict:
    """What the page shows: the cluster, every job that has not ended and the ``ended``
    that ended last (``ended_total`` counts them all), the queue and the last rounds."""
    rows, ended_total = store.page_jobs(ended)
    jobs = jobs_view(store, work_dir, rows, losses=losses, curve_points=STATE_CURVE_POINTS)
    return {"cluster": cluster_view(store, cluster), "jobs": jobs,
            "queue": [j["id"] for j in jobs if j["status"] == "queued"],
            "ended_total": ended_total, "ended_shown": sum(1 for r in rows if r.status in TERMINAL),
            "rounds": rounds_view(store, 10)}


def job_logs(store: Store, work_dir: str, job_id: int, chars: int = 20_000) -> dict:
    """The latest launch's mpiexec output (stdout and stderr tails)."""
    launches = store.launches(job_id)
    if not launches:
        return {"id": job_id, "launch": None, "stdout": "", "stderr": ""}
    d = launch_dir(work_dir, launches[-1])
    return {"id": job_id, "launch": launches[-1].generation, "stdout": tail(d / "stdout.log", chars),
            "stderr": tail(d / "stderr.log", chars)}
