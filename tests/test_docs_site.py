"""The docs site's bookkeeping that `mkdocs build --strict` (scripts/test.sh) does not do by
itself: every study in docs/results/ is listed in results/index.md, newest first, and every
page under docs/ is in mkdocs.yml's navigation (strict mode only warns about the pages left
out; this names them)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_results_index_lists_every_study_newest_first():
    index = (DOCS / "results" / "index.md").read_text(encoding="utf-8")
    listed = re.findall(r"\]\((20\d\d-\d\d-\d\d-[^)#]+\.md)\)", index)
    studies = sorted(p.name for p in (DOCS / "results").glob("20*.md"))
    assert sorted(listed) == studies, set(studies) ^ set(listed)
    dates = [name[:10] for name in listed]
    assert dates == sorted(dates, reverse=True), "results/index.md: not newest first"


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    in_nav = set(re.findall(r"([\w./-]+\.md)\s*$", nav, flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - in_nav == set(), f"not in mkdocs.yml's nav: {sorted(pages - in_nav)}"
    assert in_nav - pages == set(), f"in the nav but missing: {sorted(in_nav - pages)}"


def test_the_readme_fits_on_two_screens_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md: {len(lines)} lines (at most 200)"
    long = [i for i, line in enumerate(lines, 1) if len(line) >= 200]
    assert not long, f"README.md: lines {long} are 200 characters or more"
    targets = (re.findall(r"\]\(((?:docs|examples|bench)/[^)#\s]+)", text)
               + re.findall(r"^\[[^\]]+\]: (\S+)$", text, re.M))
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
    rows = [line for line in text.split("## Where it stands", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| figure")]
    assert 0 < len(rows) <= 12, f"'Where it stands' has {len(rows)} rows (at most 12)"
