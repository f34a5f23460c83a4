"""How outcomes become verdicts, and how a run ends: CONFORMANT only when everything was checked.

The run rules are shown on hand-built record streams (each test breaks one thing in a complete run), then
end to end, as a user runs the suite: a selection is INCOMPLETE, a run that ran nothing or whose own item
crashed is a harness error, never CONFORMANT.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from suite.context import TargetInfo
from suite.machines.base import MachineBase
from suite.outcomes import (
    EXIT_CODES,
    EXIT_HARNESS_ERROR,
    EXIT_INCOMPLETE_CERTIFY,
    CheckFailure,
    HarnessError,
    Indeterminate,
    NotCovered,
    RunVerdict,
    Unimplemented,
    Verdict,
    exit_status,
)
from suite.protocol.requirements import REGISTRY
from suite.registry import Check, entries
from suite.results import Completeness
from suite.run import judge
from tests.conftest import ServerProcess, run_suite
from tests.suite.runs import changed, complete_records, pytest_cli, results_of

TARGET = TargetInfo(url="http://127.0.0.1:9", cluster_info={})
TRIM = "dw::VERSION-TRIM::version_trimmed"


async def _noop(ctx: object) -> None:
    return None


def _check(requirement: str, capability: str | None = None) -> Check:
    return Check("probe", _noop, (requirement,), capability, False, "doc")  # type: ignore[arg-type]


# -- one check's outcome ------------------------------------------------------------------------------------


def test_must_failure_fails_and_should_failure_is_non_strict() -> None:
    failure = CheckFailure("broken", expected=1, received=2)
    assert judge(_check("FENCE-OWNER"), failure, True, TARGET)[0] is Verdict.FAILED
    assert judge(_check("ENVELOPE-ERROR-AND-MESSAGE"), failure, True, TARGET)[0] is Verdict.NON_STRICT


def test_failure_names_the_requirement_it_broke() -> None:
    check = Check("probe", _noop, ("FENCE-OWNER", "FENCE-NO-STATE-CHANGE"), None, False, "doc")  # type: ignore[arg-type]
    verdict, _, _, req = judge(check, CheckFailure("x", requirement="FENCE-NO-STATE-CHANGE"), True, TARGET)
    assert (verdict, req) == (Verdict.FAILED, "FENCE-NO-STATE-CHANGE")


def test_optional_capability_not_advertised_is_unimplemented_or_informational() -> None:
    check = _check("FENCE-OWNER", capability="worker_sessions")
    assert judge(check, CheckFailure("x"), False, TARGET)[0] is Verdict.UNIMPLEMENTED
    assert judge(check, None, False, TARGET)[0] is Verdict.INFORMATIONAL
    assert judge(check, CheckFailure("x"), True, TARGET)[0] is Verdict.FAILED  # advertised but broken
    assert judge(check, None, True, TARGET)[0] is Verdict.PASSED


def test_a_wait_longer_than_max_wait_is_not_covered_in_one_sentence() -> None:
    from suite.context import CheckContext

    ctx = CheckContext(target=replace(TARGET, max_wait=30.0), client=None, check_name="c")  # type: ignore[arg-type]
    with pytest.raises(NotCovered) as caught:
        ctx.needs_short(65, "a poll with timeout_seconds 120, which may hold 60 s,", "long_poll_max_seconds")
    assert caught.value.reason == (
        "waiting for a poll with timeout_seconds 120, which may hold 60 s, takes 65 s, but --max-wait lets this "
        "run wait at most 30 s"
    )
    assert caught.value.setting is not None
    assert caught.value.setting.startswith("--max-wait 65, or a shorter worker_protocol.test_profile.")


def test_harness_problems_are_never_the_targets_failure() -> None:
    assert judge(_check("FENCE-OWNER"), HarnessError("timeout"), True, TARGET)[0] is Verdict.ERROR
    assert judge(_check("FENCE-OWNER"), NotCovered("long lease"), True, TARGET)[0] is Verdict.NOT_COVERED
    assert judge(_check("FENCE-OWNER"), Unimplemented("x"), True, TARGET)[0] is Verdict.UNIMPLEMENTED
    assert judge(_check("FENCE-OWNER"), RuntimeError("bug"), True, TARGET)[0] is Verdict.ERROR


# -- the run verdict ------------------------------------------------------------------------------------------


def _verdict(results: dict[str, object]) -> RunVerdict:
    return RunVerdict(results["summary"]["verdict"])  # type: ignore[index]


def test_a_complete_passing_run_is_conformant() -> None:
    results = results_of(complete_records())
    assert _verdict(results) is RunVerdict.CONFORMANT
    assert results["summary"]["checked"] == results["summary"]["applicable"] == len(REGISTRY)
    assert results["summary"]["headline"].startswith("CONFORMANT: http://127.0.0.1:9")
    assert f"all {len(REGISTRY)} of {len(REGISTRY)} requirements checked" in results["summary"]["headline"]
    assert EXIT_CODES[RunVerdict.CONFORMANT] == 0


def test_a_selection_is_incomplete_and_says_how_much_was_checked() -> None:
    records = [r for r in complete_records() if r.test_id == TRIM]
    others = tuple(e.test_id for e in entries() if e.test_id != TRIM)
    completeness = Completeness(narrowed_by=("--requirement VERSION-TRIM",), not_run=others, items=len(entries()))
    results = results_of(records, completeness=completeness)
    assert _verdict(results) is RunVerdict.INCOMPLETE
    line = results["summary"]["headline"]
    assert line.startswith("INCOMPLETE: ")
    assert f"PARTIAL: 1 of {len(REGISTRY)} requirements checked, nothing that ran failed" in line
    assert "the selection --requirement VERSION-TRIM" in line
    assert "CONFORMANT" not in line.replace("INCOMPLETE", "")
    assert EXIT_CODES[RunVerdict.INCOMPLETE] == 0  # server CI may gate on a subset…
    assert EXIT_INCOMPLETE_CERTIFY not in EXIT_CODES.values()  # …but under --certify it has a code of its own


@pytest.mark.parametrize(
    ("verdict", "plain", "certify"),
    [
        (RunVerdict.CONFORMANT, 0, 0),
        (RunVerdict.NOT_CONFORMANT, 1, 1),
        (RunVerdict.INCOMPLETE, 0, EXIT_INCOMPLETE_CERTIFY),
        (RunVerdict.HARNESS_ERROR, EXIT_HARNESS_ERROR, EXIT_HARNESS_ERROR),
    ],
)
def test_exit_status_of_each_run_verdict(verdict: RunVerdict, plain: int, certify: int) -> None:
    assert exit_status(verdict, certify=False) == plain
    assert exit_status(verdict, certify=True) == certify


def test_a_selection_that_ran_everything_is_still_incomplete() -> None:
    completeness = Completeness(narrowed_by=("-k 'not nothing'",), items=len(entries()))
    assert _verdict(results_of(complete_records(), completeness=completeness)) is RunVerdict.INCOMPLETE


def test_a_must_not_covered_makes_the_run_incomplete_and_names_the_setting() -> None:
    req = "EXPIRY-SELF-RECOVERY"
    setting = "--max-wait 300, or a shorter worker_protocol.test_profile.workflow_task_lease_seconds"
    records = [
        replace(r, verdict=Verdict.NOT_COVERED, message="the lease is 300s", setting=setting)
        if req in r.requirements
        else r
        for r in complete_records()
    ]
    results = results_of(records)
    assert _verdict(results) is RunVerdict.INCOMPLETE
    assert "requirements not covered (" in results["summary"]["headline"]
    assert results["summary"]["not_covered_must"] >= 1
    row = next(r for r in results["requirements"] if r["id"] == req)
    assert row["verdict"] == "not-covered"
    assert row["setting"] == setting


def test_budgets_below_the_defaults_make_the_run_incomplete() -> None:
    completeness = Completeness(reduced=("--machine-examples 2 (below the default 8)",), items=len(entries()))
    results = results_of(complete_records(), completeness=completeness)
    assert _verdict(results) is RunVerdict.INCOMPLETE
    assert "--machine-examples 2 (below the default 8)" in results["summary"]["headline"]


def test_items_that_did_not_run_make_the_run_incomplete() -> None:
    records = complete_records()[1:]
    completeness = Completeness(not_run=(records[0].test_id,), items=len(entries()))
    assert _verdict(results_of(records, completeness=completeness)) is RunVerdict.INCOMPLETE


def test_a_broken_must_is_not_conformant_even_beside_harness_errors() -> None:
    records = changed(
        complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM", message="no trim"
    )
    assert _verdict(results_of(records)) is RunVerdict.NOT_CONFORMANT
    records = changed(records, "dw::machine::workflow_leases", verdict=Verdict.ERROR, message="network")
    results = results_of(records)
    assert _verdict(results) is RunVerdict.NOT_CONFORMANT
    assert "broken: VERSION-TRIM" in results["summary"]["headline"]


def test_a_run_with_only_harness_errors_is_a_harness_error_not_a_failure() -> None:
    records = changed(complete_records(), "dw::machine::workflow_leases", verdict=Verdict.ERROR, message="timeout")
    results = results_of(records)
    assert _verdict(results) is RunVerdict.HARNESS_ERROR
    line = results["summary"]["headline"]
    assert line.startswith("HARNESS ERROR: ")
    assert "no verdict: 1 harness error (not the target's failure)" in line
    assert "NOT CONFORMANT" not in line
    assert "0 failed" not in line
    assert EXIT_CODES[RunVerdict.HARNESS_ERROR] == EXIT_HARNESS_ERROR == 10


def test_a_run_that_ran_nothing_is_a_harness_error() -> None:
    completeness = Completeness(narrowed_by=("-k 'nomatch'",), not_run=tuple(e.test_id for e in entries()))
    results = results_of([], completeness=completeness)
    assert _verdict(results) is RunVerdict.HARNESS_ERROR
    assert "no verdict: no item ran (the selection -k 'nomatch')" in results["summary"]["headline"]


def test_a_broken_should_fails_only_under_strict() -> None:
    records = changed(
        complete_records(),
        "dw::ENVELOPE-ERROR-AND-MESSAGE::" + _name_of("ENVELOPE-ERROR-AND-MESSAGE"),
        verdict=Verdict.NON_STRICT,
        failed_requirement="ENVELOPE-ERROR-AND-MESSAGE",
    )
    assert _verdict(results_of(records)) is RunVerdict.CONFORMANT
    assert _verdict(results_of(records, strict=True)) is RunVerdict.NOT_CONFORMANT


def test_requirements_introduced_later_are_not_applicable_and_do_not_make_a_run_incomplete() -> None:
    results = results_of(complete_records(), minor="1.0")
    later = [r for r in results["requirements"] if REGISTRY[r["id"]].minor > 0]
    assert later
    assert all(r["verdict"] == "not-applicable" for r in later)
    assert results["summary"]["applicable"] == len(REGISTRY) - len(later)
    assert _verdict(results) is RunVerdict.CONFORMANT


def test_a_machine_the_target_cannot_drive_is_not_covered_never_an_error(tmp_path: Path) -> None:
    """The session machine against a target that does not advertise worker sessions: its setup says so, and
    every requirement it judges is not covered, with no replay bundle (there is no failure to replay)."""
    from suite.machines.runner import MachineBudget, run_machine
    from suite.machines.sessions import SessionMachine

    target = TargetInfo(url="http://127.0.0.1:1", cluster_info={"worker_protocol": {"server_capabilities": {}}})
    result = run_machine(SessionMachine, target, MachineBudget(examples=2, steps=5), tmp_path)
    assert result.records
    assert {r.verdict for r in result.records} == {Verdict.NOT_COVERED}
    assert result.records[0].message == "the target does not advertise worker_sessions"
    assert list(tmp_path.iterdir()) == []


def test_a_machine_whose_examples_the_targets_timing_made_flaky_runs_them_again_one_by_one() -> None:
    """A precondition reads the model, which the target's answers (and their timing) shape; when one choice
    sequence takes two paths, Hypothesis raises Flaky* although nothing was violated. The machine then runs its
    examples again, each as its own Hypothesis run: no harness error, no verdict changed, the rerun in the ledger.
    """
    import itertools

    from hypothesis import strategies as st
    from hypothesis.stateful import precondition, rule

    from suite.machines.base import MachineBase
    from suite.machines.runner import MachineBudget, run_machine

    wobble = itertools.cycle([True, False, False])  # what the target's timing looks like to the machine

    class Wobbly(MachineBase):
        name = "wobbly"
        REQUIREMENTS: ClassVar[dict[str, str | None]] = {"VERSION-TRIM": "b_ran"}

        @rule(data=st.data())
        def a(self, data: st.DataObject) -> None:
            if next(wobble):
                data.draw(st.booleans())

        @precondition(lambda self: next(wobble))
        @rule(x=st.integers(0, 3))
        def b(self, x: int) -> None:
            self.ledger["b_ran"] += 1

    target = TargetInfo(url="http://127.0.0.1:1", cluster_info={"worker_protocol": {}})
    result = run_machine(Wobbly, target, MachineBudget(examples=60, steps=3, seed=3), None)
    assert not result.failed, result.message
    assert [r.verdict for r in result.records] == [Verdict.PASSED]
    assert result.records[0].ledger is not None
    assert result.records[0].ledger["examples_rerun_one_by_one"] == 1


def _replayed_another_way(first: BaseException, replay: BaseException) -> tuple[type[MachineBase], list[int]]:
    """A machine whose first example raises ``first`` after one draw, and whose replay of it (Hypothesis re-runs a
    failing example to report it) raises ``replay`` before drawing: the replay stops drawing earlier, so
    Hypothesis raises FlakyStrategyDefinition in place of ``first`` — what a fault proxy does to a machine whose
    failing example meets other faults when it is replayed. Later examples pass."""
    from hypothesis import strategies as st
    from hypothesis.stateful import rule

    executions = [0]

    class Replayed(MachineBase):
        name = "replayed"
        REQUIREMENTS: ClassVar[dict[str, str | None]] = {"VERSION-TRIM": None}

        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            executions[0] += 1
            if executions[0] == 1:
                data.draw(st.booleans())
                raise first
            if executions[0] == 2:
                raise replay

    return Replayed, executions


FAULTY = TargetInfo(url="http://127.0.0.1:1", cluster_info={"worker_protocol": {}}, fault_ledger=object())


def test_under_faults_a_replay_that_went_another_way_reports_what_the_example_raised() -> None:
    """The first execution's harness problem is the machine's outcome, named as itself: not Hypothesis'
    "Inconsistent data generation", which only says that the replay met other faults."""
    from suite.machines.runner import MachineBudget, run_machine

    machine, executions = _replayed_another_way(HarnessError("the test clock did not move"), HarnessError("other"))
    result = run_machine(machine, FAULTY, MachineBudget(examples=2, steps=3, seed=1, shrink=False), None)
    assert executions[0] == 2
    assert result.failed
    assert [r.verdict for r in result.records] == [Verdict.ERROR]
    assert "the test clock did not move" in result.message
    assert "Inconsistent data generation" not in result.message


def test_a_fault_of_the_machines_own_code_is_located_by_its_last_frames() -> None:
    """An exception the harness did not name (a bug in the machine's own bookkeeping) is a harness error whose
    message ends with the frames that raised it, so it can be found without rerunning."""
    from suite.machines.runner import MachineBudget, run_machine

    machine, _ = _replayed_another_way(KeyError("bookkeeping"), HarnessError("other"))
    result = run_machine(machine, FAULTY, MachineBudget(examples=2, steps=3, seed=1, shrink=False), None)
    assert [r.verdict for r in result.records] == [Verdict.ERROR]
    assert result.message.startswith("KeyError: 'bookkeeping'")
    assert ", in step\n" in result.message  # the rule of _replayed_another_way that raised it


def test_under_faults_a_violation_the_replay_did_not_repeat_is_still_a_failure() -> None:
    """A violation raised where the machine's own judging does not record it (the client's judgment of a resent
    or duplicated request) is the target's failure, even when the replay went another way."""
    from suite.machines.runner import MachineBudget, run_machine

    violation = CheckFailure("the resent poll was answered with another task", requirement="VERSION-TRIM")
    machine, _ = _replayed_another_way(violation, HarnessError("other"))
    result = run_machine(machine, FAULTY, MachineBudget(examples=2, steps=3, seed=1, shrink=False), None)
    assert [(r.verdict, r.failed_requirement) for r in result.records] == [(Verdict.FAILED, "VERSION-TRIM")]
    assert "the resent poll was answered with another task" in result.message


