"""A long run's feedback on stderr: the progress line, Ctrl-C as a request to stop before
the next round (the results so far are written), and what a run left unfinished."""
from __future__ import annotations

import sys
import time


class ProgressLine:
    """One self-overwriting status line on stderr (plain text, at most ~4 updates/s)."""

    def __init__(self, stream=sys.stderr, min_interval_s: float = 0.25):
        self.stream, self.min_interval_s, self.last = stream, min_interval_s, 0.0
        self.tty = getattr(stream, "isatty", lambda: False)()

    def __call__(self, p) -> None:
        now = time.perf_counter()
        if now - self.last < (self.min_interval_s if self.tty else 5.0):
            return
        self.last = now
        if p.horizon_rounds >= p.max_rounds:
            where = f"round {p.round_index} (no horizon: until every job is done)"
        elif p.round_index <= p.horizon_rounds or not p.run_out:
            frac = min(1.0, p.round_index / max(1, p.horizon_rounds))
            bar = "#" * int(frac * 20)
            where = f"[{bar:<20}] round {p.round_index}/{p.horizon_rounds}"
        else:
            where = f"run-out: round {p.round_index} (horizon {p.horizon_rounds})"
        line = f"{where}  finished {p.jobs_finished}/{p.jobs_total}  {p.elapsed_s:.1f} s"
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


class Interrupt:
    """Ctrl-C (SIGINT) during a run, as a ``stop`` the simulator asks before every round:
    the first asks the run to stop there (its results so far are written, and the command
    exits with status 130); a second stops at once (``KeyboardInterrupt``). Outside the
    main thread nothing is installed (the run then stops only at a second, plain Ctrl-C)."""

    EXIT_STATUS = 130                   # 128 + SIGINT, as a shell reports it

    def __init__(self, prog: str):
        self.prog, self.requested, self._old = prog, False, None

    def __enter__(self) -> "Interrupt":
        import signal
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:              # not the main thread
            self._old = None
        return self

    def __exit__(self, *exc) -> None:
        import signal
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{self.prog}: interrupted: stopping before the next round and writing the results so far "
              f"(Ctrl-C again to stop at once, writing nothing)", file=sys.stderr, flush=True)

    def __call__(self) -> bool:
        return self.requested


def report_incomplete(res, prog: str) -> None:
    """On stderr: every job never placed, with why, and a run-out that a safety stop ended."""
    from engine.sim.metrics import never_placed_lines
    for line in never_placed_lines(res):
        print(f"{prog}: {line}", file=sys.stderr)
    s = res.summary
    if s.get("stopped_by_safety"):
        if s.get("end_reason") == "safety limit":
            why = (f"reached the safety limit of {s['safety_limit_rounds']:,} rounds "
                   f"({s['safety_limit_rounds'] * s['round_interval_s'] / 86400 / 365:.1f} simulated years; "
                   f"raise it with --max-rounds)")
        elif s.get("end_reason") == "clock bound":
            why = (f"reached the bound on simulated time after {s['rounds_simulated']:,} rounds (the clock must stay "
                   f"<= 9e12 s, about 285,000 years; beyond it float time loses millisecond precision)")
        else:
            why = "stalled: nothing ran, nothing was left to arrive and the policy started nothing"
        print(f"{prog}: warning: the run-out ended before every job finished: {why}; "
              f"{s.get('jobs_unfinished_runout')} job(s) unfinished", file=sys.stderr)
