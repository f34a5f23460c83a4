"""Faults of the workflow-task lease: claiming, replayed polls, redelivery, fencing, renewal and the command batch
(its commands' failure fields among them)."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from suite.protocol import commands as cmdmodel
from suite.protocol.errors import Rejection
from suite.protocol.fencing import WorkflowTaskView
from suite.protocol.lifecycles import RunStatus, TaskEvent, TaskStatus

from .. import commands, workers
from .. import workflow_tasks as wt
from ..commands import apply_command
from ..polling import Poll
from ..routes.worker import workflow_tasks as routes
from ..tx import T
from .patching import wraps

# -- claim and replay -------------------------------------------------------------------------------------


@wraps("replay-increments-attempt", wt, "refresh_replayed_lease")
def _replay_increments(original: Callable[[T, str], None], t: T, task_id: str) -> None:
    t.db.execute("UPDATE workflow_tasks SET attempt = attempt + 1 WHERE task_id = ?", (task_id,))
    original(t, task_id)


@wraps("throttled-reported-empty", wt, "claim_workflow_task")
def _throttled_empty(original: Callable[..., Any], t: T, poll: Poll, **kwargs: Any) -> Any:
    claimed = original(t, poll, **kwargs)
    return None if claimed == "throttled" else claimed  # the bug: a refused lease looks like an empty queue


@wraps("claim-not-conditional", wt, "claim_next")
def _claim_unconditionally(original: Callable[[T, Poll], sqlite3.Row | None], t: T, poll: Poll) -> sqlite3.Row | None:
    """The claim reads the queue and then writes without re-checking the task. Requests run one at a time in
    this server, so a racing poll is emulated: a task another worker claimed within the last second still looks
    ready, and the unconditional write hands it out again with the same attempt."""
    lease_us = t.settings.lease_seconds * wt.US
    raced = t.one(
        "SELECT task_id FROM workflow_tasks WHERE namespace = ? AND task_queue = ? AND status = 'leased'"
        " AND lease_owner != ? AND lease_expires_at > ? ORDER BY lease_expires_at DESC LIMIT 1",
        poll.namespace,
        poll.queue,
        poll.worker_id,
        t.now + lease_us - 1_000_000,
    )
    if raced is None:
        return original(t, poll)
    t.db.execute(
        "UPDATE workflow_tasks SET lease_owner = ?, lease_expires_at = ? WHERE task_id = ?",
        (poll.worker_id, t.now + lease_us, raced["task_id"]),
    )
    return wt.leased_row(t, str(raced["task_id"]))


@wraps("expired-never-redelivered", wt, "oldest_first")
def _ready_only(
    original: Callable[..., Iterator[sqlite3.Row]], ready: Iterator[sqlite3.Row], expired: Iterator[sqlite3.Row]
) -> Iterator[sqlite3.Row]:
    return ready  # the bug: expired leases are never candidates again, so a crashed worker's task is stuck


@wraps("redelivery-keeps-attempt", wt, "claim_lease")
def _keep_attempt(
    original: Callable[..., TaskStatus | None], t: T, task_id: str, status: TaskStatus, *args: Any
) -> TaskStatus | None:
    moved = original(t, task_id, status, *args)
    if moved is not None and status is TaskStatus.LEASED:  # a redelivery: the lease's +1 is taken back
        t.db.execute("UPDATE workflow_tasks SET attempt = attempt - 1 WHERE task_id = ?", (task_id,))
    return moved


@wraps("drop-poll-status", routes.Routes, "wt_poll")
async def _drop_poll_status(original: Callable[..., Any], self: routes.Routes, ctx: Any) -> tuple[int, Any]:
    status, out = await original(self, ctx)
    out.pop("poll_status", None)
    return status, out


# -- fencing -----------------------------------------------------------------------------------------------


@wraps("accept-wrong-lease-owner", wt, "guard_workflow_task")
def _any_owner(original: Callable[..., None], view: WorkflowTaskView | None, **fence: Any) -> None:
    if view is not None and view.lease_owner is not None:
        fence["lease_owner"] = view.lease_owner
    original(view, **fence)


@wraps("accept-stale-attempt", wt, "guard_workflow_task")
def _any_attempt(original: Callable[..., None], view: WorkflowTaskView | None, **fence: Any) -> None:
    if view is not None:
        fence["attempt"] = view.attempt
    original(view, **fence)


@wraps("skip-run-closed-guard", wt, "guard_workflow_task")
def _run_always_open(original: Callable[..., None], view: WorkflowTaskView | None, **fence: Any) -> None:
    if view is not None:
        view = dataclasses.replace(view, run_status=RunStatus.RUNNING)  # the run-closed row is never reached
    original(view, **fence)


@wraps("third-attempt-takes-previous", wt, "guarded_task")
def _previous_attempt_deep(
    original: Callable[..., tuple[sqlite3.Row, sqlite3.Row]],
    t: T,
    namespace: str,
    task_id: str,
    body: Mapping[str, Any],
) -> tuple[sqlite3.Row, sqlite3.Row]:
    """From the third attempt on, a completion by the current owner naming the attempt before is taken as the
    current attempt's."""
    view, _task, _run = wt.task_view(t, namespace, task_id)
    owner, attempt = body.get("lease_owner"), body.get("workflow_task_attempt")
    deep = view is not None and view.attempt >= 3 and owner == view.lease_owner and attempt == view.attempt - 1
    if deep and "commands" in body:
        assert view is not None
        body = {**body, "workflow_task_attempt": view.attempt}
    return original(t, namespace, task_id, body)


