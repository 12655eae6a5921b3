"""Prometheus' text exposition format, read strictly (the service's ``/metrics``)."""
from __future__ import annotations

import re


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, checked line by line: ``name{labels}`` -> value."""
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')
    out, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = sample.match(line)
        assert m, f"not a sample line: {line!r}"
        assert m.group(1) in typed, f"{m.group(1)} has no # TYPE line before it"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
