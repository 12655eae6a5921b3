"""`arena models`: the model catalog (``instances/models.py``), with sizes.

Example::

    arena models            # every model: family, parameters, layers, width, sequence/image
    arena models --json
"""
from __future__ import annotations

from ..jsonout import dumps


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list the model catalog with sizes (parameters, layers, width)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _params(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def rows() -> list[dict]:
    from instances.models import MODELS
    out = []
    for name, m in MODELS.items():
        out.append({"name": name, "family": m.family, "parameters": m.param_count, "layers": m.num_blocks,
                    "hidden_size": m.hidden_size if m.is_transformer else None,
                    "heads": m.num_heads if m.is_transformer else None,
                    "experts": m.num_experts or None,
                    "input": f"seq {m.seq_len}" if m.is_transformer else f"image {m.image_size}",
                    "dtype": m.dtype, "tiny": name.startswith("tiny-")})
    return out


def run(args) -> int:
    table = rows()
    if args.json:
        print(dumps(table, indent=1))
        return 0
    head = ("name", "family", "params", "layers", "hidden", "heads", "experts", "input", "dtype")
    lines = [head] + [(r["name"], r["family"], _params(r["parameters"]), str(r["layers"]),
                       str(r["hidden_size"] or "-"), str(r["heads"] or "-"), str(r["experts"] or "-"),
                       r["input"], r["dtype"]) for r in table]
    w = [max(len(line[c]) for line in lines) for c in range(len(head))]
    for line in lines:
        print("  ".join(f"{v:<{w[c]}}" if c in (0, 1, 7, 8) else f"{v:>{w[c]}}" for c, v in enumerate(line)).rstrip())
    print("layers: decoder layers (transformers) or residual blocks (Wide-ResNet); tiny-* models train on a "
          "CPU in seconds (arena train, tests)")
    return 0
