"""Reports: results.json validates against its schema, tokens never reach any report, junit.xml is dated and
timed, and report.html is the page a vendor attaches — dated, with the command line, the target, a legend,
what was not covered and how to cover it, requirements by area with their spec section, fuzz statistics."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from jsonschema import Draft202012Validator

import schemas
from suite.outcomes import FuzzStats, Kind, Record, Verdict
from suite.plugin import progress_line, redacted_command
from suite.protocol.requirements import REGISTRY
from suite.reports import render_html, render_junit, terminal_lines, write_reports
from suite.results import Completeness, build_results
from tests.suite.runs import OPTIONS, RUN, changed, complete_records, results_of, target

TOKEN = "s3cr3t-worker-token-value"
TRIM = "dw::VERSION-TRIM::version_trimmed"
SCHEMA = Draft202012Validator(schemas.load_json("json/report.schema.json"))


def _exchange() -> dict[str, Any]:
    return {
        "method": "POST",
        "url": "http://127.0.0.1:9/api/worker/workflow-tasks/poll",
        "request_headers": {"Authorization": "<redacted>", "X-Durable-Workflow-Protocol-Version": "1.20"},
        "request_body": '{"worker_id":"w"}',
        "status": 200,
        "response_headers": {},
        "response_body": {"task": None},
        "elapsed_seconds": 0.01,
        "error": None,
        "schema_errors": [],
        "curl": 'curl -sS -X POST -H "Authorization: Bearer $DW_TOKEN" http://127.0.0.1:9/api/worker/x',
    }


def _failing() -> list[Record]:
    return changed(
        complete_records(),
        TRIM,
        verdict=Verdict.FAILED,
        failed_requirement="VERSION-TRIM",
        message="the version was not trimmed",
        exchanges=(_exchange(),),
    )


def report_kinds() -> dict[str, dict[str, Any]]:
    """A passing, a failing, an incomplete and a harness-error run."""
    not_covered = [
        Record(
            Kind.CHECK, "c", TRIM, ("VERSION-TRIM",), Verdict.NOT_COVERED, "the lease is 300s", setting="--max-wait 305"
        )
    ]
    return {
        "passing": results_of(complete_records()),
        "failing": results_of(_failing()),
        "incomplete": results_of(not_covered, completeness=Completeness(narrowed_by=("-k 'trim'",), items=179)),
        "harness-error": results_of(changed(complete_records(), TRIM, verdict=Verdict.ERROR, message="timeout")),
    }


@pytest.mark.parametrize("kind", ["passing", "failing", "incomplete", "harness-error"])
def test_results_validate_against_the_report_schema(kind: str) -> None:
    SCHEMA.validate(report_kinds()[kind])


def test_the_records_cross_between_processes_unchanged() -> None:
    for record in [*complete_records(), *_failing()]:
        assert Record.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_verdicts_are_per_requirement_and_worst_wins() -> None:
    results = results_of(_failing())
    by_id = {r["id"]: r for r in results["requirements"]}
    assert by_id["VERSION-TRIM"]["verdict"] == "failed"
    assert by_id["VERSION-TRIM"]["exchanges"][0]["curl"].startswith("curl")
    assert by_id["VERSION-MISSING"]["verdict"] == "passed"
    assert results["summary"]["failed"] == 1
    assert not results["summary"]["conformant"]


def _sibling_failure() -> Record:
    """A check of two requirements that failed on the first."""
    return Record(
        Kind.CHECK,
        "c",
        "dw::A::c",
        ("VERSION-TRIM", "VERSION-MISSING"),
        Verdict.FAILED,
        message="the version was not trimmed",
        failed_requirement="VERSION-TRIM",
        exchanges=(_exchange(),),
    )


def test_a_check_that_failed_another_requirement_says_nothing_about_this_one() -> None:
    """The sibling is reported by its own status — not covered by that check, for a reason of its own — never
    with the other requirement's message or exchanges, in results.json and in the terminal."""
    results = results_of([_sibling_failure()])
    rows = {r["id"]: r for r in results["requirements"]}
    assert rows["VERSION-TRIM"]["verdict"] == "failed"
    sibling = rows["VERSION-MISSING"]
    assert sibling["verdict"] == "not-covered"
    assert sibling["reason"] == "not judged: c failed on VERSION-TRIM first"
    assert sibling["setting"] == "VERSION-TRIM passing (c judges them together)"
    assert sibling["exchanges"] == []
    text = "\n".join(terminal_lines(results, None, width=200))
    line = next(x for x in text.splitlines() if "NOT COVERED VERSION-MISSING" in x)
    assert "the version was not trimmed" not in line
    assert "not judged: c failed on VERSION-TRIM first" in line


