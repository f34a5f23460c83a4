"""Fencing and lease expiry (§8.9, §9, §10.6, §11.2; invariants 26-29): a report from anyone but
the lease's holder, or for an attempt that is over, is rejected in the guard order and changes nothing; an expired
lease is fenced and its task delivered again.

Every check builds its own queue, workers and workflows. The checks that need a lease to expire read its
length from ``worker_protocol.test_profile`` (or measure it as ``lease_expires_at`` minus the response's
``Date``) and are not covered when it exceeds ``--max-wait``; they wait for what the protocol promises
(a redelivery, a rejection) with a deadline of the lease plus slack, and read the *server's* clock from
the ``Date`` header of ``GET /api/health`` when they must know that an instant has passed.
"""

from __future__ import annotations

import json
from typing import Any

from suite.context import CheckContext
from suite.protocol.history import RUN_TERMINAL_EVENTS
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    ACT_LEASE,
    LIVE_RUN_STATUSES,
    SLACK,
    WORKFLOW_TASK_VERBS,
    activity_call,
    activity_cmd,
    complete_cmd,
    contested_lease,
    count_events,
    event_types,
    expect_run_cancelled,
    expect_run_closed,
    lease_length,
    lease_workflow_task,
    next_activity,
    renew_lease,
    require_run_open,
    require_taken_over,
    same_json,
    verb_body,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.FENCING, Area.EXPIRY)


def _timer_cmd() -> dict[str, Any]:
    # A long timer: the batch is non-terminal and nothing wakes the run while the check runs.
    return {"type": "start_timer", "delay_seconds": 3600}


