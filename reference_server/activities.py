"""Activity tasks (docs/reference.md: Activities): poll, complete, fail, heartbeat, status, and the §11.7 timeout
enforcer.

Three rows describe one activity, and each has its lifecycle table in :mod:`suite.protocol.lifecycles`
(every state change below is asked of the table first, so an illegal move is a loud bug, not a silent one)::

    activity_executions   one logical activity; ``activity_execution_id`` is stable across attempts
       └── activity_tasks     one per retry (a retry is a NEW task_id); stable across lease redeliveries
              └── activity_attempts  one per lease (every claim is a NEW activity_attempt_id)

Fencing is decided twice, as for workflow tasks: the pure model's guards (``guard_activity_attempt``,
``guard_activity_report``, ``activity_heartbeat_outcome``) produce the exact §11.2–§11.5 answer, and the write
that records an outcome is a conditional ``UPDATE … WHERE attempt_id = ? AND status = 'running' AND
lease_owner = ? AND lease_expires_at > now``, so no interleaving can record two outcomes for one attempt.

Decisions where the spec leaves room (each is repeated where it is enforced):

* **Lease expiry is found lazily.** An expired lease is not swept by a timer: the next matching poll closes
  the old attempt as ``expired`` and leases the same task to a new attempt (§9 "Activity redelivery"). The
  long poll's own due time includes lease expiries, so an expired task is pollable without outside help.
* **Timeouts run before anything else** in every poll, complete, fail and heartbeat transaction (for the
  execution concerned) as well as in the scheduler's maintenance pass, so a verdict never depends on whether
  the scheduler has run yet: an outcome reported after a timeout deadline is ``stale_attempt``, exactly as if
  the enforcer had been instantaneous.
* **schedule_to_start is terminal.** §11.7 says the enforcer "retries, subject to attempts left", but an
  activity that was never started has used no attempt: retrying it would either leave a gap in the attempt
  numbers workers see (§14.2 "numbered 1, 2, 3, … with no gaps") or never be bounded by ``max_attempts``.
* **The activity's worker learns of a closed run, the run hears nothing more.** A cancelled or terminated
  run records ``ActivityCancelled`` for an attempt that was still running when it is closed (§11.5); a run
  that completed or failed with an activity still open gets no history after its terminal event — the
  attempt, task and execution are just closed as cancelled.
* **The status verb is read-only** (§1.1: "liveness and cancel state **without** renewing the lease"): it
  never renews, never closes an attempt and never enforces a timeout.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from suite.protocol.commands import ActivityFailure, ActivityFence, HeartbeatProgress, RetryPolicy
from suite.protocol.errors import Rejection
from suite.protocol.fencing import (
    ActivityAttemptView,
    ActivityVerb,
    activity_heartbeat_outcome,
    guard_activity_attempt,
    guard_activity_report,
    stop_reason,
)
from suite.protocol.lifecycles import (
    ACTIVITY_EXECUTION,
    ACTIVITY_TASK,
    RUN_LIVE_STATUSES,
    AttemptEvent,
    AttemptStatus,
    ExecutionEvent,
    ExecutionStatus,
    RunStatus,
    TaskEvent,
    TaskStatus,
)
from suite.protocol.sessions import Admission

from . import sessions
from .engine import TERMINAL_RUN_STATUSES, append_event, open_workflow_task, record_wake, ts
from .polling import Poll, forget_polls, lease_taken, replayed_task
from .store import dumps, from_us, loads, new_id
from .transitions import ACTIVITY_ATTEMPTS, ACTIVITY_EXECUTIONS, ACTIVITY_TASKS, claim, initial, move
from .tx import T, Watch

__all__ = [
    "TIMEOUT_WATCHES",
    "activity_due_in",
    "activity_wake_context",
    "claim_activity_task",
    "complete_activity_task",
    "enforce_activity_timeouts",
    "fail_activity_task",
    "heartbeat_activity_task",
    "task_payload",
]

US = 1_000_000

_TERMINAL_RUNS_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_RUN_STATUSES))
# "The leased activity task's run is closed", looked up by the run's primary key for each leased task. The
# earlier `run_id IN (SELECT run_id FROM runs WHERE status IN …)` read every finished run ever kept on every
# heartbeat and complete (tests/server/test_query_plans.py), so their cost grew with the server's age.
_RUN_CLOSED = (
    f"EXISTS (SELECT 1 FROM runs r WHERE r.run_id = activity_tasks.run_id AND r.status IN ({_TERMINAL_RUNS_SQL}))"
)
_SWEEP_LIMIT = 100


# -- lifecycle writes: the model's tables decide every target state -------------------------------------


def _move_attempt(t: T, attempt_id: str, event: AttemptEvent, *, owner: str | None = None) -> bool:
    """running → completed | failed | cancelled | expired. Every attempt transition leaves ``running``, so the
    ``status = 'running'`` condition is the whole race. With ``owner`` this is the outcome-recording write:
    only the live lease the guard saw may move it."""
    moved = move(
        t,
        ACTIVITY_ATTEMPTS,
        attempt_id,
        AttemptStatus.RUNNING,
        event,
        also="closed_at = ?",
        args=(t.now,),
        where="lease_owner = ? AND lease_expires_at > ?" if owner is not None else "",
        where_args=(owner, t.now) if owner is not None else (),
        cause=event.value,
    )
    return moved is not None


def _move_task(t: T, task_id: str, event: TaskEvent) -> bool:
    """Close a ready or leased task (complete, time_out, cancel); a closed task is left as it is."""
    row = t.one("SELECT status FROM activity_tasks WHERE task_id = ?", task_id)
    if row is None or not ACTIVITY_TASK.can(TaskStatus(row["status"]), event):
        return False
    moved = move(t, ACTIVITY_TASKS, task_id, row["status"], event, also="lease_expires_at = NULL", cause=event.value)
    return moved is not None


def _move_execution(t: T, execution_id: str, event: ExecutionEvent) -> bool:
    """Move the execution by ``event`` if its table allows it in the execution's state (a closed execution
    is left as it is); a terminal state records ``closed_at``."""
    row = t.one("SELECT status FROM activity_executions WHERE execution_id = ?", execution_id)
    if row is None or not ACTIVITY_EXECUTION.can(ExecutionStatus(row["status"]), event):
        return False
    closed = ACTIVITY_EXECUTION.is_terminal(ACTIVITY_EXECUTION.table[(ExecutionStatus(row["status"]), event)])
    moved = move(
        t,
        ACTIVITY_EXECUTIONS,
        execution_id,
        row["status"],
        event,
        also="closed_at = CASE WHEN ? THEN ? ELSE closed_at END",
        args=(closed, t.now),
        cause=event.value,
    )
    return moved is not None


# -- shared pieces -----------------------------------------------------------------------------------------


def _policy(execution: sqlite3.Row) -> RetryPolicy:
    """The policy snapshot taken when the activity was scheduled (§11.1 ``retry_policy``); §11.6: with no
    policy, ``max_attempts = 1``."""
    snap = loads(execution["retry_policy"]) or {}
    try:
        return RetryPolicy(
            max_attempts=int(snap.get("max_attempts") or 1),
            backoff_seconds=tuple(int(b) for b in snap.get("backoff_seconds") or ()),
            non_retryable_error_types=tuple(str(n) for n in snap.get("non_retryable_error_types") or ()),
        )
    except (TypeError, ValueError):
        return RetryPolicy()


def _event_base(execution: sqlite3.Row, attempt_id: str | None, attempt_number: int | None) -> dict[str, Any]:
    # Python SDK 2.12.0, Replay: `sequence` is the step number of the ActivityScheduled command, stamped on every event
    # of that step, so replay can match the outcome to the command.
    return {
        "sequence": execution["step_sequence"],
        "activity_execution_id": execution["execution_id"],
        "activity_attempt_id": attempt_id,
        "activity_type": execution["activity_type"],
        "attempt_number": attempt_number,
    }


def _resolve(
    t: T, execution: sqlite3.Row, attempt_id: str | None, event_type: str, payload: dict[str, Any]
) -> str | None:
    """Record the execution's one terminal event and resume the workflow (§11.3, §11.6 "Final failure");
    returns the workflow task that will see it. §14.2: "The workflow is resumed … **only** for the final
    outcome"."""
    record_wake(t, execution["run_id"], event_type, payload, **activity_wake_context(execution, attempt_id))
    task = open_workflow_task(t, execution["run_id"])
    # Decided rule (README, "Decided rules"): next_task_id names the task that will see the result. A task
    # leased at this moment was shown a history without it; the follow-up its completion creates will see
    # it and does not exist yet, so: null.
    if task is None or task["status"] == "leased":
        return None
    return str(task["task_id"])


