"""Fencing, lease expiry and redelivery, cancellation, dispatch, the control plane's run lifecycle and
namespace scoping (PROTOCOL.md §4.2, §8.9, §9, §11.5, §12, §14.1; invariants 26-31 and 49-51).

Every check builds its own queue, workers and workflows. The checks that need a lease to expire read its
length from ``worker_protocol.test_profile`` (or measure it as ``lease_expires_at`` minus the response's
``Date``) and are not covered when it exceeds ``--max-wait``; they wait for what the protocol promises
(a redelivery, a rejection) with a deadline of the lease plus slack, and read the *server's* clock from
the ``Date`` header of ``GET /api/health`` when they must know that an instant has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from suite.client import ProtocolClient, Reply
from suite.context import CLOCK_SKEW, CheckContext
from suite.protocol.commands import LEGACY_START_FIELDS
from suite.protocol.history import RUN_TERMINAL_EVENTS
from suite.protocol.lifecycles import RUN_LIVE_STATUSES
from suite.registry import check
from suite.worlds import (
    ACT_LEASE,
    WF_LEASE,
    activity_call,
    instant,
    lease_length,
    next_activity,
    poll_activity,
    require_open,
)

# Added to every lease-derived deadline: scheduling jitter, a busy target, xdist neighbours.
SLACK = 10.0
# The four workflow-task verbs fenced by §8.9.
VERBS = ("heartbeat", "complete", "fail", "history")
LIVE_RUN_STATUSES = tuple(sorted(status.value for status in RUN_LIVE_STATUSES))


# -- commands and bodies -----------------------------------------------------------------------------------


def _complete_cmd(value: Any = "done") -> dict[str, Any]:
    return {"type": "complete_workflow", "result": CheckContext.envelope(value)}


def _timer_cmd() -> dict[str, Any]:
    # A long timer: the batch is non-terminal and nothing wakes the run while the check runs.
    return {"type": "start_timer", "delay_seconds": 3600}


def _activity_cmd(activity_type: str, **extra: Any) -> dict[str, Any]:
    return {"type": "schedule_activity", "activity_type": activity_type, **extra}


def _verb_body(verb: str, commands: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if verb == "complete":
        return {"commands": commands if commands is not None else [_complete_cmd()]}
    if verb == "fail":
        return {"failure": {"message": "conformance probe: task failure"}}
    return {}


# -- polling -----------------------------------------------------------------------------------------------


async def _lease(
    ctx: CheckContext, worker: str, queue: str, *, within: float = 10.0, timeout: int = 1
) -> tuple[dict[str, Any], Reply]:
    """Poll until a workflow task is leased to ``worker``; the task and the poll's reply."""

    async def probe() -> tuple[dict[str, Any], Reply] | None:
        reply = await ctx.poll_wf(worker, queue, timeout)
        task = ctx.expect(reply, 200, what="workflow-task poll").get("task")
        return (task, reply) if isinstance(task, dict) else None

    return await ctx.wait_until(probe, timeout=within, what=f"a workflow task for {worker} on {queue}")


async def _started_with_activities(
    ctx: CheckContext, worker: str, queue: str, activity_types: list[str], **start: Any
) -> tuple[str, str, dict[str, Any]]:
    """Start a run, lease its first workflow task and complete it scheduling one activity per type."""
    wid, run_id = await ctx.start(queue, **start)
    task, reply = await _lease(ctx, worker, queue)
    ctx.require_equal(
        task.get("run_id"), run_id, "the only ready task on a fresh queue is the new run's", replies=[reply]
    )
    reply = await ctx.complete(task, [_activity_cmd(t) for t in activity_types])
    ctx.expect(reply, 200, what="complete scheduling activities")
    return wid, run_id, task


# -- time --------------------------------------------------------------------------------------------------


# -- judging -----------------------------------------------------------------------------------------------


def _task_of(body: dict[str, Any]) -> dict[str, Any] | None:
    task = body.get("task")
    return task if isinstance(task, dict) else None


def _same(got: Any, want: Any) -> bool:
    return type(got) is type(want) and got == want


def _require_fields(
    ctx: CheckContext,
    reply: Reply,
    body: dict[str, Any],
    want: dict[str, Any],
    message: str,
    requirement: str | None = None,
) -> None:
    """Fail unless every field of ``want`` stands in ``body`` with that value and JSON type (``"<absent>"``: the
    field must be missing)."""
    got = {k: body.get(k, "<absent>") for k in want}
    ctx.require(
        all(_same(got[k], v) for k, v in want.items()),
        message,
        expected=want,
        received=got,
        replies=[reply],
        requirement=requirement,
    )


def _expect_run_closed(
    ctx: CheckContext,
    reply: Reply,
    *,
    stop_reason: str,
    cancel_requested: bool,
    run_status: str,
    requirement: str,
    what: str,
) -> dict[str, Any]:
    """409 run_closed with the §8.9 row 2 body: exact flags, stop_reason, run_status, no outcome, a
    run_closed_at."""
    body = ctx.expect(reply, 409, "run_closed", what=what, requirement=requirement)
    want: dict[str, Any] = {
        "can_continue": False,
        "cancel_requested": cancel_requested,
        "stop_reason": stop_reason,
        "run_status": run_status,
        "outcome": "<absent>",  # a rejection, not a report's outcome
    }
    _require_fields(
        ctx,
        reply,
        body,
        want,
        f"{what}: the run_closed body says why the run stopped, with no outcome key (§8.9 row 2)",
        requirement,
    )
    ctx.require(
        instant(body.get("run_closed_at")) is not None,
        f"{what}: run_closed carries the RFC 3339 instant the run closed in run_closed_at",
        expected="an RFC 3339 timestamp",
        received=body.get("run_closed_at", "<absent>"),
        replies=[reply],
        requirement=requirement,
    )
    return body


async def _renew(ctx: CheckContext, task: dict[str, Any], what: str, requirement: str) -> None:
    """The owner's heartbeat: proves the lease is intact and keeps a short test lease alive under load."""
    reply = await ctx.wf_call(task, "heartbeat")
    ctx.expect(reply, 200, what=f"the owner's heartbeat {what}", requirement=requirement)


async def _events(ctx: CheckContext, wid: str, run_id: str) -> list[dict[str, Any]]:
    return await ctx.history(wid, run_id)


def _count(events: list[dict[str, Any]], event_type: str) -> int:
    return sum(1 for e in events if e.get("event_type") == event_type)


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("event_type")) for e in events]


async def _run_status(ctx: CheckContext, wid: str) -> dict[str, Any]:
    return await ctx.describe(wid)


@contextlib.asynccontextmanager
async def _other_client(ctx: CheckContext) -> AsyncIterator[ProtocolClient]:
    """A second client with its own connection pool, recorded into the same exchange list, talking through the
    same fault proxy as the check's own client (with its trace ids and lost-answer handling)."""
    client = ProtocolClient(
        ctx.target.url,
        worker_token=ctx.target.worker_token,
        operator_token=ctx.target.operator_token,
        namespace=ctx.target.namespace,
        worker_version=ctx.target.protocol_version,
        validator=ctx.client.validator,
        exchanges=ctx.client.exchanges,
        faults=ctx.target.fault_ledger,  # through --faults its lost answers are handled like the check's own
    )
    try:
        yield client
    finally:
        await client.aclose()


# =========================================================================================================
# fencing (§8.9, invariants 26-29)
# =========================================================================================================