def test_a_sibling_another_check_judged_keeps_that_checks_verdict() -> None:
    passing = Record(Kind.CHECK, "d", "dw::VERSION-MISSING::d", ("VERSION-MISSING",), Verdict.PASSED)
    rows = {r["id"]: r for r in results_of([_sibling_failure(), passing])["requirements"]}
    assert rows["VERSION-MISSING"]["verdict"] == "passed"
    assert rows["VERSION-MISSING"]["reason"] == ""


def test_reports_are_written_without_tokens(tmp_path: Path) -> None:
    results = build_results(
        target(),
        _failing(),
        {**RUN, "command": redacted_command(["--target=x", "--worker-token", TOKEN])},
        options=OPTIONS,
    )
    out = write_reports(results, tmp_path / RUN["run_id"])
    for name in ("results.json", "junit.xml", "report.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert TOKEN not in text, name
    assert results["command"] == "pytest --target=x --worker-token '<redacted>'"
    assert redacted_command([f"--operator-token={TOKEN}"]) == "pytest '--operator-token=<redacted>'"
    page = (out / "report.html").read_text(encoding="utf-8")
    for external in ("<script", "<link", "src="):  # self-contained: nothing is fetched
        assert external not in page


def test_junit_has_a_timestamp_and_times(tmp_path: Path) -> None:
    out = write_reports(results_of(_failing()), tmp_path / "r")
    suite_el = ET.fromstring((out / "junit.xml").read_text(encoding="utf-8"))
    assert suite_el.get("failures") == "1"
    assert suite_el.get("timestamp") == "2026-01-01T00:00:00"
    assert suite_el.get("time") == "130.000"
    cases = list(suite_el.iter("testcase"))
    assert all(float(c.get("time", "x")) >= 0 for c in cases)
    props = {p.get("name"): p.get("value") for p in suite_el.iter("property")}
    assert props["verdict"] == "NOT CONFORMANT"
    assert props["run_id"] == RUN["run_id"]


def test_the_report_says_when_how_and_against_what_it_ran() -> None:
    results = build_results(
        target(embedded=True),
        complete_records(),
        RUN,
        options={**OPTIONS, "max_wait": 30.0},
        completeness=Completeness(items=179),
    )
    page = render_html(results)
    assert "2026-01-01 00:00:00 UTC to 2026-01-01 00:02:10 UTC" in page
    assert html.escape(RUN["command"]) in page
    assert "embedded reference server 0.1.0 at http://127.0.0.1:9" in page
    assert "no name given, version 0.1.0, id srv-1" in page
    assert "<code>max_wait</code>" in page
    assert "id='legend'" in page
    for verdict in ("CONFORMANT", "NOT CONFORMANT", "INCOMPLETE", "HARNESS ERROR", "not-covered", "not-applicable"):
        assert f">{verdict}<" in page
    assert page.count('id="badge">CONFORMANT<') == 1


def test_counts_appear_once() -> None:
    page = render_html(results_of(complete_records()))
    assert len(re.findall(r"\d+ passed", page)) == 1


def test_not_covered_entries_name_the_setting_that_covers_them() -> None:
    page = render_html(report_kinds()["incomplete"])
    section = page[page.index("id='not-covered'") : page.index("Requirements by area")]
    assert "VERSION-TRIM" in section
    assert "<code>--max-wait 305</code>" in section
    assert "requirements were not run at all because of the selection -k &#x27;trim&#x27;" in section


def test_requirements_are_grouped_by_area_with_their_section_and_ids_that_do_not_wrap() -> None:
    results = results_of(complete_records())
    page = render_html(results)
    areas = sorted({r["area"] for r in results["requirements"]})
    positions = [page.index(f"<h3 id='area-{a}'>") for a in areas]
    assert positions == sorted(positions)
    assert "<td class='section'>Worker protocol 1.20 · Protocol version</td>" in page
    assert "code.id,td.section,td.verdict{white-space:nowrap}" in page


def test_fuzz_statistics_are_a_labelled_table_never_truncated(tmp_path: Path) -> None:
    stats = [
        FuzzStats(operation=f"op_{i}", group="g", cases=100 + i, statuses={"200": 3, "422": 97 + i}, seconds=1.5)
        for i in range(40)
    ]
    records = [
        Record(Kind.FUZZ, f"fuzz:op_{i}", "dw::fuzz::g", ("ROBUST-NO-5XX",), Verdict.PASSED, fuzz=s)
        for i, s in enumerate(stats)
    ]
    results = results_of(records)
    SCHEMA.validate(results)
    assert len(results["fuzz_statistics"]) == 40
    assert results["fuzz_statistics"][39]["statuses"] == {"200": 3, "422": 136}
    page = render_html(results)
    table = page[page.index("<table id='fuzz'>") :]
    for label in ("Operation", "Cases", "Coverage phase", "Positive", "Negative", "Statuses", "Seconds"):
        assert f"<th>{label}</th>" in table
    assert "<td>op_39</td>" in table
    assert "422×136" in table
    row = next(r for r in results["requirements"] if r["id"] == "ROBUST-NO-5XX")
    assert "cases" not in row["reason"]  # statistics are not squeezed into a note


def test_machine_ledgers_reach_the_report(tmp_path: Path) -> None:
    record = Record(
        Kind.MACHINE, "machine:workflow_leases", "dw::machine::workflow_leases", ("LEASE-EXCLUSIVE",), Verdict.PASSED,
        ledger={"duplicate_claim_raced": 3, "lease_granted": 9},
    )  # fmt: skip
    results = results_of([record])
    assert results["coverage_ledger"] == {"workflow_leases": {"duplicate_claim_raced": 3, "lease_granted": 9}}
    SCHEMA.validate(results)
    page = render_html(results)
    assert "State-machine coverage ledger" in page
    assert "duplicate_claim_raced" in page


def test_a_run_through_the_fault_proxy_says_so_and_counts_its_re_runs() -> None:
    records = changed(complete_records(), TRIM, fault_reruns=2, indeterminate=("POST /x: the answer was lost",))
    results = results_of(records, options={"faults": "standard", "fault_seed": 5})
    SCHEMA.validate(results)
    page = render_html(results)
    assert "<code>--faults standard</code>, seed 5" in page
    assert "1 check ran again (2 re-runs in all)" in page
    assert "id='faults'" not in render_html(results_of(complete_records()))


def test_progress_lines_summarise_an_area_a_machine_and_a_fuzz_group() -> None:
    checks = [r for r in complete_records() if r.kind is Kind.CHECK and r.test_id.startswith("dw::VERSION-")]
    assert progress_line("versioning", checks).startswith(
        f"versioning: {len(checks)} checks done — {len(checks)} passed"
    )
    machine = Record(
        Kind.MACHINE, "machine:m", "dw::machine::m", ("LEASE-EXCLUSIVE",), Verdict.PASSED, duration_seconds=12.0,
        ledger={"a": 1, "b": 0}, budget={"examples": 8, "steps": 40},
    )  # fmt: skip
    line = progress_line("machine:m", [machine, machine])
    assert line == "machine m: 2 passed — 8 examples × 40 steps, 1 hard state and 0 coverage cells reached, 12.0 s"
    fuzz = Record(
        Kind.FUZZ, "fuzz:op", "dw::fuzz::g", ("ROBUST-NO-5XX",), Verdict.PASSED, requests=30,
        fuzz=FuzzStats(operation="op", group="g", cases=12, seconds=2.0),
    )  # fmt: skip
    assert progress_line("fuzz:g", [fuzz]) == "fuzz g: 1 passed — 1 operation, 12 cases, 30 requests, 2.0 s"
    one = replace(checks[0], requests=1)
    assert progress_line("versioning", [one]).startswith("versioning: 1 check done — 1 passed (1 request, ")


# -- the terminal: whole messages, the rule, the curl line; "not run" wherever nothing ran ----------------------

LONG = (
    "complete with a wrong owner and a wrong attempt: POST http://127.0.0.1:9/api/worker/workflow-tasks/01M94ND6"
    "ZYJJCVMNP8R6H7XZDX/complete\n  Expected: 409 lease_owner_mismatch\n  Received: 409 "
    "workflow_task_attempt_mismatch (Workflow task '01M94ND6ZYJJCVMNP8R6H7XZDX' is at attempt 1, not 2; this lease "
    "is stale, poll again.)"
)


def _long_failure() -> dict[str, Any]:
    return results_of(
        changed(
            complete_records(),
            TRIM,
            verdict=Verdict.FAILED,
            failed_requirement="VERSION-TRIM",
            message=LONG,
            exchanges=(_exchange(), _exchange()),
        )
    )


@pytest.mark.parametrize("width", [80, 120])
def test_a_failure_in_the_terminal_is_whole_with_its_rule_and_curl_line(width: int) -> None:
    lines = terminal_lines(_long_failure(), "reports/r", width=width)
    start = next(i for i, x in enumerate(lines) if x.startswith("  FAILED     VERSION-TRIM (MUST): "))
    block = lines[start : next(i for i, x in enumerate(lines) if "Reproduce:" in x) + 2]
    # Every word of the message is there, none split across lines: wrapping only moved them.
    assert " ".join(" ".join(block).split()).startswith("FAILED VERSION-TRIM (MUST): " + " ".join(LONG.split())), block
    assert all(len(x) <= width for x in block if " " in x.strip() and "curl" not in x), block
    sentence = REGISTRY["VERSION-TRIM"].sentence
    assert " ".join(sentence.split()) in " ".join(" ".join(block).split())
    assert any(x.strip().startswith("Rule (Worker protocol 1.20 · Protocol version): ") for x in block), block
    # The curl line is one line, exactly as recorded, so it can be copied; the other exchange is in the report.
    assert f"    Reproduce: {_exchange()['curl']}" in block
    assert "    (1 more exchange of this failure in reports/r/report.html)" in block


def test_a_curl_line_too_long_for_a_terminal_is_pointed_at_never_cut() -> None:
    huge = {**_exchange(), "curl": "curl --data-binary '" + "x" * 5000 + "' http://127.0.0.1:9/api/worker/x"}
    results = results_of(
        changed(complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM", exchanges=(huge,))
    )
    lines = terminal_lines(results, "reports/r")
    assert "    Reproduce: a curl line of 5053 characters, whole in reports/r/report.html" in lines
    assert not any("xxxx" in x for x in lines)


def stopped_after_one_area() -> dict[str, Any]:
    """A run that -x stopped after the versioning checks: every other item did not run."""
    records = [r for r in complete_records() if r.test_id.startswith("dw::VERSION-")]
    ran = {r.test_id for r in records}
    not_run = tuple(r.test_id for r in complete_records() if r.test_id not in ran)
    return results_of(records, completeness=Completeness(not_run=not_run, items=len(complete_records())))


def test_requirements_no_item_of_which_ran_are_not_run_in_every_writer() -> None:
    results = stopped_after_one_area()
    rows = [r for r in results["requirements"] if not r["ran"]]
    assert rows
    assert all(r["verdict"] == "not-covered" for r in rows)  # the document keeps the verdict; writers show it
    lines = terminal_lines(results, None)
    table = [x for x in lines if x.startswith("  ") and not x.startswith("  NOT ")]
    assert any(x.split()[0] == "fencing" and x.endswith(" not run") for x in table), table
    assert not any("not-covered" in x for x in table), table
    assert not any(x.startswith("  NOT COVERED") for x in lines)
    cells = re.findall(r"<td class='verdict'[^>]*>([^<]*)</td>", render_html(results))
    assert cells.count("not run") == len(rows)
    assert "not-covered" not in cells
    skipped = [el.get("message", "") for el in ET.fromstring(render_junit(results)).iter("skipped")]
    assert sum(1 for m in skipped if m.startswith("not run: ")) == len(rows)


def test_a_message_too_long_for_junit_is_cut_between_words_and_says_so() -> None:
    words = " ".join(f"word{i}" for i in range(250))  # whole in results.json, too long for a junit message
    results = results_of(
        changed(complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM", message=words)
    )
    failure = next(ET.fromstring(render_junit(results)).iter("failure"))
    message = failure.get("message", "")
    kept, marker = message.split(" […", 1)
    assert words.startswith(kept)
    assert words[len(kept)] == " "  # cut at a word boundary
    assert marker == f"{len(words) - len(kept)} more characters; whole in results.json]"


def test_counts_agree_with_their_number() -> None:
    from suite.text import clip, plural

    assert [plural(n, "requirement") for n in (0, 1, 2)] == ["0 requirements", "1 requirement", "2 requirements"]
    assert plural(1, "requirement was", "requirements were") == "1 requirement was"
    assert clip("short", 10) == "short"
    records = [
        replace(r, verdict=Verdict.NOT_COVERED, message="the lease is 300s") if r.test_id == TRIM else r
        for r in complete_records()
    ]
    assert "because of 1 requirement not covered (1 MUST;" in results_of(records)["summary"]["headline"]
    not_run = results_of(
        [r for r in complete_records() if "VERSION-TRIM" not in r.requirements],
        completeness=Completeness(narrowed_by=("-k 'not trim'",), items=len(complete_records())),
    )
    assert "<p id='not-run'>1 requirement was not run at all" in render_html(not_run)
