"""arena: schedule large-model training jobs on shared heterogeneous GPU clusters -- simulate
policies on traces, estimate jobs' parallel plans, benchmark solvers and policies, train
real torch jobs under MPI, and run live rescheduling rounds over them (`arena serve`)
(run `arena COMMAND --help`; `arena` alone simulates the demo).

One module per subcommand under ``engine/cli/commands`` (``bench``: a package, one module
per subcommand of its own). Each command module defines ``register(subparsers)``, which
adds its parser and sets ``func`` (called with the parsed args; returns an exit code). A
command imports no other command: what several share is in ``engine/cli`` (``common``,
``progress``, ``flags``, ``jsonout``). Modules import heavy dependencies (torch, solvers)
inside their handlers, so ``arena --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from instances.errors import InputError

COMMAND_MODULES = (
    "engine.cli.commands.simulate",
    "engine.cli.commands.instances",
    "engine.cli.commands.outages",
    "engine.cli.commands.estimate",
    "engine.cli.commands.profile",
    "engine.cli.commands.bench",
    "engine.cli.commands.train",
    "engine.cli.commands.models",
    "engine.cli.commands.service",
)


PLUGIN_HELP = ("a plug-in (repeatable, anywhere in the command): a Python file or an importable module that "
               "registers its own policies, objective terms, solver backends or performance-model kinds with "
               "the built-in decorators; also ARENA_PLUGINS (os.pathsep-separated) and installed entry points "
               "of the group arena_sched.plugins (docs/architecture.md, \"Plug-ins\")")


def _plugin_preparser() -> argparse.ArgumentParser:
    """Takes ``--plugin`` out of the command wherever it stands, before the parser is
    built (the commands' help lists the registered names, plug-ins' included)."""
    pre = argparse.ArgumentParser(prog="arena", add_help=False, allow_abbrev=False)
    pre.add_argument("--plugin", action="append", default=[], metavar="FILE.py|MODULE")
    return pre


def plugin_registries() -> tuple:
    """Every registry a plug-in may add to (discovered before a plug-in runs)."""
    from engine.core.policy import POLICIES
    from engine.decide.objectives.base import TERMS
    from engine.decide.solvers.base import BACKENDS
    from estimators.perf import KINDS
    from instances.oracle import ORACLES
    return (POLICIES, TERMS, BACKENDS, KINDS, ORACLES)


def load_requested_plugins(flags: list[str]) -> tuple:
    """The command line's, the environment's and the installed entry points' plug-ins,
    loaded (nothing is imported when there are none)."""
    from instances.plugins import entry_point_specs, load_plugins, requested_specs
    specs = requested_specs(flags) + entry_point_specs()
    if not specs:
        return ()
    return tuple(load_plugins(specs, plugin_registries()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arena", description=__doc__.split("\n\n")[0],
                                     epilog="Documentation: README.md and docs/ (docs/architecture.md "
                                            "for the layout).")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py|MODULE", help=PLUGIN_HELP)
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


def check_no_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An option given an empty value (``--outages ''``, ``--instance ''``) is an
    ``InputError`` naming it: taken as not given, it ran the default without a word. An
    option whose default is itself empty (``--reason``) may be given empty."""
    while True:
        for a in parser._actions:
            if a.option_strings and a.nargs is None and a.default != "" and getattr(args, a.dest, None) == "":
                raise InputError("is empty; give a value or leave the option out", field=a.option_strings[-1])
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None:
            return
        parser = subs[0].choices[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    flags, argv = _plugin_preparser().parse_known_args(argv)
    try:
        plugins = load_requested_plugins(flags.plugin)
        for p in plugins:
            print(f"arena: plugin {p.describe()} from {p.source}", file=sys.stderr)
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:            # `arena` alone: the main job, a demo simulation
            args = parser.parse_args(["simulate"])
        check_no_empty_values(parser, args)
        args.plugins = plugins              # what the results record of the code that decided
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"arena: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:           # Ctrl-C outside a run that handles it (arena simulate writes what it has)
        print("\narena: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:             # the reader went away (`arena simulate | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (the exit's flush would raise again)
        return 1


if __name__ == "__main__":
    sys.exit(main())
