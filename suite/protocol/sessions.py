"""Worker sessions: the option shape, the session lifecycle as a table, admission and expiry rules.

Sources, in the order they decide: worker protocol 1.20 names the two discovery keys
("``worker_session_verbs`` and ``worker_sessions``: worker-session lifecycle operations, activity command
fields, renewal, failure detection and terminal statuses; the runtime shape is defined by
``worker-sessions-runtime.schema.json``"); the protocol's endpoint map gives the three routes and its canonical
capability values the runtime contract (docs/reference.md: Worker sessions); the upstream engine's
``docs/architecture/worker-sessions.md`` and the runtime schema (``workerSessionOptions``,
``workerSessionOperationResult``, ``workerSessionSnapshot``) give the rules and the reason codes; the official SDK
2.12.0 (``durable_workflow.worker_session``) gives the request bodies.

Decisions where those sources leave a choice (each also a requirement sentence in
:mod:`suite.protocol.requirements`, ``SESSION-*``):

* **Statuses.** ``active``; ``expired`` (the lease was not renewed in time) and ``orphaned`` (the holder's
  registration went stale or was removed) are reacquirable; ``closed`` (explicit holder close, or the
  absolute TTL passed) is terminal — the contract's ``terminal_statuses`` is ``["closed"]`` and its
  ``terminal_conditions`` are explicit close, TTL expiry and ``allow_reacquire_after_failure: false``. A lost
  lease or holder of a session that forbids reacquisition therefore moves to ``failed``, which has no way
  out either: the schema's ``terminal_statuses`` enum admits only ``closed``, so ``failed`` is final by its
  condition, not by that list.
* **The TTL is absolute** ("absolute_session_ttl_is_terminal_for_that_session_id"): set when the session is
  created, never extended by renewal or reacquisition; a renewed lease never runs past it.
* **Who may close.** The lease owner; also the last owner of an ``expired`` or ``orphaned`` session (a planned
  shutdown "should close held sessions", and a lease may lapse just before it). Closing a ``closed`` or
  ``failed`` session again answers 200 ``already_closed`` and changes nothing.
* **Explicit create** always creates (``create_if_missing`` governs lazy creation by matching); on an
  existing session it follows the same admission as a claim: ``reused`` for the owner, ``reacquired`` where
  allowed, otherwise the typed refusal.

Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from suite.protocol.lifecycles import Lifecycle

__all__ = [
    "DEFAULTS",
    "RUNTIME_CONTRACT",
    "SESSION",
    "SESSION_VERBS",
    "TERMINAL_STATUSES",
    "Admission",
    "SessionEvent",
    "SessionOptions",
    "SessionStatus",
    "SessionView",
    "WorkerFacts",
    "admit",
    "close_decision",
    "due_event",
    "failure_event",
    "heartbeat_decision",
    "parse_options",
    "renewed_lease",
]

# docs/reference.md: Worker sessions, Discovery: `worker_session_verbs` `["create","heartbeat","close"]`.
SESSION_VERBS: Final = ("create", "heartbeat", "close")

# [SPEC] workerSessionOptions defaults (docs/reference.md: Worker sessions "Session option defaults"), also the SDK's.
DEFAULTS: Final[Mapping[str, Any]] = {
    "lease_seconds": 120,
    "ttl_seconds": 1800,
    "max_concurrent_activities": 1,
    "create_if_missing": True,
    "allow_reacquire_after_failure": True,
}
_MAX_TEXT = 255  # workerSessionOptions: session_id, queue, connection, requirements items: maxLength 255
_MAX_SECONDS = 10 * 365 * 86_400  # keeps now + seconds inside SQLite's integer range (no 500s)


class SessionStatus(StrEnum):
    """The five wire statuses (A.2 ``statuses``) plus ``none``: no session with that id exists yet."""

    NONE = "none"
    ACTIVE = "active"
    CLOSED = "closed"
    EXPIRED = "expired"
    FAILED = "failed"
    ORPHANED = "orphaned"


class SessionEvent(StrEnum):
    CREATE = "create"  # explicit create, or lazy creation at the first admitted in-session claim
    RENEW = "renew"  # explicit session heartbeat, or a heartbeat of an in-session activity of the owner
    CLOSE = "close"  # explicit holder close
    LEASE_EXPIRE = "lease_expire"  # "session_expires_when_lease_is_not_renewed"
    HOLDER_STALE = "holder_stale"  # "registered_worker_heartbeat_staleness"
    FAIL = "fail"  # lease or holder lost while allow_reacquire_after_failure is false
    TTL_EXPIRE = "ttl_expire"  # "absolute_session_ttl_is_terminal_for_that_session_id"
    REACQUIRE = "reacquire"  # a capable worker takes over an expired or orphaned session


_S, _E = SessionStatus, SessionEvent
SESSION_TRANSITIONS: dict[tuple[SessionStatus, SessionEvent], SessionStatus] = {
    (_S.NONE, _E.CREATE): _S.ACTIVE,
    (_S.ACTIVE, _E.RENEW): _S.ACTIVE,
    (_S.ACTIVE, _E.CLOSE): _S.CLOSED,
    (_S.ACTIVE, _E.LEASE_EXPIRE): _S.EXPIRED,
    (_S.ACTIVE, _E.HOLDER_STALE): _S.ORPHANED,
    (_S.ACTIVE, _E.FAIL): _S.FAILED,
    (_S.ACTIVE, _E.TTL_EXPIRE): _S.CLOSED,
    (_S.EXPIRED, _E.REACQUIRE): _S.ACTIVE,
    (_S.EXPIRED, _E.CLOSE): _S.CLOSED,
    (_S.EXPIRED, _E.TTL_EXPIRE): _S.CLOSED,
    (_S.ORPHANED, _E.REACQUIRE): _S.ACTIVE,
    (_S.ORPHANED, _E.CLOSE): _S.CLOSED,
    (_S.ORPHANED, _E.TTL_EXPIRE): _S.CLOSED,
}
SESSION: Final = Lifecycle(
    name="worker_session",
    states=SessionStatus,
    events=SessionEvent,
    table=SESSION_TRANSITIONS,
    initial=_S.NONE,
    terminal=frozenset({_S.CLOSED, _S.FAILED}),
)
TERMINAL_STATUSES: Final = frozenset({_S.CLOSED, _S.FAILED})
REACQUIRABLE: Final = frozenset({_S.EXPIRED, _S.ORPHANED})


@dataclass(frozen=True)
class SessionOptions:
    """The ``worker_session`` object of ``schedule_activity`` and the body of an explicit create."""

    session_id: str
    queue: str | None = None
    connection: str | None = None
    requirements: tuple[str, ...] = ()
    lease_seconds: int = 120
    ttl_seconds: int = 1800
    max_concurrent_activities: int = 1
    create_if_missing: bool = True
    allow_reacquire_after_failure: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "queue": self.queue,
            "connection": self.connection,
            "requirements": list(self.requirements),
            "lease_seconds": self.lease_seconds,
            "ttl_seconds": self.ttl_seconds,
            "max_concurrent_activities": self.max_concurrent_activities,
            "create_if_missing": self.create_if_missing,
            "allow_reacquire_after_failure": self.allow_reacquire_after_failure,
        }


def parse_options(value: object, path: str) -> tuple[SessionOptions | None, dict[str, list[str]]]:
    """Validate a ``worker_session`` object against ``workerSessionOptions``; ``(options, {})`` or
    ``(None, {field: [messages]})``. Null optional fields mean "absent", as everywhere in the model."""
    errors: dict[str, list[str]] = {}
    if not isinstance(value, Mapping):
        return None, {path: ["worker_session must be an object with a session_id."]}

    def text(name: str, *, required: bool = False) -> str | None:
        raw = value.get(name)
        if raw is None and not required:
            return None
        if not isinstance(raw, str) or not raw.strip() or len(raw) > _MAX_TEXT:
            errors[f"{path}.{name}"] = [f"{name} must be a non-empty string of at most {_MAX_TEXT} characters."]
            return None
        return raw.strip() if name == "session_id" else raw

    def positive(name: str) -> int:
        raw = value.get(name)
        if raw is None:
            return int(DEFAULTS[name])
        if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= _MAX_SECONDS:
            errors[f"{path}.{name}"] = [f"{name} must be an integer from 1 to {_MAX_SECONDS}."]
            return int(DEFAULTS[name])
        return raw

    def flag(name: str) -> bool:
        raw = value.get(name)
        if raw is None:
            return bool(DEFAULTS[name])
        if not isinstance(raw, bool):
            errors[f"{path}.{name}"] = [f"{name} must be a boolean."]
            return bool(DEFAULTS[name])
        return raw

    session_id = text("session_id", required=True)
    queue = text("queue")
    connection = text("connection")
    raw_requirements = value.get("requirements")
    requirements: tuple[str, ...] = ()
    if raw_requirements is not None:
        if not isinstance(raw_requirements, list) or not all(
            isinstance(r, str) and r.strip() and len(r) <= _MAX_TEXT for r in raw_requirements
        ):
            errors[f"{path}.requirements"] = ["requirements must be a list of non-empty strings."]
        else:
            # The SDK deduplicates too; order is kept so a snapshot echoes what was asked.
            requirements = tuple(dict.fromkeys(r.strip() for r in raw_requirements))
    options = SessionOptions(
        session_id=session_id or "",
        queue=queue,
        connection=connection,
        requirements=requirements,
        lease_seconds=positive("lease_seconds"),
        ttl_seconds=positive("ttl_seconds"),
        max_concurrent_activities=positive("max_concurrent_activities"),
        create_if_missing=flag("create_if_missing"),
        allow_reacquire_after_failure=flag("allow_reacquire_after_failure"),
    )
    return (None, errors) if errors else (options, {})


@dataclass(frozen=True)
class SessionView:
    """What the rules need of one stored session."""

    status: SessionStatus
    lease_owner: str | None
    lease_expires_at: datetime | None
    ttl_expires_at: datetime | None
    allow_reacquire_after_failure: bool = True
    requirements: tuple[str, ...] = ()
    queue: str | None = None


@dataclass(frozen=True)
class WorkerFacts:
    """What admission needs of the asking worker's registration (None: not registered)."""

    worker_id: str
    task_queue: str
    capabilities: frozenset[str]
    held_sessions: int  # active sessions this worker owns now, other than the one asked for
    max_sessions: int | None  # max_concurrent_worker_sessions of the registration; None: no limit


