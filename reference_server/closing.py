"""Closing a run, and what closing it does to the rest: its open work, its children, its parent.

A run closes by a closing event of the RUN table (:func:`close_run`): one terminal event, every open task,
timer, update and pending query task closed by its own table, children handled by their parent-close
policy (terminated, cancelled at once, or asked to clean up cooperatively), and the parent told of a child's
close — or the child retried by its policy (§9.1, §12.2, §8.7.1). Above :mod:`reference_server.engine` and
:mod:`reference_server.cancellation`, so neither needs to import the other or this module.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from suite.protocol.commands import RetryPolicy
from suite.protocol.lifecycles import (
    CHILD_CLOSED_EVENTS,
    RUN,
    RUN_CLOSED_REASONS,
    ChildEvent,
    ChildStatus,
    ExecutionEvent,
    QueryTaskEvent,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
    TimerEvent,
    UpdateEvent,
)

from . import cancellation
from .engine import TERMINAL_RUN_STATUSES, append_event, record_wake, release_leases
from .store import dumps, loads
from .transitions import (
    ACTIVITY_EXECUTIONS,
    ACTIVITY_TASKS,
    CHILDREN,
    QUERY_TASKS,
    TIMERS,
    UPDATES,
    WORKFLOW_TASKS,
    BulkMove,
    move,
    pending_moves,
    step,
)
from .tx import T, Watch

__all__ = [
    "CLEANUP_DEADLINE_WATCHES",
    "apply_parent_close_policies",
    "child_closed",
    "close_run",
    "enforce_cancellation_deadlines",
]


def close_run(
    t: T,
    run_id: str,
    event: RunEvent,
    *,
    event_type: str,
    payload: Mapping[str, Any],
    output_blob: str | None = None,
    failure: Mapping[str, Any] | None = None,
    workflow_task_id: str | None = None,
) -> None:
    """Close a run by a closing ``event`` of the RUN table: one terminal event, every open task cancelled,
    children handled by their parent-close policy, and the parent told (§9.1, §12.2, §8.7.1)."""
    run = t.one("SELECT status, parent_run_id, parent_child_call_id FROM runs WHERE run_id = ?", run_id)
    assert run is not None, run_id
    status = step(RUN, run["status"], event)  # IllegalTransition for a run that is already closed
    assert RUN.is_terminal(status), (run_id, event)
    closed_reason = RUN_CLOSED_REASONS[event]
    append_event(t, run_id, event_type, payload, workflow_task_id=workflow_task_id)
    t.db.execute(
        "UPDATE runs SET status = ?, closed_reason = ?, closed_at = ?, output_blob = COALESCE(?, output_blob),"
        " failure = COALESCE(?, failure) WHERE run_id = ? AND status = ?",
        (status, closed_reason, t.now, output_blob, dumps(dict(failure)) if failure else None, run_id, run["status"]),
    )
    t.fx.transition("run", run_id, run["status"], status.value, closed_reason=closed_reason)
    t.fx.run_changed.add(run_id)
    close_what_it_leaves(t, run_id, event, run, status, payload)


def close_what_it_leaves(
    t: T, run_id: str, event: RunEvent, run: sqlite3.Row, status: RunStatus, payload: Mapping[str, Any]
) -> None:
    """After a run closed by ``event`` (``run`` its row before): its open work is closed, its children handled by
    their parent-close policies, and its parent told."""
    _close_open_work(t, run_id, event)
    apply_parent_close_policies(t, run_id)
    if run["parent_run_id"] and run["parent_child_call_id"]:
        # The row as closed above, not ``run`` (read before the UPDATE): child_closed reads the closed run's
        # output_blob, failure and closed_reason. The stale row reported every child result as null, ignored
        # non_retryable/exception_type (so a non-retryable child failure was retried), and took a
        # continue_as_new close (closed_reason "continued") for the child's completion.
        child_closed(t, t.run(run_id), status, payload)


# The failures a run's close writes on its open updates and query tasks (encoded once).
_UPDATE_REJECTED = dumps({"reason": "rejected_not_active", "message": "The workflow run closed."})
_QUERY_REJECTED = dumps({"reason": "query_rejected", "message": "The workflow run closed."})


def _close_open_work(t: T, run_id: str, event: RunEvent) -> None:
    """What a closed run leaves open is closed with it, each by its own table."""
    moves = [
        # Open workflow tasks: a leased one stays visible as cancelled so its holder gets run_closed (§8.9 row
        # 2); its lease (live or lapsed) ends with it.
        BulkMove(WORKFLOW_TASKS, TaskEvent.CANCEL),
        # Ready activity tasks will never be leased (invariant 50); leased ones learn through heartbeat.
        BulkMove(ACTIVITY_TASKS, TaskEvent.CANCEL, states=(TaskStatus.READY,)),
    ]
    if event in (RunEvent.CANCEL, RunEvent.TERMINATE):
        moves.append(BulkMove(ACTIVITY_EXECUTIONS, ExecutionEvent.CANCEL, also="closed_at = ?", also_args=(t.now,)))
    moves += [
        BulkMove(TIMERS, TimerEvent.CANCEL),
        # Decided rule (docs/reference-server.md): an accepted update can never complete once its run closed.
        BulkMove(
            UPDATES, UpdateEvent.RUN_CLOSED, also="closed_at = ?, failure = ?", also_args=(t.now, _UPDATE_REJECTED)
        ),
        BulkMove(QUERY_TASKS, QueryTaskEvent.RUN_CLOSED, also="failure = ?", also_args=(_QUERY_REJECTED,)),
    ]
    for bulk in pending_moves(t, moves, "run_id = ?", (run_id,)):
        if bulk.rows is WORKFLOW_TASKS:
            release_leases(t, "run_id = ?", (run_id,))
        bulk.apply(t, "run_id = ?", (run_id,))


def apply_parent_close_policies(t: T, parent_run_id: str) -> None:
    children = t.all(
        # Two index lookups (an IN list builds a temporary table each time: about twice the cost at every close).
        "SELECT * FROM children WHERE parent_run_id = ? AND (status = 'running' OR status = 'backoff')",
        parent_run_id,
    )
    for child in children:
        policy = child["parent_close_policy"]
        if child["status"] == ChildStatus.BACKOFF:
            move(t, CHILDREN, child["child_call_id"], ChildStatus.BACKOFF, ChildEvent.PARENT_CLOSED, quiet=True)
            continue
        child_run_id = child["current_run_id"]
        if child_run_id is None or policy == "abandon":
            continue
        child_run = t.run(child_run_id)
        if child_run["status"] in TERMINAL_RUN_STATUSES:
            continue
        closing = {"reason": "parent_closed", "parent_close_policy": policy}
        if policy == "terminate":
            close_run(t, child_run_id, RunEvent.TERMINATE, event_type="WorkflowTerminated", payload=closing)
        elif policy == "request_cancellation":
            ask_child_to_cancel(t, child_run, child, closing)
        else:  # request_cancel: "closes the child at once" [S0]
            cancel_child_at_once(t, child_run_id, closing)


def ask_child_to_cancel(t: T, child_run: sqlite3.Row, child: sqlite3.Row, closing: Mapping[str, Any]) -> None:
    """Parent-close policy request_cancellation: the child is asked, and closed only past its deadline."""
    cancellation.request(t, child_run, child)


def cancel_child_at_once(t: T, child_run_id: str, closing: Mapping[str, Any]) -> None:
    """Parent-close policy request_cancel: the child is cancelled with its parent."""
    append_event(t, child_run_id, "CancelRequested", {"reason": "parent_closed"})
    close_run(t, child_run_id, RunEvent.CANCEL, event_type="WorkflowCancelled", payload=closing)


def child_closed(t: T, child_run: sqlite3.Row, status: RunStatus, payload: Mapping[str, Any]) -> None:
    """Report a child run's close to its parent, or retry it per the child retry policy (§8.7.1)."""
    call = t.one("SELECT * FROM children WHERE child_call_id = ?", child_run["parent_child_call_id"])
    if call is None or call["current_run_id"] != child_run["run_id"]:
        return
    parent = t.run(call["parent_run_id"])
    closed = CHILD_CLOSED_EVENTS[status]
    if parent["status"] in TERMINAL_RUN_STATUSES:
        move(t, CHILDREN, call["child_call_id"], call["status"], closed, quiet=True)
        closed_by = "cleanup_deadline" if payload.get("reason") == "cleanup_deadline_exceeded" else "child"
        cancellation.on_child_closed(t, child_run, status, closed_by=closed_by)
        return
    if child_run["closed_reason"] == "continued":
        return  # the chain goes on; the parent hears from the last run of it
    if status is RunStatus.FAILED and _retry_child(t, call, child_run, parent):
        return
    event_type = _CHILD_EVENT_TYPES[status]
    move(t, CHILDREN, call["child_call_id"], call["status"], closed, quiet=True)
    output = child_run["output_blob"]
    record_wake(
        t,
        parent["run_id"],
        event_type,
        {
            "sequence": call["step_sequence"],
            "child_call_id": call["child_call_id"],
            "child_workflow_id": call["child_workflow_id"],
            "child_workflow_run_id": child_run["run_id"],
            "output": output,
            "result": {"codec": "avro", "blob": output} if output else None,
            "payload_codec": "avro",
            **{k: v for k, v in payload.items() if k in ("message", "exception_type", "exception_class", "reason")},
        },
        **child_wake_context(call, child_run),
    )


