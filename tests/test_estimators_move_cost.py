"""Move-cost model: fit from move records, prediction, held-out evaluation, the published
defaults and the calibration measured here."""
import pytest

from estimators.move_cost import MoveCostParams, fit, held_out, load_measured
from instances.errors import InputError

TRUE = MoveCostParams(drain_s=0.3, startup_s=7.0, regroup_s=0.1, warmup_s=0.05, d2d_bytes_per_s=2e8,
                      storage_bytes_per_s=5e7, stop_s=0.25, d2d_fixed_s=0.05, storage_fixed_s=0.2)


def record(path, kind, bytes_moved, world_old=2, world_new=2, rep=0, model="m", noise=0.0, params=TRUE):
    p = params.predict(path="d2d" if path == "d2d" else "storage", bytes_moved=bytes_moved,
                       new_processes=path != "d2d" or world_new > world_old)
    return {"model": model, "rep": rep, "path": path, "kind": kind, "world_old": world_old,
            "world_new": world_new, "bytes_moved": bytes_moved, "drain_stop_s": p["drain_stop_s"] + noise,
            "state_s": p["state_s"] + noise, "startup_s": p["startup_s"] + noise,
            "warmup_s": p["warmup_s"], "first_step_s": 0.1 + p["warmup_s"], "other_s": 0.0,
            "total_s": p["downtime_s"] + 0.1 + 3 * noise}


def synthetic(reps=2):
    out = []
    for rep in range(reps):
        noise = 0.01 * rep
        for path in ("d2d", "storage"):
            out += [record(path, "dp->pp", 0 if path == "d2d" else 2e6, rep=rep, noise=noise),
                    record(path, "pp->dp", 1.6e6 if path == "d2d" else 3e6, rep=rep, noise=noise),
                    record(path, "grow x2", 8e5 if path == "d2d" else 2e6, 2, 4, rep=rep, noise=noise),
                    record(path, "shrink /2", 8e5 if path == "d2d" else 2e6, 4, 2, rep=rep, noise=noise)]
    return out


def test_fit_recovers_the_parameters_of_noise_free_records():
    got = fit(synthetic(reps=1))
    for name in ("drain_s", "stop_s", "startup_s", "regroup_s", "warmup_s", "d2d_fixed_s", "storage_fixed_s"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-9), name
    assert got.d2d_bytes_per_s == pytest.approx(TRUE.d2d_bytes_per_s, rel=1e-6)
    assert got.storage_bytes_per_s == pytest.approx(TRUE.storage_bytes_per_s, rel=1e-6)


def test_held_out_errors_per_kind_on_moves_not_fitted():
    res = held_out(synthetic(reps=2))
    assert res["fit_records"] == 8 and res["test_records"] == 8
    assert set(res["per_kind"]) == {f"{p} {k}" for p in ("d2d", "storage")
                                    for k in ("dp->pp", "pp->dp", "grow x2", "shrink /2")}
    for k, v in res["per_kind"].items():
        # fitted on noise-free repetition 0 (= TRUE); repetition 1 adds 0.01 s to three parts
        assert v["n"] == 1 and v["mean_abs_error_s"] == pytest.approx(0.03, abs=1e-9), (k, v)
        assert v["mean_rel_error"] == pytest.approx(0.03 / v["mean_measured_s"], rel=1e-9)


def test_bytes_that_do_not_explain_time_keep_the_prior_bandwidth():
    recs = [dict(r, state_s=0.3) for r in synthetic(reps=1)]        # state time flat in bytes
    got = fit(recs, prior=TRUE)
    assert got.d2d_bytes_per_s == TRUE.d2d_bytes_per_s and got.storage_bytes_per_s == TRUE.storage_bytes_per_s


def test_move_seconds_prices_layout_changes():
    p = MoveCostParams.gpu_cluster_defaults()
    S = 10e9                                                        # 10 GB of training state
    # dp=2 -> tp=2: replicas already hold their shards: no bytes; no new process
    assert p.move_seconds(S, (2, 1, 1), (1, 2, 1)) == pytest.approx(p.drain_s + p.regroup_s + p.warmup_s)
    assert p.predict(path="d2d", bytes_moved=0, new_processes=False)["downtime_s"] == \
        p.move_seconds(S, (2, 1, 1), (1, 2, 1))
    # pp=2 -> dp=2 moves one full copy (10 GB over 25 GB/s)
    assert p.move_seconds(S, (1, 1, 2), (2, 1, 1)) == pytest.approx(p.drain_s + 0.4 + p.regroup_s + p.warmup_s)
    # storage writes one copy and reads one per DDP replica, at 100 MB/s: 300 s
    assert p.move_seconds(S, (1, 1, 2), (2, 1, 1), path="storage") == pytest.approx(
        p.drain_s + p.stop_s + 300 + p.startup_s + p.warmup_s)
    assert p.move_seconds(S, (2, 1, 1), (4, 1, 1)) > p.startup_s                # growing starts processes


def test_bad_input_is_refused():
    with pytest.raises(InputError, match="d2d_bytes_per_s"):
        MoveCostParams(1, 1, 1, 1, 0, 1)
    with pytest.raises(InputError, match="records"):
        fit([{"total_s": 1.0, "first_step_s": 0.1, "warmup_s": None, "startup_s": 1.0}])
    with pytest.raises(InputError, match="unknown keys"):
        MoveCostParams.from_json({**TRUE.to_json(), "speed": 1})


def test_the_calibration_measured_here_loads_with_provenance():
    d = load_measured()
    assert {"date", "machine", "command"} <= set(d["provenance"])
    p = MoveCostParams.measured_here()
    assert p.startup_s > p.regroup_s                 # relaunching processes costs more than regrouping
