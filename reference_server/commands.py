"""The commands of a completed workflow-task batch (§8.7.1): one handler per command type, in a table.

:func:`complete_workflow_task <reference_server.workflow_tasks.complete_workflow_task>` validates the whole
batch with the model (``suite.protocol.commands.validate_batch``) before anything is written, then applies
the non-terminal commands in order and the terminal one last, all in its one transaction. A handler only
writes: every check it could fail was made by the model, so a batch is applied whole or not at all.
Every event a command records carries the task's id and a ``workflow_command_id`` of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from suite.protocol import commands as cmdmodel
from suite.protocol.lifecycles import ConditionWaitEvent, RunEvent, TimerEvent, UpdateEvent, UpdateStatus

from . import sessions
from .app import validation_error
from .closing import close_run
from .engine import append_event, next_step, open_workflow_task, start_child_run, start_run, ts
from .store import dumps, loads, new_id
from .transitions import (
    ACTIVITY_EXECUTIONS,
    ACTIVITY_TASKS,
    CHILDREN,
    CONDITION_WAITS,
    TIMERS,
    UPDATES,
    initial,
    move,
    move_all,
)
from .tx import T

__all__ = [
    "HANDLERS",
    "IMPLEMENTED_OPTIONAL_COMMANDS",
    "MAX_DURATION_SECONDS",
    "apply_command",
    "check_storable_durations",
    "satisfy_moved_past_waits",
]

# §5.2: the optional command types this server implements (see :func:`_open_condition_wait`). The same tuple
# is advertised in `supported_workflow_task_commands` and accepted by `validate_batch`, so advertisement and
# acceptance cannot drift apart. The official Python SDK emits `open_condition_wait` for every
# `ctx.wait_condition(...)` (Python SDK 2.12.0, Worker handshake).
IMPLEMENTED_OPTIONAL_COMMANDS: tuple[str, ...] = ("open_condition_wait",)

US = 1_000_000


@dataclass(frozen=True)
class Applying:
    """One command of a batch being applied: the transaction, the completing task, its run, and what the
    batch created so far (returned as ``created_task_ids``)."""

    t: T
    task: sqlite3.Row
    run_id: str
    created: list[str]
    command_id: str

    @cached_property
    def run(self) -> sqlite3.Row:
        """The run's row as this command found it (every handler reads it before writing; read when first used,
        so a command that only needs the id does not read it)."""
        return self.t.run(self.run_id)

    def record(self, event_type: str, payload: Mapping[str, Any]) -> int:
        """Append one event of this command (§8.2: stamped with the task and command ids)."""
        return append_event(
            self.t,
            self.run_id,
            event_type,
            payload,
            workflow_task_id=self.task["task_id"],
            workflow_command_id=self.command_id,
        )

    def next_step(self) -> int:
        return next_step(self.t, self.run_id)


Handler = Callable[[Applying, Mapping[str, Any]], None]


def apply_command(t: T, task: sqlite3.Row, command: cmdmodel.Command, created: list[str]) -> None:
    """Apply one validated command of ``task``'s batch."""
    applying = Applying(t, task, str(task["run_id"]), created, new_id(t.now))
    HANDLERS[command.type](applying, command.fields)


# This server keeps instants as int64 microseconds (store.py), so "now + duration" must fit in 2**63 µs.
# The spec bounds durations only below ("ints ≥1"); a larger one used to reach SQLite and fail there with a
# 500, which §14.1 forbids ("never return 5xx. Either 422 or ignored"). The cap is 10,000 years, the range of
# a protobuf Duration: far beyond any real timeout, far below the overflow.
MAX_DURATION_SECONDS = 315_576_000_000
_DURATION_FIELDS = (
    "delay_seconds",  # start_timer
    "timeout_seconds",  # open_condition_wait
    *cmdmodel.ACTIVITY_TIMEOUTS,
    *cmdmodel.CHILD_TIMEOUTS,
)


def check_storable_durations(batch: list[cmdmodel.Command]) -> None:
    """422 for a duration (or retry backoff) of a validated batch that this server cannot store."""
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


