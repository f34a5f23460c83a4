"""Wording the suite prints: a counted noun agrees with its number ("1 requirement", "2 requirements"), through
the one helper ``suite.text.plural``; a refusal of ``--certify`` is a whole sentence that says what to do."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from suite.text import plural
from tests.suite.runs import pytest_cli

SUITE = Path(__file__).resolve().parents[2] / "suite"
# A constant right after a count that begins with a plural-looking noun: " requirements", " items ran", " hits)".
_PLURAL_AFTER = re.compile(r"^ (?:[a-z][a-z-]* )?[a-z][a-z-]*[^s]s\b")
# What counts: len(…), sum(…) or a value read as a count.
_COUNT_CALLS = {"len", "sum"}
_COUNT_KEYS = {"checked", "applicable", "items", "items_run", "passed", "failed"}


def _is_count(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in _COUNT_CALLS
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in _COUNT_KEYS
    return False


def _counted_plurals(source: str) -> list[tuple[int, str]]:
    """Every f-string of ``source`` that writes a count and then a fixed plural noun, or a ``(s)``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.search(r"\w\(s\)", node.value.replace("http(s)", "http"))
        ):
            found.append((node.lineno, node.value))
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, after in zip(node.values, node.values[1:], strict=False):
            if (
                isinstance(value, ast.FormattedValue)
                and _is_count(value.value)
                and isinstance(after, ast.Constant)
                and isinstance(after.value, str)
                and _PLURAL_AFTER.match(after.value)
            ):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_a_count_with_a_fixed_plural_and_accepts_the_helper() -> None:
    assert _counted_plurals('f"{len(xs)} requirements checked"')
    assert _counted_plurals("f\"{r['checked']} of {r['applicable']} requirements\"")
    assert _counted_plurals('f"{len(a)}/{total} cells reached ({sum(h)} hits)"')  # "(1 hits)"
    assert _counted_plurals('"appears 1 time(s)"')
    assert _counted_plurals("f\"{plural(len(xs), 'requirement')} checked\"") == []
    assert _counted_plurals('f"{len(xs)} of them"') == []


def test_no_count_in_the_suite_is_written_with_a_fixed_plural() -> None:
    """``1 requirements``, ``1 items did not run``, ``(1 hits)``, ``1 time(s)``: every counted noun goes through
    ``suite.text.plural``."""
    offenders = [
        f"{path.relative_to(SUITE.parent)}:{line}: {text}"
        for path in sorted(SUITE.rglob("*.py"))
        for line, text in _counted_plurals(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


@pytest.mark.parametrize(("n", "text"), [(0, "0 hits"), (1, "1 hit"), (2, "2 hits")])
def test_plural_agrees_with_its_number(n: int, text: str) -> None:
    assert plural(n, "hit") == text


def test_a_refusal_of_certify_is_one_sentence_naming_the_options_and_the_way_out(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, "--target=http://127.0.0.1:9", "--certify", "--fuzz-examples", "5", "-k", "x")
    assert run.returncode == 4, run.output[-2000:]
    (line,) = [line for line in run.output.splitlines() if line.startswith("ERROR: ")]
    assert line == (
        "ERROR: --certify cannot run with -k 'x'; --fuzz-examples 5 (below the default 20): a certification run "
        "checks every requirement at the default budgets, straight to the target; leave them out, or run without "
        "--certify"
    )
