"""The mutant kill matrix: every named fault of the reference server is caught by the requirement it is
declared to break, the correct server passes the same checks, and the matrix shows up in the reports.

The slow test runs the whole matrix (``python -m suite.mutants --jobs 2``, through its Python API); it
replaces the former per-fault ``test_broken_servers.py`` and keeps its extra assertions: a failure carries the
exchanges that show it, the run exits 1 and the terminal summary names the broken requirement.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from suite.context import TargetInfo
from suite.mutants import (
    CORRECT,
    FIRST_FAILURES_SCHEMA,
    FirstFailures,
    Matrix,
    MutantResult,
    gaps,
    judge_run,
    list_faults,
    run_matrix,
    time_driven_faults,
    write_matrix,
)
from suite.mutants import main as mutants_main
from suite.protocol.requirements import REGISTRY
from suite.registry import entries
from suite.reports import write_reports
from suite.results import build_results

ROOT = Path(__file__).resolve().parents[2]


def test_every_fault_names_known_requirements_and_has_a_hook() -> None:
    mutants = list_faults()
    assert len(mutants) >= 25
    sources = {p: p.read_text(encoding="utf-8") for p in (ROOT / "reference_server").rglob("*.py")}
    for m in mutants:
        assert m.description.endswith("."), m
        assert m.kills, m
        assert all(r in REGISTRY for r in m.kills), m
        hooked = [p.name for p, text in sources.items() if p.name != "faults.py" and f'"{m.name}"' in text]
        assert hooked, f"fault {m.name} is listed but no server code checks it"
    assert COLD_CELL_BUGS.issubset({m.name for m in mutants if m.machine})  # each a fault a machine kills


def _result(name: str, verdict: str, failed: list[str], expected: list[str]) -> MutantResult:
    return MutantResult(
        name=name,
        description="Does the wrong thing.",
        expected=expected,
        verdict=verdict,
        failed=failed,
        expected_caught=[r for r in expected if r in failed],
        first_failure={"check": "c", "requirement": failed[0], "requests": 3, "seconds": 0.5} if failed else None,
    )


def _matrix() -> Matrix:
    return Matrix(
        mode="targeted",
        jobs=2,
        started_at="2026-01-01T00:00:00+00:00",
        seconds=12.0,
        correct=_result(CORRECT, "passed", [], []),
        mutants=[
            _result("caught", "killed", ["FENCE-OWNER"], ["FENCE-OWNER"]),
            _result("missed", "survived", [], ["LEASE-EXCLUSIVE"]),
            _result("sideways", "killed", ["SCHEMA-RESPONSES"], ["FENCE-ATTEMPT"]),
        ],
    )


def test_gaps_name_survivors_and_unexpected_kills() -> None:
    found = gaps(_matrix())
    assert len(found) == 2
    assert found[0].startswith("missed survived")
    assert "LEASE-EXCLUSIVE" in found[0]
    assert found[1].startswith("sideways was killed by SCHEMA-RESPONSES")
    assert "FENCE-ATTEMPT" in found[1]
    doc = _matrix().to_json()
    assert doc["summary"]["killed"] == 2
    assert doc["summary"]["killed_as_expected"] == 1
    assert doc["summary"]["correct_server_passed"]


def test_a_proxy_only_mutant_must_survive_without_the_proxy_and_the_correct_server_pass_through_it() -> None:
    matrix = _matrix()
    matrix.mutants = [_result("retry-bug", "killed", ["IDEMPOTENT-POLL-REPLAY"], ["IDEMPOTENT-POLL-REPLAY"])]
    matrix.mutants[0].proxy = "drop_response=0.25"
    matrix.mutants[0].without_proxy = "survived"
    matrix.correct_proxy = _result(CORRECT, "passed", [], [])
    matrix.correct_proxy.proxy = "drop_response=0.25"
    assert gaps(matrix) == []
    doc = matrix.to_json()
    assert doc["summary"]["proxy_only"] == 1
    assert doc["summary"]["correct_server_passed"]
    matrix.mutants[0].without_proxy = "killed"  # the plain suite catches it: it is no retry-only bug
    matrix.correct_proxy.verdict = "failed"
    found = gaps(matrix)
    assert any("through the fault proxy" in g for g in found), found
    assert any(g.startswith("retry-bug is declared to need the fault proxy") for g in found), found
    assert not matrix.to_json()["summary"]["correct_server_passed"]


def test_report_html_gets_the_matrix_when_mutants_json_is_beside_it(tmp_path: Path) -> None:
    target = TargetInfo(url="http://127.0.0.1:9", cluster_info={"worker_protocol": {"version": "1.20"}})
    run = {"run_id": "20260101T000000Z-abc123", "started_at": "2026-01-01T00:00:00+00:00", "seed": 7}
    results = build_results(target, [], run, options={})
    plain = (write_reports(results, tmp_path / "reports" / "a") / "report.html").read_text(encoding="utf-8")
    assert "Mutant kill matrix" not in plain
    _, page = write_matrix(_matrix(), tmp_path / "reports")
    assert "Mutant kill matrix" in page.read_text(encoding="utf-8")
    html = (write_reports(results, tmp_path / "reports" / "b") / "report.html").read_text(encoding="utf-8")
    assert 'id="mutants"' in html
    survivor = re.search(r"<tr class='gap'><td><code>missed</code>.*?</tr>", html)
    assert survivor is not None
    assert "SURVIVED" in survivor.group(0)  # survivors are highlighted
    assert "<tr><td><code>caught</code>" in html


# Faults that show only in a coverage cell no example of their machine reaches: the machine's sweep over cold
# cells finds them (docs/coverage.md), and no plain check does.
COLD_CELL_BUGS = frozenset(
    {
        "abandon-child-cancelled-with-parent",
        "activity-closed-run-skips-owner-check",
        "activity-former-holder-reports",
        "cancellation-dropped-after-delivery",
        "continue-as-new-restarts-execution-timeout",
        "continued-run-fail-recorded-completed",
        "delivered-child-terminated-at-deadline",
        "deregistration-skips-redelivered-leases",
        "fail-update-closes-again",
        "query-failed-task-retried",
        "query-leased-failed-on-run-close",
        "second-child-wake-names-first",
        "session-expired-revived-by-activity-heartbeat",
        "session-former-holder-closes",
        "session-reacquire-resets-ttl",
        "signal-to-failed-run-accepted",
        "update-close-from-any-worker",
    }
)


@pytest.mark.slow
@pytest.mark.whole_suite
@pytest.mark.kill_matrix
def test_every_mutant_is_killed_by_its_expected_requirement(tmp_path: Path) -> None:
    matrix = run_matrix(jobs=2, report_dir=tmp_path)
    json_path, _ = write_matrix(matrix, tmp_path)
    doc: dict[str, Any] = json.loads(json_path.read_text(encoding="utf-8"))
    assert doc["summary"]["gaps"] == [], "\n".join(doc["summary"]["gaps"])
    assert matrix.correct.verdict == "passed", matrix.correct.failed
    assert matrix.correct.exit_code == 0
    assert len(matrix.mutants) >= 25
    # A bug only retried requests reveal: killed through the fault proxy, survives the plain suite, and the
    # correct server passes the same checks through the proxy.
    proxied = [m for m in matrix.mutants if m.proxy]
    assert proxied
    assert all(m.without_proxy == "survived" for m in proxied), [(m.name, m.without_proxy) for m in proxied]
    assert matrix.correct_proxy is not None
    assert matrix.correct_proxy.verdict == "passed"
    # A bug too deep for a default run is found by a campaign of its machine only (no plain check goes that deep).
    history_bugs = {f.name for f in list_faults() if f.machine is not None and f.campaign is None} - COLD_CELL_BUGS
    assert any(f.campaign for f in list_faults())
    for m in matrix.mutants:
        assert m.as_expected, (m.name, m.verdict, m.failed, m.note)
        assert m.exit_code == 1, (m.name, m.exit_code)
        assert m.first_failure is not None, m.name
        assert m.first_failure["requests"] > 0, m.name
        assert m.report is not None
        results = json.loads((Path(m.report).parent / "results.json").read_text(encoding="utf-8"))
        output = (Path(m.report).parents[2] / "pytest.log").read_text(encoding="utf-8")
        if m.name in history_bugs:
            # A history bug is found by a plain check too (the read-back checks of suite/checks/history.py), not
            # only by its machine.
            by_checks = {c["failed_requirement"] for c in results["checks"] if c["kind"] == "check"}
            assert set(m.expected) <= by_checks, (m.name, sorted(by_checks - {None}))
        for requirement in m.expected:
            failure = next(r for r in results["requirements"] if r["id"] == requirement)
            assert failure["exchanges"], f"{m.name}: a failure carries the exchanges that show it"
            assert requirement in output, f"{m.name}: the terminal summary names {requirement}"


def test_first_failures_stop_at_the_first_failing_item_and_report_how_soon(tmp_path: Path) -> None:
    """``python -m suite.mutants --first-failure``: ``pytest -x`` of the whole suite, in its default order, stops
    at the first failure of a broken server; ``first-failures.json`` gives the median and worst seconds."""
    faults = ["--fault", "echo-requested-minor", "--fault", "accept-minor-above"]
    status = mutants_main(["--first-failure", *faults, "--jobs", "2", "--report-dir", str(tmp_path)])
    assert status == 0
    doc: dict[str, Any] = json.loads((tmp_path / "first-failures.json").read_text(encoding="utf-8"))
    assert doc["schema"] == FIRST_FAILURES_SCHEMA
    summary = doc["summary"]
    assert (summary["mutants"], summary["stopped_at_a_failure"], summary["not_caught"]) == (2, 2, [])
    first, run = summary["first_failure_seconds"], summary["run_seconds"]
    assert 0 < first["median"] <= first["worst"] < run["worst"]
    for entry in doc["runs"]:
        assert entry["exit_code"] == 1, entry
        # -x: the run stopped at that item, so fewer items than the suite has ran.
        results = json.loads(next((tmp_path / "first-failures" / entry["name"]).rglob("results.json")).read_text())
        assert len({c["test_id"] for c in results["checks"]}) < len(entries())
        failed = [r["id"] for r in results["requirements"] if r["verdict"] in ("failed", "non-strict")]
        assert entry["first_failure"]["requirement"] in failed, entry


def test_the_cost_of_a_first_failure_counts_a_machine_once() -> None:
    """A machine writes one record per requirement, each carrying the whole machine's duration: the seconds until
    the first failure count it once, not once per record before the failing one."""
    check = {"test_id": "dw::A::a", "check": "a", "verdict": "passed", "requests": 4, "duration_seconds": 1.0}
    machine = {"test_id": "dw::machine::m", "check": "machine:m", "requests": 0, "duration_seconds": 10.0}
    records = [check, *({**machine, "verdict": "passed"} for _ in range(5))]
    records.append({**machine, "verdict": "failed", "failed_requirement": "FENCE-OWNER"})
    results = {"requirements": [{"id": "FENCE-OWNER", "verdict": "failed"}], "checks": records}
    result = MutantResult(name="m", description="", expected=["FENCE-OWNER"], verdict="", exit_code=1)
    judge_run(result, results)
    assert result.verdict == "killed"
    assert result.first_failure == {"check": "machine:m", "requirement": "FENCE-OWNER", "requests": 4, "seconds": 11.0}


def test_waiting_in_real_time_the_first_failure_is_the_runs_span_not_its_items_added_up() -> None:
    """In real time the items overlap: ten seconds of items may pass in three. Under -x the run's span ends at
    its first failure."""
    records = [
        {"test_id": "dw::A::a", "check": "a", "verdict": "passed", "requests": 4, "duration_seconds": 6.0},
        {"test_id": "dw::B::b", "check": "b", "verdict": "failed", "failed_requirement": "B", "duration_seconds": 4.0},
    ]
    results: dict[str, Any] = {
        "requirements": [{"id": "B", "verdict": "failed"}],
        "checks": records,
        "started_at": "2026-12-07T15:42:23.500000+00:00",
        "finished_at": "2026-12-07T15:42:26.750000+00:00",
        "target": {"time": {"test_clock_used": False}},
    }
    result = MutantResult(name="m", description="", expected=["B"], verdict="", exit_code=1)
    judge_run(result, results)
    assert result.first_failure is not None
    assert result.first_failure["seconds"] == 3.25
    results["target"]["time"]["test_clock_used"] = True  # one by one: the items before it and its own
    judge_run(result, results)
    assert result.first_failure["seconds"] == 10.0


def test_first_failures_name_a_fault_the_whole_suite_passes() -> None:
    correct = MutantResult(name="m", description="", expected=["X"], verdict="survived")
    caught = _result("c", "killed", ["FENCE-OWNER"], ["FENCE-OWNER"])
    caught.suite_seconds = 2.0
    stopped = MutantResult(name="e", description="", expected=["X"], verdict="error", note="harness errors on X")
    doc = FirstFailures("2026-01-01T00:00:00+00:00", 3.0, 1, "python", [correct, caught, stopped]).to_json()
    assert doc["summary"]["not_caught"] == ["m"]  # the whole suite passed against it
    assert doc["summary"]["no_verdict"] == ["e"]  # a harness error stopped the run: never called a pass
    assert doc["summary"]["first_failure_seconds"] == {"median": 0.5, "worst": 0.5}
    assert doc["summary"]["run_seconds"] == {"median": 2.0, "worst": 2.0}


def test_time_driven_faults_are_those_a_check_that_waits_on_the_targets_time_judges() -> None:
    # LONGPOLL-CLAMP-MAX's check holds a long poll for its clamp (seconds in real time, none with the test clock);
    # VERSION-MISSING's answers at once either way.
    kills = {
        "held": ("LONGPOLL-CLAMP-MAX",),
        "at-once": ("VERSION-MISSING",),
        "both": ("VERSION-MISSING", "LONGPOLL-CLAMP-MAX"),
    }
    assert time_driven_faults(kills) == ["both", "held"]


def test_real_time_and_time_driven_are_options_of_the_first_failure_mode_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        mutants_main(["--real-time"])
    assert stopped.value.code == 2
    assert "--real-time and --time-driven go with --first-failure" in capsys.readouterr().err