async def _fenced_calls_changed_nothing(
    ctx: CheckContext, task: dict[str, Any], wid: str, run_id: str, holder: str
) -> None:
    """FENCE-NO-STATE-CHANGE: after the fenced calls the lease ``holder``'s complete still succeeds, and the
    history holds exactly that completion."""
    reply = await ctx.complete(task, [_complete_cmd()])
    ctx.expect(reply, 200, what=f"{holder}'s complete after fenced calls", requirement="FENCE-NO-STATE-CHANGE")
    ctx.require_counts(
        await _events(ctx, wid, run_id),
        {"WorkflowCompleted": 1, "WorkflowFailed": 0},
        f"history holds exactly {holder}'s completion",
        "FENCE-NO-STATE-CHANGE",
    )


@check("FENCE-OWNER", "FENCE-NO-STATE-CHANGE")
async def fence_wrong_owner(ctx: CheckContext) -> None:
    """A wrong lease_owner on heartbeat, complete, fail and history is 409 lease_owner_mismatch naming the
    owner, and changes nothing: the owner's complete still succeeds."""
    queue = ctx.uid("q")
    owner = await ctx.register(queue)
    intruder = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, owner, queue)
    for verb in VERBS:
        reply = await ctx.wf_call(task, verb, _verb_body(verb), owner=intruder)
        ctx.expect(
            reply,
            409,
            "lease_owner_mismatch",
            what=f"{verb} by a worker without the lease",
            requirement="FENCE-OWNER",
            fields={"lease_owner": owner},  # the current owner
        )
        await _renew(ctx, task, f"after the fenced {verb}", "FENCE-NO-STATE-CHANGE")
    # Nothing moved: the run is open and the owner's complete is the only one recorded.
    described = await _run_status(ctx, wid)
    ctx.require(
        described.get("status") in LIVE_RUN_STATUSES,
        "a fenced complete or fail must not close the run",
        expected=f"one of {LIVE_RUN_STATUSES}",
        received=described.get("status"),
        requirement="FENCE-NO-STATE-CHANGE",
    )
    await _fenced_calls_changed_nothing(ctx, task, wid, run_id, "the owner")


@check("FENCE-ATTEMPT", "FENCE-NO-STATE-CHANGE")
async def fence_stale_attempt(ctx: CheckContext) -> None:
    """The right owner with workflow_task_attempt = current+1 is 409 workflow_task_attempt_mismatch with
    current_attempt on every verb, and the real attempt still completes."""
    queue = ctx.uid("q")
    owner = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, owner, queue)
    current = task.get("workflow_task_attempt")
    ctx.require(
        isinstance(current, int) and not isinstance(current, bool),
        "a leased task carries an integer workflow_task_attempt",
        expected="int",
        received=current,
        requirement="FENCE-ATTEMPT",
    )
    assert isinstance(current, int)
    for verb in VERBS:
        reply = await ctx.wf_call(task, verb, _verb_body(verb), attempt=current + 1)
        body = ctx.expect(
            reply,
            409,
            "workflow_task_attempt_mismatch",
            what=f"{verb} with workflow_task_attempt {current + 1} (current {current})",
            requirement="FENCE-ATTEMPT",
        )
        ctx.require(
            _same(body.get("current_attempt"), current),
            f"{verb}: workflow_task_attempt_mismatch states current_attempt",
            expected=current,
            received=body.get("current_attempt"),
            replies=[reply],
            requirement="FENCE-ATTEMPT",
        )
        await _renew(ctx, task, f"after the fenced {verb}", "FENCE-NO-STATE-CHANGE")
    await _fenced_calls_changed_nothing(ctx, task, wid, run_id, "the current attempt")


@check("FENCE-UNKNOWN-TASK")
async def fence_unknown_task_ids(ctx: CheckContext) -> None:
    """Every workflow-task verb and every activity-task verb on an unknown task id is 404 task_not_found."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    ghost = ctx.uid("no-such-task")
    for verb in VERBS:
        body = {"lease_owner": worker, "workflow_task_attempt": 1, **_verb_body(verb)}
        reply = await ctx.client.worker(f"/workflow-tasks/{ghost}/{verb}", body)
        ctx.expect(reply, 404, "task_not_found", what=f"workflow-task {verb} on an unknown task id")
    bodies: dict[str, dict[str, Any]] = {
        "complete": {"result": None},
        "fail": {"failure": {"message": "conformance probe"}},
        "heartbeat": {},
    }
    for verb, extra in bodies.items():
        body = {"activity_attempt_id": ctx.uid("no-such-attempt"), "lease_owner": worker, **extra}
        reply = await ctx.client.worker(f"/activity-tasks/{ghost}/{verb}", body)
        ctx.expect(reply, 404, "task_not_found", what=f"activity-task {verb} on an unknown task id")


@check("FENCE-UNKNOWN-QUERY-TASK")
async def fence_unknown_query_task_id(ctx: CheckContext) -> None:
    """Query-task complete and fail on an unknown query task id are 404 query_task_not_found."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    ghost = ctx.uid("no-such-query-task")
    probes: tuple[tuple[str, dict[str, Any]], ...] = (
        ("complete", {"result": None}),
        ("fail", {"failure": {"message": "conformance probe"}}),
    )
    for verb, extra in probes:
        reply = await ctx.client.worker(
            f"/query-tasks/{ghost}/{verb}", {"lease_owner": worker, "query_task_attempt": 1, **extra}
        )
        ctx.expect(reply, 404, "query_task_not_found", what=f"query-task {verb} on an unknown query task id")


