"""Reports: results.json validates against its schema, tokens never reach any report, the JUnit file
parses, and the HTML page is one self-contained document with the summary badge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from jsonschema import Draft202012Validator

import schemas
from suite.context import TargetInfo
from suite.reports import build_results, quote_line, write_reports

TOKEN = "s3cr3t-worker-token-value"


def _target(strict: bool = False) -> TargetInfo:
    return TargetInfo(
        url="http://127.0.0.1:9",
        cluster_info={"worker_protocol": {"version": "1.20", "server_capabilities": {"poll_status": True}}},
        worker_token=TOKEN,
        strict=strict,
    )


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


RECORDS = [
    {
        "check": "version_header_missing",
        "requirements": ["VERSION-MISSING", "VERSION-ERROR-BODY"],
        "verdict": "passed",
        "message": "",
        "exchanges": [],
        "requests": 1,
        "duration_seconds": 0.1,
    },
    {
        "check": "drops_poll_status",
        "requirements": ["POLL-STATUS-PRESENT"],
        "verdict": "failed",
        "message": "poll_status missing",
        "failed_requirement": "POLL-STATUS-PRESENT",
        "exchanges": [_exchange()],
        "requests": 2,
        "duration_seconds": 0.2,
    },
    {
        "check": "page_sizes",
        "requirements": ["DISCOVERY-PAGE-SIZE-BOTH-NAMES"],
        "verdict": "non-strict",
        "message": "missing default_history_page_size",
        "failed_requirement": "DISCOVERY-PAGE-SIZE-BOTH-NAMES",
        "exchanges": [],
        "requests": 0,
        "duration_seconds": 0.0,
    },
]
RUN = {"run_id": "20260101T000000Z-abc123", "started_at": "2026-01-01T00:00:00+00:00", "seed": 7}
OPTIONS = {"target": "http://127.0.0.1:9", "worker_token": "<set>", "operator_token": None}


def test_results_validate_against_the_report_schema() -> None:
    results = build_results(_target(), RECORDS, RUN, options=OPTIONS)
    Draft202012Validator(schemas.load_json("json/report.schema.json")).validate(results)


def test_verdicts_are_per_requirement_and_worst_wins() -> None:
    results = build_results(_target(), RECORDS, RUN, options=OPTIONS)
    by_id = {r["id"]: r for r in results["requirements"]}
    assert by_id["VERSION-MISSING"]["verdict"] == "passed"
    assert by_id["POLL-STATUS-PRESENT"]["verdict"] == "failed"
    assert by_id["POLL-STATUS-PRESENT"]["exchanges"][0]["curl"].startswith("curl")
    assert by_id["DISCOVERY-PAGE-SIZE-BOTH-NAMES"]["verdict"] == "non-strict"
    assert by_id["LEASE-EXCLUSIVE"]["verdict"] == "not-covered"  # no check of it ran
    assert results["summary"]["failed"] == 1
    assert not results["summary"]["conformant"]
    assert "NOT CONFORMANT" in quote_line(results)


def test_strict_makes_should_violations_non_conformant() -> None:
    records = [r for r in RECORDS if r["verdict"] != "failed"]
    assert build_results(_target(), records, RUN, options=OPTIONS)["summary"]["conformant"]
    assert not build_results(_target(strict=True), records, RUN, options=OPTIONS)["summary"]["conformant"]


def test_reports_are_written_without_tokens(tmp_path: Path) -> None:
    results = build_results(_target(), RECORDS, RUN, options=OPTIONS)
    out = write_reports(results, tmp_path / RUN["run_id"])
    for name in ("results.json", "junit.xml", "report.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert TOKEN not in text, name
    suite_el = ET.fromstring((out / "junit.xml").read_text(encoding="utf-8"))
    assert suite_el.get("failures") == "1"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="badge"' in page
    assert "NOT CONFORMANT" in page
    for external in ("<script", "<link", "src="):  # self-contained: nothing is fetched
        assert external not in page
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["run_id"] == RUN["run_id"]


def test_machine_ledgers_reach_the_report(tmp_path: Path) -> None:
    record = {
        "check": "machine:workflow_leases",
        "requirements": ["LEASE-EXCLUSIVE"],
        "verdict": "passed",
        "message": "",
        "ledger": {"duplicate_claim_raced": 3, "lease_granted": 9},
    }
    results = build_results(_target(), [record], RUN, options=OPTIONS)
    assert results["coverage_ledger"] == {"workflow_leases": {"duplicate_claim_raced": 3, "lease_granted": 9}}
    Draft202012Validator(schemas.load_json("json/report.schema.json")).validate(results)
    page = (write_reports(results, tmp_path / "r") / "report.html").read_text(encoding="utf-8")
    assert "State-machine coverage ledger" in page
    assert "duplicate_claim_raced" in page


def test_a_run_through_the_fault_proxy_says_so_and_counts_its_re_runs(tmp_path: Path) -> None:
    records = [{**RECORDS[0], "fault_reruns": 2, "indeterminate": ["POST /x: the answer was lost"]}, *RECORDS[1:]]
    options = {**OPTIONS, "faults": "standard", "fault_seed": 5}
    results = build_results(_target(), records, RUN, options=options)
    Draft202012Validator(schemas.load_json("json/report.schema.json")).validate(results)
    html = (write_reports(results, tmp_path) / "report.html").read_text(encoding="utf-8")
    assert "<code>--faults standard</code>, seed 5" in html
    assert "1 check ran again (2 re-runs in all)" in html
    plain = build_results(_target(), RECORDS, RUN, options=OPTIONS)
    assert "id='faults'" not in (write_reports(plain, tmp_path / "plain") / "report.html").read_text(encoding="utf-8")