def activity_wake_context(execution: sqlite3.Row, attempt_id: str | None) -> dict[str, Any]:
    """The resume context of the task an activity's final outcome wakes: the execution and the attempt that
    reported it (§8.3; with §15, upstream's workflow_wait_kind "activity" and open_wait_id "activity:{id}")."""
    eid = execution["execution_id"]
    return {
        "workflow_wait_kind": "activity",
        "open_wait_id": f"activity:{eid}",
        "resume_source_kind": "activity_execution",
        "resume_source_id": eid,
        "activity_execution_id": eid,
        "activity_attempt_id": attempt_id,
        "activity_type": execution["activity_type"],
    }


def retry_ready_at(t: T, backoff: int) -> int:
    """When a retry scheduled now with ``backoff`` seconds becomes leasable (µs)."""
    return t.now + backoff * US


def _schedule_retry(
    t: T,
    execution: sqlite3.Row,
    old_task: sqlite3.Row,
    attempt_id: str,
    after_attempt: int,
    cause: Mapping[str, Any],
) -> str:
    """§11.6 "How a retry is created": a new **ready** task (new task_id) with ``available_at = now +
    backoff`` and ``ActivityRetryScheduled``; "**No workflow task is created** for a retry"."""
    policy = _policy(execution)
    backoff = policy.backoff_before(after_attempt + 1)
    available_at = retry_ready_at(t, backoff)
    s2s = execution["schedule_to_start_timeout"]
    task_id = new_id(t.now)
    t.db.execute(
        "INSERT INTO activity_tasks (task_id, namespace, execution_id, run_id, task_queue, activity_type,"
        " compatibility, status, available_at, created_at, schedule_to_start_deadline)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            task_id,
            old_task["namespace"],
            execution["execution_id"],
            execution["run_id"],
            old_task["task_queue"],
            execution["activity_type"],
            old_task["compatibility"],
            initial(ACTIVITY_TASKS),
            available_at,
            t.now,
            # schedule_to_start runs from the moment the retry becomes claimable, not from its creation:
            # the backoff is the server's own choice and must not eat into the worker's pickup budget.
            available_at + s2s * US if s2s else None,
        ),
    )
    t.db.execute(
        "UPDATE activity_executions SET current_task_id = ? WHERE execution_id = ?",
        (task_id, execution["execution_id"]),
    )
    _move_execution(t, execution["execution_id"], ExecutionEvent.RETRY)
    t.fx.transition("activity_task", task_id, None, initial(ACTIVITY_TASKS), run_id=execution["run_id"])
    t.fx.wake.add(("activity", old_task["namespace"], old_task["task_queue"]))
    append_event(
        t,
        execution["run_id"],
        "ActivityRetryScheduled",
        {
            **_event_base(execution, attempt_id, after_attempt),
            "task_id": task_id,
            "failed_task_id": old_task["task_id"],
            "retry_after_attempt": after_attempt,
            "retry_available_at": ts(available_at),
            "retry_backoff_seconds": backoff,
            "max_attempts": policy.max_attempts,
            **cause,
        },
    )
    return task_id


