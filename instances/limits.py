"""The bounds on numeric and size input, one place for each (docs/instances.md, "Limits").

- ``MAX_TIME_S`` (9e12 s, about 285,000 years): every time and duration an input gives
  (trace arrivals, deadlines and durations in every format, outage times, round
  intervals, solver time limits, job spec fields, generator options) is at most this.
  A double holds integers exactly up to 2^53, so a time counted in milliseconds stays
  exact up to 2^53 / 1000 s (about 9.007e12 s); beyond it ``t + d`` rounds and, far
  enough out, rounds back to ``t`` (a simulation that never advances). The simulated
  clock is held to it as well (``engine/sim/simulator.py``).
- ``MAX_COEFFICIENT`` (1e4): objective weights and the coefficient options of objective
  terms lie in [0, 1e4], a job's priority in [1e-4, 1e4]. Their product with the terms'
  own factors (a speedup, a clipped ratio) stays below about 1e15, finite and well under
  the 1e20 that HiGHS reads as infinite, and the ratio of two jobs' priorities within
  1e8, which keeps the solvers' tolerances meaningful.
- ``MAX_INPUT_BYTES`` (128 MiB): the most bytes an input file read through
  ``instances.csv_rows.read_text`` (traces, outage lists) may hold, after gzip
  decompression; the decompression is streamed and stops there (a gzip bomb never
  expands in memory). The largest bundled trace (Philly, 82,247 jobs) is 3.4 MB.
- ``MAX_NESTING_DEPTH`` (64): how deeply a JSON or TOML document may nest arrays and
  objects (``instances.structured``); every such file the project reads is at most 4
  deep.
- ``Range`` bounds, each checked by ``Range.check`` wherever its value comes from (a
  ``--policy-opt``, the Sia artifact's files, the live service): the goodput policies'
  options (Sia's ``p``, ``lambda_n`` and ``clip``, also the artifact's
  ``sia_default_*``; Pollux's ``p``; Gavel's round; the genetic search's size) and the
  Sia artifact's measurements (calibration slowdowns, restart times, step times,
  gradient statistics). Each says why: the value past it overflows, stalls the solver,
  runs for hours, or gives a schedule that runs nothing.
- ``MAX_LINK_LOAD`` (1.0): other jobs' traffic on a shared link, a fraction of its
  capacity (``link_load`` of the analytic and learned models, ``arena estimate
  --link-load``); the inter-node bandwidth is divided by ``1 + link_load``, so a fraction
  past 1 describes no link, and 1e308 made every estimate infinite.
- ``MAX_PROFILE_ACTIVATION_BYTES`` (256 MiB): the activations one profiled layer may hold
  at its largest micro-batch (``arena profile --micro-batches``), by the catalog's count
  for the shape the profiler runs. The process's peak is 2-5 times it (measured at 512
  MiB: 1.1 GB for tiny-gpt__2L, 2.6 GB for gpt__1.3B), so a profile stays under 1.5 GB,
  where a micro-batch of 10^8 asked for 25.6 GB.
- ``MAX_PROFILE_REPEATS`` (1,000): a measurement's timed repetitions, warm-up and timed
  iterations (``arena profile --repeats``, ``--warmup-iters``, ``--measured-iters``): the
  default takes 3; 10^9 ran on for days.
- ``MAX_BENCH_JOBS`` (100,000) and ``MAX_BENCH_ROUNDS`` (1,000): the synthetic rounds of
  ``arena bench solver`` and ``bench incremental`` (``--jobs``; ``--repeat``, ``--rounds``):
  the project measures up to 4,000 jobs and 20 rounds; every round is built before the
  first is solved, so 10^20 rounds never started and 10^8 jobs would not end.
- ``MAX_EXHAUSTIVE_SPLITS`` (10,000): the stage splits an exhaustive plan search enumerates
  per grid (``arena estimate proxy-quality --max-splits``; the planner's own default is
  3,000): 3,000 took 15 CPU-s on gpt__350M, and 10^20 never ended.
- ``MAX_REFIT_EVALS`` (10,000): the objective evaluations of one start of a refit of the
  analytic constants (``arena estimate accuracy --refit-analytic --refit-evals``; default
  120, each a pass over the measured table): Powell stops at its tolerances well before;
  past it, 10^20 read as "no end".
- ``MAX_STORED_INTEGER`` (2^63 - 1): SQLite's largest integer, the most any count the
  service stores or compares in SQL may be (``arena serve --keep-rounds``,
  ``--keep-measurements``: 10^20 stopped the scheduler with an ``OverflowError``).
  ``MAX_SEED``, a training run's seed (``arena train --seed``, a job's ``seed``), is it:
  the service stores the seed.
- ``available_cores()``: the CPU cores this process may use. Solver threads (every
  backend) and the processes one measurement starts on this host (``arena profile``'s
  collective groups and ``--run-grids``, on a CPU; on CUDA the GPUs torch sees) are at
  most this: more measures the cores' sharing, not the work.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import InputError

MAX_TIME_S = 9e12
TIME_BOUND = ("must be <= 9e12 s (about 285,000 years; beyond it float time loses millisecond "
              "precision)")

MAX_COEFFICIENT = 1e4
MIN_PRIORITY = 1.0 / MAX_COEFFICIENT

MAX_INPUT_BYTES = 128 * 1024 * 1024

MAX_NESTING_DEPTH = 64

MAX_LINK_LOAD = 1.0

MAX_PROFILE_REPEATS = 1000

MAX_BENCH_JOBS = 100_000
MAX_BENCH_ROUNDS = 1000

MAX_EXHAUSTIVE_SPLITS = 10_000

MAX_REFIT_EVALS = 10_000

MAX_STORED_INTEGER = 2**63 - 1
MAX_SEED = MAX_STORED_INTEGER

MAX_PROFILE_ACTIVATION_BYTES = 256 * 2**20


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Range:
    """A number's bound: in ``[lo, hi]`` (``integer``: a whole number; ``nonzero``: not 0),
    and why (``why``: what a value past it does, said in the refusal)."""
    lo: float
    hi: float
    why: str = ""
    integer: bool = False
    nonzero: bool = False

    def describe(self) -> str:
        if self.integer:
            return f"a whole number in {int(self.lo):,}..{int(self.hi):,}{', not 0' if self.nonzero else ''}"
        return f"a finite number in [{self.lo:g}, {self.hi:g}]{', not 0' if self.nonzero else ''}"

    def check(self, v, *, field: str | None = None, file: str | None = None, line: int | None = None,
              what: str = "") -> float:
        """``v`` (a number, or its text) within the range, as a float (an int when
        ``integer``), or an ``InputError`` naming ``field`` (``file``, ``line``) that says
        the range and ``why``; ``what`` prefixes the reason (``policy 'sia': p ``)."""
        why = f" ({self.why})" if self.why else ""
        f = _as_float(v)
        if f is None:
            raise InputError(f"{what}must be {self.describe()}, got {show_number(v)}", file=file, line=line,
                             field=field)
        if self.integer and math.isfinite(f) and not f.is_integer():         # 1.5 replicas is not 1
            raise InputError(f"{what}must be a whole number, got {show_number(v)}", file=file, line=line,
                             field=field)
        if not (math.isfinite(f) and self.lo <= f <= self.hi) or (self.nonzero and f == 0):
            raise InputError(f"{what}must be {self.describe()}{why}, got {show_number(v)}", file=file, line=line,
                             field=field)
        return int(f) if self.integer else f


def _as_float(v) -> float | None:
    """``v`` as a float (an integer past a float's range: +-inf), None for what is no number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        try:
            return _as_float(int(v.strip()))
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            return None
    return None


# Sia's goodput policy (engine/decide/policies/sia_goodput.py): its options and the Sia
# artifact's defaults of them (simulator_config.py: sia_default_p_val, sia_default_lambda_n,
# sia_goodput_clip_val). A configuration's cost is its normalized goodput to the power p,
# clipped: p's sign says whether the MILP minimizes (p < 0) or maximizes; lambda_n, the
# price of leaving a job out, must have the other sign and exceed the cost of a job's
# smallest configuration (1) in size, else leaving every job out is optimal.
SIA_P = Range(-10.0, 10.0, "Sia's fairness exponent; its artifact runs -0.5", nonzero=True)
SIA_LAMBDA_N = Range(-1e6, 1e6, "the price of a job left out: its size above 1, its sign opposite p's; the "
                                 "artifact runs 1.1")
SIA_CLIP = Range(1.0, 1e9, "the cap on a configuration's cost; below 1 every configuration costs the same")


def check_sia_pair(p: float, lambda_n: float, *, field: str, what: str = "", where: str = "",
                   file: str | None = None, line: int | None = None) -> None:
    """Sia's ``p`` and ``lambda_n`` together (see above): ``lambda_n`` of the other sign
    than ``p`` and larger than 1 in size, else an ``InputError`` naming ``field``."""
    if abs(lambda_n) <= 1.0 or (lambda_n > 0) == (p > 0):
        need = "> 1" if p < 0 else "< -1"
        raise InputError(f"{what}lambda_n {lambda_n:g} with p {p:g}{where}: lambda_n must be {need} (the price of "
                         f"a job left out must outweigh the cost of its smallest configuration, else the schedule "
                         f"leaves every job out)", file=file, line=line, field=field)
# Pollux's fairness exponent (engine/decide/policies/pollux.py): its exact search prices a
# job left out at 1e-3 ** p, which at p = -5 is 1e15 and past HiGHS's precision.
POLLUX_P = Range(-4.0, 10.0, "Pollux's power-mean exponent; its artifact runs -1; below -4 the cost of a job "
                             "left out (1e-3 ** p) exceeds what the solver resolves", nonzero=True)
# Gavel's time-sharing round on the Sia artifact's jobs (engine/decide/policies/gavel_goodput.py).
GAVEL_ROUND = Range(1.0, 86_400.0, "Gavel's round; its artifact runs 360 s")
# The genetic search of Pollux (engine/decide/policies/pollux_ga.py): its work per round is
# generations x population evaluations (the artifact's 100 x 100; 10 ms to seconds a round
# depending on the jobs); at most ten times that.
GA_GENERATIONS = Range(1, 1000, "the search's generations a round; its artifact runs 100", integer=True)
GA_POPULATION = Range(2, 1000, "the search's population; its artifact runs 100", integer=True)
GA_MAX_EVALUATIONS = 100_000
# The Sia artifact's measurements (instances/sia_artifact.py).
SIA_SLOWDOWN = Range(0.01, 100.0, "a calibration factor; the artifact's are 1.0 to 1.8: past 100 a job runs for "
                                   "simulated years, below 0.01 its steps take less than float time resolves")
RESTART_S = Range(0.0, 86_400.0, "a restart time; the artifact's are 15 to 250 s")
STEP_TIME_S = Range(1e-6, 3600.0, "a measured step or all-reduce time; the artifact's are 0.007 to 13 s")
SYNC_TIME_S = Range(0.0, 3600.0, STEP_TIME_S.why)
GRADIENT_STAT = Range(0.0, 1e100, "a gradient statistic; the artifact's are at most 1e16: statistical efficiency "
                                  "adds and divides them")


def is_number(v) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def show_number(v) -> str:
    """A value as an error shows it: a huge integer by its magnitude, not its 300 digits."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**16:
        return f"{float(v):.3g}" if abs(v) < 10**308 else f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    return repr(v)


def check_time(v, *, field: str | None = None, file: str | None = None, line: int | None = None,
               minimum: float | None = 0.0, strict_min: bool = False, what: str = "") -> float:
    """``v`` as a float time or duration in ``[minimum, MAX_TIME_S]`` (``strict_min``: above
    ``minimum``), or an ``InputError`` naming ``field`` (and ``file``, ``line``) that says
    the bound. ``what`` prefixes the reason (e.g. ``job j1: ``)."""
    def err(msg: str) -> InputError:
        return InputError(f"{what}{msg}", file=file, line=line, field=field)
    if not is_number(v):
        raise err(f"must be a number of seconds, got {v!r}")
    try:
        f = float(v)
    except OverflowError:               # an int past a float's range
        raise err(f"{TIME_BOUND}, got {show_number(v)}") from None
    if math.isnan(f):
        raise err(f"must be a finite number of seconds, got {v!r}")
    if f > MAX_TIME_S:
        raise err(f"{TIME_BOUND}, got {show_number(v)}")
    if minimum is not None and (f <= minimum if strict_min else f < minimum):
        raise err(f"must be {'>' if strict_min else '>='} {minimum:g}, got {show_number(v)}")
    return f


def check_coefficient(v, *, field: str | None = None, file: str | None = None, line: int | None = None,
                      minimum: float = 0.0, strict_min: bool = False, what: str = "") -> float:
    """``v`` as a float in ``[minimum, MAX_COEFFICIENT]`` (``strict_min``: above ``minimum``),
    or an ``InputError`` naming ``field`` that says the range."""
    lo = f"{'(' if strict_min else '['}{minimum:g}"
    rng = f"in {lo}, {MAX_COEFFICIENT:g}] (larger values overflow or ill-condition the objective)"
    if not is_number(v):
        raise InputError(f"{what}must be a number {rng}, got {v!r}", file=file, line=line, field=field)
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not (math.isfinite(f) and (f > minimum if strict_min else f >= minimum) and f <= MAX_COEFFICIENT):
        raise InputError(f"{what}must be a finite number {rng}, got {show_number(v)}", file=file, line=line,
                         field=field)
    return f


def check_priority(v, *, field: str | None = "priority", file: str | None = None, line: int | None = None,
                   what: str = "") -> float:
    """A job's priority: a finite number in ``[MIN_PRIORITY, MAX_COEFFICIENT]``."""
    rng = (f"in [{MIN_PRIORITY:g}, {MAX_COEFFICIENT:g}] (the objective multiplies by it: beyond that range it "
           "overflows or ill-conditions the solvers)")
    if not is_number(v):
        raise InputError(f"{what}must be a number {rng}, got {v!r}", file=file, line=line, field=field)
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not (math.isfinite(f) and MIN_PRIORITY <= f <= MAX_COEFFICIENT):
        raise InputError(f"{what}must be a finite number {rng}, got {show_number(v)}", file=file, line=line,
                         field=field)
    return f
