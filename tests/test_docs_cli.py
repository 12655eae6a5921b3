"""docs/cli.md, docs/cli-bench.md and docs/cli-service.md are what scripts/gen_cli_docs.py
generates from the `arena` command's argparse parsers now: a flag added, renamed or
re-documented without regenerating the pages fails here.

The check runs in a fresh interpreter (the pages are regenerated in memory and compared,
nothing is written), so a plug-in another test registered in this process, or the
terminal's width, cannot change what the parsers say.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_command_line_reference_is_up_to_date():
    env = {k: v for k, v in os.environ.items() if k != "ARENA_PLUGINS"}
    out = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]


def test_every_command_has_a_section():
    # the generator walks every subcommand: each one `arena --help` lists has its heading
    sys.path.insert(0, str(ROOT))
    from engine.cli.main import build_parser
    pages = ("cli.md", "cli-bench.md", "cli-service.md")
    text = "".join((ROOT / "docs" / p).read_text(encoding="utf-8") for p in pages)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    for name in sub.choices:
        assert f"# arena {name}\n" in text, name
