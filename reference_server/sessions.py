"""Worker sessions: storage, the three worker routes, operator visibility, and the hooks the activity code
calls (schedule, claim admission, heartbeat renewal, the affinity snapshot).

The rules are :mod:`suite.protocol.sessions` (admission, the lifecycle table, expiry); this module stores
sessions in SQLite and steps every status change through ``SESSION``. Expiry is settled lazily inside each
transaction that reads a session (so an answer is always right at its ``now``) and by a scheduler step (so
operator visibility shows expired, orphaned and TTL-closed sessions without anyone asking first).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from suite.protocol import sessions as model
from suite.protocol.errors import Rejection
from suite.protocol.sessions import SESSION, Admission, SessionEvent, SessionOptions, SessionStatus, SessionView

from .engine import ts
from .store import apply_schema, dumps, from_us, loads, to_us
from .transitions import WORKER_SESSIONS, move, step
from .tx import T, Watch

__all__ = [
    "DDL",
    "DUE_WATCHES",
    "activity_snapshot",
    "admit_claim",
    "close_session",
    "commit_admission",
    "create_session",
    "describe_session",
    "heartbeat_session",
    "install",
    "list_sessions",
    "note_registration",
    "on_schedule",
    "renew_from_activity",
    "settle_due",
]

US = 1_000_000

DDL = """
CREATE TABLE IF NOT EXISTS worker_sessions (
    namespace TEXT NOT NULL,
    session_id TEXT NOT NULL,
    queue TEXT,
    connection TEXT,
    requirements TEXT NOT NULL,          -- JSON list
    status TEXT NOT NULL,                -- active | closed | expired | failed | orphaned
    lease_owner TEXT,
    lease_seconds INTEGER NOT NULL,
    ttl_seconds INTEGER NOT NULL,
    max_concurrent_activities INTEGER NOT NULL,
    create_if_missing INTEGER NOT NULL,
    allow_reacquire INTEGER NOT NULL,
    lease_expires_at INTEGER,
    ttl_expires_at INTEGER NOT NULL,
    failure_reason TEXT,
    close_reason TEXT,
    closed_at INTEGER,
    last_heartbeat_at INTEGER,
    generation INTEGER NOT NULL,         -- +1 at every reacquisition
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, session_id)
);
CREATE INDEX IF NOT EXISTS worker_sessions_due ON worker_sessions (status, lease_expires_at, ttl_expires_at);

-- The session an activity execution runs in (its schedule_activity `worker_session`).
CREATE TABLE IF NOT EXISTS activity_sessions (
    execution_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL UNIQUE,
    namespace TEXT NOT NULL,
    session_id TEXT NOT NULL,
    options TEXT NOT NULL                -- JSON workerSessionOptions as scheduled
);
CREATE INDEX IF NOT EXISTS activity_sessions_by_session ON activity_sessions (namespace, session_id);

-- max_concurrent_worker_sessions of a registration (A.2 limits: "worker_registration").
CREATE TABLE IF NOT EXISTS worker_session_limits (
    namespace TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    max_sessions INTEGER NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);
