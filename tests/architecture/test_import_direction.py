"""The layers of ARCHITECTURE.md, enforced.

schemas → suite.protocol (pure model) → (reference_server | suite checks) → reports.
The pure model imports neither side and does no I/O and reads no clock; the suite never imports the
reference server (``--target=embedded`` starts it as its own process).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules whose import means I/O, concurrency or a clock: none belongs in the pure model.
IO_MODULES = {
    "asyncio",
    "h11",
    "http",
    "httpx",
    "selectors",
    "socket",
    "sqlite3",
    "subprocess",
    "threading",
    "time",
    "urllib",
    "multiprocessing",
    "signal",
}
# Clock reads spelled through datetime.
CLOCK_CALLS = {"now", "utcnow", "today"}


def python_files(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.lineno, node.module


def violations(package: str, forbidden: set[str], allow: frozenset[str] = frozenset()) -> list[str]:
    found = []
    for path in python_files(package):
        for lineno, module in imported_modules(path):
            if any(module == a or module.startswith(a + ".") for a in allow):
                continue
            top = module.split(".")[0]
            if module in forbidden or top in forbidden or any(module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{lineno} imports {module}")
    return found


def test_schemas_import_no_project_package() -> None:
    assert violations("schemas", {"suite", "reference_server"}) == []


def test_protocol_model_imports_neither_side_nor_io() -> None:
    forbidden = {"reference_server", "suite"} | IO_MODULES
    assert violations("suite/protocol", forbidden, allow=frozenset({"suite.protocol"})) == []


def test_protocol_model_reads_no_clock() -> None:
    found = []
    for path in python_files("suite/protocol"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_CALLS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} calls .{node.func.attr}()")
    assert found == []


def test_suite_never_imports_the_reference_server() -> None:
    assert violations("suite", {"reference_server"}) == []


def test_reference_server_uses_only_the_model_from_the_suite() -> None:
    assert violations("reference_server", {"suite"}, allow=frozenset({"suite.protocol"})) == []


@pytest.mark.parametrize("package", ["suite", "reference_server", "schemas"])
def test_packages_are_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