@dataclass(frozen=True)
class Admission:
    """The decision for one admission attempt (explicit create or an in-session claim).

    ``event`` is the lifecycle event to apply when admitted (None: ``reused``, nothing changes state);
    a refusal carries its wire ``reason``, HTTP ``status`` and extra body fields.
    """

    admitted: bool
    outcome: str | None = None  # created | reused | reacquired
    event: SessionEvent | None = None
    reason: str | None = None
    status: int = 200
    fields: dict[str, Any] = field(default_factory=dict)


def _refuse(reason: str, status: int = 409, **fields: Any) -> Admission:
    return Admission(admitted=False, reason=reason, status=status, fields=dict(fields))


def admit(
    session: SessionView | None,
    options: SessionOptions,
    worker: WorkerFacts | None,
    *,
    explicit: bool,
    queue: str | None = None,
    check_requirements: bool = True,
) -> Admission:
    """Whether ``worker`` may hold the session now (upstream "Lease And Ownership", "Admission And
    Routing"). ``session`` is the stored session after :func:`due_event` was applied; ``queue`` the task
    queue the work was routed to (a claim: the task's queue; a create: the options' queue)."""
    if worker is None:
        # A2 admission.requires_registered_worker.
        return _refuse("worker_not_registered", 412)
    wanted_queue = options.queue if options.queue is not None else queue
    if explicit and wanted_queue is not None and wanted_queue != worker.task_queue:
        # A2 admission.queue_routing_first: the session lives on the queue its activities are routed to.
        return _refuse(
            "session_queue_mismatch",
            registered_task_queue=worker.task_queue,
            requested_task_queue=wanted_queue,
        )
    required = session.requirements if session is not None and session.status is not _S.NONE else options.requirements
    missing = [r for r in required if r not in worker.capabilities]
    if missing and check_requirements:
        # "worker registration `capabilities` must cover every session requirement".
        return _refuse("session_requirements_not_met", missing_requirements=missing)
    status = session.status if session is not None else _S.NONE
    if status is _S.ACTIVE and session is not None:
        if session.lease_owner == worker.worker_id:
            return Admission(admitted=True, outcome="reused")
        # A2 ownership: "single_worker_lease_owner".
        return _refuse("session_owned_by_another_worker", lease_owner=session.lease_owner)
    if status in TERMINAL_STATUSES:
        if status is _S.FAILED:
            return _refuse("session_reacquire_disallowed", session_status=status.value)
        return _refuse("session_closed", session_status=status.value)
    if status in REACQUIRABLE:
        assert session is not None
        if not session.allow_reacquire_after_failure:
            return _refuse("session_reacquire_disallowed", session_status=status.value)
        event = SessionEvent.REACQUIRE
        outcome = "reacquired"
    else:
        if not explicit and not options.create_if_missing:
            return _refuse("session_missing")
        event = SessionEvent.CREATE
        outcome = "created"
    if worker.max_sessions is not None and worker.held_sessions >= worker.max_sessions:
        # A2 limits.max_concurrent_worker_sessions: "worker_registration".
        return _refuse("worker_session_limit_exceeded", max_concurrent_worker_sessions=worker.max_sessions)
    return Admission(admitted=True, outcome=outcome, event=event)


