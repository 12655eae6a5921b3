"""The tutorials run as written: every fenced block of docs/extending.md and
docs/operators.md is executed, in order, in one bash session.

- a ```python title="PATH"``` block is written to PATH (relative to the scratch folder)
  exactly as the page shows it, at the point where it appears;
- a ```bash``` block runs as it is, with `set -euo pipefail`, after the blocks before it
  (so a `cd` or an `export` carries on, as in a reader's terminal);
- the one block not run is the install from a fresh clone (`python3 -m venv ...`): CI runs
  that same install through scripts/test.sh, and the test checks the block is the
  README's command; the venv running the tests stands in for it (its bin/ first on PATH);
- the only change made to a block: the service's port, 8765, becomes a free port, so that
  two tests cannot collide.

The scratch folder has the clone's `instances/` and `examples/` beside it (links), as a
folder in the clone has. A page whose blocks fail (a renamed flag, a changed output
field, a plug-in API that moved) fails here, with the block and its output.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.service.scenario import free_port

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INSTALL = "python3 -m venv"
PAGES = ("extending.md", "operators.md")

pytestmark = pytest.mark.slow


def blocks(page: str) -> list[tuple[str, str, str]]:
    """(language, info after it, body) of every fenced block of docs/PAGE, in order."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(text)]


def script(page: str, scratch: Path, port: int) -> str:
    """The page's blocks as one bash script run in ``scratch``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    out = ["set -euo pipefail", f"cd {scratch}"]
    for i, (lang, info, body) in enumerate(blocks(page), 1):
        where = f"{page}, block {i}"
        if lang == "python":
            m = re.fullmatch(r'title="([^"]+)"', info)
            assert m, f"{where}: a python block needs title=\"PATH\" (the file it is), got {info!r}"
            path = scratch / m.group(1)
            assert "EOF_BLOCK" not in body
            out += [f"echo '--- {where}: {m.group(1)}' >&2", f"mkdir -p {path.parent}",
                    f"cat > {path} <<'EOF_BLOCK'", body.rstrip("\n"), "EOF_BLOCK"]
        elif lang == "bash":
            if body.startswith(INSTALL):
                first = body.splitlines()[0]
                assert first in readme, f"{where}: the install is not the README's: {first!r}"
                continue
            out += [f"echo \"--- {where} (t=$SECONDS s)\" >&2", body.replace("8765", str(port)).rstrip("\n")]
        else:
            raise AssertionError(f"{where}: a {lang!r} block; the tutorials' blocks are python files or bash")
    return "\n".join(out) + "\n"


def run_page(page: str, tmp_path: Path, timeout_s: float) -> str:
    scratch = tmp_path / "clone"
    scratch.mkdir()
    for d in ("instances", "examples"):
        (scratch / d).symlink_to(ROOT / d)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    text = script(page, scratch, free_port())
    proc = subprocess.Popen(["bash", "-c", text], cwd=scratch, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        out = ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # a service the page left running
        except ProcessLookupError:
            pass
        if timed_out:
            out, _ = proc.communicate()              # what the page printed before the timeout
        proc.wait()
    assert not timed_out, f"{page} did not finish within {timeout_s} s; its output so far:\n{out[-6000:]}"
    assert proc.returncode == 0, f"{page} failed (exit {proc.returncode}):\n{out[-6000:]}"
    return out


def test_every_tutorial_block_is_fenced_as_a_file_or_a_command():
    for page in PAGES:
        assert blocks(page), page
        for lang, info, _ in blocks(page):
            assert lang in ("python", "bash"), (page, lang)


def test_extending_runs_as_written(tmp_path):
    out = run_page("extending.md", tmp_path, timeout_s=600)
    lab = tmp_path / "clone" / "lab"
    for run in ("pai-fcfs", "pai-sjf", "demo-compact", "compare"):
        assert (lab / "runs" / run).is_dir(), run
    assert re.search(r"^sjf +[0-9.]+x \[", out, re.M), out[-3000:]           # paired.py read the comparison
    assert re.search(r"^arena-compact +[0-9.]+x \[", out, re.M), out[-3000:]
    assert re.search(r"first +finished", out), out[-3000:]                   # the live job ran under sjf


def test_operators_runs_as_written(tmp_path):
    out = run_page("operators.md", tmp_path, timeout_s=600)
    ops = tmp_path / "clone" / "ops"
    assert "already submitted as job 1" in out, out[-3000:]                 # the key made it idempotent
    assert "drained: maintenance" in out, out[-3000:]
    assert (ops / "backup.db").is_file() and (ops / "state" / "restored.db").is_file()
    # the kill -9 cost: nothing (the launch taken over, not relaunched)
    assert re.search(r"job 1: launch \d+ \(run folder launch_\d+\) still runs: taken over at step \d+, nothing "
                     r"relaunched", out), out[-3000:]
    assert "scheduler stopped on an error" not in (ops / "serve.log").read_text()     # (the restore's recovery)
    assert re.search(r"^ +1 nightly +finished", out, re.M), out[-3000:]
