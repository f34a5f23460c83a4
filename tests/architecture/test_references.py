"""No reference to something the repository does not hold: every text file git tracks — code and its comments,
schemas, documents — cites the protocol by the requirement IDs and areas of ``docs/reference.md``, never a
protocol document the repository does not ship; and every relative link of a Markdown file names a file that
exists."""

from __future__ import annotations

import ast
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


# A section number of an unshipped document ("§8.9"), a numbered seed or the interop notes.
# A public standard's own section ("RFC 4648 §4") is a citation the user can follow, so it is allowed.
INTERNAL = re.compile(r"(?<!RFC \d{4} )§\s?\d|\bseed 0\d\d\b|" + "SDK-" + "INTEROP", re.IGNORECASE)


def internal_citations_in_text(path: Path, root: Path = ROOT) -> list[str]:
    """Every line of a document or schema that cites a section number, a seed or an internal note."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [f"{path.relative_to(root)}:{n}" for n, line in enumerate(text.splitlines(), 1) if INTERNAL.search(line)]


def internal_citations_in_strings(path: Path, root: Path = ROOT) -> list[str]:
    """Every string of a module that can reach a user (a message, a help text, a table cell) and cites one.

    Docstrings and other bare string statements are read only by maintainers, so they are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [
        f"{path.relative_to(root)}:{n.lineno}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare and INTERNAL.search(n.value)
    ]


def _user_facing_documents() -> list[Path]:
    return [
        p
        for p in _tracked(".md", ".json", ".yaml", ".yml", ".html")
        if p.relative_to(ROOT).parts[0] in ("schemas", "docs", "bench") or p.parent == ROOT
    ]


def test_no_document_or_schema_cites_a_section_number_or_a_seed() -> None:
    files = _user_facing_documents()
    assert len(files) > 50
    assert [hit for path in files for hit in internal_citations_in_text(path)] == []


def test_no_user_facing_string_cites_a_section_number_or_a_seed() -> None:
    files = [p for p in _tracked(".py") if p.relative_to(ROOT).parts[0] in ("suite", "reference_server")]
    assert len(files) > 50
    assert [hit for path in files for hit in internal_citations_in_strings(path)] == []


def test_the_scans_find_a_planted_citation(tmp_path: Path) -> None:
    schema = tmp_path / "probe.schema.json"
    schema.write_text('{"description": "Run status (§9.1)."}\n{"description": "base64 (RFC 4648 §4)"}\n')
    assert internal_citations_in_text(schema, tmp_path) == ["probe.schema.json:1"]
    module = tmp_path / "probe.py"
    module.write_text(
        '"""A docstring may say §9.1."""\n'
        'MESSAGE = "a retry is a new task (§11.6)"\n'
        'NOTE = "as se'
        'ed 003 says"\n'
        'OK = "standard base64 (RFC 4648 §4)"\n',
        encoding="utf-8",
    )
    assert internal_citations_in_strings(module, tmp_path) == ["probe.py:2", "probe.py:3"]


# The notes the project was written from, which nobody else has: no comment or docstring names them either.
NOTES = re.compile(r"\b[Ss]eed 0\d\d\b|" + "SDK-" + "INTEROP")


def test_no_file_names_the_notes_the_project_was_written_from() -> None:
    files = _tracked(*TEXT)
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if NOTES.search(line)
    ]
    assert hits == []
    assert NOTES.search("# one valid lease (se" + "ed 003)")
    assert not NOTES.search('mktemp("sdk-interop")')
