"""Control-plane operations on runs (§12): start, the run a call targets, signal, update, cancel, terminate.

Each operation that changes state is one function of a transaction (:class:`reference_server.tx.T`);
the routes of :mod:`reference_server.routes.control` validate the request, call it inside ``run_tx`` and
shape the answer. A closed run refuses every command with 409 ``rejected_not_active`` (§12.2).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import RunEvent

from . import engine as E
from .closing import close_run
from .engine import TERMINAL_RUN_STATUSES
from .store import loads, new_id
from .transitions import UPDATES, initial
from .tx import T

__all__ = [
    "accept_update",
    "close_by_request",
    "command_target",
    "live_run",
    "receive_signal",
    "resolve_run",
    "signal_wake_context",
    "start_body",
    "start_workflow",
    "update_outcome",
    "update_wake_context",
]


def resolve_run(db: sqlite3.Connection, namespace: str, params: dict[str, str]) -> sqlite3.Row:
    """The run a control-plane call targets: the current run, or ``runs/{run_id}``."""
    wid = params["workflow_id"]
    run_id = params.get("run_id")
    if run_id is None:
        row: sqlite3.Row | None = db.execute(
            "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND is_current = 1",
            (namespace, wid),
        ).fetchone()
        if row is None:
            raise Rejection(404, "instance_not_found", f"Workflow '{wid}' was not found.", {"workflow_id": wid})
        return row
    row = db.execute(
        "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND run_id = ?",
        (namespace, wid, run_id),
    ).fetchone()
    if row is None:
        if db.execute("SELECT 1 FROM runs WHERE namespace = ? AND workflow_id = ?", (namespace, wid)).fetchone():
            raise Rejection(
                404,
                "run_not_found",
                f"Run '{run_id}' was not found.",
                {"workflow_id": wid, "run_id": run_id},
            )
        raise Rejection(404, "instance_not_found", f"Workflow '{wid}' was not found.", {"workflow_id": wid})
    return row


def command_target(db: sqlite3.Connection, namespace: str, params: dict[str, str]) -> sqlite3.Row:
    """The run a command targets; a run-targeted command on a historical run is 409 (§1.2)."""
    run = resolve_run(db, namespace, params)
    if "run_id" in params and not run["is_current"]:
        raise Rejection(
            409,
            "historical_run_command_rejected",
            "Commands may only target the current run.",
            {"workflow_id": run["workflow_id"], "run_id": run["run_id"]},
        )
    return run


def live_run(t: T, run_id: str, message: str, *, with_status: bool = True) -> sqlite3.Row:
    """The run, re-read inside the transaction; 409 ``rejected_not_active`` when it is closed (§12.2)."""
    current = t.run(run_id)
    if current["status"] in TERMINAL_RUN_STATUSES:
        status = {"run_status": current["status"]} if with_status else {}
        raise Rejection(
            409,
            "rejected_not_active",
            message,
            {
                "workflow_id": current["workflow_id"],
                "run_id": current["run_id"],
                **status,
                "outcome": "rejected_not_active",
            },
        )
    return current


def start_body(run: sqlite3.Row, namespace: str) -> dict[str, Any]:
    """The §12.1 start answer's run fields."""
    return {
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "workflow_type": run["workflow_type"],
        "namespace": namespace,
        "status": run["status"],
        "business_key": run["business_key"],
        "payload_codec": "avro",
    }


def start_workflow(
    t: T, namespace: str, workflow_id: str, duplicate_policy: str, **start: Any
) -> tuple[int, dict[str, Any]]:
    """§12.1: start a run of ``workflow_id``, or answer by the duplicate policy when it has an active run."""
    current = t.one(
        "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND is_current = 1",
        namespace,
        workflow_id,
    )
    if current is not None and current["status"] not in TERMINAL_RUN_STATUSES:
        if duplicate_policy == "use-existing":
            return 200, {**start_body(current, namespace), "outcome": "returned_existing_active"}
        raise Rejection(
            409,
            "rejected_duplicate",
            f"Workflow '{workflow_id}' already has an active run.",
            {"workflow_id": workflow_id, "run_id": current["run_id"], "outcome": "rejected_duplicate"},
        )
    run_id = E.start_run(
        t,
        namespace=namespace,
        workflow_id=workflow_id,
        run_number=1 if current is None else int(current["run_number"]) + 1,
        **start,
    )
    return 201, {**start_body(t.run(run_id), namespace), "outcome": "started_new"}


