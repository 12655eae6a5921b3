"""GPU and model catalogs, cluster loading, measured tables."""
import json

import pytest

from instances.cluster import ClusterSpec, NodeGroup, load_cluster
from instances.errors import InputError, UnknownGpuType, UnknownModel
from instances.gpus import GPU_TYPES, canonical_gpu_name, get_gpu
from instances.measurements import load_dp_memory, load_measured_iter_times, parse_dp_memory, parse_measured_iter_times
from instances.models import MODELS, canonical_model_name, get_model

REQUIRED_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "v100-32gb", "a40", "a10", "l20", "cpu")


def test_gpu_catalog_has_required_types_with_sane_specs():
    for name in REQUIRED_GPUS:
        g = GPU_TYPES[name]
        assert g.fp16_flops > 0 and g.fp32_flops > 0 and g.memory_bytes > 0
        assert g.memory_bw_bytes_per_s > 0 and g.intra_node_bw_bytes_per_s >= g.inter_node_bw_bytes_per_s > 0
        assert g.default_gpus_per_node >= 1 and g.source
    # orderings the datasheets guarantee
    assert get_gpu("h100-sxm").fp16_flops > get_gpu("a100-40gb").fp16_flops > get_gpu("v100-32gb").fp16_flops
    assert get_gpu("a100-80gb").memory_bytes == 2 * get_gpu("a100-40gb").memory_bytes
    assert get_gpu("h200").memory_bytes > get_gpu("h100-sxm").memory_bytes
    assert get_gpu("cpu").fp16_flops < get_gpu("a10").fp16_flops / 100


def test_gpu_aliases():
    assert canonical_gpu_name("A100") == "a100-40gb"
    assert canonical_gpu_name(" v100 ") == "v100-32gb"
    assert canonical_gpu_name("h100") == "h100-sxm"
    with pytest.raises(UnknownGpuType, match="unknown GPU type 'b200'"):
        canonical_gpu_name("b200")


def test_tiny_gpt_parameters_and_flops_by_hand():
    m = get_model("tiny-gpt__2L")
    L, h, s, V = 2, 64, 32, 256
    assert (m.num_layers, m.hidden_size, m.seq_len, m.vocab_size) == (L, h, s, V)
    # GPT-2 layout: token + position embeddings; per layer qkv (3h^2 + 3h), output
    # projection (h^2 + h), MLP (4h^2 + 4h, 4h^2 + h), two LayerNorms (2 x 2h);
    # final LayerNorm (2h); head tied to the token embedding.
    per_layer = 3 * h * h + 3 * h + h * h + h + 4 * h * h + 4 * h + 4 * h * h + h + 4 * h
    expected = V * h + s * h + L * per_layer + 2 * h
    assert per_layer == 12 * h * h + 13 * h
    assert m.param_count == expected == 118_528
    # forward FLOPs per token: 2 per multiply-add; per layer 2*12h^2 for the weights plus
    # 2*s*h for QK^T and 2*s*h for attention x V; the head 2*h*V.
    per_token = L * (2 * 12 * h * h + 4 * s * h) + 2 * h * V
    assert m.fwd_flops_per_token == pytest.approx(per_token) and per_token == 245_760
    assert m.train_flops_per_sample == pytest.approx(3 * per_token * s)


def test_model_catalog_names_and_aliases():
    assert canonical_model_name("bert__1.3B") == "gpt__1.3B"
    assert canonical_model_name("wresnet__2B") == "wide_resnet__2B"
    for name in ("gpt__760M", "moe__10B", "wide_resnet__6.8B", "llama__7B", "tiny-llama__4L"):
        assert name in MODELS and MODELS[name].param_count > 0
    with pytest.raises(UnknownModel):
        canonical_model_name("gpt__1T")
    # Arena's size labels agree with the derived counts (within 15%)
    for name in ("gpt__760M", "gpt__1.3B", "gpt__2.6B", "gpt__6.7B", "moe__1.3B", "moe__10B",
                 "wide_resnet__500M", "wide_resnet__6.8B", "wide_resnet__13B"):
        label = float(name.split("__")[1][:-1]) * (1e9 if name.endswith("B") else 1e6)
        assert abs(MODELS[name].param_count / label - 1) < 0.15, name


