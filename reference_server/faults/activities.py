"""Faults of activities: retries (their bound, the non-retryable flag, the backoff), attempt numbers, a result
recorded for an attempt that is no longer live, and timeouts that are validated but not applied."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from suite.protocol.commands import ActivityFailure, ActivityFence, RetryPolicy
from suite.protocol.lifecycles import AttemptStatus

from .. import activities
from ..engine import append_event
from ..tx import T
from .patching import wraps


@wraps("retry-past-max-attempts", activities, "failure_policy")
def _unbounded(original: Callable[..., RetryPolicy], execution: sqlite3.Row, attempt_number: int) -> RetryPolicy:
    return replace(original(execution, attempt_number), max_attempts=attempt_number + 1)  # never reached


@wraps("retry-non-retryable", activities, "fail_activity_task")
def _flag_ignored(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, failure: ActivityFailure
) -> Any:
    return original(t, namespace, task_id, fence, replace(failure, non_retryable=False))  # the worker's flag dropped


@wraps("ignore-retry-backoff", activities, "retry_ready_at")
def _ready_at_once(original: Callable[[T, int], int], t: T, backoff: int) -> int:
    return t.now  # the backoff is recorded in history, but the retry is leasable at once


@wraps("record-stale-activity-complete", activities, "complete_activity_task")
def _record_again(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, result_blob: str | None
) -> Any:
    """An attempt that is no longer live still records its result (a second ActivityCompleted)."""
    view, rows = activities.guarded(t, namespace, task_id, fence)
    if view.attempt_status is AttemptStatus.RUNNING:
        return original(t, namespace, task_id, fence, result_blob)
    base = activities._event_base(rows.execution, rows.attempt["attempt_id"], rows.attempt["attempt_number"])
    append_event(t, rows.run["run_id"], "ActivityCompleted", {**base, "result": result_blob})
    return {
        "task_id": task_id,
        "activity_attempt_id": fence.activity_attempt_id,
        "activity_execution_id": rows.execution["execution_id"],
        "outcome": "completed",
        "recorded": True,
        "reason": None,
        "next_task_id": None,
    }


@wraps("retry-attempt-restarts-after-heartbeat", activities, "task_payload")
def _numbered_from_one(original: Callable[[T, str], dict[str, Any]], t: T, task_id: str) -> dict[str, Any]:
    """The retry that follows an attempt which heartbeated and failed is shown as attempt 1 again."""
    body = original(t, task_id)
    before = t.one(
        "SELECT b.task_id, b.status, b.last_heartbeat_at FROM activity_attempts a JOIN activity_attempts b"
        " ON b.execution_id = a.execution_id AND b.attempt_number = a.attempt_number - 1 WHERE a.attempt_id = ?",
        body["activity_attempt_id"],
    )
    failed = before is not None and before["task_id"] != task_id and before["status"] == "failed"
    if failed and before is not None and before["last_heartbeat_at"]:
        body.update(attempt_number=1, attempt=1)
    return body


@wraps("heartbeat-records-first-attempt", activities, "record_heartbeat")
def _first_attempt(
    original: Callable[..., None], t: T, execution: sqlite3.Row, attempt: Mapping[str, Any], *args: Any
) -> None:
    original(t, execution, {**dict(attempt), "attempt_number": 1}, *args)


def _held_before(t: T, task_id: str, worker: str, attempt_id: str) -> bool:
    """Whether ``worker`` held an earlier attempt of ``task_id`` than ``attempt_id`` (a lease it lost)."""
    return (
        t.one(
            "SELECT 1 FROM activity_attempts a JOIN activity_attempts b ON b.task_id = a.task_id"
            " AND b.attempt_number < a.attempt_number WHERE a.attempt_id = ? AND b.lease_owner = ?",
            attempt_id,
            worker,
        )
        is not None
    )


@wraps("activity-former-holder-reports", activities, "_reported")
def _former_holder_owns(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, verb: Any
) -> Any:
    """The worker whose lease of a task lapsed and was redelivered still passes the ownership guard when it
    reports with the new attempt's id: its complete or fail is recorded for the new holder's attempt."""
    row = t.one("SELECT lease_owner FROM activity_attempts WHERE attempt_id = ?", fence.activity_attempt_id)
    lost = row is not None and row["lease_owner"] != fence.lease_owner
    if lost and row is not None and _held_before(t, task_id, fence.lease_owner, fence.activity_attempt_id):
        fence = replace(fence, lease_owner=row["lease_owner"])
    return original(t, namespace, task_id, fence, verb)


@wraps("activity-closed-run-skips-owner-check", activities, "guarded")
def _closed_run_unfenced(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, **how: Any
) -> Any:
    """Once an attempt's run is closed, any worker naming the attempt passes the ownership guard: it is told of
    the cancellation (a heartbeat's stop, a report's run_cancelled) instead of lease_owner_mismatch."""
    row = t.one(
        "SELECT a.lease_owner FROM activity_attempts a JOIN activity_executions e ON e.execution_id = a.execution_id"
        " JOIN runs r ON r.run_id = e.run_id WHERE a.attempt_id = ? AND r.status IN ('cancelled', 'terminated')",
        fence.activity_attempt_id,
    )
    if row is not None and row["lease_owner"] != fence.lease_owner:
        fence = replace(fence, lease_owner=row["lease_owner"])
    return original(t, namespace, task_id, fence, **how)


def _skipped(kind: str, column: str, table: str, key: str) -> Callable[..., None]:
    """A wrap of ``activities._time_out`` under which a ``kind`` expiry does nothing but forget its deadline (so the
    enforcer does not find it due again and again)."""

    def skip(
        original: Callable[..., None],
        t: T,
        execution: sqlite3.Row,
        task: sqlite3.Row | None,
        attempt: sqlite3.Row | None,
        timeout_type: str,
    ) -> None:
        if timeout_type != kind:
            return original(t, execution, task, attempt, timeout_type)
        row = attempt if table == "activity_attempts" else task
        assert row is not None
        t.db.execute(f"UPDATE {table} SET {column} = NULL WHERE {key} = ?", (row[key],))
        return None

    return skip


wraps("heartbeat-timeout-ignored", activities, "_time_out")(
    _skipped("heartbeat", "heartbeat_deadline", "activity_attempts", "attempt_id")
)
wraps("start-to-close-ignored", activities, "_time_out")(
    _skipped("start_to_close", "start_to_close_deadline", "activity_attempts", "attempt_id")
)
wraps("schedule-to-start-ignored", activities, "_time_out")(
    _skipped("schedule_to_start", "schedule_to_start_deadline", "activity_tasks", "task_id")
)


@wraps("heartbeat-timeout-from-claim", activities, "heartbeat_activity_task")
def _deadline_kept(
    original: Callable[..., dict[str, Any]],
    t: T,
    namespace: str,
    task_id: str,
    fence: ActivityFence,
    progress: Any,
    *,
    renew: bool = True,
) -> dict[str, Any]:
    """The heartbeat renews the lease, and the heartbeat deadline is put back where the claim set it."""
    before = t.one("SELECT heartbeat_deadline FROM activity_attempts WHERE attempt_id = ?", fence.activity_attempt_id)
    answer = original(t, namespace, task_id, fence, progress, renew=renew)
    if before is not None:
        t.db.execute(
            "UPDATE activity_attempts SET heartbeat_deadline = ? WHERE attempt_id = ?",
            (before["heartbeat_deadline"], fence.activity_attempt_id),
        )
    return answer


@wraps("schedule-to-close-restarts-on-retry", activities, "_schedule_retry")
def _deadline_restarted(original: Callable[..., str], t: T, execution: sqlite3.Row, *args: Any) -> str:
    task_id = original(t, execution, *args)
    t.db.execute(
        "UPDATE activity_executions SET schedule_to_close_deadline = ? + schedule_to_close_timeout * ?"
        " WHERE execution_id = ? AND schedule_to_close_timeout IS NOT NULL",
        (t.now, activities.US, execution["execution_id"]),
    )
    return task_id


@wraps("failure-stack-in-message", activities, "fail_activity_task")
def _stack_in_message(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, failure: ActivityFailure
) -> Any:
    if failure.stack_trace:
        failure = replace(failure, message=f"{failure.message}\n{failure.stack_trace}")
    return original(t, namespace, task_id, fence, failure)


@wraps("failure-drops-code", activities, "fail_activity_task")
def _code_dropped(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, failure: ActivityFailure
) -> Any:
    return original(t, namespace, task_id, fence, replace(failure, code=None))


@wraps("failure-non-retryable-as-sent", activities, "fail_activity_task")
def _flag_as_sent(
    original: Callable[..., Any], t: T, namespace: str, task_id: str, fence: ActivityFence, failure: ActivityFailure
) -> Any:
    """The retry decision is the server's, but the ActivityFailed it wrote is rewritten to the worker's own flag."""
    answer = original(t, namespace, task_id, fence, failure)
    t.db.execute(
        "UPDATE history SET payload = json_set(payload, '$.non_retryable', json(?)) WHERE event_type = 'ActivityFailed'"
        " AND json_extract(payload, '$.activity_attempt_id') = ?",
        ("true" if failure.non_retryable else "false", fence.activity_attempt_id),
    )
    return answer


@wraps("status-renews-lease", activities, "heartbeat_activity_task")
def _status_renews(original: Callable[..., dict[str, Any]], *args: Any, renew: bool = True) -> dict[str, Any]:
    return {**original(*args, renew=True), **({} if renew else {"heartbeat_recorded": False})}


@wraps("status-hides-cancellation", activities, "heartbeat_activity_task")
def _status_hides(original: Callable[..., dict[str, Any]], *args: Any, renew: bool = True) -> dict[str, Any]:
    answer = original(*args, renew=renew)
    return answer if renew else {**answer, "cancel_requested": False, "can_continue": True}
