"""Node outages for a simulation: when nodes leave service (maintenance, failure) and
come back. A CSV file with the header ``node,start_s,end_s`` (an optional fourth column
``reason`` is kept for the reader); ``node`` is a node id (0-based, in the cluster's group
order) or a host name; times are on the trace's clock (the jobs' ``arrival_s``); an empty
``end_s`` means the node never comes back. Errors are ``InputError`` naming the file, the
line and the field."""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from .cluster import ClusterSpec
from .csv_rows import CsvRows, read_text
from .errors import InputError
from .limits import MAX_TIME_S, TIME_BOUND, check_time, is_number, show_number
from .paths import check_regular_file, write_output

COLUMNS = ("node", "start_s", "end_s")


@dataclass(frozen=True)
class Outage:
    node: int
    start_s: float
    end_s: float = math.inf             # inf: it never comes back
    reason: str = ""

    def __post_init__(self):
        if not (math.isfinite(self.start_s) and self.end_s > self.start_s):
            raise InputError(f"an outage needs a finite start before its end, got {self.start_s} - {self.end_s}",
                             field="end_s")
        check_time(self.start_s, field="start_s", minimum=None)
        if self.end_s != math.inf:
            check_time(self.end_s, field="end_s", minimum=None)

    def covers(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


def down_at(outages: tuple[Outage, ...], t: float) -> frozenset[int]:
    """The nodes out of service at time ``t``."""
    return frozenset(o.node for o in outages if o.covers(t))


def load_outages(path: str | Path, cluster: ClusterSpec) -> tuple[Outage, ...]:
    label = str(path)
    check_regular_file(path, "outage file")
    try:
        text = read_text(path, "outage")
    except NotADirectoryError:
        raise InputError("outage file not found (a part of its path is a file, not a folder)", file=str(path)) from None
    except OSError as e:                    # past the cases read_text names (a name too long, an I/O error)
        raise InputError(f"cannot read the outage file: {e.strerror or e}", file=label) from None
    header = next(csv.reader([text.lstrip("\ufeff").split("\n", 1)[0]]), [])
    if tuple(h.strip() for h in header[:3]) != COLUMNS or len(header) > 4 or \
            (len(header) == 4 and header[3].strip() != "reason"):       # (another name would be read as the reason)
        raise InputError(f"the first line must be the header {','.join(COLUMNS)}[,reason], got {header!r}",
                         file=label, line=1)
    rows = CsvRows(text, label, COLUMNS)
    out = []
    for line, rec in rows:
        try:
            node = cluster.node_id(rows.raw(rec, "node"), field="node")
            start = rows.time(rec, line, "start_s", minimum=None)
            end = rows.time(rec, line, "end_s", minimum=None, optional=True)
            out.append(Outage(node, start, math.inf if end is None else end,
                              rec[3].strip() if len(header) > 3 else ""))
        except InputError as e:
            raise InputError(e.reason, file=label, line=line, field=e.field) from None
    return tuple(sorted(out, key=lambda o: (o.start_s, o.node)))


ROUND_S = 0.1                           # synthetic times are written to a tenth of a second
MAX_SYNTHETIC_OUTAGES = 1_000_000       # about a second to draw; far past any useful failure model


def synthetic_outages(cluster: ClusterSpec, *, mtbf_h: float, repair_h: float, start_s: float, hours: float,
                      seed: int = 0) -> tuple[Outage, ...]:
    """Node failures as a Poisson process per node (mean time between failures ``mtbf_h``
    hours of service) with exponential repairs (mean ``repair_h`` hours), over ``hours``
    from ``start_s``; seeded, so the same arguments give the same outages. Synthetic: no
    correlation between nodes (a switch or power domain failing together) and no wear.
    Times are rounded to ``ROUND_S``; a repair shorter than that lasts ``ROUND_S``.
    Arguments that would give more than ``MAX_SYNTHETIC_OUTAGES`` outages (on average), or
    times past ``instances.limits.MAX_TIME_S``, are an ``InputError`` naming the argument."""
    import random
    for name, v in (("mtbf_h", mtbf_h), ("repair_h", repair_h), ("hours", hours)):
        if not (is_number(v) and v > 0 and (isinstance(v, int) or math.isfinite(v))):
            raise InputError(f"must be a finite number > 0, got {v!r}", field=name)
        if v > MAX_TIME_S / 3600.0:
            shown = show_number(v) if isinstance(v, int) else format(v, "g")
            raise InputError(f"{shown} h is past the bound on durations: a time {TIME_BOUND}", field=name)
    end = start_s + hours * 3600.0
    if not end < MAX_TIME_S:
        raise InputError(f"{hours:g} h is too long a span: its times would pass {MAX_TIME_S:.3g} s (about "
                         f"{(MAX_TIME_S - max(start_s, 0.0)) / 3600:.3g} h from the start); every time "
                         f"{TIME_BOUND}", field="hours")
    nodes = cluster.nodes()
    expected = len(nodes) * hours / (mtbf_h + repair_h)
    if expected > MAX_SYNTHETIC_OUTAGES:
        raise InputError(f"{len(nodes)} nodes failing every {mtbf_h:g} h (repaired in {repair_h:g} h) over "
                         f"{hours:g} h would make about {expected:.3g} outages, more than "
                         f"{MAX_SYNTHETIC_OUTAGES:,}: give a longer mean time between failures or a shorter span",
                         field="mtbf_h")
    rng = random.Random(seed)
    out = []
    for node in nodes:
        t = start_s + rng.expovariate(1.0 / mtbf_h) * 3600.0
        while t < end:
            back = t + rng.expovariate(1.0 / repair_h) * 3600.0
            down, up = round(t, 1), round(back, 1)
            if up <= down:                  # a repair shorter than the rounding: one step long, and
                up = round(down + ROUND_S, 1)   # the next failure after it (no overlap)
                back = max(back, up)
            out.append(Outage(node.node_id, down, up, "synthetic failure"))
            t = back + rng.expovariate(1.0 / mtbf_h) * 3600.0
    return tuple(sorted(out, key=lambda o: (o.start_s, o.node)))


def write_outages(outages: tuple[Outage, ...], path: str | Path, field: str | None = None) -> None:
    """Write ``outages`` as ``load_outages`` reads them; a failed write is an ``InputError``
    naming ``path`` and ``field`` (``paths.write_output``)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*COLUMNS, "reason"])
    for o in outages:
        w.writerow([o.node, repr(o.start_s), "" if math.isinf(o.end_s) else repr(o.end_s), o.reason])
    write_output(path, buf.getvalue(), field)
