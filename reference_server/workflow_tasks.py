"""Workflow tasks: claim, history, heartbeat, complete (all command types, atomically) and fail.

Fencing is decided twice on purpose: the pure model's guard produces the exact rejection of the
rejection matrix (docs/reference.md: Fencing), and the write itself is a conditional ``UPDATE`` on (status, owner,
attempt), so no interleaving can accept a stale report even if the guard's read were outdated.
Every status the task, its lease and its run take is the answer of their lifecycle tables
(:mod:`reference_server.transitions`); the commands of a batch are applied by
:mod:`reference_server.commands`.
"""

from __future__ import annotations

import heapq
import itertools
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from suite.protocol import commands as cmdmodel
from suite.protocol import history as hist
from suite.protocol.errors import Rejection
from suite.protocol.fencing import WorkflowTaskView, guard_workflow_task
from suite.protocol.lifecycles import (
    RUN,
    WORKFLOW_TASK_LEASE,
    LeaseEvent,
    LeaseState,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
)

from . import cancellation
from .commands import IMPLEMENTED_OPTIONAL_COMMANDS, apply_command, check_storable_durations, satisfy_moved_past_waits
from .engine import (
    DEFERRED_RESUME_KEY,
    TERMINAL_RUN_STATUSES,
    create_workflow_task,
    deferred_resume,
    empty_resume,
    event_json,
    history_page,
    run_event,
    task_resume,
    ts,
)
from .polling import Poll, forget_polls, lease_taken, replayed_task
from .store import from_us, loads
from .transitions import WORKFLOW_TASKS, claim, move, step
from .tx import T

__all__ = [
    "claim_workflow_task",
    "complete_workflow_task",
    "default_history_page_size",
    "fail_workflow_task",
    "heartbeat_workflow_task",
    "task_history",
    "task_payload",
    "workflow_due_in",
]

US = 1_000_000


# -- claim -----------------------------------------------------------------------------------------------


def claim_workflow_task(
    t: T, poll: Poll, *, page_size: int, accept_encoding: str | None
) -> dict[str, Any] | str | None:
    """Lease one ready task to the polling worker; ``None`` when nothing matches, ``"throttled"`` when the
    admission limit refuses a lease. Returns the task payload (§8.2) on success."""
    replay = replayed_task(t, poll)
    if replay is not None:
        # §7.3: same task and attempt, refreshed lease, no attempt increment.
        step(WORKFLOW_TASK_LEASE, LeaseState.LIVE, LeaseEvent.REPLAY_POLL)
        refresh_replayed_lease(t, replay)
        return task_payload(t, leased_row(t, replay), page_size, accept_encoding)
    if _throttled(t, poll):
        return "throttled"
    leased = claim_next(t, poll)
    return None if leased is None else task_payload(t, leased, page_size, accept_encoding)


def refresh_replayed_lease(t: T, task_id: str) -> None:
    """§7.3: a replayed poll refreshes the lease it answers again, attempt unchanged."""
    expires = t.now + t.settings.lease_seconds * US
    t.db.execute("UPDATE workflow_tasks SET lease_expires_at = ? WHERE task_id = ?", (expires, task_id))


def claim_next(t: T, poll: Poll) -> sqlite3.Row | None:
    """Lease the oldest claimable task of the poll's queue to its worker: the task's row as leased, or None."""
    with _candidates(t, poll) as candidates:
        for cand in candidates:
            leased = _lease(t, poll, cand)
            if leased is not None:
                return leased
            # lost the race: not an error, try the next candidate (§7.5)
    return None


def _throttled(t: T, poll: Poll) -> bool:
    """Appendix C's admission limit: at most ``max_active_leases_per_queue`` live leases on the queue."""
    limit = t.settings.max_active_leases_per_queue
    if limit is None:
        return False
    active = t.one(
        "SELECT COUNT(*) AS n FROM workflow_tasks WHERE namespace = ? AND task_queue = ? AND status = 'leased'"
        " AND lease_expires_at > ?",
        poll.namespace,
        poll.queue,
        t.now,
    )
    return active is not None and int(active["n"]) >= limit


