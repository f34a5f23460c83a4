"""Lease and attempt fencing: the rejection matrices of docs/reference.md: Fencing.

Each guard is an ordered list of checks over a frozen *view* — a snapshot of the rows the server read inside
its transaction (or the state the suite tracked). The first failing check raises
:class:`~suite.protocol.errors.Rejection` with the HTTP status, ``reason`` and every extra body field the spec
lists; a guard that returns means the request may proceed. Time is always the ``now`` argument.

Guards:

- :func:`guard_workflow_task` — workflow-task history, heartbeat, complete and fail (§8.9 rows 1–6).
- :func:`guard_activity_attempt` — activity complete, fail and heartbeat ownership (§11.2).
- :func:`guard_activity_report` — what a complete or fail that passed ownership may record (§11.3, §11.5).
- :func:`activity_heartbeat_outcome` — the HTTP 200 heartbeat decision (§11.5), never a rejection.
- :func:`guard_query_task` — query-task complete and fail (§10.6).

:func:`outcome` says what a guard answers a call: ``"ok"`` or the reason of its rejection.

Timestamps: the spec says "Timestamps are RFC 3339 UTC strings" and "the suite must parse any RFC 3339 string"
(§0), so :func:`rfc3339` writes the upstream lease form and :func:`parse_rfc3339` reads every RFC 3339 form.
All datetimes here must be timezone-aware.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, ParamSpec

from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import (
    AttemptEvent,
    AttemptStatus,
    ExecutionStatus,
    QueryTaskStatus,
    RunStatus,
    TaskStatus,
)

__all__ = [
    "ActivityAttemptView",
    "ActivityVerb",
    "HeartbeatDecision",
    "QueryTaskView",
    "WorkflowTaskView",
    "activity_heartbeat_outcome",
    "guard_activity_attempt",
    "guard_activity_report",
    "guard_query_task",
    "guard_workflow_task",
    "outcome",
    "parse_rfc3339",
    "rfc3339",
    "stop_reason",
]

P = ParamSpec("P")


# ---------------------------------------------------------------------------------------------------------
# RFC 3339
# ---------------------------------------------------------------------------------------------------------


def rfc3339(dt: datetime) -> str:
    """``dt`` in UTC with microseconds and ``Z``: upstream's lease form, e.g. ``2026-04-18T12:00:00.000000Z``.

    Raises ``ValueError`` for a naive datetime: the model never guesses a time zone.
    """
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"rfc3339() needs a timezone-aware datetime, got naive {dt!r}; pass tzinfo=UTC")
    u = dt.astimezone(UTC)
    # Formatted by hand: strftime("%Y") does not zero-pad years below 1000 on every platform.
    date = f"{u.year:04d}-{u.month:02d}-{u.day:02d}"
    return f"{date}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond:06d}Z"


# RFC 3339 §5.6 date-time: full-date "T" full-time, with time-secfrac of any length and "Z" or ±hh:mm.
# §5.6 NOTE allows a lowercase "t"/"z" and a space as the separator ("for the sake of readability").
_RFC3339 = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[Tt ]"
    r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d+))?"
    r"(?P<tz>[Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


def parse_rfc3339(value: object) -> datetime:
    """Parse any RFC 3339 date-time into an aware UTC ``datetime``; ``ValueError`` if it is not one.

    Accepts ``Z``/``z`` or a numeric offset (``-00:00`` is UTC), ``T``/``t``/space, fractions of any length
    (truncated to microseconds) and a leap second ``:60`` (read as ``:59.999999``, the nearest representable
    instant).
    """
    if not isinstance(value, str):
        raise ValueError(f"an RFC 3339 timestamp must be a string, got {type(value).__name__}")
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} is not an RFC 3339 date-time (expected e.g. 2026-04-18T12:00:00Z)")
    frac = (m["frac"] or "")[:6].ljust(6, "0")
    second, micro = int(m["s"]), int(frac)
    if second == 60:
        second, micro = 59, 999_999
    tz = m["tz"]
    if tz in ("Z", "z"):
        offset = timedelta(0)
    else:
        hours, minutes = int(tz[1:3]), int(tz[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(f"{value!r} has an out-of-range UTC offset {tz}")
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if tz[0] == "-" else 1)
    try:
        local = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), second, micro)
        return (local - offset).replace(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{value!r} is not a valid, representable date-time: {exc}") from None


def _ts(dt: datetime | None) -> str | None:
    return None if dt is None else rfc3339(dt)


def _lease_over(expires: datetime | None, now: datetime) -> bool:
    """§8.9 row 4's boundary, the one every lease of the model keeps: a lease is over from its expiry on
    (``lease_expires_at ≤ now``), and a leased row with no expiry recorded is inconsistent data, treated as over
    (fail closed)."""
    return expires is None or expires <= now


def _lease_expired(task: str, expires: datetime | None, drop: str, fields: dict[str, Any]) -> Rejection:
    """The 409 ``lease_expired`` of a lease that is over (§8.9 row 4, §10.6): ``task`` names it in the message
    (its kind and id), ``drop`` what its holder drops; the body is ``fields`` and the expiry."""
    return Rejection(
        409,
        "lease_expired",
        f"The lease on {task} expired at {_ts(expires)}; drop this {drop} and poll again.",
        {**fields, "lease_expires_at": _ts(expires)},
    )


# ---------------------------------------------------------------------------------------------------------
# Workflow tasks: §8.9
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowTaskView:
    """What the §8.9 guard needs to know about one workflow task and its run."""

    task_id: str
    status: TaskStatus
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    run_status: RunStatus
    run_closed_reason: str | None
    run_closed_at: datetime | None


_STOP_REASONS: dict[RunStatus, str] = {
    RunStatus.CANCELLED: "run_cancelled",
    RunStatus.TERMINATED: "run_terminated",
    RunStatus.COMPLETED: "run_completed",
    RunStatus.FAILED: "run_failed",
}


def stop_reason(run_status: RunStatus) -> str:
    """§8.9 row 2 ``stop_reason``: ``run_cancelled|run_terminated|run_completed|run_failed|run_closed``.

    Decision: chosen by run status alone, so a continued-as-new run (status ``completed``) says
    ``run_completed``; ``run_closed`` is the fallback for a status outside the terminal four.
    """
    return _STOP_REASONS.get(run_status, "run_closed")


def _workflow_run_closed(view: WorkflowTaskView) -> Rejection:
    """Row 2's rejection (the fields a holder needs to stop: why, since when, and the task as it is)."""
    return Rejection(
        409,
        "run_closed",
        # "error:"Workflow run is already closed."" — Rejection.body() copies the message into `error`.
        "Workflow run is already closed.",
        {
            "task_id": view.task_id,
            "can_continue": False,
            # "`cancel_requested` (true iff run_status ∈ {cancelled, terminated})".
            "cancel_requested": view.run_status in (RunStatus.CANCELLED, RunStatus.TERMINATED),
            "stop_reason": stop_reason(view.run_status),
            "run_status": view.run_status.value,
            "run_closed_reason": view.run_closed_reason,
            "run_closed_at": _ts(view.run_closed_at),
            "task_status": view.status.value,
            "lease_owner": view.lease_owner,
            "lease_expires_at": _ts(view.lease_expires_at),
            # "**no `outcome` key**".
        },
    )


