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
from suite.results import Completeness, build_results, document_matrix
from tests.suite.runs import OPTIONS, RUN, all_cells, complete_records, results_of, target

SCHEMA = Draft202012Validator(schemas.load_json("json/report.schema.json"))
EXPIRED_POLL = cell_key("workflow_task", "lease_expired", "poll", Actor.OTHER_WORKER)
READ = cell_key("run", "pending", "read_history", Actor.OPERATOR)


def _results(records: list[Record]) -> dict[str, Any]:
    info = target()
    return build_results(info, records, RUN, options=OPTIONS, completeness=Completeness(items=len(entries())))


def _bare() -> list[Record]:
    """The complete run with no coverage counts of its own (the tests add the machines' counts they need)."""
    return [replace(r, cells=None) for r in complete_records()]


def _machine(name: str, cells: dict[str, int], requirement: str) -> Record:
    return Record(Kind.MACHINE, f"machine:{name}", requirements=(requirement,), cells=cells)


def test_hits_are_summed_once_per_machine_and_shown_everywhere() -> None:
    records = [
        *_bare(),
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
    results = _results([*_bare(), _machine("a", {impossible: 1}, "LEASE-EXCLUSIVE")])
    row = next(r for r in results["coverage_matrix"] if r["entity"] == "workflow_task")
    assert row["impossible_hits"] == [impossible]
    assert any("classifier bug of the suite" in line for line in coverage_lines(results))


def test_a_record_without_cells_round_trips() -> None:
    rec = _machine("a", {READ: 1}, "LEASE-EXCLUSIVE")
    assert Record.from_json(rec.to_json()) == rec
    assert Record.from_json(replace(rec, cells=None).to_json()).cells is None


def test_the_summary_counts_the_applicable_cells_not_reached() -> None:
    records = complete_records()
    missing = sorted(all_cells())[0]
    short = [replace(r, cells={k: v for k, v in r.cells.items() if k != missing}) if r.cells else r for r in records]
    results = results_of(short)
    SCHEMA.validate(results)
    assert results["summary"]["cells_not_reached"] == 1
    assert results_of(records)["summary"]["cells_not_reached"] == 0
    # Verification re-derives the matrix from the hit counts: a not-reached list emptied by hand changes nothing.
    for row in results["coverage_matrix"]:
        row["not_reached"] = []
    assert [k for r in document_matrix(results) if r.applicable for k in r.not_reached] == [missing]
