"""The service's soak under load, printed: ``arena serve --local-slots 3 --local-nodes 2``
with real torch jobs, 200 submissions from 8 concurrent clients (keys, some sent again,
some twice at once), cancels, holds and releases while it runs, and the service SIGKILLed
at 10 seeded random moments and started again at once (engine/service/soak.py says what
is measured and how).

    python bench/service_soak.py [--submissions 200] [--clients 8] [--kills 10] [--seed 1]
                                 [--window 360] [--keep DIR] [--json]

Progress on stderr; the report (a table, or ``--json``) on stdout. Exit 1 when a zero
target was missed (the table's last line names it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from engine.service.soak import SoakConfig, analyse, format_report, main_progress, run_soak


def main(argv=None) -> int:
    d = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--submissions", type=int, default=d.submissions, metavar="N")
    p.add_argument("--clients", type=int, default=d.clients, metavar="N")
    p.add_argument("--kills", type=int, default=d.kills, metavar="N")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--slots", type=int, default=d.slots, metavar="N", help="per node (--local-slots)")
    p.add_argument("--nodes", type=int, default=d.nodes, metavar="K", help="--local-nodes")
    p.add_argument("--steps", type=int, nargs=2, default=list(d.steps), metavar=("MIN", "MAX"),
                   help="each job's steps, drawn in this range")
    p.add_argument("--step-delay", type=float, default=d.step_delay_s, metavar="S")
    p.add_argument("--checkpoint-interval", type=float, default=d.checkpoint_interval_s, metavar="S")
    p.add_argument("--window", type=float, default=d.submit_window_s, metavar="S",
                   help="the clients spread their submissions over this many seconds")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="run in DIR (must not exist) and keep its state, work folder and serve.log")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.submissions < 1 or a.clients < 1 or a.kills < 0 or a.window <= 0 or not 1 <= a.steps[0] <= a.steps[1]:
        p.error("--submissions and --clients >= 1, --kills >= 0, --window > 0, 1 <= MIN <= MAX for --steps")
    if a.keep is not None and Path(a.keep).exists():
        p.error(f"--keep {a.keep}: already exists")
    cfg = dataclasses.replace(d, submissions=a.submissions, clients=a.clients, kills=a.kills, seed=a.seed,
                              slots=a.slots, nodes=a.nodes, steps=(a.steps[0], a.steps[1]),
                              step_delay_s=a.step_delay, checkpoint_interval_s=a.checkpoint_interval,
                              submit_window_s=a.window)
    if a.keep is not None:
        Path(a.keep).mkdir(parents=True)
        rep = analyse(run_soak(cfg, Path(a.keep), main_progress))
    else:
        with tempfile.TemporaryDirectory(prefix="arena-soak-") as tmp:
            rep = analyse(run_soak(cfg, Path(tmp), main_progress))
    print(json.dumps(rep, indent=1) if a.json else format_report(rep))
    return 1 if rep["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
