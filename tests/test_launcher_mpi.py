"""Real mpiexec launches (CPU, gloo): every plan trains the same losses as one process,
and a checkpoint taken on one plan resumes on another (DCP resharding) on track.

Tolerance: float32 with different reduction orders; measured differences are ~1e-6 after
20 Adam steps, the tests allow LOSS_TOL."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.api import run_training
from launcher.launch import ranks_not_done
from launcher.reference import train_reference

MODEL = "tiny-gpt__2L"
BATCH = 8
LOSS_TOL = 1e-4
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def reference():
    return train_reference(MODEL, steps=20, global_batch=BATCH, seed=0)


def close(got, want):
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < LOSS_TOL


def test_checkpoint_on_dp_resumes_on_tp_and_on_pp(tmp_path, reference):
    ck = tmp_path / "ck_dp"
    r = run_training(MODEL, 2, 1, 1, steps=10, global_batch=BATCH, checkpoint_dir=ck, timeout_s=TIMEOUT_S,
                     run_dir=tmp_path / "run_dp")
    assert r.ok, r.output_tail
    assert r.steps == tuple(range(1, 11)) and close(r.losses, reference[:10]), (r.losses, reference[:10])
    assert (ck / "step_00000010" / "meta.json").is_file()
    ck_pp = tmp_path / "ck_pp"
    shutil.copytree(ck, ck_pp)
    # what a crash mid-save leaves behind: a temporary directory and one without meta.json
    for partial in (ck / ".tmp-step_00000015", ck / "step_00000018"):
        partial.mkdir()
        (partial / "__0_0.distcp").write_bytes(b"torn")

    r = run_training(MODEL, 1, 2, 1, steps=20, global_batch=BATCH, checkpoint_dir=ck, timeout_s=TIMEOUT_S,
                     run_dir=tmp_path / "run_tp")
    assert r.ok, r.output_tail
    assert r.start_step == 10 and r.steps == tuple(range(11, 21))
    assert close(r.losses, reference[10:]), (r.losses, reference[10:])
    load = [e for e in r.events if e["event"] == "load"]
    assert load and load[0]["step"] == 10 and load[0]["saved_plan"] == "dp=2,tp=1,pp=1"

    r = run_training(MODEL, 1, 1, 2, steps=20, microbatches=2, global_batch=BATCH, checkpoint_dir=ck_pp,
                     timeout_s=TIMEOUT_S, run_dir=tmp_path / "run_pp")
    assert r.ok, r.output_tail
    assert r.steps == tuple(range(11, 21)) and close(r.losses, reference[10:]), (r.losses, reference[10:])


def test_fresh_tensor_parallel_run_matches(tmp_path, reference):
    r = run_training(MODEL, 1, 2, 1, steps=6, global_batch=BATCH, timeout_s=TIMEOUT_S, run_dir=tmp_path)
    assert r.ok, r.output_tail
    assert close(r.losses, reference[:6]), (r.losses, reference[:6])
    assert len(r.iteration_times_s) == 6 and all(t > 0 for t in r.iteration_times_s)


def test_cli_pipeline_run_prints_steps_and_records_telemetry(tmp_path, reference):
    """`arena train` on pp=2 (GPipe, 4 micro-batches, MPICH hostfile; stage 0 holds only the
    embeddings, stage 1 both decoder layers and the head) with --breakdown: one line per
    step, losses as one process, measured runs in the profile store."""
    store, tel, hosts = tmp_path / "store", tmp_path / "tel.jsonl", tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    env = {**os.environ, "ARENA_PROFILE_DIR": str(store)}
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "train", "--model", MODEL, "--plan", "dp=1,tp=1,pp=2",
         "--microbatches", "4", "--schedule", "gpipe", "--stage-layers", "0,2", "--steps", "5",
         "--global-batch", str(BATCH),
         "--breakdown", "--telemetry", str(tel), "--run-dir", str(tmp_path / "run"),
         "--hostfile", str(hosts)],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [l.split() for l in out.stdout.splitlines() if l.startswith("step ")]
    assert [int(l[1]) for l in lines] == [1, 2, 3, 4, 5]
    assert close([float(l[3]) for l in lines], reference[:5])
    recs = [json.loads(l) for l in tel.read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    stored = [json.loads(l) for l in (store / "measured_runs.jsonl").read_text().splitlines()]
    assert [r["step"] for r in stored] == [2, 3, 4, 5]                # warm-up step 1 not stored
    for r in stored:
        assert (r["pp"], r["microbatches"], r["schedule"], r["gpu_type"]) == (2, 4, "gpipe", "cpu")
        assert len(r["stage_compute_s"]) == 2 and all(c > 0 for c in r["stage_compute_s"])
        for c, m in zip(r["stage_compute_s"], r["stage_comm_s"]):
            assert m >= 0 and (m == 0 or abs(c + m - r["iteration_time_s"]) < 1e-9)


@pytest.mark.slow
def test_four_ranks_fsdp2_with_tensor_and_pipeline(tmp_path, reference):
    """dp=2 x tp=2 (FSDP2 on the data dimension over a TP model), then resumed on
    dp=2 x pp=2 (FSDP2 under the 1F1B schedule)."""
    ck = tmp_path / "ck"
    r = run_training(MODEL, 2, 2, 1, steps=4, global_batch=BATCH, checkpoint_dir=ck, timeout_s=TIMEOUT_S,
                     run_dir=tmp_path / "a")
    assert r.ok, r.output_tail
    assert close(r.losses, reference[:4]), (r.losses, reference[:4])
    r = run_training(MODEL, 2, 1, 2, steps=8, microbatches=2, global_batch=BATCH, checkpoint_dir=ck,
                     timeout_s=TIMEOUT_S, run_dir=tmp_path / "b")
    assert r.ok, r.output_tail
    assert r.steps == (5, 6, 7, 8) and close(r.losses, reference[4:8]), (r.losses, reference[4:8])


def test_llama_grouped_query_tensor_parallel_matches(tmp_path):
    """tiny-llama (RMSNorm, rotary, SwiGLU, 4 query / 2 key-value heads) on tp=2: each
    tensor rank holds 2 query heads sharing 1 key-value head."""
    ref = train_reference("tiny-llama__4L", steps=4, global_batch=BATCH, seed=1)
    r = run_training("tiny-llama__4L", 1, 2, 1, steps=4, global_batch=BATCH, seed=1, timeout_s=TIMEOUT_S,
                     run_dir=tmp_path)
    assert r.ok, r.output_tail
    assert close(r.losses, ref), (r.losses, ref)


def test_moe_trains_on_data_tensor_and_pipeline_splits_and_reshards(tmp_path):
    """tiny-moe (top-2 of 4 experts in every layer): data-parallel steps checkpoint and
    resume with every expert split over two tensor ranks, then over two pipeline stages,
    on the one-process losses."""
    model = "tiny-moe__2L"
    ref = train_reference(model, steps=6, global_batch=BATCH, seed=1)
    ck = tmp_path / "ck"
    for (dp, tp, pp, mb), steps, want in (((2, 1, 1, 1), 2, (1, 2)), ((1, 2, 1, 1), 4, (3, 4)),
                                          ((1, 1, 2, 2), 6, (5, 6))):
        r = run_training(model, dp, tp, pp, steps=steps, microbatches=mb, global_batch=BATCH, seed=1,
                         checkpoint_dir=ck, timeout_s=TIMEOUT_S, run_dir=tmp_path / f"{dp}{tp}{pp}")
        assert r.ok, r.output_tail
        assert r.steps == want and close(r.losses, ref[want[0] - 1:want[-1]]), (dp, tp, pp, r.losses, ref)
        assert ranks_not_done(r.run_dir) == []             # every rank left the training loop cleanly


def test_wide_resnet_trains_on_data_and_pipeline_splits_and_reshards(tmp_path):
    """tiny Wide-ResNet (GroupNorm, so the loss does not depend on the batch split): data
    parallel steps checkpoint and resume on a two-stage 1F1B pipeline, on the one-process
    losses."""
    model = "tiny-wide_resnet__50"
    ref = train_reference(model, steps=4, global_batch=BATCH, seed=1)
    ck = tmp_path / "ck"
    for (dp, tp, pp, mb), steps, want in (((2, 1, 1, 1), 2, (1, 2)), ((1, 1, 2, 2), 4, (3, 4))):
        r = run_training(model, dp, tp, pp, steps=steps, microbatches=mb, global_batch=BATCH, seed=1,
                         checkpoint_dir=ck, timeout_s=TIMEOUT_S, run_dir=tmp_path / f"{dp}{tp}{pp}")
        assert r.ok, r.output_tail
        assert r.steps == want and close(r.losses, ref[want[0] - 1:want[-1]]), (dp, tp, pp, r.losses, ref)
