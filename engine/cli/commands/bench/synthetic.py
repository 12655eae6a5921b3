"""What ``arena bench solver`` and ``arena bench incremental`` share: their synthetic
rounds' sizes and solver limits, and the objective's ``term=weight`` list, each refused
by its own flag before any work; the flags both have (fields of their options)."""
from __future__ import annotations

import math
from dataclasses import field
from typing import Any

from ...common import seed_arg


def parse_weights(text: str) -> dict:
    """``--objective``'s ``term=weight`` list; a weight is refused here, by the flag's
    field ``objective``, against the bound every objective weight has
    (``instances.limits.check_coefficient``), not by the objective's own ``w_<term>``."""
    from instances.errors import InputError
    from instances.limits import check_coefficient
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        if k.strip() in out:
            raise InputError(f"term {k.strip()!r} given twice in {text!r}; give it once", field="objective")
        if not sep:
            raise InputError(f"expected term=weight, got {part!r}", field="objective")
        try:
            w = float(v)
        except ValueError:
            raise InputError(f"expected term=weight, got {part!r}", field="objective") from None
        out[k.strip()] = check_coefficient(w, field="objective", what=f"{part}: a term's weight ")
    return out


def check_synthetic(opts, rounds: str) -> None:
    """The synthetic benches' sizes and solver limits (``opts``: a bench's options, with
    the fields ``gpus``, ``jobs``, ``seed``, ``time_limit_s``, ``rel_gap``, ``objective`` and the
    one named ``rounds``: ``repeat`` or ``rounds``), each refused by its field (the
    command names it by its flag) before any work."""
    from engine.decide.solvers.base import MAX_SOLVER_SEED
    from instances.cluster import MAX_CLUSTER_GPUS
    from instances.errors import InputError
    from instances.limits import MAX_BENCH_JOBS, MAX_BENCH_ROUNDS, check_time, show_number
    for name, lo, hi in (("gpus", 8, MAX_CLUSTER_GPUS), ("jobs", 1, MAX_BENCH_JOBS), (rounds, 1, MAX_BENCH_ROUNDS)):
        v = getattr(opts, name)
        if not lo <= v <= hi:
            raise InputError(f"must be in {lo}..{hi:,}, got {show_number(v)}", field=name)
    if opts.seed > MAX_SOLVER_SEED:             # (the solvers' own check named the field 'seed', not the flag)
        raise InputError(f"must be at most {MAX_SOLVER_SEED:,} (the solvers take a 32-bit seed), got "
                         f"{show_number(opts.seed)}", field="seed")
    if not (math.isfinite(opts.time_limit_s) and opts.time_limit_s > 0):
        raise InputError(f"must be a finite number of seconds > 0, got {opts.time_limit_s}", field="time_limit_s")
    check_time(opts.time_limit_s, field="time_limit_s")
    if not (math.isfinite(opts.rel_gap) and 0 <= opts.rel_gap < 1):
        raise InputError(f"must be in [0, 1), got {opts.rel_gap}", field="rel_gap")
    round_objective(opts.objective)


def round_objective(text: str):
    """``--objective``'s ``term=weight`` list as the round's objective (an unknown term is
    refused naming the field ``objective``)."""
    from engine.decide.objectives import parse_objective
    return parse_objective({}, parse_weights(text))


# The flags both synthetic benches have, with the same meaning: one declaration each (a
# field of each bench's options, engine/cli/flags.py).
def gpus_field() -> Any:
    return field(default=1280, metadata={"flag": "--gpus", "help": "cluster size (default %(default)s)"})


def jobs_field() -> Any:
    return field(default=500, metadata={"flag": "--jobs", "help": "active jobs per round (default %(default)s)"})


def seed_field() -> Any:
    return field(default=0, metadata={"flag": "--seed", "type": seed_arg,
                                      "help": "synthetic rounds' seed (default %(default)s)"})


def objective_field() -> Any:
    return field(default="throughput=1,jct=1,queue=1,reconfig=1",
                 metadata={"flag": "--objective", "help": "term=weight list (default: arena's)"})