def failure_event(kind: SessionEvent, allow_reacquire: bool) -> SessionEvent:
    """A lost lease (``LEASE_EXPIRE``) or holder (``HOLDER_STALE``) of a session that forbids reacquisition
    is final: ``FAIL`` (terminal condition ``allow_reacquire_after_failure_false``)."""
    return kind if allow_reacquire else SessionEvent.FAIL


def due_event(view: SessionView, now: datetime, *, holder_stale: bool) -> tuple[SessionEvent, str] | None:
    """The expiry event due at ``now`` and its ``failure_reason`` (``workerSessionFailureReason``), if any.
    TTL first: it is terminal and wins over a lapsed lease; a lapsed lease wins over a stale holder."""
    if view.status not in (_S.ACTIVE, *REACQUIRABLE):
        return None
    if view.ttl_expires_at is not None and now >= view.ttl_expires_at:
        return SessionEvent.TTL_EXPIRE, "ttl_expired"
    if view.status is not _S.ACTIVE:
        return None
    if view.lease_expires_at is not None and now >= view.lease_expires_at:
        return failure_event(SessionEvent.LEASE_EXPIRE, view.allow_reacquire_after_failure), "lease_expired"
    if holder_stale:
        return failure_event(SessionEvent.HOLDER_STALE, view.allow_reacquire_after_failure), "worker_heartbeat_stale"
    return None


