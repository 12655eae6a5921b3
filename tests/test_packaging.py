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


def test_the_scheduling_core_and_the_service_import_without_torch():
    # README: the scheduling core imports without torch; `arena serve` too (its launched
    # ranks import it), so the service starts in about a second, not three
    code = ("import sys\n"
            "import engine.cli.main, engine.sim.simulator, engine.decide.policies.milp\n"
            "import engine.decide.incremental.search\n"
            "import engine.service.daemon, engine.service.api, launcher.mpi_executor, launcher.validate\n"
            "import estimators.analytic, estimators.learned, estimators.perf, estimators.grids\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
