"""The protocol reference the suite ships, ``docs/reference.md``, generated from the requirement registry.

``python -m suite.reference`` prints it; ``python -m suite.reference --check PATH`` exits 1 when the file at
``PATH`` is not what the registry generates (``tests/unit/test_reference.py`` holds the committed file to it).
Every requirement by area, with its level, the minor that introduced it, its sentence and where it comes
from; then the documents cited, where each is published, and the suite's readings.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from suite.protocol.documents import DOCUMENTS, READING_NOTES, READINGS, Document
from suite.protocol.requirements import REGISTRY, Area, Requirement, by_area
from suite.text import plural

__all__ = ["PATH", "anchor", "main", "render"]

PATH = "docs/reference.md"


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading: lower case, punctuation dropped, spaces → -."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _area_title(area: Area) -> str:
    return area.value.replace("-", " ").capitalize()


def _cited_sections(document: Document) -> list[str]:
    cited = {c.section for req in REGISTRY.values() for c in req.cites if c.document is document}
    return [section for section in document.sections if section in cited]


def _requirement(req: Requirement) -> list[str]:
    lines = [f"### {req.id}", "", f"**{req.level.value}** · since 1.{req.minor}", "", req.sentence, ""]
    lines.append("From: " + "; ".join(str(c) for c in req.cites) + ".")
    if req.profile is not None:
        lines.append(f"Covered through the test profile's `{req.profile}`.")
    return [*lines, ""]


def render() -> str:
    """docs/reference.md, as the registry says it."""
    areas = [area for area in Area if by_area(area)]
    out = [
        "# Durable Workflow worker protocol 1.20: the requirements",
        "",
        "Every rule the suite checks, by area: its stable ID (the one reports, `-k` and `--list-requirements`",
        "use), its level (MUST, SHOULD, MAY), the protocol minor that introduced it, its sentence, and the",
        "sections of the public documents it comes from (listed under [Documents](#documents)). Generated",
        "from the requirement registry by `python -m suite.reference > docs/reference.md`; do not edit by hand.",
        "",
        f"{plural(len(REGISTRY), 'requirement')} in {plural(len(areas), 'area')}:",
        "",
    ]
    out += [f"- [{_area_title(a)}](#{anchor(_area_title(a))}) ({len(by_area(a))})" for a in areas]
    out += ["- [Documents](#documents)", "- [Readings](#readings)", ""]
    for area in areas:
        out += [f"## {_area_title(area)}", ""]
        for req in by_area(area):
            out += _requirement(req)
    out += ["## Documents", ""]
    for document in DOCUMENTS:
        if document is READINGS:
            continue
        out += [f"### {document.name}", "", f"Published: {document.published}.", "", "Sections cited:", ""]
        for section in _cited_sections(document):
            heading = document.sections[section]
            out.append(f"- {section}" + (f" (“{heading}”)" if heading else ""))
        out.append("")
    out += [
        "## Readings",
        "",
        "What the suite holds where the documents are silent or disagree (cited as “This suite's readings”).",
        "",
    ]
    for section in _cited_sections(READINGS):
        out += [f"### {section}", "", READING_NOTES[section], ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from the generated reference")
    args = parser.parse_args(argv)
    text = render()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    path = Path(args.check)
    if not path.is_file():
        print(f"{path}: no such file; write it with: python -m suite.reference > {path}", file=sys.stderr)
        return 4
    if path.read_text(encoding="utf-8") != text:
        print(f"{path} is out of date; write it again with: python -m suite.reference > {path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