def renewed_lease(now: datetime, lease_seconds: int, ttl_expires_at: datetime | None) -> datetime:
    """A renewed session lease: ``now + lease_seconds``, never past the absolute TTL."""
    until = now + timedelta(seconds=lease_seconds)
    return min(until, ttl_expires_at) if ttl_expires_at is not None else until


def heartbeat_decision(view: SessionView | None, worker_id: str) -> Admission:
    """An explicit session heartbeat: only the owner of an ``active`` session renews it."""
    if view is None or view.status is _S.NONE:
        return _refuse("session_not_found", 404)
    if view.status is not _S.ACTIVE:
        return _refuse("session_not_active", session_status=view.status.value)
    if view.lease_owner != worker_id:
        return _refuse("session_owner_mismatch", lease_owner=view.lease_owner)
    return Admission(admitted=True, outcome="heartbeat_recorded", event=SessionEvent.RENEW)


def close_decision(view: SessionView | None, worker_id: str) -> Admission:
    """An explicit close by the holder (or the last holder of an expired or orphaned session)."""
    if view is None or view.status is _S.NONE:
        return _refuse("session_not_found", 404)
    if view.status in TERMINAL_STATUSES:
        return Admission(admitted=True, outcome="already_closed")
    if view.lease_owner != worker_id:
        return _refuse("session_owner_mismatch", lease_owner=view.lease_owner)
    return Admission(admitted=True, outcome="closed", event=SessionEvent.CLOSE)