# -- non-terminal commands ---------------------------------------------------------------------------------


def _schedule_activity(a: Applying, f: Mapping[str, Any]) -> None:
    """§8.7.1 / §11.1: one execution, its first ready task, ``ActivityScheduled`` with the policy snapshot."""
    t, run = a.t, a.run
    step = a.next_step()
    execution_id = new_id(t.now)
    activity_task_id = new_id(t.now)
    # SESSION-ROUTING: the command's queue, else the session's, else the run's.
    queue = f.get("queue") or sessions.session_queue(f.get("worker_session")) or run["task_queue"]
    policy = f.get("retry_policy") or None
    snapshot = _policy_snapshot(f, policy)
    _insert_activity(a, f, step, execution_id, activity_task_id, queue, snapshot)
    session = sessions.on_schedule(t, run["namespace"], execution_id, activity_task_id, f.get("worker_session"))
    a.record(
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
    )
    a.created.append(activity_task_id)
    t.fx.wake.add(("activity", run["namespace"], queue))
    t.fx.transition("activity_task", activity_task_id, None, initial(ACTIVITY_TASKS), run_id=a.run_id)


def _policy_snapshot(f: Mapping[str, Any], policy: Mapping[str, Any] | None) -> dict[str, Any]:
    """The retry policy and timeouts as scheduled (§11.1 ``retry_policy``): what every attempt is held to."""
    # A null retry_policy field means "absent" (suite.protocol.commands accepts it as such): `.get(k, [])`
    # returned the null and list(None) answered 500 (found by the OpenAPI fuzz, suite/fuzz.py).
    return {
        "snapshot_version": 1,
        "max_attempts": (policy or {}).get("max_attempts") or 1,
        "backoff_seconds": list((policy or {}).get("backoff_seconds") or []),
        "non_retryable_error_types": list((policy or {}).get("non_retryable_error_types") or []),
        **{name: f.get(name) for name in cmdmodel.ACTIVITY_TIMEOUTS},
    }


def _insert_activity(
    a: Applying,
    f: Mapping[str, Any],
    step: int,
    execution_id: str,
    activity_task_id: str,
    queue: str,
    snapshot: Mapping[str, Any],
) -> None:
    """The execution row and its first ready task row (deadlines from the scheduling instant)."""
    t, run = a.t, a.run
    s2c = f.get("schedule_to_close_timeout")
    s2s = f.get("schedule_to_start_timeout")
    t.db.execute(
        "INSERT INTO activity_executions (execution_id, namespace, run_id, step_sequence, activity_type,"
        " task_queue, connection, arguments_blob, retry_policy, start_to_close_timeout,"
        " schedule_to_start_timeout, schedule_to_close_timeout, heartbeat_timeout, status, attempt_count,"
        " scheduled_at, schedule_to_close_deadline, current_task_id)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        (
            execution_id,
            run["namespace"],
            a.run_id,
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
            initial(ACTIVITY_EXECUTIONS),
            t.now,
            t.now + s2c * US if s2c else None,
            activity_task_id,
        ),
    )
    t.db.execute(
        "INSERT INTO activity_tasks (task_id, namespace, execution_id, run_id, task_queue, activity_type,"
        " compatibility, status, available_at, created_at, schedule_to_start_deadline)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            activity_task_id,
            run["namespace"],
            execution_id,
            a.run_id,
            queue,
            f["activity_type"],
            run["compatibility"],
            initial(ACTIVITY_TASKS),
            t.now,
            t.now,
            t.now + s2s * US if s2s else None,
        ),
    )


def _start_timer(a: Applying, f: Mapping[str, Any]) -> None:
    step = a.next_step()
    delay = int(f["delay_seconds"])
    a.created.append(_timer(a, step, delay, "sleep"))