def _cancel_execution(t: T, execution: sqlite3.Row, run: sqlite3.Row, reason: str) -> None:
    """Close everything still open of an execution whose run closed (or that was cancelled itself).

    §11.5: the heartbeat "closes the attempt as cancelled and records `ActivityCancelled`"; the same closing
    happens whichever call notices first (heartbeat, a late complete or fail, a timeout, or an expired lease
    nobody will report on), so the history has one ``ActivityCancelled`` per attempt that was running.
    """
    eid = execution["execution_id"]
    quiet = run["status"] in ("completed", "failed")  # no history after the run's terminal event
    for attempt in t.all("SELECT * FROM activity_attempts WHERE execution_id = ? AND status = 'running'", eid):
        if _move_attempt(t, attempt["attempt_id"], AttemptEvent.CANCEL) and not quiet:
            append_event(
                t,
                execution["run_id"],
                "ActivityCancelled",
                {
                    **_event_base(execution, attempt["attempt_id"], attempt["attempt_number"]),
                    "failure_category": "cancelled",
                    "reason": reason,
                    "message": f"The activity attempt was cancelled ({reason}).",
                    "exception_type": None,
                    "exception_class": None,
                    "non_retryable": True,
                },
            )
    for task in t.all(
        "SELECT task_id FROM activity_tasks WHERE execution_id = ? AND status IN ('ready', 'leased')", eid
    ):
        _move_task(t, task["task_id"], TaskEvent.CANCEL)
        forget_polls(t, "activity", task["task_id"])
    _move_execution(t, eid, ExecutionEvent.CANCEL)


# -- claim (§11.1, §7) -------------------------------------------------------------------------------------


def _match_sql(alias: str) -> str:
    """The §7.5 matching rules shared by the claim and the long poll's due time: same namespace and queue,
    compatibility marker, type filter (empty list = all), and never a task of a closed run (invariant 50)."""
    a = alias
    return (
        f"{a}.namespace = ? AND {a}.task_queue = ? AND ({a}.compatibility IS NULL OR {a}.compatibility = ?)"
        f" AND (? = 0 OR {a}.activity_type IN (SELECT value FROM json_each(?)))"
        f" AND EXISTS (SELECT 1 FROM runs r WHERE r.run_id = {a}.run_id"
        f" AND r.status NOT IN ({_TERMINAL_RUNS_SQL}))"
    )


def registered_activity_types(worker: sqlite3.Row) -> list[str]:
    """The activity types a worker registered: matching leases it only activity tasks of these types (an empty
    list: any type)."""
    return list(loads(worker["activity_types"]) or [])


def _match_args(worker: sqlite3.Row, queue: str) -> tuple[Any, ...]:
    types = registered_activity_types(worker)
    return (worker["namespace"], queue, worker["build_id"] or "", len(types), dumps(types))


def claim_activity_task(t: T, poll: Poll) -> dict[str, Any] | str | None:
    """Lease one activity task to the polling worker: the task payload (§11.1), ``None`` when nothing
    matches, or ``"throttled"`` when the admission limit refuses a lease (§7.4, Appendix C)."""
    enforce_activity_timeouts(t)
    lease_until = t.now + t.settings.activity_lease_seconds * US
    replay = replayed_task(t, poll)
    if replay is not None:
        # §7.3: "the same task_id and the same attempt … returns the refreshed `lease_expires_at`".
        task = t.one("SELECT current_attempt_id FROM activity_tasks WHERE task_id = ?", replay)
        assert task is not None
        t.db.execute("UPDATE activity_tasks SET lease_expires_at = ? WHERE task_id = ?", (lease_until, replay))
        t.db.execute(
            "UPDATE activity_attempts SET lease_expires_at = ? WHERE attempt_id = ? AND status = ?",
            (lease_until, task["current_attempt_id"], AttemptStatus.RUNNING),
        )
        return task_payload(t, replay)
    limit = t.settings.max_active_leases_per_queue
    if limit is not None:
        active = t.one(
            "SELECT COUNT(*) AS n FROM activity_tasks WHERE namespace = ? AND task_queue = ?"
            " AND status = 'leased' AND lease_expires_at > ?",
            poll.namespace,
            poll.queue,
            t.now,
        )
        if active is not None and int(active["n"]) >= limit:
            return "throttled"
    candidates = t.all(
        "SELECT k.task_id, k.status, k.current_attempt_id, k.execution_id FROM activity_tasks k"
        f" WHERE {_match_sql('k')}"
        " AND ((k.status = 'ready' AND k.available_at <= ?)"
        " OR (k.status = 'leased' AND k.lease_expires_at <= ?))"
        " ORDER BY k.available_at, k.task_id LIMIT 100",
        *_match_args(poll.worker, poll.queue),
        t.now,
        t.now,
    )
    for cand in candidates:
        # SESSION-ADMISSION: an in-session task is leased only to a worker the session admits.
        admission = sessions.admit_claim(t, poll.worker, cand["task_id"], poll.queue)
        if admission is not None and not admission.admitted:
            continue
        if _lease(t, poll, cand, lease_until, admission):
            return task_payload(t, cand["task_id"])
        # lost the race: not an error, try the next candidate (§7.5)
    return None