"""


# -- rows and views -----------------------------------------------------------------------------------------


def _row(t: T, namespace: str, session_id: str) -> sqlite3.Row | None:
    return t.one("SELECT * FROM worker_sessions WHERE namespace = ? AND session_id = ?", namespace, session_id)


def _view(row: sqlite3.Row | None) -> SessionView | None:
    if row is None:
        return None
    return SessionView(
        status=SessionStatus(row["status"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=from_us(row["lease_expires_at"]) if row["lease_expires_at"] is not None else None,
        ttl_expires_at=from_us(row["ttl_expires_at"]),
        allow_reacquire_after_failure=bool(row["allow_reacquire"]),
        requirements=tuple(loads(row["requirements"]) or ()),
        queue=row["queue"],
    )


def holder_stale(t: T, namespace: str, owner: str | None) -> bool:
    """A2 failure_detection "registered_worker_heartbeat_staleness": the holder's registration is gone or
    has not heartbeat (or polled) for ``stale_worker_seconds``."""
    if owner is None:
        return False
    worker = t.one(
        "SELECT status, last_heartbeat_at FROM workers WHERE namespace = ? AND worker_id = ?", namespace, owner
    )
    if worker is None or worker["status"] != "active":
        return True
    return heartbeats_stale(t, int(worker["last_heartbeat_at"]))


def heartbeats_stale(t: T, last_heartbeat_at: int) -> bool:
    """Whether a registered worker last heard from at ``last_heartbeat_at`` is stale: no heartbeat or poll for
    ``stale_worker_seconds``."""
    return last_heartbeat_at + t.settings.stale_worker_seconds * US <= t.now


def _step(t: T, row: sqlite3.Row, event: SessionEvent, **changes: Any) -> None:
    """Move one session through the lifecycle table and write ``changes`` with it."""
    changes = {"updated_at": t.now, **changes}
    assignments = ", ".join(f"{name} = ?" for name in changes)
    move(
        t,
        WORKER_SESSIONS,
        row["session_id"],
        row["status"],
        event,
        also=assignments,
        args=tuple(changes.values()),
        where="namespace = ?",
        where_args=(row["namespace"],),
        cause=event.value,
    )


def _settle(t: T, row: sqlite3.Row | None) -> sqlite3.Row | None:
    """Apply the expiry event due now (if any) and return the row as it is after it."""
    view = _view(row)
    if row is None or view is None:
        return row
    due = model.due_event(view, from_us(t.now), holder_stale=holder_stale(t, row["namespace"], row["lease_owner"]))
    if due is None:
        return row
    event, failure_reason = due
    changes: dict[str, Any] = {"failure_reason": failure_reason}
    if event is SessionEvent.TTL_EXPIRE:
        changes.update(closed_at=t.now, close_reason="ttl_expired")
    _step(t, row, event, **changes)
    return _row(t, row["namespace"], row["session_id"])


def snapshot(t: T, row: sqlite3.Row) -> dict[str, Any]:
    """``workerSessionSnapshot``: what the worker routes and operator visibility show of one session."""
    owner = row["lease_owner"]
    holder: dict[str, Any] | None = None
    if owner is not None:
        worker = t.one("SELECT * FROM workers WHERE namespace = ? AND worker_id = ?", row["namespace"], owner)
        holder = {
            "worker_id": owner,
            "task_queue": worker["task_queue"] if worker is not None else None,
            "status": worker["status"] if worker is not None else None,
            "last_heartbeat_at": ts(worker["last_heartbeat_at"]) if worker is not None else None,
            "is_stale": holder_stale(t, row["namespace"], owner),
        }
    active = t.one(
        "SELECT COUNT(*) AS n FROM activity_sessions s JOIN activity_attempts a ON a.task_id = s.task_id"
        " WHERE s.namespace = ? AND s.session_id = ? AND a.status = 'running' AND a.lease_expires_at > ?",
        row["namespace"],
        row["session_id"],
        t.now,
    )
    return {
        "session_id": row["session_id"],
        "namespace": row["namespace"],
        "connection": row["connection"],
        "queue": row["queue"],
        "requirements": loads(row["requirements"]) or [],
        "status": row["status"],
        "lease_owner": owner,
        "holder": holder,
        "lease_expires_at": ts(row["lease_expires_at"]),
        "ttl_expires_at": ts(row["ttl_expires_at"]),
        "closed_at": ts(row["closed_at"]),
        "failure_reason": row["failure_reason"],
        "close_reason": row["close_reason"],
        "lease_seconds": int(row["lease_seconds"]),
        "ttl_seconds": int(row["ttl_seconds"]),
        "max_concurrent_activities": int(row["max_concurrent_activities"]),
        "create_if_missing": bool(row["create_if_missing"]),
        "allow_reacquire_after_failure": bool(row["allow_reacquire"]),
        "active_activity_count": int(active["n"]) if active is not None else 0,
        "generation": int(row["generation"]),
        "last_heartbeat_at": ts(row["last_heartbeat_at"]),
        "created_at": ts(row["created_at"]),
        "updated_at": ts(row["updated_at"]),
    }


# -- admission ---------------------------------------------------------------------------------------------


def _worker_facts(t: T, namespace: str, worker_id: str, session_id: str) -> model.WorkerFacts | None:
    worker = t.one(
        "SELECT * FROM workers WHERE namespace = ? AND worker_id = ? AND status = 'active'", namespace, worker_id
    )
    if worker is None:
        return None
    held = t.one(
        "SELECT COUNT(*) AS n FROM worker_sessions WHERE namespace = ? AND lease_owner = ? AND status = 'active'"
        " AND session_id != ?",
        namespace,
        worker_id,
        session_id,
    )
    limit = t.one(
        "SELECT max_sessions FROM worker_session_limits WHERE namespace = ? AND worker_id = ?", namespace, worker_id
    )
    return model.WorkerFacts(
        worker_id=worker_id,
        task_queue=worker["task_queue"],
        capabilities=frozenset(c for c in (loads(worker["capabilities"]) or []) if isinstance(c, str)),
        held_sessions=int(held["n"]) if held is not None else 0,
        max_sessions=int(limit["max_sessions"]) if limit is not None else None,
    )


def _decide(
    t: T, namespace: str, options: SessionOptions, worker_id: str, *, explicit: bool, queue: str | None
) -> tuple[Admission, sqlite3.Row | None]:
    row = _settle(t, _row(t, namespace, options.session_id))
    decision = model.admit(
        _view(row), options, _worker_facts(t, namespace, worker_id, options.session_id), explicit=explicit, queue=queue
    )
    return decision, row


def _apply(t: T, namespace: str, options: SessionOptions, worker_id: str, decision: Admission) -> sqlite3.Row:
    """Write an admitted decision: create, reacquire, or (reused) renew the owner's lease."""
    row = _row(t, namespace, options.session_id)
    now = from_us(t.now)
    if decision.event is SessionEvent.CREATE:
        ttl = t.now + options.ttl_seconds * US
        lease = to_us(model.renewed_lease(now, options.lease_seconds, from_us(ttl)))
        t.db.execute(
            "INSERT OR REPLACE INTO worker_sessions (namespace, session_id, queue, connection, requirements, status,"
            " lease_owner, lease_seconds, ttl_seconds, max_concurrent_activities, create_if_missing,"
            " allow_reacquire, lease_expires_at, ttl_expires_at, last_heartbeat_at, generation, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (
                namespace,
                options.session_id,
                options.queue,
                options.connection,
                dumps(list(options.requirements)),
                step(SESSION, SessionStatus.NONE, SessionEvent.CREATE).value,
                worker_id,
                options.lease_seconds,
                options.ttl_seconds,
                options.max_concurrent_activities,
                int(options.create_if_missing),
                int(options.allow_reacquire_after_failure),
                lease,
                ttl,
                t.now,
                t.now,
                t.now,
            ),
        )
        t.fx.transition("worker_session", options.session_id, None, "active", lease_owner=worker_id)
    else:
        assert row is not None
        lease = to_us(model.renewed_lease(now, int(row["lease_seconds"]), from_us(row["ttl_expires_at"])))
        if decision.event is SessionEvent.REACQUIRE:
            # "replacement_worker_must_reacquire_session": a new owner and a new lease; the TTL stays.
            _step(
                t,
                row,
                SessionEvent.REACQUIRE,
                lease_owner=worker_id,
                lease_expires_at=lease,
                last_heartbeat_at=t.now,
                failure_reason=None,
                generation=int(row["generation"]) + 1,
            )
        elif row["status"] == SessionStatus.ACTIVE.value and row["lease_owner"] == worker_id:
            _step(t, row, SessionEvent.RENEW, lease_expires_at=lease, last_heartbeat_at=t.now)
    out = _row(t, namespace, options.session_id)
    assert out is not None
    return out