def test_a_violation_whose_replay_went_another_way_is_a_failure_without_faults_too() -> None:
    """Without faults a replay that goes another way sends the machine's examples to run again one by one; a
    violation the first execution raised (a check of the context's, so not the machine's own record) is still
    the target's failure, not lost among examples that pass."""
    from suite.machines.runner import MachineBudget, run_machine

    violation = CheckFailure("the poll answered without poll_status", requirement="VERSION-TRIM")
    machine, _ = _replayed_another_way(violation, HarnessError("other"))
    target = TargetInfo(url="http://127.0.0.1:1", cluster_info={"worker_protocol": {}})
    result = run_machine(machine, target, MachineBudget(examples=2, steps=3, seed=1), None)
    assert [(r.verdict, r.failed_requirement) for r in result.records] == [(Verdict.FAILED, "VERSION-TRIM")]
    assert "the poll answered without poll_status" in result.message


def test_under_faults_an_example_an_unknown_outcome_stopped_is_discarded_wherever_it_was_raised() -> None:
    """An unknown outcome ends the example without a verdict, also when it was raised outside ``run`` (so the
    machine did not count it): the example is discarded and another one runs."""
    from suite.machines.runner import MachineBudget, run_machine

    machine, executions = _replayed_another_way(Indeterminate("the answer was lost"), Indeterminate("lost again"))
    result = run_machine(machine, FAULTY, MachineBudget(examples=2, steps=3, seed=1, shrink=False), None)
    assert not result.failed, result.message
    assert [r.verdict for r in result.records] == [Verdict.PASSED]
    assert result.records[0].ledger == {"example_discarded_by_faults": 1}
    assert executions[0] > 2  # the examples after the discarded one ran


