"""bench/sia_fidelity.py: the Sia simulator's logs read as the artifact's
``utils/print_run_stats.py`` reads them (on a log written here by hand, in its format),
and a table rebuilt from an earlier ``--out`` (``--ours-from``) equals the first one.
The project's own fixture only (tests/data/sia_artifact); the artifact is never read."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "sia_artifact"


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("sia_fidelity", ROOT / "bench" / "sia_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job(name, submitted, done, alloc):
    return {"name": name, "epoch": 0, "progress": 0.0, "num_restarts": 0, "cluster": "aws", "allocation": alloc,
            "placement": [], "batch_size": 128, "accum_steps": 0, "stages": 1, "submission_time": submitted,
            "start_time": None, "completion_time": done, "n_avg": 1.0, "category": None}


def test_reference_log_metrics(fidelity, tmp_path):
    # rounds at 0, 60, 120, 180: job a holds 2 GPUs over [0, 120) and ends at 100; job b
    # arrives at 30, holds 4 GPUs over [60, 180) and ends at 170; the last logged round's
    # GPUs count for one more round (the artifact's rule).
    rounds = [
        (0, [_job("a", 0, None, ["aws", [0, 0]])]),
        (60, [_job("a", 0, None, ["aws", [0, 0]]), _job("b", 30, None, ["aws", [1, 1, 1, 1]])]),
        (120, [_job("a", 0, 100, []), _job("b", 30, None, ["aws", [1, 1, 1, 1]])]),
        (180, [_job("a", 0, 100, []), _job("b", 30, 170, [])]),
    ]
    log = tmp_path / "workload-1.log"
    log.write_text("".join(json.dumps({"timestamp": t, "num_nodes": {"aws": 2}, "submitted_jobs": jobs}) + "\n"
                           for t, jobs in rounds))
    m = fidelity.read_reference(log)
    assert m["jobs"] == 2 and m["unfinished"] == 0 and m["round_s"] == 60
    assert m["avg_jct_h"] == pytest.approx((100 + 140) / 2 / 3600)
    assert m["p99_jct_h"] == pytest.approx(140 / 3600)
    assert m["makespan_h"] == pytest.approx(170 / 3600)
    assert m["gpu_h_per_job"] == pytest.approx((2 * 120 + 4 * 120) / 2 / 3600)


def test_ours_from_rebuilds_the_same_table(fidelity, tmp_path, capsys):
    out = tmp_path / "mini.json"
    argv = ["--sia-artifact", str(FIXTURE), "--trace", "mini", "--workloads", "2", "--policy", "gavel"]
    assert fidelity.main(argv + ["--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert fidelity.main(["--sia-artifact", str(FIXTURE), "--trace", "mini", "--ours-from", str(out)]) == 0
    assert capsys.readouterr().out == first
    assert fidelity.main(["--sia-artifact", str(FIXTURE), "--trace", "mini", "--ours-from", str(out),
                          "--ours-from", str(out)]) == 2
    assert "mini/workload-2 gavel is in two of the --ours-from files" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert fidelity.main(["--sia-artifact", str(FIXTURE), "--trace", "mini", "--ours-from", str(bad)]) == 2
    assert "field '--ours-from'" in capsys.readouterr().err
