"""No reference to something the repository does not hold: every text file git tracks — code and its comments,
schemas, documents — cites the protocol by the requirement IDs and areas of ``docs/reference.md``, never a
protocol document the repository does not ship; and every relative link of a Markdown file names a file that
exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".yaml", ".yml", ".json", ".toml", ".sh", ".sql", ".html", ".avsc", ".txt", ".cfg")
# Spelled in two pieces so that this file does not match itself.
UNSHIPPED = ("PROTOCOL" + ".md", "known-deviation" + " list")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked(*suffixes: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in names.split() if name.endswith(suffixes) and (ROOT / name).is_file()]


def unshipped_citations(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [
        f"{path.relative_to(root)}:{n}: {needle}"
        for n, line in enumerate(text.splitlines(), 1)
        for needle in UNSHIPPED
        if needle in line
    ]


def test_nothing_cites_a_document_the_repository_does_not_hold() -> None:
    files = _tracked(*TEXT)
    assert len(files) > 200  # the scan reads the tree, not an empty list
    assert [hit for path in files for hit in unshipped_citations(path)] == []


def test_the_scan_finds_a_citation_in_a_comment(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(f"x = 1\n# the replay rule ({UNSHIPPED[0]} §7.3)\n", encoding="utf-8")
    assert unshipped_citations(probe, tmp_path) == [f"probe.py:2: {UNSHIPPED[0]}"]


def test_every_relative_link_of_a_markdown_file_exists() -> None:
    broken = [
        f"{path.relative_to(ROOT)} links {target}"
        for path in _tracked(".md")
        for target in LINK.findall(path.read_text(encoding="utf-8"))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not (path.parent / target).exists()
    ]
    assert broken == []