def _refusal(decision: Admission, message: str, worker_id: str) -> Rejection:
    # The worker_id rides along: `worker_not_registered` bodies name it (§7.5), the others say who asked.
    fields = {"admitted": False, "worker_id": worker_id, **decision.fields}
    return Rejection(decision.status, decision.reason or "invalid_worker_session", message, fields)


# -- hooks for the activity code -------------------------------------------------------------------------


def on_schedule(t: T, namespace: str, execution_id: str, task_id: str, value: object) -> dict[str, Any] | None:
    """``schedule_activity`` carried ``worker_session`` (validated by the command model): link the execution
    to its session. Returns the options snapshot recorded on ActivityScheduled."""
    if value is None:
        return None
    options, errors = model.parse_options(value, "worker_session")
    assert options is not None, errors  # suite.protocol.commands validated the batch before it applied
    t.db.execute(
        "INSERT INTO activity_sessions (execution_id, task_id, namespace, session_id, options) VALUES (?, ?, ?, ?, ?)",
        (execution_id, task_id, namespace, options.session_id, dumps(options.to_json())),
    )
    return options.to_json()


def _link(t: T, task_id: str) -> tuple[sqlite3.Row, SessionOptions] | None:
    link = t.one("SELECT * FROM activity_sessions WHERE task_id = ?", task_id)
    if link is None:
        return None
    options, _ = model.parse_options(loads(link["options"]), "worker_session")
    assert options is not None
    return link, options


