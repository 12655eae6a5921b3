"""Launcher pieces that need no MPI launch: plans, validation, data, model splitting,
checkpoint directory handling, telemetry records, CLI refusal of bad plans."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instances.errors import InputError
from launcher.config import ParallelPlan, TrainConfig, decoder_stage_layers
from launcher.pipeline import stage_ranges
from launcher.validate import estimate_memory, validate

MODEL = "tiny-gpt__2L"


def cfg(dp=1, tp=1, pp=1, **kw):
    plan_kw = {k: kw.pop(k) for k in ("microbatches", "schedule", "stage_layers") if k in kw}
    return TrainConfig(model=kw.pop("model", MODEL), plan=ParallelPlan(dp=dp, tp=tp, pp=pp, **plan_kw),
                       steps=kw.pop("steps", 4), run_dir="/tmp/unused", **kw)


def test_plan_parse_and_errors():
    p = ParallelPlan.parse("dp=2, tp=1,pp=2", microbatches=4)
    assert (p.dp, p.tp, p.pp, p.microbatches, p.world_size) == (2, 1, 2, 4, 4)
    assert ParallelPlan.parse("tp=2").world_size == 2
    for bad in ("dp=2,dp=2", "xp=2", "dp=two", "", "dp=0"):
        with pytest.raises(InputError):
            ParallelPlan.parse(bad)
    with pytest.raises(InputError, match="schedule"):
        ParallelPlan(schedule="zigzag")


def test_config_json_roundtrip_and_estimator_stage_layers():
    c = cfg(dp=1, pp=2, microbatches=2, stage_layers=(2, 2), global_batch=8)   # layers() counting
    assert c.plan.stage_layers == (1, 1)                                       # decoder counting
    assert TrainConfig.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert decoder_stage_layers(MODEL, (1, 1)) == (1, 1)
    assert decoder_stage_layers(MODEL, (1, 3)) == (0, 2)          # stage 0: embeddings only
    with pytest.raises(InputError, match="nothing to run"):
        decoder_stage_layers("tiny-gpt__4L", (2, 0, 4))          # middle stage empty
    with pytest.raises(InputError, match="stage_layers"):
        decoder_stage_layers(MODEL, (3, 3))
    with pytest.raises(InputError, match="unknown keys"):
        TrainConfig.from_json({**c.to_json(), "bogus": 1})


@pytest.mark.parametrize("kwargs,ranks,field,match", [
    (dict(dp=2), 4, "plan", "needs dp\\*tp\\*pp = 2 ranks but 4"),
    (dict(tp=3), None, "plan.tp", "does not divide"),
    (dict(pp=3, microbatches=3), None, "plan.pp", "exceeds"),
    (dict(dp=2, global_batch=3), None, "global_batch", "not divisible"),
    (dict(pp=2, microbatches=1), None, "microbatches", "1F1B"),
    (dict(model="gpt__6.7B", global_batch=8), None, "plan", "does not fit in memory on cpu"),
    (dict(model="tiny-wide_resnet__50", tp=2), None, "plan.tp", "data and pipeline ranks only"),
    (dict(model="tiny-llama__4L", tp=4), None, "plan.tp", "num_kv_heads=2"),
])
def test_bad_plans_are_refused_before_launch(kwargs, ranks, field, match):
    with pytest.raises(InputError, match=match) as e:
        validate(cfg(**kwargs), ranks=ranks)
    assert e.value.field == field


def test_memory_estimate_scales_with_sharding():
    one = estimate_memory(cfg(model="gpt__1.3B", global_batch=8), "a100-80gb")
    tp4 = estimate_memory(cfg(model="gpt__1.3B", tp=4, global_batch=8), "a100-80gb")
    pp4 = estimate_memory(cfg(model="gpt__1.3B", pp=4, microbatches=4, global_batch=8), "a100-80gb")
    assert tp4.per_rank_bytes < one.per_rank_bytes and pp4.per_rank_bytes < one.per_rank_bytes
    assert validate(cfg(model="gpt__1.3B", tp=4, global_batch=8), device_type="a100-80gb").fits


def test_synthetic_data_is_a_function_of_seed_and_step():
    import torch

    from launcher.data import SyntheticImages, SyntheticTokens, dp_shard

    src = SyntheticTokens(256, 32, seed=3)
    (x, y), (x2, y2) = src.global_batch(5, 8), src.global_batch(5, 8)
    assert x.shape == y.shape == (8, 32) and bool((x == x2).all()) and bool((y == y2).all())
    assert bool((x[:, 1:] == y[:, :-1]).all())                    # targets: the next tokens
    assert not bool((x == src.global_batch(6, 8)[0]).all())
    assert not bool((x == SyntheticTokens(256, 32, seed=4).global_batch(5, 8)[0]).all())
    shards = [dp_shard((x, y), 4, r) for r in range(4)]
    assert bool((torch.cat([s[0] for s in shards]) == x).all()) and bool((torch.cat([s[1] for s in shards]) == y).all())
    img = SyntheticImages(10, 16, seed=3)
    (a, la), (b, lb) = img.global_batch(2, 6), img.global_batch(2, 6)
    assert a.shape == (6, 3, 16, 16) and la.shape == (6,) and bool((a == b).all()) and bool((la == lb).all())
    assert not bool((a == img.global_batch(3, 6)[0]).all())
    # same label, same template: images of one class are closer to each other than to another's
    big, lab = SyntheticImages(2, 8, seed=0, noise=0.1).global_batch(0, 64)
    c0, c1 = big[lab == 0], big[lab == 1]
    assert (c0[0] - c0[1]).norm() < (c0[0] - c1[0]).norm()


def test_text_file_data(tmp_path):
    from launcher.data import TextFileTokens

    f = tmp_path / "corpus.txt"
    f.write_text("hello arena " * 50)
    x, y = TextFileTokens(str(f), 256, 16, seed=0).global_batch(0, 4)
    assert x.shape == y.shape == (4, 16) and int(x.max()) < 256
    with pytest.raises(InputError, match="not found"):
        TextFileTokens(str(tmp_path / "missing.txt"), 256, 16, seed=0)


def test_pipeline_stages_compose_to_the_full_model_with_global_names():
    import torch

    from launcher.model import build_model
    from launcher.parallelize import tp_plan
    from launcher.pipeline import split_stage

    assert stage_ranges(5, 2) == [(0, 3), (3, 5)] and stage_ranges(4, 2, (1, 3)) == [(0, 1), (1, 4)]
    model = "tiny-gpt__4L"
    full = build_model(model, seed=7)
    stages = [split_stage(build_model(model, seed=7), i, 3) for i in range(3)]
    names = set()
    for s in stages:
        names |= {n for n, _ in s.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}       # same FQNs, nothing lost
    assert list(stages[1].layers.keys()) == ["2"]
    x = torch.randint(0, 512, (2, 64))
    h = x
    for s in stages:
        h = s(h)
    assert torch.allclose(h, full(x), atol=1e-6)
    from instances.models import get_model
    for name in ("tiny-gpt__4L", "tiny-llama__4L", "tiny-moe__2L"):
        m = build_model(name, seed=0)
        for sub in tp_plan(m.arch):                                # the TP plan names real linears
            assert isinstance(m.layers["0"].get_submodule(sub), torch.nn.Linear)
        a = get_model(name)
        untied = a.vocab_size * a.hidden_size if a.base_family != "llama" else 0   # GPT/MoE head untied (model.py)
        assert sum(p.numel() for p in m.parameters()) == a.param_count + untied, name
    moe = get_model("tiny-moe__2L")
    assert len(tp_plan(moe)) == 4 + 2 * moe.num_experts


def test_moe_layer_routes_each_token_to_its_top_k_experts():
    """The MoE output is, token by token, the renormalised top-k mixture of the experts'
    outputs computed one token at a time; every expert gets a gradient every step."""
    import torch

    from launcher.model import MoE
    torch.manual_seed(0)
    moe = MoE(8, 16, num_experts=4, top_k=2)
    x = torch.randn(3, 5, 8)
    flat = moe(x).reshape(-1, 8)
    for n, t in enumerate(x.reshape(-1, 8)):
        p = torch.softmax(moe.router(t), -1)
        w, idx = p.topk(2)
        want = sum(wi / w.sum() * moe.experts[int(i)](t[None])[0] for wi, i in zip(w, idx))
        assert torch.allclose(flat[n], want, atol=1e-6)
    # one token: at most two experts are used, yet every expert parameter gets a gradient
    moe(x[:1, :1]).sum().backward()
    assert all(p.grad is not None for p in moe.parameters())
    with pytest.raises(InputError):
        MoE(8, 16, num_experts=2, top_k=3)


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(1, 100_000), experts=st.integers(1, 64), data=st.data())
def test_moe_expert_padding_is_small_and_takes_few_shapes(tokens, experts, data):
    """An expert computes its routed tokens plus less than 1/16 of its balanced load of
    padding (never more than the step's tokens), and a token count gives few distinct
    shapes over every routed count (DTensor's sharding cache)."""
    from launcher.model import EXPERT_PAD_BUCKETS, expert_rows
    top_k = data.draw(st.integers(1, experts))
    routed = data.draw(st.integers(0, tokens))
    rows = expert_rows(routed, tokens, top_k, experts)
    granule = max(1, -(-top_k * tokens // (experts * EXPERT_PAD_BUCKETS)))
    assert max(routed, 1) <= rows <= tokens
    assert rows - routed < granule or routed == 0
    if tokens <= 4096:
        shapes = {expert_rows(r, tokens, top_k, experts) for r in range(tokens + 1)}
        assert len(shapes) <= -(-experts * EXPERT_PAD_BUCKETS // top_k) + 1


def test_reference_training_learns():
    from launcher.reference import train_reference

    losses = train_reference(MODEL, steps=12, global_batch=8, seed=0)
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.1
    assert train_reference(MODEL, steps=12, global_batch=8, seed=0, start_step=10) == losses[10:]


def test_latest_checkpoint_ignores_partial_saves(tmp_path):
    from launcher.checkpoint import META, latest_checkpoint

    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(None) is None
    for name, complete in (("step_00000004", True), ("step_00000008", True),
                           ("step_00000012", False), (".tmp-step_00000016", True)):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / META).write_text("{}")
    step, path = latest_checkpoint(tmp_path)
    assert step == 8 and path.name == "step_00000008"


def test_launcher_imports_nothing_from_the_estimators():
    """Dependencies point one way: instances <- launcher <- estimators."""
    import ast
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "launcher").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n.split(".")[0] in ("estimators", "engine") for n in names), (path.name, names)


def test_measured_run_record_matches_the_profile_store_schema(tmp_path):
    from estimators.profile_store import MEASURED_RUN_KEYS, ProfileStore
    from launcher import telemetry

    c = cfg(dp=1, pp=2, microbatches=2, global_batch=4)
    rec = telemetry.measured_run(c, device="cpu", gpu_type="cpu", iteration_time_s=0.5, step=3,
                                 stage_compute_s=[0.1, 0.2], stage_comm_s=[0.4, 0.3])
    assert set(MEASURED_RUN_KEYS) <= set(rec) and set(telemetry.RECORD_KEYS) == set(MEASURED_RUN_KEYS)
    assert set(rec) == set(telemetry.RECORD_KEYS) | set(telemetry.BREAKDOWN_KEYS)     # nothing undocumented
    telemetry.append_measured_runs(tmp_path, [rec, rec])
    back = ProfileStore(tmp_path).read_measured_runs()
    assert len(back) == 2 and back[0]["pp"] == 2 and back[0]["stage_comm_s"] == [0.4, 0.3]
    assert telemetry.store_dir("x") == __import__("pathlib").Path("x")


def test_progress_file_roundtrip(tmp_path):
    from launcher.telemetry import read_progress, write_progress

    p = tmp_path / "progress.json"
    assert read_progress(p) is None
    write_progress(p, status="running", iterations_done=3, last_checkpoint_step=2)
    got = read_progress(p)
    assert got["status"] == "running" and got["iterations_done"] == 3 and "updated_at" in got
    with pytest.raises(ValueError):
        write_progress(p, status="bogus")


def test_hostfile_parsing(tmp_path):
    from launcher.launch import hostfile_hosts

    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode-a:4\nnode-b\n\n")
    assert hostfile_hosts(f) == [("node-a", 4), ("node-b", 1)]
    f.write_text("node-a:x\n")
    with pytest.raises(InputError) as e:
        hostfile_hosts(f)
    assert e.value.line == 1 and e.value.field == "slots"


def test_cli_refuses_bad_plan_and_dry_runs(capsys):
    from engine.cli.main import main

    assert main(["train", "--model", MODEL, "--plan", "tp=3", "--steps", "2"]) == 2
    assert "tensor degree tp=3 does not divide" in capsys.readouterr().err
    assert main(["train", "--model", MODEL, "--plan", "dp=2,pp=2", "--steps", "2", "--global-batch", "8",
                 "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 4 and out["command"][1:4] == ["-print-all-exitcodes", "-n", "4"]
    assert "launcher.worker" in out["command"]


def test_wide_resnet_stages_compose_and_match_the_catalog():
    """tiny Wide-ResNet: the catalog's parameter count, pipeline stages (stem on the first,
    classifier on the last) that compose to the full model, and images as its only data."""
    import torch

    from instances.models import get_model
    from launcher.data import make_source
    from launcher.model import build_model
    from launcher.pipeline import split_stage

    name = "tiny-wide_resnet__50"
    arch = get_model(name)
    full = build_model(name, seed=3)
    assert sum(p.numel() for p in full.parameters()) == arch.param_count
    assert len(full.layers) == arch.num_blocks == 16
    stages = [split_stage(build_model(name, seed=3), i, 3, (6, 5, 5)) for i in range(3)]
    assert stages[0].classifier is None and stages[1].stem is None and stages[2].stem is None
    names = set().union(*({n for n, _ in s.named_parameters()} for s in stages))
    assert names == {n for n, _ in full.named_parameters()}
    x, y = make_source(arch, 0, None).global_batch(0, 4)
    h = x
    for s in stages:
        h = s(h)
    assert h.shape == (4, arch.num_classes) and torch.allclose(h, full(x), atol=1e-5)
    with pytest.raises(InputError) as e:
        make_source(arch, 0, "corpus.txt")
    assert e.value.field == "data_path"


def test_wide_resnet_reference_training_learns():
    from launcher.config import OptimizerConfig
    from launcher.reference import train_reference

    losses = train_reference("tiny-wide_resnet__50", steps=40, global_batch=8, seed=1,
                             optimizer=OptimizerConfig(lr=1e-3))
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.5


def _tp_shard_worker(rank: int, init_method: str, world: int, models: tuple[str, ...]):
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from launcher.model import build_model
    from launcher.parallelize import apply_tp, tp_plan, tp_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for model in models:
            full = build_model(model, 0)
            plain = tp_shard(copy.deepcopy(full.layers["0"]), tp_plan(full.arch), world, rank)
            apply_tp(full, mesh)
            dtensor = full.layers["0"]
            for name in tp_plan(full.arch):
                for attr in ("weight", "bias"):
                    d, p = getattr(dtensor.get_submodule(name), attr), getattr(plain.get_submodule(name), attr)
                    assert (d is None) == (p is None), (model, name, attr)
                    if d is not None:
                        local = d.to_local() if hasattr(d, "to_local") else d
                        assert torch.equal(local.detach(), p.detach()), (model, name, attr, rank)
        dist.barrier()          # both ranks done before either tears gloo down; run_spawned's
        #                         ranks then skip torch's teardown, which aborts at times
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_tp_shard_holds_what_apply_tp_gives_each_rank():
    """The plain shard the profiler times (``tp_shard``) holds exactly the weights each
    rank holds under ``apply_tp`` (DTensor), for every projection of ``tp_plan`` (Llama:
    grouped-query attention and SwiGLU; MoE: every expert). Two gloo ranks."""
    from estimators.profiler import run_spawned
    run_spawned(_tp_shard_worker, (2, ("tiny-llama__4L", "tiny-moe__2L")), 2, 300.0, "tp_shard check")


def test_move_records_name_the_kind_and_fill_first_step_warmup_and_downtime():
    from launcher import move_record as mr

    assert [mr.move_kind(a, b) for a, b in (((2, 1, 1), (1, 2, 1)), ((2, 2, 1), (2, 1, 2)), ((1, 1, 2), (2, 1, 2)),
                                             ((4, 1, 1), (1, 1, 1)))] == ["dp->tp", "tp->pp", "grow x2", "shrink /4"]
    rec = mr.d2d_record({"old_plan": [2, 1, 1], "new_plan": [1, 1, 2], "world_old": 2, "world_new": 2, "step": 4,
                         "time": 101.0, "drain_s": 0.2, "transfer_s": 0.3, "install_s": 0.1, "bytes_moved": 8.0,
                         "joint_group_s": 0.0, "regroup_s": 0.05, "build_s": 0.15}, requested_at=100.0)
    steps = [{"time": 101.5 + i, "iteration_time_s": 0.5 if i == 0 else 0.2} for i in range(6)]
    assert not mr.finish(rec, steps[:3])                       # warm-up needs 5 steady steps after the first
    assert rec["total_s"] == 1.5 and rec["first_step_s"] == 0.5 and rec["warmup_s"] is None
    assert rec["other_s"] == pytest.approx(1.5 - (0.2 + 0.4 + 0.2 + 0.5))
    assert mr.finish(rec, steps)
    assert rec["warmup_s"] == pytest.approx(0.3) and rec["downtime_s"] == pytest.approx(1.5 - 0.2)


def test_rendezvous_store_binds_its_port_as_it_picks_it():
    from launcher.dist import rendezvous_store
    a = rendezvous_store("127.0.0.1", None, 2, 10.0)
    b = rendezvous_store("127.0.0.1", None, 2, 10.0)
    assert a.port > 0 and b.port > 0 and a.port != b.port        # both bound: no two masters on one port
    c = rendezvous_store("127.0.0.1", a.port, 2, 10.0)
    c.set("k", "v")
    assert a.get("k") == b"v"
