"""Policies compared over several seeds (``arena bench policies --seeds``): each policy's
metrics as mean, standard deviation, min and max over the seeds, and a paired comparison
of every policy's average JCT with a baseline's, seed by seed.

The paired comparison is the one that can say "A is better than B": both policies ran
the same workload in each seed, so the per-seed ratio ``baseline JCT / policy JCT``
(above 1: the policy is faster) removes what the seed does to both. Its geometric mean
comes with a 95% confidence interval from Student's t on the log ratios (n - 1 degrees
of freedom; none for one seed). A seed counts only where both policies finished every
job (the average is then over all jobs, the same jobs for both); the others are
reported as ``seeds_incomparable``, never averaged over fewer jobs.
"""
from __future__ import annotations

import math
from typing import Iterable

METRICS = ("avg_jct_runout_s", "makespan_runout_s", "avg_jct_over_bound", "reconfigurations_per_job_runout",
           "reconfig_gpu_hours_lost_runout", "moves_paid_back_share", "decision_time_median_s")
COUNTS = ("jobs_never_placed", "jobs_unfinished_runout")


def parse_seeds(text: str) -> list[int]:
    """``0-4`` or ``0,1,7`` (or both: ``0-2,9``) as a list of distinct seeds >= 0, in order;
    ValueError naming the bad part."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ValueError(f"expected seeds like 0-4 or 0,1,7, got {part!r}") from None
        if a < 0 or b < a:
            raise ValueError(f"expected seeds >= 0 and ranges low-high, got {part!r}")
        if b - a >= 10_000:
            raise ValueError(f"at most 10,000 seeds in a range, got {part!r}")
        for s in range(a, b + 1):
            if s in seeds:
                raise ValueError(f"seed {s} given twice")
            seeds.append(s)
    return seeds


def _finite(values: Iterable) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def spread(values: Iterable) -> dict[str, float | int | None]:
    """mean, sd (sample; 0 for one value), min, max and n of the finite values."""
    v = _finite(values)
    if not v:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return {"mean": m, "sd": sd, "min": min(v), "max": max(v), "n": len(v)}


def _complete(row: dict) -> bool:
    """Every job finished (so its average JCT is over all jobs)."""
    return not row.get("jobs_unfinished_runout") and row.get("avg_jct_runout_s") is not None


def paired_ratio(pairs: list[tuple[dict, dict]]) -> dict:
    """Seed by seed ``baseline avg JCT / policy avg JCT`` over (baseline row, policy row)
    pairs: geometric mean, its 95% interval, min, max, wins (ratio > 1), and how many
    seeds could not be compared (a job unfinished in either)."""
    from scipy.stats import t as student_t
    logs = [math.log(b["avg_jct_runout_s"] / p["avg_jct_runout_s"]) for b, p in pairs
            if _complete(b) and _complete(p) and p["avg_jct_runout_s"] > 0 and b["avg_jct_runout_s"] > 0]
    out: dict = {"seeds_compared": len(logs), "seeds_incomparable": len(pairs) - len(logs)}
    if not logs:
        return {**out, "geomean": None, "ci95": None, "min": None, "max": None, "wins": 0}
    n = len(logs)
    m = sum(logs) / n
    ci = None
    if n > 1:
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1))
        half = float(student_t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        ci = [math.exp(m - half), math.exp(m + half)]
    return {**out, "geomean": math.exp(m), "ci95": ci, "min": math.exp(min(logs)), "max": math.exp(max(logs)),
            "wins": sum(1 for x in logs if x > 1e-12)}


def aggregate(rows: list[dict], baseline: str) -> list[dict]:
    """One entry per policy label (in the rows' first-seen order) over rows that carry
    ``seed`` and ``policy``: each metric's spread, the counts' totals, and the paired ratio
    against ``baseline`` (a label among the rows)."""
    labels = list(dict.fromkeys(r["policy"] for r in rows))
    if baseline not in labels:
        raise ValueError(f"baseline {baseline!r} is not among the policies ({', '.join(labels)})")
    by = {(r["policy"], r["seed"]): r for r in rows}
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    out = []
    for label in labels:
        mine = [by[(label, s)] for s in seeds if (label, s) in by]
        entry: dict = {"policy": label, "policy_name": mine[0].get("policy_name", label), "seeds": len(mine)}
        for k in METRICS:
            entry[k] = spread(r.get(k) for r in mine)
        for k in COUNTS:
            entry[k + "_total"] = sum(int(r.get(k) or 0) for r in mine)
        entry["baseline"] = baseline
        pairs = [(by[(baseline, s)], by[(label, s)]) for s in seeds if (baseline, s) in by and (label, s) in by]
        entry["jct_gain_vs_baseline"] = paired_ratio(pairs)
        out.append(entry)
    return out


def seeds_changed_nothing(rows: list[dict]) -> bool:
    """Every policy's average JCT and makespan the same in every seed: the workload and
    the decisions did not depend on the seed (a fixed trace decided without noise)."""
    by: dict[str, set] = {}
    for r in rows:
        by.setdefault(r["policy"], set()).add((r.get("avg_jct_runout_s"), r.get("makespan_runout_s")))
    return len({r["seed"] for r in rows}) > 1 and all(len(v) == 1 for v in by.values())
