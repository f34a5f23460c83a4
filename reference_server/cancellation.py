"""Cooperative cancellation of a child whose parent closed under ``parent_close_policy: request_cancellation``.

Worker protocol 1.20 (start_child_workflow): "``request_cancel`` closes the child at once. ``request_cancellation``
requests cooperative cleanup with an initial cancellation identity and deadline." What this server does with
it (requirements ``CANCEL-COOPERATIVE-*``; the wire names are the official SDK 2.12.0's, so its cooperative
worker can take part):

* the parent's close records ``CooperativeCancellationRequested`` in the child's history — the identity
  (``workflow_command_id``, the request id), ``workflow_run_id``, ``requested_at`` and ``cleanup_deadline_at``
  — and wakes the child; every workflow task of the child carries ``cancel_requested: true`` and the
  observation ``cancellation_request`` {request_id, requested_at, cleanup_deadline_at,
  history_refresh_page_token} until the child closes;
* the child cleans up and closes itself with any terminal command; a worker may first commit the delivery
  at one of its calls (``POST /api/worker/workflow-tasks/{id}/deliver-cancellation``, recorded as
  ``CooperativeCancellationDelivered``);
* past the deadline the scheduler closes a child still open as cancelled (``WorkflowCancelled``, reason
  ``cleanup_deadline_exceeded``; :func:`reference_server.closing.enforce_cancellation_deadlines`);
* however it ends, the parent's history records the outcome as ``ChildCancellationResolved`` (the request,
  the child's closing status and who closed it). That event follows the parent's own terminal event: the
  parent closed first, by definition of a parent-close policy, and the issue asks its history to say how the
  request it made ended.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from suite.protocol import history as hist
from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import CancellationRequestEvent

from .app import validation_error
from .engine import append_event, ts, wake_run
from .store import apply_schema, dumps, loads, new_id
from .transitions import CANCELLATION_REQUESTS as REQUESTS
from .transitions import initial, move
from .tx import T

__all__ = [
    "DDL",
    "client_request",
    "client_request_fields",
    "deliver",
    "delivery_fields",
    "install",
    "observation",
    "on_child_closed",
    "request",
    "resolve_closed",
]

# A client's request has no parent run and no child call: both columns hold this.
NO_PARENT = ""
MAX_CLEANUP_SECONDS = 3600

US = 1_000_000
CALL_KINDS = frozenset(
    {"activity", "local_activity", "timer", "condition", "signal", "child", "parallel", "selection_handle"}
)

DDL = """
CREATE TABLE IF NOT EXISTS cancellation_requests (
    request_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,          -- the child run asked to clean up
    parent_run_id TEXT NOT NULL,
    child_call_id TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    cleanup_deadline_at INTEGER NOT NULL,
    status TEXT NOT NULL,                 -- requested | delivered | resolved
    delivery TEXT,                        -- JSON: the committed delivery (sequence, call_kind, span)
    outcome TEXT,                         -- the child's closing status
    closed_by TEXT                        -- child | cleanup_deadline
);
CREATE INDEX IF NOT EXISTS cancellation_requests_due ON cancellation_requests (status, cleanup_deadline_at);
"""


def request(t: T, child: sqlite3.Row, call: sqlite3.Row) -> None:
    """Ask the open child run ``child`` to clean up: record the request, wake the child. A child a client already
    asked keeps that request (one per run)."""
    if _open_request(t, child["run_id"]) is not None:
        return
    request_id = new_id(t.now)
    deadline = t.now + t.settings.cancellation_cleanup_seconds * US
    t.db.execute(
        "INSERT INTO cancellation_requests (request_id, run_id, parent_run_id, child_call_id, requested_at,"
        " cleanup_deadline_at, status) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (request_id, child["run_id"], call["parent_run_id"], call["child_call_id"], t.now, deadline, initial(REQUESTS)),
    )
    append_event(
        t,
        child["run_id"],
        "CooperativeCancellationRequested",
        {
            "workflow_command_id": request_id,
            "workflow_run_id": child["run_id"],
            "requested_at": ts(t.now),
            "cleanup_deadline_at": ts(deadline),
            "reason": "parent_closed",
            "parent_close_policy": "request_cancellation",
            "parent_workflow_run_id": call["parent_run_id"],
        },
        workflow_command_id=request_id,
    )
    wake_run(t, child["run_id"])
    t.fx.transition("cancellation_request", request_id, None, initial(REQUESTS), run_id=child["run_id"])


def client_request_fields(body: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """``cleanup_timeout_seconds`` (1..3600, optional) and ``reason`` (optional) of a client's request (422 first)."""
    errors: dict[str, list[str]] = {}
    seconds = body.get("cleanup_timeout_seconds")
    if seconds is not None and (
        not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= MAX_CLEANUP_SECONDS
    ):
        errors["cleanup_timeout_seconds"] = [
            f"cleanup_timeout_seconds must be an integer from 1 to {MAX_CLEANUP_SECONDS}."
        ]
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
        errors["reason"] = ["reason must be a string of at most 1000 characters."]
    if errors:
        raise validation_error(errors)
    return seconds, reason


