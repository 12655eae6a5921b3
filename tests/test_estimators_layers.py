"""Layer costs and memory against hand calculations for a small model."""
from dataclasses import replace

import pytest

from estimators.config import EfficiencyConfig, MemoryConfig
from estimators.layers import layer_costs
from estimators.memory import plan_memory
from instances.errors import InputError
from instances.models import get_model
from instances.plan import Plan

NO_REMAT = EfficiencyConfig(recompute_activations=False, dp_sharded_optimizer=False)
ARCH = get_model("tiny-gpt__2L")        # h=64, heads=4, s=32, V=256, fp32, 2 decoder layers
H, S, A, V, B = 64, 32, 4, 256, 4        # B: bytes per fp32 element


def decoder(costs):
    return [c for c in costs if c.kind == "decoder"]


@pytest.mark.parametrize("mb,tp", [(1, 1), (3, 1), (2, 2), (4, 4)])
def test_decoder_flops_params_and_tp_volume(mb, tp):
    c = decoder(layer_costs(ARCH, micro_batch=mb, tp=tp))[0]
    # forward: QKV + output projection 8*s*h^2, MLP 16*s*h^2, attention scores 4*s^2*h
    fwd = mb * (24 * S * H * H + 4 * S * S * H)
    assert c.fwd_flops == pytest.approx(fwd / tp)
    assert c.bwd_flops == pytest.approx(2 * fwd / tp)
    # params: 12 h^2 weights + 13 h biases and norms (qkv 3h, out h, two norms 4h, MLP 5h)
    assert c.params == pytest.approx((12 * H * H + 13 * H) / tp)
    if tp == 1:
        assert (c.tp_allreduces_fwd, c.tp_allreduces_bwd, c.tp_comm_bytes_fwd) == (0, 0, 0)
    else:   # Megatron: 2 all-reduces of b*s*h forward, 2 backward
        assert c.tp_allreduces_fwd == 2 and c.tp_allreduces_bwd == 2
        assert c.tp_allreduce_bytes == mb * S * H * B
        assert c.tp_comm_bytes_bwd == 2 * mb * S * H * B


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_decoder_activations_follow_korthikanti(tp):
    c = decoder(layer_costs(ARCH, micro_batch=2, tp=tp))[0]
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes at 2-byte elements, scaled to fp32 (x2)
    expect = 2 * S * H * (10 + 24 / tp + 5 * A * S / (H * tp)) * (B / 2)
    assert c.activation_bytes == pytest.approx(expect)


def test_sequence_length_and_dtype_rederive():
    c = decoder(layer_costs(ARCH, micro_batch=1, seq_len=64, dtype="float16"))[0]
    assert c.fwd_flops == pytest.approx(24 * 64 * H * H + 4 * 64 * 64 * H)
    assert c.param_bytes == pytest.approx((12 * H * H + 13 * H) * 2)
    with pytest.raises(ValueError):
        layer_costs(ARCH, micro_batch=0)


def test_head_and_embedding_sharding():
    costs = layer_costs(ARCH, micro_batch=1, tp=2)
    emb, head = costs[0], costs[-1]
    assert emb.kind == "embedding" and emb.tp_allreduces_fwd == 1 and emb.tp_allreduces_bwd == 0
    assert head.fwd_flops == pytest.approx(2 * S * H * V / 2)
    assert head.tp_allreduces_bwd == 1


def test_memory_single_rank_by_hand():
    plan = Plan(1, 1, 1, (len(ARCH.layers()),), 1, "1f1b")
    cfg = MemoryConfig(framework_reserve_bytes=0)
    mem = plan_memory(ARCH, plan, global_batch=2, cfg=cfg, eff=NO_REMAT)
    costs = layer_costs(ARCH, micro_batch=2)
    # fp32 Adam: weights 4 + grads 4 + m 4 + v 4 = 16 bytes/param
    state = 16 * ARCH.param_count
    act = sum(c.activation_bytes for c in costs)
    assert mem.peak_bytes == pytest.approx(state + act)


