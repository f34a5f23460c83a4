"""The durable core: runs, history and workflow tasks, run close and children.

Every public function here takes a :class:`~reference_server.tx.T` (one open transaction), so a route
composes several steps into one atomic state change. Every status change goes through
:mod:`reference_server.transitions`, so the model's lifecycle tables decide it.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping
from typing import Any

from suite.protocol.codec import decode_blob, value_to_json
from suite.protocol.fencing import rfc3339
from suite.protocol.lifecycles import (
    RUN,
    RUN_TERMINAL_STATUSES,
    WORKFLOW_TASK_LEASE,
    ChildEvent,
    ChildStatus,
    LeaseEvent,
    RunEvent,
    RunStatus,
    TaskStatus,
    lease_state_at,
)
from suite.protocol.payloads import RESUME_CONTEXT_KEYS

from .store import dumps, from_us, loads, new_id
from .transitions import (
    CHILDREN,
    RUNS,
    WORKFLOW_TASKS,
    initial,
    move,
    step,
)
from .tx import T

__all__ = [
    "DEFERRED_RESUME_KEY",
    "RESUME_KEYS",
    "TERMINAL_RUN_STATUSES",
    "append_event",
    "child_execution_deadline",
    "create_workflow_task",
    "defer_resume",
    "deferred_resume",
    "describe_run",
    "empty_resume",
    "event_json",
    "history_page",
    "json_view",
    "next_step",
    "open_workflow_task",
    "record_wake",
    "release_leases",
    "run_deadline",
    "run_event",
    "start_child_run",
    "start_run",
    "task_resume",
    "ts",
    "wake_run",
]

# docs/reference.md: Payload shape: all 20 resume-context keys are always present on a leased workflow task.
RESUME_KEYS: tuple[str, ...] = RESUME_CONTEXT_KEYS

TERMINAL_RUN_STATUSES: frozenset[RunStatus] = RUN_TERMINAL_STATUSES
"""The model's terminal run statuses (``StrEnum`` members compare equal to the stored text)."""


