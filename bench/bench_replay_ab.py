"""Replay speed of two commits, side by side on pinned cores (a benchmark, not a test).

    .venv/bin/python bench/bench_replay_ab.py --old REV [--new REV] [--instance arena-philly]
        [--policy arena] [--pairs 2] [--sim-arg=--perf=online ...] [--keep DIR] [--json]
        [--different-results]

Each pair runs ``arena simulate --instance I --policy P --run-out --no-plots --quiet`` for
the old and the new code at once, each pinned to one core (``taskset``); the next pair
swaps the cores. On a shared VM the cores' speeds differ and drift (this project's
2-core VM: by up to 15% between its two cores, 25% between hours), so unpinned pairs can
disagree even in sign; swapping makes a slow core count against both. ``--old`` (and
``--new``, default: the working tree) are checked out in temporary git worktrees, removed
afterwards. Both are first run for one round, so a bad option or name fails in seconds,
not after the first pair. Prints per pair the wall seconds, the decision time summed over
the rounds (``rounds.csv``) and the new/old ratio, and whether ``jobs.csv`` and
``moves.csv`` are byte-identical (an exact change must leave them so); ``--json`` prints
the rows as JSON on stdout instead (progress is on stderr). Exits 1 when a pair's
outputs differ, 2 on bad input. ``--different-results``: the two commits are known to
decide differently (e.g. ``--old`` is the commit a speed target was first measured at,
before later changes of behaviour); the ratio is then that of two different replays,
the outputs are still compared and reported, and a difference does not fail the run.
"""
from __future__ import annotations

import argparse
import csv
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fail(msg: str) -> int:
    print(f"bench_replay_ab: {msg}", file=sys.stderr)
    return 2


def _worktree(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def _command(args, out: Path, cpu: int | None, rounds: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "engine.cli", "simulate", "--instance", args.instance, "--policy", args.policy,
           "--no-plots", "--quiet", "--out", str(out), *args.sim_arg]
    cmd += ["--rounds", str(rounds)] if rounds is not None else ["--run-out"]
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + cmd


_RUNNING: list[subprocess.Popen] = []         # stopped if the benchmark is interrupted


def _start(tree: Path, args, out: Path, cpu: int | None, rounds: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.Popen(_command(args, out, cpu, rounds), cwd=tree, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _RUNNING.append(p)
    return p


def _decision_s(out: Path) -> float:
    with open(out / "rounds.csv") as f:
        return sum(float(r["decision_time_s"]) for r in csv.DictReader(f))


def _same(a: Path, b: Path) -> bool:
    """``jobs.csv`` and ``moves.csv`` byte-identical; a file one side did not write (a
    commit older than the move ledger writes no ``moves.csv``) is a difference."""
    names = ["jobs.csv"] + (["moves.csv"] if (a / "moves.csv").exists() or (b / "moves.csv").exists() else [])
    return all((a / n).exists() and (b / n).exists() and filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the commit to compare against (any git revision)")
    ap.add_argument("--new", default=None, help="a git revision (default: the working tree)")
    ap.add_argument("--instance", default="arena-philly")
    ap.add_argument("--policy", default="arena")
    ap.add_argument("--pairs", type=int, default=2, help="pairs of runs; every second pair swaps the cores")
    ap.add_argument("--sim-arg", action="append", default=[],
                    help="one more `arena simulate` argument for both, e.g. --sim-arg=--perf=online (repeatable)")
    ap.add_argument("--keep", default=None, help="keep the runs' output folders under this folder")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    ap.add_argument("--different-results", action="store_true",
                    help="the commits decide differently: report, do not fail on, differing outputs")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        return _fail(f"--pairs must be >= 1, got {args.pairs}")
    if shutil.which("taskset") is None:
        return _fail("taskset (util-linux) is not installed: it pins each run to one core")
    if len(os.sched_getaffinity(0)) < 2:
        return _fail("needs two cores to run the pair side by side")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    for rev in filter(None, (args.old, args.new)):
        if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", rev + "^{commit}"],
                          stdout=subprocess.DEVNULL).returncode:
            return _fail(f"--old/--new: {rev!r} is not a commit of {ROOT}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # a kill still cleans up (``finally``)
    scratch = Path(tempfile.mkdtemp(prefix="replay-ab-"))
    outs = Path(args.keep) if args.keep else scratch / "out"
    trees: list[Path] = []
    try:
        old = _worktree(args.old, scratch)
        trees.append(old)
        new = ROOT if args.new is None else _worktree(args.new, scratch)
        if args.new is not None:
            trees.append(new)
        for tag, tree in (("old", old), ("new", new)):        # one round each: options and names checked
            p = _start(tree, args, outs / f"check-{tag}", None, rounds=1)
            _, err = p.communicate()
            if p.returncode:
                return _fail(f"the {tag} code refused the run ({' '.join(_command(args, outs, None, 1))}):\n"
                             + err.strip()[-2000:])
        rows = []
        for i in range(args.pairs):
            core = {"old": cpus[i % 2], "new": cpus[(i + 1) % 2]}
            print(f"pair {i + 1}/{args.pairs}: old on core {core['old']}, new on core {core['new']}",
                  file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            wall: dict[str, float] = {}
            errors: dict[str, str] = {}

            def run(tag: str, tree: Path) -> None:          # each run's own end time, in its own thread
                started = time.perf_counter()
                p = _start(tree, args, outs / f"{tag}-{i}", core[tag])
                _, err = p.communicate()
                wall[tag] = time.perf_counter() - started
                if p.returncode:
                    errors[tag] = err.strip()[-2000:]

            threads = [threading.Thread(target=run, args=(tag, tree)) for tag, tree in (("old", old), ("new", new))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for tag, err in errors.items():
                return _fail(f"the {tag} run of pair {i + 1} failed:\n{err}")
            row = {"pair": i + 1, "old_core": core["old"], "new_core": core["new"],
                   "old_wall_s": round(wall["old"], 2), "new_wall_s": round(wall["new"], 2),
                   "ratio": round(wall["new"] / wall["old"], 4),
                   "old_decision_s": round(_decision_s(outs / f"old-{i}"), 2),
                   "new_decision_s": round(_decision_s(outs / f"new-{i}"), 2),
                   "identical": _same(outs / f"old-{i}", outs / f"new-{i}")}
            rows.append(row)
            print(f"  {time.perf_counter() - t0:.0f} s: old {row['old_wall_s']} s, new {row['new_wall_s']} s "
                  f"(x{row['ratio']}), decision {row['old_decision_s']} -> {row['new_decision_s']} s, "
                  f"{'identical' if row['identical'] else 'DIFFERENT'} jobs.csv/moves.csv", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps({"old": args.old, "new": args.new or "working tree", "instance": args.instance,
                              "policy": args.policy, "sim_args": args.sim_arg, "pairs": rows}))
        else:
            print("| pair | old core | new core | old s | new s | new/old | decision s, old -> new | identical |")
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['pair']} | {r['old_core']} | {r['new_core']} | {r['old_wall_s']} | {r['new_wall_s']} | "
                      f"{r['ratio']} | {r['old_decision_s']} -> {r['new_decision_s']} | {r['identical']} |")
        return 0 if args.different_results or all(r["identical"] for r in rows) else 1
    finally:
        for p in _RUNNING:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(t)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