def client_request(t: T, run: sqlite3.Row, seconds: int | None, reason: str | None) -> dict[str, Any]:
    """A client asks the open run ``run`` to clean up and close (SDK 2.12.0 ``request_workflow_cancellation``):
    the request is recorded once; a repeated one answers the original identity and deadline (``duplicate``)."""
    row = _open_request(t, run["run_id"])
    duplicate = row is not None
    if row is None:
        request_id = new_id(t.now)
        deadline = t.now + (seconds or t.settings.cancellation_cleanup_seconds) * US
        t.db.execute(
            "INSERT INTO cancellation_requests (request_id, run_id, parent_run_id, child_call_id, requested_at,"
            " cleanup_deadline_at, status) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (request_id, run["run_id"], NO_PARENT, NO_PARENT, t.now, deadline, initial(REQUESTS)),
        )
        append_event(
            t,
            run["run_id"],
            "CooperativeCancellationRequested",
            {
                "workflow_command_id": request_id,
                "workflow_run_id": run["run_id"],
                "requested_at": ts(t.now),
                "cleanup_deadline_at": ts(deadline),
                "reason": reason if reason is not None else "client_requested",
            },
            workflow_command_id=request_id,
        )
        wake_run(t, run["run_id"])
        t.fx.transition("cancellation_request", request_id, None, initial(REQUESTS), run_id=run["run_id"])
    observed = observation(t, run["run_id"])
    assert observed is not None
    return {
        "accepted": True,
        "duplicate": duplicate,
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "cancellation_request": observed,
    }


def resolve_closed(t: T, row: sqlite3.Row, status: str) -> None:
    """The open request of a run that closed without telling a parent (a client asked it): resolved as the run
    closed (the scheduler's deadline step finds it)."""
    closed_by = "run"
    also, args = "outcome = ?, closed_by = ?", (status, closed_by)
    rid, state = row["request_id"], row["status"]
    move(t, REQUESTS, rid, state, CancellationRequestEvent.RESOLVE, also=also, args=args, quiet=True)
    t.fx.transition("cancellation_request", rid, state, "resolved", outcome=status)


def _open_request(t: T, run_id: str) -> sqlite3.Row | None:
    return t.one("SELECT * FROM cancellation_requests WHERE run_id = ? AND status != 'resolved'", run_id)


def observation(t: T, run_id: str) -> dict[str, Any] | None:
    """The ``cancellation_request`` observation a workflow task of ``run_id`` carries, if one is open."""
    row = _open_request(t, run_id)
    if row is None:
        return None
    return {
        "request_id": row["request_id"],
        "requested_at": ts(row["requested_at"]),
        "cleanup_deadline_at": ts(row["cleanup_deadline_at"]),
        # The whole history from its start: where a worker re-reads the canonical request and delivery.
        "history_refresh_page_token": hist.encode_page_token(0),
    }


