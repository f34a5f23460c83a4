"""Query tasks (docs/reference.md: Queries, Control plane): the control-plane query, and the worker poll, complete and
fail.

A query is **ephemeral** and **read-only** (§10.1, ``QUERY-READ-ONLY``): the control-plane call creates one
``query_tasks`` row, wakes the query pollers of the run's task queue and holds the caller until the row is
terminal. Nothing here appends history, creates a workflow task or changes a run; the only rows written
are the query task's own (and the poll-replay cache).

Lifecycle (``suite.protocol.lifecycles.QUERY_TASK``, the model decides every target state)::

    pending ──claim──▶ leased ──complete──▶ completed
       │                 │  └──fail──────▶ failed
       │                 └──expire──▶ pending (lazily, by the next claim)
       └────────time_out (either state)──▶ timed_out

Decisions (each documented where it is enforced):

* **Who can take queries.** The SDK adds ``"query_tasks"`` to its registered ``capabilities`` only when
  the server advertises it, and older workers send no capabilities at all, so *any* active, fresh
  (``last_heartbeat_at`` within ``stale_worker_seconds``; polls refresh it) worker registered on the run's
  queue whose ``supported_workflow_types`` match (empty = all), whose build id matches the run's
  compatibility marker, and whose build-id cohort is not draining counts as a query target. Without one
  the call answers 409 ``query_worker_unavailable`` at once and creates no task (§10.5, invariant 62).
* **Closed runs can be queried.** §10.1: queries "never mutate the run", so a closed current run is
  routed like an open one (the worker replays its complete history). A run-targeted query on a
  *non-current* run is refused with 409 ``historical_run_command_rejected`` like every run-targeted
  command (§1.2). (``engine.close_run`` fails queries still *pending* when a run closes; the waiting
  caller then gets 409 ``query_rejected``.)
* **Lease expiry before the deadline** makes the task claimable again, exactly like workflow tasks
  (§9): the next eligible poll re-leases it with attempt + 1; until then the old holder is fenced with
  ``lease_expired``, afterwards with ``lease_owner_mismatch`` / ``query_task_attempt_mismatch``.
* **No retry after the control-plane timeout** (§10.1 step 4): once the deadline passes the task is
  ``timed_out`` (terminal in the model). A task past its deadline is never leased, and a complete or fail
  for it is fenced as ``query_task_not_leased`` even before the sweep has written ``timed_out``.
* **Result views.** The caller's ``result`` is the decoded JSON view of ``result_envelope`` when the
  worker sent one (§10.3); otherwise it is the worker's raw ``result``, and the server encodes that into
  an Avro ``result_envelope`` (the run's codec is always ``avro``, §12.1) so clients always have the
  authoritative form.
* **Retention.** Terminal query tasks are deleted ``TERMINAL_RETENTION_SECONDS`` after their deadline, so
  the ephemeral table stays small; until then a late report gets 409 ``query_task_not_leased``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from suite.protocol.commands import DEFAULT_QUERY_FAILURE_REASON
from suite.protocol.errors import Rejection
from suite.protocol.fencing import QueryTaskView, guard_query_task
from suite.protocol.lifecycles import QUERY_TASK, QueryTaskEvent, QueryTaskStatus

from .engine import event_json, history_page, ts
from .polling import Poll, forget_polls, lease_taken, replayed_task
from .store import dumps, from_us, loads, new_id
from .transitions import QUERY_TASKS, claim, initial, move
from .tx import T, Watch

__all__ = [
    "DEADLINE_WATCHES",
    "MAX_PENDING_PER_QUEUE",
    "MAX_QUERY_NAME_LENGTH",
    "TERMINAL_RETENTION_SECONDS",
    "claim_query_task",
    "create_query_task",
    "give_up",
    "is_terminal",
    "query_answer",
    "query_due_in",
    "query_task_row",
    "report_query_task",
    "result_key",
    "sweep_query_tasks",
]

# §10.5: "Pending query tasks per queue ≥ 1024 | `query_task_queue_full` | 429".
MAX_PENDING_PER_QUEUE = 1024
TERMINAL_RETENTION_SECONDS = 3600
# cluster/info ``limits.max_operation_name_length``.
MAX_QUERY_NAME_LENGTH = 256

_LIVE = (QueryTaskStatus.PENDING.value, QueryTaskStatus.LEASED.value)
_TERMINAL = frozenset(s.value for s in QUERY_TASK.terminal)


def result_key(namespace: str, query_task_id: str) -> tuple[str, str, str]:
    """The hub key a query task's waiting caller listens on. It is published through ``Effects.wake``
    (whose keys are 3-tuples), so the notification goes out only after the deciding transaction commits."""
    return ("query_result", namespace, query_task_id)


def _effective_status(row: sqlite3.Row, now: int) -> str:
    """A live task past its deadline is timed out whether or not the sweep has written it yet (§10.1
    step 4: "not retried after the control-plane timeout")."""
    status = str(row["status"])
    if status in _LIVE and int(row["deadline"]) <= now:
        return QueryTaskStatus.TIMED_OUT.value
    return status


def _time_out(t: T, row: sqlite3.Row) -> None:
    """pending|leased → timed_out, and tell the waiting caller."""
    qid = row["query_task_id"]
    if move(t, QUERY_TASKS, qid, row["status"], QueryTaskEvent.TIME_OUT, run_id=row["run_id"]) is not None:
        forget_polls(t, "query", qid)
        t.fx.wake.add(result_key(row["namespace"], qid))


# -- maintenance ---------------------------------------------------------------------------------------


# A live query task's deadline, as the task is created (sweep_query_tasks' next due work; tx.Watch).
DEADLINE_WATCHES = (
    Watch("query_tasks", ("status", "deadline"), f"NEW.status IN ('{_LIVE[0]}', '{_LIVE[1]}')", ("NEW.deadline",)),
)


def sweep_query_tasks(t: T) -> float | None:
    """Time out live query tasks past their deadline, drop long-finished ones, and return the seconds
    until the next deadline (``None`` when no query task is live)."""
    for row in t.all(
        "SELECT * FROM query_tasks WHERE status IN (?, ?) AND deadline <= ? ORDER BY deadline LIMIT 500",
        *_LIVE,
        t.now,
    ):
        _time_out(t, row)
    t.db.execute(
        "DELETE FROM query_tasks WHERE status IN (?, ?, ?) AND deadline < ?",
        (*sorted(_TERMINAL), t.now - TERMINAL_RETENTION_SECONDS * 1_000_000),
    )
    nxt = t.one("SELECT MIN(deadline) AS at FROM query_tasks WHERE status IN (?, ?)", *_LIVE)
    if nxt is None or nxt["at"] is None:
        return None
    return max(0.0, (int(nxt["at"]) - t.now) / 1e6)


# -- routing (§10.1, §10.5) ----------------------------------------------------------------------------


def _has_query_worker(t: T, run: sqlite3.Row) -> bool:
    """Whether an active, fresh worker that could lease this run's query task exists (module docstring:
    "Who can take queries"). The filters are the claim's filters, so a yes here means a poll can lease."""
    fresh_since = t.now - t.settings.stale_worker_seconds * 1_000_000
    rows = t.all(
        "SELECT w.workflow_types FROM workers w"
        " WHERE w.namespace = ? AND w.task_queue = ? AND w.status = 'active' AND w.last_heartbeat_at >= ?"
        " AND (? IS NULL OR COALESCE(w.build_id, '') = ?)"
        " AND NOT EXISTS (SELECT 1 FROM drains d WHERE d.namespace = w.namespace"
        " AND d.task_queue = w.task_queue AND d.build_id = COALESCE(w.build_id, '')"
        " AND d.drain_intent = 'draining')",
        run["namespace"],
        run["task_queue"],
        fresh_since,
        run["compatibility"],
        run["compatibility"],
    )
    for w in rows:
        types = loads(w["workflow_types"]) or []
        if not types or run["workflow_type"] in types:
            return True
    return False


