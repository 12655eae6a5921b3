"""Baselines against their authors' own simulator: the Sia artifact's workloads under our
policies, beside the Sia simulator's logs of the same workloads and the paper's Table 3.

    python bench/sia_fidelity.py --sia-artifact DIR --trace philly [--workloads 1-8] \\
        [--policy sia --policy gavel --policy pollux --policy arena] [--policy LABEL=NAME --policy-opt LABEL:K=V] \\
        [--reference sia=/work/sia-runs/sia-philly --reference gavel=... --reference pollux=...] \\
        [--baseline sia] [--json] [--out FILE] [--ours-from FILE]

Per policy and workload (``sia:<trace>/workload-N``, every job run out): average JCT,
p99 JCT (the job at index ``int(0.99 n)`` of the sorted JCTs, the artifact's rule),
makespan (last completion minus first arrival) and GPU-hours per job (GPU-seconds held,
restarts included, over the jobs); printed as mean ± sd over the workloads (sample sd),
with the p99 over the pooled jobs of every workload (what Table 3 reports). A
``--reference LABEL=DIR`` folder holds the Sia simulator's output for the same
workloads (``workload-N.log``, one JSON line per round, as ``multi_simulator.py
--output=FILE`` writes it): the same metrics read from it (GPU-hours: the GPUs each job
holds at each logged round times the round's length, as the artifact's
``utils/print_run_stats.py`` counts them). Every label with a reference gets the ratio
of our average JCT to its reference's; every policy the paired per-workload comparison
of average JCT against ``--baseline`` (geometric mean of baseline / policy, 95%
interval, and on how many workloads the policy is faster). Progress on stderr; ``--json``:
the rows and summaries as JSON on stdout. ``--ours-from FILE`` (repeatable) takes our
rows from earlier ``--out`` files instead of simulating again (the references are read
afresh: the Sia simulator's runs take hours and finish one by one).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

# Table 3 of the Sia paper draft (sia-sosp23.pdf in the artifact): average JCT (h, mean ±
# sd over the workloads), p99 JCT (h, pooled), makespan (h) and GPU-hours per job
# (mean ± sd), heterogeneous 64-GPU cluster. Traces: the artifact's workloads/ folders.
TABLE3 = {
    "philly": {"sia": (0.6, 0.1, 9.5, 14.2, 1.9, 4.0, 0.7), "pollux": (1.0, 0.1, 14.9, 24.5, 7.9, 5.6, 1.1),
               "gavel": (1.9, 0.3, 30.0, 33.8, 8.6, 9.0, 6.3)},
    "saturn": {"sia": (0.7, 0.1, 10.9, 14.9, 1.7, 4.8, 0.7), "pollux": (1.0, 0.2, 15.0, 25.5, 8.0, 5.9, 0.7),
               "gavel": (2.5, 0.9, 38.7, 43.0, 10.9, 12.1, 3.7)},
    "newtrace": {"sia": (0.7, 0.1, 4.6, 52.2, 1.3, 3.0, 0.1), "pollux": (1.5, 0.2, 10.3, 62.3, 4.6, 3.4, 0.2),
                 "gavel": (11.3, 3.0, 98.1, 110.0, 21.5, 6.4, 1.1)},
}
METRICS = ("avg_jct_h", "p99_jct_h", "makespan_h", "gpu_h_per_job")


def p99_index(jcts: list[float]) -> float:
    s = sorted(jcts)
    return s[min(int(0.99 * len(s)), len(s) - 1)]


def workload_metrics(jobs: list[tuple[str, float, float]], gpu_s: float) -> dict:
    """``jobs``: (name, arrival s, JCT s) of every job; ``gpu_s``: GPU-seconds held."""
    jcts = [j for _, _, j in jobs]
    return {"jobs": len(jobs), "avg_jct_h": sum(jcts) / len(jcts) / 3600, "p99_jct_h": p99_index(jcts) / 3600,
            "makespan_h": (max(a + j for _, a, j in jobs) - min(a for _, a, _ in jobs)) / 3600,
            "gpu_h_per_job": gpu_s / len(jobs) / 3600, "_jcts": jcts}


def read_reference(path: Path) -> dict:
    """The metrics of one Sia-simulator log (module doc)."""
    last = None
    prev_t = None
    interval = None
    held: dict[str, int] = {}
    gpu_s = 0.0
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            entry = json.loads(line)
            t = float(entry["timestamp"])
            if prev_t is not None and interval is None:
                interval = t - prev_t
            if prev_t is not None:                      # GPUs held over the round that just ended
                gpu_s += sum(held.values()) * (t - prev_t)
            held = {}
            for j in entry["submitted_jobs"]:
                alloc = j.get("allocation") or []
                if j["completion_time"] is None and len(alloc) == 2 and alloc[0] is not None:
                    held[j["name"]] = len(alloc[1])
            prev_t = t
            last = entry
    if last is None:
        raise ValueError(f"{path}: empty log")
    gpu_s += sum(held.values()) * (interval or 0.0)
    jobs = [(j["name"], float(j["submission_time"]), float(j["completion_time"]) - float(j["submission_time"]))
            for j in last["submitted_jobs"] if j["completion_time"] is not None]
    unfinished = sum(1 for j in last["submitted_jobs"] if j["completion_time"] is None)
    out = workload_metrics(jobs, gpu_s)
    out["unfinished"] = unfinished
    out["round_s"] = interval
    return out


def run_ours(inst, label: str, name: str, options: dict) -> dict:
    from engine.cli.common import check_policy_on, goodput_perf, instance_workload, reconfig_for
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate
    pol = make_policy(name, **options)
    check_policy_on(pol, instance_workload(inst, run_out=True))     # an option it would not read: refused
    t0 = time.perf_counter()
    res = simulate(inst, pol, perf=goodput_perf(None, None, None, inst.oracle), reconfig=reconfig_for(inst, {}),
                   run_out=True)
    jobs = [(j.job_id, j.arrival_s, j.jct_s) for j in res.jobs if j.jct_s is not None]
    out = workload_metrics(jobs, sum(j.attained_gpu_s for j in res.jobs))
    out["unfinished"] = sum(1 for j in res.jobs if j.jct_s is None)
    out["reconfigurations_per_job"] = res.summary.get("reconfigurations_per_job_runout")
    out["wall_s"] = time.perf_counter() - t0
    return out


def summarize(rows: list[dict]) -> dict:
    from engine.sim.seed_stats import spread
    s = {k: spread(r[k] for r in rows) for k in METRICS}
    pooled = [j for r in rows for j in r["_jcts"]]
    s["p99_pooled_h"] = p99_index(pooled) / 3600 if pooled else None
    s["workloads"] = len(rows)
    s["unfinished"] = sum(r.get("unfinished", 0) for r in rows)
    return s


def _plain(rows: list[dict]) -> list[dict]:
    """The rows as JSON keeps them (each row's JCTs in hours)."""
    return [{**{k: v for k, v in r.items() if k != "_jcts"}, "jcts_h": [j / 3600 for j in r["_jcts"]]} for r in rows]


def _fmt(sp: dict) -> str:
    if sp["mean"] is None:
        return "-"
    return f"{sp['mean']:.2f}" if sp.get("n", 2) < 2 else f"{sp['mean']:.2f} ± {sp['sd']:.2f}"     # no sd of one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sia-artifact", required=True, metavar="DIR")
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--workloads", default=None, help="numbers, e.g. 1-8 or 1,3 (default: every workload-N)")
    ap.add_argument("--policy", action="append", default=[], metavar="[LABEL=]NAME")
    ap.add_argument("--policy-opt", action="append", default=[], metavar="LABEL:K=V")
    ap.add_argument("--reference", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--baseline", default="sia")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, metavar="FILE", help="write the rows and summaries as JSON here too")
    ap.add_argument("--ours-from", action="append", default=[], metavar="FILE",
                    help="our rows from an earlier --out (its workloads and policies) instead of simulating again "
                         "(repeatable: runs of different workloads side by side)")
    args = ap.parse_args(argv)

    from engine.cli.common import parse_value
    from engine.sim.seed_stats import paired_ratio, parse_seeds
    from instances.errors import InputError
    from instances.sia_artifact import artifact_root, list_workloads
    from instances.sia_instances import load_sia_instance

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        root = artifact_root(args.sia_artifact)
        names = list_workloads(root, args.trace)
        if args.workloads:
            want = set(parse_seeds(args.workloads))
            names = [n for n in names if n.rsplit("-", 1)[-1].isdigit() and int(n.rsplit("-", 1)[-1]) in want]
        if not names:
            raise InputError(f"no workloads selected in {args.trace}", field="--workloads")
        policies = {}
        for p in args.policy or ["sia", "gavel", "pollux"]:
            label, _, name = p.partition("=")
            policies[label] = name or label
        options: dict[str, dict] = {label: {} for label in policies}
        for o in args.policy_opt:
            label, _, kv = o.partition(":")
            k, _, v = kv.partition("=")
            if label not in options or not k:
                raise InputError(f"bad --policy-opt {o!r}: LABEL:KEY=VALUE with LABEL one of {list(options)}",
                                 field="--policy-opt")
            options[label][k] = parse_value(v)
        refs = {}
        for r in args.reference:
            label, _, d = r.partition("=")
            if not d or not Path(d).is_dir():
                raise InputError(f"--reference {r!r}: LABEL=DIR with DIR a folder of workload-N.log",
                                 field="--reference")
            refs[label] = Path(d)
        earlier = None
        if args.ours_from:
            earlier = []
            for path in args.ours_from:
                try:
                    earlier += [r for r in json.loads(Path(path).read_text())["rows"] if r["source"] == "ours"]
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise InputError(f"not an earlier --out of this script ({e})", file=path,
                                     field="--ours-from") from None
            seen = set()
            for r in earlier:
                if (r["workload"], r["policy"]) in seen:
                    raise InputError(f"{r['workload']} {r['policy']} is in two of the --ours-from files",
                                     field="--ours-from")
                seen.add((r["workload"], r["policy"]))
            names = [n for n in names if any(r["workload"] == n for r in earlier)]
    except InputError as e:
        print(f"sia_fidelity: error: {e}", file=sys.stderr)
        return 2

    rows: list[dict] = []
    for wname in names:
        if earlier is not None:
            for r in earlier:
                if r["workload"] == wname and (not args.policy or r["policy"] in policies):
                    rows.append({**r, "_jcts": [h * 3600 for h in r["jcts_h"]]})
        inst = load_sia_instance("sia:" + wname, root) if earlier is None else None
        for label, name in policies.items() if inst is not None else ():
            m = run_ours(inst, label, name, options[label])
            rows.append({"source": "ours", "policy": label, "policy_name": name, "workload": wname, **m})
            log(f"{wname} {label}: avg JCT {m['avg_jct_h']:.3f} h, p99 {m['p99_jct_h']:.2f} h, makespan "
                f"{m['makespan_h']:.2f} h, {m['gpu_h_per_job']:.2f} GPU-h/job ({m['wall_s']:.0f} s)")
        for label, d in refs.items():
            f = d / (wname.split("/", 1)[1] + ".log")
            if f.is_file():
                m = read_reference(f)
                rows.append({"source": "sia-simulator", "policy": label, "workload": wname, **m})
                log(f"{wname} {label} (Sia simulator): avg JCT {m['avg_jct_h']:.3f} h")
        if args.out:                # the rows so far: --ours-from reads them if the run is cut short
            Path(args.out).write_text(json.dumps({"trace": args.trace, "rows": _plain(rows)}, indent=1))
    summaries = []
    for source in ("ours", "sia-simulator"):
        for label in dict.fromkeys(r["policy"] for r in rows if r["source"] == source):
            mine = [r for r in rows if r["source"] == source and r["policy"] == label]
            s = {"source": source, "policy": label, **summarize(mine)}
            if source == "ours":
                base = {r["workload"]: r for r in rows if r["source"] == "ours" and r["policy"] == args.baseline}
                pairs = [({"avg_jct_runout_s": base[r["workload"]]["avg_jct_h"]},
                          {"avg_jct_runout_s": r["avg_jct_h"]}) for r in mine if r["workload"] in base]
                s["vs_baseline"] = paired_ratio(pairs) if pairs else None
                ref = {r["workload"]: r for r in rows if r["source"] == "sia-simulator" and r["policy"] == label}
                both = [r["workload"] for r in mine if r["workload"] in ref]
                if both:
                    ours_m = sum(r["avg_jct_h"] for r in mine if r["workload"] in ref) / len(both)
                    ref_m = sum(ref[w]["avg_jct_h"] for w in both) / len(both)
                    s["vs_reference"] = {"workloads": len(both), "ours_h": ours_m, "reference_h": ref_m,
                                         "ratio": ours_m / ref_m}
            summaries.append(s)
    out = {"trace": args.trace, "workloads": names, "summaries": summaries, "table3": TABLE3.get(args.trace),
           "rows": _plain(rows)}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"trace {args.trace}, {len(names)} workloads; mean ± sd over the workloads (h); p99 pooled")
    print(f"{'policy':<16}{'source':<15}{'n':>3}  {'avg JCT':<14}{'p99 JCT':<14}{'p99 pooled':>10}  "
          f"{'makespan':<15}{'GPU-h/job':<14}{'vs ' + args.baseline + ' (wins)':<28}{'ours/ref JCT':>12}")
    for s in summaries:
        vb = s.get("vs_baseline")
        vbs = "-" if not vb or vb.get("geomean") is None else \
            f"{vb['geomean']:.2f}x" + (f" [{vb['ci95'][0]:.2f}, {vb['ci95'][1]:.2f}]" if vb.get("ci95") else "") \
            + f" {vb['wins']}/{vb['seeds_compared']}"
        vr = s.get("vs_reference")
        vrs = f"{vr['ratio']:.3f}" if vr else "-"
        print(f"{s['policy']:<16}{s['source']:<15}{s['workloads']:>3}  {_fmt(s['avg_jct_h']):<14}"
              f"{_fmt(s['p99_jct_h']):<14}{s['p99_pooled_h'] or math.nan:>10.2f}  {_fmt(s['makespan_h']):<15}"
              f"{_fmt(s['gpu_h_per_job']):<14}{vbs:<28}{vrs:>12}")
    t3 = TABLE3.get(args.trace)
    if t3:
        for label, (j, jsd, p99, mk, mksd, gh, ghsd) in t3.items():
            print(f"{label:<16}{'Table 3':<15}{'':>3}  {f'{j} ± {jsd}':<14}{'':<14}{p99:>10.2f}  "
                  f"{f'{mk} ± {mksd}':<15}{f'{gh} ± {ghsd}':<14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