def _timer(a: Applying, step: int, delay: int, kind: str, condition_wait_id: str | None = None) -> str:
    """A pending timer of this step and its ``TimerScheduled`` (a sleep, or a condition wait's timeout)."""
    t = a.t
    timer_id = new_id(t.now)
    fire_at = t.now + delay * US
    t.db.execute(
        "INSERT INTO timers (timer_id, run_id, step_sequence, delay_seconds, fire_at, status, timer_kind,"
        " condition_wait_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (timer_id, a.run_id, step, delay, fire_at, initial(TIMERS), kind, condition_wait_id),
    )
    wait = {} if condition_wait_id is None else {"condition_wait_id": condition_wait_id}
    a.record(
        "TimerScheduled",
        {"sequence": step, "timer_id": timer_id, "delay_seconds": delay, "fire_at": ts(fire_at), "timer_kind": kind}
        | wait,
    )
    return timer_id


def _open_condition_wait(a: Applying, f: Mapping[str, Any]) -> None:
    """``open_condition_wait`` (Python SDK 2.12.0, Replay): re-emitting an open wait with the same key and
    fingerprint re-opens it (no new event); a wait the worker stopped re-emitting was satisfied, which
    the completion records before applying the batch (:func:`satisfy_moved_past_waits`)."""
    t = a.t
    key = f.get("condition_key")
    fingerprint = f.get("condition_definition_fingerprint")
    existing = t.one(
        "SELECT * FROM condition_waits WHERE run_id = ? AND status = 'open' AND condition_key IS ?"
        " AND fingerprint IS ?",
        a.run_id,
        key,
        fingerprint,
    )
    if existing is not None:
        return
    step = a.next_step()
    wait_id = new_id(t.now)
    timeout = f.get("timeout_seconds")
    timer_id = None
    a.record(
        "ConditionWaitOpened",
        {
            "sequence": step,
            "condition_wait_id": wait_id,
            "condition_key": key,
            "condition_definition_fingerprint": fingerprint,
            "timeout_seconds": timeout,
        },
    )
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout >= 0:
        timer_id = _timer(a, step, timeout, "condition_timeout", wait_id)
        a.created.append(timer_id)
    t.db.execute(
        "INSERT INTO condition_waits (condition_wait_id, run_id, condition_key, fingerprint, step_sequence,"
        " timeout_seconds, timer_id, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (wait_id, a.run_id, key, fingerprint, step, timeout, timer_id, initial(CONDITION_WAITS)),
    )


def omitted_parent_close_policy() -> str:
    """The parent-close policy a child started without one is recorded with: abandon."""
    return cmdmodel.DEFAULT_PARENT_CLOSE_POLICY


def _start_child_workflow(a: Applying, f: Mapping[str, Any]) -> None:
    t, run = a.t, a.run
    step = a.next_step()
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
    close_policy = f.get("parent_close_policy") or omitted_parent_close_policy()
    cancellation_policy = f.get("cancellation_policy")
    if not isinstance(cancellation_policy, str) or not cancellation_policy:
        cancellation_policy = cmdmodel.DEFAULT_CHILD_CANCELLATION_POLICY
    t.db.execute(
        "INSERT INTO children (child_call_id, parent_run_id, step_sequence, workflow_type, child_workflow_id,"
        " task_queue, arguments_blob, parent_close_policy, retry_policy, execution_timeout_seconds,"
        " run_timeout_seconds, attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
        (
            call_id,
            a.run_id,
            step,
            f["workflow_type"],
            child_workflow_id,
            f.get("queue") or run["task_queue"],
            _blob(f.get("arguments")),
            close_policy,
            dumps(policy) if policy else None,
            f.get("execution_timeout_seconds"),
            f.get("run_timeout_seconds"),
            initial(CHILDREN),
        ),
    )
    a.record(
        "ChildWorkflowScheduled",
        {
            "sequence": step,
            "child_call_id": call_id,
            "child_workflow_id": child_workflow_id,
            "workflow_type": f["workflow_type"],
            "parent_close_policy": close_policy,
            "cancellation_policy": cancellation_policy,
            "retry_policy": policy,
        },
    )
    call = t.one("SELECT * FROM children WHERE child_call_id = ?", call_id)
    assert call is not None
    a.created.append(first_task_of(t, start_child_run(t, call, t.run(a.run_id))))


