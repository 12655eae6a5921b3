"""Fingerprint of a simulation, to show that a refactor leaves results identical.

    python bench/sim_fingerprint.py --instance demo --policy arena [--rounds N] [--run-out]
    python bench/sim_fingerprint.py --check [--reference bench/fingerprints.json] [--only POLICY ...]
    python bench/sim_fingerprint.py --write [--reference bench/fingerprints.json]

Prints one JSON line: the summary's figures (timing keys excluded) and a SHA-256 over
every job's record and every round's record (decision times excluded). Two runs of the
same code give the same digest; compare the lines before and after a change.

``--check`` runs every case of the reference file (``bench/fingerprints.json``: every
fixed-batch policy on ``demo`` run out and on ``arena-philly``'s 2,000 rounds, about 20
minutes on the 2-core VM) and prints per case ``same`` or ``changed`` (exit 1 when any
changed); ``--write`` records the current digests there. A change that alters results
by design writes new references, and says why in its study.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

TIMING = {"decision_time_s", "context_time_s", "decision_time_median_s", "decision_time_p99_s",
          "decision_time_total_s", "wall_time_s"}
LIVE_ONLY = {"failures"}        # counters of live runs (always 0 in simulation)


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if k not in TIMING and k not in LIVE_ONLY}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)
    return obj


def fingerprint(instance: str, policy: str, rounds: int | None, run_out: bool) -> dict:
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate
    from estimators import make_performance_model
    from instances.builtin import get_instance

    inst = get_instance(instance)
    perf = None if policy == "fcfs" else make_performance_model("table")   # as `arena simulate`
    result = simulate(inst, make_policy(policy), perf=perf,
                      rounds=rounds, run_out=run_out)
    h = hashlib.sha256()
    for j in result.jobs:
        h.update(json.dumps(_clean(dataclasses.asdict(j)), sort_keys=True).encode())
    for r in result.rounds:
        h.update(json.dumps(_clean(dataclasses.asdict(r)), sort_keys=True).encode())
    summary = _clean(result.summary)
    return {"instance": instance, "policy": policy, "rounds": rounds, "run_out": run_out,
            "digest": h.hexdigest(), "summary": summary}


# the reference cases: every fixed-batch policy, as the stops since 52 compared them
POLICIES = ("arena", "arena-incremental", "elasticflow-ls", "elasticflow-ls-ap", "fcfs", "gavel", "gavel-ap", "sia",
            "sia-ap", "suika")
CASES = tuple((i, p, r, o) for p in POLICIES for i, r, o in (("demo", None, True), ("arena-philly", 2000, False)))
REFERENCE = Path(__file__).with_name("fingerprints.json")


def _key(instance: str, policy: str, rounds: int | None, run_out: bool) -> str:
    return f"{instance} {policy} " + ("run-out" if run_out else f"{rounds} rounds")


def check(reference: Path, write: bool, only: list[str]) -> int:
    """Every reference case run again: ``same``/``changed`` per case on stdout (progress
    on stderr); with ``write``, the digests recorded instead."""
    known = json.loads(reference.read_text()) if reference.is_file() else {}
    cases = [c for c in CASES if not only or c[1] in only]
    changed = 0
    for n, (instance, policy, rounds, run_out) in enumerate(cases, 1):
        key = _key(instance, policy, rounds, run_out)
        print(f"sim_fingerprint: {n}/{len(cases)} {key}", file=sys.stderr, flush=True)
        digest = fingerprint(instance, policy, rounds, run_out)["digest"]
        if write:
            known[key] = digest
            continue
        same = known.get(key) == digest
        changed += not same
        print(f"{key}: {'same' if same else 'changed' if key in known else 'no reference'}", flush=True)
    if write:
        reference.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        print(f"sim_fingerprint: wrote {len(cases)} digest(s) to {reference}", file=sys.stderr)
    return 1 if changed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instance")
    p.add_argument("--policy")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--run-out", action="store_true")
    p.add_argument("--check", action="store_true", help="run the reference cases and compare their digests")
    p.add_argument("--write", action="store_true", help="run the reference cases and record their digests")
    p.add_argument("--reference", type=Path, default=REFERENCE, help="the reference file (default %(default)s)")
    p.add_argument("--only", action="append", default=[], metavar="POLICY", help="only this policy's cases")
    a = p.parse_args(argv)
    if a.check or a.write:
        if a.check and a.write:
            p.error("--check or --write, not both")
        bad = [x for x in a.only if x not in POLICIES]
        if bad:
            p.error(f"--only {bad[0]}: not a reference policy ({', '.join(POLICIES)})")
        return check(a.reference, a.write, a.only)
    if not a.instance or not a.policy:
        p.error("--instance and --policy (or --check / --write)")
    from instances.errors import InputError
    try:
        line = fingerprint(a.instance, a.policy, a.rounds, a.run_out)
    except InputError as e:          # an unknown instance or policy, a policy refusing the jobs
        print(f"sim_fingerprint: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
