"""Cancellation and termination as a worker sees them (§8.9, §11.5; invariants 49-51): a leased task
of a closed run answers run_closed before any fencing, no new leases follow the close, activity heartbeats carry
the cancel and late outcomes are ignored; and the cooperative cancellation of children (``request_cancellation``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from suite.context import CLOCK_SKEW, CheckContext
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    ACT_LEASE,
    SLACK,
    WF_LEASE,
    WORKFLOW_TASK_VERBS,
    activity_call,
    activity_cmd,
    contested_lease,
    expect_run_cancelled,
    expect_run_closed,
    instant,
    lease_length,
    lease_workflow_task,
    next_activity,
    poll_activity,
    require_fields,
    same_json,
    started_with_activities,
    verb_body,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.CANCELLATION,)


async def _closed_task_calls(ctx: CheckContext, op: str, requirement: str) -> None:
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, _ = await ctx.start(queue)
    task, _ = await lease_workflow_task(ctx, worker, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"}), 200, what=op)
    status = "cancelled" if op == "cancel" else "terminated"
    for verb in WORKFLOW_TASK_VERBS:
        reply = await ctx.wf_call(task, verb, verb_body(verb))
        expect_run_closed(
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
    world = await contested_lease(ctx)
    wid, task, stranger = world.workflow_id, world.task, world.rival
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
        for verb in WORKFLOW_TASK_VERBS:
            reply = await ctx.wf_call(task, verb, verb_body(verb), **fence)
            what = f"{verb} by {who} after cancel"
            expect_run_cancelled(ctx, reply, what=what, requirement="CANCEL-RUN-CLOSED-BEFORE-FENCING")


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
            await ctx.complete(task, [activity_cmd(control_act)]),
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
        op: await started_with_activities(ctx, worker, queue, [ctx.uid("act"), ctx.uid("act")])
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
    wid, run_id, _ = await started_with_activities(ctx, worker, queue, [ctx.uid("act")])
    act, act_reply = await next_activity(ctx, holder, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/wake", {}), 202, what="signal")
    wf, wf_reply = await lease_workflow_task(ctx, holder, queue)
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
    wid, run_id, _ = await started_with_activities(ctx, worker, queue, [ctx.uid("act") for _ in range(n)])
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
        require_fields(
            ctx, reply, body, want, f"the activity heartbeat reports the {op} (docs/reference.md: Activities)"
        )


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
                same_json(got["outcome"], "ignored") and same_json(got["recorded"], False),
                f"an activity {verb} after {op} is ignored",
                expected={"outcome": "ignored", "recorded": False},
                received=got,
                replies=[reply],
            )
        events = await ctx.history(wid, run_id)
        ctx.require_counts(
            events,
            {"ActivityCompleted": 0, "ActivityFailed": 0},
            f"activity outcomes reported after {op} are not recorded",
        )