# The candidates a claim reads, oldest first. One transaction runs alone, so the first candidate is always leased
# (its conditional write sees the row as the read did); the rest only matter to claims that race. A
# bounded page keeps the cost of a poll independent of the backlog of the queue, and the page is read lazily: a
# claim that leases its first candidate reads one row of each query, not a page of rows it never uses.
_CANDIDATE_PAGE = 16
_CANDIDATE_FILTERS = (
    " AND (compatibility IS NULL OR compatibility = ?)"
    " AND (? = 0 OR workflow_type IN (SELECT value FROM json_each(?)))"
    " ORDER BY available_at, task_id LIMIT ?"
)


def registered_workflow_types(worker: sqlite3.Row) -> str:
    """The workflow types a worker registered, the JSON list as stored: matching leases it only tasks of these
    types (an empty list: any type)."""
    return str(worker["workflow_types"] or "[]")


@contextmanager
def _candidates(t: T, poll: Poll) -> Iterator[Iterator[sqlite3.Row]]:
    """§7.5 matching: the queue's ready tasks and expired leases, compatible with the worker's build id and
    of a workflow type it registered (empty list = all), oldest first.

    Two queries, each on an index of the queue's open tasks (ready ones by ``wt_ready_by_age``, in the order
    returned; leases by ``wt_leased_by_expiry``), merged here: one query with ``OR`` between the two would sort
    every ready task of the queue before the first could be returned."""
    types = registered_workflow_types(poll.worker)
    filters = (poll.worker["build_id"] or "", len(loads(types) or []), types, _CANDIDATE_PAGE)
    ready = t.db.execute(
        "SELECT task_id, status, attempt, available_at FROM workflow_tasks WHERE namespace = ? AND task_queue = ?"
        " AND status = 'ready' AND available_at <= ?" + _CANDIDATE_FILTERS,
        (poll.namespace, poll.queue, t.now, *filters),
    )
    expired = t.db.execute(
        "SELECT task_id, status, attempt, available_at FROM workflow_tasks"
        " WHERE status = 'leased' AND lease_expires_at <= ? AND namespace = ? AND task_queue = ?" + _CANDIDATE_FILTERS,
        (t.now, poll.namespace, poll.queue, *filters),
    )
    try:
        yield oldest_first(ready, expired)
    finally:  # a query read only in part is reset now, not whenever its cursor is collected
        ready.close()
        expired.close()


def oldest_first(ready: Iterator[sqlite3.Row], expired: Iterator[sqlite3.Row]) -> Iterator[sqlite3.Row]:
    """The ready tasks and the expired leases of a queue as one page of candidates, oldest first: an expired
    lease is claimable like a ready task (§9 redelivery)."""
    both = heapq.merge(ready, expired, key=lambda row: (row["available_at"], row["task_id"]))
    return itertools.islice(both, _CANDIDATE_PAGE)


def _lease(t: T, poll: Poll, candidate: sqlite3.Row) -> sqlite3.Row | None:
    """Lease the ``candidate`` task to the poll's worker: the task's row as leased, or None when another claim got
    it first.

    A ready task is claimed; a leased one was found with its lease expired: §9 "On lease expiry: The task goes
    back to `ready` with the **same task_id** … The next poll … leases it with attempt+1" (the lease lapsed,
    is recovered, then claimed). The claim is the conditional write: only the row as the candidate query saw
    it moves.
    """
    task_id, status = str(candidate["task_id"]), TaskStatus(candidate["status"])
    redelivery = status is TaskStatus.LEASED
    if redelivery:
        step(WORKFLOW_TASK_LEASE, step(WORKFLOW_TASK_LEASE, LeaseState.LIVE, LeaseEvent.LAPSE), LeaseEvent.RECOVER)
    step(WORKFLOW_TASK_LEASE, LeaseState.NONE, LeaseEvent.CLAIM)
    # This lease shows every event so far (seen_sequence is the run's last one): a wake deferred during an earlier
    # lease is in its history.
    also = (
        "attempt = attempt + 1, lease_owner = ?, lease_expires_at = ?,"
        " seen_sequence = (SELECT last_sequence FROM runs WHERE runs.run_id = workflow_tasks.run_id),"
        # Only a context holding a deferred resume is parsed and rewritten (nearly every lease leaves it as it is).
        " resume_context = CASE WHEN instr(resume_context, ?) THEN json_remove(resume_context, ?)"
        " ELSE resume_context END"
    )
    args = (
        poll.worker_id,
        t.now + t.settings.lease_seconds * US,
        f'"{DEFERRED_RESUME_KEY}"',
        f"$.{DEFERRED_RESUME_KEY}",
    )
    if claim_lease(t, task_id, status, also, args) is None:
        return None
    if redelivery:
        t.fx.transition("workflow_task", task_id, "leased", "ready", cause="lease_expired")
    t.fx.transition("workflow_task", task_id, "ready", "leased", lease_owner=poll.worker_id)
    task = leased_row(t, task_id)
    # Every lease adds one to the attempt: at 0 the task had none before this one.
    lease_taken(t, poll, task_id, int(task["attempt"]), leased_before=int(candidate["attempt"]) > 0)
    return task