def _lease(t: T, poll: Poll, cand: sqlite3.Row, lease_until: int, admission: Admission | None) -> bool:
    """Lease the candidate task to a new attempt; False when another claim got it first. The claim is the
    conditional write (§7.5): only a ready task, or one whose lease has expired, moves."""
    attempt_id = new_id(t.now)
    redelivery = cand["status"] == TaskStatus.LEASED
    also, args = (
        "lease_owner = ?, lease_expires_at = ?, current_attempt_id = ?",
        (poll.worker_id, lease_until, attempt_id),
    )
    moved = claim(t, ACTIVITY_TASKS, cand["task_id"], cand["status"], also=also, args=args)
    if moved is None:
        return False
    if redelivery:
        # §9 "Activity redelivery": "A lease expiry closes the attempt (status `expired`). The re-claim of
        # the same activity task creates a **new `activity_attempt_id`** and `attempt_number + 1`". §11.6:
        # not a retry — no backoff, no ActivityRetryScheduled.
        _move_attempt(t, cand["current_attempt_id"], AttemptEvent.EXPIRE)
        t.fx.transition("activity_task", cand["task_id"], "leased", "ready", cause=TaskEvent.EXPIRE.value)
        _move_execution(t, cand["execution_id"], ExecutionEvent.LEASE_LOST)
    t.fx.transition("activity_task", cand["task_id"], "ready", "leased", lease_owner=poll.worker_id)
    if admission is not None:
        sessions.commit_admission(t, poll.worker, cand["task_id"], admission)  # lazy creation / reacquisition
    execution = _execution(t, cand["execution_id"])
    _move_execution(t, cand["execution_id"], ExecutionEvent.CLAIM)
    number = int(execution["attempt_count"]) + 1
    s2c, hb = execution["start_to_close_timeout"], execution["heartbeat_timeout"]
    t.db.execute(
        "UPDATE activity_executions SET attempt_count = ? WHERE execution_id = ?", (number, cand["execution_id"])
    )
    t.db.execute(
        "INSERT INTO activity_attempts (attempt_id, task_id, execution_id, attempt_number, lease_owner,"
        " status, started_at, lease_expires_at, start_to_close_deadline, heartbeat_deadline)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            attempt_id,
            cand["task_id"],
            cand["execution_id"],
            number,
            poll.worker_id,
            initial(ACTIVITY_ATTEMPTS),
            t.now,
            lease_until,
            # §11.7: start_to_close is "one attempt, from claim to outcome"; heartbeat is "the maximum gap
            # between heartbeats", so the first gap starts at the claim.
            t.now + s2c * US if s2c else None,
            t.now + hb * US if hb else None,
        ),
    )
    t.fx.transition("activity_attempt", attempt_id, None, initial(ACTIVITY_ATTEMPTS), task_id=cand["task_id"])
    lease_taken(t, poll, cand["task_id"], number)
    return True


def task_payload(t: T, task_id: str) -> dict[str, Any]:
    """The leased activity task (§11.1)."""
    task = t.row("activity_tasks", "task_id", task_id)
    attempt = t.row("activity_attempts", "attempt_id", task["current_attempt_id"])
    execution = t.row("activity_executions", "execution_id", task["execution_id"])
    run = t.run(task["run_id"])
    # §11.1 "`deadlines` … Any of `schedule_to_start`, `start_to_close`, `schedule_to_close`, `heartbeat`.
    # Omitted when none apply": schedule_to_start no longer applies once the task is claimed.
    deadlines = {
        name: ts(at)
        for name, at in (
            ("start_to_close", attempt["start_to_close_deadline"]),
            ("schedule_to_close", execution["schedule_to_close_deadline"]),
            ("heartbeat", attempt["heartbeat_deadline"]),
        )
        if at is not None
    }
    number = int(attempt["attempt_number"])
    session = sessions.activity_snapshot(t, task_id)
    return {
        "task_id": task_id,
        "namespace": task["namespace"],
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "workflow_type": run["workflow_type"],
        "activity_execution_id": execution["execution_id"],
        # [S0]: "Use it as the default remote idempotency key"; UPP's idempotency_key equals it.
        "idempotency_key": execution["execution_id"],
        "activity_attempt_id": attempt["attempt_id"],
        "attempt_number": number,
        "attempt": number,  # §11.1: "The RS SHOULD also emit `attempt` as an alias"
        "activity_type": execution["activity_type"],
        "payload_codec": "avro",
        "arguments": ({"codec": "avro", "blob": execution["arguments_blob"]} if execution["arguments_blob"] else None),
        "retry_policy": loads(execution["retry_policy"]),
        "deadlines": deadlines,
        "task_queue": task["task_queue"],
        "connection": execution["connection"],
        "lease_owner": attempt["lease_owner"],
        "lease_expires_at": ts(attempt["lease_expires_at"]),
        **({"worker_session": session} if session is not None else {}),
    }