def session_queue(value: object) -> str | None:
    """The queue a ``worker_session`` routes its activity to when the command names none."""
    if isinstance(value, Mapping) and isinstance(value.get("queue"), str) and value["queue"]:
        return str(value["queue"])
    return None


def admit_claim(t: T, worker: sqlite3.Row, task_id: str, queue: str) -> Admission | None:
    """Before an activity task is leased: ``None`` when the task runs in no session; otherwise the admission
    decision. A refused task is skipped by this poll (it stays ready for a worker that may hold it)."""
    linked = _link(t, task_id)
    if linked is None:
        return None
    link, options = linked
    decision, row = _decide(t, link["namespace"], options, worker["worker_id"], explicit=False, queue=queue)
    if not decision.admitted:
        return decision
    # A2 limits.max_concurrent_activities: "session" — leased attempts inside the session.
    limit = int(row["max_concurrent_activities"]) if row is not None else options.max_concurrent_activities
    running = t.one(
        "SELECT COUNT(*) AS n FROM activity_sessions s JOIN activity_attempts a ON a.task_id = s.task_id"
        " WHERE s.namespace = ? AND s.session_id = ? AND a.status = 'running' AND a.lease_expires_at > ?"
        " AND s.task_id != ?",
        link["namespace"],
        options.session_id,
        t.now,
        task_id,
    )
    if running is not None and int(running["n"]) >= limit:
        return Admission(admitted=False, reason="session_activity_limit_exceeded", fields={"limit": limit})
    return decision


def commit_admission(t: T, worker: sqlite3.Row, task_id: str, decision: Admission) -> None:
    """After the claim won: create, reacquire or renew the session for the claiming worker (lazy creation)."""
    linked = _link(t, task_id)
    assert linked is not None
    link, options = linked
    _apply(t, link["namespace"], options, worker["worker_id"], decision)


def activity_snapshot(t: T, task_id: str) -> dict[str, Any] | None:
    """``workerSessionTaskAffinity``: the options the activity was scheduled with plus the session's status,
    owner and lease, for the leased task payload and the activity heartbeat/status answers."""
    linked = _link(t, task_id)
    if linked is None:
        return None
    link, options = linked
    row = _row(t, link["namespace"], options.session_id)
    out: dict[str, Any] = {**options.to_json(), "status": None, "lease_owner": None}
    out.update(lease_expires_at=None, ttl_expires_at=None)
    if row is not None:
        out.update(
            status=row["status"],
            lease_owner=row["lease_owner"],
            lease_expires_at=ts(row["lease_expires_at"]),
            ttl_expires_at=ts(row["ttl_expires_at"]),
        )
    return out


