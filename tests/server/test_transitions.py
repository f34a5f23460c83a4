"""The reference server's state changes go through the model's tables, and every row of them is used.

Two proofs, one each way:

* **No status beside the tables.** No SQL statement of the server writes a status literal: every status is
  a parameter, the answer of :func:`reference_server.transitions.step` (or a machine's initial state).
* **No table row without a code path.** The server's own tests are run once more with the transition trace
  on (``RS_TRANSITION_TRACE``); every ``(machine, state, event)`` row of every lifecycle table must have been
  answered by some code path of the server. A row nobody steps through is either dead model or a path the
  server forgot.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_server.transitions import TRACE_ENV, step
from suite.protocol.errors import IllegalTransition
from suite.protocol.lifecycles import ALL_LIFECYCLES, RUN, RunEvent, RunStatus
from suite.protocol.sessions import SESSION

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "reference_server"

# A literal status in the SET part of an UPDATE, or any quoted literal in the VALUES of an INSERT that
# names a status column.
_SET_STATUS = re.compile(r"\bSET\b(?:(?!\bWHERE\b).)*?\bstatus\s*=\s*'", re.S | re.I)


def _sql_strings(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            yield node.lineno, "{}".join(parts)


def _literal_status_writes(text: str) -> bool:
    if re.search(r"\bUPDATE\b", text) and _SET_STATUS.search(text):
        return True
    insert = re.search(r"\bINSERT\b.*?\((?P<cols>[^)]*)\)\s*VALUES\s*\((?P<vals>[^)]*)\)", text, re.S | re.I)
    return bool(insert and re.search(r"\bstatus\b", insert["cols"]) and "'" in insert["vals"])


def test_no_sql_statement_writes_a_status_literal() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text.strip()[:90]}"
        for path in sorted(SERVER.rglob("*.py"))
        for line, text in _sql_strings(path)
        if _literal_status_writes(text)
    ]
    assert found == []


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE runs SET status = 'waiting' WHERE run_id = ?",
        "UPDATE workflow_tasks SET attempt = 1, status = 'ready' WHERE task_id = ?",
        "INSERT INTO timers (timer_id, status) VALUES (?, 'pending')",
    ],
)
def test_the_literal_probe_finds_a_literal_status(sql: str) -> None:
    assert _literal_status_writes(sql)


def test_the_literal_probe_accepts_reads_and_parameters() -> None:
    assert not _literal_status_writes("UPDATE runs SET status = ? WHERE run_id = ? AND status = 'pending'")
    assert not _literal_status_writes("INSERT INTO timers (timer_id, status) VALUES (?, ?)")
    assert not _literal_status_writes("INSERT INTO meta (key, value) VALUES ('schema_version', ?)")


def test_an_illegal_pair_is_the_models_typed_error() -> None:
    with pytest.raises(IllegalTransition) as info:
        step(RUN, RunStatus.COMPLETED, RunEvent.WAKE)
    assert (info.value.machine, info.value.state, info.value.event) == ("run", RunStatus.COMPLETED, RunEvent.WAKE)


def _all_rows() -> set[tuple[str, str, str]]:
    machines = (*ALL_LIFECYCLES, SESSION)
    return {(m.name, state.value, event.value) for m in machines for (state, event) in m.table}


@pytest.mark.slow
def test_every_table_row_is_used_by_a_code_path_of_the_server(tmp_path: Path) -> None:
    trace = tmp_path / "transitions.txt"
    env = {**os.environ, TRACE_ENV: str(trace)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "tests" / "server"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "--deselect",
            f"{Path(__file__).relative_to(ROOT)}::test_every_table_row_is_used_by_a_code_path_of_the_server",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    used = {tuple(line.split()) for line in trace.read_text(encoding="utf-8").splitlines() if line.strip()}
    assert used <= _all_rows(), "the trace names a pair the tables do not have"
    unused = sorted(_all_rows() - used)
    assert unused == [], "\n".join(" ".join(row) for row in unused)
