"""The control plane (§12, §13): starts and their duplicate policies, historical and unknown runs,
cancel and terminate closing a run, its version header and envelope, signals and updates.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from suite.context import CheckContext
from suite.protocol.commands import LEGACY_START_FIELDS
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import LIVE_RUN_STATUSES, carrying, lease_wf, lease_workflow_task

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.CONTROL_PLANE,)


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
    task, _ = await lease_workflow_task(ctx, worker, queue)
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


@check("CONTROL-VERSION-MISSING")
async def control_header_missing(ctx: CheckContext) -> None:
    """A control-plane call without the control-plane header is 400 missing_control_plane_version."""
    headers = {k: v for k, v in ctx.client.control_headers().items() if k != "X-Durable-Workflow-Control-Plane-Version"}
    reply = await ctx.client.request("GET", f"/api/workflows/{ctx.uid('absent')}", headers=headers)
    ctx.expect(reply, 400, "missing_control_plane_version")


@check("CONTROL-VERSION-UNSUPPORTED")
async def control_header_unsupported(ctx: CheckContext) -> None:
    """Any control-plane version other than '2' is 400 unsupported_control_plane_version."""
    for value in ("1", "3", "v2", "2.0"):
        reply = await ctx.client.control(
            "GET",
            f"/workflows/{ctx.uid('absent')}",
            headers={"X-Durable-Workflow-Control-Plane-Version": value},
        )
        ctx.expect(reply, 400, "unsupported_control_plane_version", what=f"control-plane version {value!r}")


@check("CONTROL-ENVELOPE")
async def control_plane_envelope(ctx: CheckContext) -> None:
    """Control-plane responses carry the control-plane header and no worker envelope."""
    queue = ctx.uid("q")
    wid, _ = await ctx.start(queue)
    reply = await ctx.client.control("GET", f"/workflows/{wid}")
    ctx.expect(reply, 200)
    body = reply.json()
    ctx.require(
        reply.headers.get("x-durable-workflow-control-plane-version") == "2"
        and "protocol_version" not in body
        and "server_capabilities" not in body,
        "control-plane answers carry X-Durable-Workflow-Control-Plane-Version: 2 and no worker envelope",
        expected="control header, no protocol_version",
        received=dict(reply.headers),
        replies=[reply],
    )


# -- signals and updates (§12.2, §8.7.1) ------------------------------------------------------------------


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


@check("UPDATE-FAIL-FIELDS")
async def update_failure_keeps_its_fields(ctx: CheckContext) -> None:
    """fail_update with exception_class, exception_type and non_retryable true: the update's failure in history
    keeps each with the message, and the 422 update_failed answer, where it carries the failure, too."""
    req = "UPDATE-FAIL-FIELDS"
    queue, worker, wid, run_id = await _running_run(ctx)
    fields = {"exception_class": "ConformanceRefusal", "exception_type": "Conformance.Refused", "non_retryable": True}
    reply, update_id = await _update_through_worker_on(ctx, queue, worker, wid, run_id, fail=True, failure=fields)
    body = ctx.expect(reply, 422, "update_failed", what="update failed by the workflow", requirement=req)
    want = {"message": "refused", **fields}
    events = [
        e for e in await ctx.history(wid, run_id) if carrying(e.get("payload"), {"update_id": update_id}) is not None
    ]
    ctx.require(
        any(carrying(e.get("payload"), want) is not None for e in events),
        "the failed update's history keeps fail_update's message, exception_class, exception_type and non_retryable",
        expected=want,
        received=[{"event_type": e.get("event_type"), "payload": e.get("payload")} for e in events],
        requirement=req,
    )
    answered = body.get("failure")
    ctx.require(
        answered is None or carrying(answered, want) is not None,
        "the update_failed answer's failure keeps fail_update's fields as given",
        expected=want,
        received=answered,
        replies=[reply],
        requirement=req,
    )


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
    ctx: CheckContext,
    queue: str,
    worker: str,
    wid: str,
    run_id: str,
    *,
    fail: bool = False,
    failure: dict[str, Any] | None = None,
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
            {"type": "fail_update", "update_id": update_id, "message": "refused", **(failure or {})}
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


@check("RUN-TIMEOUT-CLOSES-RUN")
async def run_timeout_closes_a_waiting_run(ctx: CheckContext) -> None:
    """A run of run_timeout_seconds 2, parked on a long timer, is open before its timeout and failed with
    closed_reason timed_out (one WorkflowTimedOut) 1.5 s after it."""
    limit, slack = 2, 1.5
    ctx.needs_short(limit + slack, "a 2-second run timeout plus 1.5 s of slack")
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    sent = ctx.now()
    workflow_id, run_id = await ctx.start(queue, run_timeout_seconds=limit)
    started = ctx.now()
    task = await lease_wf(ctx, worker, queue)
    parked = [{"type": "start_timer", "delay_seconds": 3600}]
    ctx.expect(await ctx.complete(task, parked), 200, what="the run's first task")
    early = await ctx.describe(workflow_id)
    if ctx.now() < sent + timedelta(seconds=limit):
        ctx.require(
            early.get("status") in LIVE_RUN_STATUSES,
            "a run is not timed out before its run_timeout_seconds",
            expected="an open run",
            received={k: early.get(k) for k in ("status", "closed_reason")},
        )
    await ctx.wait(until=started + timedelta(seconds=limit + slack))
    described = await ctx.describe(workflow_id)
    got = {k: described.get(k) for k in ("status", "closed_reason")}
    ctx.require_equal(got, {"status": "failed", "closed_reason": "timed_out"}, "a run past its run timeout")
    timed_out = [e for e in await ctx.history(workflow_id, run_id) if e.get("event_type") == "WorkflowTimedOut"]
    ctx.require_equal(len(timed_out), 1, "its history records one WorkflowTimedOut")