def activity_due_in(db: sqlite3.Connection, worker: sqlite3.Row, queue: str, now: int) -> float | None:
    """Seconds until durable state alone makes a task claimable by *this* worker: the earliest future
    ``available_at`` (a retry's backoff) or lease expiry (redelivery). Filtering by this worker's matching
    rules keeps a poll from spinning on an expired lease it could never claim."""
    row = db.execute(
        "SELECT MIN(CASE WHEN k.status = 'ready' THEN k.available_at ELSE k.lease_expires_at END)"
        f" FROM activity_tasks k WHERE {_match_sql('k')}"
        " AND ((k.status = 'ready' AND k.available_at > ?) OR k.status = 'leased')",
        (*_match_args(worker, queue), now),
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, (int(row[0]) - now) / 1e6)


# -- fencing -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    attempt: sqlite3.Row
    task: sqlite3.Row
    execution: sqlite3.Row
    run: sqlite3.Row


def _load(t: T, attempt_id: str) -> tuple[ActivityAttemptView, _Rows]:
    attempt = t.row("activity_attempts", "attempt_id", attempt_id)
    task = t.row("activity_tasks", "task_id", attempt["task_id"])
    execution = t.row("activity_executions", "execution_id", attempt["execution_id"])
    run = t.run(execution["run_id"])

    def dt(us: int | None) -> datetime | None:
        return None if us is None else from_us(us)

    view = ActivityAttemptView(
        attempt_id=attempt_id,
        task_id=attempt["task_id"],
        attempt_number=int(attempt["attempt_number"]),
        attempt_status=AttemptStatus(attempt["status"]),
        lease_owner=attempt["lease_owner"],
        lease_expires_at=dt(attempt["lease_expires_at"]),
        task_status=TaskStatus(task["status"]),
        task_current_attempt_id=task["current_attempt_id"] if task["status"] == TaskStatus.LEASED.value else None,
        execution_status=ExecutionStatus(execution["status"]),
        execution_current_task_id=execution["current_task_id"],
        run_status=RunStatus(run["status"]),
        run_closed_reason=run["closed_reason"],
        run_closed_at=dt(run["closed_at"]),
    )
    return view, _Rows(attempt, task, execution, run)


def guarded(
    t: T, namespace: str, task_id: str, fence: ActivityFence, *, enforce: bool = True
) -> tuple[ActivityAttemptView, _Rows]:
    """§11.2 ownership (404 task_not_found, 404 attempt_not_found, 409 task_mismatch, 409
    lease_owner_mismatch), then — once the caller is known to be the owner — any timeout already due for
    this execution, so the view the caller is judged on is the one the enforcer would have produced."""
    task_exists = t.one("SELECT 1 FROM activity_tasks WHERE task_id = ? AND namespace = ?", task_id, namespace)
    attempt = t.one(
        "SELECT a.attempt_id, a.execution_id FROM activity_attempts a"
        " JOIN activity_executions e ON e.execution_id = a.execution_id"
        " WHERE a.attempt_id = ? AND e.namespace = ?",
        fence.activity_attempt_id,
        namespace,
    )
    view = _load(t, fence.activity_attempt_id)[0] if attempt is not None else None
    guard_activity_attempt(
        view,
        task_exists=task_exists is not None,
        task_id=task_id,
        activity_attempt_id=fence.activity_attempt_id,
        lease_owner=fence.lease_owner,
    )
    assert attempt is not None
    if enforce:
        enforce_activity_timeouts(t, execution_id=attempt["execution_id"])
    return _load(t, fence.activity_attempt_id)


def _report_guard(t: T, view: ActivityAttemptView, rows: _Rows, verb: ActivityVerb) -> Rejection | None:
    """§11.3/§11.5 via the model. A stale attempt is refused with no change at all (invariant 68). A closed
    run is refused too, but §11.5 has the server close the attempt, task and execution as cancelled in the
    same transaction — so that rejection is *returned*, to be raised only after the commit."""
    try:
        guard_activity_report(view, verb=verb, now=from_us(t.now))
    except Rejection as rejection:
        if view.run_status in RUN_LIVE_STATUSES:
            raise
        _cancel_execution(t, rows.execution, rows.run, rejection.reason)
        return rejection
    return None


def _record_outcome(t: T, rows: _Rows, event: AttemptEvent) -> None:
    """The write that decides the race: only the live lease the guard saw can record an outcome."""
    if not _move_attempt(t, rows.attempt["attempt_id"], event, owner=rows.attempt["lease_owner"]):
        raise Rejection(
            409,
            "stale_attempt",
            "The activity attempt stopped being live before its outcome could be recorded; drop the result.",
            {
                "task_id": rows.task["task_id"],
                "activity_attempt_id": rows.attempt["attempt_id"],
                "outcome": "completed" if event is AttemptEvent.COMPLETE else "failed",
                "recorded": False,
            },
        )
    _move_task(t, rows.task["task_id"], TaskEvent.COMPLETE)  # §9.1: every reported outcome completes the task
    forget_polls(t, "activity", rows.task["task_id"])


def _reported(t: T, namespace: str, task_id: str, fence: ActivityFence, verb: ActivityVerb) -> _Rows | Rejection:
    """A complete or fail through its guards and the write that records it: the attempt's rows, or the
    rejection of a report on a closed run (returned, to be raised after the commit that cancelled the attempt)."""
    view, rows = guarded(t, namespace, task_id, fence)
    stop = _report_guard(t, view, rows, verb)
    if stop is not None:
        return stop
    _record_outcome(t, rows, AttemptEvent.COMPLETE if verb == "complete" else AttemptEvent.FAIL)
    return rows


