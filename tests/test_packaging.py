"""Installing prints no setuptools deprecation warning (issue 13: three about
``project.license``): the metadata is built as ``pip install -e .`` builds it, without
installing anything."""
import subprocess
import sys
from pathlib import Path

import pytest


def test_metadata_builds_without_deprecation_warnings():
    pytest.importorskip("setuptools")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--no-deps",
                          "--no-index", "-e", "."], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent.parent)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert "Would install arena-sched" in text
    assert "deprecat" not in text.lower(), text[-2000:]
