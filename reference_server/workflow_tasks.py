"""Workflow tasks: claim, history, heartbeat, complete (all command types, atomically) and fail.

Fencing is decided twice on purpose: the pure model's guard produces the exact rejection of the
PROTOCOL.md §8.9 matrix, and the write itself is a conditional ``UPDATE`` on (status, owner,
attempt), so no interleaving can accept a stale report even if the guard's read were outdated.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Mapping
from typing import Any

from suite.protocol import commands as cmdmodel
from suite.protocol import history as hist
from suite.protocol.errors import Rejection
from suite.protocol.fencing import WorkflowTaskView, guard_workflow_task
from suite.protocol.lifecycles import RunStatus, TaskStatus

from . import cancellation, sessions
from .engine import (
    DEFERRED_RESUME_KEY,
    TERMINAL_RUN_STATUSES,
    T,
    append_event,
    close_run,
    create_workflow_task,
    deferred_resume,
    empty_resume,
    event_json,
    history_page,
    next_step,
    set_run_status,
    start_child_run,
    start_run,
    task_resume,
    ts,
)
from .faults import fault
from .polling import Poll, forget_polls, lease_taken, replayed_task
from .store import dumps, from_us, loads, new_id

__all__ = [
    "IMPLEMENTED_OPTIONAL_COMMANDS",
    "MAX_DURATION_SECONDS",
    "check_storable_durations",
    "claim_workflow_task",
    "complete_workflow_task",
    "fail_workflow_task",
    "heartbeat_workflow_task",
    "task_history",
    "task_payload",
    "workflow_due_in",
]


# §5.2: the optional command types this server implements (see :func:`_open_condition_wait`). The same tuple
# is advertised in `supported_workflow_task_commands` and accepted by `validate_batch`, so advertisement and
# acceptance cannot drift apart. The official Python SDK emits `open_condition_wait` for every
# `ctx.wait_condition(...)` (SDK-INTEROP.md §4, §6.4).
IMPLEMENTED_OPTIONAL_COMMANDS: tuple[str, ...] = ("open_condition_wait",)


# -- claim -----------------------------------------------------------------------------------------------


def claim_workflow_task(
    t: T, poll: Poll, *, page_size: int, accept_encoding: str | None
) -> dict[str, Any] | str | None:
    """Lease one ready task to the polling worker; ``None`` when nothing matches, ``"throttled"`` when the
    admission limit refuses a lease. Returns the task payload (§8.2) on success."""
    namespace, worker_id, task_queue = poll.namespace, poll.worker_id, poll.queue
    lease_us = t.settings.lease_seconds * 1_000_000
    replay = replayed_task(t, poll)
    if replay is not None:
        if fault(t.settings, "replay-increments-attempt"):
            t.db.execute("UPDATE workflow_tasks SET attempt = attempt + 1 WHERE task_id = ?", (replay,))
        # §7.3: same task and attempt, refreshed lease, no attempt increment.
        t.db.execute("UPDATE workflow_tasks SET lease_expires_at = ? WHERE task_id = ?", (t.now + lease_us, replay))
        return task_payload(t, replay, page_size, accept_encoding)
    limit = t.settings.max_active_leases_per_queue
    if limit is not None:
        active = t.one(
            "SELECT COUNT(*) AS n FROM workflow_tasks WHERE namespace = ? AND task_queue = ? AND status = 'leased'"
            " AND lease_expires_at > ?",
            namespace,
            task_queue,
            t.now,
        )
        if active is not None and int(active["n"]) >= limit:
            if fault(t.settings, "throttled-reported-empty"):
                return None  # the bug: backpressure looks like an empty queue
            return "throttled"
    if fault(t.settings, "claim-not-conditional"):
        # The bug: the claim reads the queue and then writes without re-checking the task. Requests run one
        # at a time here, so a racing poll is emulated: a task another worker claimed within the last second
        # still looks ready, and the unconditional write hands it out again with the same attempt.
        raced = t.one(
            "SELECT task_id FROM workflow_tasks WHERE namespace = ? AND task_queue = ? AND status = 'leased'"
            " AND lease_owner != ? AND lease_expires_at > ? ORDER BY lease_expires_at DESC LIMIT 1",
            namespace,
            task_queue,
            worker_id,
            t.now + lease_us - 1_000_000,
        )
        if raced is not None:
            t.db.execute(
                "UPDATE workflow_tasks SET lease_owner = ?, lease_expires_at = ? WHERE task_id = ?",
                (worker_id, t.now + lease_us, raced["task_id"]),
            )
            return task_payload(t, raced["task_id"], page_size, accept_encoding)
    types = loads(poll.worker["workflow_types"]) or []
    candidates = t.all(
        "SELECT task_id, status FROM workflow_tasks WHERE namespace = ? AND task_queue = ?"
        " AND ((status = 'ready' AND available_at <= ?) OR (status = 'leased' AND lease_expires_at <= ?))"
        " AND (compatibility IS NULL OR compatibility = ?)"
        " AND (? = 0 OR workflow_type IN (SELECT value FROM json_each(?)))"
        " ORDER BY available_at, task_id LIMIT 100",
        namespace,
        task_queue,
        t.now,
        t.now,
        poll.worker["build_id"] or "",
        len(types),
        dumps(types),
    )
    if fault(t.settings, "expired-never-redelivered"):
        candidates = [c for c in candidates if c["status"] == "ready"]  # the bug: expired leases stay stuck
    for cand in candidates:
        run_row = t.one(
            "SELECT r.last_sequence, r.status, r.run_id FROM runs r JOIN workflow_tasks w ON w.run_id = r.run_id"
            " WHERE w.task_id = ?",
            cand["task_id"],
        )
        assert run_row is not None
        # The claim is the conditional write: only a ready task, or one whose lease has expired, moves.
        cur = t.db.execute(
            "UPDATE workflow_tasks SET status = 'leased', attempt = attempt + 1, lease_owner = ?,"
            " lease_expires_at = ?, seen_sequence = ?, resume_context = json_remove(resume_context, ?)"
            " WHERE task_id = ? AND (status = 'ready' OR (status = 'leased' AND lease_expires_at <= ?))",
            (
                worker_id,
                t.now + lease_us,
                run_row["last_sequence"],
                # This lease shows every event so far: a wake deferred during an earlier lease is in its history.
                f"$.{DEFERRED_RESUME_KEY}",
                cand["task_id"],
                t.now,
            ),
        )
        if cur.rowcount != 1:
            continue  # lost the race: not an error, try the next candidate (§7.5)
        if fault(t.settings, "redelivery-keeps-attempt") and cand["status"] == "leased":
            t.db.execute("UPDATE workflow_tasks SET attempt = attempt - 1 WHERE task_id = ?", (cand["task_id"],))
        if cand["status"] == "leased":
            t.fx.transition("workflow_task", cand["task_id"], "leased", "ready", cause="lease_expired")
        t.fx.transition("workflow_task", cand["task_id"], "ready", "leased", lease_owner=worker_id)
        row = t.one("SELECT attempt FROM workflow_tasks WHERE task_id = ?", cand["task_id"])
        assert row is not None
        lease_taken(t, poll, cand["task_id"], int(row["attempt"]))
        return task_payload(t, cand["task_id"], page_size, accept_encoding)
    return None


def workflow_due_in(db: sqlite3.Connection, poll: Poll, now: int) -> float | None:
    """Seconds until durable state makes a task on the poll's queue claimable without any notification:
    the earliest future ``available_at`` or lease expiry (redelivery)."""
    row = db.execute(
        "SELECT MIN(at) FROM (SELECT MIN(available_at) AS at FROM workflow_tasks WHERE namespace = ?"
        " AND task_queue = ? AND status = 'ready' AND available_at > ? UNION ALL SELECT MIN(lease_expires_at)"
        " FROM workflow_tasks WHERE namespace = ? AND task_queue = ? AND status = 'leased')",
        (poll.namespace, poll.queue, now, poll.namespace, poll.queue),
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, (int(row[0]) - now) / 1e6)


def _threshold(t: T) -> int:
    return 1 if fault(t.settings, "compress-below-threshold") else hist.COMPRESSION_THRESHOLD


def task_payload(t: T, task_id: str, page_size: int, accept_encoding: str | None) -> dict[str, Any]:
    """The leased task object (§8.2) with the first history page inline and the resume context."""
    task = t.one("SELECT * FROM workflow_tasks WHERE task_id = ?", task_id)
    assert task is not None
    run = t.run(task["run_id"])
    # One extra row tells the page whether more follow, without counting the whole history.
    rows = history_page(t.db, run["run_id"], 0, min(page_size, hist.MAX_PAGE_SIZE) + 1)
    events = [event_json(r, run["namespace"]) for r in rows]
    last = int(run["last_sequence"])
    page = hist.paginate(events, 0, page_size)
    body: dict[str, Any] = {
        "task_id": task["task_id"],
        "namespace": run["namespace"],
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "workflow_task_attempt": task["attempt"],
        "workflow_type": run["workflow_type"],
        "payload_codec": "avro",
        "arguments": {"codec": "avro", "blob": run["input_blob"]} if run["input_blob"] else None,
        "run_status": run["status"],
        "last_history_sequence": last,
        "total_history_events": last,
        "next_history_page_token": page.next_history_page_token,
        "has_more": page.has_more,
        "next_after_sequence": page.next_after_sequence,
        "task_queue": task["task_queue"],
        "connection": None,
        "compatibility": task["compatibility"],
        "lease_owner": task["lease_owner"],
        "lease_expires_at": ts(task["lease_expires_at"]),
        **hist.compress_page(list(page.events), accept_encoding, _threshold(t)),
        **task_resume(task),
    }
    observed = cancellation.observation(t, run["run_id"])
    if observed is not None:
        # CANCEL-COOPERATIVE-REQUEST: the identity and deadline travel with every task of the child.
        body.update(cancel_requested=True, cancellation_request=observed)
    return body


# -- fencing ---------------------------------------------------------------------------------------------


def _view(t: T, namespace: str, task_id: str) -> tuple[WorkflowTaskView | None, sqlite3.Row | None]:
    task = t.one("SELECT * FROM workflow_tasks WHERE task_id = ? AND namespace = ?", task_id, namespace)
    if task is None:
        return None, None
    run = t.run(task["run_id"])
    view = WorkflowTaskView(
        task_id=task_id,
        status=TaskStatus(task["status"]),
        attempt=int(task["attempt"]),
        lease_owner=task["lease_owner"],
        lease_expires_at=from_us(task["lease_expires_at"]) if task["lease_expires_at"] is not None else None,
        run_status=RunStatus(run["status"]),
        run_closed_reason=run["closed_reason"],
        run_closed_at=from_us(run["closed_at"]) if run["closed_at"] is not None else None,
    )
    return view, task


def guarded_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> sqlite3.Row:
    """Validate the fencing fields (422), then apply the §8.9 matrix in order. Returns the task row."""
    owner, attempt = fencing_fields(body)
    view, task = _view(t, namespace, task_id)
    if fault(t.settings, "accept-wrong-lease-owner") and view is not None and view.lease_owner is not None:
        owner = view.lease_owner
    if fault(t.settings, "accept-stale-attempt") and view is not None:
        attempt = view.attempt
    if fault(t.settings, "skip-run-closed-guard") and view is not None:
        view = dataclasses.replace(view, run_status=RunStatus.RUNNING)  # the bug: the run-closed row is skipped
    guard_workflow_task(view, task_id=task_id, lease_owner=owner, attempt=attempt, now=from_us(t.now))
    assert task is not None
    return task


def fencing_fields(body: Mapping[str, Any]) -> tuple[str, int]:
    from .app import validation_error

    errors: dict[str, list[str]] = {}
    owner = body.get("lease_owner")
    attempt = body.get("workflow_task_attempt")
    if not isinstance(owner, str) or not owner:
        errors["lease_owner"] = ["lease_owner is required and must be a non-empty string."]
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        errors["workflow_task_attempt"] = ["workflow_task_attempt is required and must be an integer >= 1."]
    if errors:
        raise validation_error(errors)
    assert isinstance(owner, str)
    assert isinstance(attempt, int)
    return owner, attempt


def _fenced_write(t: T, task: sqlite3.Row, sql_set: str, args: tuple[Any, ...]) -> None:
    """The write that decides the race: it only touches the lease the guard saw."""
    cur = t.db.execute(
        f"UPDATE workflow_tasks SET {sql_set} WHERE task_id = ? AND status = 'leased' AND lease_owner = ?"
        " AND attempt = ? AND lease_expires_at > ?",
        (*args, task["task_id"], task["lease_owner"], task["attempt"], t.now),
    )
    if cur.rowcount != 1:
        raise Rejection(
            409,
            "task_not_leased",
            "The workflow task lease changed before the write.",
            {"task_id": task["task_id"]},
        )


# -- history, heartbeat ----------------------------------------------------------------------------------


def task_history(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task = guarded_task(t, namespace, task_id, body)
    if fault(t.settings, "accept-invalid-page-token") and body.get("next_history_page_token") is not None:
        try:
            hist.decode_page_token(body["next_history_page_token"])
        except Rejection:  # the bug: a token that does not decode is read as "from the start"
            body = {k: v for k, v in body.items() if k != "next_history_page_token"}
    cursor = hist.resolve_cursor(body)
    if fault(t.settings, "history-page-gap") and cursor.after_sequence > 0:
        cursor = hist.Cursor(cursor.after_sequence + 1, cursor.page_size)
    run = t.run(task["run_id"])
    rows = history_page(t.db, run["run_id"], cursor.after_sequence, min(cursor.page_size, hist.MAX_PAGE_SIZE) + 1)
    events = [event_json(r, namespace) for r in rows]
    page = hist.paginate(events, cursor.after_sequence, cursor.page_size)
    accept = body.get("accept_history_encoding")
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "total_history_events": run["last_sequence"],
        "has_more": page.has_more,
        "next_after_sequence": page.next_after_sequence,
        "next_history_page_token": page.next_history_page_token,
        **hist.compress_page(list(page.events), accept if isinstance(accept, str) else None, _threshold(t)),
    }


def heartbeat_workflow_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task = guarded_task(t, namespace, task_id, body)
    # §8.6: the new expiry is now + lease duration, set fresh, never added to the old one.
    expires = t.now + t.settings.lease_seconds * 1_000_000
    if fault(t.settings, "heartbeat-does-not-renew"):
        expires = int(task["lease_expires_at"])  # the bug: "renewed", but the old expiry is kept
    _fenced_write(t, task, "lease_expires_at = ?", (expires,))
    run = t.run(task["run_id"])
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "lease_owner": task["lease_owner"],
        "renewed": True,
        "lease_expires_at": ts(expires),
        "run_status": run["status"],
        "task_status": "leased",
        "reason": None,
    }


# -- fail ------------------------------------------------------------------------------------------------


def fail_workflow_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    from .app import validation_error

    task = guarded_task(t, namespace, task_id, body)
    failure = body.get("failure")
    if not isinstance(failure, dict) or not isinstance(failure.get("message"), str) or not failure["message"]:
        raise validation_error({"failure.message": ["failure.message is required and must be a non-empty string."]})
    _fenced_write(t, task, "status = 'failed', lease_owner = NULL, lease_expires_at = NULL", ())
    t.fx.transition("workflow_task", task_id, "leased", "failed")
    forget_polls(t, "workflow", task_id)
    run = t.run(task["run_id"])
    # §8.8: a task failure is a replay problem, not a workflow failure; the run stays open. When new
    # history arrived while the task was leased (e.g. the SDK's "waiting for history" report), a fresh
    # task picks it up, so nothing the run is waiting for is lost.
    next_task_id = None
    if int(run["last_sequence"]) > int(task["seen_sequence"] or 0):
        # The failed task handled nothing: its own wake is still the first one to handle.
        next_task_id = create_workflow_task(t, run, task_resume(task))
    elif run["status"] in ("pending", "running"):
        set_run_status(t, run["run_id"], "waiting")
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "outcome": "failed",
        "recorded": True,
        "reason": None,
        "next_task_id": next_task_id,
    }


# -- complete --------------------------------------------------------------------------------------------


def complete_workflow_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task = guarded_task(t, namespace, task_id, body)
    run_id = task["run_id"]
    open_updates = [
        r["update_id"] for r in t.all("SELECT update_id FROM updates WHERE run_id = ? AND status = 'accepted'", run_id)
    ]
    if fault(t.settings, "accept-two-terminal") and isinstance(body.get("commands"), list):
        ends = [c for c in body["commands"] if isinstance(c, dict) and c.get("type") in cmdmodel.TERMINAL_TYPES]
        body = {**body, "commands": [c for c in body["commands"] if not any(c is e for e in ends[1:])]}
    if fault(t.settings, "partial-batch-on-invalid"):
        _commit_valid_prefix(t, task, body.get("commands"), open_updates)
    batch = cmdmodel.validate_batch(
        body.get("commands"), open_update_ids=open_updates, optional_types=IMPLEMENTED_OPTIONAL_COMMANDS
    )
    check_storable_durations(batch)
    _fenced_write(t, task, "status = 'completed', lease_owner = NULL, lease_expires_at = NULL", ())
    t.fx.transition("workflow_task", task_id, "leased", "completed")
    forget_polls(t, "workflow", task_id)
    seen = int(task["seen_sequence"] or 0)
    run_before = t.run(run_id)
    # Decided rule (README): a follow-up replay is owed only for an event that woke the run during the lease
    # (engine.wake_run records it as the deferred resume); heartbeats and ActivityStarted wake nothing.
    new_events_arrived = int(run_before["last_sequence"]) > seen and deferred_resume(task) is not None
    created: list[str] = []
    terminal: cmdmodel.Command | None = None
    # SDK-INTEROP §6.4: an open wait that this batch does not re-emit (same key and fingerprint) was
    # satisfied by the history the task replayed — before anything the batch schedules after it in workflow
    # code. Record that first, so ConditionWaitSatisfied precedes the events of the following commands.
    _satisfy_moved_past_waits(t, run_id, _reemitted_waits(t, run_id, batch), task_id)
    for command in batch:
        if command.type in cmdmodel.TERMINAL_TYPES:
            terminal = command
            continue
        apply_command(t, task, command, created)
    if terminal is not None:
        apply_terminal(t, task, terminal, created)
    run = t.run(run_id)
    if run["status"] not in TERMINAL_RUN_STATUSES:
        if new_events_arrived:
            # §8.3: the follow-up names the first wake that arrived during the lease (engine.defer_resume), not
            # this task's own, which the batch just handled; events that woke nothing give a plain replay.
            created.append(create_workflow_task(t, run, deferred_resume(task) or empty_resume()))
            # §9.1: "pending" is "first workflow task not yet completed"; it was just completed.
            set_run_status(t, run_id, "running")
        else:
            # §8.7: with only non-terminal commands the run becomes waiting.
            set_run_status(t, run_id, "waiting")
    run = t.run(run_id)
    if fault(t.settings, "complete-not-persisted"):
        t.db.execute("ROLLBACK")  # the bug: the answer below says completed, but nothing was kept
        t.db.execute("BEGIN IMMEDIATE")
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "outcome": "completed",
        "recorded": True,
        "run_id": run_id,
        "run_status": run["status"],
        "created_task_ids": created,
        "reason": None,
    }


def _commit_valid_prefix(t: T, task: sqlite3.Row, commands: Any, open_updates: list[str]) -> None:
    """Fault "partial-batch-on-invalid": when the batch is invalid, its longest valid prefix's non-terminal
    commands are applied and committed before the rejection (the bug: a batch that is not atomic)."""
    if not isinstance(commands, list):
        return
    for n in range(len(commands), 0, -1):
        try:
            prefix = cmdmodel.validate_batch(
                commands[:n], open_update_ids=open_updates, optional_types=IMPLEMENTED_OPTIONAL_COMMANDS
            )
        except Rejection:
            continue
        if n == len(commands):
            return  # the whole batch is valid: the normal path applies it
        for command in prefix:
            if command.type not in cmdmodel.TERMINAL_TYPES:
                apply_command(t, task, command, [])
        t.db.execute("COMMIT")
        t.db.execute("BEGIN IMMEDIATE")
        return


# This server keeps instants as int64 microseconds (store.py), so "now + duration" must fit in 2**63 µs.
# The spec bounds durations only below ("ints ≥1"); a larger one used to reach SQLite and fail there with a
# 500, which §14.1 forbids ("never return 5xx. Either 422 or ignored"). The cap is 10,000 years, the range of
# a protobuf Duration: far beyond any real timeout, far below the overflow.
MAX_DURATION_SECONDS = 315_576_000_000
_DURATION_FIELDS = (
    "delay_seconds",  # start_timer
    "timeout_seconds",  # open_condition_wait
    "start_to_close_timeout",
    "schedule_to_start_timeout",
    "schedule_to_close_timeout",
    "heartbeat_timeout",
    "execution_timeout_seconds",
    "run_timeout_seconds",
)


def check_storable_durations(batch: list[cmdmodel.Command]) -> None:
    """422 for a duration (or retry backoff) of a validated batch that this server cannot store."""
    from .app import validation_error

    errors: dict[str, list[str]] = {}
    limit = f"must be at most {MAX_DURATION_SECONDS} seconds (10,000 years)"
    for command in batch:
        p = f"commands.{command.index}"
        for name in _DURATION_FIELDS:
            value = command.fields.get(name)
            if isinstance(value, int) and value > MAX_DURATION_SECONDS:
                errors[f"{p}.{name}"] = [limit]
        policy = command.fields.get("retry_policy")
        backoff = policy.get("backoff_seconds") if isinstance(policy, Mapping) else None
        for i, value in enumerate(backoff if isinstance(backoff, list) else []):
            if isinstance(value, int) and value > MAX_DURATION_SECONDS:
                errors[f"{p}.retry_policy.backoff_seconds.{i}"] = [limit]
    if errors:
        raise validation_error(errors)


def _blob(value: Any) -> str | None:
    """A payload field is an envelope ``{codec, blob}`` or a bare base64 blob (§8.7.1)."""
    if value is None:
        return None
    if isinstance(value, dict):
        blob = value.get("blob")
        return blob if isinstance(blob, str) else None
    return value if isinstance(value, str) else None


def apply_command(t: T, task: sqlite3.Row, command: cmdmodel.Command, created: list[str]) -> None:
    run = t.run(task["run_id"])
    run_id = run["run_id"]
    f = command.fields
    command_id = new_id(t.now)
    ev = {"workflow_task_id": task["task_id"], "workflow_command_id": command_id}
    if command.type == "schedule_activity":
        step = next_step(t, run_id)
        execution_id = new_id(t.now)
        activity_task_id = new_id(t.now)
        # SESSION-ROUTING: the command's queue, else the session's, else the run's.
        queue = f.get("queue") or sessions.session_queue(f.get("worker_session")) or run["task_queue"]
        policy = f.get("retry_policy") or None
        # A null retry_policy field means "absent" (suite.protocol.commands accepts it as such): `.get(k, [])`
        # returned the null and list(None) answered 500 (found by the OpenAPI fuzz, suite/fuzz.py).
        snapshot = {
            "snapshot_version": 1,
            "max_attempts": (policy or {}).get("max_attempts") or 1,
            "backoff_seconds": list((policy or {}).get("backoff_seconds") or []),
            "non_retryable_error_types": list((policy or {}).get("non_retryable_error_types") or []),
            "start_to_close_timeout": f.get("start_to_close_timeout"),
            "schedule_to_start_timeout": f.get("schedule_to_start_timeout"),
            "schedule_to_close_timeout": f.get("schedule_to_close_timeout"),
            "heartbeat_timeout": f.get("heartbeat_timeout"),
        }
        s2c = f.get("schedule_to_close_timeout")
        s2s = f.get("schedule_to_start_timeout")
        t.db.execute(
            "INSERT INTO activity_executions (execution_id, namespace, run_id, step_sequence, activity_type,"
            " task_queue, connection, arguments_blob, retry_policy, start_to_close_timeout,"
            " schedule_to_start_timeout, schedule_to_close_timeout, heartbeat_timeout, status, attempt_count,"
            " scheduled_at, schedule_to_close_deadline, current_task_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)",
            (
                execution_id,
                run["namespace"],
                run_id,
                step,
                f["activity_type"],
                queue,
                f.get("connection"),
                _blob(f.get("arguments")),
                dumps(snapshot),
                f.get("start_to_close_timeout"),
                s2s,
                s2c,
                f.get("heartbeat_timeout"),
                t.now,
                t.now + s2c * 1_000_000 if s2c else None,
                activity_task_id,
            ),
        )
        t.db.execute(
            "INSERT INTO activity_tasks (task_id, namespace, execution_id, run_id, task_queue, activity_type,"
            " compatibility, status, available_at, created_at, schedule_to_start_deadline)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
            (
                activity_task_id,
                run["namespace"],
                execution_id,
                run_id,
                queue,
                f["activity_type"],
                run["compatibility"],
                t.now,
                t.now,
                t.now + s2s * 1_000_000 if s2s else None,
            ),
        )
        session = sessions.on_schedule(t, run["namespace"], execution_id, activity_task_id, f.get("worker_session"))
        append_event(
            t,
            run_id,
            "ActivityScheduled",
            {
                "sequence": step,
                "activity_execution_id": execution_id,
                "activity_type": f["activity_type"],
                "task_id": activity_task_id,
                "queue": queue,
                "arguments": _blob(f.get("arguments")),
                "payload_codec": "avro",
                "retry_policy": snapshot,
                **({"cancellation_policy": f["cancellation_policy"]} if "cancellation_policy" in f else {}),
                **({"worker_session": session} if session is not None else {}),
            },
            **ev,
        )
        created.append(activity_task_id)
        t.fx.wake.add(("activity", run["namespace"], queue))
        t.fx.transition("activity_task", activity_task_id, None, "ready", run_id=run_id)
    elif command.type == "start_timer":
        step = next_step(t, run_id)
        timer_id = new_id(t.now)
        delay = int(f["delay_seconds"])
        fire_at = t.now + delay * 1_000_000
        t.db.execute(
            "INSERT INTO timers (timer_id, run_id, step_sequence, delay_seconds, fire_at, status, timer_kind)"
            " VALUES (?, ?, ?, ?, ?, 'pending', 'sleep')",
            (timer_id, run_id, step, delay, fire_at),
        )
        append_event(
            t,
            run_id,
            "TimerScheduled",
            {
                "sequence": step,
                "timer_id": timer_id,
                "delay_seconds": delay,
                "fire_at": ts(fire_at),
                "timer_kind": "sleep",
            },
            **ev,
        )
        created.append(timer_id)
    elif command.type == "open_condition_wait":
        _open_condition_wait(t, run_id, f, ev, created)
    elif command.type == "start_child_workflow":
        step = next_step(t, run_id)
        call_id = new_id(t.now)
        # The child's workflow id is the server's, unique per call: start_run makes it the id's current run, so
        # an id that already has a run would take that workflow over (the same-numbered run even failed the
        # UNIQUE index: a 500). "{workflow_id}:child:{step}" did both for a child of a later run of the same
        # workflow (continue-as-new restarts the step count) while an abandoned child of an earlier run lived
        # on, and a command's own `workflow_id` (not a start_child_workflow field, §8.7.1; unknown fields are
        # ignored, §0) could name the parent itself.
        child_workflow_id = f"{run['workflow_id']}:child:{call_id}"
        policy = f.get("retry_policy") or None
        # CHILD-PARENT-CLOSE-DEFAULT / CHILD-POLICY-RECORDED: record what the SDK assumes for an omitted
        # policy, because its replay compares the recorded value with its own default.
        parent_close = f.get("parent_close_policy") or cmdmodel.DEFAULT_PARENT_CLOSE_POLICY
        if fault(t.settings, "child-default-terminate") and not f.get("parent_close_policy"):
            parent_close = "terminate"  # the bug: an omitted policy closes the child with its parent
        cancellation = f.get("cancellation_policy")
        if not isinstance(cancellation, str) or not cancellation:
            cancellation = cmdmodel.DEFAULT_CHILD_CANCELLATION_POLICY
        t.db.execute(
            "INSERT INTO children (child_call_id, parent_run_id, step_sequence, workflow_type, child_workflow_id,"
            " task_queue, arguments_blob, parent_close_policy, retry_policy, execution_timeout_seconds,"
            " run_timeout_seconds, attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, 'running')",
            (
                call_id,
                run_id,
                step,
                f["workflow_type"],
                child_workflow_id,
                f.get("queue") or run["task_queue"],
                _blob(f.get("arguments")),
                parent_close,
                dumps(policy) if policy else None,
                f.get("execution_timeout_seconds"),
                f.get("run_timeout_seconds"),
            ),
        )
        append_event(
            t,
            run_id,
            "ChildWorkflowScheduled",
            {
                "sequence": step,
                "child_call_id": call_id,
                "child_workflow_id": child_workflow_id,
                "workflow_type": f["workflow_type"],
                "parent_close_policy": parent_close,
                "cancellation_policy": cancellation,
                "retry_policy": policy,
            },
            **ev,
        )
        call = t.one("SELECT * FROM children WHERE child_call_id = ?", call_id)
        assert call is not None
        child_run_id = start_child_run(t, call, t.run(run_id))
        created.append(child_run_id)
    elif command.type in ("complete_update", "fail_update"):
        update_id = f["update_id"]
        completed = command.type == "complete_update"
        result_blob = _blob(f.get("result")) if completed else None
        failure = (
            None
            if completed
            else {
                "message": f.get("message"),
                "exception_class": f.get("exception_class"),
                "exception_type": f.get("exception_type"),
                "non_retryable": bool(f.get("non_retryable", False)),
            }
        )
        t.db.execute(
            "UPDATE updates SET status = ?, result_blob = ?, failure = ?, closed_at = ? WHERE update_id = ?",
            (
                "completed" if completed else "failed",
                result_blob,
                dumps(failure) if failure else None,
                t.now,
                update_id,
            ),
        )
        append_event(t, run_id, "UpdateApplied", {"update_id": update_id}, **ev)
        append_event(
            t,
            run_id,
            "UpdateCompleted",
            {
                "update_id": update_id,
                "outcome": "completed" if completed else "failed",
                "result": result_blob,
                "payload_codec": "avro",
                "failure": failure,
            },
            **ev,
        )
    elif command.type == "record_side_effect":
        step = next_step(t, run_id)
        append_event(
            t,
            run_id,
            "SideEffectRecorded",
            {"sequence": step, "result": _blob(f.get("result")), "payload_codec": "avro"},
            **ev,
        )
    elif command.type == "record_version_marker":
        step = next_step(t, run_id)
        append_event(
            t,
            run_id,
            "VersionMarkerRecorded",
            {
                "sequence": step,
                "change_id": f["change_id"],
                "version": f["version"],
                "min_supported": f["min_supported"],
                "max_supported": f["max_supported"],
            },
            **ev,
        )
    elif command.type == "upsert_search_attributes":
        current = dict(loads(run["search_attributes"]) or {})
        for key, value in dict(f["attributes"]).items():
            if value is None:
                current.pop(key, None)  # §8.7.1: a null value deletes the key
            else:
                current[key] = value
        t.db.execute("UPDATE runs SET search_attributes = ? WHERE run_id = ?", (dumps(current), run_id))
        append_event(
            t,
            run_id,
            "SearchAttributesUpserted",
            {"attributes": f["attributes"], "attribute_types": f.get("attribute_types")},
            **ev,
        )
    else:  # pragma: no cover - validate_batch admits only known types
        raise AssertionError(command.type)


def _open_condition_wait(
    t: T,
    run_id: str,
    f: Mapping[str, Any],
    ev: Mapping[str, Any],
    created: list[str],
) -> None:
    """``open_condition_wait`` (SDK-INTEROP §5, §6.4): re-emitting an open wait with the same key and
    fingerprint re-opens it (no new event); a wait the worker stopped re-emitting was satisfied, which
    :func:`complete_workflow_task` records before applying the batch (:func:`_reemitted_waits`)."""
    key = f.get("condition_key")
    fingerprint = f.get("condition_definition_fingerprint")
    existing = t.one(
        "SELECT * FROM condition_waits WHERE run_id = ? AND status = 'open' AND condition_key IS ?"
        " AND fingerprint IS ?",
        run_id,
        key,
        fingerprint,
    )
    if existing is not None:
        return
    step = next_step(t, run_id)
    wait_id = new_id(t.now)
    timeout = f.get("timeout_seconds")
    timer_id = None
    append_event(
        t,
        run_id,
        "ConditionWaitOpened",
        {
            "sequence": step,
            "condition_wait_id": wait_id,
            "condition_key": key,
            "condition_definition_fingerprint": fingerprint,
            "timeout_seconds": timeout,
        },
        **ev,
    )
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout >= 0:
        timer_id = new_id(t.now)
        fire_at = t.now + timeout * 1_000_000
        t.db.execute(
            "INSERT INTO timers (timer_id, run_id, step_sequence, delay_seconds, fire_at, status, timer_kind,"
            " condition_wait_id) VALUES (?, ?, ?, ?, ?, 'pending', 'condition_timeout', ?)",
            (timer_id, run_id, step, timeout, fire_at, wait_id),
        )
        append_event(
            t,
            run_id,
            "TimerScheduled",
            {
                "sequence": step,
                "timer_id": timer_id,
                "delay_seconds": timeout,
                "fire_at": ts(fire_at),
                "timer_kind": "condition_timeout",
                "condition_wait_id": wait_id,
            },
            **ev,
        )
        created.append(timer_id)
    t.db.execute(
        "INSERT INTO condition_waits (condition_wait_id, run_id, condition_key, fingerprint, step_sequence,"
        " timeout_seconds, timer_id, status) VALUES (?, ?, ?, ?, ?, ?, ?, 'open')",
        (wait_id, run_id, key, fingerprint, step, timeout, timer_id),
    )


def _reemitted_waits(t: T, run_id: str, batch: list[cmdmodel.Command]) -> set[str]:
    """The open condition waits of the run that ``batch`` re-emits (a "reopen", SDK-INTEROP §6.4)."""
    wanted = {
        (c.fields.get("condition_key"), c.fields.get("condition_definition_fingerprint"))
        for c in batch
        if c.type == "open_condition_wait"
    }
    return {
        w["condition_wait_id"]
        for w in t.all("SELECT * FROM condition_waits WHERE run_id = ? AND status = 'open'", run_id)
        if (w["condition_key"], w["fingerprint"]) in wanted
    }


def _satisfy_moved_past_waits(t: T, run_id: str, still_open: set[str], task_id: str) -> None:
    for wait in t.all("SELECT * FROM condition_waits WHERE run_id = ? AND status = 'open'", run_id):
        if wait["condition_wait_id"] in still_open:
            continue
        t.db.execute(
            "UPDATE condition_waits SET status = 'satisfied' WHERE condition_wait_id = ?",
            (wait["condition_wait_id"],),
        )
        if wait["timer_id"]:
            t.db.execute(
                "UPDATE timers SET status = 'cancelled' WHERE timer_id = ? AND status = 'pending'",
                (wait["timer_id"],),
            )
        append_event(
            t,
            run_id,
            "ConditionWaitSatisfied",
            {"condition_wait_id": wait["condition_wait_id"], "sequence": wait["step_sequence"]},
            workflow_task_id=task_id,
        )


def apply_terminal(t: T, task: sqlite3.Row, command: cmdmodel.Command, created: list[str]) -> None:
    run = t.run(task["run_id"])
    f = command.fields
    if command.type == "complete_workflow":
        blob = _blob(f.get("result"))
        close_run(
            t,
            run["run_id"],
            "completed",
            closed_reason="completed",
            event_type="WorkflowCompleted",
            payload={
                "output": blob,
                "result": {"codec": "avro", "blob": blob} if blob else None,
                "payload_codec": "avro",
            },
            output_blob=blob,
            workflow_task_id=task["task_id"],
        )
    elif command.type == "fail_workflow":
        failure = {
            "message": f["message"],
            "exception_class": f.get("exception_class"),
            "exception_type": f.get("exception_type"),
            "exception": f.get("exception"),
            "non_retryable": bool(f.get("non_retryable", False)),
        }
        close_run(
            t,
            run["run_id"],
            "failed",
            closed_reason="failed",
            event_type="WorkflowFailed",
            payload=failure,
            failure=failure,
            workflow_task_id=task["task_id"],
        )
    elif command.type == "continue_as_new":
        blob = _blob(f.get("arguments"))
        workflow_type = f.get("workflow_type") or run["workflow_type"]
        queue = f.get("queue") or run["task_queue"]
        close_run(
            t,
            run["run_id"],
            "completed",
            closed_reason="continued",
            event_type="WorkflowContinuedAsNew",
            payload={
                "workflow_type": workflow_type,
                "task_queue": queue,
                "arguments": blob,
                "payload_codec": "avro",
            },
            workflow_task_id=task["task_id"],
        )
        new_run_id = start_run(
            t,
            namespace=run["namespace"],
            workflow_id=run["workflow_id"],
            workflow_type=workflow_type,
            task_queue=queue,
            input_blob=blob,
            run_number=int(run["run_number"]) + 1,
            first_run_id=run["first_run_id"],
            memo=loads(run["memo"]),
            search_attributes=loads(run["search_attributes"]),
            business_key=run["business_key"],
            execution_timeout_seconds=run["execution_timeout_seconds"],
            run_timeout_seconds=run["run_timeout_seconds"],
            execution_deadline=run["execution_deadline"],
            parent_run_id=run["parent_run_id"],
            parent_child_call_id=run["parent_child_call_id"],
            compatibility=run["compatibility"],
            extra_started={"continued_from_run_id": run["run_id"]},
        )
        if run["parent_child_call_id"]:
            t.db.execute(
                "UPDATE children SET current_run_id = ? WHERE child_call_id = ?",
                (new_run_id, run["parent_child_call_id"]),
            )
        t.db.execute("UPDATE runs SET output_blob = NULL WHERE run_id = ?", (run["run_id"],))
        created.append(new_run_id)
    else:  # pragma: no cover
        raise AssertionError(command.type)