def _name_of(requirement: str) -> str:
    return next(e.name for e in entries() if e.test_id.startswith(f"dw::{requirement}::"))


# -- end to end ---------------------------------------------------------------------------------------------


def test_unreachable_target_is_one_line_and_a_distinct_exit_code(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, "--target=http://127.0.0.1:1", "-q")
    assert run.returncode == EXIT_HARNESS_ERROR
    lines = run.output.strip().splitlines()
    assert any(line.startswith("Exit: harness error: cannot connect to http://127.0.0.1:1") for line in lines)
    assert "Traceback" not in run.output


def test_one_requirement_is_incomplete_and_exits_0(tmp_path: Path) -> None:
    run = run_suite("embedded", tmp_path / "reports", "--requirement", "VERSION-TRIM")
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.results is not None
    assert run.results["summary"]["verdict"] == "INCOMPLETE"
    assert f"PARTIAL: 1 of {len(REGISTRY)} requirements checked" in run.stdout
    assert "\nCONFORMANT" not in run.stdout
    assert "[dw]" not in run.stdout  # -q: no progress lines


def test_a_selection_that_matches_nothing_is_a_harness_error(tmp_path: Path) -> None:
    run = run_suite("embedded", tmp_path / "reports", "-k", "nomatch")
    assert run.returncode == EXIT_HARNESS_ERROR, run.stdout[-3000:]
    assert run.results is not None
    assert run.results["summary"]["verdict"] == "HARNESS ERROR"
    assert "no verdict: no item ran (the selection -k 'nomatch')" in run.stdout