def _close_update(event: UpdateEvent) -> Handler:
    """``complete_update`` / ``fail_update`` (§12.2): the accepted update closes, ``UpdateApplied`` and
    ``UpdateCompleted`` record it (the model checked it is accepted and open on the run)."""
    completed = event is UpdateEvent.COMPLETE

    def close(a: Applying, f: Mapping[str, Any]) -> None:
        update_id = f["update_id"]
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
        also, args = (
            "result_blob = ?, failure = ?, closed_at = ?",
            (result_blob, dumps(failure) if failure else None, a.t.now),
        )
        move(a.t, UPDATES, update_id, UpdateStatus.ACCEPTED, event, also=also, args=args, quiet=True)
        a.record("UpdateApplied", {"update_id": update_id})
        a.record(
            "UpdateCompleted",
            {
                "update_id": update_id,
                "outcome": "completed" if completed else "failed",
                "result": result_blob,
                "payload_codec": "avro",
                "failure": failure,
            },
        )

    return close


def _record_side_effect(a: Applying, f: Mapping[str, Any]) -> None:
    step = a.next_step()
    a.record("SideEffectRecorded", {"sequence": step, "result": _blob(f.get("result")), "payload_codec": "avro"})


def _record_version_marker(a: Applying, f: Mapping[str, Any]) -> None:
    step = a.next_step()
    marker = {key: f[key] for key in ("change_id", "version", "min_supported", "max_supported")}
    a.record("VersionMarkerRecorded", {"sequence": step, **marker})


def _upsert_search_attributes(a: Applying, f: Mapping[str, Any]) -> None:
    current = merged_search_attributes(loads(a.run["search_attributes"]) or {}, dict(f["attributes"]))
    a.t.db.execute("UPDATE runs SET search_attributes = ? WHERE run_id = ?", (dumps(current), a.run_id))
    a.record("SearchAttributesUpserted", {"attributes": f["attributes"], "attribute_types": f.get("attribute_types")})


def merged_search_attributes(current: Mapping[str, Any], upserted: Mapping[str, Any]) -> dict[str, Any]:
    """The run's search attributes after an upsert, as describe shows them: each key set to its value, and a key
    upserted null deleted (§8.7.1)."""
    merged = dict(current)
    for key, value in upserted.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


# -- terminal commands (applied last, §8.7) ------------------------------------------------------------------


def _complete_workflow(a: Applying, f: Mapping[str, Any]) -> None:
    blob = _blob(f.get("result"))
    close_run(
        a.t,
        a.run_id,
        RunEvent.BATCH_COMPLETE,
        event_type="WorkflowCompleted",
        payload={"output": blob, "result": {"codec": "avro", "blob": blob} if blob else None, "payload_codec": "avro"},
        output_blob=blob,
        workflow_task_id=a.task["task_id"],
    )


def _fail_workflow(a: Applying, f: Mapping[str, Any]) -> None:
    failure = {
        "message": f["message"],
        "exception_class": f.get("exception_class"),
        "exception_type": f.get("exception_type"),
        "exception": f.get("exception"),
        "non_retryable": bool(f.get("non_retryable", False)),
    }
    close_run(
        a.t,
        a.run_id,
        RunEvent.BATCH_FAIL,
        event_type="WorkflowFailed",
        payload=failure,
        failure=failure,
        workflow_task_id=a.task["task_id"],
    )