def child_wake_context(call: sqlite3.Row, child_run: sqlite3.Row) -> dict[str, Any]:
    """The resume context of the parent task a child's result wakes: the child wait it resolves."""
    return {
        "workflow_wait_kind": "child",
        "open_wait_id": f"child:{call['child_call_id']}",
        "resume_source_kind": "child_workflow_run",
        "resume_source_id": child_run["run_id"],
        "child_call_id": call["child_call_id"],
        "child_workflow_run_id": child_run["run_id"],
    }


_CHILD_EVENT_TYPES: Mapping[RunStatus, str] = {
    RunStatus.COMPLETED: "ChildRunCompleted",
    RunStatus.FAILED: "ChildRunFailed",
    RunStatus.CANCELLED: "ChildRunCancelled",
    RunStatus.TERMINATED: "ChildRunTerminated",
}


def _retry_child(t: T, call: sqlite3.Row, child_run: sqlite3.Row, parent: sqlite3.Row) -> bool:
    """A failed child run is retried when the call's retry policy allows another attempt (§8.7.1): the call
    waits out the backoff (``ChildWorkflowRetryScheduled``), and the parent hears nothing yet (§14.2)."""
    policy_doc = loads(call["retry_policy"])
    if not policy_doc:
        return False
    # Null policy fields mean "absent", as the model validated them; int(None) raised here inside the
    # scheduler's maintenance pass, which then failed on every pass and stalled every timer, retry and
    # timeout of the server (found by the OpenAPI fuzz, suite/fuzz.py).
    policy = RetryPolicy(
        max_attempts=int(policy_doc.get("max_attempts") or 1),
        backoff_seconds=tuple(policy_doc.get("backoff_seconds") or ()),
        non_retryable_error_types=tuple(policy_doc.get("non_retryable_error_types") or ()),
    )
    failure = loads(child_run["failure"]) or {}
    attempt = int(call["attempt"])
    non_retryable = bool(failure.get("non_retryable"))
    if not policy.should_retry(attempt, failure.get("exception_type"), failure.get("exception_class"), non_retryable):
        return False
    delay = child_retry_delay(policy, attempt + 1)
    also, retry_at = "retry_at = ?, attempt = attempt + 1", t.now + delay * 1_000_000
    move(t, CHILDREN, call["child_call_id"], call["status"], ChildEvent.RETRY, also=also, args=(retry_at,), quiet=True)
    append_event(
        t,
        parent["run_id"],
        "ChildWorkflowRetryScheduled",
        {
            "sequence": call["step_sequence"],
            "child_call_id": call["child_call_id"],
            "retry_after_attempt": call["attempt"],
            "retry_backoff_seconds": delay,
            "failed_child_run_id": child_run["run_id"],
        },
    )
    return True