def test_sharded_optimizer_and_family_optimizer_memory():
    """dp-sharded update (Alpa prefer_reduce_scatter): weights and grads whole, optimizer
    state / dp; Wide-ResNet trains with SGD momentum (4 B/param of state, not Adam's 8)."""
    cfg = MemoryConfig(framework_reserve_bytes=0)
    n = len(ARCH.layers())
    sharded = replace(NO_REMAT, dp_sharded_optimizer=True)
    m4 = plan_memory(ARCH, Plan(1, 4, 1, (n,), 1, "1f1b"), global_batch=8, cfg=cfg, eff=sharded)
    act = sum(c.activation_bytes for c in layer_costs(ARCH, micro_batch=2))
    assert m4.peak_bytes == pytest.approx((8 + 8 / 4) * ARCH.param_count + act)
    sgd_wrn = MemoryConfig(optimizer_by_family=(("wide_resnet", "sgd"),))
    assert sgd_wrn.state_bytes_per_param(4, "wide_resnet") == 12
    assert sgd_wrn.state_bytes_per_param(2, "gpt") == 16        # fp16: 2 + 2 + master 4 + m, v 8
    assert sgd_wrn.state_bytes_per_param(2, "gpt", shard=4) == 4 + 12 / 4
    assert cfg.state_bytes_per_param(4, "wide_resnet") == 16    # default: Adam for every family
    with pytest.raises(InputError):
        MemoryConfig(optimizer_by_family=(("gpt", "lamb"),))


def test_memory_inflight_gpipe_vs_1f1b():
    n = len(ARCH.layers())
    cfg = MemoryConfig(framework_reserve_bytes=0)
    g = plan_memory(ARCH, Plan(2, 1, 1, (2, n - 2), 4, "gpipe"), global_batch=8, cfg=cfg, eff=NO_REMAT)
    f = plan_memory(ARCH, Plan(2, 1, 1, (2, n - 2), 4, "1f1b"), global_batch=8, cfg=cfg, eff=NO_REMAT)
    costs = layer_costs(ARCH, micro_batch=2)
    act0 = sum(c.activation_bytes for c in costs[:2])
    buf0 = 2 * costs[1].output_bytes
    state0 = 16 * sum(c.params for c in costs[:2])
    assert g.stage_peak_bytes[0] == pytest.approx(state0 + 4 * (act0 + buf0))   # gpipe keeps all 4
    assert f.stage_peak_bytes[0] == pytest.approx(state0 + 2 * (act0 + buf0))   # 1f1b: pp - 0 = 2
    act1 = sum(c.activation_bytes for c in costs[2:])
    assert f.stage_peak_bytes[1] == pytest.approx(16 * sum(c.params for c in costs[2:]) + act1
                                                  + 2 * costs[-1].output_bytes)


def test_recompute_keeps_less():
    plan = Plan(1, 1, 1, (len(ARCH.layers()),), 1, "1f1b")
    full = plan_memory(ARCH, plan, global_batch=8, cfg=MemoryConfig(), eff=NO_REMAT)
    rc = plan_memory(ARCH, plan, global_batch=8, cfg=MemoryConfig(),
                     eff=EfficiencyConfig(recompute_activations=True))
    assert rc.activation_bytes < full.activation_bytes


def test_moe_expert_parallelism_by_hand():
    from estimators.layers import expert_parallel_degree
    moe = get_model("tiny-moe__2L")          # h=64, s=32, E=4 experts, top-2, ffn=4h, fp32
    h, s, E, ffn = 64, 32, 4, 256
    c = next(c for c in layer_costs(moe, micro_batch=2, tp=1) if c.kind == "moe_decoder")
    expert = E * (2 * h * ffn + ffn + h)
    assert c.expert_params == pytest.approx(expert)
    assert c.rank_params(2) == pytest.approx(c.params - expert / 2)
    assert c.a2a_bytes == pytest.approx(2 * s * h * 2 * 4)     # mb * s * h * top_k * 4 bytes
    assert [expert_parallel_degree(moe, d) for d in (1, 2, 6, 8, 16)] == [1, 2, 2, 4, 4]
    assert expert_parallel_degree(ARCH, 8) == 1               # dense model
