"""The rejection matrices: §8.9 rows 1–6, §11.2, §11.3/§11.5 outcomes, the §11.5 heartbeat table and §10.6."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite.protocol import fencing
from suite.protocol.errors import Rejection
from suite.protocol.fencing import (
    ActivityAttemptView,
    QueryTaskView,
    WorkflowTaskView,
    activity_heartbeat_outcome,
    guard_activity_attempt,
    guard_activity_report,
    guard_query_task,
    guard_workflow_task,
    parse_rfc3339,
    rfc3339,
)
from suite.protocol.lifecycles import (
    AttemptEvent,
    AttemptStatus,
    ExecutionStatus,
    QueryTaskStatus,
    RunStatus,
    TaskStatus,
)

NOW = datetime(2026, 4, 18, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=300)
CLOSED_AT = NOW - timedelta(seconds=5)
V = TypeVar("V", WorkflowTaskView, ActivityAttemptView)


def closed(view: V, run: RunStatus, /, **changes: Any) -> V:
    """``view`` of a run that closed as ``run`` five seconds ago, with ``changes``."""
    return replace(view, run_status=run, run_closed_reason=run.value, run_closed_at=CLOSED_AT, **changes)


def test_exported_names_exist() -> None:
    for name in fencing.__all__:
        assert hasattr(fencing, name), name


def reject(call: Any, *args: Any, **kwargs: Any) -> Rejection:
    with pytest.raises(Rejection) as info:
        call(*args, **kwargs)
    return info.value


# ---------------------------------------------------------------------------------------------------------
# RFC 3339
# ---------------------------------------------------------------------------------------------------------


def test_rfc3339_writes_upstream_lease_form() -> None:
    assert rfc3339(NOW) == "2026-04-18T12:00:00.000000Z"
    plus2 = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 4, 18, 14, 0, 0, 123456, tzinfo=plus2)) == "2026-04-18T12:00:00.123456Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        rfc3339(datetime(2026, 4, 18, 12, 0))


@pytest.mark.parametrize(
    "text",
    [
        "2026-04-18T12:00:00Z",
        "2026-04-18T12:00:00.000000Z",
        "2026-04-18T12:00:00+00:00",
        "2026-04-18T12:00:00-00:00",
        "2026-04-18t12:00:00z",
        "2026-04-18 12:00:00Z",
        "2026-04-18T14:00:00+02:00",
        "2026-04-18T07:30:00-04:30",
        "2026-04-18T12:00:00.000000000Z",
    ],
)
def test_parse_rfc3339_accepts_every_form(text: str) -> None:
    assert parse_rfc3339(text) == NOW
    assert parse_rfc3339(text).tzinfo is UTC


def test_parse_rfc3339_fractions_and_leap_second() -> None:
    assert parse_rfc3339("2026-04-18T12:00:00.5Z") == NOW + timedelta(microseconds=500_000)
    assert parse_rfc3339("2026-04-18T12:00:00.1234567Z") == NOW + timedelta(microseconds=123_456)
    assert parse_rfc3339("2016-12-31T23:59:60Z") == datetime(2016, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-04-18",
        "2026-04-18T12:00:00",
        "2026-04-18T12:00Z",
        "2026-13-01T00:00:00Z",
        "2026-04-18T12:00:00+2",
        "2026-04-18T12:00:00+24:00",
        "x2026-04-18T12:00:00Z",
        "2026-04-18T12:00:00.Z",
        12,
    ],
)
def test_parse_rfc3339_rejects_non_rfc3339(text: object) -> None:
    with pytest.raises(ValueError, match=r"RFC 3339|date-time|offset"):
        parse_rfc3339(text)


@given(st.datetimes(timezones=st.just(UTC)))
def test_rfc3339_round_trip(dt: datetime) -> None:
    assert parse_rfc3339(rfc3339(dt)) == dt


# ---------------------------------------------------------------------------------------------------------
# §8.9 workflow-task matrix
# ---------------------------------------------------------------------------------------------------------

LIVE_TASK = WorkflowTaskView(
    task_id="t1",
    status=TaskStatus.LEASED,
    attempt=2,
    lease_owner="w1",
    lease_expires_at=LATER,
    run_status=RunStatus.RUNNING,
    run_closed_reason=None,
    run_closed_at=None,
)


def wf(view: WorkflowTaskView | None, owner: str = "w1", attempt: int = 2, task_id: str = "t1") -> Rejection:
    return reject(guard_workflow_task, view, task_id=task_id, lease_owner=owner, attempt=attempt, now=NOW)


def test_owner_with_live_lease_passes() -> None:
    assert guard_workflow_task(LIVE_TASK, task_id="t1", lease_owner="w1", attempt=2, now=NOW) is None


def test_row1_task_not_found() -> None:
    err = wf(None, task_id="nope", attempt=3)
    assert (err.status, err.reason) == (404, "task_not_found")
    assert err.fields == {"task_id": "nope", "workflow_task_attempt": 3}


@pytest.mark.parametrize(
    ("run_status", "cancel_requested", "stop_reason"),
    [
        (RunStatus.CANCELLED, True, "run_cancelled"),
        (RunStatus.TERMINATED, True, "run_terminated"),
        (RunStatus.COMPLETED, False, "run_completed"),
        (RunStatus.FAILED, False, "run_failed"),
    ],
)
def test_row2_run_closed_task_not_leased(run_status: RunStatus, cancel_requested: bool, stop_reason: str) -> None:
    view = closed(LIVE_TASK, run_status, status=TaskStatus.CANCELLED if cancel_requested else TaskStatus.COMPLETED)
    err = wf(view)
    assert (err.status, err.reason) == (409, "run_closed")
    body = err.body()
    assert body["error"] == "Workflow run is already closed."
    assert "outcome" not in body
    assert err.fields == {
        "task_id": "t1",
        "can_continue": False,
        "cancel_requested": cancel_requested,
        "stop_reason": stop_reason,
        "run_status": run_status.value,
        "run_closed_reason": run_status.value,
        "run_closed_at": "2026-04-18T11:59:55.000000Z",
        "task_status": view.status.value,
        "lease_owner": "w1",
        "lease_expires_at": "2026-04-18T12:05:00.000000Z",
    }


@pytest.mark.parametrize("run_status", [RunStatus.CANCELLED, RunStatus.TERMINATED])
@pytest.mark.parametrize(
    ("owner", "attempt", "expires"),
    [("w1", 2, LATER), ("intruder", 2, LATER), ("w1", 9, LATER), ("intruder", 9, NOW - timedelta(seconds=1))],
)
def test_row2_cancel_during_lease_beats_every_later_row(
    run_status: RunStatus, owner: str, attempt: int, expires: datetime
) -> None:
    # §8.9 notes: "The run-closed check comes before the owner and attempt checks, so every caller sees
    # run_closed."
    view = closed(LIVE_TASK, run_status, lease_expires_at=expires)
    err = wf(view, owner=owner, attempt=attempt)
    assert err.reason == "run_closed"
    assert err.fields["cancel_requested"] is True
    assert err.fields["task_status"] == "leased"
    assert err.fields["stop_reason"] == f"run_{run_status.value}"


def test_row2_after_completing_batch_closed_the_run() -> None:
    # §16 #29: a second complete after the batch closed the run → run_closed, stop_reason run_completed.
    view = replace(
        LIVE_TASK,
        status=TaskStatus.COMPLETED,
        run_status=RunStatus.COMPLETED,
        run_closed_reason="completed",
        run_closed_at=CLOSED_AT,
    )
    err = wf(view)
    assert (err.reason, err.fields["stop_reason"], err.fields["cancel_requested"]) == (
        "run_closed",
        "run_completed",
        False,
    )


@pytest.mark.parametrize("status", [TaskStatus.READY, TaskStatus.COMPLETED, TaskStatus.FAILED])
@pytest.mark.parametrize("run_status", [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING])
def test_row3_task_not_leased_on_live_run(status: TaskStatus, run_status: RunStatus) -> None:
    err = wf(replace(LIVE_TASK, status=status, run_status=run_status), owner="someone-else", attempt=7)
    assert (err.status, err.reason) == (409, "task_not_leased")
    assert err.fields == {"task_id": "t1", "task_status": status.value}


@pytest.mark.parametrize("expires", [NOW, NOW - timedelta(seconds=30), None])
@pytest.mark.parametrize(("owner", "attempt"), [("w1", 2), ("intruder", 2), ("w1", 3), ("intruder", 3)])
def test_row4_lease_expired_whoever_asks(expires: datetime | None, owner: str, attempt: int) -> None:
    err = wf(replace(LIVE_TASK, lease_expires_at=expires), owner=owner, attempt=attempt)
    assert (err.status, err.reason) == (409, "lease_expired")
    assert err.fields == {
        "task_id": "t1",
        "task_status": "leased",
        "lease_owner": "w1",
        "lease_expires_at": None if expires is None else rfc3339(expires),
    }


def test_row5_owner_mismatch_names_current_owner_and_precedes_attempt() -> None:
    for attempt in (2, 1, 3):
        err = wf(LIVE_TASK, owner="intruder", attempt=attempt)
        assert (err.status, err.reason) == (409, "lease_owner_mismatch")
        assert err.fields == {"task_id": "t1", "lease_owner": "w1"}


@pytest.mark.parametrize("attempt", [1, 3, 0])
def test_row6_attempt_mismatch(attempt: int) -> None:
    err = wf(LIVE_TASK, attempt=attempt)
    assert (err.status, err.reason) == (409, "workflow_task_attempt_mismatch")
    assert err.fields == {"task_id": "t1", "current_attempt": 2}


def test_outcome_is_ok_or_the_rejection_reason() -> None:
    assert fencing.outcome(guard_workflow_task, LIVE_TASK, task_id="t1", lease_owner="w1", attempt=2, now=NOW) == "ok"
    stale = fencing.outcome(guard_workflow_task, LIVE_TASK, task_id="t1", lease_owner="w1", attempt=1, now=NOW)
    assert stale == "workflow_task_attempt_mismatch"


def test_stale_attempt_after_takeover() -> None:
    # §8.9 notes: row 6 if the same worker re-leased the task, row 5 if another worker did.
    relet_same = replace(LIVE_TASK, attempt=3)
    assert wf(relet_same, owner="w1", attempt=2).reason == "workflow_task_attempt_mismatch"
    relet_other = replace(LIVE_TASK, attempt=3, lease_owner="w2")
    assert wf(relet_other, owner="w1", attempt=2).reason == "lease_owner_mismatch"


# ---------------------------------------------------------------------------------------------------------
# §11.2 ownership, §11.3/§11.5 report outcomes, §11.5 heartbeat
# ---------------------------------------------------------------------------------------------------------

LIVE_ATTEMPT = ActivityAttemptView(
    attempt_id="a1",
    task_id="at1",
    attempt_number=1,
    attempt_status=AttemptStatus.RUNNING,
    lease_owner="w1",
    lease_expires_at=LATER,
    task_status=TaskStatus.LEASED,
    task_current_attempt_id="a1",
    execution_status=ExecutionStatus.RUNNING,
    execution_current_task_id="at1",
    run_status=RunStatus.WAITING,
    run_closed_reason=None,
    run_closed_at=None,
)


def own(
    view: ActivityAttemptView | None,
    *,
    task_exists: bool = True,
    task_id: str = "at1",
    attempt_id: str = "a1",
    owner: str = "w1",
) -> Rejection:
    return reject(
        guard_activity_attempt,
        view,
        task_exists=task_exists,
        task_id=task_id,
        activity_attempt_id=attempt_id,
        lease_owner=owner,
    )


def test_activity_owner_passes_and_gets_the_view_back() -> None:
    got = guard_activity_attempt(
        LIVE_ATTEMPT, task_exists=True, task_id="at1", activity_attempt_id="a1", lease_owner="w1"
    )
    assert got is LIVE_ATTEMPT


def test_activity_task_not_found_first() -> None:
    err = own(None, task_exists=False, task_id="zz", owner="intruder")
    assert (err.status, err.reason) == (404, "task_not_found")
    assert err.fields == {"task_id": "zz", "activity_attempt_id": "a1"}


def test_activity_attempt_not_found() -> None:
    err = own(None, attempt_id="ghost", owner="intruder")
    assert (err.status, err.reason) == (404, "attempt_not_found")
    assert err.fields == {"task_id": "at1", "activity_attempt_id": "ghost"}


def test_activity_task_mismatch_before_owner() -> None:
    err = own(LIVE_ATTEMPT, task_id="other-task", owner="intruder")
    assert (err.status, err.reason) == (409, "task_mismatch")
    assert err.fields == {"task_id": "other-task", "activity_attempt_id": "a1", "attempt_task_id": "at1"}


def test_activity_owner_mismatch_names_actual_owner() -> None:
    err = own(LIVE_ATTEMPT, owner="intruder")
    assert (err.status, err.reason) == (409, "lease_owner_mismatch")
    assert err.fields == {"task_id": "at1", "activity_attempt_id": "a1", "lease_owner": "w1"}


@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_live_attempt_may_report(verb: Any) -> None:
    assert guard_activity_report(LIVE_ATTEMPT, verb=verb, now=NOW) is None


@pytest.mark.parametrize(
    "stale",
    [
        replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.COMPLETED, task_status=TaskStatus.COMPLETED),
        replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.FAILED, task_status=TaskStatus.COMPLETED),
        replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.EXPIRED, task_current_attempt_id="a2"),
        replace(LIVE_ATTEMPT, task_current_attempt_id="a2"),
        replace(LIVE_ATTEMPT, lease_expires_at=NOW),
        replace(LIVE_ATTEMPT, lease_expires_at=None),
    ],
)
@pytest.mark.parametrize(("verb", "outcome"), [("complete", "completed"), ("fail", "failed")])
def test_stale_attempt_report(stale: ActivityAttemptView, verb: Any, outcome: str) -> None:
    # §11.3: "A duplicate or late complete gets 409 with outcome:"completed", recorded:false and
    # reason:"stale_attempt"".
    err = reject(guard_activity_report, stale, verb=verb, now=NOW)
    assert (err.status, err.reason) == (409, "stale_attempt")
    assert err.fields == {
        "task_id": "at1",
        "activity_attempt_id": "a1",
        "outcome": outcome,
        "recorded": False,
        "attempt_status": stale.attempt_status.value,
    }


@pytest.mark.parametrize(
    ("run_status", "reason", "cancel_requested"),
    [
        (RunStatus.CANCELLED, "run_cancelled", True),
        (RunStatus.TERMINATED, "run_terminated", True),
        (RunStatus.COMPLETED, "run_closed", False),
        (RunStatus.FAILED, "run_closed", False),
    ],
)
@pytest.mark.parametrize("attempt_status", [AttemptStatus.RUNNING, AttemptStatus.CANCELLED])
@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_report_after_run_close_is_ignored(
    run_status: RunStatus, reason: str, cancel_requested: bool, attempt_status: AttemptStatus, verb: Any
) -> None:
    view = closed(LIVE_ATTEMPT, run_status, attempt_status=attempt_status)
    err = reject(guard_activity_report, view, verb=verb, now=NOW)
    assert (err.status, err.reason) == (409, reason)
    assert err.body()["error"] == "Activity outcome ignored because the workflow run is already closed."
    assert err.fields == {
        "task_id": "at1",
        "activity_attempt_id": "a1",
        "outcome": "ignored",
        "recorded": False,
        "cancel_requested": cancel_requested,
        "can_continue": False,
        "run_status": run_status.value,
        "run_closed_reason": run_status.value,
        "run_closed_at": "2026-04-18T11:59:55.000000Z",
        "activity_status": "cancelled",
        "attempt_status": "cancelled",
        "task_status": "cancelled",
        "lease_owner": "w1",
        "lease_expires_at": None,
    }


def test_heartbeat_live() -> None:
    d = activity_heartbeat_outcome(LIVE_ATTEMPT, now=NOW)
    assert d.fields() == {
        "can_continue": True,
        "cancel_requested": False,
        "reason": None,
        "heartbeat_recorded": True,
        "run_closed_reason": None,
        "run_closed_at": None,
    }
    assert d.closes_attempt is None


def _closed_run(status: RunStatus) -> ActivityAttemptView:
    return closed(LIVE_ATTEMPT, status)


# §11.5 table: reason → cancel_requested; each view produces exactly that row.
HEARTBEAT_TABLE: list[tuple[str, ActivityAttemptView, bool, AttemptEvent | None]] = [
    ("run_cancelled", _closed_run(RunStatus.CANCELLED), True, AttemptEvent.CANCEL),
    ("run_terminated", _closed_run(RunStatus.TERMINATED), True, AttemptEvent.CANCEL),
    ("run_closed", _closed_run(RunStatus.COMPLETED), False, AttemptEvent.CANCEL),
    ("run_closed", _closed_run(RunStatus.FAILED), False, AttemptEvent.CANCEL),
    (
        "activity_cancelled",
        replace(LIVE_ATTEMPT, execution_status=ExecutionStatus.CANCELLED),
        True,
        AttemptEvent.CANCEL,
    ),
    ("task_cancelled", replace(LIVE_ATTEMPT, task_status=TaskStatus.CANCELLED), True, AttemptEvent.CANCEL),
    (
        "stale_task",
        replace(
            LIVE_ATTEMPT,
            attempt_status=AttemptStatus.FAILED,
            task_status=TaskStatus.COMPLETED,
            execution_status=ExecutionStatus.PENDING,
            execution_current_task_id="at2",
        ),
        False,
        None,
    ),
    (
        "activity_not_running",
        replace(
            LIVE_ATTEMPT,
            attempt_status=AttemptStatus.COMPLETED,
            task_status=TaskStatus.COMPLETED,
            execution_status=ExecutionStatus.COMPLETED,
        ),
        False,
        None,
    ),
    (
        "task_not_leased",
        replace(
            LIVE_ATTEMPT,
            attempt_status=AttemptStatus.EXPIRED,
            task_status=TaskStatus.READY,
            task_current_attempt_id=None,
            execution_status=ExecutionStatus.RUNNING,
        ),
        False,
        None,
    ),
    (
        "stale_attempt",
        replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.EXPIRED, task_current_attempt_id="a2"),
        False,
        None,
    ),
    ("stale_attempt", replace(LIVE_ATTEMPT, lease_expires_at=NOW), False, AttemptEvent.EXPIRE),
    ("attempt_closed", replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.COMPLETED), False, None),
    ("attempt_closed", replace(LIVE_ATTEMPT, attempt_status=AttemptStatus.CANCELLED), True, None),
]


@pytest.mark.parametrize(
    ("reason", "view", "cancel_requested", "closes"),
    HEARTBEAT_TABLE,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(HEARTBEAT_TABLE)],
)
def test_heartbeat_table(
    reason: str, view: ActivityAttemptView, cancel_requested: bool, closes: AttemptEvent | None
) -> None:
    d = activity_heartbeat_outcome(view, now=NOW)
    assert d.reason == reason
    assert d.cancel_requested is cancel_requested
    assert d.can_continue is False
    assert d.heartbeat_recorded is False
    assert d.closes_attempt is closes
    assert d.run_closed_reason == view.run_closed_reason
    assert d.run_closed_at == (None if view.run_closed_at is None else rfc3339(view.run_closed_at))


def test_heartbeat_after_cancel_reports_closed_run_fields() -> None:
    # §11.5: "run_closed_reason:"cancelled"|"terminated" and a non-null run_closed_at".
    d = activity_heartbeat_outcome(_closed_run(RunStatus.TERMINATED), now=NOW)
    assert d.run_closed_reason == "terminated"
    assert d.run_closed_at == "2026-04-18T11:59:55.000000Z"
    # An attempt the first heartbeat already cancelled is not closed twice.
    again = replace(_closed_run(RunStatus.TERMINATED), attempt_status=AttemptStatus.CANCELLED)
    assert activity_heartbeat_outcome(again, now=NOW).closes_attempt is None


# ---------------------------------------------------------------------------------------------------------
# §10.6 query-task matrix
# ---------------------------------------------------------------------------------------------------------

LIVE_QUERY = QueryTaskView(
    query_task_id="q1", status=QueryTaskStatus.LEASED, attempt=1, lease_owner="w1", lease_expires_at=LATER
)


def qt(view: QueryTaskView | None, owner: str = "w1", attempt: int = 1) -> Rejection:
    return reject(guard_query_task, view, query_task_id="q1", lease_owner=owner, attempt=attempt, now=NOW)


def test_query_owner_passes() -> None:
    assert guard_query_task(LIVE_QUERY, query_task_id="q1", lease_owner="w1", attempt=1, now=NOW) is None


def test_query_not_found() -> None:
    err = qt(None)
    assert (err.status, err.reason) == (404, "query_task_not_found")
    assert err.fields == {"query_task_id": "q1", "query_task_attempt": 1, "outcome": "rejected"}


@pytest.mark.parametrize(
    "status",
    [QueryTaskStatus.PENDING, QueryTaskStatus.COMPLETED, QueryTaskStatus.FAILED, QueryTaskStatus.TIMED_OUT],
)
def test_query_not_leased_first(status: QueryTaskStatus) -> None:
    err = qt(replace(LIVE_QUERY, status=status, lease_expires_at=NOW), owner="intruder", attempt=5)
    assert (err.status, err.reason) == (409, "query_task_not_leased")
    assert err.fields == {"query_task_id": "q1", "query_task_status": status.value, "outcome": "rejected"}


def test_query_owner_before_attempt_before_expiry() -> None:
    expired = replace(LIVE_QUERY, lease_expires_at=NOW)
    err = qt(expired, owner="intruder", attempt=2)
    assert (err.status, err.reason) == (409, "lease_owner_mismatch")
    assert err.fields == {"query_task_id": "q1", "lease_owner": "w1", "outcome": "rejected"}
    err = qt(expired, attempt=2)
    assert (err.status, err.reason) == (409, "query_task_attempt_mismatch")
    assert err.fields == {"query_task_id": "q1", "current_attempt": 1, "outcome": "rejected"}
    err = qt(expired)
    assert (err.status, err.reason) == (409, "lease_expired")
    assert err.fields == {
        "query_task_id": "q1",
        "lease_expires_at": "2026-04-18T12:00:00.000000Z",
        "outcome": "rejected",
    }


def test_every_query_rejection_has_error_text() -> None:
    for err in (
        qt(None),
        qt(replace(LIVE_QUERY, status=QueryTaskStatus.COMPLETED)),
        qt(LIVE_QUERY, owner="x"),
    ):
        assert err.body()["error"]
        assert err.body()["outcome"] == "rejected"
