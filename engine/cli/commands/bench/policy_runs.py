"""Runs of policies on one workload, side by side: the core of ``arena bench policies``
(engine/cli/commands/bench/policies.py) and of its form over several seeds (engine/cli/commands/bench/seeds.py):
a workload named by plain values (each MPI rank builds it), one simulation per policy
label, the rows' common-jobs and lower-bound columns."""
from __future__ import annotations

import math
import time

POLICY_COLUMNS = ("policy", "policy_name", "perf", "perf_runtime", "move_costs", "jobs_finished",
                  "jobs_finished_runout", "avg_jct_s",
                  "avg_jct_runout_s",
                  "makespan_runout_s", "jobs_unfinished_runout", "jobs_never_placed", "avg_jct_common_s",
                  "jobs_common", "never_placed_reasons", "avg_throughput", "peak_throughput", "gpu_util",
                  "active_span_s", "reconfigurations", "reconfigurations_per_job",
                  "reconfigurations_runout", "reconfigurations_per_job_runout",
                  "reconfig_gpu_hours_lost_runout", "evictions", "packing_failures", "decision_time_median_s",
                  "decision_time_p99_s", "wall_time_s", "avg_jct_bound_s", "avg_jct_over_bound",
                  "moves_decided", "moves_giving_way", "moves_paid_back_share", "moves_est_gain_median",
                  "moves_realized_gain_median")


def workload_args(args, seed: int) -> dict:
    """What names the workload (the workload's flags in ``args``, the instance's ``seed``),
    as plain values (each MPI rank builds it from them)."""
    return {"instance": args.instance, "cluster": args.cluster, "trace": args.trace,
            "trace_opt": list(args.trace_opt), "seed": seed, "outages": args.outages,
            "sia_artifact": getattr(args, "sia_artifact", None)}


def build_workload(w: dict):
    import argparse

    from ...common import build_instance
    return build_instance(argparse.Namespace(**w))


def run_one_policy(workload: dict, policy: str, options: dict, rounds, run_out: bool, perf_kind: str | None,
                   reconfig_opts: dict, seed: int, out_dir=None, log=None, name: str | None = None,
                   profile_store: str | None = None, runtime: str | None = None, stop=None) -> dict:
    """One row: policy ``name`` (default: ``policy``) with ``options``, labelled ``policy``;
    its performance model reads ``profile_store`` when given and assumes ``runtime`` (when
    None: the runtime the workload's truth was measured under); ``stop`` (Ctrl-C) ends its
    simulation before the next round (the row's ``end_reason`` is then ``interrupted``)."""
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate

    from ...common import build_perf, decides_without_model, load_outages_arg, reconfig_for

    name = name or policy
    inst = build_workload(workload)
    outages = load_outages_arg(workload.get("outages"), inst.cluster)
    pol = make_policy(name, **options)
    bare = decides_without_model(perf_kind, name)
    perf = build_perf(perf_kind, name, None if bare else profile_store, None if bare else runtime,
                      inst.oracle.training_runtime, inst.oracle)
    reconfig = reconfig_for(inst, reconfig_opts)
    last = [0.0]

    def progress(p):
        now = time.perf_counter()
        if log and (now - last[0] > 10.0):
            last[0] = now
            phase = "run-out" if p.round_index >= p.horizon_rounds else f"of {p.horizon_rounds}"
            log(f"  [{policy}] round {p.round_index} {phase}: {p.jobs_finished}/{p.jobs_total} finished, "
                f"{p.elapsed_s:.0f} s")

    t0 = time.perf_counter()
    from instances.errors import InputError

    from ...common import SIM_FLAGS
    try:
        res = simulate(inst, pol, perf=perf, reconfig=reconfig, rounds=rounds, run_out=run_out,
                       seed=seed, progress=progress, out_dir=out_dir, outages=outages, stop=stop)
    except InputError as e:             # refused before the first round: named by its flag
        raise InputError(e.reason, file=e.file, line=e.line, field=SIM_FLAGS.get(e.field or "", e.field)) from None
    from ...progress import report_incomplete
    report_incomplete(res, f"arena bench policies [{policy}]")
    row = {k: res.summary.get(k) for k in POLICY_COLUMNS
           if k not in ("policy", "policy_name", "perf", "perf_runtime", "move_costs")}
    row["policy"] = policy
    row["policy_name"] = name
    row["perf"] = getattr(perf, "name", None) if perf is not None else None
    row["perf_runtime"] = getattr(perf, "runtime", None) if perf is not None else None
    row["move_costs"] = reconfig.preset
    row["end_reason"] = res.summary.get("end_reason")
    row["outages"] = workload.get("outages")
    row["_jct_by_job"] = {j.job_id: j.jct_s for j in res.jobs if j.jct_s is not None}
    row["options"] = options
    row["wall_time_s"] = time.perf_counter() - t0
    for k, v in list(row.items()):
        if hasattr(v, "item"):
            row[k] = v.item()
    if log:
        log(f"  [{policy}] done in {row['wall_time_s']:.0f} s: {row['jobs_finished']} finished by the horizon")
    return row


