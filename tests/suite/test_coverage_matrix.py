"""The coverage matrix in every report: results.json (valid against its schema), the terminal and report.html."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jsonschema import Draft202012Validator

import schemas
from suite.outcomes import Kind, Record
from suite.protocol.coverage import Actor, cell_key
from suite.registry import entries
from suite.reports import coverage_lines, render_html
from suite.results import Completeness, build_results
from tests.suite.runs import OPTIONS, RUN, complete_records, target

SCHEMA = Draft202012Validator(schemas.load_json("json/report.schema.json"))
EXPIRED_POLL = cell_key("workflow_task", "lease_expired", "poll", Actor.OTHER_WORKER)
READ = cell_key("run", "pending", "read_history", Actor.OPERATOR)


def _results(records: list[Record]) -> dict[str, Any]:
    info = target()
    return build_results(info, records, RUN, options=OPTIONS, completeness=Completeness(items=len(entries())))


def _machine(name: str, cells: dict[str, int], requirement: str) -> Record:
    return Record(Kind.MACHINE, f"machine:{name}", requirements=(requirement,), cells=cells)


def test_hits_are_summed_once_per_machine_and_shown_everywhere() -> None:
    records = [
        *complete_records(),
        # Two records of one machine carry the same whole-run counts: counted once.
        _machine("a", {EXPIRED_POLL: 2}, "LEASE-EXCLUSIVE"),
        _machine("a", {EXPIRED_POLL: 2}, "FENCE-OWNER"),
        _machine("b", {EXPIRED_POLL: 1, READ: 4}, "LEASE-EXCLUSIVE"),
    ]
    results = _results(records)
    SCHEMA.validate(results)
    rows = {r["entity"]: r for r in results["coverage_matrix"]}
    assert rows["workflow_task"]["reached"] == {EXPIRED_POLL: 3}
    assert rows["run"]["reached"] == {READ: 4}
    assert EXPIRED_POLL not in rows["workflow_task"]["not_reached"]
    assert all("cells" not in c for c in results["checks"])  # the per-machine counts live in the matrix alone
    lines = coverage_lines(results)
    assert any(line.startswith("coverage workflow_task: 1/") and "(3 hits)" in line for line in lines)
    page = render_html(results)
    assert "Coverage matrix" in page
    assert EXPIRED_POLL in page


def test_a_classifier_that_hits_a_ruled_out_cell_is_shown_as_the_suites_bug() -> None:
    impossible = cell_key("workflow_task", "leased", "complete", Actor.FORMER_HOLDER)
    results = _results([*complete_records(), _machine("a", {impossible: 1}, "LEASE-EXCLUSIVE")])
    row = next(r for r in results["coverage_matrix"] if r["entity"] == "workflow_task")
    assert row["impossible_hits"] == [impossible]
    assert any("classifier bug of the suite" in line for line in coverage_lines(results))


def test_a_record_without_cells_round_trips() -> None:
    rec = _machine("a", {READ: 1}, "LEASE-EXCLUSIVE")
    assert Record.from_json(rec.to_json()) == rec
    assert Record.from_json(replace(rec, cells=None).to_json()).cells is None
