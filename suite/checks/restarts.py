"""Restarts: the target killed hard mid-flight and started again (``--restart-command``; the embedded target
restarts itself). Work acknowledged before the restart is all there after it, accepted runs are still dispatched,
held leases run out at their acknowledged instant and are taken over, and a stale lease from before the restart
is fenced. Each check restarts the target once, alone in the run (no other item is in flight meanwhile)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from suite.context import CheckContext
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    ACTIVITY_TYPE,
    READY_WITHIN,
    SLACK,
    activity_call,
    activity_cmd,
    complete_cmd,
    contested_lease,
    event_types,
    fenced_report,
    instant,
    lease_task,
    lease_workflow_task,
    require_no_trace,
    require_taken_over,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.DISPATCH,)

# Timestamps may be kept to the second: a takeover is early only when it is more than this before the expiry.
INSTANT_RESOLUTION = timedelta(seconds=1)


def _view(event: dict[str, Any]) -> tuple[Any, Any, str]:
    return event.get("sequence"), event.get("event_type"), json.dumps(event.get("payload"), sort_keys=True)


@check("RESTART-ACKNOWLEDGED-DURABLE", "RESTART-WORK-TAKEN-OVER", restarts=True)
async def restart_keeps_acknowledged_work(ctx: CheckContext) -> None:
    """Acknowledged starts, a signal, a workflow completion and an activity completion, then a hard restart:
    every run keeps its id and every event recorded before it; the runs with work pending are leased after it."""
    if ctx.target.restart_command is None:
        await ctx.restart()  # not covered, naming --restart-command
    # A run accepted and signalled on a queue no worker polls before the restart: dispatched after it.
    idle = ctx.uid("q-idle")
    waiting, waiting_run = await ctx.start(idle)
    signal = await ctx.client.control("POST", f"/workflows/{waiting}/signal/conformance", {})
    ctx.expect(signal, (200, 202), what="signal", requirement="RESTART-ACKNOWLEDGED-DURABLE")
    # On another queue: a run completed (its close must survive) and a run whose activity completed (its result
    # must survive, and its next workflow task be dispatched).
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    closed, closed_run = await ctx.start(queue)
    resumed, resumed_run = await ctx.start(queue)
    runs = {waiting: waiting_run, closed: closed_run, resumed: resumed_run}
    for _ in range(2):
        task, _ = await lease_workflow_task(ctx, worker, queue)
        if task.get("workflow_id") == closed:
            command = complete_cmd(ctx.uid("kept"))
        else:
            command = activity_cmd(ACTIVITY_TYPE, arguments=ctx.envelope([]))
        done = await ctx.complete(task, [command])
        ctx.expect(done, 200, what="workflow-task complete", requirement="RESTART-ACKNOWLEDGED-DURABLE")
    activity, _ = await lease_task(ctx, "activity", worker, queue)
    result = {"result": ctx.envelope({"kept": ctx.uid("result")})}
    done = await activity_call(ctx, activity, "complete", result)
    ctx.expect(done, 200, what="activity complete", requirement="RESTART-ACKNOWLEDGED-DURABLE")
    before = {wid: await ctx.history(wid, rid) for wid, rid in runs.items()}

    await ctx.restart()

    for wid, rid in runs.items():
        described = await ctx.describe(wid)
        ctx.require_equal(described.get("run_id"), rid, f"{wid} keeps its run id across the restart")
        after = await ctx.history(wid, rid)
        kept = [_view(e) for e in after[: len(before[wid])]]
        ctx.require(
            kept == [_view(e) for e in before[wid]],
            f"every event of {wid} recorded before the restart is there after it, unchanged",
            expected=event_types(before[wid]),
            received=event_types(after),
        )
    ctx.require_equal((await ctx.describe(closed)).get("status"), "completed", "the completed run stays completed")
    # Both runs with a ready workflow task are leased after the restart, by workers that never saw them.
    for wid, on in ((waiting, idle), (resumed, queue)):
        successor = await ctx.register(on)
        task, _ = await lease_task(
            ctx, "workflow", successor, on, within=READY_WITHIN, requirement="RESTART-WORK-TAKEN-OVER"
        )
        ctx.require_equal(
            task.get("workflow_id"),
            wid,
            f"after the restart the ready workflow task of {wid}, accepted before it, is leased on {on}",
            requirement="RESTART-WORK-TAKEN-OVER",
        )
        ctx.expect(await ctx.complete(task, [complete_cmd()]), 200, requirement="RESTART-WORK-TAKEN-OVER")


@check("RESTART-LEASE-TAKEOVER", "RESTART-STALE-LEASE-FENCED", restarts=True, slow=True)
async def restart_keeps_leases_fenced(ctx: CheckContext) -> None:
    """A workflow task leased before a hard restart is taken over after it only once its acknowledged lease ran
    out (same task, next attempt); the old holder's reports with that lease are then 409 and leave no trace."""
    if ctx.target.restart_command is None:
        await ctx.restart()  # not covered, naming --restart-command
    world = await contested_lease(ctx)
    task, successor, lease = world.task, world.rival, world.lease(ctx)
    expires = ctx.lease_expiry(task, world.reply)

    await ctx.restart()

    new, _ = await lease_workflow_task(ctx, successor, world.queue, within=lease + SLACK)
    require_taken_over(ctx, task, new, successor, "the task leased before the restart is taken over after it")
    renewed = instant(new.get("lease_expires_at"))
    claimed = renewed - timedelta(seconds=lease) if renewed is not None else None
    ctx.require(
        claimed is not None and claimed >= expires - INSTANT_RESOLUTION,
        "the takeover comes no earlier than the acknowledged lease_expires_at (the new lease_expires_at minus "
        "the lease)",
        expected=f"claimed at or after {task.get('lease_expires_at')}",
        received=f"lease_expires_at {new.get('lease_expires_at')} with a {lease:g} s lease",
    )
    marker = ctx.uid("stale-marker")
    stale: dict[str, dict[str, Any]] = {
        "heartbeat": {},
        "complete": {"commands": [{"type": "fail_workflow", "message": marker}]},
        "fail": {"failure": {"message": marker}},
    }
    for verb, body in stale.items():
        what = f"the old holder's {verb} with its lease from before the restart"
        await fenced_report(ctx, task, verb, body, what=what, requirement="RESTART-STALE-LEASE-FENCED")
    done = await ctx.complete(new, [complete_cmd("winner")])
    ctx.expect(done, 200, what="the new holder's complete", requirement="RESTART-STALE-LEASE-FENCED")
    events = await ctx.history(world.workflow_id, world.run_id)
    require_no_trace(
        ctx, events, marker, "the old holder's reports leave no trace in history", "RESTART-STALE-LEASE-FENCED"
    )