# -- claim and task payload (§10.2) --------------------------------------------------------------------


def _task_payload(t: T, query_task_id: str) -> dict[str, Any]:
    """The leased query task: the §10.2 fields plus ``namespace`` (Python SDK 2.12.0, Worker handshake).
    ``history_events`` is the run's whole committed history, unpaginated, as UPS sends it."""
    task = t.one("SELECT * FROM query_tasks WHERE query_task_id = ?", query_task_id)
    assert task is not None, query_task_id
    run = t.run(task["run_id"])
    last = int(run["last_sequence"])
    events = [event_json(r, run["namespace"]) for r in history_page(t.db, run["run_id"], 0, max(last, 1))]
    args = task["arguments_blob"]
    return {
        "query_task_id": task["query_task_id"],
        "query_task_attempt": task["attempt"],
        "namespace": task["namespace"],
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "workflow_type": run["workflow_type"],
        "query_name": task["query_name"],
        "payload_codec": "avro",
        "workflow_arguments": {"codec": "avro", "blob": run["input_blob"]} if run["input_blob"] else None,
        "query_arguments": {"codec": "avro", "blob": args} if args else None,
        "run_status": run["status"],
        "last_history_sequence": last,
        "history_events": events,
        "task_queue": task["task_queue"],
        "lease_owner": task["lease_owner"],
        # Python SDK 2.12.0, Worker handshake: canonical ``YYYY-MM-DDTHH:MM:SS.ffffffZ``
        # (engine.ts → fencing.rfc3339).
        "lease_expires_at": ts(task["lease_expires_at"]),
    }