def guard_workflow_task(
    view: WorkflowTaskView | None,
    *,
    task_id: str,
    lease_owner: str,
    attempt: int,
    now: datetime,
) -> None:
    """Fence a workflow-task history, heartbeat, complete or fail call (§8.9 rows 1–6, in that order).

    ``view`` is ``None`` when the task id is unknown in the request's namespace. Returns ``None`` when the
    caller holds the live lease for this attempt; otherwise raises the first matching ``Rejection``.
    """
    # Row 1. "Task id unknown in this namespace | 404 | `task_not_found` | `task_id`,
    # `workflow_task_attempt`".
    if view is None:
        raise Rejection(
            404,
            "task_not_found",
            f"Workflow task {task_id!r} does not exist in this namespace; poll for a new task.",
            {"task_id": task_id, "workflow_task_attempt": attempt},
        )

    # Row 2. "Task not leased **and** the run is terminal … 409 | **`run_closed`**", and the notes: "Cancel or
    # terminate during a lease: the history, heartbeat, complete and fail calls all return row 2 … The
    # run-closed check comes before the owner and attempt checks, so every caller sees `run_closed`." Hence: a
    # terminal run answers run_closed whatever the task status, before the expiry, owner and attempt rows.
    if view.run_status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
        raise _workflow_run_closed(view)

    # Row 3. "Task not leased (ready, completed or failed) and the run is live | 409 | `task_not_leased`".
    # §8.8: "A later complete, fail or heartbeat of that attempt gets 409 `task_not_leased`."
    if view.status is not TaskStatus.LEASED:
        raise Rejection(
            409,
            "task_not_leased",
            f"Workflow task {view.task_id!r} is {view.status.value}, not leased; poll for a new task.",
            {"task_id": view.task_id, "task_status": view.status.value},
        )

    # Row 4. "Lease expired (`lease_expires_at ≤ now`), whoever is asking | 409 | `lease_expired` |
    # `task_status:"leased"`, `lease_owner`, `lease_expires_at`." Notes: "An expired lease that **nobody has
    # reclaimed** is still rejected (row 4). A worker with an expired lease can never commit." Decision: a
    # leased task with no expiry recorded is inconsistent data and is treated as expired (fail closed).
    if _lease_over(view.lease_expires_at, now):
        raise _lease_expired(
            f"workflow task {view.task_id!r}",
            view.lease_expires_at,
            "task",
            {"task_id": view.task_id, "task_status": TaskStatus.LEASED.value, "lease_owner": view.lease_owner},
        )

    # Row 5. "`lease_owner` ≠ the current owner | 409 | `lease_owner_mismatch` | `lease_owner` = **the current
    # owner**". Notes: "In UPS the owner check runs first" (before the attempt check).
    if lease_owner != view.lease_owner:
        raise Rejection(
            409,
            "lease_owner_mismatch",
            f"Workflow task {view.task_id!r} is leased by {view.lease_owner!r}, not {lease_owner!r}; "
            "only the lease owner may act on it.",
            {"task_id": view.task_id, "lease_owner": view.lease_owner},
        )

    # Row 6. "`workflow_task_attempt` ≠ the current attempt | 409 | `workflow_task_attempt_mismatch` |
    # `current_attempt`".
    if attempt != view.attempt:
        raise Rejection(
            409,
            "workflow_task_attempt_mismatch",
            f"Workflow task {view.task_id!r} is at attempt {view.attempt}, not {attempt}; "
            "this lease is stale, poll again.",
            {"task_id": view.task_id, "current_attempt": view.attempt},
        )


