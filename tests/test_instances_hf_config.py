"""A user's own model from a Hugging Face-style config.json: parsing, every refusal, a
fuzz of the parser, the one model-name resolver, and the CLI's estimate of such a model.
(The real launch of one is in test_launcher_mpi.py.)"""
import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instances.arch import ModelArch
from instances.errors import InputError
from instances.hf_config import load_hf_config, parse_hf_config
from instances.jobs import Job
from instances.models import MODELS, canonical_model_name, get_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
TINY_LLAMA = EXAMPLES / "tiny-llama-config.json"
TINY_MIXTRAL = EXAMPLES / "tiny-mixtral-config.json"

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 352, "vocab_size": 512,
         "max_position_embeddings": 64, "torch_dtype": "float32", "tie_word_embeddings": False}
MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 256, "vocab_size": 256, "max_position_embeddings": 32,
           "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": True}
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32, "vocab_size": 256,
        "n_inner": None}


def write(tmp_path, data, name="config.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("cfg, twin", [(LLAMA, "tiny-llama__4L"), (MIXTRAL, "tiny-moe__2L"),
                                       (GPT2, "tiny-gpt__2L")])
def test_a_file_with_a_catalog_models_sizes_is_that_model(tmp_path, cfg, twin):
    """Same per-layer decomposition (parameters, FLOPs, activations) as the catalog twin."""
    m = load_hf_config(write(tmp_path, cfg))
    ref = get_model(twin)
    assert m.base_family == ref.base_family
    assert m.layers() == ref.layers()
    assert m.param_count == ref.param_count and m.dtype == "float32"


def test_examples_resolve_like_catalog_models(tmp_path, monkeypatch):
    for path, family, experts in ((TINY_LLAMA, "llama", 0), (TINY_MIXTRAL, "moe", 4)):
        m = get_model(str(path))
        assert (m.family, m.num_experts, m.source) == (family, experts, str(path))
        assert m.name == str(path) and get_model(m.name) is m      # the name resolves back, cached
        assert m.name not in MODELS
    monkeypatch.chdir(EXAMPLES.parent)                               # a relative path becomes absolute
    assert canonical_model_name("models/tiny-llama-config.json") == str(TINY_LLAMA)
    job = Job("j", "models/tiny-mixtral-config.json", 8, 10, 0.0)
    assert job.model == str(TINY_MIXTRAL) and job.arch.num_experts == 4


def test_architectures_picks_the_family_when_model_type_is_absent(tmp_path):
    cfg = {k: v for k, v in LLAMA.items() if k != "model_type"} | {"architectures": ["MistralForCausalLM"]}
    assert load_hf_config(write(tmp_path, cfg)).family == "llama"


def test_qwen_files_are_llama_like_and_a_non_standard_head_size_is_refused(tmp_path):
    """Qwen2/Qwen3 files (their extra keys ignored) read as the llama family with the same
    layers as the llama twin; a Qwen3 ``head_dim`` other than hidden / heads is refused."""
    extra = {"rope_theta": 1e6, "use_sliding_window": False, "attention_dropout": 0.0, "rms_norm_eps": 1e-6}
    for kind, arch in (("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")):
        m = load_hf_config(write(tmp_path, LLAMA | extra | {"model_type": kind}, f"{kind}.json"))
        assert m.family == "llama" and m.layers() == get_model("tiny-llama__4L").layers()
        cfg = {k: v for k, v in LLAMA.items() if k != "model_type"} | {"architectures": [arch]}
        assert load_hf_config(write(tmp_path, cfg, f"{arch}.json")).family == "llama"
    with pytest.raises(InputError, match="head_dim"):
        load_hf_config(write(tmp_path, LLAMA | {"model_type": "qwen3", "head_dim": 64}, "q3.json"))


def test_a_changed_file_is_read_again(tmp_path):
    p = write(tmp_path, LLAMA)
    assert get_model(str(p)).num_layers == 4
    p.write_text(json.dumps(LLAMA | {"num_hidden_layers": 6, "intermediate_size": 300}))
    assert get_model(str(p)).num_layers == 6


