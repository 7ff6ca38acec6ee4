"""The docs hold together: every relative link in README.md and docs/ reaches a file, every
#anchor a heading of that file, and the README's map links every page in docs/.

Anchors are made as GitHub makes them from a heading: the text without markup, lower-cased,
stripped of everything but letters, digits, `_`, `-` and spaces, spaces turned into `-`, and
`-1`, `-2`... added to a repeated one."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root: Path) -> list[Path]:
    """The project's own docs: README.md, everything under docs/, a README.md one folder down."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted(root.glob("*/README.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = _LINK.sub(lambda m: m.group(1), text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every inline link outside code."""
    found = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(_CODE_SPAN.sub("code", line)):
            found.append((number, match.group(2)))
    return found


def broken_links(root: Path) -> list[str]:
    """'file:line: target (why)' for each relative link or anchor that leads nowhere."""
    problems = []
    for source in markdown_files(root):
        if not source.is_file():
            continue
        for number, target in links(source):
            if not target or _EXTERNAL.match(target):
                continue
            where = f"{source.relative_to(root)}:{number}: {target}"
            path_part, _, anchor = target.partition("#")
            dest = (source.parent / path_part).resolve() if path_part else source
            if not dest.is_relative_to(root) or not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading makes #{anchor})")
    return problems


def unmapped_docs(root: Path) -> list[str]:
    """Pages in docs/ that README.md does not link to."""
    linked = {(root / target.partition("#")[0]).resolve() for _, target in links(root / "README.md")}
    return [str(page.relative_to(root)) for page in sorted((root / "docs").rglob("*.md")) if page.resolve() not in linked]


def test_every_relative_link_and_anchor_resolves() -> None:
    assert broken_links(ROOT) == []


def test_the_readme_maps_every_docs_page() -> None:
    assert unmapped_docs(ROOT) == []


def test_broken_links_and_unmapped_pages_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# ferry\n\n## A `ferry lag` tour\n\n"
        "[ok](#a-ferry-lag-tour) [ok](docs/a.md#dead-letters) [gone](#using-it)\n"
        "[missing](docs/nope.md) [stale](docs/a.md#metrics) `[code](#not-a-link)`\n\n"
        "```\n[fenced](#not-a-link-either)\n```\n"
    )
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Dead letters\n\n[back](../README.md#a-ferry-lag-tour)\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n")

    assert broken_links(tmp_path) == [
        "README.md:5: #using-it (no heading makes #using-it)",
        "README.md:6: docs/nope.md (no such file)",
        "README.md:6: docs/a.md#metrics (no heading makes #metrics)",
    ]
    assert unmapped_docs(tmp_path) == ["docs/b.md"]


def test_anchors_follow_githubs_rules(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Requests straight from Kafka (and Redis) producers\n"
        "## GPU backends: TensorRT and ONNX Runtime's TensorRT provider\n"
        "### config.pbtxt fields ferry reads\n"
        "## Notes\n## Notes\n"
        "```\n# not a heading\n```\n"
    )
    assert anchors(page) == {
        "requests-straight-from-kafka-and-redis-producers",
        "gpu-backends-tensorrt-and-onnx-runtimes-tensorrt-provider",
        "configpbtxt-fields-ferry-reads",
        "notes",
        "notes-1",
    }