def _continue_as_new(a: Applying, f: Mapping[str, Any]) -> None:
    """§8.7.1: the run closes as completed (``continued``) and the next run of the workflow starts with
    the same memo, search attributes, business key, timeouts, parent and compatibility marker."""
    t, run = a.t, a.run
    workflow_type, blob = continued_as(run, f)
    queue = f.get("queue") or run["task_queue"]
    close_run(
        t,
        a.run_id,
        RunEvent.BATCH_CONTINUE_AS_NEW,
        event_type="WorkflowContinuedAsNew",
        payload={"workflow_type": workflow_type, "task_queue": queue, "arguments": blob, "payload_codec": "avro"},
        workflow_task_id=a.task["task_id"],
    )
    carried = (
        "first_run_id",
        "business_key",
        "execution_timeout_seconds",
        "run_timeout_seconds",
        "execution_deadline",
        "parent_run_id",
        "parent_child_call_id",
        "compatibility",
    )
    new_run_id = start_run(
        t,
        namespace=run["namespace"],
        workflow_id=run["workflow_id"],
        workflow_type=workflow_type,
        task_queue=queue,
        input_blob=blob,
        run_number=int(run["run_number"]) + 1,
        memo=loads(run["memo"]),
        search_attributes=loads(run["search_attributes"]),
        extra_started={"continued_from_run_id": a.run_id},
        **{name: run[name] for name in carried},
    )
    if run["parent_child_call_id"]:
        t.db.execute(
            "UPDATE children SET current_run_id = ? WHERE child_call_id = ?",
            (new_run_id, run["parent_child_call_id"]),
        )
    t.db.execute("UPDATE runs SET output_blob = NULL WHERE run_id = ?", (a.run_id,))
    a.created.append(first_task_of(t, new_run_id))


def continued_as(run: sqlite3.Row, f: Mapping[str, Any]) -> tuple[str, str | None]:
    """The workflow type and arguments of the run a continue_as_new starts: the command's (§8.7.1, "optional
    arguments, workflow_type"), the type defaulting to the current one."""
    return f.get("workflow_type") or run["workflow_type"], _blob(f.get("arguments"))


def first_task_of(t: T, run_id: str) -> str:
    """The id ``created_task_ids`` lists for a run the batch started (a child's, or the next run of a
    continue_as_new): its first workflow task, which a poll leases — a task id, never the run's id (the list names
    "the activity, timer, child and next tasks that the batch created")."""
    task = open_workflow_task(t, run_id)
    assert task is not None, run_id
    return str(task["task_id"])


HANDLERS: Mapping[str, Handler] = {
    "schedule_activity": _schedule_activity,
    "start_timer": _start_timer,
    "open_condition_wait": _open_condition_wait,
    "start_child_workflow": _start_child_workflow,
    "complete_update": _close_update(UpdateEvent.COMPLETE),
    "fail_update": _close_update(UpdateEvent.FAIL),
    "record_side_effect": _record_side_effect,
    "record_version_marker": _record_version_marker,
    "upsert_search_attributes": _upsert_search_attributes,
    "complete_workflow": _complete_workflow,
    "fail_workflow": _fail_workflow,
    "continue_as_new": _continue_as_new,
}
"""One handler per command type the model validates (§8.7.1, plus the implemented optional types)."""


# -- condition waits a batch moved past (Python SDK 2.12.0, Replay) ----------------------------------------------------


def reemitted(wait: sqlite3.Row, batch: list[cmdmodel.Command]) -> bool:
    """Whether ``batch`` re-emits the open condition ``wait`` (same key and fingerprint: a "reopen", Python SDK 2.12.0
    §6.4)."""
    return any(
        c.type == "open_condition_wait"
        and (c.fields.get("condition_key"), c.fields.get("condition_definition_fingerprint"))
        == (wait["condition_key"], wait["fingerprint"])
        for c in batch
    )


def satisfy_moved_past_waits(t: T, run_id: str, batch: list[cmdmodel.Command], task_id: str) -> None:
    """An open wait that ``batch`` does not re-emit (same key and fingerprint) was satisfied by the history
    the task replayed: it closes, its timeout timer is cancelled, and ``ConditionWaitSatisfied`` records it."""
    for wait in t.all("SELECT * FROM condition_waits WHERE run_id = ? AND status = 'open'", run_id):
        if reemitted(wait, batch):
            continue
        move(t, CONDITION_WAITS, wait["condition_wait_id"], wait["status"], ConditionWaitEvent.SATISFY, quiet=True)
        if wait["timer_id"]:
            move_all(t, TIMERS, TimerEvent.CANCEL, "timer_id = ?", (wait["timer_id"],))
        append_event(
            t,
            run_id,
            "ConditionWaitSatisfied",
            {"condition_wait_id": wait["condition_wait_id"], "sequence": wait["step_sequence"]},
            workflow_task_id=task_id,
        )
