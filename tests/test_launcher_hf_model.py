"""A user's own model (a Hugging Face-style config.json, not in the catalog) trained for
real by `arena train` on 2 ranks: the same losses as one process (tolerance as in
test_launcher_mpi.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.reference import train_reference

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-llama-config.json"
LOSS_TOL = 1e-4
STEPS, BATCH = 5, 4


@pytest.mark.slow               # ~30 s on the shared 2-core machine
def test_arena_train_of_a_config_json_llama_on_two_tensor_ranks_matches_one_process(tmp_path):
    """tp=2 splits the file's 6 query / 2 key-value heads: 3 / 1 per rank."""
    env = {**os.environ, "ARENA_PROFILE_DIR": str(tmp_path / "store")}
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "train", "--model", str(CONFIG), "--plan", "dp=1,tp=2,pp=1",
         "--steps", str(STEPS), "--global-batch", str(BATCH), "--no-record", "--run-dir", str(tmp_path / "run"),
         "--timeout", "180"],
        capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", out.stdout, re.M)]
    want = train_reference(str(CONFIG), steps=STEPS, global_batch=BATCH, seed=0)
    assert len(losses) == STEPS and max(abs(a - b) for a, b in zip(losses, want)) < LOSS_TOL, (losses, want)
    assert losses[-1] < losses[0]