def renew_from_activity(t: T, task_id: str, lease_owner: str) -> None:
    """A recorded heartbeat of an in-session activity renews the session lease (A.2 renewal
    ``activity_heartbeat_renews_session``) — only an active session held by that same worker."""
    linked = _link(t, task_id)
    if linked is None:
        return
    link, options = linked
    row = _settle(t, _row(t, link["namespace"], options.session_id))
    if row is None or row["status"] != SessionStatus.ACTIVE.value or row["lease_owner"] != lease_owner:
        return
    lease = to_us(model.renewed_lease(from_us(t.now), int(row["lease_seconds"]), from_us(row["ttl_expires_at"])))
    _step(t, row, SessionEvent.RENEW, lease_expires_at=lease, last_heartbeat_at=t.now)


def note_registration(t: T, namespace: str, worker_id: str, max_sessions: int | None) -> None:
    """Keep the registration's ``max_concurrent_worker_sessions`` (None: no limit)."""
    if max_sessions is None:
        t.db.execute("DELETE FROM worker_session_limits WHERE namespace = ? AND worker_id = ?", (namespace, worker_id))
        return
    t.db.execute(
        "INSERT OR REPLACE INTO worker_session_limits (namespace, worker_id, max_sessions) VALUES (?, ?, ?)",
        (namespace, worker_id, max_sessions),
    )


# The writes that can make settle_due due sooner (tx.Watch): a session's TTL and its lease as they are set or renewed.
# A holder going stale (its heartbeats stopped, its registration ended) is no deadline a write sets: the pass at
# most scheduler_max_sleep_seconds later settles it, and every read of the session settles it first (_settle).
DUE_WATCHES = (
    Watch(
        "worker_sessions",
        ("status", "lease_expires_at", "ttl_expires_at"),
        "NEW.status IN ('active', 'expired', 'orphaned')",
        ("NEW.ttl_expires_at", "CASE WHEN NEW.status = 'active' THEN NEW.lease_expires_at END"),
    ),
)


def settle_due(t: T) -> float | None:
    """Scheduler step: persist every due expiry (lease, TTL, stale holder); seconds until the next one."""
    rows = t.all(
        "SELECT * FROM worker_sessions WHERE status IN ('active', 'expired', 'orphaned')"
        " AND (ttl_expires_at <= ? OR (status = 'active' AND lease_expires_at <= ?)) LIMIT 500",
        t.now,
        t.now,
    )
    for row in rows:
        _settle(t, row)
    # Holders that went stale: checked for every active session (bounded; sessions are few).
    for row in t.all("SELECT * FROM worker_sessions WHERE status = 'active' LIMIT 500"):
        if holder_stale(t, row["namespace"], row["lease_owner"]):
            _settle(t, row)
    nxt = t.one(
        "SELECT MIN(CASE WHEN status = 'active' AND lease_expires_at < ttl_expires_at THEN lease_expires_at"
        " ELSE ttl_expires_at END) AS at FROM worker_sessions WHERE status IN ('active', 'expired', 'orphaned')"
    )
    if nxt is None or nxt["at"] is None:
        return None
    return max(0.0, (int(nxt["at"]) - t.now) / US)


# -- operations (the routes of reference_server.routes.worker.sessions and .control.worker_sessions) --------


def _answer(t: T, decision: Admission, row: sqlite3.Row, status: int = 200) -> tuple[int, dict[str, Any]]:
    return status, {
        "admitted": True,
        "outcome": decision.outcome,
        "session": snapshot(t, row),
        "activity_task_id": None,
        "status": status,
        "reason": None,
    }