async def _fenced_calls_changed_nothing(
    ctx: CheckContext, task: dict[str, Any], wid: str, run_id: str, holder: str
) -> None:
    """FENCE-NO-STATE-CHANGE: after the fenced calls the lease ``holder``'s complete still succeeds, and the
    history holds exactly that completion."""
    reply = await ctx.complete(task, [complete_cmd()])
    ctx.expect(reply, 200, what=f"{holder}'s complete after fenced calls", requirement="FENCE-NO-STATE-CHANGE")
    ctx.require_counts(
        await ctx.history(wid, run_id),
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
    task, _ = await lease_workflow_task(ctx, owner, queue)
    for verb in WORKFLOW_TASK_VERBS:
        reply = await ctx.wf_call(task, verb, verb_body(verb), owner=intruder)
        ctx.expect(
            reply,
            409,
            "lease_owner_mismatch",
            what=f"{verb} by a worker without the lease",
            requirement="FENCE-OWNER",
            fields={"lease_owner": owner},  # the current owner
        )
        await renew_lease(ctx, task, f"after the fenced {verb}", "FENCE-NO-STATE-CHANGE")
    # Nothing moved: the run is open and the owner's complete is the only one recorded.
    await require_run_open(ctx, wid, "a fenced complete or fail must not close the run", "FENCE-NO-STATE-CHANGE")
    await _fenced_calls_changed_nothing(ctx, task, wid, run_id, "the owner")


@check("FENCE-ATTEMPT", "FENCE-NO-STATE-CHANGE")
async def fence_stale_attempt(ctx: CheckContext) -> None:
    """The right owner with workflow_task_attempt = current+1 is 409 workflow_task_attempt_mismatch with
    current_attempt on every verb, and the real attempt still completes."""
    queue = ctx.uid("q")
    owner = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, _ = await lease_workflow_task(ctx, owner, queue)
    current = task.get("workflow_task_attempt")
    ctx.require(
        isinstance(current, int) and not isinstance(current, bool),
        "a leased task carries an integer workflow_task_attempt",
        expected="int",
        received=current,
        requirement="FENCE-ATTEMPT",
    )
    assert isinstance(current, int)
    for verb in WORKFLOW_TASK_VERBS:
        reply = await ctx.wf_call(task, verb, verb_body(verb), attempt=current + 1)
        body = ctx.expect(
            reply,
            409,
            "workflow_task_attempt_mismatch",
            what=f"{verb} with workflow_task_attempt {current + 1} (current {current})",
            requirement="FENCE-ATTEMPT",
        )
        ctx.require(
            same_json(body.get("current_attempt"), current),
            f"{verb}: workflow_task_attempt_mismatch states current_attempt",
            expected=current,
            received=body.get("current_attempt"),
            replies=[reply],
            requirement="FENCE-ATTEMPT",
        )
        await renew_lease(ctx, task, f"after the fenced {verb}", "FENCE-NO-STATE-CHANGE")
    await _fenced_calls_changed_nothing(ctx, task, wid, run_id, "the current attempt")


@check("FENCE-UNKNOWN-TASK")
async def fence_unknown_task_ids(ctx: CheckContext) -> None:
    """Every workflow-task verb and every activity-task verb on an unknown task id is 404 task_not_found."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    ghost = ctx.uid("no-such-task")
    for verb in WORKFLOW_TASK_VERBS:
        body = {"lease_owner": worker, "workflow_task_attempt": 1, **verb_body(verb)}
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
    task, _ = await lease_workflow_task(ctx, worker, queue)
    ctx.expect(await ctx.complete(task, [complete_cmd()]), 200, what="the first complete")
    again = await ctx.complete(task, [complete_cmd("again")])
    closed_by_batch: dict[str, Any] = {
        "stop_reason": "run_completed",
        "cancel_requested": False,
        "run_status": "completed",
        "requirement": "FENCE-AFTER-COMPLETE",
    }
    expect_run_closed(ctx, again, what="a second complete after complete_workflow", **closed_by_batch)
    fail = await ctx.wf_call(task, "fail", verb_body("fail"))
    expect_run_closed(ctx, fail, what="a fail after complete_workflow", **closed_by_batch)
    events = await ctx.history(wid, run_id)
    ctx.require_counts(events, {"WorkflowCompleted": 1}, "history shows exactly one WorkflowCompleted")
    # The batch leaves the run open.
    wid2, _ = await ctx.start(queue)
    task2, _ = await lease_workflow_task(ctx, worker, queue)
    ctx.expect(await ctx.complete(task2, [_timer_cmd()]), 200, what="a non-terminal complete")
    again = await ctx.complete(task2, [complete_cmd()])
    ctx.expect(again, 409, "task_not_leased", what="a second complete after a non-terminal batch")
    fail = await ctx.wf_call(task2, "fail", verb_body("fail"))
    ctx.expect(fail, 409, "task_not_leased", what="a fail after a non-terminal batch")
    await require_run_open(ctx, wid2, "the rejected second complete did not close the run")


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
    task, _ = await lease_workflow_task(ctx, worker, queue)
    attempt = int(task.get("workflow_task_attempt") or 1)
    marker = ctx.uid("fenced-marker")
    fenced = [activity_cmd(marker), {"type": "fail_workflow", "message": marker}]
    reply = await ctx.wf_call(task, "complete", {"commands": fenced}, owner=stranger, attempt=attempt + 1)
    ctx.expect(reply, 409, "lease_owner_mismatch", what="complete with a wrong owner and a wrong attempt")
    reply = await ctx.wf_call(task, "complete", {"commands": fenced}, attempt=attempt + 1)
    ctx.expect(reply, 409, "workflow_task_attempt_mismatch", what="complete with a stale attempt")
    events = await ctx.history(wid, run_id)
    ctx.require(
        marker not in json.dumps(events) and count_events(events, "WorkflowFailed") == 0,
        "wrong owners and stale attempts are rejected before commands are applied",
        expected="no event from the fenced batch",
        received=event_types(events),
    )
    # Not leased before owner and attempt: the task was completed, the run stays open.
    await renew_lease(ctx, task, "after the fenced completes", "FENCE-ORDER")
    ctx.expect(await ctx.complete(task, [_timer_cmd()]), 200, what="the owner's non-terminal complete")
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger, attempt=attempt + 1)
    ctx.expect(reply, 409, "task_not_leased", what="heartbeat of a completed task with a wrong owner and attempt")
    # Run closed before not leased, owner and attempt.
    ctx.expect(
        await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance"}), 200, what="cancel"
    )
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger, attempt=attempt + 1)
    what = "heartbeat of a completed task of a cancelled run"
    expect_run_cancelled(ctx, reply, what=what, requirement="FENCE-ORDER")


@check("FENCE-TASK-FAILED-NOT-LEASED")
async def fence_after_task_fail(ctx: CheckContext) -> None:
    """After a workflow-task fail, complete, fail and heartbeat of that attempt are 409 task_not_leased and
    the run stays open."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task, _ = await lease_workflow_task(ctx, worker, queue)
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
        reply = await ctx.wf_call(task, verb, verb_body(verb))
        ctx.expect(reply, 409, "task_not_leased", what=f"{verb} of a failed attempt")
    described = await ctx.describe(wid)
    events = await ctx.history(wid, run_id)
    closed = [e for e in event_types(events) if e in RUN_TERMINAL_EVENTS]
    ctx.require(
        described.get("status") in LIVE_RUN_STATUSES and not closed,
        "a workflow-task failure does not close the run",
        expected=f"status in {LIVE_RUN_STATUSES}",
        received=f"status {described.get('status')!r}, events {event_types(events)}",
    )


@check("EXPIRY-HOLDER-FENCED", "FENCE-ORDER", "EXPIRY-REDELIVER-SAME-TASK", slow=True)
async def expiry_holder_fenced(ctx: CheckContext) -> None:
    """Once lease_expires_at passes, the holder's heartbeat and complete are 409 (lease_expired before a
    reclaim, the owner and attempt checks coming after it), never 200; after its own re-poll (attempt+1)
    its old attempt is workflow_task_attempt_mismatch."""
    world = await contested_lease(ctx)
    task, holder, stranger, lease = world.task, world.holder, world.rival, world.lease(ctx)
    expires = ctx.lease_expiry(task, world.reply, "EXPIRY-HOLDER-FENCED")
    await ctx.wait_past(expires, within=lease + SLACK, what="the server clock to pass lease_expires_at")
    # Nobody has reclaimed the task: whoever asks is told the lease expired (a server whose repair loop
    # already put the task back to ready answers task_not_leased, which the order also allows).
    unclaimed = ("lease_expired", "task_not_leased")
    reply = await ctx.wf_call(task, "heartbeat")
    ctx.expect(
        reply, 409, unclaimed, what="the holder's heartbeat after lease_expires_at", requirement="EXPIRY-HOLDER-FENCED"
    )
    reply = await ctx.complete(task, [complete_cmd()])
    ctx.expect(
        reply, 409, unclaimed, what="the holder's complete after lease_expires_at", requirement="EXPIRY-HOLDER-FENCED"
    )
    reply = await ctx.wf_call(task, "heartbeat", owner=stranger)
    ctx.expect(reply, 409, unclaimed, what="a wrong owner's heartbeat on an expired lease", requirement="FENCE-ORDER")
    # The same worker polls again: the same task with the next attempt; its old attempt stays fenced.
    again, _ = await lease_workflow_task(ctx, holder, world.queue, within=lease + SLACK)
    require_taken_over(
        ctx,
        task,
        again,
        None,
        "after expiry the same task_id is redelivered with workflow_task_attempt + 1",
        requirement="EXPIRY-REDELIVER-SAME-TASK",
    )
    reply = await ctx.complete(task, [complete_cmd("stale")])
    ctx.expect(
        reply,
        409,
        "workflow_task_attempt_mismatch",
        what="the old attempt's complete after the same worker re-leased the task",
        requirement="EXPIRY-HOLDER-FENCED",
    )
    ctx.expect(
        await ctx.complete(again, [complete_cmd()]),
        200,
        what="the new attempt's complete",
        requirement="EXPIRY-REDELIVER-SAME-TASK",
    )
    events = await ctx.history(world.workflow_id, world.run_id)
    ctx.require_counts(
        events, {"WorkflowCompleted": 1}, "only the new attempt completed the run", "EXPIRY-HOLDER-FENCED"
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
    task, _ = await lease_workflow_task(ctx, worker, queue)
    # A 60 s retry backoff: a redelivery that (wrongly) waited for it would miss the deadline below.
    policy = {"max_attempts": 3, "backoff_seconds": [60]}
    ctx.expect(
        await ctx.complete(task, [activity_cmd(act_type, retry_policy=policy)]),
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
    events = await ctx.history(wid, run_id)
    done = [e for e in events if e.get("event_type") == "ActivityCompleted"]
    ctx.require(
        len(done) == 1 and str(new.get("activity_attempt_id")) in json.dumps(done),
        "history records one ActivityCompleted, the new attempt's",
        expected="one, of the new attempt",
        received=done,
        requirement=req,
    )