@check("FENCE-AFTER-COMPLETE")
async def fence_after_complete(ctx: CheckContext) -> None:
    """After a complete, a second complete or fail with the same lease is 409: run_closed (run_completed) when
    the batch closed the run, task_not_leased when it did not; history has one WorkflowCompleted."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    # The batch closes the run.
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    ctx.expect(await ctx.complete(task, [_complete_cmd()]), 200, what="the first complete")
    again = await ctx.complete(task, [_complete_cmd("again")])
    closed_by_batch: dict[str, Any] = {
        "stop_reason": "run_completed",
        "cancel_requested": False,
        "run_status": "completed",
        "requirement": "FENCE-AFTER-COMPLETE",
    }
    _expect_run_closed(ctx, again, what="a second complete after complete_workflow", **closed_by_batch)
    fail = await ctx.wf_call(task, "fail", _verb_body("fail"))
    _expect_run_closed(ctx, fail, what="a fail after complete_workflow", **closed_by_batch)
    events = await _events(ctx, wid, run_id)
    ctx.require_counts(events, {"WorkflowCompleted": 1}, "history shows exactly one WorkflowCompleted")
    # The batch leaves the run open.
    wid2, _ = await ctx.start(queue)
    task2, _ = await _lease(ctx, worker, queue)
    ctx.expect(await ctx.complete(task2, [_timer_cmd()]), 200, what="a non-terminal complete")
    again = await ctx.complete(task2, [_complete_cmd()])
    ctx.expect(again, 409, "task_not_leased", what="a second complete after a non-terminal batch")
    fail = await ctx.wf_call(task2, "fail", _verb_body("fail"))
    ctx.expect(fail, 409, "task_not_leased", what="a fail after a non-terminal batch")
    described = await _run_status(ctx, wid2)
    ctx.require(
        described.get("status") in LIVE_RUN_STATUSES,
        "the rejected second complete did not close the run",
        expected=f"one of {LIVE_RUN_STATUSES}",
        received=described.get("status"),
    )


@check("FENCE-ORDER")
async def fence_guard_order(ctx: CheckContext) -> None:
    """Guards run in order lookup, run closed, not leased, owner, attempt: a call failing several guards gets
    the first one's answer, and a fenced complete applies none of its commands."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    stranger = await ctx.register(queue)
    # Lookup first: an unknown id with a wrong owner and attempt is 404.
    reply = await ctx.client.worker(
        f"/workflow-tasks/{ctx.uid('no-such-task')}/heartbeat", {"lease_owner": stranger, "workflow_task_attempt": 7}
    )
    ctx.expect(reply, 404, "task_not_found", what="unknown task, wrong owner and attempt")
    # Owner before attempt, and a fenced complete applies nothing.
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    attempt = int(task.get("workflow_task_attempt") or 1)
    marker = ctx.uid("fenced-marker")
    fenced = [_activity_cmd(marker), {"type": "fail_workflow", "message": marker}]
    reply = await ctx.wf_call(task, "complete", {"commands": fenced}, owner=stranger, attempt=attempt + 1)
    ctx.expect(reply, 409, "lease_owner_mismatch", what="complete with a wrong owner and a wrong attempt")
    reply = await ctx.wf_call(task, "complete", {"commands": fenced}, attempt=attempt + 1)
    ctx.expect(reply, 409, "workflow_task_attempt_mismatch", what="complete with a stale attempt")
    events = await _events(ctx, wid, run_id)
    ctx.require(
        marker not in json.dumps(events) and _count(events, "WorkflowFailed") == 0,
        "wrong owners and stale attempts are rejected before commands are applied",
        expected="no event from the fenced batch",
        received=_types(events),
    )
    # Not leased before owner and attempt: the task was completed, the run stays open.
    await _renew(ctx, task, "after the fenced completes", "FENCE-ORDER")
    ctx.expect(await ctx.complete(task, [_timer_cmd()]), 200, what="the owner's non-terminal complete")
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger, attempt=attempt + 1)
    ctx.expect(reply, 409, "task_not_leased", what="heartbeat of a completed task with a wrong owner and attempt")
    # Run closed before not leased, owner and attempt.
    ctx.expect(
        await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance"}), 200, what="cancel"
    )
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger, attempt=attempt + 1)
    _expect_run_closed(
        ctx,
        reply,
        stop_reason="run_cancelled",
        cancel_requested=True,
        run_status="cancelled",
        requirement="FENCE-ORDER",
        what="heartbeat of a completed task of a cancelled run",
    )


