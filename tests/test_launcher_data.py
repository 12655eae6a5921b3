"""The training data file (issue 46): read once and by windows, with the batches the
whole-file reader gave; checked (type, size, roots) before anything starts."""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from instances.errors import InputError
from launcher.datafile import MAX_DATA_BYTES, DataFileRefused, check_data_file, min_data_bytes


def whole_file_batch(path, vocab, seq_len, seed, step, batch):
    """The reader before issue 46 (the whole file read at every step): the reference."""
    import torch

    from launcher.data import STEP_SEED_STRIDE, split
    raw = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    tokens = raw % vocab
    g = torch.Generator().manual_seed(seed * STEP_SEED_STRIDE + step + 1)
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    return split(tokens[idx])


def test_batches_and_data_rank_shards_equal_the_whole_file_readers(tmp_path):
    import torch

    from launcher.data import TextFileTokens, dp_shard, shard_batch
    f = tmp_path / "corpus.bin"
    f.write_bytes(os.urandom(3000) + "héllo, ärena ✓".encode() * 20)
    for vocab, seq_len, seed in ((256, 16, 0), (100, 64, 3), (50257, 128, 2**40)):
        src = TextFileTokens(str(f), vocab, seq_len, seed)
        for step in (0, 1, 7, 1000):
            want = whole_file_batch(f, vocab, seq_len, seed, step, 8)
            got = src.global_batch(step, 8)
            assert all(torch.equal(a, b) and a.dtype == b.dtype == torch.long for a, b in zip(want, got))
            for dp in (2, 4):
                for r in range(dp):
                    assert all(torch.equal(a, b) for a, b in zip(dp_shard(want, dp, r),
                                                                 shard_batch(src, step, 8, dp, r)))


def _bytes_read() -> int:
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines()
                    if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_step_reads_its_windows_not_the_file(tmp_path):
    from launcher.data import TextFileTokens
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(8 << 20))
    src = TextFileTokens(str(f), 256, 128, 0)
    before = _bytes_read()
    for step in range(5):
        src.global_batch(step, 16)
    # 5 steps x 16 windows x 129 bytes, with room for this process's other reads; the
    # whole-file reader read 5 x 8 MiB
    assert _bytes_read() - before < 1 << 20


def test_the_file_is_opened_once_and_a_change_under_the_run_is_reported(tmp_path):
    from launcher.data import TextFileTokens
    f = tmp_path / "corpus.txt"
    f.write_bytes(os.urandom(4096))
    want = whole_file_batch(f, 256, 32, 1, 3, 4)
    src = TextFileTokens(str(f), 256, 32, 1)
    moved = tmp_path / "elsewhere.txt"
    f.rename(moved)                       # the rank trains on the file it opened
    f.write_bytes(b"another file " * 400)
    assert all(bool((a == b).all()) for a, b in zip(want, src.global_batch(3, 4)))
    with open(moved, "r+b") as h:         # cut short: reported, not a SIGBUS, not other batches
        h.truncate(2000)
    with pytest.raises(InputError, match="changed size during the run"):
        src.global_batch(4, 4)


def test_data_files_refused_before_anything_starts(tmp_path):
    need = min_data_bytes(16)
    cases = {}
    cases["missing"] = (tmp_path / "absent.txt", "file not found")
    cases["folder"] = (tmp_path, "is a folder")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases["fifo"] = (fifo, "not a regular file")
    cases["device"] = (Path("/dev/zero"), "not a regular file")
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    cases["socket"] = (sock_path, "not a regular file")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    cases["empty"] = (empty, "is empty")
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * (need - 1))
    cases["short"] = (short, f"holds {need - 1} bytes; the model needs at least {need}")
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as h:           # sparse: no disk used
        h.truncate(MAX_DATA_BYTES + 1)
    cases["huge"] = (huge, f"is {MAX_DATA_BYTES + 1:,} bytes, over the {MAX_DATA_BYTES:,} bytes (64 GiB) a data file")
    try:
        for name, (path, words) in cases.items():
            done: list = []

            def check(path=path):
                try:
                    check_data_file(str(path), min_bytes=need)
                except DataFileRefused as e:
                    done.append(e)
            t = threading.Thread(target=check, daemon=True)
            t.start()
            t.join(5)                     # a pipe must not hang the check
            assert done, f"{name}: no refusal within 5 s"
            assert words in done[0].reason and done[0].field == "data" and done[0].file == str(path), (name, done)
    finally:
        sock.close()
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"x" * need)
    assert check_data_file(str(ok), min_bytes=need) == need


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_data_file_is_refused(tmp_path):
    f = tmp_path / "locked.txt"
    f.write_bytes(b"x" * 100)
    f.chmod(0)
    with pytest.raises(DataFileRefused, match="not readable"):
        check_data_file(str(f), min_bytes=10)


def test_data_roots_are_checked_with_links_and_dots_resolved(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "data2"
    root.mkdir()
    outside.mkdir()
    (root / "sub").mkdir()
    good = root / "sub" / "corpus.txt"
    good.write_bytes(b"y" * 100)
    secret = outside / "secret.txt"
    secret.write_bytes(b"z" * 100)
    (root / "link.txt").symlink_to(secret)            # a link inside the root that leads out
    (root / "dirlink").symlink_to(outside)
    roots = (str(root),)
    assert check_data_file(str(good), min_bytes=10, roots=roots) == 100
    assert check_data_file(str(root / "sub" / ".." / "sub" / "corpus.txt"), min_bytes=10, roots=roots) == 100
    for path in (secret, root / "link.txt", root / "dirlink" / "secret.txt", root / ".." / "data2" / "secret.txt",
                 Path("/etc/shadow"), root / "absent-but-outside" / ".." / ".." / "data2" / "nothing"):
        with pytest.raises(DataFileRefused) as e:
            check_data_file(str(path), min_bytes=10, roots=roots)
        assert "is outside the folders training data may be read from: " + str(root.resolve()) in e.value.reason
        assert "--data-root" in e.value.reason, e.value.reason
    # the same words whether or not the file outside exists: nothing is learnt about it
    a = pytest.raises(DataFileRefused, check_data_file, str(outside / "nothing"), min_bytes=10, roots=roots)
    b = pytest.raises(DataFileRefused, check_data_file, str(secret), min_bytes=10, roots=roots)
    assert a.value.reason.replace("nothing", "X") == b.value.reason.replace("secret.txt", "X")


@pytest.mark.slow
def test_two_data_ranks_reading_their_own_windows_train_the_one_process_losses(tmp_path):
    """Each data rank reads only its windows of the file (``shard_batch``); together they
    train the losses of the one-process reference on the same file (whose batches are the
    whole-file reader's, above)."""
    from launcher.api import run_training
    from launcher.reference import train_reference
    data = tmp_path / "corpus.txt"
    data.write_bytes(("the quick brown fox jumps over the lazy dog; " * 200).encode() + os.urandom(2000))
    want = train_reference("tiny-gpt__2L", steps=4, global_batch=4, seed=5, data_path=str(data))
    r = run_training("tiny-gpt__2L", 2, 1, 1, steps=4, global_batch=4, seed=5, data_path=str(data),
                     run_dir=tmp_path / "dp", timeout_s=180)
    assert r.ok, r.output_tail
    assert len(r.losses) == 4 and max(abs(a - b) for a, b in zip(r.losses, want)) < 1e-4, (r.losses, want)