def claim_lease(t: T, task_id: str, status: TaskStatus, also: str, args: tuple[Any, ...]) -> TaskStatus | None:
    """The conditional write of a lease (every lease adds one to the attempt): the state it moved to, or None
    when the task is no longer as the claim read it."""
    return claim(t, WORKFLOW_TASKS, task_id, status, also=also, args=args)


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


def default_history_page_size() -> int:
    """The page size of a history page asked for without one (inline and on the history route), as advertised
    in ``history_page_size_default``."""
    return hist.DEFAULT_PAGE_SIZE


def compression_threshold(t: T) -> int:
    """How many events a page holds before an opted-in page is compressed (the threshold this server advertises)."""
    return hist.COMPRESSION_THRESHOLD


# A leased task's row and what its payload (§8.2) shows of its run, in one read: the task's columns, then the run's
# that the task does not have (its namespace, run_id and workflow_type are the run's, copied when it was created).
# ``cancel_open`` says whether the run has an open cooperative cancellation request, which the payload then shows
# (nearly every run has none, and the flag spares reading it).
_LEASED = (
    "SELECT w.*, r.workflow_id, r.run_number, r.input_blob, r.status AS run_status, r.last_sequence,"
    " EXISTS (SELECT 1 FROM cancellation_requests c WHERE c.run_id = w.run_id AND c.status != 'resolved')"
    " AS cancel_open FROM workflow_tasks w JOIN runs r ON r.run_id = w.run_id WHERE w.task_id = ?"
)


def leased_row(t: T, task_id: str) -> sqlite3.Row:
    row = t.one(_LEASED, task_id)
    assert row is not None, task_id
    return row


def task_payload(t: T, task: sqlite3.Row, page_size: int, accept_encoding: str | None) -> dict[str, Any]:
    """The leased ``task`` (as :data:`_LEASED` reads it) as the task object of §8.2, with the first history page
    inline and the resume context."""
    # One extra row tells the page whether more follow, without counting the whole history.
    events = worker_page(t, task, 0, min(page_size, hist.MAX_PAGE_SIZE) + 1)
    last = int(task["last_sequence"])
    page = hist.paginate(events, 0, page_size)
    body: dict[str, Any] = {
        "task_id": task["task_id"],
        "namespace": task["namespace"],
        "workflow_id": task["workflow_id"],
        "run_id": task["run_id"],
        "workflow_task_attempt": task["attempt"],
        "workflow_type": task["workflow_type"],
        "payload_codec": "avro",
        "arguments": {"codec": "avro", "blob": task["input_blob"]} if task["input_blob"] else None,
        "run_status": task["run_status"],
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
        **hist.compress_page(list(page.events), accept_encoding, compression_threshold(t)),
        **task_resume(task),
    }
    observed = cancellation.observation(t, task["run_id"]) if task["cancel_open"] else None
    if observed is not None:
        # CANCEL-COOPERATIVE-REQUEST: the identity and deadline travel with every task of the child.
        body.update(cancel_requested=True, cancellation_request=observed)
    return body


def worker_page(t: T, task: sqlite3.Row, after: int, limit: int) -> list[dict[str, Any]]:
    """The worker-plane history events of ``task``'s run after ``after`` (the poll's inline page and the
    history route's pages)."""
    return [event_json(r, task["namespace"]) for r in worker_rows(t, task, after, limit)]


def worker_rows(t: T, task: sqlite3.Row, after: int, limit: int) -> list[sqlite3.Row]:
    """The history rows :func:`worker_page` shows: every event of the run, in sequence order."""
    return history_page(t.db, task["run_id"], after, limit)