@check("FENCE-TASK-FAILED-NOT-LEASED")
async def fence_after_task_fail(ctx: CheckContext) -> None:
    """After a workflow-task fail, complete, fail and heartbeat of that attempt are 409 task_not_leased and
    the run stays open."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    failure = {"message": "conformance: replay failed", "type": "Replay"}
    reply = await ctx.wf_call(task, "fail", {"failure": failure})
    body = ctx.expect(reply, 200, what="workflow-task fail")
    ctx.require(
        body.get("outcome") == "failed" and body.get("recorded") is True,
        "a workflow-task fail is recorded",
        expected="outcome failed, recorded true",
        received={k: body.get(k) for k in ("outcome", "recorded")},
        replies=[reply],
    )
    for verb in ("complete", "fail", "heartbeat"):
        reply = await ctx.wf_call(task, verb, _verb_body(verb))
        ctx.expect(reply, 409, "task_not_leased", what=f"{verb} of a failed attempt")
    described = await _run_status(ctx, wid)
    events = await _events(ctx, wid, run_id)
    closed = [e for e in _types(events) if e in RUN_TERMINAL_EVENTS]
    ctx.require(
        described.get("status") in LIVE_RUN_STATUSES and not closed,
        "a workflow-task failure does not close the run",
        expected=f"status in {LIVE_RUN_STATUSES}",
        received=f"status {described.get('status')!r}, events {_types(events)}",
    )


# =========================================================================================================
# expiry and redelivery (§9, invariants 30-31)
# =========================================================================================================


@check("EXPIRY-HOLDER-FENCED", "FENCE-ORDER", "EXPIRY-REDELIVER-SAME-TASK", slow=True)
async def expiry_holder_fenced(ctx: CheckContext) -> None:
    """Once lease_expires_at passes, the holder's heartbeat and complete are 409 (lease_expired before a
    reclaim, the owner and attempt checks coming after it), never 200; after its own re-poll (attempt+1)
    its old attempt is workflow_task_attempt_mismatch."""
    queue = ctx.uid("q")
    holder = await ctx.register(queue)
    stranger = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, reply = await _lease(ctx, holder, queue)
    lease = lease_length(ctx, task, reply, WF_LEASE)
    expires = instant(task.get("lease_expires_at"))
    ctx.require(
        expires is not None,
        "a leased task carries lease_expires_at (RFC 3339)",
        expected="a timestamp",
        received=task.get("lease_expires_at"),
        requirement="EXPIRY-HOLDER-FENCED",
    )
    assert expires is not None
    await ctx.wait_past(expires, within=lease + SLACK, what="the server clock to pass lease_expires_at")
    # Nobody has reclaimed the task: whoever asks is told the lease expired (a server whose repair loop
    # already put the task back to ready answers task_not_leased, which the order also allows).
    unclaimed = ("lease_expired", "task_not_leased")
    reply = await ctx.wf_call(task, "heartbeat")
    ctx.expect(
        reply, 409, unclaimed, what="the holder's heartbeat after lease_expires_at", requirement="EXPIRY-HOLDER-FENCED"
    )
    reply = await ctx.complete(task, [_complete_cmd()])
    ctx.expect(
        reply, 409, unclaimed, what="the holder's complete after lease_expires_at", requirement="EXPIRY-HOLDER-FENCED"
    )
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger)
    ctx.expect(reply, 409, unclaimed, what="a wrong owner's heartbeat on an expired lease", requirement="FENCE-ORDER")
    # The same worker polls again: the same task with the next attempt; its old attempt stays fenced.
    again, _ = await _lease(ctx, holder, queue, within=lease + SLACK)
    previous = int(task.get("workflow_task_attempt") or 0)
    got = {"task_id": again.get("task_id"), "workflow_task_attempt": again.get("workflow_task_attempt")}
    ctx.require_equal(
        got,
        {"task_id": task["task_id"], "workflow_task_attempt": previous + 1},
        "after expiry the same task_id is redelivered with workflow_task_attempt + 1",
        requirement="EXPIRY-REDELIVER-SAME-TASK",
    )
    reply = await ctx.complete(task, [_complete_cmd("stale")])
    ctx.expect(
        reply,
        409,
        "workflow_task_attempt_mismatch",
        what="the old attempt's complete after the same worker re-leased the task",
        requirement="EXPIRY-HOLDER-FENCED",
    )
    ctx.expect(
        await ctx.complete(again, [_complete_cmd()]),
        200,
        what="the new attempt's complete",
        requirement="EXPIRY-REDELIVER-SAME-TASK",
    )
    events = await _events(ctx, wid, run_id)
    ctx.require_counts(
        events, {"WorkflowCompleted": 1}, "only the new attempt completed the run", "EXPIRY-HOLDER-FENCED"
    )


@check(
    "DISPATCH-CRASH-TAKEOVER",
    "EXPIRY-REDELIVER-SAME-TASK",
    "EXPIRY-ONLY-NEW-LEASE-COMMITS",
    "DISPATCH-LATE-EVENT-FENCED",
    "EXPIRY-SELF-RECOVERY",
    "EXPIRY-HOLDER-FENCED",
    "FENCE-ORDER",
    slow=True,
)
async def dispatch_crash_takeover(ctx: CheckContext) -> None:
    """A crashed holder is replaced once its lease expires: another worker's poll gets the same task_id with
    attempt+1; the old worker's late heartbeat, complete, fail and history are 409 and leave no trace; only
    the new lease commits."""
    queue = ctx.uid("q")
    crashed = await ctx.register(queue)
    successor = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, reply = await _lease(ctx, crashed, queue)
    lease = lease_length(ctx, task, reply, WF_LEASE)
    # The crashed worker never calls again; the successor just keeps polling, as any worker would.
    new, _ = await _lease(ctx, successor, queue, within=lease + SLACK)
    previous = int(task.get("workflow_task_attempt") or 0)
    want = {"task_id": task["task_id"], "workflow_task_attempt": previous + 1, "lease_owner": successor}
    got = {k: new.get(k) for k in want}
    ctx.require_equal(
        got,
        want,
        "the expired task is taken over: same task_id, attempt + 1, the new lease_owner",
        requirement="DISPATCH-CRASH-TAKEOVER",
    )
    # The old worker wakes up and reports.
    marker = ctx.uid("late-marker")
    late: dict[str, dict[str, Any]] = {
        "heartbeat": {},
        "complete": {"commands": [_activity_cmd(marker), {"type": "fail_workflow", "message": marker}]},
        "fail": {"failure": {"message": marker}},
        "history": {},
    }
    for verb, body in late.items():
        reply = await ctx.wf_call(task, verb, body)
        ctx.expect(
            reply,
            409,
            ("lease_owner_mismatch", "workflow_task_attempt_mismatch"),
            what=f"the replaced worker's late {verb}",
            requirement="DISPATCH-LATE-EVENT-FENCED",
        )
        ctx.require(
            reply.reason == "lease_owner_mismatch" and reply.json().get("lease_owner") == successor,
            f"the replaced worker's late {verb} is fenced by owner, checked before the attempt",
            expected=f"lease_owner_mismatch naming {successor}",
            received=f"{reply.reason} {reply.json().get('lease_owner')}",
            replies=[reply],
            requirement="FENCE-ORDER",
        )
        await _renew(ctx, new, f"after the replaced worker's late {verb}", "EXPIRY-ONLY-NEW-LEASE-COMMITS")
    ctx.expect(
        await ctx.complete(new, [_complete_cmd("winner")]),
        200,
        what="the new holder's complete",
        requirement="EXPIRY-ONLY-NEW-LEASE-COMMITS",
    )
    events = await _events(ctx, wid, run_id)
    ctx.require(
        marker not in json.dumps(events),
        "the replaced worker's commands leave no trace in history",
        expected=f"no event mentioning {marker}",
        received=_types(events),
        requirement="DISPATCH-LATE-EVENT-FENCED",
    )
    ctx.require_counts(
        events,
        {"WorkflowCompleted": 1, "WorkflowFailed": 0},
        "only the new lease committed",
        "EXPIRY-ONLY-NEW-LEASE-COMMITS",
    )
    described = await _run_status(ctx, wid)
    ctx.require_equal(
        described.get("status"),
        "completed",
        "the run ends as the new holder decided",
        requirement="EXPIRY-ONLY-NEW-LEASE-COMMITS",
    )


async def _waiting_poll(
    ctx: CheckContext, kind: str, worker: str, queue: str, hold: int, due: datetime | None, what: str
) -> tuple[Reply, dict[str, Any], float]:
    """A long poll of ``hold`` seconds, already waiting when work becomes ``due``: its answer, the answer's body
    and the seconds it took (a test clock cuts the hold short at ``due``: the poll must then answer at once)."""
    started = ctx.now()
    reply = await ctx.poll(kind, worker, queue, hold, until=due)
    elapsed = (ctx.now() - started).total_seconds()
    return reply, ctx.expect(reply, 200, what=what, requirement="DISPATCH-LOST-NOTIFICATION"), elapsed


def _require_woken(
    ctx: CheckContext, reply: Reply, body: dict[str, Any], elapsed: float, woken: bool, message: str, expected: str
) -> None:
    """DISPATCH-LOST-NOTIFICATION: the waiting poll got the work that became due (``woken``), with no other
    request to prompt the server."""
    ctx.require(
        woken,
        f"{message}, without any other request",
        expected=expected,
        received=f"poll_status {body.get('poll_status')!r} after {elapsed:.1f}s",
        replies=[reply],
        requirement="DISPATCH-LOST-NOTIFICATION",
    )


@check("DISPATCH-LOST-NOTIFICATION", "EXPIRY-SELF-RECOVERY", slow=True)
async def dispatch_lost_notification(ctx: CheckContext) -> None:
    """An expired lease needs no stimulus: a long poll started before expiry receives the task when the lease
    expires, and after a second expiry the very next short poll gets it."""
    queue = ctx.uid("q")
    first = await ctx.register(queue)
    waiting = await ctx.register(queue)
    third = await ctx.register(queue)
    await ctx.start(queue)
    task, reply = await _lease(ctx, first, queue)
    lease = lease_length(ctx, task, reply, WF_LEASE)
    ctx.needs_short(
        lease + SLACK,
        "a long poll spanning the workflow-task lease",
        "workflow_task_lease_seconds",
    )
    hold = min(60, math.ceil(lease + SLACK))
    expires = instant(task.get("lease_expires_at"))
    what = "a long poll started while the task was leased"
    reply, body, elapsed = await _waiting_poll(ctx, "workflow", waiting, queue, hold, expires, what)
    got = _task_of(body)
    _require_woken(
        ctx,
        reply,
        body,
        elapsed,
        got is not None and got.get("task_id") == task["task_id"],
        f"a long poll (timeout_seconds {hold}) started before lease expiry receives the task when the lease expires",
        f"task {task['task_id']} leased",
    )
    assert got is not None
    ctx.require(
        elapsed <= lease + SLACK / 2,
        "the waiting long poll is answered when the lease expires, not at the end of its hold",
        expected=f"within about {lease:g}s",
        received=f"{elapsed:.1f}s",
        replies=[reply],
        requirement="DISPATCH-LOST-NOTIFICATION",
    )
    # The second holder crashes too. Once the server's clock is past its lease, one short poll must get it.
    expires = instant(got.get("lease_expires_at"))
    ctx.require(
        expires is not None,
        "the redelivered task carries lease_expires_at",
        expected="a timestamp",
        received=got.get("lease_expires_at"),
        replies=[reply],
        requirement="DISPATCH-LOST-NOTIFICATION",
    )
    assert expires is not None
    await ctx.wait_past(expires, within=lease + SLACK, what="the server clock to pass the second lease")
    reply = await ctx.poll_wf(third, queue, 1)
    body = ctx.expect(
        reply, 200, what="the first poll after the second lease expired", requirement="EXPIRY-SELF-RECOVERY"
    )
    taken = _task_of(body)
    want = {"task_id": task["task_id"], "workflow_task_attempt": int(got.get("workflow_task_attempt") or 0) + 1}
    received = {k: (taken or {}).get(k) for k in want}
    ctx.require(
        received == want,
        "the first poll after a lease expired gets the task, with no other stimulus",
        expected=want,
        received={**received, "poll_status": body.get("poll_status")},
        replies=[reply],
        requirement="EXPIRY-SELF-RECOVERY",
    )


@check("DISPATCH-LOST-NOTIFICATION", slow=True)
async def dispatch_due_work_without_stimulus(ctx: CheckContext) -> None:
    """A due timer and a retry whose backoff passed reach a long poll that was already waiting, with no other
    request: the server finds due work itself."""
    delay = 2
    ctx.needs_short(
        delay + SLACK,
        "a long poll spanning a 2-second timer and retry backoff",
    )
    hold = math.ceil(delay + SLACK)
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    # A timer fires while the poll waits.
    await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    ctx.expect(
        await ctx.complete(task, [{"type": "start_timer", "delay_seconds": delay}]),
        200,
        what="complete with start_timer",
    )
    due = ctx.now() + timedelta(seconds=delay)
    reply, body, elapsed = await _waiting_poll(ctx, "workflow", worker, queue, hold, due, "a long poll for the timer")
    fired = _task_of(body)
    _require_woken(
        ctx,
        reply,
        body,
        elapsed,
        fired is not None and fired.get("run_id") == task.get("run_id") and elapsed <= delay + SLACK / 2,
        f"a long poll (timeout_seconds {hold}) receives the workflow task of a {delay}s timer once it is due",
        f"the run's task within about {delay}s",
    )
    assert fired is not None
    # A retry becomes available while the poll waits.
    policy = {"max_attempts": 2, "backoff_seconds": [delay]}
    ctx.expect(
        await ctx.complete(fired, [_activity_cmd(ctx.uid("act"), retry_policy=policy)]),
        200,
        what="complete scheduling a retried activity",
    )
    act, _ = await next_activity(ctx, worker, queue)
    transient = {"message": "conformance: transient", "type": "Transient"}
    reply = await activity_call(ctx, act, "fail", {"failure": transient})
    ctx.expect(reply, 200, what="a retryable activity failure")
    due = ctx.now() + timedelta(seconds=delay)
    reply, body, elapsed = await _waiting_poll(ctx, "activity", worker, queue, hold, due, "a long poll for the retry")
    retry = _task_of(body) or {}
    _require_woken(
        ctx,
        reply,
        body,
        elapsed,
        retry.get("activity_execution_id") == act.get("activity_execution_id") and elapsed <= delay + SLACK / 2,
        f"a long poll (timeout_seconds {hold}) receives the retry once its {delay}s backoff passed",
        f"attempt 2 of the activity within about {delay}s",
    )


@check("ACTIVITY-REDELIVERY-NEW-ATTEMPT", slow=True)
async def expiry_activity_redelivery(ctx: CheckContext) -> None:
    """An expired activity lease is re-claimed with a new activity_attempt_id and attempt_number + 1 without
    the retry backoff; the old attempt's late complete is 409 stale_attempt and only the new one records."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    crashed = await ctx.register(queue)
    successor = await ctx.register(queue)
    act_type = ctx.uid("act")
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    # A 60 s retry backoff: a redelivery that (wrongly) waited for it would miss the deadline below.
    policy = {"max_attempts": 3, "backoff_seconds": [60]}
    ctx.expect(
        await ctx.complete(task, [_activity_cmd(act_type, retry_policy=policy)]),
        200,
        what="complete scheduling an activity",
    )
    old, reply = await next_activity(ctx, crashed, queue)
    lease = lease_length(ctx, old, reply, ACT_LEASE)
    new, _ = await next_activity(ctx, successor, queue, within=lease + SLACK)
    req = "ACTIVITY-REDELIVERY-NEW-ATTEMPT"
    want = {
        "task_id": old.get("task_id"),
        "activity_execution_id": old.get("activity_execution_id"),
        "attempt_number": int(old.get("attempt_number") or 0) + 1,
        "lease_owner": successor,
    }
    got = {k: new.get(k) for k in want}
    ctx.require_equal(
        got, want, "the expired activity is re-claimed: same task and execution, attempt_number + 1", requirement=req
    )
    new_id, old_id = new.get("activity_attempt_id"), old.get("activity_attempt_id")
    ctx.require(
        bool(new_id) and new_id != old_id,
        "the re-claim creates a new activity_attempt_id",
        expected=f"≠ {old.get('activity_attempt_id')}",
        received=new.get("activity_attempt_id"),
        requirement=req,
    )
    reply = await activity_call(ctx, old, "complete", {"result": CheckContext.envelope("late")})
    what = "the expired attempt's late complete"
    ctx.expect(reply, 409, "stale_attempt", what=what, requirement=req, fields={"recorded": False})
    reply = await activity_call(ctx, new, "complete", {"result": CheckContext.envelope("winner")})
    what = "the new attempt's complete"
    ctx.expect(reply, 200, what=what, requirement=req, fields={"recorded": True})
    events = await _events(ctx, wid, run_id)
    done = [e for e in events if e.get("event_type") == "ActivityCompleted"]
    ctx.require(
        len(done) == 1 and str(new.get("activity_attempt_id")) in json.dumps(done),
        "history records one ActivityCompleted, the new attempt's",
        expected="one, of the new attempt",
        received=done,
        requirement=req,
    )


