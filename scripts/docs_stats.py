"""The documentation's size and shape, as issue 49 measured it: the README's lines, words and
longest line; each docs page's size; and, per reference page, the share that is measurements.

    python scripts/docs_stats.py [--root DIR] [--json]

A page's *measurement share* is the bytes under a heading that names a measurement
("Measured ...", "... measured here") or a date (``2026-11-30``, ``2 Dec``), subsections
included, over the page's bytes. Dates and commit hashes are counted in the text outside
link targets (a link to ``results/2026-12-04-soak.md`` is not a date in the text). The
tutorials (``extending.md``, ``operators.md``), the site's home page and ``docs/results/``
are not reference pages; the results are summarized as one line.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

NOT_REFERENCE = {"extending.md", "operators.md", "index.md"}
HEADING = re.compile(r"^(#{1,6}) (.*)$")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (?:Nov|Dec)\b|\b(?:Nov|Dec)[a-z]* \d{1,2}\b")
# 7 to 40 hex digits with at least one digit and one letter: a commit hash, not a word or a number
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
LINK_TARGET = re.compile(r"\]\([^)]*\)|\bresults/20\d\d-\d\d-\d\d-[\w.-]+")
MEASURED_HEADING = re.compile(r"\bmeasured\b", re.IGNORECASE)


def sections(text: str) -> list[tuple[int, str, int]]:
    """(level, heading, bytes) for each section; text before the first heading is level 0."""
    out: list[list] = [[0, "", 0]]
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else HEADING.match(line)
        if m:
            out.append([len(m.group(1)), m.group(2), 0])
        out[-1][2] += len(line.encode()) + 1
    return [(lvl, h, n) for lvl, h, n in out]


def measurement_bytes(text: str) -> int:
    """Bytes under a measurement heading, subsections included."""
    total, inside = 0, None            # inside: the level of the measurement heading we are under
    for lvl, head, n in sections(text):
        if inside is not None and lvl and lvl <= inside:
            inside = None
        if inside is None and lvl and (MEASURED_HEADING.search(head) or DATE.search(LINK_TARGET.sub("", head))):
            inside = lvl
        if inside is not None:
            total += n
    return total


def page_stats(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    plain = LINK_TARGET.sub("", text)
    size = len(text.encode())
    meas = measurement_bytes(text)
    return {"page": path.name, "bytes": size, "lines": text.count("\n"),
            "measurement_share": round(meas / size, 3) if size else 0.0,
            "dates": len(DATE.findall(plain)), "commit_hashes": len(HASH.findall(plain)),
            "reference": path.name not in NOT_REFERENCE}


def readme_stats(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    longest = max(lines, key=len) if lines else ""
    stands = []
    inside = False
    for line in lines:
        if line.startswith("## "):
            inside = line.lower().startswith("## where it stands")
        elif inside and line.startswith("|") and not set(line) <= set("|-: "):
            stands.append(line)
    cells = [c for row in stands for c in row.split("|")]
    return {"lines": len(lines), "words": len(text.split()), "bytes": len(text.encode()),
            "longest_line_chars": len(longest),
            "lines_over_200_chars": sum(len(l) > 200 for l in lines),
            "where_it_stands_rows": max(len(stands) - 1, 0),      # less the header row
            "where_it_stands_longest_cell_chars": max((len(c.strip()) for c in cells), default=0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    docs = args.root / "docs"
    pages = [page_stats(p) for p in sorted(docs.glob("*.md"))]
    results = sorted((docs / "results").glob("*.md")) if (docs / "results").is_dir() else []
    out = {"readme": readme_stats(args.root / "README.md"),
           "docs_bytes": sum(p.stat().st_size for p in docs.rglob("*.md")),
           "pages": pages,
           "results": {"files": len(results), "bytes": sum(p.stat().st_size for p in results)}}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    r = out["readme"]
    print(f"README: {r['lines']} lines, {r['words']} words, longest line {r['longest_line_chars']} chars "
          f"({r['lines_over_200_chars']} over 200); 'Where it stands': {r['where_it_stands_rows']} rows, "
          f"longest cell {r['where_it_stands_longest_cell_chars']} chars")
    print(f"docs/ (all .md): {out['docs_bytes'] / 1000:.0f} KB; docs/results/: {out['results']['files']} files, "
          f"{out['results']['bytes'] / 1000:.0f} KB")
    print(f"{'page':<24} {'KB':>6} {'lines':>6} {'measured':>9} {'dates':>6} {'hashes':>7}")
    for p in pages:
        kind = "" if p["reference"] else "  (tutorial or home)"
        print(f"{p['page']:<24} {p['bytes'] / 1000:6.1f} {p['lines']:6d} {p['measurement_share']:9.0%} "
              f"{p['dates']:6d} {p['commit_hashes']:7d}{kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
