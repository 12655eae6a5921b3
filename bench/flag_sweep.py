"""Every `arena` flag given hostile values, as a careless or hostile user would (issue 58):
each case in a forked child of one warm process, in a folder of its own, with a time
limit and a watch on its memory. A case ends one of these ways:

- ``refused``: exit status 2 with one ``error:`` line (an input error, or argparse's);
- ``accepted``: exit status 0 or 1 (read the list: a value taken must mean something);
- ``TRACEBACK``, ``HANG`` (past ``--timeout``), ``BLOWUP`` (past ``--max-rss-gb``).

The values: numbers (``nan``, ``inf``, ``-inf``, ``1e308``, ``1e999``, ``1e-300``, ``-1``, ``0``,
``-0``, ``10^20``, ``1e19``; integers of 20 and 400 digits, ``1e3``), paths (a 300-character
name, one below a missing folder, a FIFO, ``/dev/full``, ``/dev/zero``, a folder, a link
loop, a missing deep path, a file), an empty and a 5,000-character string, and broken
``KEY=VALUE`` options; the client commands' positional numbers. Values a flag takes as
valid and that start minutes of real work (a store folder for ``estimate accuracy
--against local``) are left out. Run from the repository root:

    .venv/bin/python bench/flag_sweep.py [FILTER ...] [--json OUT]   # FILTER: e.g. "bench solver"

Prints a line per case and the outcomes per command; about 1,400 cases, 15 minutes on 2
cores. Needs the ``service`` extra (``arena serve`` cases start a service for a second).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter

NUM_FLOAT = ["nan", "inf", "-inf", "1e308", "1e999", "1e-300", "-1", "0", "-0", "99999999999999999999", "1e19"]
NUM_INT = ["-1", "0", "99999999999999999999", "9" * 400, "1e3", "nan"]
PATHS = {"long": "x" * 300, "deeplong": "d/" + "x" * 300, "fifo": "FIX/fifo", "devfull": "/dev/full",
         "dir": "FIX/adir", "loop": "FIX/loop1", "missing-deep": "FIX/none/a/b", "devzero": "/dev/zero",
         "file": "FIX/afile"}
INPUT_PATHS = {"--cluster", "--trace", "--outages", "--sia-artifact", "--profile-store", "--data", "--hostfile",
               "--tokens-file", "--slurm-gpu-types", "--slurm-conf", "--db", "--model", "--data-root"}
OUTPUT_PATHS = {"--out", "--plot", "--dump-rounds", "--store", "--checkpoint-dir", "--telemetry", "--telemetry-store",
                "--run-dir", "--work-dir"}
LONG_WORK = {("estimate", "--store"), ("profile", "--store"), ("estimate", "--out"), ("estimate", "--plot")}
NO_SERVICE = "http://127.0.0.1:9"
CLIENT = {c: [c, *pos, "--url", NO_SERVICE] for c, pos in (
    ("status", []), ("logs", ["1"]), ("rounds", []), ("jobs", []), ("nodes", []), ("cancel", ["1"]), ("hold", ["1"]),
    ("release", ["1"]), ("priority", ["1", "2"]), ("drain", ["0"]), ("undrain", ["0"]))}


def bases(fix: str) -> tuple[dict, dict, dict]:
    """Each command's valid, fast arguments; the bases of flags another action reads; the
    partner of a flag that goes with another."""
    base = {
        "simulate": ["simulate", "--instance", "demo", "--rounds", "3", "--no-plots", "--quiet", "--out", "o"],
        "outages": ["outages", "--mtbf-hours", "100", "--repair-hours", "1", "--hours", "10", "--out", "o.csv"],
        "estimate": ["estimate", "--model", "gpt__350M", "--gpu-type", "a100", "--gpus", "8"],
        "profile": ["profile", "--model", "tiny-gpt__2L", "--store", "st", "--no-collectives", "--tp", "1",
                    "--micro-batches", "1", "--repeats", "1"],
        "bench solver": ["bench", "solver", "--gpus", "8", "--jobs", "2", "--repeat", "1", "--backend", "greedy"],
        "bench incremental": ["bench", "incremental", "--gpus", "8", "--jobs", "2", "--rounds", "1"],
        "bench policies": ["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--rounds", "3", "--out",
                           "o", "--quiet"],
        "bench bound": ["bench", "bound", "--instance", "demo"],
        "train": ["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run"],
        "serve": ["serve", "--local-slots", "2", "--db", "s.db", "--work-dir", "w", "--stop-after", "1", "--port",
                  "FREE"],
        "submit": ["submit", "--name", "a", "--model", "tiny-gpt__2L", "--batch", "8", "--steps", "3", "--url",
                   NO_SERVICE],
        "export-trace": ["export-trace", "--db", f"{fix}/state.db", "--out", "t.csv"],
        "backup": ["backup", "--db", f"{fix}/state.db", "--out", "b.db"],
        **CLIENT}
    local = ["estimate", "accuracy", "--against", "local", "--model", "tiny-gpt__2L"]
    action = {("estimate", "--refit-evals"): ["estimate", "accuracy", "--refit-analytic"],
              ("estimate", "--refit-starts"): ["estimate", "accuracy", "--refit-analytic"],
              ("estimate", "--plot"): ["estimate", "accuracy"], ("estimate", "--passes"): local,
              ("estimate", "--store"): local, ("estimate", "--max-splits"): ["estimate", "proxy-quality"],
              ("estimate", "--out"): ["estimate", "fit"],
              ("profile", "--group-sizes"): ["profile", "--model", "tiny-gpt__2L", "--store", "st", "--tp", "1",
                                             "--micro-batches", "1", "--repeats", "1"]}
    partner = {"--cluster": ["--trace", f"{fix}/trace.csv"], "--trace": ["--cluster", f"{fix}/cluster.json"]}
    return base, action, partner


def make_fixtures(fix: str) -> None:
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.builtin import get_instance
    from instances.traces import write_trace
    os.mkfifo(f"{fix}/fifo")
    os.symlink(f"{fix}/loop2", f"{fix}/loop1")
    os.symlink(f"{fix}/loop1", f"{fix}/loop2")
    os.mkdir(f"{fix}/adir")
    with open(f"{fix}/afile", "w") as f:
        f.write("x")
    inst = get_instance("demo", 0)
    with open(f"{fix}/cluster.json", "w") as f:
        json.dump(inst.cluster.to_json(), f)
    write_trace(list(inst.jobs)[:3], f"{fix}/trace.csv")
    with Store(f"{fix}/state.db") as st:
        st.jobs.submit(JobSpec.from_dict({"name": "a", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 3}))


def flags_by_command(parser) -> dict:
    out: dict = {}

    def walk(p, path):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, sp in subs[0].choices.items():
                walk(sp, path + [name])
            return
        out[" ".join(path)] = [a for a in p._actions if a.option_strings and a.nargs != 0
                               and a.option_strings[-1] not in ("--help", "--plugin")]
    walk(parser, [])
    return out


def with_flag(base: list[str], flag: str, value: str, partner: dict) -> list[str]:
    """``base`` with ``flag`` set to ``value`` (in place of its own value, where it has one)."""
    argv = list(base)
    if flag in partner and "--instance" in argv:
        del argv[argv.index("--instance"):argv.index("--instance") + 2]
        argv += partner[flag]
    if flag in argv:
        del argv[argv.index(flag):argv.index(flag) + 2]
    return argv + [flag, value]


def cases(fix: str):
    from engine.cli.main import build_parser
    base, action, partner = bases(fix)
    for cmd, actions in flags_by_command(build_parser()).items():
        if cmd not in base:
            continue
        for a in actions:
            flag = a.option_strings[-1]
            start = action.get((cmd, flag), base[cmd])
            kind = getattr(a.type, "__name__", "")
            if kind in ("int", "float", "seed_arg"):
                values = [(v, v) for v in (NUM_FLOAT if kind == "float" else NUM_INT)]
            elif a.choices:
                values = [("bogus", "bogus")]
            else:
                values = [(k, v.replace("FIX", fix)) for k, v in PATHS.items()
                          if (flag in INPUT_PATHS or flag in OUTPUT_PATHS)
                          and not ((cmd, flag) in LONG_WORK and k in ("dir", "missing-deep"))]
                values += [("empty", ""), ("huge-str", "y" * 5000)]
                if "opt" in flag or flag == "--objective":
                    values += [(v, v) for v in ("=", "k=", "w_jct=1e308", "time_limit_s=nan", "threads=1e999")]
            for label, v in values:
                yield cmd, flag, label, with_flag(start, flag, v, partner)
    for cmd, argv in CLIENT.items():                  # the positional numbers
        pos = next((i for i in range(1, len(argv)) if not argv[i].startswith("-") and argv[i - 1] != "--url"), None)
        for v in ["-1", "99999999999999999999", "nan", "1e308", "0x10", "9" * 400]:
            yield cmd, "<positional>", v, argv + [v] if pos is None else argv[:pos] + [v] + argv[pos + 1:]


def _child(argv: list[str], work: str, timeout_s: int) -> None:
    """In the forked child: run ``arena ARGV`` in ``work``; exit with its status (99: an
    exception escaped main)."""
    from engine.cli.main import main
    os.chdir(work)
    for fd, name in ((1, ".stdout"), (2, ".stderr")):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT), fd)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
    os.setpgid(0, 0)
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(timeout_s)
    if "FREE" in argv:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            argv[argv.index("FREE")] = str(s.getsockname()[1])
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:
        traceback.print_exc()
        rc = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(rc or 0))


def run_case(argv: list[str], fix: str, timeout_s: int, max_rss_kb: int) -> dict:
    work = tempfile.mkdtemp(prefix="case-", dir=fix)
    pid = os.fork()
    if pid == 0:
        try:
            _child(argv, work, timeout_s)
        finally:
            os._exit(98)
    peak, killed, done = [0], [False], threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
                peak[0] = max(peak[0], kb)
                if kb > max_rss_kb:
                    killed[0] = True
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, StopIteration, ValueError):
                pass
            time.sleep(0.05)
    threading.Thread(target=watch, daemon=True).start()
    t0 = time.monotonic()
    _, status, usage = os.wait4(pid, 0)
    done.set()
    wall = time.monotonic() - t0
    try:
        os.killpg(pid, signal.SIGKILL)                # whatever the case started (ranks, a service)
    except OSError:
        pass
    rc = os.waitstatus_to_exitcode(status)
    with open(f"{work}/.stderr", errors="replace") as f:
        err = f.read()
    with open(f"{work}/.stdout", errors="replace") as f:
        out = f.read()
    shutil.rmtree(work, ignore_errors=True)
    kind = ("BLOWUP" if killed[0] else "HANG" if rc == 124 else
            "TRACEBACK" if "Traceback" in err or rc in (98, 99) or rc < 0 else
            "refused" if rc == 2 and "error:" in err else "accepted" if rc in (0, 1) else f"exit {rc}")
    last = [ln for ln in (err.strip() or out.strip()).splitlines() if ln.strip()][-1:] or [""]
    return {"kind": kind, "rc": rc, "wall_s": round(wall, 2), "rss_mb": max(peak[0], usage.ru_maxrss) // 1024,
            "said": last[0][-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("filters", nargs="*", help="run only the cases whose 'command flag value' holds one of these")
    ap.add_argument("--timeout", type=int, default=30, help="seconds per case (default 30)")
    ap.add_argument("--max-rss-gb", type=float, default=3.0, help="a case past this is a blow-up (default 3)")
    ap.add_argument("--json", default=None, metavar="OUT", help="also write every case's outcome here")
    args = ap.parse_args()
    os.environ["ARENA_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for name in ("ARENA_TOKEN", "ARENA_URL", "ARENA_PLUGINS"):
        os.environ.pop(name, None)
    fix = tempfile.mkdtemp(prefix="arena-flag-sweep-")
    try:
        make_fixtures(fix)
        rows = []
        for cmd, flag, label, argv in cases(fix):
            if args.filters and not any(f in f"{cmd} {flag} {label}" for f in args.filters):
                continue
            r = {"command": cmd, "flag": flag, "value": label[:30],
                 **run_case(argv, fix, args.timeout, int(args.max_rss_gb * 2**20))}
            rows.append(r)
            print(f"{r['kind']:<9} {r['wall_s']:6.1f}s {r['rss_mb']:5d}MB {cmd:<18} {flag:<22} {label[:22]:<22} | "
                  f"{r['said'][-150:]}", flush=True)
    finally:
        shutil.rmtree(fix, ignore_errors=True)
    by = Counter((r["command"], r["kind"]) for r in rows)
    print("\noutcomes per command:")
    for c in sorted({r["command"] for r in rows}):
        print(f"  {c:<18} " + ", ".join(f"{k} {n}" for (cc, k), n in sorted(by.items()) if cc == c))
    print(f"{len(rows)} cases: " + ", ".join(f"{k} {n}" for k, n in Counter(r["kind"] for r in rows).most_common()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=0)
    bad = sum(1 for r in rows if r["kind"] not in ("refused", "accepted"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    sys.exit(main())