def policy_bench(workload: dict, policies, options: dict, rounds, run_out: bool, perf_kind: str | None,
                 reconfig_opts: dict, seed: int, out_dir=None, log=None, comm=None,
                 names: dict[str, str] | None = None, profile_store: str | None = None,
                 runtime: str | None = None, stop=None) -> list[dict] | None:
    """Rows, one per policy label (on rank 0; None on other MPI ranks); ``names`` maps a
    label to its policy (default: the label is the name); every policy's performance model
    reads ``profile_store`` when given (fcfs decides without one). ``stop`` (Ctrl-C) ends
    the running simulation before its next round and skips the policies not yet begun:
    their rows are missing."""
    from pathlib import Path
    names = names or {}
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    mine = [p for i, p in enumerate(policies) if i % size == rank]
    rows = []
    for p in mine:
        if stop is not None and stop():
            break
        sub = (Path(out_dir) / p) if out_dir else None
        rows.append(run_one_policy(workload, p, options.get(p, {}), rounds, run_out, perf_kind, reconfig_opts,
                                   seed, sub, log, name=names.get(p, p), profile_store=profile_store,
                                   runtime=runtime, stop=stop))
    if comm is not None:
        gathered = comm.gather(rows, root=0)
        if rank != 0:
            return None
        rows = [r for part in gathered for r in part]
    order = {p: i for i, p in enumerate(policies)}
    rows.sort(key=lambda r: order[r["policy"]])
    add_common_jct(rows)
    return rows


def add_jct_bound(rows: list[dict], inst, options: dict) -> None:
    """``avg_jct_bound_s``: the average over every job of its JCT alone on the cluster at
    its fastest shape (``instances/bounds.py``; shapes up to the largest ``max_gpus`` a
    row's policy was given, 16 by default), and per row ``avg_jct_over_bound``: its average
    JCT over all jobs, run out, over that (None when a job did not finish)."""
    from instances.bounds import jct_lower_bounds
    max_gpus = max([16] + [int(float(o["max_gpus"])) for o in options.values() if "max_gpus" in o])
    bounds = [b.bound_s for b in jct_lower_bounds(inst.jobs, inst.cluster, inst.oracle,
                                                  round_interval_s=inst.round_interval_s, max_gpus=max_gpus)]
    avg = sum(bounds) / len(bounds) if bounds and all(math.isfinite(b) for b in bounds) else None
    for r in rows:
        r["avg_jct_bound_s"] = avg
        done = not r.get("jobs_unfinished_runout") and r.get("avg_jct_runout_s") is not None
        r["avg_jct_over_bound"] = r["avg_jct_runout_s"] / avg if avg and done else None


def add_common_jct(rows: list[dict]) -> None:
    """``avg_jct_common_s``: average JCT over the jobs that every policy finished (run-out
    included), so that a policy that never runs the hardest jobs is not flattered."""
    sets = [set(r.get("_jct_by_job", {})) for r in rows]
    common = set.intersection(*sets) if sets else set()
    for r in rows:
        jct = r.pop("_jct_by_job", {})
        r["jobs_common"] = len(common)
        r["avg_jct_common_s"] = (sum(jct[j] for j in common) / len(common)) if common else None


def policy_colour(name: str) -> str:
    """A comparison figure's bar colour: ours (and variants of ours) in red, the others grey."""
    return "tab:red" if name.startswith(("arena", "suika")) else "tab:gray"


def decided_with(rows: list[dict]) -> str:
    """The performance model the rows' policies decided with (fcfs decides without one)."""
    kinds = sorted({r["perf"] for r in rows if r.get("perf")})
    return ", ".join(kinds) if kinds else "no model (fcfs)"