# =========================================================================================================
# cancellation and termination (§8.9 notes, §11.5, invariants 49-51)
# =========================================================================================================


async def _closed_task_calls(ctx: CheckContext, op: str, requirement: str) -> None:
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, _ = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"}), 200, what=op)
    status = "cancelled" if op == "cancel" else "terminated"
    for verb in VERBS:
        reply = await ctx.wf_call(task, verb, _verb_body(verb))
        _expect_run_closed(
            ctx,
            reply,
            stop_reason=f"run_{status}",
            cancel_requested=True,
            run_status=status,
            requirement=requirement,
            what=f"the owner's {verb} after {op}",
        )


@check("CANCEL-TASK-RUN-CLOSED")
async def cancel_leased_task_run_closed(ctx: CheckContext) -> None:
    """After cancel, the owner's heartbeat, complete, fail and history are 409 run_closed with can_continue
    false, cancel_requested true, stop_reason run_cancelled, run_status cancelled and run_closed_at."""
    await _closed_task_calls(ctx, "cancel", "CANCEL-TASK-RUN-CLOSED")


@check("TERMINATE-TASK-RUN-CLOSED")
async def terminate_leased_task_run_closed(ctx: CheckContext) -> None:
    """After terminate, the owner's heartbeat, complete, fail and history are 409 run_closed with
    stop_reason run_terminated, cancel_requested true and run_status terminated."""
    await _closed_task_calls(ctx, "terminate", "TERMINATE-TASK-RUN-CLOSED")