def _recorded(task_id: str, rows: _Rows, outcome: str, next_task_id: str | None) -> dict[str, Any]:
    """The answer to a recorded complete or fail (§11.3, §11.4)."""
    return {
        "task_id": task_id,
        "activity_attempt_id": rows.attempt["attempt_id"],
        "activity_execution_id": rows.execution["execution_id"],
        "outcome": outcome,
        "recorded": True,
        "reason": None,
        "next_task_id": next_task_id,
    }


# -- complete (§11.3) --------------------------------------------------------------------------------------


def complete_activity_task(
    t: T, namespace: str, task_id: str, fence: ActivityFence, result_blob: str | None
) -> dict[str, Any] | Rejection:
    rows = _reported(t, namespace, task_id, fence, "complete")
    if isinstance(rows, Rejection):
        return rows
    execution = rows.execution
    _move_execution(t, execution["execution_id"], ExecutionEvent.COMPLETE)
    attempt_id = rows.attempt["attempt_id"]
    # §11.3: "History: `ActivityCompleted`, whose payload includes `result` and `payload_codec`, then a new
    # workflow task"; the result is the worker's blob, unchanged.
    next_task_id = _resolve(
        t,
        execution,
        attempt_id,
        "ActivityCompleted",
        {
            **_event_base(execution, attempt_id, rows.attempt["attempt_number"]),
            "result": result_blob,
            "payload_codec": "avro",
        },
    )
    return _recorded(task_id, rows, "completed", next_task_id)


def failure_policy(execution: sqlite3.Row, attempt_number: int) -> RetryPolicy:
    """The retry policy that decides what follows the failure of attempt ``attempt_number``: the execution's."""
    return _policy(execution)


# -- fail (§11.4, §11.6) -----------------------------------------------------------------------------------


def fail_activity_task(
    t: T, namespace: str, task_id: str, fence: ActivityFence, failure: ActivityFailure
) -> dict[str, Any] | Rejection:
    rows = _reported(t, namespace, task_id, fence, "fail")
    if isinstance(rows, Rejection):
        return rows
    execution, attempt = rows.execution, rows.attempt
    attempt_id, number = attempt["attempt_id"], int(attempt["attempt_number"])
    policy = failure_policy(execution, number)
    # §11.6: "Non-retryable if `failure.non_retryable == true`, or `failure.type` or `failure.class` ∈
    # `non_retryable_error_types`"; "Retry if the failure is not non-retryable **and** attempt_number <
    # max_attempts".
    non_retryable = policy.is_non_retryable(failure.type, failure.class_, failure.non_retryable)
    summary: dict[str, Any] = {
        "failure_category": failure.category(),
        "exception_type": failure.type,
        "exception_class": failure.class_,
        "message": failure.message,
        "code": failure.code,
        "non_retryable": non_retryable,
    }
    next_task_id: str | None
    if policy.should_retry(number, failure.type, failure.class_, failure.non_retryable):
        next_task_id = _schedule_retry(t, execution, rows.task, attempt_id, number, summary)
    else:
        _move_execution(t, execution["execution_id"], ExecutionEvent.FAIL)
        # §11.4 "The stable cross-language failure contract … recorded in `ActivityFailed`". Runtime detail
        # (the stack trace) is "diagnostic only", so it sits in `diagnostics`, never in the contract fields.
        next_task_id = _resolve(
            t,
            execution,
            attempt_id,
            "ActivityFailed",
            {
                **_event_base(execution, attempt_id, number),
                **summary,
                "kind": failure.kind,
                "timeout_type": failure.timeout_type,
                "details": failure.details,
                "details_payload_codec": None if failure.details is None else failure.details["codec"],
                "max_attempts": policy.max_attempts,
                "diagnostics": None if failure.stack_trace is None else {"stack_trace": failure.stack_trace},
            },
        )
    return _recorded(task_id, rows, "failed", next_task_id)


# -- heartbeat and status (§11.5) ------------------------------------------------------------------------


def record_heartbeat(
    t: T, execution: sqlite3.Row, attempt: sqlite3.Row | Mapping[str, Any], progress: Any, lease_expires_at: int
) -> None:
    """``ActivityHeartbeatRecorded`` of ``attempt``, with its progress and renewed lease."""
    append_event(
        t,
        execution["run_id"],
        "ActivityHeartbeatRecorded",
        {
            **_event_base(execution, attempt["attempt_id"], attempt["attempt_number"]),
            "progress": progress,
            "lease_expires_at": ts(lease_expires_at),
        },
    )