# docs/reference.md: Worker sessions, the value of `worker_sessions` (it validates against
# worker-sessions-runtime.schema.json#/$defs/workerSessionRuntimeContract).
RUNTIME_CONTRACT: Final[Mapping[str, Any]] = {
    "feature": "worker_sessions",
    "contract_version": "1.0",
    "minimum_protocol_version": "1.8",
    "command_field": "worker_session",
    "activity_options_field": "worker_session",
    "verbs": list(SESSION_VERBS),
    "lifecycle": {
        "creation": "lazy_create_on_first_admitted_activity_or_explicit_worker_create",
        "renewal": "activity_heartbeat_or_explicit_session_heartbeat",
        "close": "explicit_holder_close",
        "lease_expiry": "session_expires_when_lease_is_not_renewed",
        "ttl_expiry": "absolute_session_ttl_is_terminal_for_that_session_id",
    },
    "ownership": "single_worker_lease_owner",
    "lease": {
        "scope": "namespace_session_id",
        "owner": "registered_worker_id",
        "activity_attempt_leases_remain_independent": True,
    },
    "admission": {
        "queue_routing_first": True,
        "requires_registered_worker": True,
        "requires_capabilities": True,
        "create_if_missing_default": True,
        "allow_reacquire_after_failure_default": True,
    },
    "limits": {"max_concurrent_worker_sessions": "worker_registration", "max_concurrent_activities": "session"},
    "default_max_concurrent_activities": 1,
    "renewal": {"activity_heartbeat_renews_session": True, "explicit_session_heartbeat": True},
    "failure_detection": ["lease_expiry", "registered_worker_heartbeat_staleness"],
    "holder_loss": {
        "in_flight_activities_keep_at_least_once_attempt_semantics": True,
        "replacement_worker_must_reacquire_session": True,
        "process_local_state_must_be_rebuilt_after_reacquire": True,
    },
    "cancellation": {
        "workflow_cancellation_observed_through_activity_heartbeat": True,
        "session_lease_does_not_override_activity_cancel_requested": True,
        "planned_shutdown_should_close_sessions": True,
    },
    "routing": ["queue", "connection", "requirements"],
    "visibility": ["active", "closed", "expired", "failed", "orphaned"],
    "statuses": ["active", "closed", "expired", "failed", "orphaned"],
    "terminal_statuses": ["closed"],
    "terminal_conditions": ["explicit_close", "ttl_expired", "allow_reacquire_after_failure_false"],
    "authoring_guidance": [
        "use_for_process_local_state_gpu_memory_or_filesystem_affinity",
        "prefer_ordinary_queued_activities_for_independent_steps",
        "prefer_one_larger_activity_for_atomic_side_effects",
    ],
}