def child_retry_delay(policy: RetryPolicy, attempt: int) -> int:
    """Seconds a child waits before its ``attempt``-th run: the policy's backoff (§8.7.1, "Child retry backoff
    applies after a failed child run")."""
    return policy.backoff_before(attempt)


# A cooperative-cancellation request's cleanup deadline, as the request is recorded (tx.Watch).
CLEANUP_DEADLINE_WATCHES = (
    Watch(
        "cancellation_requests",
        ("status", "cleanup_deadline_at"),
        "NEW.status != 'resolved'",
        ("NEW.cleanup_deadline_at",),
    ),
)


def close_past_cleanup_deadline(t: T) -> None:
    """Every child still open past its cooperative-cancellation cleanup deadline is cancelled (a client's request
    whose run closed first is resolved)."""
    for row in t.all(
        "SELECT * FROM cancellation_requests WHERE status != 'resolved' AND cleanup_deadline_at <= ? LIMIT 100",
        t.now,
    ):
        child = t.run(row["run_id"])
        if child["status"] in TERMINAL_RUN_STATUSES:
            cancellation.resolve_closed(t, row, child["status"])  # a client's request: its run closed first
            continue
        close_run(
            t,
            row["run_id"],
            RunEvent.CANCEL,
            event_type="WorkflowCancelled",
            payload={"reason": "cleanup_deadline_exceeded", "request_id": row["request_id"]},
        )


def enforce_cancellation_deadlines(t: T) -> float | None:
    """Scheduler step: close every child still open past its cooperative-cancellation cleanup deadline
    (:mod:`reference_server.cancellation`); seconds until the next one."""
    close_past_cleanup_deadline(t)
    nxt = t.one("SELECT MIN(cleanup_deadline_at) AS at FROM cancellation_requests WHERE status != 'resolved'")
    if nxt is None or nxt["at"] is None:
        return None
    return max(0.0, (int(nxt["at"]) - t.now) / 1e6)