def test_llama_7b_parameter_count_matches_published():
    assert get_model("llama__7B").param_count == pytest.approx(6.74e9, rel=0.01)


def test_load_cluster_ours_and_arena(tmp_path):
    from importlib import resources
    with resources.as_file(resources.files("instances").joinpath("data/arena/sim_cluster_spec.json")) as p:
        arena = load_cluster(p)
    assert arena.num_gpus == 1280
    assert arena.gpus_by_type() == {"a100-40gb": 320, "v100-32gb": 320, "a40": 320, "a10": 320}
    assert arena.max_gpus_per_node("v100-32gb") == 16
    spec = ClusterSpec((NodeGroup("h100", 2, 8), NodeGroup("a40", 3, 4, nodes_per_switch=2)), "mine")
    f = tmp_path / "c.json"
    f.write_text(json.dumps(spec.to_json()))
    back = load_cluster(f)
    assert back == spec and len(back.nodes()) == 5
    assert {n.switch_id for n in back.nodes()} == {0, 1, 2}


@pytest.mark.parametrize("content, field", [
    ('{"node_groups": [{"gpu_type": "a100", "num_nodes": 0, "gpus_per_node": 8}]}', "node_groups[0].num_nodes"),
    ('{"node_groups": [{"gpu_type": "zz", "num_nodes": 1, "gpus_per_node": 8}]}', "node_groups[0].gpu_type"),
    ('{"node_groups": [{"num_nodes": 1, "gpus_per_node": 8}]}', "node_groups[0].gpu_type"),
    ('[{"a100": {"node_num": -1}}]', "a100"),
    ('[{"tpu": {"node_num": 2}}]', "tpu"),
    # issue 13: each of these crashed or was silently accepted
    ('{"node_groups": []}', "node_groups"),
    ('{"node_groups": {}}', "node_groups"),
    ('[{"a100": {"node_num": 0}, "a40": {"node_num": 0}}]', "node_num"),
    ('{"node_groups": [{"gpu_type": 42, "num_nodes": 1, "gpus_per_node": 8}]}', "node_groups[0].gpu_type"),
    ('{"node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 8, '
     '"inter_node_bw_bytes_per_s": -5}]}', "node_groups[0].inter_node_bw_bytes_per_s"),
    ('{"node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 8, '
     '"inter_node_bw_bytes_per_s": "fast"}]}', "node_groups[0].inter_node_bw_bytes_per_s"),
    ('{"node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 8, "gpus": 3}]}',
     "node_groups[0].gpus"),
    ('{"name": 7, "node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 8}]}', "name"),
    # issue 46: an unknown key in Arena's format was ignored
    ('[{"a100": {"node_num": 2, "gpus_per_node": 8}}]', "a100.gpus_per_node"),
])
def test_load_cluster_errors_name_the_field(tmp_path, content, field):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(InputError) as e:
        load_cluster(f)
    assert e.value.field == field and e.value.file == str(f)


def test_load_cluster_binary_or_folder_is_an_input_error(tmp_path):
    binary = tmp_path / "bin.json"
    binary.write_bytes(bytes(range(256)))
    for path, msg in ((binary, "not UTF-8"), (tmp_path, "is a directory"), (tmp_path / "no.json", "not found")):
        with pytest.raises(InputError, match=msg) as e:
            load_cluster(path)
        assert e.value.file == str(path)


