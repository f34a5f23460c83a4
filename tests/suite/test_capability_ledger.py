"""The capability ledger: every behaviour an advertised capability promises must be exercised by some record, or
the run cannot be CONFORMANT.

Shown on hand-built runs (a complete, passing run whose only gap is the ledger's) and end to end (a run of the
embedded target with the checks of a capability deselected names it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import schemas
from suite.outcomes import Verdict
from suite.protocol.promises import PROMISES, Behaviour, advertised, ledger, unexercised, validate_promises
from suite.protocol.requirements import REGISTRY
from suite.registry import entries
from suite.reports import capability_line, render_html
from suite.results import Completeness, build_results
from tests.conftest import run_suite
from tests.suite.runs import OPTIONS, RUN, complete_records, target

SCHEMA = Draft202012Validator(schemas.load_json("json/report.schema.json"))
SESSIONS = {"worker_sessions": {"version": 1}, "worker_session_verbs": ["create", "heartbeat", "close"]}


def _results(capabilities: dict[str, Any], records: list[Any]) -> dict[str, Any]:
    info = target()
    info.cluster_info["worker_protocol"]["server_capabilities"] = {"poll_status": True, **capabilities}
    return build_results(info, records, RUN, options=OPTIONS, completeness=Completeness(items=len(entries())))


# -- the table -------------------------------------------------------------------------------------------------


def test_the_table_is_sound_and_names_only_known_requirements() -> None:
    validate_promises()
    for behaviours in PROMISES.values():
        for b in behaviours:
            assert b.requirements, b
            assert all(r in REGISTRY for r in b.requirements), b


def test_a_behaviour_naming_no_requirement_or_an_unknown_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import suite.protocol.promises as promises

    broken = {**PROMISES, "poll_status": (Behaviour("x", "y", ()), Behaviour("z", "w", ("NO-SUCH-REQ",)))}
    monkeypatch.setattr(promises, "PROMISES", broken)
    with pytest.raises(ValueError, match="capability promises are unsound") as err:
        promises.validate_promises()
    assert "poll_status.x: names no requirement" in str(err.value)
    assert "poll_status.z: unknown requirement NO-SUCH-REQ" in str(err.value)


@pytest.mark.parametrize("value", [False, None, 0, [], {}])
def test_a_falsy_value_advertises_nothing(value: object) -> None:
    assert not advertised(value)
    assert ledger({"poll_status": value}, {}, 20) == ()


def test_the_ledger_counts_each_requirement_and_names_what_no_record_exercised() -> None:
    rows = ledger({"poll_status": True}, {"POLL-STATUS-PRESENT": 3, "POLL-STATUS-THROTTLED": 1}, 20)
    (row,) = rows
    counts = {b.name: dict(b.exercised_by) for b in row.behaviours}
    assert counts["leased-or-empty"] == {"POLL-STATUS-PRESENT": 3, "POLL-STATUS-EMPTY": 0}
    assert unexercised(rows) == [("poll_status", "unavailable")]
    assert not row.covered


def test_a_behaviour_whose_requirements_came_after_the_certified_minor_neither_counts_nor_blocks() -> None:
    rows = ledger(SESSIONS, {}, 5)  # worker sessions came in 1.8
    assert rows
    assert all(not b.applicable for r in rows for b in r.behaviours)
    assert unexercised(rows) == []


# -- the run verdict -----------------------------------------------------------------------------------------


def test_a_complete_run_that_exercised_every_promise_is_conformant_and_shows_its_ledger() -> None:
    results = _results(SESSIONS, complete_records())
    assert results["summary"]["verdict"] == "CONFORMANT", results["summary"]["gaps"]
    SCHEMA.validate(results)
    caps = {row["capability"]: row for row in results["capability_ledger"]}
    assert set(caps) == {"poll_status", "worker_sessions", "worker_session_verbs"}
    assert all(row["covered"] for row in caps.values())
    single = next(b for b in caps["worker_sessions"]["behaviours"] if b["behaviour"] == "single-owner")
    judging = sum("SESSION-SINGLE-OWNER" in e.requirements for e in entries())  # one passing record per item
    assert judging >= 1
    assert single["requirements"] == [{"id": "SESSION-SINGLE-OWNER", "exercised": judging}]
    assert (
        capability_line(results) == "capabilities: 3 advertised capabilities promise 10 behaviours, every one exercised"
    )
    page = render_html(results)
    assert "<h2 id='capabilities'>Capability ledger</h2>" in page
    assert f"SESSION-SINGLE-OWNER ×{judging}" in page


def test_an_advertised_capability_whose_checks_only_found_it_unimplemented_keeps_the_run_incomplete() -> None:
    """Every requirement has a verdict (unimplemented counts as checked), so without the ledger this run would be
    CONFORMANT: yet the target advertises worker sessions and no record exercised any session behaviour."""
    records = [
        replace(r, verdict=Verdict.UNIMPLEMENTED) if any(q.startswith("SESSION-") for q in r.requirements) else r
        for r in complete_records()
    ]
    results = _results(SESSIONS, records)
    summary = results["summary"]
    assert summary["checked"] == summary["applicable"]
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["gaps"] == [
        "2 advertised capabilities with behaviours no check exercised: worker_session_verbs, worker_sessions "
        "(see Capability ledger)"
    ]
    assert summary["unexercised_capabilities"] == [
        "worker_session_verbs (verbs)",
        "worker_sessions (single-owner, admission, expiry, stale-holder, holder-lost, activity-limit)",
    ]
    assert "never exercised: worker_session_verbs (verbs); worker_sessions (single-owner" in capability_line(results)
    assert "NEVER EXERCISED" in render_html(results)
    SCHEMA.validate(results)
    # Not advertised: the same records are complete.
    assert _results({}, records)["summary"]["verdict"] == "CONFORMANT"


def test_deselecting_a_capabilitys_checks_names_it_in_an_incomplete_run(tmp_path: Path) -> None:
    """The embedded target advertises cooperative cancellation; a run of the poll-status checks alone exercises
    none of its behaviours, and its verdict, results.json, report.html and terminal line say so."""
    run = run_suite("embedded", tmp_path / "reports", "-m", "dw_check", "--requirement", "POLL-STATUS-PRESENT")
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.results is not None
    summary = run.results["summary"]
    assert summary["verdict"] == "INCOMPLETE"
    assert any("cooperative_cancellation" in gap and "no check exercised" in gap for gap in summary["gaps"])
    assert (
        "cooperative_cancellation (request, cleanup, deadline, outcome, client-request)"
        in summary["unexercised_capabilities"]
    )
    caps = {row["capability"]: row for row in run.results["capability_ledger"]}
    poll = {b["behaviour"]: b["exercised"] for b in caps["poll_status"]["behaviours"]}
    assert poll == {"leased-or-empty": True, "throttled": False, "unavailable": False}
    assert "never exercised:" in " ".join(run.stdout.split())
    page = next((tmp_path / "reports").glob("*/report.html")).read_text(encoding="utf-8")
    assert "Capability ledger" in page


def test_compression_a_server_never_uses_is_not_applicable_but_an_unexercised_capability_still_blocks() -> None:
    """Compressing above the threshold is the server's option: a target advertising the encodings whose checks
    found it never compresses (unimplemented) is complete. The option alone is released: the capability's other
    behaviour (a page below the threshold is plain) must still be exercised."""
    compression = {"history_compression": {"supported_encodings": ["gzip"], "compression_threshold": 50}}
    option = ("COMPRESSION-ROUNDTRIP", "COMPRESSION-ABOVE-THRESHOLD")
    records = [
        replace(r, verdict=Verdict.UNIMPLEMENTED) if any(q in option for q in r.requirements) else r
        for r in complete_records()
    ]
    assert _results(compression, records)["summary"]["verdict"] == "CONFORMANT"
    below = [
        replace(r, verdict=Verdict.UNIMPLEMENTED) if "COMPRESSION-BELOW-THRESHOLD" in r.requirements else r
        for r in records
    ]
    assert _results(compression, below)["summary"]["unexercised_capabilities"] == [
        "history_compression (below-threshold)"
    ]
