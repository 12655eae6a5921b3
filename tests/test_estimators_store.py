"""Profile store: round trips, versioning, measured runs."""
import json

import pytest

from estimators.config import EfficiencyConfig
from estimators.profile_store import SCHEMA_VERSION, CollectiveProfile, LayerProfile, ProfileStore, fit_collectives
from instances.errors import InputError
from instances.models import get_model


def _layer(sig=(64, 4, 32, 256, "gelu", "float32"), mb=1, tp=1, rate=1e10):
    return LayerProfile("cpu", "float32", "decoder", sig, tp, mb, 1e-3, 2e-3, rate, rate / 2, "full", 1e-3, 2e-3,
                        1.0, 3, 3e-3)


def test_layer_round_trip_and_reuse_key(tmp_path):
    st = ProfileStore(tmp_path)
    rec = _layer()
    st.put_layers([rec, _layer(mb=2)])
    assert st.get_layer("cpu", "float32", "decoder", rec.signature, 1, 1) == rec
    assert st.get_layer("cpu", "float32", "decoder", rec.signature, 2, 1) is None
    assert len(st.layer_records("cpu")) == 2
    # a second put of the same key replaces, not duplicates
    st.put_layers([_layer(rate=5e9)])
    assert len(st.layer_records()) == 2
    assert st.get_layer("cpu", "float32", "decoder", rec.signature, 1, 1).fwd_flops_per_s == 5e9
    assert st.devices() == ["cpu"]


