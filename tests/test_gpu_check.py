"""``bench/gpu_check.py`` where no GPU is: it says so and exits 0; its table and exit code.
(The checks themselves need CUDA: they run on a machine with a GPU, docs/results.)"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check            # (its dataclass looks its module up)
_spec.loader.exec_module(gpu_check)
Row, exit_code, table = gpu_check.Row, gpu_check.exit_code, gpu_check.table


def test_without_cuda_it_says_so_and_exits_0():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpu_check: no CUDA device") and "nothing to check" in out.stdout


def test_one_failed_check_fails_the_run_and_the_table_says_which():
    rows = [Row("layers", "tiny-gpt__4L", "1.0 ms", "finite", True),
            Row("nccl", "all-reduce over 1 GPU(s)", "sums []", "1.0 on every GPU", False)]
    text = table(rows)
    assert text.splitlines()[0].split() == ["check", "what", "measured", "expected", "verdict"]
    assert text.splitlines()[2].startswith("nccl") and text.splitlines()[2].endswith("FAILED")
    assert exit_code(rows) == 1 and exit_code(rows[:1]) == 0 and exit_code([]) == 1