# -- renewal and the batch ----------------------------------------------------------------------------------


@wraps("heartbeat-does-not-renew", wt, "renewed_expiry")
def _old_expiry(original: Callable[[T, sqlite3.Row], int], t: T, task: sqlite3.Row) -> int:
    return int(task["lease_expires_at"])  # "renewed", but the old expiry is kept


@wraps("accept-two-terminal", wt, "validated_batch")
def _first_terminal_only(
    original: Callable[..., list[cmdmodel.Command]], t: T, task: sqlite3.Row, commands: Any, open_updates: list[str]
) -> list[cmdmodel.Command]:
    if isinstance(commands, list):  # the later terminal commands are dropped instead of rejecting the batch
        ends = [c for c in commands if isinstance(c, dict) and c.get("type") in cmdmodel.TERMINAL_TYPES]
        commands = [c for c in commands if not any(c is e for e in ends[1:])]
    return original(t, task, commands, open_updates)


@wraps("partial-batch-on-invalid", wt, "validated_batch")
def _commit_valid_prefix(
    original: Callable[..., list[cmdmodel.Command]], t: T, task: sqlite3.Row, commands: Any, open_updates: list[str]
) -> list[cmdmodel.Command]:
    """When the batch is invalid, its longest valid prefix's non-terminal commands are applied and committed
    before the rejection: a batch that is not atomic."""
    if isinstance(commands, list):
        for n in range(len(commands), 0, -1):
            try:
                prefix = original(t, task, commands[:n], open_updates)
            except Rejection:
                continue
            if n < len(commands):
                for command in prefix:
                    if command.type not in cmdmodel.TERMINAL_TYPES:
                        apply_command(t, task, command, [])
                t.db.execute("COMMIT")
                t.db.execute("BEGIN IMMEDIATE")
            break
    return original(t, task, commands, open_updates)


# -- what a batch starts ------------------------------------------------------------------------------------


@wraps("continue-as-new-keeps-type-and-arguments", commands, "continued_as")
def _same_again(
    original: Callable[..., tuple[str, str | None]], run: sqlite3.Row, f: Mapping[str, Any]
) -> tuple[str, str | None]:
    return run["workflow_type"], run["input_blob"]  # the command's workflow_type and arguments are dropped


@wraps("created-task-ids-name-runs", commands, "first_task_of")
def _the_run(original: Callable[[T, str], str], t: T, run_id: str) -> str:
    return run_id  # a started run is listed by its run id, not by the task a poll leases


@wraps("upsert-search-attributes-invisible", commands, "merged_search_attributes")
def _not_merged(
    original: Callable[..., dict[str, Any]], current: Mapping[str, Any], upserted: Mapping[str, Any]
) -> dict[str, Any]:
    return dict(current)  # SearchAttributesUpserted is recorded, but describe never shows the upsert


# -- the failure fields of a command ------------------------------------------------------------------------


def _dropping(command_type: str, fields: tuple[str, ...]) -> Callable[..., None]:
    """A wrap of ``commands.apply_command`` that applies a ``command_type`` command without ``fields``."""

    def drop(
        original: Callable[..., None], t: T, task: sqlite3.Row, command: cmdmodel.Command, created: list[str]
    ) -> None:
        if command.type == command_type:
            kept = {k: v for k, v in command.fields.items() if k not in fields}
            command = dataclasses.replace(command, fields=kept)
        original(t, task, command, created)

    return drop


wraps("fail-workflow-drops-non-retryable", commands, "apply_command")(_dropping("fail_workflow", ("non_retryable",)))
wraps("fail-update-drops-optional-fields", commands, "apply_command")(
    _dropping("fail_update", ("exception_class", "exception_type", "non_retryable"))
)


# -- deregistration ---------------------------------------------------------------------------------------


@wraps("deregistration-keeps-leases", workers, "move_all")
def _leases_kept(
    original: Callable[..., int], t: T, rows: Any, event: Any, where: str, args: Any = (), **kw: Any
) -> int:
    """A deregistered worker's workflow tasks are counted as recovered, but keep its leases: they are ready again
    only when those leases expire."""
    if event is not TaskEvent.ABANDON:
        return int(original(t, rows, event, where, args, **kw))
    held = t.one(
        f"SELECT COUNT(*) AS n FROM workflow_tasks WHERE status = ? AND ({where})", TaskStatus.LEASED.value, *args
    )
    return int(held["n"]) if held is not None else 0


@wraps("deregistration-skips-redelivered-leases", workers, "move_all")
def _first_attempts_only(
    original: Callable[..., int], t: T, rows: Any, event: Any, where: str, args: Any = (), **kw: Any
) -> int:
    """Deregistration gives up only first-attempt leases: a task its worker took over after another's lease expired
    stays leased to the worker that left, until that lease expires too."""
    if event is TaskEvent.ABANDON:
        where = f"({where}) AND attempt = 1"
    return int(original(t, rows, event, where, args, **kw))
