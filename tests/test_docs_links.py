"""Every relative link in the README and docs/ leads somewhere: to a file of the repository,
and to a heading of it when the link names one (``file.md#anchor``), as GitHub renders the
anchors. Documents were rewritten and split often (docs/results.md was cut from the
README); a link left pointing at a moved section fails here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), not images
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation but hyphens
    dropped, spaces made hyphens; a repeated heading gets -1, -2..."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(2).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(files: list[Path]) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``files`` that leads nowhere
    (links inside code blocks and to other sites are not checked)."""
    broken = []
    for doc in files:
        fenced = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:...
                    continue
                path, _, fragment = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                where = doc.name if doc.parent == ROOT else f"{doc.parent.name}/{doc.name}"
                if not dest.exists():
                    broken.append(f"{where}:{number}: {target} (no such file)")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(
                        dest.read_text()):
                    broken.append(f"{where}:{number}: {target} (no such heading)")
    return broken


def test_readme_and_docs_links_resolve() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(files) > 5
    assert broken_links(files) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The check itself: a missing file, a missing heading, a repeated heading's anchor."""
    (tmp_path / "docs").mkdir()
    other = tmp_path / "docs" / "other.md"
    other.write_text("# Other\n\n## Small products: one region\n\n## Notes\n\n## Notes\n")
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("[ok](other.md#small-products-one-region) [twice](other.md#notes-1)\n"
                   "[gone](missing.md) [no heading](other.md#large-products)\n"
                   "```\n[in code](missing.md)\n```\n[site](https://example.com/x.md)\n")
    assert broken_links([doc]) == [
        "docs/page.md:2: missing.md (no such file)",
        "docs/page.md:2: other.md#large-products (no such heading)",
    ]