def claim_query_task(t: T, poll: Poll) -> dict[str, Any] | None:
    """Lease one claimable query task to the polling worker (§10.2) or return ``None``.

    Claimable: on this namespace and queue, before its deadline, and either pending or leased with an
    expired lease (redelivery, attempt + 1). The worker must match the run's workflow type (empty list =
    all) and compatibility marker, as for workflow tasks (§7.5).
    """
    namespace, worker_id, task_queue, worker = poll.namespace, poll.worker_id, poll.queue, poll.worker
    lease_until = t.now + t.settings.query_lease_seconds * 1_000_000
    replay = replayed_task(t, poll)
    if replay is not None:
        t.db.execute("UPDATE query_tasks SET lease_expires_at = ? WHERE query_task_id = ?", (lease_until, replay))
        return _task_payload(t, replay)
    types = loads(worker["workflow_types"]) or []
    candidates = t.all(
        "SELECT q.query_task_id, q.status, q.run_id FROM query_tasks q JOIN runs r ON r.run_id = q.run_id"
        " WHERE q.namespace = ? AND q.task_queue = ? AND q.deadline > ?"
        " AND (q.status = 'pending' OR (q.status = 'leased' AND q.lease_expires_at <= ?))"
        " AND (r.compatibility IS NULL OR r.compatibility = ?)"
        " AND (? = 0 OR r.workflow_type IN (SELECT value FROM json_each(?)))"
        " ORDER BY q.created_at, q.query_task_id LIMIT 100",
        namespace,
        task_queue,
        t.now,
        t.now,
        worker["build_id"] or "",
        len(types),
        dumps(types),
    )
    for cand in candidates:
        # The conditional write decides any race; a lost one is not an error (§7.5).
        redelivery = cand["status"] == QueryTaskStatus.LEASED
        also, args = "attempt = attempt + 1, lease_owner = ?, lease_expires_at = ?", (worker_id, lease_until)
        moved = claim(
            t,
            QUERY_TASKS,
            cand["query_task_id"],
            cand["status"],
            also=also,
            args=args,
            where="deadline > ?",
            where_args=(t.now,),
        )
        if moved is None:
            continue
        if redelivery:
            t.fx.transition("query_task", cand["query_task_id"], "leased", "pending", cause="lease_expired")
        t.fx.transition(
            "query_task",
            cand["query_task_id"],
            "pending",
            "leased",
            run_id=cand["run_id"],
            lease_owner=worker_id,
        )
        attempt = t.one("SELECT attempt FROM query_tasks WHERE query_task_id = ?", cand["query_task_id"])
        assert attempt is not None
        lease_taken(t, poll, cand["query_task_id"], int(attempt["attempt"]))
        return _task_payload(t, cand["query_task_id"])
    return None