def receive_signal(t: T, run_id: str, name: str, input_blob: str | None, request_id: str | None) -> dict[str, Any]:
    """§12.2 signal: ``SignalReceived`` and a wake of the run; a repeated ``request_id`` is deduplicated."""
    current = live_run(t, run_id, "The workflow run is closed.")
    if request_id:
        dup = t.one("SELECT signal_id FROM signals WHERE run_id = ? AND request_id = ?", run_id, request_id)
        if dup is not None:
            return {"signal_id": dup["signal_id"], "deduplicated": True}
    signal_id = new_id(t.now)
    t.db.execute(
        "INSERT INTO signals (signal_id, run_id, signal_name, input_blob, request_id, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (signal_id, current["run_id"], name, input_blob, request_id, t.now),
    )
    payload = {"signal_id": signal_id, "signal_name": name, "input": input_blob, "arguments": input_blob}
    E.record_wake(
        t,
        current["run_id"],
        "SignalReceived",
        {**payload, "value": input_blob, "payload_codec": "avro", "request_id": request_id},
        **signal_wake_context(signal_id, name),
    )
    return {"signal_id": signal_id}


def signal_wake_context(signal_id: str, name: str) -> dict[str, Any]:
    """The resume context of the task an accepted signal wakes: the signal it applies (§8.3)."""
    return {
        "workflow_wait_kind": "signal",
        "open_wait_id": f"signal-application:{signal_id}",
        "resume_source_kind": "workflow_signal",
        "resume_source_id": signal_id,
        "workflow_signal_id": signal_id,
        "signal_name": name,
    }


def accept_update(t: T, run_id: str, name: str, input_blob: str | None, request_id: str | None) -> str:
    """§12.2 update: ``UpdateAccepted`` and a wake of the run; a repeated ``request_id`` is the same update."""
    current = live_run(t, run_id, "The workflow run is closed.", with_status=False)
    if request_id:
        dup = t.one("SELECT update_id FROM updates WHERE run_id = ? AND request_id = ?", run_id, request_id)
        if dup is not None:
            return str(dup["update_id"])
    update_id = new_id(t.now)
    t.db.execute(
        "INSERT INTO updates (update_id, run_id, update_name, input_blob, request_id, status, accepted_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (update_id, current["run_id"], name, input_blob, request_id, initial(UPDATES), t.now),
    )
    payload = {"update_id": update_id, "update_name": name, "arguments": input_blob, "payload_codec": "avro"}
    E.record_wake(
        t,
        current["run_id"],
        "UpdateAccepted",
        {**payload, "request_id": request_id},
        **update_wake_context(update_id),
    )
    return update_id


def update_wake_context(update_id: str) -> dict[str, Any]:
    """The resume context of the task an accepted update wakes: the update it applies (§8.3)."""
    return {
        "workflow_wait_kind": "update",
        "open_wait_id": f"update:{update_id}",
        "resume_source_kind": "workflow_update",
        "resume_source_id": update_id,
        "workflow_update_id": update_id,
    }


_CLOSE_EVENTS = {
    RunEvent.CANCEL: ("CancelRequested", "WorkflowCancelled"),
    RunEvent.TERMINATE: ("TerminateRequested", "WorkflowTerminated"),
}


def close_by_request(t: T, run_id: str, event: RunEvent, reason: str | None) -> None:
    """§12.2 cancel or terminate: ``CancelRequested`` / ``TerminateRequested``, then the run is closed."""
    requested, closed = _CLOSE_EVENTS[event]
    current = live_run(t, run_id, "The workflow run is already closed.")
    E.append_event(t, current["run_id"], requested, {"reason": reason})
    close_run(t, current["run_id"], event, event_type=closed, payload={"reason": reason})


def update_outcome(db: sqlite3.Connection, update_id: str, base: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The answer to an update call waiting for completion (§12.2), or ``None`` while it is still open: 200
    with the result, 422 ``update_failed``, or 409 when the run closed before the update completed."""
    row = db.execute("SELECT * FROM updates WHERE update_id = ?", (update_id,)).fetchone()
    run_now = db.execute("SELECT status FROM runs WHERE run_id = ?", (base["run_id"],)).fetchone()
    if row["status"] == "completed":
        blob = row["result_blob"]
        return 200, {
            **base,
            "outcome": "update_completed",
            "update_status": "completed",
            "result": E.json_view(blob),
            "result_envelope": {"codec": "avro", "blob": blob} if blob else None,
        }
    if row["status"] == "failed":
        failure = loads(row["failure"])
        return 422, {
            **base,
            "reason": "update_failed",
            "outcome": "update_failed",
            "update_status": "failed",
            "failure": failure,
            "message": (failure or {}).get("message"),
            "error": (failure or {}).get("message"),
        }
    if run_now["status"] in TERMINAL_RUN_STATUSES:
        raise Rejection(
            409,
            "rejected_not_active",
            "The workflow run closed before the update completed.",
            {**base, "outcome": "rejected_not_active", "update_status": "rejected"},
        )
    return None
