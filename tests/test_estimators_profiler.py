"""Real torch profiling at tiny sizes, into a temporary store, with reuse."""
import pytest

from estimators.analytic import AnalyticModel
from estimators.profile_store import ProfileStore
from estimators.profiler import ProfilerConfig, profile_collectives, profile_layers, reduced_arch
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.models import get_model


def test_profile_tiny_model_and_reuse(tmp_path):
    store = ProfileStore(tmp_path)
    arch = get_model("tiny-gpt__2L")
    cfg = ProfilerConfig(micro_batches=(1,), tp_degrees=(1, 2), repeats=1)
    r = profile_layers(arch, store=store, cfg=cfg)
    kinds = {(x.kind, x.tp) for x in r["records"]}
    assert {("decoder", 1), ("decoder", 2), ("head", 1), ("embedding", 1)} <= kinds
    assert all(x.fwd_s > 0 and x.bwd_s > 0 and x.scale == 1.0 for x in r["records"])
    assert r["device_seconds"] > 0
    # warm times and the working set: parameters as the layer's module holds them, saved activations
    from estimators.profiler import build_layer
    assert all(x.warm_fwd_s > 0 and x.warm_bwd_s > 0 and x.saved_bytes > 0 and x.flush_bytes == 8 * 2**20
               for x in r["records"])
    dec = next(x for x in r["records"] if x.kind == "decoder" and x.tp == 1)
    mod, _ = build_layer(arch, next(i for i, s in enumerate(arch.layers()) if s.kind == "decoder"), 1, "float32")
    assert dec.param_bytes == sum(p.numel() * 4 for p in mod.parameters())
    assert store.get_layer(r["device"], "float32", "decoder", dec.signature, 1, 1).saved_bytes == dec.saved_bytes
    again = profile_layers(arch, store=store, cfg=cfg)
    assert again["records"] == [] or all(x.kind == "embedding" for x in again["records"])
    assert again["reused"] >= 4
    # the analytic model now times this model's decoder layers from the store on "cpu"
    m = AnalyticModel(profile_store=store, profile_device=r["device"])
    e = m.estimate(Job("t", "tiny-gpt__2L", 8, 1, 0.0), Grid(Shape("cpu", 1, 1), 1))
    assert e.feasible and "profiled" in e.source


def test_reduced_shapes_keep_layer_kinds():
    cfg = ProfilerConfig()
    assert ProfilerConfig(flush_cache_mib=0).flush_cache_mib == 0       # 0 turns the cache flush off
    with pytest.raises(InputError):
        ProfilerConfig(flush_cache_mib=-1)
    for name in ("gpt__1.3B", "moe__690M", "wide_resnet__500M", "llama__7B"):
        arch = get_model(name)
        small = reduced_arch(arch, cfg, 2)
        assert [l.kind for l in small.layers()] == [l.kind for l in arch.layers()]
        assert small.fwd_flops_per_sample < arch.fwd_flops_per_sample


def test_profile_collectives_two_ranks(tmp_path):
    store = ProfileStore(tmp_path)
    r = profile_collectives(group_sizes=(2,), sizes=(4096, 65536), ops=("all_reduce", "send_recv"), repeats=2,
                            store=store, timeout_s=90)
    assert r["backend"] in ("gloo", "nccl")
    assert {x.op for x in r["records"]} == {"all_reduce", "send_recv"}
    assert all(x.time_s > 0 for x in r["records"]) and r["device_seconds"] > 0
    assert len(store.collective_records(r["device"])) == 4


def _fails_on_rank_one(rank: int, init_method: str, queue):
    queue.put(rank)
    if rank == 1:
        raise ValueError("rank one fails")


def test_a_failing_rank_still_fails_run_spawned():
    """Ranks leave through ``os._exit(0)`` once their function returned; a rank whose
    function raised must still fail the run, and the others' results arrive."""
    import torch.multiprocessing as mp

    from estimators.profiler import run_spawned
    q = mp.get_context("spawn").SimpleQueue()
    with pytest.raises(mp.ProcessRaisedException, match="rank one fails"):
        run_spawned(_fails_on_rank_one, (q,), 2, 60.0, "failing check")
    assert sorted([q.get(), q.get()]) == [0, 1]