def query_due_in(db: sqlite3.Connection, poll: Poll, now: int) -> float | None:
    """Seconds until a lease on this queue expires while its task is still before the deadline, i.e.
    until durable state alone makes a task claimable again (no notification announces that)."""
    row = db.execute(
        "SELECT MIN(lease_expires_at) FROM query_tasks WHERE namespace = ? AND task_queue = ?"
        " AND status = 'leased' AND lease_expires_at < deadline AND deadline > ?",
        (poll.namespace, poll.queue, now),
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, (int(row[0]) - now) / 1e6)


# -- complete and fail (§10.3, §10.4, §10.6) -----------------------------------------------------------


def report_query_task(
    t: T,
    namespace: str,
    query_task_id: str,
    owner: str,
    attempt: int,
    event: QueryTaskEvent,
    doc: dict[str, Any],
) -> str:
    """Fence (§10.6, in the model's order) and record one outcome. Returns the new status."""
    row = t.one("SELECT * FROM query_tasks WHERE query_task_id = ? AND namespace = ?", query_task_id, namespace)
    view = None
    if row is not None:
        expires = row["lease_expires_at"]
        view = QueryTaskView(
            query_task_id=query_task_id,
            status=QueryTaskStatus(_effective_status(row, t.now)),
            attempt=int(row["attempt"]),
            lease_owner=row["lease_owner"],
            lease_expires_at=from_us(expires) if expires is not None else None,
        )
    # FENCE-UNKNOWN-QUERY-TASK, QUERY-LATE-COMPLETE-NOT-LEASED, QUERY-FENCE-OWNER, QUERY-FENCE-ATTEMPT.
    guard_query_task(view, query_task_id=query_task_id, lease_owner=owner, attempt=attempt, now=from_us(t.now))
    assert row is not None
    column = "result" if event is QueryTaskEvent.COMPLETE else "failure"
    # The write is conditional on the very lease the guard saw, so two reports can never both land.
    new = move(
        t,
        QUERY_TASKS,
        query_task_id,
        QueryTaskStatus.LEASED,
        event,
        also=f"{column} = ?",
        args=(dumps(doc),),
        where="lease_owner = ? AND attempt = ? AND lease_expires_at > ? AND deadline > ?",
        where_args=(owner, attempt, t.now, t.now),
        quiet=True,
    )
    if new is None:
        raise Rejection(
            409,
            "query_task_not_leased",
            f"Query task {query_task_id!r} changed before this report was written; drop the result.",
            {"query_task_id": query_task_id, "outcome": "rejected"},
        )
    forget_polls(t, "query", query_task_id)
    t.fx.transition("query_task", query_task_id, "leased", new.value, run_id=row["run_id"])
    t.fx.wake.add(result_key(namespace, query_task_id))
    return new.value


# -- the control-plane call (§10.1, §10.5, §12.2) ------------------------------------------------------


