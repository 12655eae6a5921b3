"""arena: schedule large-model training jobs on shared heterogeneous GPU clusters -- simulate
policies on traces, estimate jobs' parallel plans, benchmark solvers and policies, train
real torch jobs under MPI, and run live rescheduling rounds over them (`arena serve`)
(run `arena COMMAND --help`; `arena` alone simulates the demo).

One module per subcommand under ``engine/commands``. Each command module defines
``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed args; returns an exit code). Modules import heavy
dependencies (torch, solvers) inside their handlers, so ``arena --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from instances.errors import InputError

COMMAND_MODULES = (
    "engine.commands.simulate",
    "engine.commands.instances",
    "engine.commands.outages",
    "engine.commands.estimate",
    "engine.commands.profile",
    "engine.commands.bench",
    "engine.commands.train",
    "engine.commands.models",
    "engine.commands.service",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arena", description=__doc__.split("\n\n")[0],
                                     epilog="Documentation: README.md and docs/ (docs/architecture.md "
                                            "for the layout).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMAND_MODULES:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:           # command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:            # `arena` alone: the main job, a demo simulation
        args = parser.parse_args(["simulate"])
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"arena: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