def test_collect_only_lists_stable_ids_writes_no_report_and_is_no_verdict(tmp_path: Path) -> None:
    """Listing the items is what was asked, so it exits 0 — and it is no verdict, neither a pass nor an error."""
    reports = tmp_path / "reports"
    run = run_suite("http://127.0.0.1:1", reports, "--collect-only")  # the target is not even contacted
    assert run.returncode == 0, run.stdout[-3000:]
    assert TRIM in run.stdout.splitlines()
    assert "dw::machine::workflow_leases" in run.stdout
    assert "dw::fuzz::stateful" in run.stdout
    assert "no verdict: --collect-only lists the items of the suite and runs none" in run.stdout
    for verdict in RunVerdict:
        assert verdict.value not in run.stdout
    assert run.results is None
    assert not reports.exists()


def test_one_item_is_rerun_by_its_id_from_outside_a_checkout(tmp_path: Path) -> None:
    run = run_suite("embedded", tmp_path / "reports", TRIM, "-vv")
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"{TRIM} PASSED" in run.stdout
    assert "[dw] versioning: 1 check done — 1 passed" in run.stdout  # the area's progress line
    assert run.results is not None
    assert [c["test_id"] for c in run.results["checks"]] == [TRIM]
    assert run.results["summary"]["verdict"] == "INCOMPLETE"


