"""docs/reference.md is what the requirement registry generates, and every citation names a real section."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite import reference
from suite.protocol.documents import DOCUMENTS, READING_NOTES, READINGS, WORKER_PROTOCOL, Citation, cite
from suite.protocol.requirements import REGISTRY, Area, by_area

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_the_generated_one() -> None:
    committed = (ROOT / reference.PATH).read_text(encoding="utf-8")
    assert committed == reference.render(), "run: python -m suite.reference > docs/reference.md"


def test_check_mode_tells_a_stale_file_from_a_current_one(tmp_path: Path) -> None:
    current = tmp_path / "reference.md"
    current.write_text(reference.render(), encoding="utf-8")
    assert reference.main(["--check", str(current)]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(reference.render().replace("MUST", "SHOULD", 1), encoding="utf-8")
    assert reference.main(["--check", str(stale)]) == 1
    assert reference.main(["--check", str(tmp_path / "absent.md")]) == 4


def test_every_requirement_appears_under_its_area_with_its_sentence_and_provenance() -> None:
    text = reference.render()
    for area in Area:
        body = text.split(f"\n## {area.value.replace('-', ' ').capitalize()}\n", 1)[1].split("\n## ", 1)[0]
        for req in by_area(area):
            entry = body.split(f"### {req.id}\n", 1)[1].split("\n### ", 1)[0]
            assert f"**{req.level.value}** · since 1.{req.minor}" in entry
            assert req.sentence in entry
            assert f"From: {req.source}." in entry


def test_every_cited_document_and_reading_is_described() -> None:
    text = reference.render()
    cited = {c.document for req in REGISTRY.values() for c in req.cites}
    assert cited <= set(DOCUMENTS)
    for document in cited - {READINGS}:
        assert f"### {document.name}\n\nPublished: {document.published}." in text
    for section in {c.section for req in REGISTRY.values() for c in req.cites if c.document is READINGS}:
        assert f"### {section}\n\n{READING_NOTES[section]}" in text


def test_a_citation_names_a_section_its_document_declares() -> None:
    assert str(cite(WORKER_PROTOCOL, "Protocol version")) == "Durable Workflow worker protocol 1.20, Protocol version"
    with pytest.raises(ValueError, match="has no section"):
        Citation(WORKER_PROTOCOL, "§3.1")


def test_anchors_are_the_ones_a_renderer_gives_the_headings() -> None:
    assert reference.anchor("VERSION-MISSING") == "version-missing"
    assert reference.anchor("Long poll") == "long-poll"
