"""A training step's data time with a data file (``--data``), before and after issue 46.

For each file size (random bytes in a temporary folder), times building one data rank's
batch of a step, ``--steps`` times (after one untimed warm-up step, so the file is in the
page cache for both):

- ``whole-file (reference)``: the reader before issue 46, re-implemented here as the
  reference: the whole file read into memory at every step, then the step's windows
  taken from it;
- ``windows``: ``launcher.data.TextFileTokens`` as the ranks use it now (``shard_batch``):
  the file opened once, only the step's windows read.

Every timed step's batches are checked equal between the two. Prints the median and the
ratio (reference over now) per size, from the same run.

    PYTHONPATH=. .venv/bin/python bench/bench_data_reader.py [--sizes-mb 1,200] [--steps 5]
        [--model tiny-gpt__2L] [--batch 8] [--dp 1] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def whole_file_reference(path: str, vocab: int, seq_len: int, seed: int, step: int, batch: int, dp: int, rank: int):
    """THE OLD READER (reference only): the whole file read at every step (issue 46)."""
    import torch

    from launcher.data import STEP_SEED_STRIDE, dp_shard, split
    raw = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    tokens = raw % vocab
    g = torch.Generator().manual_seed(seed * STEP_SEED_STRIDE + step + 1)
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    return dp_shard(split(tokens[idx]), dp, rank)


def _median_s(fn, steps: int) -> tuple[float, list]:
    fn(0)                                   # warm-up (page cache, first allocation)
    times, outs = [], []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        out = fn(step)
        times.append(time.perf_counter() - t0)
        outs.append(out)
    return statistics.median(times), outs


def measure(size_mb: float, *, model: str, batch: int, dp: int, steps: int, folder: Path) -> dict:
    import torch

    from instances.models import get_model
    from launcher.data import TextFileTokens, shard_batch
    arch = get_model(model)
    path = folder / f"data-{size_mb:g}MB.bin"
    with open(path, "wb") as f:
        left = int(size_mb * 2**20)
        while left:
            chunk = min(left, 16 << 20)
            f.write(os.urandom(chunk))
            left -= chunk
    seed = 0
    old_s, old = _median_s(lambda s: whole_file_reference(str(path), arch.vocab_size, arch.seq_len, seed, s, batch,
                                                          dp, 0), steps)
    src = TextFileTokens(str(path), arch.vocab_size, arch.seq_len, seed)
    new_s, new = _median_s(lambda s: shard_batch(src, s, batch, dp, 0), steps)
    src.close()
    same = all(torch.equal(a, b) for o, n in zip(old, new) for a, b in zip(o, n))
    path.unlink()
    return {"size_mb": size_mb, "bytes": int(size_mb * 2**20), "model": model, "seq_len": arch.seq_len,
            "global_batch": batch, "dp": dp, "steps_timed": steps, "whole_file_reference_s": old_s,
            "windows_s": new_s, "ratio": old_s / new_s, "batches_equal": same}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", default="1,200", help="file sizes in MiB, comma-separated (default 1,200)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per reader and size (default 5)")
    p.add_argument("--model", default="tiny-gpt__2L", help="catalog model: its context and vocabulary")
    p.add_argument("--batch", type=int, default=8, help="global batch (default 8)")
    p.add_argument("--dp", type=int, default=1, help="data ranks; rank 0's part is timed (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    sizes = [float(s) for s in a.sizes_mb.split(",") if s.strip()]
    if a.steps < 1 or a.batch < 1 or a.dp < 1 or a.batch % a.dp or not sizes or min(sizes) <= 0:
        p.error("--steps, --batch, --dp >= 1, --batch divisible by --dp, sizes > 0")
    import torch
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        rows = []
        for size in sizes:
            rows.append(measure(size, model=a.model, batch=a.batch, dp=a.dp, steps=a.steps, folder=Path(tmp)))
            print(f"measured {size:g} MiB", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'file':>9} {'whole-file (reference) ms':>26} {'windows ms':>11} {'ratio':>8}  batches equal")
    for r in rows:
        print(f"{r['size_mb']:>6g} MiB {r['whole_file_reference_s'] * 1e3:>26.3f} {r['windows_s'] * 1e3:>11.3f} "
              f"{r['ratio']:>7.0f}x  {r['batches_equal']}")
    return 0 if all(r["batches_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