def test_an_item_of_the_suite_that_crashes_is_a_harness_error(tmp_path: Path) -> None:
    """A crash outside any verdict (here an exception raised around the item) never goes green."""
    (tmp_path / "crash_item.py").write_text(
        textwrap.dedent("""
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_call(item):
            raise RuntimeError("the suite broke")
        """),
        encoding="utf-8",
    )
    run = run_suite("embedded", tmp_path / "reports", TRIM, "-p", "crash_item", env={"PYTHONPATH": str(tmp_path)})
    assert run.returncode == EXIT_HARNESS_ERROR, run.stdout[-3000:]
    assert run.results is not None
    assert run.results["summary"]["verdict"] == "HARNESS ERROR"
    record = run.results["checks"][0]
    assert record["verdict"] == "error"
    assert "failed outside a requirement verdict" in record["message"]
    assert "RuntimeError: the suite broke" in record["message"]


@pytest.mark.slow
def test_a_server_on_default_settings_is_incomplete_with_the_exact_settings_that_cover_it(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """300 s leases and a 60 s query timeout: the requirements that need them are not covered, each naming
    --max-wait N (N computed) or the test-profile key with the reference server's flag."""
    server = server_factory("--query-timeout", "60")
    wanted = ("EXPIRY-SELF-RECOVERY", "QUERY-TIMEOUT-504")
    run = run_suite(
        server.url, tmp_path / "reports", "-m", "dw_check", *[a for r in wanted for a in ("--requirement", r)]
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.results is not None
    assert run.results["summary"]["verdict"] == "INCOMPLETE"
    rows = {r["id"]: r for r in run.results["requirements"]}
    lease = rows["EXPIRY-SELF-RECOVERY"]
    assert lease["verdict"] == "not-covered"
    assert lease["profile"] == "workflow_task_lease_seconds"
    assert lease["setting"].startswith("--max-wait 30"), lease["setting"]  # 300 s and more
    assert (
        "worker_protocol.test_profile.workflow_task_lease_seconds (reference server: --lease-seconds 3)"
        in (lease["setting"])
    )
    query = rows["QUERY-TIMEOUT-504"]
    assert query["setting"] == (
        "--max-wait 60, or a shorter worker_protocol.test_profile.query_task_timeout_seconds "
        "(reference server: --query-timeout 3)"
    )
    assert "DW_QUERY_TASK_TIMEOUT" not in json.dumps(run.results)
    assert "NOT COVERED EXPIRY-SELF-RECOVERY (MUST)" in run.stdout


def test_a_certification_run_that_left_applicable_cells_not_reached_is_incomplete_and_names_them() -> None:
    """A run whose machines could not reach every cell (as one against a target without deregistration, or whose
    waits cannot hold a run's timeout, leaves those): an ordinary run still CONFORMANT; a certification run
    INCOMPLETE, naming each entity and how many of its cells were not reached."""
    records = complete_records()
    kept = next(r for r in records if r.cells is not None).cells or {}
    cold = {k for k in kept if k.startswith("workflow_task/requeued/") or k.endswith("/time_out/clock")}
    partial = [
        replace(r, cells={k: v for k, v in (r.cells or {}).items() if k not in cold}) if r.cells is not None else r
        for r in records
    ]
    items = len(entries())
    assert _verdict(results_of(partial)) is RunVerdict.CONFORMANT
    results = results_of(partial, completeness=Completeness(items=items, certify=True))
    assert _verdict(results) is RunVerdict.INCOMPLETE
    summary = results["summary"]
    tasks = sum(1 for k in cold if k.startswith("workflow_task/"))
    assert summary["cells_not_reached"] == len(cold)
    assert summary["cells_not_reached_by_entity"] == {"workflow_task": [tasks, 121], "run": [len(cold) - tasks, 76]}
    gap = next(g for g in summary["gaps"] if "coverage cell" in g)
    assert f"{len(cold)} applicable coverage cells not reached: run {len(cold) - tasks} of 76, workflow_task" in gap
    assert f"workflow_task {tasks} of 121" in gap
    assert gap in summary["headline"]
    # Every cell reached: the certification run is complete.
    assert _verdict(results_of(records, completeness=Completeness(items=items, certify=True))) is RunVerdict.CONFORMANT