@check("CANCEL-RUN-CLOSED-BEFORE-FENCING")
async def cancel_run_closed_before_fencing(ctx: CheckContext) -> None:
    """After cancel, a wrong owner, a wrong attempt, or both, still get run_closed on every verb."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    stranger = await ctx.register(queue)
    wid, _ = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    attempt = int(task.get("workflow_task_attempt") or 1)
    ctx.expect(
        await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance"}), 200, what="cancel"
    )
    callers: dict[str, dict[str, Any]] = {
        "a wrong owner": {"owner": stranger},
        "a wrong attempt": {"attempt": attempt + 1},
        "a wrong owner and attempt": {"owner": stranger, "attempt": attempt + 1},
    }
    for who, fence in callers.items():
        for verb in VERBS:
            reply = await ctx.wf_call(task, verb, _verb_body(verb), **fence)
            _expect_run_closed(
                ctx,
                reply,
                stop_reason="run_cancelled",
                cancel_requested=True,
                run_status="cancelled",
                requirement="CANCEL-RUN-CLOSED-BEFORE-FENCING",
                what=f"{verb} by {who} after cancel",
            )


async def _drain_polls(
    ctx: CheckContext,
    worker: str,
    queue: str,
    *,
    kind: str,
    forbidden: set[str],
    control_run: str,
    on_control: Any = None,
    requirement: str,
) -> None:
    """Poll until an empty answer: no leased task may belong to a ``forbidden`` run; ``control_run``'s
    task must show up (the poller is live)."""
    seen_control = False
    for _ in range(20):
        reply = await (ctx.poll_wf(worker, queue, 1) if kind == "workflow" else poll_activity(ctx, worker, queue))
        body = ctx.expect(reply, 200, what=f"{kind}-task poll after cancel/terminate")
        task = body.get("task")
        if not isinstance(task, dict):
            if seen_control:
                return
            continue
        ctx.require(
            task.get("run_id") not in forbidden,
            f"no poll leases a {kind} task of a cancelled or terminated run",
            expected=f"no task of runs {sorted(forbidden)}",
            received=task.get("run_id"),
            replies=[reply],
            requirement=requirement,
        )
        if task.get("run_id") == control_run:
            seen_control = True
            if on_control is not None:
                await on_control(task)
    raise ctx.fail(
        f"the {kind} poller never leased the control run's task or never ran empty",
        expected=f"a lease of run {control_run}, then an empty poll",
        received="see exchanges",
    )


async def _no_leases_after_close(
    ctx: CheckContext, queue: str, worker: str, closed: set[str], requirement: str
) -> None:
    """A live control run on the same queue proves the pollers work; nothing of ``closed`` is ever leased."""
    control_act = ctx.uid("act-control")
    _, control_run = await ctx.start(queue)

    async def schedule(task: dict[str, Any]) -> None:
        ctx.expect(
            await ctx.complete(task, [_activity_cmd(control_act)]),
            200,
            what="the control run's complete scheduling an activity",
        )

    await _drain_polls(
        ctx,
        worker,
        queue,
        kind="workflow",
        forbidden=closed,
        control_run=control_run,
        on_control=schedule,
        requirement=requirement,
    )
    await _drain_polls(
        ctx, worker, queue, kind="activity", forbidden=closed, control_run=control_run, requirement=requirement
    )


@check("CANCEL-NO-NEW-LEASES")
async def cancel_no_new_leases(ctx: CheckContext) -> None:
    """After cancel or terminate, ready workflow and activity tasks of the run are never leased, while a live
    run on the same queue still is."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    runs = {
        op: await _started_with_activities(ctx, worker, queue, [ctx.uid("act"), ctx.uid("act")])
        for op in ("cancel", "terminate")
    }
    for op, (wid, _, _) in runs.items():
        # A signal wakes the waiting run: a ready workflow task joins the ready activity tasks.
        ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/wake", {}), 202, what="signal")
        ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"}), 200, what=op)
    await _no_leases_after_close(ctx, queue, worker, {run_id for _, run_id, _ in runs.values()}, "CANCEL-NO-NEW-LEASES")


