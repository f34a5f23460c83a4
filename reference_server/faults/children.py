"""Faults of closing runs, children and cooperative cancellation: what a closed run leaves open, the parent-close
policy a child is recorded with, how a request to cancel is answered, delivered and enforced, and a child's
retries and timeouts."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from suite.protocol.commands import RetryPolicy
from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import RunEvent

from .. import cancellation, closing, commands, engine, workflow_tasks
from ..store import new_id
from ..tx import T
from .patching import wraps


@wraps("cancel-leaves-tasks-open", closing, "close_what_it_leaves")
def _left_open(original: Callable[..., None], t: T, run_id: str, event: RunEvent, *args: Any) -> None:
    if event not in (RunEvent.CANCEL, RunEvent.TERMINATE):  # cancelled or terminated, its work is left as it was
        original(t, run_id, event, *args)


@wraps("child-default-terminate", commands, "omitted_parent_close_policy")
def _terminate_by_default(original: Callable[[], str]) -> str:
    return "terminate"  # an omitted policy closes the child with its parent


@wraps("request-cancellation-closes-at-once", closing, "ask_child_to_cancel")
def _at_once(
    original: Callable[..., None], t: T, child_run: sqlite3.Row, child: sqlite3.Row, closing_payload: Mapping[str, Any]
) -> None:
    closing.cancel_child_at_once(t, child_run["run_id"], closing_payload)  # like request_cancel


@wraps("request-cancellation-never-closes", closing, "close_past_cleanup_deadline")
def _never_enforced(original: Callable[[T], None], t: T) -> None:
    return None  # a child asked to cancel that does not close stays open past its deadline


@wraps("request-cancellation-new-identity", cancellation, "client_request")
def _new_identity(
    original: Callable[..., dict[str, Any]], t: T, run: sqlite3.Row, seconds: int | None, reason: str | None
) -> dict[str, Any]:
    """A repeated request replaces the original identity and deadline instead of answering them."""
    row = cancellation._open_request(t, run["run_id"])
    if row is not None:
        lasting = seconds or t.settings.cancellation_cleanup_seconds
        again = (new_id(t.now), t.now + lasting * cancellation.US, row["request_id"])
        t.db.execute(
            "UPDATE cancellation_requests SET request_id = ?, cleanup_deadline_at = ? WHERE request_id = ?", again
        )
    answer = original(t, run, seconds, reason)
    if row is not None:
        answer["duplicate"] = False
    return answer


@wraps("child-wake-without-context", closing, "child_wake_context")
def _no_child_context(
    original: Callable[..., dict[str, Any]], call: sqlite3.Row, child_run: sqlite3.Row
) -> dict[str, Any]:
    return {}  # the parent is woken, but its task names no child wait (every resume field null)


@wraps("request-cancel-leaves-child-open", closing, "cancel_child_at_once")
def _request_cancel_ignored(
    original: Callable[..., None], t: T, child_run_id: str, closing_payload: Mapping[str, Any]
) -> None:
    return None  # the parent closes; its request_cancel child runs on


# -- a child's retries and timeouts -------------------------------------------------------------------------


@wraps("child-retry-without-backoff", closing, "child_retry_delay")
def _no_backoff(original: Callable[[RetryPolicy, int], int], policy: RetryPolicy, attempt: int) -> int:
    return 0  # a failed child run is retried at once, whatever backoff its policy gives


# Runs whose batches had a start_child_workflow rejected, and how many: the attempts those starts spent.
_SPENT: dict[str, int] = {}


@wraps("invalid-child-start-spends-attempt", workflow_tasks, "validated_batch")
def _count_rejected_starts(
    original: Callable[..., list[Any]], t: T, task: sqlite3.Row, commands_sent: Any, open_updates: list[str]
) -> list[Any]:
    try:
        return original(t, task, commands_sent, open_updates)
    except Rejection:
        if isinstance(commands_sent, list) and any(
            isinstance(c, dict) and c.get("type") == "start_child_workflow" for c in commands_sent
        ):
            _SPENT[task["run_id"]] = _SPENT.get(task["run_id"], 0) + 1
        raise


@wraps("invalid-child-start-spends-attempt", engine, "start_child_run")
def _first_run_counts_spent(original: Callable[..., str], t: T, call: sqlite3.Row, parent: sqlite3.Row) -> str:
    spent = _SPENT.pop(parent["run_id"], 0) if not call["current_run_id"] else 0
    if spent:  # the child's first run counts the attempts its rejected starts spent
        t.db.execute(
            "UPDATE children SET attempt = attempt + ? WHERE child_call_id = ?", (spent, call["child_call_id"])
        )
        again = t.one("SELECT * FROM children WHERE child_call_id = ?", call["child_call_id"])
        assert again is not None
        call = again
    return original(t, call, parent)


@wraps("child-run-timeout-ignored", engine, "run_deadline")
def _no_run_timeout(
    original: Callable[..., int | None], now: int, run_timeout_seconds: int | None, execution_deadline: int | None
) -> int | None:
    return original(now, None, execution_deadline)  # run_timeout_seconds never closes a run


@wraps("child-execution-timeout-per-run", engine, "child_execution_deadline")
def _deadline_per_run(original: Callable[[T, sqlite3.Row], int | None], t: T, call: sqlite3.Row) -> int | None:
    return None  # each retry of a child starts its execution_timeout_seconds afresh


# -- bugs only the child sweep's cells show (a parent cancelled by the operator, a second child result, a later
# task of a child asked to clean up, a delivered request's deadline) ----------------------------------------


@wraps("abandon-child-cancelled-with-parent", closing, "close_what_it_leaves")
def _abandon_cancelled(
    original: Callable[..., None], t: T, run_id: str, event: RunEvent, run: sqlite3.Row, *args: Any
) -> None:
    original(t, run_id, event, run, *args)
    if event is not RunEvent.CANCEL:
        return  # a parent that closes itself leaves its abandon children running, as it must
    for call in t.all("SELECT * FROM children WHERE parent_run_id = ? AND parent_close_policy = 'abandon'", run_id):
        child_run_id = call["current_run_id"]
        if child_run_id and t.run(child_run_id)["status"] not in engine.TERMINAL_RUN_STATUSES:
            closing.cancel_child_at_once(t, child_run_id, {"reason": "parent_closed", "parent_close_policy": "abandon"})


# Per parent run, the resume context of the first child result that woke it.
_FIRST_WAKE: dict[str, dict[str, Any]] = {}


@wraps("second-child-wake-names-first", closing, "child_wake_context")
def _first_child_context(
    original: Callable[..., dict[str, Any]], call: sqlite3.Row, child_run: sqlite3.Row
) -> dict[str, Any]:
    context = original(call, child_run)
    # Every later child result names the first child's call and run.
    return _FIRST_WAKE.setdefault(call["parent_run_id"], context)


@wraps("cancellation-dropped-after-delivery", cancellation, "observation")
def _dropped_once_delivered(original: Callable[[T, str], dict[str, Any] | None], t: T, run_id: str) -> Any:
    row = cancellation._open_request(t, run_id)
    if row is not None and row["delivery"] is not None:
        return None  # once a delivery is committed, the child's later tasks no longer carry the request
    return original(t, run_id)


@wraps("delivered-child-terminated-at-deadline", closing, "close_past_cleanup_deadline")
def _delivered_terminated(original: Callable[[T], None], t: T) -> None:
    """A child whose delivery was committed is terminated at its deadline, not cancelled."""
    for row in t.all(
        "SELECT * FROM cancellation_requests WHERE status != 'resolved' AND delivery IS NOT NULL"
        " AND cleanup_deadline_at <= ? LIMIT 100",
        t.now,
    ):
        if t.run(row["run_id"])["status"] not in engine.TERMINAL_RUN_STATUSES:
            payload = {"reason": "cleanup_deadline_exceeded", "request_id": row["request_id"]}
            closing.close_run(t, row["run_id"], RunEvent.TERMINATE, event_type="WorkflowTerminated", payload=payload)
    original(t)
