"""CSV input with line numbers: reading a file's text (gzip detected), then rows after a
header with typed field getters whose errors are ``InputError`` naming the file, the
line and the field (traces, outage lists)."""
from __future__ import annotations

import csv
import gzip
import io
import math
import zlib
from pathlib import Path
from typing import BinaryIO

from .errors import InputError
from .gpus import canonical_gpu_name
from .limits import MAX_INPUT_BYTES, MAX_TIME_S, TIME_BOUND, Range
from .models import canonical_model_name
from .paths import check_regular_file


def read_bounded(f: BinaryIO, label: str, what: str) -> bytes:
    """The bytes of the open binary file ``f`` (seekable; gzip detected by its magic bytes and
    decompressed as a stream), at most ``MAX_INPUT_BYTES`` of them after decompression,
    or an ``InputError`` naming ``label``: a larger file, or corrupt gzip data."""
    def upto_limit(r) -> bytes:         # 1 MiB at a time, stopping past the limit
        chunks, n = [], 0
        while n <= MAX_INPUT_BYTES and (c := r.read(1 << 20)):
            chunks.append(c)
            n += len(c)
        return b"".join(chunks)

    gz = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    try:
        if gz:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                data = upto_limit(g)           # a stream: never the whole expansion in memory
        else:
            data = upto_limit(f)
    except (OSError, EOFError, zlib.error) as e:    # BadGzipFile, a truncated or corrupt stream
        if not gz:
            raise
        raise InputError(f"corrupt gzip data: {e}", file=label) from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{what} file is larger than {MAX_INPUT_BYTES // 2**20} MiB"
                         f"{' once decompressed' if gz else ''}, the limit on an input file "
                         f"(instances/limits.py, MAX_INPUT_BYTES)", file=label)
    return data


def read_text(path: str | Path, what: str) -> str:
    """The text of a ``what`` file (a trace, an outage list; gzip detected by its magic
    bytes), at most ``MAX_INPUT_BYTES`` of it, or an ``InputError`` naming the file. Line
    endings are read as Python's text files read them: ``\r\n`` and a lone ``\r`` (old
    Mac files) end a line as ``\n`` does."""
    p = Path(path)
    check_regular_file(p, f"{what} file")            # a pipe or a device: reading it may never end
    try:
        with p.open("rb") as f:
            data = read_bounded(f, str(p), what)
    except FileNotFoundError:
        raise InputError(f"{what} file not found", file=str(p)) from None
    except IsADirectoryError:
        article = "an" if what[:1] in "aeiou" else "a"
        raise InputError(f"is a directory, not {article} {what} file", file=str(p)) from None
    except OSError as e:                              # permission, a name too long, a link loop
        raise InputError(f"cannot read the {what} file: {e.strerror or e}", file=str(p)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start})", file=str(p)) from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


class CsvRows:
    """CSV rows after a header, with line numbers and typed field getters."""

    def __init__(self, text: str, label: str, columns: tuple[str, ...], skip_lines: int = 0):
        self.label = label
        lines = text.lstrip("\ufeff").split("\n")[skip_lines:]
        self.offset = skip_lines
        self.reader = csv.reader(io.StringIO("\n".join(lines)))
        try:
            header = next(self.reader)
        except StopIteration:
            raise InputError("missing CSV header", file=label, line=skip_lines + 1) from None
        except csv.Error as e:
            raise InputError(f"malformed CSV: {e}", file=label, line=skip_lines + 1) from None
        self.header = [h.strip() for h in header]
        missing = [c for c in columns if c not in self.header]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}", file=label, line=skip_lines + 1,
                             field=missing[0])
        dup = [c for c in columns if self.header.count(c) > 1]
        if dup:
            raise InputError("duplicate column", file=label, line=skip_lines + 1, field=dup[0])
        self.idx = {c: self.header.index(c) for c in columns}

    def __iter__(self):
        start = self.offset + self.reader.line_num + 1
        while True:
            try:
                rec = next(self.reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise InputError(f"malformed CSV: {e}", file=self.label,
                                 line=self.offset + self.reader.line_num) from None
            line = start
            start = self.offset + self.reader.line_num + 1
            if not rec or (len(rec) == 1 and not rec[0].strip()):
                continue
            if len(rec) != len(self.header):
                raise InputError(f"expected {len(self.header)} fields, got {len(rec)}", file=self.label, line=line)
            yield line, rec

    # typed getters -----------------------------------------------------------------
    def err(self, line: int, field: str, msg: str) -> InputError:
        return InputError(msg, file=self.label, line=line, field=field)

    def raw(self, rec, c):
        return rec[self.idx[c]]

    def int(self, rec, line, c, minimum: int = 1, optional: bool = False,
            maximum: int | None = None) -> int | None:
        s = rec[self.idx[c]].strip()
        if not s and optional:
            return None
        try:
            v = int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                raise self.err(line, c, f"not an integer: {s!r}") from None
            if not (math.isfinite(f) and f.is_integer()):
                raise self.err(line, c, f"not an integer: {s!r}") from None
            v = int(f)
        if v < minimum:
            raise self.err(line, c, f"must be >= {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.err(line, c, f"must be <= {maximum:.3g}, got {s} (an absurd value would make the "
                                    f"simulated span endless)")
        return v

    def float(self, rec, line, c, minimum: float | None = 0.0, optional: bool = False,
              strict_min: bool = False) -> float | None:
        s = rec[self.idx[c]].strip()
        if not s and optional:
            return None
        try:
            v = float(s)
        except ValueError:
            raise self.err(line, c, f"not a number: {s!r}") from None
        if not math.isfinite(v):
            raise self.err(line, c, f"must be finite, got {s!r}")
        if minimum is not None and (v <= minimum if strict_min else v < minimum):
            raise self.err(line, c, f"must be {'>' if strict_min else '>='} {minimum}, got {s!r}")
        return v

    def bounded(self, rec, line, c, bound: Range) -> float:
        """A number within ``bound`` (instances/limits.py; an int when it is ``integer``)."""
        return bound.check(rec[self.idx[c]].strip(), file=self.label, line=line, field=c)

    def time(self, rec, line, c, minimum: float | None = 0.0, optional: bool = False) -> float | None:
        """A time or duration in seconds: finite, ``>= minimum`` and at most ``MAX_TIME_S``
        (``instances.limits``)."""
        v = self.float(rec, line, c, minimum=minimum, optional=optional)
        if v is not None and v > MAX_TIME_S:
            raise self.err(line, c, f"{TIME_BOUND}, got {rec[self.idx[c]].strip()}")
        return v

    def model(self, rec, line, c) -> str:
        try:
            return canonical_model_name(rec[self.idx[c]])
        except InputError as e:         # a config.json's own error names that file and its key
            raise self.err(line, c, str(e) if e.file else e.reason) from None

    def gpu(self, rec, line, c, optional: bool = False) -> str | None:
        s = rec[self.idx[c]].strip()
        if not s and optional:
            return None
        try:
            return canonical_gpu_name(s)
        except InputError as e:
            raise self.err(line, c, e.reason) from None
