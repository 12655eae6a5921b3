"""Model catalog: the named models (Arena's artifact, Llama, tiny ones for CPU tests)
and the one resolver of model names (``canonical_model_name``, ``get_model``): a catalog
name, or the path of a Hugging Face-style ``config.json`` (``instances.hf_config``).
Architectures and what follows from them (parameters, FLOPs, layers): ``instances.arch``.

- ``tiny-*``: configurations that train on a CPU in seconds (tests, launcher, profiler).
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .arch import ModelArch
from .errors import UnknownModel


def _load_arena_models() -> dict[str, ModelArch]:
    raw = json.loads(resources.files("instances").joinpath("data/arena/models.json").read_text())
    out = {}
    for family, sizes in raw["models"].items():
        for size, c in sizes.items():
            if family == "wide_resnet":
                m = ModelArch("wide_resnet", size, dtype=c["dtype"], depth=c["layer_num"],
                              width_factor=c["width_factor"], num_channels=c["num_channels"],
                              image_size=c["image_size"], num_classes=c["num_classes"])
            else:
                fam = "gpt" if family == "bert" else family
                m = ModelArch(fam, size, dtype=c["dtype"], num_layers=c["num_layers"],
                              hidden_size=c["hidden_size"], num_heads=c["num_heads"],
                              seq_len=c["seq_len"], vocab_size=c["vocab_size"],
                              num_experts=c.get("num_experts", 0),
                              expert_group_size=c.get("expert_group_size", 0))
            out[m.name] = m
    return out


_LLAMA = (
    # size, layers, hidden, heads, kv heads, ffn, vocab, seq  (Meta's published configs)
    ("1B", 16, 2048, 32, 8, 8192, 128256, 2048),     # Llama 3.2 1B
    ("7B", 32, 4096, 32, 32, 11008, 32000, 4096),    # Llama 2 7B
    ("13B", 40, 5120, 40, 40, 13824, 32000, 4096),   # Llama 2 13B
    ("70B", 80, 8192, 64, 8, 28672, 32000, 4096),    # Llama 2 70B
)

_TINY = (
    ModelArch("tiny-gpt", "2L", dtype="float32", num_layers=2, hidden_size=64, num_heads=4,
              seq_len=32, vocab_size=256),
    ModelArch("tiny-gpt", "4L", dtype="float32", num_layers=4, hidden_size=128, num_heads=4,
              seq_len=64, vocab_size=512),
    ModelArch("tiny-llama", "4L", dtype="float32", num_layers=4, hidden_size=128, num_heads=4,
              num_kv_heads=2, ffn_hidden_size=352, seq_len=64, vocab_size=512, tied_embeddings=False),
    ModelArch("tiny-moe", "2L", dtype="float32", num_layers=2, hidden_size=64, num_heads=4,
              seq_len=32, vocab_size=256, num_experts=4),
    ModelArch("tiny-wide_resnet", "50", dtype="float32", depth=50, width_factor=2, num_channels=4,
              image_size=32, num_classes=10),
)


def _build_catalog() -> dict[str, ModelArch]:
    cat = _load_arena_models()
    for size, L, h, a, kv, ffn, V, s in _LLAMA:
        m = ModelArch("llama", size, dtype="bfloat16", num_layers=L, hidden_size=h, num_heads=a,
                      num_kv_heads=kv, ffn_hidden_size=ffn, seq_len=s, vocab_size=V,
                      tied_embeddings=False)
        cat[m.name] = m
    for m in _TINY:
        cat[m.name] = m
    return cat


MODELS: dict[str, ModelArch] = _build_catalog()

# Other schedulers' names for our catalog's families.
FAMILY_ALIASES = {"bert": "gpt", "wresnet": "wide_resnet", "wide-resnet": "wide_resnet"}


def canonical_model_name(name: str) -> str:
    """The key under which ``get_model`` finds a model: a catalog name (aliases accepted),
    or, for a name ending in ``.json``, the absolute path of that ``config.json`` file (a
    user's own model, ``instances.hf_config``). The one resolver of model names."""
    if not isinstance(name, str):
        raise UnknownModel(f"model must be a name (a string), got {name!r}", field="model")
    raw = name.strip()
    if raw.lower().endswith(".json"):
        return get_model(raw).source             # reads and validates the file: a bad one fails here
    family, sep, size = raw.partition("__")
    if sep:
        family = FAMILY_ALIASES.get(family.lower(), family.lower())
        key = f"{family}__{size}"
    else:
        key = raw
    if key not in MODELS:
        raise UnknownModel(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))} "
                           "(or the path of a Hugging Face-style config.json)", field="model")
    return key


def get_model(name: str) -> ModelArch:
    raw = name.strip()
    if raw.lower().endswith(".json"):
        if "\0" in raw:
            raise UnknownModel("a file name cannot hold a NUL character", field="model")
        return _file_model(*_file_key(raw))
    return MODELS[canonical_model_name(name)]


def _file_key(path: str) -> tuple[str, int, int]:
    """(absolute path, modification time, size): a changed file is read again."""
    try:
        p = Path(path).resolve()
        st = p.stat()
    except (OSError, RuntimeError):              # (a symlink loop is a RuntimeError in resolve on 3.11)
        return str(Path(path).absolute()), -1, -1    # load_hf_config names the problem
    return str(p), st.st_mtime_ns, st.st_size


@lru_cache(maxsize=64)
def _file_model(path: str, mtime_ns: int, size: int) -> ModelArch:
    from .hf_config import load_hf_config
    return load_hf_config(path)
