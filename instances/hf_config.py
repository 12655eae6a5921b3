"""A user's own transformer from a Hugging Face-style ``config.json``, as a ``ModelArch``.

Which family the file describes comes from ``model_type`` (else from ``architectures``):

- llama-like (``llama``, ``mistral``, ``qwen2``, ``qwen3``; ``LlamaForCausalLM``,
  ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``) -> the catalog's
  ``llama`` family: ``num_hidden_layers``, ``hidden_size``,
  ``num_attention_heads``, ``num_key_value_heads`` (default: ``num_attention_heads``),
  ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``;
- mixtral-like (``mixtral``; ``MixtralForCausalLM``) -> the catalog's ``moe`` family: the
  llama fields plus ``num_local_experts`` (or ``num_experts``) and ``num_experts_per_tok``;
- GPT-2 (``gpt2``; ``GPT2LMHeadModel``) -> the catalog's ``gpt`` family: ``n_layer``,
  ``n_embd``, ``n_head``, ``n_positions``, ``vocab_size``, ``n_inner`` (null: 4 x n_embd).

Optional everywhere: ``torch_dtype`` (or ``dtype``; default float32, Hugging Face's
default), ``tie_word_embeddings`` (default as Hugging Face: tied for GPT-2 only), and
``seq_length``, the training sequence length (default: the length the model was
pretrained at, ``rope_scaling.original_max_position_embeddings``, where the file records
one — Llama 3.1 and later: 8,192 — else the position limit, ``max_position_embeddings`` /
``n_positions``). Every estimate, profile and launch of the model uses that length: add
``seq_length`` to the file to train shorter (or longer) sequences.

Approximations, stated: the model is the catalog family's architecture with the file's
sizes. A mixtral-like file becomes the catalog's GShard-style MoE (LayerNorm, learned
positions, GELU experts of two matrices), not Mixtral's RMSNorm, rotary positions and
SwiGLU experts of three. A Qwen file becomes the llama architecture without Qwen2's
biases on the query, key and value projections and without Qwen3's query and key
norms (a few parameters and element-wise operations per layer; a ``head_dim`` other
than ``hidden_size / num_attention_heads``, as in some Qwen3 sizes, is refused). Every
other key (``rope_theta``, ``rms_norm_eps``, ``rope_scaling`` but for its original
length, ``sliding_window``, bias switches, ...) is ignored: the launcher uses its own
constants. The model's name is the file's absolute path (so a job that names the file
resolves to it again, in any process that sees the same file system).
"""
from __future__ import annotations

from pathlib import Path

from .arch import DTYPE_BYTES, ModelArch
from .errors import InputError
from .limits import show_number
from .paths import check_regular_file
from .structured import loads_json

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MOE_TYPES = ("mixtral",)
GPT_TYPES = ("gpt2",)
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "GPT2LMHeadModel": "gpt2"}
MAX_CONFIG_BYTES = 1 << 20          # a config.json is a few KB; more is not one
MAX_COUNT = 4096                    # layers or experts: beyond any real model, and every per-layer
                                    # estimate walks the layers
MAX_SIZE = 2**31 - 1                # any other size (float arithmetic of the estimates stays in range)


def load_hf_config(path: str | Path) -> ModelArch:
    """Read and validate ``path`` (a ``config.json``); ``InputError`` naming the file and field."""
    p = Path(path)
    file = str(p)
    try:
        is_dir = p.is_dir()
    except OSError as e:                # a name too long
        raise InputError(f"cannot read the model file: {e.strerror or e}", file=file, field="model") from None
    if is_dir:
        raise InputError("is a folder; give the config.json file inside it", file=file)
    try:
        check_regular_file(p, "model file")
    except InputError as e:
        raise InputError(e.reason, file=file, field="model") from None
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise InputError("model file not found", file=file, field="model") from None
    except OSError as e:
        raise InputError(f"cannot read the model file: {e.strerror or e}", file=file, field="model") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(f"larger than {MAX_CONFIG_BYTES} bytes; not a config.json", file=file)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not a text file (expected a JSON config.json)", file=file) from None
    data = loads_json(text, file=file)
    return parse_hf_config(data, file=str(p.resolve()))