def create_query_task(t: T, run: sqlite3.Row, name: str, args_blob: str | None, timeout: float) -> str:
    """Create the query task of one control-plane query and wake the run's query pollers; 409 at once when no
    worker can take it (``QUERY-NO-WORKER-FAST``: decided before anything is written), 429 when the queue is
    full (§10.5)."""
    base = {"workflow_id": run["workflow_id"], "run_id": run["run_id"], "query_name": name}
    if not _has_query_worker(t, run):
        raise Rejection(
            409,
            "query_worker_unavailable",
            f"No active worker on task queue {run['task_queue']!r} can answer queries for workflow "
            f"type {run['workflow_type']!r}; start or re-register a worker for that queue and type.",
            {**base, "task_queue": run["task_queue"], "workflow_type": run["workflow_type"]},
        )
    pending = t.one(
        "SELECT COUNT(*) AS n FROM query_tasks WHERE namespace = ? AND task_queue = ? AND status = 'pending'",
        run["namespace"],
        run["task_queue"],
    )
    if pending is not None and int(pending["n"]) >= MAX_PENDING_PER_QUEUE:
        raise Rejection(
            429,
            "query_task_queue_full",
            f"Task queue {run['task_queue']!r} already holds {MAX_PENDING_PER_QUEUE} pending query "
            "tasks; retry after the workers have drained some.",
            {
                **base,
                "task_queue": run["task_queue"],
                "max_pending_query_tasks": MAX_PENDING_PER_QUEUE,
                "retry_after_seconds": 1,
            },
        )
    qid = new_id(t.now)
    t.db.execute(
        "INSERT INTO query_tasks (query_task_id, namespace, run_id, task_queue, query_name,"
        " arguments_blob, status, attempt, deadline, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
        (
            qid,
            run["namespace"],
            run["run_id"],
            run["task_queue"],
            name,
            args_blob,
            initial(QUERY_TASKS),
            t.now + int(timeout * 1_000_000),
            t.now,
        ),
    )
    t.fx.transition("query_task", qid, None, initial(QUERY_TASKS), run_id=run["run_id"])
    t.fx.wake.add(("query", run["namespace"], run["task_queue"]))
    return qid


def query_task_row(db: sqlite3.Connection, qid: str) -> sqlite3.Row:
    row: sqlite3.Row | None = db.execute("SELECT * FROM query_tasks WHERE query_task_id = ?", (qid,)).fetchone()
    assert row is not None, qid  # retention keeps it far longer than anyone waits
    return row


def is_terminal(row: sqlite3.Row) -> bool:
    return row["status"] in _TERMINAL


def give_up(t: T, qid: str) -> sqlite3.Row:
    """The caller stops waiting: a live task becomes timed_out (a report that landed first wins)."""
    row = query_task_row(t.db, qid)
    if row["status"] in _LIVE:
        _time_out(t, row)
        row = query_task_row(t.db, qid)
    return row


def query_answer(row: sqlite3.Row, base: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
    """Map a terminal query task onto the control-plane answer (§10.4, §10.5, §12.2)."""
    status = row["status"]
    if status == QueryTaskStatus.COMPLETED.value:
        doc = loads(row["result"]) or {}
        # QUERY-RESULT-ROUNDTRIP: the worker's envelope comes back unchanged.
        return 200, {**base, "result": doc.get("result"), "result_envelope": doc.get("result_envelope")}
    if status == QueryTaskStatus.FAILED.value:
        failure = loads(row["failure"]) or {}
        reason = failure.get("reason") or DEFAULT_QUERY_FAILURE_REASON
        message = failure.get("message") or f"The worker failed query {base['query_name']!r}."
        # QUERY-UNKNOWN-404 / QUERY-REJECTED-409: rejected_unknown_query is 404, every other reason 409.
        http_status = 404 if reason == "rejected_unknown_query" else 409
        raise Rejection(http_status, reason, message, {**base, "failure": failure})
    # QUERY-TIMEOUT-504.
    raise Rejection(
        504,
        "query_worker_timeout",
        f"No worker answered query {base['query_name']!r} within {timeout:g} s; check that a worker polls "
        "query tasks on the run's task queue, or raise the query timeout.",
        {**base, "timeout_seconds": timeout},
    )