def outcome(guard: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> str:
    """What ``guard(*args, **kwargs)`` answers: ``"ok"`` when it lets the call proceed, else the ``reason`` of
    the :class:`Rejection` it raises."""
    try:
        guard(*args, **kwargs)
    except Rejection as rej:
        return rej.reason
    return "ok"


# ---------------------------------------------------------------------------------------------------------
# Activity attempts: §11.2–§11.5
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivityAttemptView:
    """One activity attempt with its task, execution and run, as the §11 guards need them.

    ``task_current_attempt_id`` is the attempt that holds the task's lease now (``None`` while the task is not
    leased); ``execution_current_task_id`` is the execution's newest task (a retry makes a new one).
    """

    attempt_id: str
    task_id: str
    attempt_number: int
    attempt_status: AttemptStatus
    lease_owner: str
    lease_expires_at: datetime | None
    task_status: TaskStatus
    task_current_attempt_id: str | None
    execution_status: ExecutionStatus
    execution_current_task_id: str | None
    run_status: RunStatus
    run_closed_reason: str | None
    run_closed_at: datetime | None


ActivityVerb = Literal["complete", "fail"]
"""The two activity reports that can record an outcome."""


def guard_activity_attempt(
    view: ActivityAttemptView | None,
    *,
    task_exists: bool,
    task_id: str,
    activity_attempt_id: str,
    lease_owner: str,
) -> ActivityAttemptView:
    """The §11.2 ownership guard, "run before complete, fail and heartbeat"; returns the (non-None) view.

    ``task_exists`` says whether ``task_id`` is a task of this namespace; ``view`` is the attempt named by
    ``activity_attempt_id`` in this namespace, or ``None``.
    """
    # "`task_id` unknown in this namespace | 404 | `task_not_found`".
    if not task_exists:
        raise Rejection(
            404,
            "task_not_found",
            f"Activity task {task_id!r} does not exist in this namespace; poll for a new task.",
            {"task_id": task_id, "activity_attempt_id": activity_attempt_id},
        )
    # "`activity_attempt_id` unknown | 404 | `attempt_not_found`".
    if view is None:
        raise Rejection(
            404,
            "attempt_not_found",
            f"Activity attempt {activity_attempt_id!r} does not exist; send the activity_attempt_id "
            "from the poll response.",
            {"task_id": task_id, "activity_attempt_id": activity_attempt_id},
        )
    # "The attempt belongs to a different task | 409 | `task_mismatch`".
    if view.task_id != task_id:
        raise Rejection(
            409,
            "task_mismatch",
            f"Activity attempt {activity_attempt_id!r} belongs to task {view.task_id!r}, not {task_id!r}; "
            "use the task_id and activity_attempt_id from the same poll response.",
            {"task_id": task_id, "activity_attempt_id": activity_attempt_id, "attempt_task_id": view.task_id},
        )
    # "`lease_owner` ≠ the attempt's owner | 409 | `lease_owner_mismatch` (`lease_owner` = the actual owner)".
    if lease_owner != view.lease_owner:
        raise Rejection(
            409,
            "lease_owner_mismatch",
            f"Activity attempt {activity_attempt_id!r} is owned by {view.lease_owner!r}, "
            f"not {lease_owner!r}; "
            "only the lease owner may report on it.",
            {"task_id": task_id, "activity_attempt_id": activity_attempt_id, "lease_owner": view.lease_owner},
        )
    return view


_RUN_STOP: dict[RunStatus, str] = {
    RunStatus.CANCELLED: "run_cancelled",
    RunStatus.TERMINATED: "run_terminated",
}


def _attempt_is_live(view: ActivityAttemptView, now: datetime) -> bool:
    # §9: "A lease expiry closes the attempt (status `expired`)". Decision: the model judges expiry by the
    # clock (`lease_expires_at ≤ now`, as §8.9 row 4 does for workflow tasks) so that the verdict never
    # depends on whether the server's lazy sweep has run yet.
    return (
        view.attempt_status is AttemptStatus.RUNNING
        and view.task_status is TaskStatus.LEASED
        and view.task_current_attempt_id == view.attempt_id
        and not _lease_over(view.lease_expires_at, now)
    )


def guard_activity_report(view: ActivityAttemptView, *, verb: ActivityVerb, now: datetime) -> None:
    """After :func:`guard_activity_attempt`: may this complete or fail be recorded? Raises a 409 if not.

    1. The run is closed → 409 ``outcome:"ignored"`` (§11.5 "Complete or fail after a run cancel or
       terminate").
       The server closes a still-running attempt, its task and execution as ``cancelled`` in the same
       transaction, which is what the body reports.
    2. The attempt is no longer live (closed, superseded, or its lease expired) → 409 ``stale_attempt`` with
       ``recorded:false`` (§11.3 "A duplicate or late complete …"; §11.7 "The expired attempt's late complete
       gets 409 `stale_attempt`").
    """
    if view.run_status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
        # §11.5: "**409**, `outcome:"ignored"`, `recorded:false`, `reason:"run_cancelled"|"run_terminated"`,
        # `error:"Activity outcome ignored because the workflow run is already closed."`,
        # `cancel_requested:true`, `can_continue:false`, `run_status`, `run_closed_reason`, `run_closed_at`,
        # `activity_status:"cancelled"`, `attempt_status:"cancelled"`, `task_status:"cancelled"`,
        # `lease_owner`, `lease_expires_at:null`." Decision: a run that completed or failed with the activity
        # in flight is answered the same way with reason "run_closed" and cancel_requested false, matching the
        # §11.5 heartbeat row for such runs.
        cancelled = view.run_status in _RUN_STOP
        raise Rejection(
            409,
            _RUN_STOP.get(view.run_status, "run_closed"),
            "Activity outcome ignored because the workflow run is already closed.",
            {
                "task_id": view.task_id,
                "activity_attempt_id": view.attempt_id,
                "outcome": "ignored",
                "recorded": False,
                "cancel_requested": cancelled,
                "can_continue": False,
                "run_status": view.run_status.value,
                "run_closed_reason": view.run_closed_reason,
                "run_closed_at": _ts(view.run_closed_at),
                "activity_status": ExecutionStatus.CANCELLED.value,
                "attempt_status": AttemptStatus.CANCELLED.value,
                "task_status": TaskStatus.CANCELLED.value,
                "lease_owner": view.lease_owner,
                "lease_expires_at": None,
            },
        )
    if not _attempt_is_live(view, now):
        # §11.3: "A duplicate or late complete gets **409** with `outcome:"completed"`, **`recorded:false`**
        # and **`reason:"stale_attempt"`**. … Workers MUST NOT treat it as a failure." Decision: `outcome`
        # names the verb that was refused ("completed" for complete, "failed" for fail).
        raise Rejection(
            409,
            "stale_attempt",
            f"Activity attempt {view.attempt_id!r} is no longer live ({view.attempt_status.value}); "
            "its outcome was not recorded. This is normal after a redelivery: drop the result.",
            {
                "task_id": view.task_id,
                "activity_attempt_id": view.attempt_id,
                "outcome": "completed" if verb == "complete" else "failed",
                "recorded": False,
                "attempt_status": view.attempt_status.value,
            },
        )


@dataclass(frozen=True)
class HeartbeatDecision:
    """The §11.5 heartbeat answer (always HTTP 200 once ownership passed).

    ``closes_attempt`` is the event the server applies to a still-running attempt in the same transaction
    (``CANCEL``: "The heartbeat also closes the attempt as cancelled and records `ActivityCancelled`";
    ``EXPIRE``: the lease ran out), or ``None``.
    """

    can_continue: bool
    cancel_requested: bool
    reason: str | None
    heartbeat_recorded: bool
    run_closed_reason: str | None
    run_closed_at: str | None
    closes_attempt: AttemptEvent | None = None

    def fields(self) -> dict[str, Any]:
        """The body keys this decision fixes (the server adds ids, lease and timestamp fields)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "closes_attempt"}


def activity_heartbeat_outcome(view: ActivityAttemptView, *, now: datetime) -> HeartbeatDecision:
    """Decide a heartbeat that passed :func:`guard_activity_attempt` (§11.5).

    "When the attempt cannot continue, the response is still **HTTP 200** … with `can_continue:false`,
    `heartbeat_recorded:false` and a `reason`". Checks, first match wins: run cancelled/terminated, run
    closed, activity cancelled, task cancelled, stale task (a retry superseded it), activity not running,
    task not leased, stale attempt (superseded, or its lease expired), attempt closed. Otherwise it is live:
    ``can_continue:true``, ``heartbeat_recorded:true`` and the server extends the lease to now + 300 s.
    """
    running = view.attempt_status is AttemptStatus.RUNNING

    def decide(reason: str | None, cancel: bool, closes: AttemptEvent | None = None) -> HeartbeatDecision:
        # No reason: the attempt is live, goes on, and the heartbeat is recorded; a reason stops it.
        return HeartbeatDecision(
            can_continue=reason is None,
            cancel_requested=cancel,
            reason=reason,
            heartbeat_recorded=reason is None,
            run_closed_reason=view.run_closed_reason,
            run_closed_at=_ts(view.run_closed_at),
            closes_attempt=closes if running else None,
        )

    # §11.5 table: "`run_cancelled` | true", "`run_terminated` | true". "Cancel or terminate of the run: the
    # heartbeat gets `cancel_requested:true`, `can_continue:false`, `reason:"run_cancelled"|"run_terminated"`,
    # `run_closed_reason:"cancelled"|"terminated"` and a non-null `run_closed_at`".
    if view.run_status in _RUN_STOP:
        return decide(_RUN_STOP[view.run_status], True, AttemptEvent.CANCEL)
    # "`run_closed` (completed or failed run) | false".
    if view.run_status in (RunStatus.COMPLETED, RunStatus.FAILED):
        return decide("run_closed", False, AttemptEvent.CANCEL)
    # "`activity_cancelled` | true", "`task_cancelled` | true".
    if view.execution_status is ExecutionStatus.CANCELLED:
        return decide("activity_cancelled", True, AttemptEvent.CANCEL)
    if view.task_status is TaskStatus.CANCELLED:
        return decide("task_cancelled", True, AttemptEvent.CANCEL)
    # "`stale_task` | false": a retry gave the execution a newer task than this one.
    if view.execution_current_task_id is not None and view.execution_current_task_id != view.task_id:
        return decide("stale_task", False)
    # "`activity_not_running` | false".
    if view.execution_status is not ExecutionStatus.RUNNING:
        return decide("activity_not_running", False)
    # "`task_not_leased` | false".
    if view.task_status is not TaskStatus.LEASED:
        return decide("task_not_leased", False)
    # "`stale_attempt` | false": the task was redelivered to a newer attempt, or this attempt's lease ran out.
    if view.task_current_attempt_id != view.attempt_id:
        return decide("stale_attempt", False)
    # "`attempt_closed` | false, or true if the attempt itself was cancelled".
    if not running:
        return decide("attempt_closed", view.attempt_status is AttemptStatus.CANCELLED)
    if _lease_over(view.lease_expires_at, now):
        return decide("stale_attempt", False, AttemptEvent.EXPIRE)
    # "Live attempt: `can_continue:true`, `cancel_requested:false`, `heartbeat_recorded:true`."
    return decide(None, False)


# ---------------------------------------------------------------------------------------------------------
# Query tasks: §10.6
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryTaskView:
    """What the §10.6 guard needs to know about one query task."""

    query_task_id: str
    status: QueryTaskStatus
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime | None


def guard_query_task(
    view: QueryTaskView | None,
    *,
    query_task_id: str,
    lease_owner: str,
    attempt: int,
    now: datetime,
) -> None:
    """Fence a query-task complete or fail (§10.6 "UPS `guardLease` order").

    Every rejection carries ``outcome:"rejected"``.

    ``view`` is ``None`` when the id is unknown in the request's namespace.
    """
    # "Unknown id or another namespace | 404 | `query_task_not_found`".
    if view is None:
        raise Rejection(
            404,
            "query_task_not_found",
            f"Query task {query_task_id!r} does not exist in this namespace; poll for a new query task.",
            {"query_task_id": query_task_id, "query_task_attempt": attempt, "outcome": "rejected"},
        )
    # "Not leased (completed, failed, timed out or pending) | 409 | `query_task_not_leased`". "A second
    # complete or fail after a terminal one gets 409 `query_task_not_leased`."
    if view.status is not QueryTaskStatus.LEASED:
        raise Rejection(
            409,
            "query_task_not_leased",
            f"Query task {view.query_task_id!r} is {view.status.value}, not leased; its caller is no longer "
            "waiting for this result.",
            {
                "query_task_id": view.query_task_id,
                "query_task_status": view.status.value,
                "outcome": "rejected",
            },
        )
    # "Owner mismatch | 409 | `lease_owner_mismatch` (with `lease_owner`)".
    if lease_owner != view.lease_owner:
        raise Rejection(
            409,
            "lease_owner_mismatch",
            f"Query task {view.query_task_id!r} is leased by {view.lease_owner!r}, not {lease_owner!r}; "
            "only the lease owner may answer it.",
            {"query_task_id": view.query_task_id, "lease_owner": view.lease_owner, "outcome": "rejected"},
        )
    # "Attempt mismatch | 409 | `query_task_attempt_mismatch` (with `current_attempt`)".
    if attempt != view.attempt:
        raise Rejection(
            409,
            "query_task_attempt_mismatch",
            f"Query task {view.query_task_id!r} is at attempt {view.attempt}, not {attempt}; this lease is stale.",
            {"query_task_id": view.query_task_id, "current_attempt": view.attempt, "outcome": "rejected"},
        )
    # "Lease expired | 409 | `lease_expired` (with `lease_expires_at`)". Same boundary as §8.9 row 4
    # (`lease_expires_at ≤ now`); a missing expiry on a leased row fails closed.
    if _lease_over(view.lease_expires_at, now):
        raise _lease_expired(
            f"query task {view.query_task_id!r}",
            view.lease_expires_at,
            "query",
            {"query_task_id": view.query_task_id, "outcome": "rejected"},
        )