def test_load_cluster_bad_json_names_line(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{\n"node_groups": [\n}')
    with pytest.raises(InputError) as e:
        load_cluster(f)
    assert e.value.line == 3


def test_measured_table_is_typed_and_canonical():
    rows = load_measured_iter_times()
    assert len(rows) == 329 and sum(r.iter_time_s is None for r in rows) == 11
    assert {r.gpu_type for r in rows} == {"a100-40gb", "v100-32gb", "a40", "a10"}
    assert all(r.model.split("__")[0] in ("gpt", "moe", "wide_resnet") for r in rows)
    first = rows[0]
    assert first.key == ("moe__690M", 256, "a100-40gb", 1, 1) and first.iter_time_s == pytest.approx(3.768958)


def test_measured_table_errors_name_line_and_field():
    head = "model,size,global_batch,gpu_type,num_nodes,gpus_per_node,iter_time_s\n"
    cases = {
        "moe,690M,256,a100,1,1,x\n": (2, "iter_time_s"),
        "moe,690M,256,tpu,1,1,3\n": (2, "gpu_type"),
        "moe,690M,2.5,a100,1,1,3\n": (2, "global_batch"),
        "moe,1T,256,a100,1,1,3\n": (2, "model"),
        "moe,690M,256,a100,1,1,-3\n": (2, "iter_time_s"),
    }
    for body, (line, field) in cases.items():
        with pytest.raises(InputError) as e:
            parse_measured_iter_times(head + body, "t.csv")
        assert (e.value.line, e.value.field) == (line, field), body
    with pytest.raises(InputError, match="duplicate"):
        parse_measured_iter_times(head + "moe,690M,256,a100,1,1,3\nmoe,690M,256,a100,1,1,4\n", "t.csv")


def test_dp_memory():
    dp = load_dp_memory()
    m = dp[("gpt__760M", 128)]
    assert m.memory_bytes(1) == pytest.approx(24.129e9) and m.memory_bytes(16) is None
    assert dp[("wide_resnet__500M", 512)].memory_bytes(1) is None
    with pytest.raises(InputError) as e:
        parse_dp_memory('{"bert_760M_128": [1, 2, 3]}', "d.json")
    assert e.value.field == "bert_760M_128"


def test_cluster_hosts_one_per_node(tmp_path):
    import json

    from instances.cluster import load_cluster
    from instances.errors import InputError
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4,
                                              "hosts": ["gpu-a", "gpu-b"]}]}))
    c = load_cluster(p)
    assert [n.host for n in c.nodes()] == ["gpu-a", "gpu-b"]
    assert load_cluster(p).to_json()["node_groups"][0]["hosts"] == ["gpu-a", "gpu-b"]
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4,
                                              "hosts": ["gpu-a"]}]}))
    with pytest.raises(InputError, match="hosts"):
        load_cluster(p)


def test_arena_cluster_list_of_more_than_one_object_is_refused(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('[{"a100": {"node_num": 2}}, {"v100": {"node_num": 1}}]')
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.file == str(p) and e.value.field == "[1]" and "one object" in e.value.reason
    p.write_text('[{"a100": {"node_num": 2}, "v100": {"node_num": 1}}]')
    assert load_cluster(p).gpus_by_type() == {"a100-40gb": 8, "v100-32gb": 16}


def test_cluster_json_top_keys_are_strict_a_bom_is_taken_and_hosts_are_unique(tmp_path):
    p = tmp_path / "c.json"
    group = {"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4}
    p.write_text(json.dumps({"bogus": 1, "node_groups": [group]}))
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.field == "bogus" and "unknown key" in e.value.reason
    p.write_bytes("\ufeff".encode() + json.dumps({"name": "b", "node_groups": [group]}).encode())
    assert load_cluster(p).num_gpus == 8
    for groups, field, host in (([{**group, "hosts": ["a", "a"]}], "node_groups[0].hosts", "'a'"),
                                ([{**group, "hosts": ["a", "b"]}, {**group, "hosts": ["c", " b"]}],
                                 "node_groups[1].hosts", "'b'")):
        p.write_text(json.dumps({"node_groups": groups}))
        with pytest.raises(InputError) as e:
            load_cluster(p)
        assert e.value.field == field and f"duplicate host name {host}" in e.value.reason, e.value


def test_an_absurd_cluster_size_is_refused_at_once(tmp_path):
    import time

    from instances.cluster import MAX_CLUSTER_GPUS
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 100_000_000, "gpus_per_node": 8}]}))
    t0 = time.monotonic()
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.field == "node_groups[0].num_nodes" and f"{MAX_CLUSTER_GPUS:,}" in e.value.reason
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 4},
                                             {"gpu_type": "v100", "num_nodes": 1, "gpus_per_node": 10**7}]}))
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.field == "node_groups[1].gpus_per_node"
    p.write_text('[{"a100": {"node_num": 1000000}}]')
    with pytest.raises(InputError) as e:
        load_cluster(p)
    assert e.value.field == "a100.node_num"
    assert time.monotonic() - t0 < 5
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": MAX_CLUSTER_GPUS // 8,
                                              "gpus_per_node": 8}]}))
    assert load_cluster(p).num_gpus == MAX_CLUSTER_GPUS