def heartbeat_activity_task(
    t: T, namespace: str, task_id: str, fence: ActivityFence, progress: HeartbeatProgress, *, renew: bool = True
) -> dict[str, Any]:
    """A heartbeat (``renew=True``) or the read-only ``status`` verb (``renew=False``). Both answer 200 once
    ownership passed; only a live heartbeat extends the lease and records ``ActivityHeartbeatRecorded``."""
    view, rows = guarded(t, namespace, task_id, fence, enforce=renew)
    decision = activity_heartbeat_outcome(view, now=from_us(t.now))
    attempt, execution = rows.attempt, rows.execution
    lease_expires_at: int | None = attempt["lease_expires_at"]
    last_heartbeat_at: int | None = attempt["last_heartbeat_at"]
    fields = decision.fields()
    if not renew:
        fields["heartbeat_recorded"] = False
    elif decision.heartbeat_recorded:
        # §11.5: "The lease is extended to now + 300"; §11.7 heartbeat is "the maximum gap between
        # heartbeats", so its deadline moves too. The lease is set fresh, never added to the old one.
        lease_expires_at = t.now + t.settings.activity_lease_seconds * US
        hb = execution["heartbeat_timeout"]
        renewed = t.db.execute(
            "UPDATE activity_attempts SET lease_expires_at = ?, last_heartbeat_at = ?,"
            " heartbeat_deadline = COALESCE(?, heartbeat_deadline)"
            " WHERE attempt_id = ? AND status = 'running' AND lease_owner = ? AND lease_expires_at > ?",
            (
                lease_expires_at,
                t.now,
                t.now + hb * US if hb else None,
                attempt["attempt_id"],
                fence.lease_owner,
                t.now,
            ),
        ).rowcount
        assert renewed == 1, "the model judged the attempt live inside this transaction"
        t.db.execute(
            "UPDATE activity_tasks SET lease_expires_at = ? WHERE task_id = ? AND current_attempt_id = ?",
            (lease_expires_at, task_id, attempt["attempt_id"]),
        )
        last_heartbeat_at = t.now
        sessions.renew_from_activity(t, task_id, fence.lease_owner)  # SESSION-ACTIVITY-HEARTBEAT-RENEWS
        record_heartbeat(t, execution, attempt, progress.to_json(), lease_expires_at)
    elif decision.closes_attempt is AttemptEvent.CANCEL:
        # §11.5: "The heartbeat also closes the attempt as cancelled and records `ActivityCancelled`".
        _cancel_execution(t, execution, rows.run, decision.reason or "activity_cancelled")
    elif decision.closes_attempt is AttemptEvent.EXPIRE:
        # §9: "A lease expiry closes the attempt (status `expired`)"; the next poll can claim the task.
        _move_attempt(t, attempt["attempt_id"], AttemptEvent.EXPIRE)
    final = t.one("SELECT status FROM activity_attempts WHERE attempt_id = ?", attempt["attempt_id"])
    if final is not None and final["status"] != AttemptStatus.RUNNING.value:
        # §11.5 "`lease_expires_at:null`" for a cancelled attempt; decided rule (README): any closed attempt
        # (timed out, expired, completed, failed) holds no lease either.
        lease_expires_at = None
    session = sessions.activity_snapshot(t, task_id)
    return {
        "task_id": task_id,
        "activity_attempt_id": attempt["attempt_id"],
        "lease_owner": attempt["lease_owner"],
        **fields,
        "lease_expires_at": ts(lease_expires_at),
        "last_heartbeat_at": ts(last_heartbeat_at),
        **({"worker_session": session} if session is not None else {}),
    }


# -- timeouts (§11.7) --------------------------------------------------------------------------------------


def _time_out(
    t: T,
    execution: sqlite3.Row,
    task: sqlite3.Row | None,
    attempt: sqlite3.Row | None,
    timeout_type: str,
) -> None:
    """§11.7: "On expiry the upstream enforcer retries, subject to attempts left and backoff, **except** for
    `schedule_to_close`, which is always terminal. When no retry remains it records a terminal
    `ActivityTimedOut` with `failure_category:"timeout"` and wakes the workflow"."""
    attempt_id: str | None = None
    number: int | None = None
    if attempt is not None:
        attempt_id, number = str(attempt["attempt_id"]), int(attempt["attempt_number"])
        _move_attempt(t, attempt_id, AttemptEvent.EXPIRE)
    if task is not None:
        _move_task(t, task["task_id"], TaskEvent.TIME_OUT)
        forget_polls(t, "activity", task["task_id"])
    policy = _policy(execution)
    cause = {
        "failure_category": "timeout",
        "timeout_type": timeout_type,
        "message": f"Activity {timeout_type} timeout expired.",
        "exception_type": None,
        "exception_class": None,
        "code": None,
    }
    # Only a per-attempt timeout can be retried: schedule_to_close is "always terminal", and
    # schedule_to_start had no attempt to retry (module docstring).
    per_attempt = timeout_type in ("start_to_close", "heartbeat")
    if (
        per_attempt
        and attempt_id is not None
        and number is not None
        and task is not None
        and policy.should_retry(number)
    ):
        _schedule_retry(t, execution, task, attempt_id, number, {**cause, "non_retryable": False})
        return
    _move_execution(t, execution["execution_id"], ExecutionEvent.TIME_OUT)
    _resolve(
        t,
        execution,
        attempt_id,
        "ActivityTimedOut",
        {
            **_event_base(execution, attempt_id, number),
            **cause,
            "non_retryable": True,
            "max_attempts": policy.max_attempts,
        },
    )