def on_child_closed(t: T, child_run: sqlite3.Row, status: str, *, closed_by: str = "child") -> None:
    """A child with an open cooperative request closed: record the outcome in the parent's history."""
    row = _open_request(t, child_run["run_id"])
    if row is None:
        return
    also, args = "outcome = ?, closed_by = ?", (status, closed_by)
    rid, state = row["request_id"], row["status"]
    move(t, REQUESTS, rid, state, CancellationRequestEvent.RESOLVE, also=also, args=args, quiet=True)
    t.fx.transition("cancellation_request", row["request_id"], row["status"], "resolved", outcome=status)
    if row["parent_run_id"] == NO_PARENT:
        return  # a client's request: the run's own history records how it closed
    append_event(
        t,
        row["parent_run_id"],
        "ChildCancellationResolved",
        {
            "child_call_id": row["child_call_id"],
            "child_workflow_id": child_run["workflow_id"],
            "child_workflow_run_id": child_run["run_id"],
            "request_id": row["request_id"],
            "requested_at": ts(row["requested_at"]),
            "cleanup_deadline_at": ts(row["cleanup_deadline_at"]),
            "outcome": status,
            "closed_by": closed_by,
        },
        workflow_command_id=row["request_id"],
    )


# -- the delivery route (SDK 2.12.0 `deliver_workflow_cancellation`) ----------------------------------------


def delivery_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The delivery body's fields (422 before any lookup)."""
    errors: dict[str, list[str]] = {}
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        errors["request_id"] = ["request_id is required: the cancellation request's identity."]
    kind = body.get("call_kind")
    if not isinstance(kind, str) or kind not in CALL_KINDS:
        errors["call_kind"] = [f"call_kind must be one of {sorted(CALL_KINDS)}."]
    fields: dict[str, Any] = {"request_id": request_id, "call_kind": kind}
    for name, default in (("sequence", None), ("sequence_span", 1), ("operation_sequence_span", 1)):
        value = body.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2**62:
            errors[name] = [f"{name} must be a positive integer."]
        fields[name] = value
    operation = body.get("operation_sequence")
    if operation is not None and (not isinstance(operation, int) or isinstance(operation, bool) or operation < 1):
        errors["operation_sequence"] = ["operation_sequence must be a positive integer or null."]
    fields["operation_sequence"] = operation
    if errors:
        raise validation_error(errors)
    return fields


def deliver(t: T, task: sqlite3.Row, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Commit the delivery of the open request at one call of the lease holder's ``task`` (the caller has
    fenced it, :func:`reference_server.workflow_tasks.guarded_task`), once."""
    task_id = task["task_id"]
    row = _open_request(t, task["run_id"])
    if row is None or row["request_id"] != fields["request_id"]:
        raise Rejection(
            409,
            "cancellation_request_not_found",
            "The run has no open cooperative cancellation request with this request_id.",
            {"request_id": fields["request_id"]},
        )
    recorded = {k: fields[k] for k in ("sequence", "call_kind", "sequence_span")}
    recorded.update(operation_sequence=fields["operation_sequence"])
    recorded.update(operation_sequence_span=fields["operation_sequence_span"])
    if row["delivery"] is None:
        append_event(
            t,
            task["run_id"],
            "CooperativeCancellationDelivered",
            {"workflow_command_id": row["request_id"], "workflow_run_id": task["run_id"], **recorded},
            workflow_task_id=task_id,
            workflow_command_id=row["request_id"],
        )
        rid, state, delivery = row["request_id"], row["status"], (dumps(recorded),)
        move(t, REQUESTS, rid, state, CancellationRequestEvent.DELIVER, also="delivery = ?", args=delivery, quiet=True)
    else:
        recorded = loads(row["delivery"])  # a retried delivery answers the committed one
    return {"task_id": task_id, "delivered": True, "request_id": row["request_id"], **recorded}


def install(db: sqlite3.Connection, capabilities: dict[str, Any]) -> None:
    """Create the table; advertise ``cooperative_cancellation`` (SDK 2.12.0 takes part only when it is)."""
    apply_schema(db, DDL)
    capabilities["cooperative_cancellation"] = True