def test_measured_run_side_of_the_profiling_cost(tmp_path, monkeypatch):
    import tempfile

    from estimators.profiler import RunCostConfig, measure_startup_s, run_grids_measured, startup_model
    from instances.cluster import ClusterSpec, NodeGroup
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))       # where run folders would be left
    assert startup_model("tiny-gpt__2L") == "tiny-gpt__2L"
    assert not list(tmp_path.iterdir())                          # checking the plan leaves no run folder
    assert startup_model("moe__690M") == "tiny-gpt__2L"          # too large to launch for a timing
    assert startup_model("tiny-moe__2L") == "tiny-moe__2L"      # the launcher trains MoE
    assert startup_model("gpt__1.3B") == "tiny-gpt__2L"          # too large to launch for a timing
    startup = measure_startup_s("tiny-gpt__2L", 4)
    assert startup > 0
    perf = AnalyticModel()
    out = run_grids_measured("tiny-gpt__2L", 4, perf, ClusterSpec((NodeGroup("cpu", 1, 2),)), max_ranks=1,
                             cfg=RunCostConfig(1, 2, startup))
    assert out["grids"] == 1 and len(out["runs"]) == 1 and out["runs"][0]["ok"]
    run = out["runs"][0]
    assert run["device_seconds"] == run["wall_s"] > startup / 2     # one device: wall time x 1
    assert out["estimated_device_seconds_same_grids"] > startup


def test_every_wide_resnet_layer_builds_and_runs_with_the_catalog_shapes():
    """The profiler's Wide-ResNet modules follow the catalog's block layout (a bottleneck
    with the catalog's parameter count at tp = 1) and run forward and backward on every
    tensor shard width."""
    from estimators.profiler import build_layer
    arch = reduced_arch(get_model("wide_resnet__500M"), ProfilerConfig(), 2)
    for i, spec in enumerate(arch.layers()):
        for tp in (1, 2):
            mod, make = build_layer(arch, i, tp, "float32")
            mod(make(2)).float().sum().backward()
            if tp == 1 and spec.kind in ("bottleneck", "conv_stem", "classifier"):
                assert sum(p.numel() for p in mod.parameters()) == spec.params, (i, spec.kind)


def test_profiled_llama_layers_are_the_launchers_modules():
    """The profiler times the launcher's own Llama block (RMSNorm, rotary positions, SwiGLU,
    grouped-query attention), with the parameter count of the layer the launcher trains;
    a tensor shard holds 1/tp of the sharded projections, the norms whole."""
    import torch
    from torch import nn

    from estimators.profiler import build_layer
    from launcher.model import Block, build_model
    trained = build_model("tiny-llama__4L", 0)
    arch = trained.arch
    i = next(i for i, spec in enumerate(arch.layers()) if spec.kind == "decoder")
    layer, make = build_layer(arch, i, 1, "float32")
    assert type(layer) is Block and layer.attn.rope
    assert isinstance(layer.ln1, nn.RMSNorm) and not any(isinstance(m, nn.LayerNorm) for m in layer.modules())
    n_trained = sum(p.numel() for p in trained.layers["0"].parameters())
    assert sum(p.numel() for p in layer.parameters()) == n_trained == arch.layers()[i].params
    shard, _ = build_layer(arch, i, 2, "float32")
    norms = sum(p.numel() for n, p in shard.named_parameters() if n.startswith(("ln1", "ln2")))
    assert sum(p.numel() for p in shard.parameters()) == (n_trained - norms) / 2 + norms
    y = shard(make(2))
    assert y.shape == (2, arch.seq_len, arch.hidden_size) and torch.isfinite(y).all()
    # the first stage has no learned positions (rotary instead); the head ends in the loss
    emb, _ = build_layer(arch, 0, 1, "float32")
    assert emb.pos_embeddings is None and emb.norm is None and emb.output is None
    head, hmake = build_layer(arch, len(arch.layers()) - 1, 1, "float32")
    assert isinstance(head.stage.norm, nn.RMSNorm) and head(hmake(2)).dim() == 0