BAD = [
    ("missing field", LLAMA, {"num_hidden_layers": None}, "num_hidden_layers"),
    ("non-integer", LLAMA, {"hidden_size": 128.0}, "hidden_size"),
    ("string", LLAMA, {"vocab_size": "512"}, "vocab_size"),
    ("boolean", LLAMA, {"intermediate_size": True}, "intermediate_size"),
    ("zero", LLAMA, {"num_hidden_layers": 0}, "num_hidden_layers"),
    ("negative", LLAMA, {"max_position_embeddings": -1}, "max_position_embeddings"),
    ("hidden % heads", LLAMA, {"hidden_size": 130}, "hidden_size"),
    ("heads % kv heads", LLAMA, {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("odd head size (rotary)", LLAMA, {"hidden_size": 36, "num_attention_heads": 4}, "hidden_size"),
    ("explicit head_dim", LLAMA, {"head_dim": 64}, "head_dim"),
    ("seq_length past positions", LLAMA, {"seq_length": 128}, "seq_length"),
    ("dtype", LLAMA, {"torch_dtype": "int8"}, "torch_dtype"),
    ("tie flag", LLAMA, {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ("unknown model_type", LLAMA, {"model_type": "bloom"}, "model_type"),
    ("unknown architectures", LLAMA, {"model_type": None, "architectures": ["BloomForCausalLM"]},
     "architectures"),
    ("no type at all", LLAMA, {"model_type": None}, "model_type"),
    ("no experts", MIXTRAL, {"num_local_experts": None}, "num_local_experts"),
    ("top-k > experts", MIXTRAL, {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("absurd layer count", LLAMA, {"num_hidden_layers": 10**6}, "num_hidden_layers"),
    ("dtype not a string", LLAMA, {"torch_dtype": ["float32"]}, "torch_dtype"),
    ("gpt2 n_embd % n_head", GPT2, {"n_embd": 66}, "n_embd"),
    ("gpt2 missing n_positions", GPT2, {"n_positions": None}, "n_positions"),
]


@pytest.mark.parametrize("what, base, change, field", BAD, ids=[b[0] for b in BAD])
def test_bad_fields_are_refused_naming_file_and_field(tmp_path, what, base, change, field):
    cfg = {k: v for k, v in (base | change).items() if v is not None or base is GPT2 and k == "n_inner"}
    p = write(tmp_path, cfg)
    with pytest.raises(InputError) as e:
        load_hf_config(p)
    assert e.value.field == field and e.value.file == str(p.resolve()), str(e.value)
    assert str(p.resolve()) in str(e.value) and field in str(e.value)


def test_bad_files_are_refused(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"model_type": "llama",\n "hidden_size": }')
    folder = tmp_path / "model.json"
    folder.mkdir()
    binary = tmp_path / "weights.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    array = write(tmp_path, [1, 2], "array.json")
    for path, words in ((bad_json, "not valid JSON"), (folder, "folder"), (binary, "not a text file"),
                        (array, "JSON object"), (tmp_path / "absent.json", "not found")):
        with pytest.raises(InputError, match=words) as e:
            get_model(str(path))
        assert str(path.name) in str(e.value)
    with pytest.raises(InputError) as e:
        load_hf_config(bad_json)
    assert e.value.line == 2
    with pytest.raises(InputError) as e:           # through the Job: the one resolver
        Job("j", str(tmp_path / "absent.json"), 8, 10, 0.0)
    assert e.value.field == "model"


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.integers(), st.floats(allow_nan=True),
                    st.lists(st.integers(0, 3), max_size=2),
                    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
                    st.text(max_size=4), st.sampled_from(["llama", "mixtral", "gpt2", "mistral", "float16"]))
KEYS = sorted(set(LLAMA) | set(MIXTRAL) | set(GPT2) | {"num_experts", "head_dim", "seq_length", "architectures",
                                                        "n_ctx", "dtype"})


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from([LLAMA, MIXTRAL, GPT2]), changes=st.dictionaries(st.sampled_from(KEYS), SCALARS,
                                                                              max_size=4))
def test_fuzz_parser_gives_a_valid_model_or_an_input_error(base, changes):
    try:
        m = parse_hf_config(base | changes, file="/fuzz/config.json")
    except InputError as e:
        assert e.file == "/fuzz/config.json"
        return
    assert isinstance(m, ModelArch) and m.is_transformer and m.source == "/fuzz/config.json"
    assert m.hidden_size % m.num_heads == 0 and m.num_heads % m.kv_heads == 0
    assert min(m.num_layers, m.hidden_size, m.seq_len, m.vocab_size, m.ffn) > 0
    assert m.base_family != "moe" or 1 <= m.top_k <= m.num_experts
    assert m.param_count > 0


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_file_bytes_give_a_model_or_an_input_error(tmp_path_factory, raw):
    p = tmp_path_factory.mktemp("fz") / "config.json"
    p.write_bytes(raw)
    try:
        load_hf_config(p)
    except InputError:
        pass


def test_cli_estimate_of_a_config_json_model():
    from engine.cli.main import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["estimate", "--model", str(TINY_LLAMA), "--gpu-type", "a100", "--gpus", "4", "--batch", "8",
                   "--json"])
    assert rc == 0
    res = json.loads(out.getvalue())
    assert res["model"] == str(TINY_LLAMA) and res["seq_len"] == get_model(str(TINY_LLAMA)).seq_len
    feasible = [g for g in res["grids"] if g["feasible"]]
    assert feasible and all(g["iteration_time_s"] > 0 for g in feasible)
    # the layers the plans split are the file's: 3 decoder layers + embedding + head
    assert all(sum(g["plan"]["stage_layers"]) == 5 for g in feasible)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["estimate", "--model", str(TINY_LLAMA.with_name("nope.json")), "--gpu-type", "a100",
                   "--gpus", "4"])
    assert rc == 2 and "not found" in err.getvalue()


def test_the_training_length_defaults_to_the_pretraining_length_and_the_file_can_set_it(tmp_path):
    long = LLAMA | {"max_position_embeddings": 4096,
                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}}
    assert load_hf_config(write(tmp_path, long, "a.json")).seq_len == 512          # pretrained at 512
    assert load_hf_config(write(tmp_path, long | {"seq_length": 2048}, "b.json")).seq_len == 2048
    assert load_hf_config(write(tmp_path, long | {"rope_scaling": None}, "c.json")).seq_len == 4096
    assert load_hf_config(write(tmp_path, long | {"rope_scaling": {"factor": 2.0}}, "d.json")).seq_len == 4096
    for bad in (0, 8192, "512", True):
        odd = long | {"rope_scaling": {"original_max_position_embeddings": bad}}
        with pytest.raises(InputError, match="original_max_position_embeddings"):
            load_hf_config(write(tmp_path, odd, "e.json"))
        # read only when it is the default: an explicit training length does not need it
        assert load_hf_config(write(tmp_path, odd | {"seq_length": 256}, "f.json")).seq_len == 256


def test_cli_estimate_names_the_sequence_length_and_the_key_when_nothing_fits(tmp_path):
    from engine.cli.main import main
    big = LLAMA | {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "intermediate_size": 14336, "max_position_embeddings": 131072, "num_hidden_layers": 32}
    p = write(tmp_path, big)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["estimate", "--model", str(p), "--gpu-type", "a100", "--gpus", "4", "--batch", "8"])
    assert rc == 1 and "batch 8 of 131072-token sequences" in out.getvalue()      # (1: nothing fits; the table)
    assert "no grid fits in memory at 131072-token sequences" in err.getvalue()
    assert f'from {p.resolve()}: add "seq_length"' in err.getvalue()


def test_architectures_must_be_a_list_agree_with_model_type_and_rope_scaling_is_an_object(tmp_path):
    no_type = {k: v for k, v in LLAMA.items() if k != "model_type"}
    for data, field, words in (({**no_type, "architectures": "LlamaForCausalLM"}, "architectures", "list of strings"),
                               ({**LLAMA, "architectures": ["MixtralForCausalLM"]}, "architectures",
                                "different families"),
                               ({**LLAMA, "rope_scaling": "yes"}, "rope_scaling", "null or an object")):
        p = write(tmp_path, data)
        with pytest.raises(InputError) as e:
            load_hf_config(p)
        assert e.value.field == field and words in e.value.reason, e.value
        assert e.value.file == str(p.resolve())
    mixed = str(write(tmp_path, {**LLAMA, "architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(InputError, match="'llama'.*MixtralForCausalLM"):        # names both
        load_hf_config(mixed)
    # the same family under another name, an architecture we do not know, and a null rope_scaling stay fine
    for extra in ({"architectures": ["MistralForCausalLM"]}, {"architectures": ["LlamaForSequenceClassification"]},
                  {"rope_scaling": None}):
        assert load_hf_config(write(tmp_path, {**LLAMA, **extra})).family == "llama"
