"""Signals and updates from the control plane (PROTOCOL.md §12.2, §8.7.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from suite.context import CheckContext
from suite.registry import check
from suite.worlds import lease_wf


async def _running_run(ctx: CheckContext) -> tuple[str, str, str, str]:
    """A run whose first workflow task was completed with a long timer: open, waiting, no task."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    ctx.expect(await ctx.complete(task, [{"type": "start_timer", "delay_seconds": 3600}]), 200, what="first task")
    return queue, worker, wid, run_id


@check("SIGNAL-RECORDED-AND-WAKES")
async def signal_recorded_and_wakes(ctx: CheckContext) -> None:
    """A signal to an open run is 202, recorded once, and wakes the run with a workflow task."""
    queue, worker, wid, run_id = await _running_run(ctx)
    reply = await ctx.client.control("POST", f"/workflows/{wid}/signal/go", {"input": ["x"]})
    ctx.expect(reply, 202, what="signal")
    ctx.require_equal(
        reply.json().get("outcome"), "signal_received", "the receipt says signal_received", replies=[reply]
    )
    events = await ctx.history(wid, run_id)
    ctx.require_counts(events, {"SignalReceived": 1}, "one SignalReceived is recorded")
    task = await lease_wf(ctx, worker, queue)
    ctx.require_equal(task.get("run_id"), run_id, "the signal made a workflow task of its run available")


@check("SIGNAL-CLOSED-RUN-REJECTED")
async def signal_to_closed_run_rejected(ctx: CheckContext) -> None:
    """A signal to a closed run is 409 and records nothing."""
    _, _, wid, run_id = await _running_run(ctx)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/cancel", {}), 200, what="cancel")
    before = await ctx.history(wid, run_id)
    reply = await ctx.client.control("POST", f"/workflows/{wid}/signal/go", {"input": ["x"]})
    ctx.expect(reply, 409, what="signal to a cancelled run")
    after = await ctx.history(wid, run_id)
    ctx.require_equal(len(after), len(before), "a refused signal records nothing", replies=[reply])


@check("UPDATE-ACCEPTED-RECORDED")
async def update_accepted_recorded(ctx: CheckContext) -> None:
    """An update with wait_for accepted is 202 with update_status accepted and an UpdateAccepted event."""
    _, _, wid, run_id = await _running_run(ctx)
    reply = await ctx.client.control("POST", f"/workflows/{wid}/update/bump", {"input": [1], "wait_for": "accepted"})
    ctx.expect(reply, 202, what="update accepted", fields={"update_status": "accepted"})
    events = await ctx.history(wid, run_id)
    ctx.require_counts(events, {"UpdateAccepted": 1}, "one UpdateAccepted is recorded")


async def _update_through_worker(ctx: CheckContext, fail: bool) -> tuple[Any, str]:
    queue, worker, wid, run_id = await _running_run(ctx)
    return await _update_through_worker_on(ctx, queue, worker, wid, run_id, fail=fail)


@check("UPDATE-WAIT-COMPLETED")
async def update_wait_completed(ctx: CheckContext) -> None:
    """wait_for completed returns 200 with the complete_update result, or 422 update_failed after fail_update."""
    reply, _ = await _update_through_worker(ctx, fail=False)
    body = ctx.expect(reply, 200, what="update completed")
    ctx.require(
        body.get("result_envelope") == ctx.envelope("bumped") or body.get("result") == "bumped",
        "the update answer carries the workflow's result",
        expected="bumped",
        received={k: body.get(k) for k in ("result", "result_envelope")},
        replies=[reply],
    )
    reply, _ = await _update_through_worker(ctx, fail=True)
    ctx.expect(reply, 422, "update_failed", what="update failed by the workflow")


@check("UPDATE-CLOSED-AT-MOST-ONCE")
async def update_closed_at_most_once(ctx: CheckContext) -> None:
    """A second complete_update for an already closed update is an invalid batch, and nothing is applied."""
    queue, worker, wid, run_id = await _running_run(ctx)
    reply, update_id = await _update_through_worker_on(ctx, queue, worker, wid, run_id)
    ctx.expect(reply, 200, what="update completed")
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/go", {"input": []}), 202, what="signal")
    task = await lease_wf(ctx, worker, queue)
    before = await ctx.history(wid, run_id)
    again = await ctx.complete(task, [{"type": "complete_update", "update_id": update_id, "result": ctx.envelope(2)}])
    ctx.expect(again, (409, 422), "invalid_commands" if again.status == 409 else None, what="close the update again")
    after = await ctx.history(wid, run_id)
    ctx.require_equal(len(after), len(before), "the rejected batch applied nothing", replies=[again])


async def _update_through_worker_on(
    ctx: CheckContext, queue: str, worker: str, wid: str, run_id: str, *, fail: bool = False
) -> tuple[Any, str]:
    """Send a blocking update and play the worker: lease the update's task, close the update, and return the
    control-plane answer and the update id."""
    call = asyncio.create_task(
        ctx.client.control(
            "POST",
            f"/workflows/{wid}/update/bump",
            {"input": [1], "wait_for": "completed", "wait_timeout_seconds": 20},
            timeout=40,
        )
    )
    try:
        task = await lease_wf(ctx, worker, queue)
        update_id = task.get("workflow_update_id")
        if not update_id:
            events = await ctx.history(wid, run_id)
            update_id = next(
                (e["payload"].get("update_id") for e in events if e.get("event_type") == "UpdateAccepted"), None
            )
        ctx.require(
            isinstance(update_id, str),
            "the update's workflow task names the update",
            expected="update_id",
            received=update_id,
        )
        command: dict[str, Any] = (
            {"type": "fail_update", "update_id": update_id, "message": "refused"}
            if fail
            else {"type": "complete_update", "update_id": update_id, "result": ctx.envelope("bumped")}
        )
        ctx.expect(await ctx.complete(task, [command]), 200, what="complete the update's workflow task")
        reply = await asyncio.wait_for(call, 40)
    finally:
        if not call.done():
            call.cancel()
    return reply, str(update_id)


@check("UPDATE-CLOSED-RUN-REJECTED")
async def update_to_closed_run_rejected(ctx: CheckContext) -> None:
    """An update to a closed run is 409 and records nothing."""
    _, _, wid, run_id = await _running_run(ctx)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/terminate", {}), 200, what="terminate")
    before = await ctx.history(wid, run_id)
    reply = await ctx.client.control("POST", f"/workflows/{wid}/update/bump", {"input": [1], "wait_for": "accepted"})
    ctx.expect(reply, 409, what="update to a terminated run")
    after = await ctx.history(wid, run_id)
    ctx.require_equal(len(after), len(before), "a refused update records nothing", replies=[reply])