# -- fencing ---------------------------------------------------------------------------------------------


def task_view(
    t: T, namespace: str, task_id: str
) -> tuple[WorkflowTaskView | None, sqlite3.Row | None, sqlite3.Row | None]:
    task = t.one("SELECT * FROM workflow_tasks WHERE task_id = ? AND namespace = ?", task_id, namespace)
    if task is None:
        return None, None, None
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
    return view, task, run


def guarded_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> tuple[sqlite3.Row, sqlite3.Row]:
    """Validate the fencing fields (422), then apply the §8.9 matrix in order. Returns the task's row and its
    run's, as the guard read them."""
    owner, attempt = cmdmodel.validate_workflow_fence(body)
    view, task, run = task_view(t, namespace, task_id)
    guard_workflow_task(view, task_id=task_id, lease_owner=owner, attempt=attempt, now=from_us(t.now))
    assert task is not None
    assert run is not None
    return task, run


def _fenced_move(t: T, task: sqlite3.Row, event: TaskEvent) -> None:
    """Close the lease the guard saw by ``event`` (complete or fail): the write that decides the race."""
    step(WORKFLOW_TASK_LEASE, LeaseState.LIVE, LeaseEvent.RELEASE)
    moved = move(
        t,
        WORKFLOW_TASKS,
        task["task_id"],
        TaskStatus.LEASED,
        event,
        also="lease_owner = NULL, lease_expires_at = NULL",
        where="lease_owner = ? AND attempt = ? AND lease_expires_at > ?",
        where_args=(task["lease_owner"], task["attempt"], t.now),
    )
    if moved is None:
        raise _lease_changed(task)
    forget_polls(t, "workflow", task["task_id"])


def _lease_changed(task: sqlite3.Row) -> Rejection:
    return Rejection(
        409,
        "task_not_leased",
        "The workflow task lease changed before the write.",
        {"task_id": task["task_id"]},
    )


# -- history, heartbeat ----------------------------------------------------------------------------------


def task_history(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task, run = guarded_task(t, namespace, task_id, body)
    page = history_route_page(t, task, hist.resolve_cursor(body, default_page_size=default_history_page_size()))
    accept = body.get("accept_history_encoding")
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "total_history_events": run["last_sequence"],
        "has_more": page.has_more,
        "next_after_sequence": page.next_after_sequence,
        "next_history_page_token": page.next_history_page_token,
        **hist.compress_page(list(page.events), accept if isinstance(accept, str) else None, compression_threshold(t)),
    }


def history_route_page(t: T, task: sqlite3.Row, cursor: hist.Cursor) -> hist.Page[dict[str, Any]]:
    """The page of ``task``'s history the history route answers at ``cursor`` (§8.5)."""
    events = worker_page(t, task, cursor.after_sequence, min(cursor.page_size, hist.MAX_PAGE_SIZE) + 1)
    return hist.paginate(events, cursor.after_sequence, cursor.page_size)


def heartbeat_workflow_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task, run = guarded_task(t, namespace, task_id, body)
    # §8.6: the new expiry is now + lease duration, set fresh, never added to the old one.
    step(WORKFLOW_TASK_LEASE, LeaseState.LIVE, LeaseEvent.RENEW)
    expires = renewed_expiry(t, task)
    # The write that decides the race: it only touches the lease the guard saw.
    renewed = t.db.execute(
        "UPDATE workflow_tasks SET lease_expires_at = ? WHERE task_id = ? AND status = ? AND lease_owner = ?"
        " AND attempt = ? AND lease_expires_at > ?",
        (expires, task_id, TaskStatus.LEASED, task["lease_owner"], task["attempt"], t.now),
    ).rowcount
    if renewed != 1:
        raise _lease_changed(task)
    return {
        "task_id": task_id,
        "workflow_task_attempt": task["attempt"],
        "lease_owner": task["lease_owner"],
        "renewed": True,
        "lease_expires_at": ts(expires),
        "run_status": run["status"],
        "task_status": TaskStatus.LEASED.value,
        "reason": None,
    }


def renewed_expiry(t: T, task: sqlite3.Row) -> int:
    """A renewed lease's new expiry (µs): now + the lease duration."""
    return t.now + t.settings.lease_seconds * US