def create_session(t: T, namespace: str, worker_id: str, options: SessionOptions) -> tuple[int, dict[str, Any]]:
    """Explicit create: 201 created, 200 reused or reacquired, or the typed refusal (which changes nothing)."""
    decision, _ = _decide(t, namespace, options, worker_id, explicit=True, queue=None)
    if not decision.admitted:
        raise _refusal(decision, f"Worker session '{options.session_id}' was not admitted.", worker_id)
    row = _apply(t, namespace, options, worker_id, decision)
    return _answer(t, decision, row, 201 if decision.outcome == "created" else 200)


def renewal_decision(view: SessionView | None, worker_id: str) -> Admission:
    """Whether ``worker_id`` may renew the session ``view`` shows (only its holder, while it is active)."""
    return model.heartbeat_decision(view, worker_id)


def heartbeat_session(
    t: T, namespace: str, session_id: str, worker_id: str, lease_seconds: int | None
) -> tuple[int, dict[str, Any]]:
    """Explicit renewal by the owner of an active session."""
    row = _settle(t, _row(t, namespace, session_id))
    decision = renewal_decision(_view(row), worker_id)
    if not decision.admitted:
        raise _refusal(decision, f"Worker session '{session_id}' cannot be renewed by '{worker_id}'.", worker_id)
    assert row is not None
    seconds = lease_seconds if lease_seconds is not None else int(row["lease_seconds"])
    lease = to_us(model.renewed_lease(from_us(t.now), seconds, from_us(row["ttl_expires_at"])))
    _step(t, row, SessionEvent.RENEW, lease_expires_at=lease, last_heartbeat_at=t.now)
    out = _row(t, namespace, session_id)
    assert out is not None
    return _answer(t, decision, out)


def close_session(t: T, namespace: str, session_id: str, worker_id: str, reason: str) -> tuple[int, dict[str, Any]]:
    """Explicit close by the holder (or the last holder of an expired or orphaned session)."""
    row = _settle(t, _row(t, namespace, session_id))
    decision = model.close_decision(_view(row), worker_id)
    if not decision.admitted:
        raise _refusal(decision, f"Worker session '{session_id}' cannot be closed by '{worker_id}'.", worker_id)
    assert row is not None
    if decision.event is SessionEvent.CLOSE:
        _step(t, row, SessionEvent.CLOSE, closed_at=t.now, close_reason=reason, lease_expires_at=None)
    out = _row(t, namespace, session_id)
    assert out is not None
    return _answer(t, decision, out)


def list_sessions(t: T, namespace: str, status: str | None) -> dict[str, Any]:
    """Operator visibility (``workerSessionVisibility``): every session of the namespace, with metrics."""
    for row in t.all("SELECT * FROM worker_sessions WHERE namespace = ?", namespace):
        _settle(t, row)
    rows = t.all("SELECT * FROM worker_sessions WHERE namespace = ? ORDER BY created_at", namespace)
    metrics = {"total": len(rows), **dict.fromkeys(model.RUNTIME_CONTRACT["statuses"], 0)}
    for row in rows:
        metrics[row["status"]] += 1
    shown = [snapshot(t, r) for r in rows if status is None or r["status"] == status]
    return {"namespace": namespace, "metrics": metrics, "sessions": shown}


def describe_session(t: T, namespace: str, session_id: str) -> dict[str, Any]:
    row = _settle(t, _row(t, namespace, session_id))
    if row is None:
        raise Rejection(404, "session_not_found", f"Worker session '{session_id}' does not exist.")
    return {"namespace": namespace, "session": snapshot(t, row)}


def install(server_db: sqlite3.Connection, capabilities: dict[str, Any]) -> None:
    """Create the session tables and advertise the capability (§5.2 / A.1: "Add worker_session_verbs and
    worker_sessions (A.2) only if worker sessions are implemented")."""
    apply_schema(server_db, DDL)
    capabilities["worker_session_verbs"] = list(model.SESSION_VERBS)
    capabilities["worker_sessions"] = dict(model.RUNTIME_CONTRACT)