def parse_hf_config(data, *, file: str) -> ModelArch:
    """The ``ModelArch`` a parsed ``config.json`` object describes; ``file`` becomes its name."""
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", file=file)
    kind = _model_type(data, file)
    scaling = data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise InputError(f"must be null or an object (such as {{\"rope_type\": \"llama3\", ...}}), got {scaling!r}",
                         file=file, field="rope_scaling")

    def num(key: str, default=None, *, aliases: tuple[str, ...] = ()) -> int:
        for k in (key, *aliases):
            if k in data and data[k] is not None:
                key = k
                break
        else:
            if default is not None:
                return default
            raise InputError("missing (needed for model_type " f"{kind!r})", file=file, field=key)
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"must be an integer, got {v!r}", file=file, field=key)
        if v <= 0:
            raise InputError(f"must be positive, got {v}", file=file, field=key)
        count = key in ("n_layer", "num_hidden_layers", "num_local_experts", "num_experts")
        cap = MAX_COUNT if count else MAX_SIZE
        if v > cap:
            raise InputError(f"must be at most {cap:,}{' (layers or experts: more than any real model has)' * count}, "
                             f"got {show_number(v)}", file=file, field=key)
        return v

    if kind in GPT_TYPES:
        layers, hidden, heads = num("n_layer"), num("n_embd"), num("n_head")
        positions = num("n_positions", aliases=("n_ctx",))
        kv_heads, ffn = heads, num("n_inner", 4 * hidden)
        hidden_f, heads_f = "n_embd", "n_head"
    else:
        layers, hidden = num("num_hidden_layers"), num("hidden_size")
        heads = num("num_attention_heads")
        kv_heads = num("num_key_value_heads", heads)
        ffn, positions = num("intermediate_size"), num("max_position_embeddings")
        hidden_f, heads_f = "hidden_size", "num_attention_heads"
    vocab = num("vocab_size")
    seq_len = num("seq_length") if data.get("seq_length") is not None else _pretraining_length(data, positions, file)
    if seq_len > positions:
        raise InputError(f"{seq_len} exceeds the position limit {positions}", file=file, field="seq_length")
    if hidden % heads:
        raise InputError(f"{hidden_f}={hidden} is not divisible by {heads_f}={heads}", file=file, field=hidden_f)
    if heads % kv_heads:
        raise InputError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}",
                         file=file, field="num_key_value_heads")
    if "head_dim" in data and data["head_dim"] is not None and data["head_dim"] != hidden // heads:
        raise InputError(f"{data['head_dim']!r} differs from hidden_size / num_attention_heads = "
                         f"{hidden // heads}; only the standard head size is supported", file=file, field="head_dim")
    family = {**{t: "llama" for t in LLAMA_TYPES}, **{t: "moe" for t in MOE_TYPES},
              **{t: "gpt" for t in GPT_TYPES}}[kind]
    if family == "llama" and (hidden // heads) % 2:
        raise InputError(f"head size {hidden // heads} is odd; rotary positions rotate pairs",
                         file=file, field="hidden_size")
    experts, top_k = 0, 2
    if family == "moe":
        experts = num("num_local_experts", aliases=("num_experts",))
        top_k = num("num_experts_per_tok")
        if top_k > experts:
            raise InputError(f"{top_k} exceeds the number of experts {experts}", file=file,
                             field="num_experts_per_tok")
    dtype = data.get("torch_dtype", data.get("dtype", "float32"))
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise InputError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPE_BYTES)}", file=file,
                         field="torch_dtype")
    tied = data.get("tie_word_embeddings", kind in GPT_TYPES)          # Hugging Face's defaults
    if not isinstance(tied, bool):
        raise InputError(f"must be true or false, got {tied!r}", file=file, field="tie_word_embeddings")
    return ModelArch(family, Path(file).name, dtype=dtype, num_layers=layers, hidden_size=hidden,
                     num_heads=heads, num_kv_heads=kv_heads, ffn_hidden_size=ffn, seq_len=seq_len,
                     vocab_size=vocab, num_experts=experts, top_k=top_k, tied_embeddings=tied, source=file)


def _pretraining_length(data: dict, positions: int, file: str) -> int:
    """The default training sequence length: ``rope_scaling.original_max_position_embeddings``
    where the file has it (the length the model was pretrained at before its context was
    extended: 8,192 for Llama 3.1 against a position limit of 131,072), else the position
    limit."""
    scaling = data.get("rope_scaling")
    if not isinstance(scaling, dict) or scaling.get("original_max_position_embeddings") is None:
        return positions
    v = scaling["original_max_position_embeddings"]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= positions:
        raise InputError(f"must be an integer in 1..{positions} (max_position_embeddings), got {v!r}", file=file,
                         field="rope_scaling.original_max_position_embeddings")
    return v


def _family(kind: str) -> str:
    return "llama" if kind in LLAMA_TYPES else "moe" if kind in MOE_TYPES else "gpt"


def _model_type(data: dict, file: str) -> str:
    known = LLAMA_TYPES + MOE_TYPES + GPT_TYPES
    mt = data.get("model_type")
    archs = data.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise InputError(f"must be a list of strings (such as [\"LlamaForCausalLM\"]), got {archs!r}", file=file,
                         field="architectures")
    if mt is None:
        if not archs:
            raise InputError(f"missing (and no 'architectures' list); known: {', '.join(known)}", file=file,
                             field="model_type")
        mapped = [ARCHITECTURES.get(a) for a in archs]
        if None in mapped or len(set(mapped)) != 1:
            raise InputError(f"unknown architectures {archs!r}; known: {', '.join(sorted(ARCHITECTURES))}",
                             file=file, field="architectures")
        return mapped[0]
    if mt not in known:
        raise InputError(f"unknown model_type {mt!r}; known: {', '.join(known)}", file=file, field="model_type")
    other = [a for a in archs or () if a in ARCHITECTURES and _family(ARCHITECTURES[a]) != _family(mt)]
    if other:
        raise InputError(f"model_type {mt!r} and architectures {other!r} name different families "
                         f"({_family(mt)} and {_family(ARCHITECTURES[other[0]])}): fix one of them",
                         file=file, field="architectures")
    return mt
