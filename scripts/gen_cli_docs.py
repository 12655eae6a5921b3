"""Write docs/cli.md, docs/cli-bench.md and docs/cli-service.md, the command-line reference,
from the `arena` command's own argparse parsers (engine/cli/main.py's ``build_parser``):
every command and subcommand, its description, and each argument with its default, choices and help.

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md, docs/cli-bench.md and docs/cli-service.md
    python scripts/gen_cli_docs.py --check    # exit 1 (and say what differs) when one is out of date

``tests/test_docs_cli.py`` runs the check, so a flag added without regenerating the page
fails the tests. Plug-ins are not loaded (only the built-in policies, terms, backends and
kinds are named), and the output does not depend on the terminal's width.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
# The live service's commands and `arena bench` go on pages of their own (each page stays under 25 KB).
SERVICE_OUT = ROOT / "docs" / "cli-service.md"
BENCH_OUT = ROOT / "docs" / "cli-bench.md"
SERVICE_COMMANDS = ("serve", "submit", "status", "cancel", "hold", "release", "priority", "drain", "undrain", "nodes",
                    "logs", "rounds", "export-trace", "backup", "jobs")
BENCH_COMMANDS = ("bench",)

HEADER = """# Command-line reference: simulate, estimate, profile, train

Generated from the `arena` command's argparse parsers by `scripts/gen_cli_docs.py`; do not
edit by hand: run `python scripts/gen_cli_docs.py` after changing a flag
(`tests/test_docs_cli.py` fails while this page is out of date). What the commands do is
in the reference pages ([architecture](architecture.md) has the map); `arena COMMAND
--help` prints the same. The live service's commands (`arena serve` and its clients) are
on [their own page](cli-service.md), and so are [`arena bench`'s](cli-bench.md).

Every command also takes `--plugin FILE.py|MODULE` anywhere on its line
([plug-ins](architecture.md#plug-ins)). A bad input ends with `arena: error: <file>, line
<n>, field '<field>': <reason>` and exit status 2 ([bad inputs](bad-inputs.md)).
"""


def _md(text: str) -> str:
    """Help text as one Markdown table cell: no pipes, no raw HTML, no stray emphasis."""
    text = " ".join(str(text).split())
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("*", "\\*"))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)   # %(default)s and the like, as --help shows them


def _names(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = ""
        if action.nargs != 0:
            mv = action.metavar if action.metavar is not None else action.dest.upper()
            if isinstance(mv, tuple):
                mv = " ".join(mv)
            if action.nargs in ("*", "+"):
                metavar = f" {mv} ..."
            elif action.nargs == "?":
                metavar = f" [{mv}]"
            elif isinstance(action.nargs, int) and action.nargs > 1:
                metavar = " " + " ".join([mv] * action.nargs)
            else:
                metavar = f" {mv}"
        return ", ".join(f"`{o}{metavar}`" for o in action.option_strings)
    mv = action.metavar if action.metavar is not None else action.dest
    return f"`{mv}`" + (" ..." if action.nargs in ("*", "+") else "")


def _default(action: argparse.Action) -> str:
    d = action.default
    if action.nargs == 0 or d is None or d == argparse.SUPPRESS or d is False or d == []:
        return ""
    if not action.option_strings:
        return ""
    return f"`{d}`" if not isinstance(d, str) or d else "`''`"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a
    return None


def _page(words: list[str]) -> str:
    if words and words[0] in SERVICE_COMMANDS:
        return "cli-service.md"
    if words and words[0] in BENCH_COMMANDS:
        return "cli-bench.md"
    return ""


def _command(parser: argparse.ArgumentParser, words: list[str], depth: int, out: list[str],
             pages: dict[str, list[str]]) -> None:
    sub = _subparsers(parser)
    out = pages.setdefault(_page(words), out) if words else out
    title = "#" * min(depth, 4) + " " + " ".join(["arena", *words])
    out += [title, ""]
    desc = parser.description or ""
    if desc:
        out += [" ".join(desc.split()), ""]
    out += ["```", " ".join(parser.format_usage().split()).removeprefix("usage: "), "```", ""]
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.help == argparse.SUPPRESS:
            continue
        help_text = _help(parser, a)
        if a.choices is not None and not isinstance(a.choices, dict):
            choices = ", ".join(f"`{c}`" for c in a.choices)
            if choices not in help_text:
                help_text = (help_text + "; " if help_text else "") + f"one of {', '.join(map(str, a.choices))}"
        rows.append(f"| {_names(a).replace('|', '&#124;')} | {_default(a).replace('|', '&#124;')} | {_md(help_text)} |")
    if rows:
        out += ["| argument | default | what it does |", "|---|---|---|", *rows, ""]
    if sub is not None:
        helps = {ca.dest: ca.help for ca in sub._choices_actions}
        names = list(sub.choices)
        out += ["| command | what it does |", "|---|---|"]
        out += [f"| [`{' '.join(['arena', *words, n])}`]({_page([*words, n])}#{_anchor(['arena', *words, n])}) | "
                f"{_md(helps.get(n) or '')} |" for n in names]
        out += [""]
        for n in names:
            _command(sub.choices[n], [*words, n], depth + 1, out, pages)


def _anchor(words: list[str]) -> str:
    """The id Python-Markdown's toc gives the heading `arena bench policies`."""
    return "-".join(w.lower() for w in words).replace("_", "_")


SERVICE_HEADER = """# Command-line reference: the live service

Generated with [the rest of the command-line reference](cli.md) by
`scripts/gen_cli_docs.py`; do not edit by hand. What the service does is
[Service](service.md); the operator's walk-through is [Operating the service](operators.md).
The clients find the service with `--url` (or `ARENA_URL`) and give a token with `--token`
(or `ARENA_TOKEN`) when it has one.
"""


BENCH_HEADER = """# Command-line reference: arena bench

Generated with [the rest of the command-line reference](cli.md) by
`scripts/gen_cli_docs.py`; do not edit by hand. What the benchmarks measure and how to read
them is [Benchmarks](bench.md); the figures they produced are in [the results](results/index.md).
"""


def render() -> dict[Path, str]:
    """{page: its text}."""
    os.environ["COLUMNS"] = "100"
    sys.path.insert(0, str(ROOT))
    from engine.cli.main import build_parser
    parser = build_parser()
    parser.prog = "arena"
    main_out: list[str] = [HEADER]
    pages: dict[str, list[str]] = {"": main_out, "cli-service.md": [SERVICE_HEADER], "cli-bench.md": [BENCH_HEADER]}
    _command(parser, [], 2, main_out, pages)

    def fix(lines: list[str]) -> str:
        return "\n".join(lines).rstrip() + "\n"
    service = fix(pages["cli-service.md"]).replace("\n### arena ", "\n## arena ")
    bench = fix(pages["cli-bench.md"]).replace("\n### arena ", "\n## arena ").replace("\n#### arena ", "\n### arena ")
    return {OUT: fix(main_out), BENCH_OUT: bench, SERVICE_OUT: service}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with docs/cli.md instead of writing it")
    args = ap.parse_args(argv)
    pages = render()
    if args.check:
        stale = 0
        for path, text in pages.items():
            old = path.read_text(encoding="utf-8") if path.exists() else ""
            if old != text:
                name = path.relative_to(ROOT).as_posix()
                diff = difflib.unified_diff(old.splitlines(), text.splitlines(), name, "generated", lineterm="", n=1)
                print("\n".join(list(diff)[:60]), file=sys.stderr)
                print(f"{name} is out of date: run `python scripts/gen_cli_docs.py`", file=sys.stderr)
                stale = 1
        return stale
    for path, text in pages.items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