def test_schema_version_is_checked(tmp_path):
    st = ProfileStore(tmp_path)
    st.put_layers([_layer()])
    path = tmp_path / "layers" / "cpu" / "float32.json"
    doc = json.loads(path.read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        st.layer_records()
    assert "float32.json" in str(e.value) and "schema_version" in str(e.value)


def test_measured_runs_written_plain_and_validated_on_read(tmp_path):
    """The launcher's telemetry appends plain records; the store validates them when it
    reads, naming the line and field of a bad one."""
    import json

    from launcher.telemetry import append_measured_runs
    st = ProfileStore(tmp_path)
    run = {"kind": "measured_run", "model": "tiny-gpt__2L", "device": "cpu", "gpu_type": "cpu", "dtype": "float32",
           "dp": 2, "tp": 1, "pp": 1, "microbatches": 1, "schedule": "1f1b", "global_batch": 8, "num_nodes": 1,
           "gpus_per_node": 2, "iteration_time_s": 0.1, "step": 3, "timestamp": 1.0}
    append_measured_runs(tmp_path, [run, dict(run, step=4, stage_compute_s=[0.05], stage_comm_s=[0.01])])
    got = st.read_measured_runs()
    assert [r["step"] for r in got] == [3, 4] and got[0]["kind"] == "measured_run"
    for bad, field in (({k: v for k, v in run.items() if k != "dp"}, "dp"),
                       (dict(run, iteration_time_s=-1), "iteration_time_s"),
                       (dict(run, tp=0), "tp"),
                       (dict(run, kind="other"), "kind"),
                       (dict(run, stage_compute_s=[0.1, 0.2], stage_comm_s=[0.0, 0.0]), "stage_compute_s")):
        st.runs_path.write_text(json.dumps(run) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(InputError) as e:
            st.read_measured_runs()
        assert e.value.line == 2 and e.value.field == field, (field, str(e.value))
    st.runs_path.write_text(json.dumps(run) + "\n{not json\n")
    with pytest.raises(InputError) as e:
        st.read_measured_runs()
    assert "line 2" in str(e.value)


def test_collectives_fit_and_profiled_timers(tmp_path):
    st = ProfileStore(tmp_path)
    lat, bw = 50e-6, 2e9
    recs = [CollectiveProfile("cpu", "gloo", "all_reduce", 2, n, 2 * lat + n / bw, 3, 0.0) for n in (4096, 1 << 20)]
    recs += [CollectiveProfile("cpu", "gloo", "send_recv", 2, n, lat + n / bw, 3, 0.0) for n in (4096, 1 << 20)]
    st.put_collectives(recs)
    assert len(st.collective_records("cpu")) == 4
    fit = fit_collectives(st.collective_records("cpu"))
    assert fit["intra"][0] == pytest.approx(lat, rel=1e-6) and fit["intra"][1] == pytest.approx(bw, rel=1e-6)
    arch = get_model("tiny-gpt__2L")
    dec = next(l for l in arch.layers() if l.kind == "decoder")
    st.put_layers([_layer(sig=dec.signature, rate=1e9)])
    timer, comm = st.timers(EfficiencyConfig())
    from estimators.layers import layer_costs
    from instances.gpus import get_gpu
    c = next(c for c in layer_costs(arch) if c.kind == "decoder")
    assert timer.profiled(c, get_gpu("cpu"), "float32")
    assert not timer.profiled(c, get_gpu("a100"), "float32")
    f, _ = timer.times(c, get_gpu("cpu"), "float32")
    assert f == pytest.approx(c.fwd_flops / 1e9 + EfficiencyConfig().layer_overhead_s)
    assert comm.bandwidth(get_gpu("cpu"), "intra") == pytest.approx(bw, rel=1e-6)


def test_collective_tables_interpolate_per_operation():
    from estimators.profile_store import collective_tables
    from estimators.timing import ProfiledComm
    from instances.gpus import get_gpu
    recs = [CollectiveProfile("cpu", "gloo", "all_reduce", 2, n, t, 3, 0.0)
            for n, t in ((4096, 7e-4), (65536, 4e-4), (1 << 20, 1e-3), (1 << 22, 5e-3))]
    recs += [CollectiveProfile("cpu", "gloo", "send_recv", 2, n, t, 3, 0.0) for n, t in ((4096, 1e-4), (1 << 22, 1e-3))]
    tables = collective_tables(recs)
    assert [t for _, t in tables[("all_reduce", 2)]] == [7e-4, 7e-4, 1e-3, 5e-3]   # never faster when larger
    comm = ProfiledComm(EfficiencyConfig(), device="cpu", fit=fit_collectives(recs), tables=tables)
    cpu, n1, n4 = get_gpu("cpu"), 1 << 20, 1 << 22
    assert comm.allreduce_s(n1, 2, cpu, "intra") == pytest.approx(1e-3)
    assert comm.allreduce_s((n1 + n4) / 2, 2, cpu, "intra") == pytest.approx(3e-3)      # linear between points
    assert comm.allreduce_s(2 * n4, 2, cpu, "intra") == pytest.approx(1e-2)           # proportional above
    assert comm.allreduce_s(100, 2, cpu, "intra") == pytest.approx(7e-4)              # the smallest's time below
    assert comm.p2p_s(n4, cpu, "intra") == pytest.approx(1e-3)                        # its own table, not the fit
    # not measured: another group size, another link, another device -> the latency + bandwidth fit
    assert comm.allreduce_s(n1, 4, cpu, "intra") == pytest.approx(
        super(ProfiledComm, comm).allreduce_s(n1, 4, cpu, "intra"))
    assert comm.allreduce_s(n1, 2, cpu, "inter") == pytest.approx(
        super(ProfiledComm, comm).allreduce_s(n1, 2, cpu, "inter"))
    a100 = get_gpu("a100")
    assert comm.allreduce_s(n1, 2, a100, "intra") == pytest.approx(
        super(ProfiledComm, comm).allreduce_s(n1, 2, a100, "intra"))
    assert comm.allgather_s(n1, 2, cpu, "intra") == pytest.approx(
        super(ProfiledComm, comm).allgather_s(n1, 2, cpu, "intra"))                   # no all-gather records
    assert comm.allreduce_s(n1, 1, cpu, "intra") == 0.0
