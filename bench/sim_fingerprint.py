"""Fingerprint of a simulation, to show that a refactor leaves results identical.

    python bench/sim_fingerprint.py --instance demo --policy arena [--rounds N] [--run-out]

Prints one JSON line: the summary's figures (timing keys excluded) and a SHA-256 over
every job's record and every round's record (decision times excluded). Two runs of the
same code give the same digest; compare the lines before and after a change.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instance", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--run-out", action="store_true")
    a = p.parse_args(argv)
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