# -- fail ------------------------------------------------------------------------------------------------


def fail_workflow_task(t: T, namespace: str, task_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    task, run = guarded_task(t, namespace, task_id, body)
    cmdmodel.validate_workflow_failure(body)
    _fenced_move(t, task, TaskEvent.FAIL)
    # §8.8: a task failure is a replay problem, not a workflow failure; the run stays open. When new
    # history arrived while the task was leased (e.g. the SDK's "waiting for history" report), a fresh
    # task picks it up, so nothing the run is waiting for is lost.
    next_task_id = None
    if int(run["last_sequence"]) > int(task["seen_sequence"] or 0):
        # The failed task handled nothing: its own wake is still the first one to handle.
        next_task_id = create_workflow_task(t, run, task_resume(task))
    elif RUN.can(RunStatus(run["status"]), RunEvent.TASK_FAIL):
        run_event(t, run["run_id"], RunEvent.TASK_FAIL)
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
    task, run = guarded_task(t, namespace, task_id, body)
    run_id = task["run_id"]
    # The run's open updates matter only to a batch that closes one (§8.7.1); most batches close none.
    open_updates: list[str] = []
    if _closes_an_update(body.get("commands")):
        accepted = t.all("SELECT update_id FROM updates WHERE run_id = ? AND status = 'accepted'", run_id)
        open_updates = [r["update_id"] for r in accepted]
    batch = validated_batch(t, task, body.get("commands"), open_updates)
    check_storable_durations(batch)
    _fenced_move(t, task, TaskEvent.COMPLETE)
    # Decided rule (README): a follow-up replay is owed only for an event that woke the run during the lease
    # (engine.wake_run records it as the deferred resume); heartbeats and ActivityStarted wake nothing. Nothing
    # since the guard wrote the run, so its row as the guard read it is current.
    new_events_arrived = int(run["last_sequence"]) > int(task["seen_sequence"] or 0)
    new_events_arrived = new_events_arrived and deferred_resume(task) is not None
    created: list[str] = []
    # Python SDK 2.12.0, Replay: an open wait that this batch does not re-emit (same key and fingerprint) was
    # satisfied by the history the task replayed — before anything the batch schedules after it in workflow
    # code. Record that first, so ConditionWaitSatisfied precedes the events of the following commands.
    satisfy_moved_past_waits(t, run_id, batch, task_id)
    for command in cmdmodel.apply_order(batch):
        apply_command(t, task, command, created)
    run = t.run(run_id)
    if run["status"] not in TERMINAL_RUN_STATUSES:
        _after_open_batch(t, task, run, new_events_arrived, created)
        run = t.run(run_id)
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


def validated_batch(t: T, task: sqlite3.Row, commands: Any, open_updates: list[str]) -> list[cmdmodel.Command]:
    """The batch ``commands`` as sent, validated as a whole (§8.7: one invalid command rejects the batch)."""
    return cmdmodel.validate_batch(commands, open_update_ids=open_updates, optional_types=IMPLEMENTED_OPTIONAL_COMMANDS)


def _closes_an_update(commands: object) -> bool:
    """Whether a batch, as sent, holds a command that closes an update (valid or not: validation decides)."""
    return isinstance(commands, list) and any(
        isinstance(c, dict) and c.get("type") in cmdmodel.UPDATE_CLOSING_TYPES for c in commands
    )


def _after_open_batch(t: T, task: sqlite3.Row, run: sqlite3.Row, new_events_arrived: bool, created: list[str]) -> None:
    """The run after a batch without a terminal command: §8.7 "the run becomes `waiting`", unless history
    arrived during the lease, which the follow-up task must show (§8.3: it names the first wake that arrived
    during the lease, engine.defer_resume, not this task's own; events that woke nothing give a plain replay).
    §9.1: "pending" is "first workflow task not yet completed" — it was just completed."""
    if new_events_arrived:
        created.append(create_workflow_task(t, run, deferred_resume(task) or empty_resume()))
        run_event(t, run["run_id"], RunEvent.BATCH_OPEN_WAITS, RunEvent.WAKE)
    else:
        run_event(t, run["run_id"], RunEvent.BATCH_OPEN_WAITS)