def enforce_activity_timeouts(t: T, *, execution_id: str | None = None) -> float | None:
    """Apply every activity timeout that is due (for all executions, or for one), close leases of closed runs
    that ran out, and return the seconds until the next such deadline (``None`` when nothing is pending).

    Registered as a maintenance step, and also run at the start of polls and reports (module docstring).
    """
    only = (execution_id, execution_id)
    for execution in t.all(
        "SELECT * FROM activity_executions WHERE closed_at IS NULL AND schedule_to_close_deadline <= ?"
        " AND (? IS NULL OR execution_id = ?) LIMIT ?",
        t.now,
        *only,
        _SWEEP_LIMIT,
    ):
        if not _closed_run_tidied(t, execution):
            task = t.one("SELECT * FROM activity_tasks WHERE task_id = ?", execution["current_task_id"])
            attempt = None
            if task is not None and task["status"] == TaskStatus.LEASED.value:
                attempt = t.one(
                    "SELECT * FROM activity_attempts WHERE attempt_id = ? AND status = 'running'",
                    task["current_attempt_id"],
                )
            _time_out(t, execution, task, attempt, "schedule_to_close")
    for ready in t.all(
        "SELECT * FROM activity_tasks WHERE status = 'ready' AND schedule_to_start_deadline <= ?"
        " AND (? IS NULL OR execution_id = ?) LIMIT ?",
        t.now,
        *only,
        _SWEEP_LIMIT,
    ):
        execution = _execution(t, ready["execution_id"])
        if not _closed_run_tidied(t, execution):
            _time_out(t, execution, ready, None, "schedule_to_start")
    for attempt in t.all(
        "SELECT * FROM activity_attempts WHERE status = 'running'"
        " AND (start_to_close_deadline <= ? OR heartbeat_deadline <= ?)"
        " AND (? IS NULL OR execution_id = ?) LIMIT ?",
        t.now,
        t.now,
        *only,
        _SWEEP_LIMIT,
    ):
        execution = _execution(t, attempt["execution_id"])
        if not _closed_run_tidied(t, execution):
            passed = [
                (at, kind)
                for at, kind in (
                    (attempt["start_to_close_deadline"], "start_to_close"),
                    (attempt["heartbeat_deadline"], "heartbeat"),
                )
                if at is not None and at <= t.now
            ]
            task = t.one("SELECT * FROM activity_tasks WHERE task_id = ?", attempt["task_id"])
            _time_out(t, execution, task, attempt, min(passed)[1])  # the deadline that passed first fired
    # A leased task of a closed run whose lease ran out will hear from nobody (its worker learns of the close
    # only through heartbeat, §11.5): close it, so it neither lingers nor keeps pollers due.
    for leased in t.all(
        "SELECT execution_id FROM activity_tasks WHERE status = 'leased' AND lease_expires_at <= ?"
        f" AND {_RUN_CLOSED} AND (? IS NULL OR execution_id = ?) LIMIT ?",
        t.now,
        *only,
        _SWEEP_LIMIT,
    ):
        _closed_run_tidied(t, _execution(t, leased["execution_id"]))
    return _next_deadline(t)


# The writes that can make enforce_activity_timeouts due sooner (tx.Watch): each deadline of _next_deadline as an
# execution, task or attempt takes it (scheduled, leased, heartbeat, retried), and the leases of a run's activity
# tasks as the run closes (a leased task of a closed run is closed once its lease ran out).
TIMEOUT_WATCHES = (
    Watch(
        "activity_executions",
        ("closed_at", "schedule_to_close_deadline"),
        "NEW.closed_at IS NULL",
        ("NEW.schedule_to_close_deadline",),
    ),
    Watch(
        "activity_tasks",
        ("status", "schedule_to_start_deadline"),
        "NEW.status = 'ready'",
        ("NEW.schedule_to_start_deadline",),
    ),
    Watch(
        "activity_attempts",
        ("status", "start_to_close_deadline", "heartbeat_deadline"),
        "NEW.status = 'running'",
        ("NEW.start_to_close_deadline", "NEW.heartbeat_deadline"),
    ),
    Watch(
        "runs",
        ("status",),
        # A run that never scheduled an activity (most) is told apart by the executions' index of runs.
        f"NEW.status IN ({_TERMINAL_RUNS_SQL})"
        " AND EXISTS (SELECT 1 FROM activity_executions WHERE run_id = NEW.run_id)",
        ("(SELECT MIN(lease_expires_at) FROM activity_tasks WHERE status = 'leased' AND run_id = NEW.run_id)",),
    ),
)


def _execution(t: T, execution_id: str) -> sqlite3.Row:
    row = t.one("SELECT * FROM activity_executions WHERE execution_id = ?", execution_id)
    assert row is not None, execution_id
    return row


def _closed_run_tidied(t: T, execution: sqlite3.Row) -> bool:
    """A deadline of a run that already closed times nothing out: the activity is cancelled with its run."""
    run = t.run(execution["run_id"])
    if run["status"] not in TERMINAL_RUN_STATUSES:
        return False
    _cancel_execution(t, execution, run, stop_reason(RunStatus(run["status"])))
    return True


def _next_deadline(t: T) -> float | None:
    row = t.one(
        "SELECT MIN(at) AS at FROM ("
        " SELECT MIN(schedule_to_close_deadline) AS at FROM activity_executions WHERE closed_at IS NULL"
        " UNION ALL SELECT MIN(schedule_to_start_deadline) FROM activity_tasks WHERE status = 'ready'"
        " UNION ALL SELECT MIN(start_to_close_deadline) FROM activity_attempts WHERE status = 'running'"
        " UNION ALL SELECT MIN(heartbeat_deadline) FROM activity_attempts WHERE status = 'running'"
        " UNION ALL SELECT MIN(lease_expires_at) FROM activity_tasks WHERE status = 'leased'"
        f" AND {_RUN_CLOSED})"
    )
    if row is None or row["at"] is None:
        return None
    return max(0.0, (int(row["at"]) - t.now) / 1e6)
