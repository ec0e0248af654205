"""Every relative link of README.md, docs/ and bench/NOTES.md points to a file that exists, and
every #anchor into a Markdown file to one of its headings (GitHub's rule for heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "NOTES.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def heading_ids(markdown: str) -> set[str]:
    """GitHub's ids: lower case, punctuation but '-' and '_' dropped, spaces to '-'; a repeated
    heading gets -1, -2, ..."""
    ids: set[str] = set()
    for title in re.findall(r"^#+ (.*)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in ids:
            n += 1
            candidate = f"{slug}-{n}"
        ids.add(candidate)
    return ids


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in heading_ids(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_and_headings(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title: one (two)\n\n## Title: one (two)\n")
    assert heading_ids((tmp_path / "a.md").read_text()) == {"title-one-two", "title-one-two-1"}
    page = tmp_path / "b.md"
    page.write_text(
        "[x](a.md#title-one-two-1) [y](missing.md) [z](a.md#nothing) [w](https://e.org/m.md)\n"
        "```\n[v](inside-a-fence.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "a.md#nothing: no heading #nothing in a.md",
    ]