@check("CANCEL-NO-NEW-LEASES", slow=True)
async def cancel_no_redelivery_after_expiry(ctx: CheckContext) -> None:
    """Workflow and activity tasks leased before a cancel are never leased again once their leases expire."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    holder = await ctx.register(queue)
    wid, run_id, _ = await _started_with_activities(ctx, worker, queue, [ctx.uid("act")])
    act, act_reply = await next_activity(ctx, holder, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/wake", {}), 202, what="signal")
    wf, wf_reply = await _lease(ctx, holder, queue)
    lease = max(lease_length(ctx, wf, wf_reply, WF_LEASE), lease_length(ctx, act, act_reply, ACT_LEASE))
    ctx.expect(
        await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance"}), 200, what="cancel"
    )
    instants = [i for i in (instant(wf.get("lease_expires_at")), instant(act.get("lease_expires_at"))) if i]
    latest = max(instants) if instants else ctx.now() + timedelta(seconds=lease + CLOCK_SKEW)
    await ctx.wait_past(latest, within=lease + SLACK, what="both leases to expire")
    await _no_leases_after_close(ctx, queue, worker, {run_id}, "CANCEL-NO-NEW-LEASES")


async def _leased_activities(ctx: CheckContext, n: int) -> tuple[str, str, list[dict[str, Any]]]:
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id, _ = await _started_with_activities(ctx, worker, queue, [ctx.uid("act") for _ in range(n)])
    leased = [(await next_activity(ctx, worker, queue))[0] for _ in range(n)]
    return wid, run_id, leased


@check("CANCEL-ACTIVITY-HEARTBEAT")
async def cancel_activity_heartbeat(ctx: CheckContext) -> None:
    """An activity leased before a cancel (terminate) heartbeats 200 with cancel_requested true, can_continue
    false and reason run_cancelled (run_terminated)."""
    for op, reason in (("cancel", "run_cancelled"), ("terminate", "run_terminated")):
        wid, _, (act,) = await _leased_activities(ctx, 1)
        ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"}), 200, what=op)
        reply = await activity_call(ctx, act, "heartbeat", {"message": "still working"})
        body = ctx.expect(reply, 200, what=f"activity heartbeat after {op}")
        want: dict[str, Any] = {"cancel_requested": True, "can_continue": False, "reason": reason}
        _require_fields(ctx, reply, body, want, f"the activity heartbeat reports the {op} (§11.5)")


@check("CANCEL-ACTIVITY-OUTCOME-IGNORED")
async def cancel_activity_outcome_ignored(ctx: CheckContext) -> None:
    """After a cancel (terminate), an activity's complete or fail is 409 outcome ignored, recorded false,
    and history records no ActivityCompleted or ActivityFailed."""
    for op, reason in (("cancel", "run_cancelled"), ("terminate", "run_terminated")):
        wid, run_id, (first, second) = await _leased_activities(ctx, 2)
        ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"}), 200, what=op)
        # One attempt learns of the cancel through its heartbeat first, the other reports straight away.
        ctx.expect(await activity_call(ctx, first, "heartbeat"), 200, what=f"activity heartbeat after {op}")
        reports = (
            ("complete", first, {"result": CheckContext.envelope("late")}),
            ("fail", second, {"failure": {"message": "conformance: late failure"}}),
        )
        for verb, act, body in reports:
            reply = await activity_call(ctx, act, verb, body)
            out = ctx.expect(reply, 409, reason, what=f"activity {verb} after {op}")
            got = {"outcome": out.get("outcome", "<absent>"), "recorded": out.get("recorded", "<absent>")}
            ctx.require(
                _same(got["outcome"], "ignored") and _same(got["recorded"], False),
                f"an activity {verb} after {op} is ignored",
                expected={"outcome": "ignored", "recorded": False},
                received=got,
                replies=[reply],
            )
        events = await _events(ctx, wid, run_id)
        ctx.require_counts(
            events,
            {"ActivityCompleted": 0, "ActivityFailed": 0},
            f"activity outcomes reported after {op} are not recorded",
        )


# =========================================================================================================
# dispatch (§14.1)
# =========================================================================================================


@check("DISPATCH-CANCEL-DURABLE")
async def dispatch_cancel_from_other_client(ctx: CheckContext) -> None:
    """A cancel sent by another client over its own connection reaches the worker: its workflow task sees
    run_closed, its activity heartbeat cancel_requested, and its polls lease nothing more of the run."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id, _ = await _started_with_activities(ctx, worker, queue, [ctx.uid("act"), ctx.uid("act")])
    act, _ = await next_activity(ctx, worker, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/wake", {}), 202, what="signal")
    wf, _ = await _lease(ctx, worker, queue)
    async with _other_client(ctx) as operator:
        reply = await operator.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance: other client"})
        ctx.expect(reply, 200, what="cancel from a separate client")
    reply = await ctx.wf_call(wf, "heartbeat")
    _expect_run_closed(
        ctx,
        reply,
        stop_reason="run_cancelled",
        cancel_requested=True,
        run_status="cancelled",
        requirement="DISPATCH-CANCEL-DURABLE",
        what="the worker's workflow-task heartbeat",
    )
    reply = await activity_call(ctx, act, "heartbeat")
    body = ctx.expect(reply, 200, what="the worker's activity heartbeat")
    ctx.require(
        body.get("cancel_requested") is True and body.get("can_continue") is False,
        "the activity heartbeat carries the cancel sent by the other client",
        expected="cancel_requested true, can_continue false",
        received={k: body.get(k) for k in ("cancel_requested", "can_continue", "reason")},
        replies=[reply],
    )
    for kind in ("workflow", "activity"):
        reply = await (ctx.poll_wf(worker, queue, 1) if kind == "workflow" else poll_activity(ctx, worker, queue))
        task = ctx.expect(reply, 200, what=f"{kind}-task poll after the cancel").get("task")
        ctx.require(
            not isinstance(task, dict) or task.get("run_id") != run_id,
            f"no {kind} task of the cancelled run is leased after the cancel",
            expected="no task of the run",
            received=task,
            replies=[reply],
        )


# =========================================================================================================
# control plane (§12)
# =========================================================================================================


@check("CONTROL-START")
async def control_start_outcomes(ctx: CheckContext) -> None:
    """Start is 201 started_new, then 409 rejected_duplicate under the default policy and 200
    returned_existing_active with use-existing; a bad duplicate_policy, a legacy field or a timeout ≤ 0 is
    422 and starts nothing."""
    queue = ctx.uid("q")
    wid = ctx.uid("wf")
    body = {"workflow_type": "conformance.Probe", "workflow_id": wid, "task_queue": queue}
    reply = await ctx.client.control("POST", "/workflows", body)
    first = ctx.expect(reply, 201, what="a new start")
    ctx.require(
        first.get("outcome") == "started_new" and bool(first.get("run_id")),
        "a new start says outcome started_new and names its run_id",
        expected="started_new",
        received={k: first.get(k) for k in ("outcome", "run_id")},
        replies=[reply],
    )
    reply = await ctx.client.control("POST", "/workflows", body)
    dup = ctx.expect(reply, 409, what="a second start of an active workflow id")
    ctx.require(
        "rejected_duplicate" in (dup.get("reason"), dup.get("outcome")),
        "the duplicate start is rejected_duplicate",
        expected="reason or outcome rejected_duplicate",
        received={k: dup.get(k) for k in ("reason", "outcome")},
        replies=[reply],
    )
    reply = await ctx.client.control("POST", "/workflows", {**body, "duplicate_policy": "use-existing"})
    same = ctx.expect(reply, 200, what="a start with duplicate_policy use-existing")
    existing = same.get("outcome") == "returned_existing_active" and same.get("run_id") == first.get("run_id")
    ctx.require(
        existing,
        "use-existing returns the active run",
        expected={"outcome": "returned_existing_active", "run_id": first.get("run_id")},
        received={k: same.get(k) for k in ("outcome", "run_id")},
        replies=[reply],
    )
    bad: dict[str, dict[str, Any]] = {
        "duplicate_policy use_existing": {"duplicate_policy": "use_existing"},
        "duplicate_policy reject": {"duplicate_policy": "reject"},
        "execution_timeout_seconds 0": {"execution_timeout_seconds": 0},
        "execution_timeout_seconds -5": {"execution_timeout_seconds": -5},
        "run_timeout_seconds 0": {"run_timeout_seconds": 0},
    }
    for legacy in LEGACY_START_FIELDS:
        bad[f"legacy field {legacy}"] = {legacy: {"max_attempts": 1} if legacy == "retry_policy" else "x1"}
    for what, extra in bad.items():
        other = ctx.uid("wf")
        reply = await ctx.client.control("POST", "/workflows", {**body, "workflow_id": other, **extra})
        ctx.expect(reply, 422, what=f"a start with {what}")
        probe = await ctx.client.control("GET", f"/workflows/{other}")
        ctx.expect(probe, 404, "instance_not_found", what=f"describe after the rejected start with {what}")


@check("CONTROL-HISTORICAL-RUN")
async def control_historical_run_rejected(ctx: CheckContext) -> None:
    """After continue_as_new, signal, cancel and terminate aimed at the first run are 409
    historical_run_command_rejected and leave the current run alone."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, first_run = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    ctx.expect(await ctx.complete(task, [{"type": "continue_as_new"}]), 200, what="complete with continue_as_new")
    described = await ctx.describe(wid)
    current = described.get("run_id")
    ctx.require(
        bool(current) and current != first_run,
        "continue_as_new makes a new current run",
        expected=f"a run_id other than {first_run}",
        received=current,
    )
    for path in ("signal/ping", "cancel", "terminate"):
        reply = await ctx.client.control("POST", f"/workflows/{wid}/runs/{first_run}/{path}", {})
        ctx.expect(reply, 409, "historical_run_command_rejected", what=f"{path} aimed at the historical run")
    described = await ctx.describe(wid)
    ctx.require(
        described.get("run_id") == current and described.get("status") in LIVE_RUN_STATUSES,
        "rejected historical-run commands do not touch the current run",
        expected=f"run {current} still live",
        received={k: described.get(k) for k in ("run_id", "status")},
    )
    # The same route on the current run is accepted: the 409 above is about the run, not the route.
    reply = await ctx.client.control("POST", f"/workflows/{wid}/runs/{current}/signal/ping", {})
    ctx.expect(reply, 202, what="a signal aimed at the current run")


@check("CONTROL-UNKNOWN-WORKFLOW")
async def control_unknown_workflow_and_run(ctx: CheckContext) -> None:
    """An unknown workflow is 404 instance_not_found; an unknown run of a known one is 404 run_not_found."""
    absent = ctx.uid("absent")
    calls = [
        ("GET", f"/workflows/{absent}"),
        ("POST", f"/workflows/{absent}/signal/ping"),
        ("POST", f"/workflows/{absent}/cancel"),
        ("POST", f"/workflows/{absent}/terminate"),
    ]
    for method, path in calls:
        reply = await ctx.client.control(method, path, {} if method == "POST" else None)
        ctx.expect(reply, 404, "instance_not_found", what=f"{method} on an unknown workflow")
    wid, _ = await ctx.start(ctx.uid("q"))
    ghost = ctx.uid("no-such-run")
    run = f"/workflows/{wid}/runs/{ghost}"
    calls = [("GET", run), ("GET", f"{run}/history"), ("POST", f"{run}/signal/ping"), ("POST", f"{run}/cancel")]
    for method, path in calls:
        reply = await ctx.client.control(method, path, {} if method == "POST" else None)
        ctx.expect(reply, 404, "run_not_found", what=f"{method} on an unknown run of a known workflow")


@check("CONTROL-CANCEL-CLOSES-RUN")
async def control_cancel_closes_run(ctx: CheckContext) -> None:
    """Cancel and terminate close the run at once: describe shows status and closed_reason cancelled
    (terminated), and a second cancel is 409."""
    queue = ctx.uid("q")
    for op, status in (("cancel", "cancelled"), ("terminate", "terminated")):
        wid, run_id = await ctx.start(queue)
        reply = await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"})
        ctx.expect(reply, 200, what=op, requirement="CONTROL-CANCEL-CLOSES-RUN", fields={"outcome": status})
        described = await ctx.describe(wid)
        got = {k: described.get(k) for k in ("run_id", "status", "closed_reason")}
        want = {"run_id": run_id, "status": status, "closed_reason": status}
        ctx.require_equal(got, want, f"{op} closes the run immediately", requirement="CONTROL-CANCEL-CLOSES-RUN")
        reply = await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "again"})
        ctx.expect(reply, 409, what=f"cancel of a run already {status}", requirement="CONTROL-CANCEL-CLOSES-RUN")


# =========================================================================================================
# namespace scoping (§4.2)
# =========================================================================================================


def _foreign_namespace(ctx: CheckContext) -> str:
    # When the suite runs in a namespace other than 'default', 'default' most likely exists, and then the
    # answer must be task_not_found itself; otherwise only an unknown namespace is available.
    return "default" if ctx.target.namespace != "default" else ctx.uid("other-namespace")


@check("NAMESPACE-SCOPED")
async def namespace_scoped_task_ids(ctx: CheckContext) -> None:
    """A workflow, activity or query task id used under another X-Namespace is not found (404) and has no
    effect; the task stays usable in its own namespace.

    Black-box limit: the protocol has no API to create a namespace, so unless the suite runs in a namespace
    other than 'default' (then 'default' is the other one), the other namespace is unknown and the server
    answers 404 namespace_not_found before any task lookup. That still shows the id is not visible there,
    and the check then asserts that the foreign call changed nothing; it cannot prove the lookup itself is
    keyed by namespace.
    """
    other = _foreign_namespace(ctx)
    queue = ctx.uid("q")
    worker = await ctx.register(queue, capabilities=["query_tasks"])
    wid, run_id = await ctx.start(queue)
    task, _ = await _lease(ctx, worker, queue)
    await _foreign_workflow_calls(ctx, task, worker, other)
    act_type = ctx.uid("act")
    ctx.expect(
        await ctx.complete(task, [_activity_cmd(act_type)]),
        200,
        what="the owner's complete in its own namespace after the foreign calls",
    )
    act, _ = await next_activity(ctx, worker, queue)
    await _foreign_activity_calls(ctx, act, other)
    answer = await _foreign_query_calls(ctx, wid, worker, queue, other)
    ctx.expect(answer, 200, what="the control-plane query")
    events = await _events(ctx, wid, run_id)
    ctx.require(
        "foreign" not in json.dumps(answer.json()) and _count(events, "ActivityFailed") == 0,
        "calls under another namespace had no effect",
        expected="the home namespace's answers only",
        received={"query": answer.json().get("result"), "events": _types(events)},
        replies=[answer],
    )


async def _foreign_workflow_calls(ctx: CheckContext, task: dict[str, Any], worker: str, other: str) -> None:
    """Every workflow-task verb under ``other`` is 404; the lease still renews at home after each."""
    not_found = ("task_not_found", "namespace_not_found")
    for verb in VERBS:
        payload = {
            "lease_owner": worker,
            "workflow_task_attempt": task.get("workflow_task_attempt"),
            **_verb_body(verb),
        }
        reply = await ctx.client.worker(f"/workflow-tasks/{task['task_id']}/{verb}", payload, namespace=other)
        ctx.expect(
            reply,
            404,
            not_found,
            what=f"workflow-task {verb} under X-Namespace {other}",
            requirement="NAMESPACE-SCOPED",
        )
        await _renew(ctx, task, f"at home after the foreign {verb}", "NAMESPACE-SCOPED")


async def _foreign_activity_calls(ctx: CheckContext, act: dict[str, Any], other: str) -> None:
    """Every activity-task verb under ``other`` is 404; the attempt still completes at home."""
    not_found = ("task_not_found", "namespace_not_found")
    act_probes: tuple[tuple[str, dict[str, Any]], ...] = (
        ("heartbeat", {}),
        ("complete", {"result": None}),
        ("fail", {"failure": {"message": "foreign"}}),
    )
    for verb, extra in act_probes:
        reply = await activity_call(ctx, act, verb, extra, namespace=other)
        ctx.expect(
            reply,
            404,
            not_found,
            what=f"activity-task {verb} under X-Namespace {other}",
            requirement="NAMESPACE-SCOPED",
        )
    reply = await activity_call(ctx, act, "complete", {"result": CheckContext.envelope("ok")})
    ctx.expect(reply, 200, what="the activity complete in its own namespace", requirement="NAMESPACE-SCOPED")


async def _foreign_query_calls(ctx: CheckContext, wid: str, worker: str, queue: str, other: str) -> Reply:
    """A query task's complete and fail under ``other`` are 404; the home complete answers the query."""
    # A query task: the control-plane query waits while the worker leases and answers it.
    timeout = float(ctx.target.test_profile.get("query_task_timeout_seconds") or 30) + 15
    query = asyncio.ensure_future(
        ctx.client.control("POST", f"/workflows/{wid}/query/status", {"input": []}, timeout=timeout)
    )
    try:

        async def probe() -> dict[str, Any] | None:
            reply = await ctx.poll("query", worker, queue)
            qt = ctx.expect(reply, 200, what="query-task poll").get("task")
            if not isinstance(qt, dict):
                require_open(ctx, query)
            return qt if isinstance(qt, dict) else None

        qtask = await ctx.wait_until(probe, timeout=timeout, what="a query task")
        qid = qtask.get("query_task_id")
        fence = {"lease_owner": worker, "query_task_attempt": qtask.get("query_task_attempt")}
        foreign: tuple[tuple[str, dict[str, Any]], ...] = (
            ("complete", {"result": "foreign"}),
            ("fail", {"failure": {"message": "foreign"}}),
        )
        for verb, extra in foreign:
            reply = await ctx.client.worker(f"/query-tasks/{qid}/{verb}", {**fence, **extra}, namespace=other)
            ctx.expect(
                reply,
                404,
                ("query_task_not_found", "namespace_not_found"),
                what=f"query-task {verb} under X-Namespace {other}",
                requirement="NAMESPACE-SCOPED",
            )
        reply = await ctx.client.worker(
            f"/query-tasks/{qid}/complete", {**fence, "result_envelope": CheckContext.envelope("home")}
        )
        ctx.expect(reply, 200, what="the query complete in its own namespace", requirement="NAMESPACE-SCOPED")
        answer = await query
    finally:
        if not query.done():
            query.cancel()
            with contextlib.suppress(BaseException):
                await query
    return answer