def empty_resume(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(RESUME_KEYS)
    for key, value in values.items():
        assert key in out, key
        out[key] = value
    return out


def json_view(blob: str | None) -> Any:
    """The JSON view of a stored Avro blob (``None`` when there is none or it does not decode)."""
    if blob is None:
        return None
    try:
        return value_to_json(decode_blob(blob))
    except Exception:  # a stored blob that does not decode has no view; describe must still answer
        return None


def ts(us: int | None) -> str | None:
    """``us`` (microseconds since the epoch) as :func:`rfc3339` writes it. The date and time of day are formatted
    once per second (a poll answer shows three or more instants, mostly of the same second or two); only the
    microseconds are formatted each time."""
    if us is None:
        return None
    seconds, micro = divmod(us, 1_000_000)
    return f"{_second(seconds)}.{micro:06d}Z"


@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of the whole second ``seconds``: :func:`rfc3339` without ``.ffffffZ``."""
    return rfc3339(from_us(seconds * 1_000_000))[:-8]


# -- history ---------------------------------------------------------------------------------------------


def append_event(
    t: T,
    run_id: str,
    event_type: str,
    payload: Mapping[str, Any],
    *,
    workflow_task_id: str | None = None,
    workflow_command_id: str | None = None,
) -> int:
    """Append one event; sequences start at 1 and increase by exactly 1 (§8.2)."""
    # The run's counter moves and answers its new value in one statement; the event takes that sequence in the same
    # transaction, so the counter and the history never disagree.
    row = t.one("UPDATE runs SET last_sequence = last_sequence + 1 WHERE run_id = ? RETURNING last_sequence", run_id)
    assert row is not None, run_id
    seq = int(row["last_sequence"])
    t.db.execute(
        "INSERT INTO history (run_id, sequence, event_id, event_type, payload, workflow_task_id,"
        " workflow_command_id, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            seq,
            new_id(t.now),
            event_type,
            dumps(dict(payload)),
            workflow_task_id,
            workflow_command_id,
            t.now,
        ),
    )
    t.fx.run_changed.add(run_id)
    return seq


def record_wake(t: T, run_id: str, event_type: str, payload: Mapping[str, Any], **resume: Any) -> int:
    """Append the event that wakes the run, then wake it with a resume context naming that event (§8.3)."""
    seq = append_event(t, run_id, event_type, payload)
    wake_run(t, run_id, empty_resume(workflow_sequence=seq, workflow_event_type=event_type, **resume))
    return seq


def next_step(t: T, run_id: str) -> int:
    """The per-run step sequence stamped on every event of one step command (Python SDK 2.12.0, Replay)."""
    row = t.run(run_id)
    step = int(row["step_sequence"]) + 1
    t.db.execute("UPDATE runs SET step_sequence = ? WHERE run_id = ?", (step, run_id))
    return step


def event_json(row: sqlite3.Row, namespace: str | None) -> dict[str, Any]:
    """The worker-plane history event object (§8.2)."""
    recorded_at = ts(row["recorded_at"])
    return {
        "id": row["event_id"],
        "sequence": row["sequence"],
        "event_type": row["event_type"],
        "namespace": namespace,
        "payload": loads(row["payload"]),
        "workflow_task_id": row["workflow_task_id"],
        "workflow_command_id": row["workflow_command_id"],
        "recorded_at": recorded_at,
        "timestamp": recorded_at,
    }


def history_page(db: sqlite3.Connection, run_id: str, after_sequence: int, limit: int) -> list[sqlite3.Row]:
    # §8.4 bounds after_sequence only below (int ≥0); past int64 it is past every event, and SQLite cannot
    # bind it (that was a 500), so it is clamped: the page is empty, as it would be anyway.
    after_sequence = min(after_sequence, 2**63 - 1)
    return list(
        db.execute(
            "SELECT * FROM history WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
            (run_id, after_sequence, limit),
        ).fetchall()
    )


# -- workflow tasks --------------------------------------------------------------------------------------


def open_workflow_task(t: T, run_id: str) -> sqlite3.Row | None:
    """The run's open (ready or leased) workflow task, if any. A run has at most one, and a task is only created
    when the run has none open (:func:`wake_run`, a completion or a failure creating the follow-up after closing
    its own task), so the open one is always the run's newest: one index entry is read, however many tasks the
    run has had (``wt_of_run``; rowids only grow, since tasks are never deleted)."""
    newest = t.one("SELECT * FROM workflow_tasks WHERE run_id = ? ORDER BY rowid DESC LIMIT 1", run_id)
    return newest if newest is not None and newest["status"] in _OPEN_TASK_STATUSES else None


_OPEN_TASK_STATUSES = frozenset({TaskStatus.READY.value, TaskStatus.LEASED.value})


def wake_run(t: T, run_id: str, resume: Mapping[str, Any] | None = None, *, available_at: int | None = None) -> None:
    """Make sure the run has a workflow task to process new history.

    At most one open task per run (Python SDK 2.12.0, Replay): a ready task simply sees the new events; a leased
    task's completion notices history grew past what it was shown (``seen_sequence``) and creates the
    follow-up task then.
    """
    run = t.run(run_id)
    if run["status"] in TERMINAL_RUN_STATUSES:
        return
    task = open_workflow_task(t, run_id)
    if task is not None:
        if task["status"] == "leased":
            defer_resume(t, task, resume or empty_resume())
        return
    create_workflow_task(t, run, resume or empty_resume(), available_at=available_at)


# §8.3: a resume context "names what woke the task". An event that wakes a run while its task is leased cannot
# wake that task (it is out with a worker); it wakes the follow-up task the completion creates. Its resume
# context is kept in the leased task's durable resume_context JSON under this key until then — the first
# such event only, so the follow-up names the first wake it must handle. Without it the follow-up reused the
# leased task's own context, naming again (e.g.) a signal or update the completed task had already handled.
# The next claim of the task (a redelivery) removes it: that lease's history already shows those events.
DEFERRED_RESUME_KEY = "deferred_resume"


def defer_resume(t: T, task: sqlite3.Row, resume: Mapping[str, Any]) -> None:
    ctx = loads(task["resume_context"]) or {}
    if ctx.get(DEFERRED_RESUME_KEY) is None:
        ctx[DEFERRED_RESUME_KEY] = dict(resume)
        t.db.execute("UPDATE workflow_tasks SET resume_context = ? WHERE task_id = ?", (dumps(ctx), task["task_id"]))


def task_resume(task: sqlite3.Row) -> dict[str, Any]:
    """The 20 resume-context keys of a task (§8.3), without the deferred follow-up context."""
    ctx = loads(task["resume_context"]) or {}
    return {key: ctx.get(key) for key in RESUME_KEYS}


def deferred_resume(task: sqlite3.Row) -> dict[str, Any] | None:
    """The resume context of the first wake that arrived while ``task`` was leased, if any."""
    deferred = (loads(task["resume_context"]) or {}).get(DEFERRED_RESUME_KEY)
    return None if deferred is None else {key: deferred.get(key) for key in RESUME_KEYS}


def create_workflow_task(t: T, run: sqlite3.Row, resume: Mapping[str, Any], *, available_at: int | None = None) -> str:
    task_id = new_id(t.now)
    t.db.execute(
        "INSERT INTO workflow_tasks (task_id, namespace, run_id, task_queue, workflow_type, compatibility, status,"
        " attempt, available_at, created_at, resume_context) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        (
            task_id,
            run["namespace"],
            run["run_id"],
            run["task_queue"],
            run["workflow_type"],
            run["compatibility"],
            initial(WORKFLOW_TASKS),
            available_at if available_at is not None else t.now,
            t.now,
            dumps(dict(resume)),
        ),
    )
    # §9.1: a new workflow task wakes the run (waiting → running; pending and running stay as they are).
    run_event(t, run["run_id"], RunEvent.WAKE)
    t.fx.wake.add(("workflow", run["namespace"], run["task_queue"]))
    t.fx.transition("workflow_task", task_id, None, initial(WORKFLOW_TASKS), run_id=run["run_id"])
    return task_id


def release_leases(t: T, where: str, args: tuple[Any, ...]) -> None:
    """The leases of the leased workflow tasks matching ``where`` end, live or lapsed (the lease machine's
    RELEASE); the caller moves the tasks themselves. A lease is two columns, not a status: nothing to write."""
    now = from_us(t.now)
    for leased in t.all(f"SELECT lease_expires_at FROM workflow_tasks WHERE status = 'leased' AND {where}", *args):
        expires = leased["lease_expires_at"]
        state = lease_state_at(None if expires is None else from_us(expires), now)
        step(WORKFLOW_TASK_LEASE, state, LeaseEvent.RELEASE)


def run_event(t: T, run_id: str, *events: RunEvent) -> RunStatus:
    """Walk the run through ``events`` by the RUN table and write where it ends (one observed transition)."""
    old = RunStatus(t.run(run_id)["status"])
    new = old
    for event in events:
        new = step(RUN, new, event)
    if new != old:
        t.db.execute("UPDATE runs SET status = ? WHERE run_id = ? AND status = ?", (new.value, run_id, old.value))
        t.fx.transition("run", run_id, old.value, new.value)
        t.fx.run_changed.add(run_id)
    return new


# -- runs ------------------------------------------------------------------------------------------------


def start_run(
    t: T,
    *,
    namespace: str,
    workflow_id: str,
    workflow_type: str,
    task_queue: str,
    input_blob: str | None,
    run_number: int = 1,
    first_run_id: str | None = None,
    memo: Mapping[str, Any] | None = None,
    search_attributes: Mapping[str, Any] | None = None,
    business_key: str | None = None,
    execution_timeout_seconds: int | None = None,
    run_timeout_seconds: int | None = None,
    execution_deadline: int | None = None,
    parent_run_id: str | None = None,
    parent_child_call_id: str | None = None,
    compatibility: str | None = None,
    extra_started: Mapping[str, Any] | None = None,
) -> str:
    """Create a run, its first history and its first workflow task (all resume keys null, §8.3)."""
    run_id = new_id(t.now)
    if execution_deadline is None and execution_timeout_seconds:
        execution_deadline = t.now + execution_timeout_seconds * 1_000_000
    t.db.execute(
        "UPDATE runs SET is_current = 0 WHERE namespace = ? AND workflow_id = ? AND is_current = 1",
        (namespace, workflow_id),
    )
    t.db.execute(
        "INSERT INTO runs (run_id, namespace, workflow_id, run_number, workflow_type, task_queue, status,"
        " is_current, input_blob, memo, search_attributes, business_key, execution_timeout_seconds,"
        " run_timeout_seconds, run_deadline, execution_deadline, compatibility, started_at, parent_run_id,"
        " parent_child_call_id, first_run_id)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            namespace,
            workflow_id,
            run_number,
            workflow_type,
            task_queue,
            initial(RUNS),
            input_blob,
            dumps(dict(memo or {})),
            dumps(dict(search_attributes or {})),
            business_key,
            execution_timeout_seconds,
            run_timeout_seconds,
            run_deadline(t.now, run_timeout_seconds, execution_deadline),
            execution_deadline,
            compatibility,
            t.now,
            parent_run_id,
            parent_child_call_id,
            first_run_id or run_id,
        ),
    )
    t.fx.transition("run", run_id, None, initial(RUNS), workflow_id=workflow_id)
    common = {"workflow_id": workflow_id, "workflow_type": workflow_type, "task_queue": task_queue}
    append_event(t, run_id, "StartAccepted", {**common, "run_id": run_id})
    append_event(
        t,
        run_id,
        "WorkflowStarted",
        {
            **common,
            "run_id": run_id,
            "run_number": run_number,
            "arguments": input_blob,
            "payload_codec": "avro",
            "timestamp": ts(t.now),
            **dict(extra_started or {}),
        },
    )
    create_workflow_task(t, t.run(run_id), empty_resume())
    return run_id


def run_deadline(now: int, run_timeout_seconds: int | None, execution_deadline: int | None) -> int | None:
    """When a run started at ``now`` times out: after its own run_timeout_seconds, and never past the deadline
    of its execution (§8.7.1, §12.1), which the scheduler's one deadline pass then enforces as well."""
    deadlines = [now + run_timeout_seconds * 1_000_000] if run_timeout_seconds else []
    if execution_deadline:
        deadlines.append(execution_deadline)
    return min(deadlines, default=None)


def child_execution_deadline(t: T, call: sqlite3.Row) -> int | None:
    """The execution deadline of a child's next run: a retry keeps the deadline its first run started
    (execution_timeout_seconds bounds the whole child, its retries too); a first run starts its own."""
    if not call["current_run_id"]:
        return None
    previous = t.one("SELECT execution_deadline FROM runs WHERE run_id = ?", call["current_run_id"])
    return int(previous["execution_deadline"]) if previous and previous["execution_deadline"] else None


def start_child_run(t: T, call: sqlite3.Row, parent: sqlite3.Row) -> str:
    child_run_id = start_run(
        t,
        namespace=parent["namespace"],
        workflow_id=call["child_workflow_id"],
        workflow_type=call["workflow_type"],
        task_queue=call["task_queue"],
        input_blob=call["arguments_blob"],
        run_number=int(call["attempt"]),
        execution_timeout_seconds=call["execution_timeout_seconds"],
        run_timeout_seconds=call["run_timeout_seconds"],
        execution_deadline=child_execution_deadline(t, call),
        parent_run_id=parent["run_id"],
        parent_child_call_id=call["child_call_id"],
        extra_started={"parent_workflow_id": parent["workflow_id"], "parent_run_id": parent["run_id"]},
    )
    if call["status"] == ChildStatus.BACKOFF:
        also = "current_run_id = ?, retry_at = NULL"
        move(
            t,
            CHILDREN,
            call["child_call_id"],
            ChildStatus.BACKOFF,
            ChildEvent.RESTART,
            also=also,
            args=(child_run_id,),
            quiet=True,
        )
    else:
        t.db.execute(
            "UPDATE children SET current_run_id = ?, retry_at = NULL WHERE child_call_id = ?",
            (child_run_id, call["child_call_id"]),
        )
    append_event(
        t,
        parent["run_id"],
        "ChildRunStarted",
        {
            "sequence": call["step_sequence"],
            "child_call_id": call["child_call_id"],
            "child_workflow_id": call["child_workflow_id"],
            "child_workflow_run_id": child_run_id,
            "attempt": call["attempt"],
        },
    )
    return child_run_id


def describe_run(t_db: sqlite3.Connection, run: sqlite3.Row) -> dict[str, Any]:
    """The control-plane describe document (§12.3)."""
    run_count = t_db.execute(
        "SELECT COUNT(*) FROM runs WHERE namespace = ? AND workflow_id = ?",
        (run["namespace"], run["workflow_id"]),
    ).fetchone()[0]
    status = run["status"]
    terminal = status in TERMINAL_RUN_STATUSES
    return {
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "namespace": run["namespace"],
        "workflow_type": run["workflow_type"],
        "status": status,
        "status_bucket": "closed" if terminal else "running",
        "is_terminal": terminal,
        "closed_reason": run["closed_reason"],
        "task_queue": run["task_queue"],
        "run_number": run["run_number"],
        "run_count": run_count,
        "is_current_run": bool(run["is_current"]),
        "payload_codec": "avro",
        "business_key": run["business_key"],
        "execution_timeout_seconds": run["execution_timeout_seconds"],
        "run_timeout_seconds": run["run_timeout_seconds"],
        "input": json_view(run["input_blob"]),
        "output": json_view(run["output_blob"]),
        "input_envelope": {"codec": "avro", "blob": run["input_blob"]} if run["input_blob"] else None,
        "output_envelope": {"codec": "avro", "blob": run["output_blob"]} if run["output_blob"] else None,
        "failure": loads(run["failure"]),
        "started_at": ts(run["started_at"]),
        "closed_at": ts(run["closed_at"]),
        "memo": loads(run["memo"]),
        "search_attributes": loads(run["search_attributes"]),
        "last_history_sequence": run["last_sequence"],
        "actions": {
            "can_signal": not terminal,
            # Decided rule (docs/reference-server.md): closed runs answer queries (replayed from history).
            "can_query": True,
            "can_update": not terminal,
            "can_cancel": not terminal,
            "can_terminate": not terminal,
        },
    }
