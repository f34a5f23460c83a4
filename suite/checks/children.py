"""Child workflows: what ChildWorkflowScheduled records for the policies the SDK compares on replay
(requirements ``CHILD-*``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from suite.context import CheckContext
from suite.outcomes import CheckFailure, Indeterminate
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import READY_WITHIN, carrying, lease_wf, require_run_status

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.CHILDREN, Area.CANCELLATION)

__all__: list[str] = []


async def start_parent_with_child(ctx: CheckContext, **fields: Any) -> tuple[str, str, dict[str, Any], str]:
    """A parent whose first task starts one child on its own queue; returns (parent id, run id, the parent's
    ChildWorkflowScheduled event, the child's queue)."""
    queue, child_queue = ctx.uid("q"), ctx.uid("cq")
    worker = await ctx.register(queue)
    workflow_id, run_id = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    command = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": child_queue, **fields}
    ctx.expect(await ctx.complete(task, [command]), 200, what="complete with start_child_workflow")
    events = await ctx.history(workflow_id, run_id)
    scheduled = [e for e in events if e.get("event_type") == "ChildWorkflowScheduled"]
    ctx.require(len(scheduled) == 1, "one ChildWorkflowScheduled", received=[e.get("event_type") for e in events])
    return workflow_id, run_id, scheduled[0], child_queue


def payload(event: dict[str, Any]) -> dict[str, Any]:
    value = event.get("payload")
    return value if isinstance(value, dict) else {}


@check("CHILD-PARENT-CLOSE-DEFAULT")
async def child_default_parent_close_policy(ctx: CheckContext) -> None:
    """An omitted parent_close_policy is recorded as abandon, and the child lives on after its parent completes."""
    queue, child_queue = ctx.uid("q"), ctx.uid("cq")
    worker = await ctx.register(queue)
    workflow_id, run_id = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    command = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": child_queue}
    ctx.expect(await ctx.complete(task, [command, {"type": "complete_workflow"}]), 200)
    events = await ctx.history(workflow_id, run_id)
    [scheduled] = [e for e in events if e.get("event_type") == "ChildWorkflowScheduled"] or [{}]
    recorded = payload(scheduled).get("parent_close_policy")
    ctx.require_equal(
        recorded, "abandon", "an omitted parent_close_policy is recorded as abandon (what the SDK assumes on replay)"
    )
    child_id = payload(scheduled).get("child_workflow_id")
    if isinstance(child_id, str):
        child = await ctx.describe(child_id)
        ctx.require(
            child.get("status") not in ("terminated", "cancelled"),
            "the abandoned child outlives its parent's close",
            expected="an open child",
            received=child.get("status"),
        )


@check("CHILD-POLICY-RECORDED")
async def child_policies_recorded(ctx: CheckContext) -> None:
    """Given policies are recorded verbatim; an omitted child cancellation_policy is recorded as abandon."""
    _, _, given, _ = await start_parent_with_child(
        ctx, parent_close_policy="terminate", cancellation_policy="try_cancel"
    )
    _, _, omitted, _ = await start_parent_with_child(ctx)
    got = (
        payload(given).get("parent_close_policy"),
        payload(given).get("cancellation_policy"),
        payload(omitted).get("cancellation_policy", "abandon"),
    )
    ctx.require_equal(
        got,
        ("terminate", "try_cancel", "abandon"),
        "ChildWorkflowScheduled records the policies the command gave, and abandon for an omitted one",
    )


# -- cooperative cancellation (parent_close_policy request_cancellation) ------------------------------------


async def cooperative_child(ctx: CheckContext) -> tuple[str, str, str, str, str]:
    """A parent that starts a child under request_cancellation and completes in the same task. Returns
    (parent id, parent run, child id, child queue, child worker)."""
    queue, child_queue = ctx.uid("q"), ctx.uid("cq")
    worker = await ctx.register(queue)
    child_worker = await ctx.register(child_queue)
    workflow_id, run_id = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    command = {
        "type": "start_child_workflow",
        "workflow_type": "conformance.Child",
        "queue": child_queue,
        "parent_close_policy": "request_cancellation",
    }
    ctx.expect(await ctx.complete(task, [command, {"type": "complete_workflow"}]), 200)
    events = await ctx.history(workflow_id, run_id)
    [scheduled] = [e for e in events if e.get("event_type") == "ChildWorkflowScheduled"] or [{}]
    child_id = payload(scheduled).get("child_workflow_id")
    ctx.require(isinstance(child_id, str), "ChildWorkflowScheduled names the child", received=scheduled)
    assert isinstance(child_id, str)
    return workflow_id, run_id, child_id, child_queue, child_worker


async def events_of(ctx: CheckContext, workflow_id: str, event_type: str) -> list[dict[str, Any]]:
    described = await ctx.describe(workflow_id)
    return [
        e for e in await ctx.history(workflow_id, str(described.get("run_id"))) if e.get("event_type") == event_type
    ]


async def parent_resolution(ctx: CheckContext, workflow_id: str, within: float) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await events_of(ctx, workflow_id, "ChildCancellationResolved")
        return payload(found[0]) if found else None

    return await ctx.wait_until(probe, timeout=within, what="ChildCancellationResolved in the parent's history")


async def closed_by_deadline(ctx: CheckContext, child_id: str) -> bool:
    cancelled = await events_of(ctx, child_id, "WorkflowCancelled")
    return any(payload(e).get("reason") == "cleanup_deadline_exceeded" for e in cancelled)


@check("CANCEL-COOPERATIVE-REQUEST", "CANCEL-COOPERATIVE-CLEANUP", "CANCEL-COOPERATIVE-OUTCOME")
async def child_cancellation_is_cooperative(ctx: CheckContext) -> None:
    """The child is asked (identity and deadline in its history and task), cleans up, closes itself; the
    parent's history records how it ended."""
    parent_id, _, child_id, child_queue, child_worker = await cooperative_child(ctx)
    try:
        await _cooperative_cleanup(ctx, parent_id, child_id, child_queue, child_worker)
    except CheckFailure:
        if await closed_by_deadline(ctx, child_id):
            # Delays outlasted the target's cleanup deadline: the server closed the child, as it must.
            raise Indeterminate("the child's cleanup deadline passed before the check could clean up") from None
        raise


async def _cooperative_cleanup(
    ctx: CheckContext, parent_id: str, child_id: str, child_queue: str, child_worker: str
) -> None:
    child = await ctx.describe(child_id)
    ctx.require(
        child.get("status") not in ("cancelled", "terminated", "completed", "failed"),
        "request_cancellation does not close the child at once",
        expected="an open child",
        received=child.get("status"),
    )
    [requested] = await events_of(ctx, child_id, "CooperativeCancellationRequested") or [{}]
    req = payload(requested)
    request_id, deadline, at = req.get("workflow_command_id"), req.get("cleanup_deadline_at"), req.get("requested_at")
    ctx.require(
        isinstance(request_id, str)
        and bool(request_id)
        and isinstance(deadline, str)
        and isinstance(at, str)
        and parse_rfc3339(deadline) > parse_rfc3339(at),
        "the child's history records the request with its identity and a deadline after it",
        expected="CooperativeCancellationRequested{workflow_command_id, requested_at < cleanup_deadline_at}",
        received=req or None,
    )
    task = await lease_wf(ctx, child_worker, child_queue)
    observed = task.get("cancellation_request")
    ctx.require(
        task.get("cancel_requested") is True
        and isinstance(observed, dict)
        and observed.get("request_id") == request_id
        and observed.get("cleanup_deadline_at") == deadline,
        "the child's workflow task carries cancel_requested and the request's identity and deadline",
        expected={"cancel_requested": True, "request_id": request_id, "cleanup_deadline_at": deadline},
        received={"cancel_requested": task.get("cancel_requested"), "cancellation_request": observed},
    )
    cleanup = {"type": "record_side_effect", "result": ctx.envelope("cleaned")["blob"]}
    reply = await ctx.complete(task, [cleanup, {"type": "complete_workflow"}])
    ctx.expect(reply, 200, what="the child's cleanup and close", requirement="CANCEL-COOPERATIVE-CLEANUP")
    await require_run_status(
        ctx, child_id, "completed", "the child closed as its own terminal command said", "CANCEL-COOPERATIVE-CLEANUP"
    )
    out = await parent_resolution(ctx, parent_id, 10.0)
    ctx.require_equal(
        (out.get("request_id"), out.get("outcome"), out.get("closed_by")),
        (request_id, "completed", "child"),
        "the parent's history records the outcome of its request",
        requirement="CANCEL-COOPERATIVE-OUTCOME",
    )


@check("CANCEL-COOPERATIVE-DEADLINE", "CANCEL-COOPERATIVE-OUTCOME")
async def child_closed_past_its_cleanup_deadline(ctx: CheckContext) -> None:
    """A child that does not close is closed as cancelled once its cleanup deadline passes."""
    seconds = ctx.target.test_profile.get("cancellation_cleanup_seconds")
    ctx.needs_short(
        seconds if isinstance(seconds, (int, float)) else None, "cooperative cleanup", "cancellation_cleanup_seconds"
    )
    parent_id, _, child_id, _, _ = await cooperative_child(ctx)

    async def closed() -> dict[str, Any] | None:
        child = await ctx.describe(child_id)
        return child if child.get("status") in ("cancelled", "terminated", "completed", "failed") else None

    child = await ctx.wait_until(closed, timeout=float(seconds or 0) + 10.0, what="the child to be closed")
    ctx.require(child.get("status") == "cancelled", "closed as cancelled", expected="cancelled", received=child)
    [event] = await events_of(ctx, child_id, "WorkflowCancelled") or [{}]
    ctx.require_equal(
        payload(event).get("reason"),
        "cleanup_deadline_exceeded",
        "WorkflowCancelled names the exceeded cleanup deadline",
    )
    out = await parent_resolution(ctx, parent_id, 10.0)
    ctx.require_equal(
        (out.get("outcome"), out.get("closed_by")),
        ("cancelled", "cleanup_deadline"),
        "the parent's history records the deadline outcome",
        requirement="CANCEL-COOPERATIVE-OUTCOME",
    )


@check("CANCEL-COOPERATIVE-DELIVERY", capability="cooperative_cancellation")
async def child_cancellation_delivery_recorded_once(ctx: CheckContext) -> None:
    """The child's lease holder commits the delivery at one call; a second delivery answers the first."""
    _, _, child_id, child_queue, child_worker = await cooperative_child(ctx)
    task = await lease_wf(ctx, child_worker, child_queue)
    observed = task.get("cancellation_request") or {}
    body = {"request_id": observed.get("request_id"), "sequence": 1, "call_kind": "condition"}
    first = ctx.expect(await ctx.wf_call(task, "deliver-cancellation", body), 200, what="delivery")
    second = await ctx.wf_call(task, "deliver-cancellation", {**body, "sequence": 2, "call_kind": "timer"})
    again = ctx.expect(second, 200, what="a repeated delivery")
    delivered = await events_of(ctx, child_id, "CooperativeCancellationDelivered")
    ctx.require(
        first.get("delivered") is True
        and (again.get("sequence"), again.get("call_kind")) == (1, "condition")
        and len(delivered) == 1,
        "one CooperativeCancellationDelivered; a repeated delivery answers the committed one",
        expected="delivered once at sequence 1 (condition)",
        received={"again": (again.get("sequence"), again.get("call_kind")), "events": len(delivered)},
        replies=[second],
    )


@check("CANCEL-CLIENT-REQUEST", capability="cooperative_cancellation")
async def client_requests_cooperative_cancellation(ctx: CheckContext) -> None:
    """A client's request-cancellation is accepted with an identity and a deadline, reaches the run's next
    workflow task, and a repeated request answers the original; the run is not closed by it."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, rid = await ctx.start(queue)
    seconds = 120
    path = f"/workflows/{wid}/runs/{rid}/request-cancellation"
    reply = await ctx.client.control("POST", path, {"cleanup_timeout_seconds": seconds, "reason": "conformance"})
    body = ctx.expect(reply, 200, what="request-cancellation")
    observed = body.get("cancellation_request")
    ctx.require(
        (body.get("accepted"), body.get("duplicate"), body.get("workflow_id"), body.get("run_id"))
        == (True, False, wid, rid)
        and isinstance(observed, dict)
        and isinstance(observed.get("request_id"), str)
        and bool(observed["request_id"]),
        "the request is accepted for the run, with an identity",
        expected={"accepted": True, "duplicate": False, "workflow_id": wid, "run_id": rid, "request_id": "…"},
        received=body,
        replies=[reply],
    )
    assert isinstance(observed, dict)
    at, deadline = observed.get("requested_at"), observed.get("cleanup_deadline_at")
    try:
        span = (parse_rfc3339(deadline) - parse_rfc3339(at)).total_seconds() if isinstance(at, str) else None
    except (TypeError, ValueError):
        span = None
    ctx.require(
        span is not None and abs(span - seconds) <= 1,
        "the cleanup deadline is cleanup_timeout_seconds after the request",
        expected=f"cleanup_deadline_at = requested_at + {seconds} s",
        received={"requested_at": at, "cleanup_deadline_at": deadline},
        replies=[reply],
    )
    again = await ctx.client.control("POST", f"/workflows/{wid}/request-cancellation", {"cleanup_timeout_seconds": 5})
    repeated = ctx.expect(again, 200, what="a repeated request-cancellation")
    first = {k: observed.get(k) for k in ("request_id", "requested_at", "cleanup_deadline_at")}
    held = repeated.get("cancellation_request")
    second: dict[str, Any] = held if isinstance(held, dict) else {}
    ctx.require_equal(
        (repeated.get("duplicate"), {k: second.get(k) for k in first}),
        (True, first),
        "a repeated request answers duplicate with the original identity and deadline",
        replies=[again],
    )
    ctx.require(
        (await ctx.describe(wid)).get("status") not in ("cancelled", "terminated", "completed", "failed"),
        "a cooperative request does not close the run at once",
        expected="an open run",
    )
    task = await lease_wf(ctx, worker, queue)
    ctx.require(
        task.get("cancel_requested") is True
        and isinstance(task.get("cancellation_request"), dict)
        and task["cancellation_request"].get("request_id") == first["request_id"]
        and task["cancellation_request"].get("cleanup_deadline_at") == first["cleanup_deadline_at"],
        "the run's workflow task carries cancel_requested and the request",
        expected={"cancel_requested": True, **first},
        received={
            "cancel_requested": task.get("cancel_requested"),
            "cancellation_request": task.get("cancellation_request"),
        },
    )
    ctx.expect(await ctx.complete(task, [{"type": "complete_workflow"}]), 200, what="the run's cleanup and close")


# -- a child's result and its parent's close -----------------------------------------------------------------


@check("CHILD-RESULT-WAKES-PARENT")
async def child_result_wakes_parent(ctx: CheckContext) -> None:
    """A completed and a failed child each wake their parent with the child resume context."""
    for closing, event_type in (
        ({"type": "complete_workflow"}, "ChildRunCompleted"),
        ({"type": "fail_workflow", "message": "child failed"}, "ChildRunFailed"),
    ):
        queue, child_queue = ctx.uid("q"), ctx.uid("cq")
        worker, child_worker = await ctx.register(queue), await ctx.register(child_queue)
        workflow_id, run_id = await ctx.start(queue)
        task = await lease_wf(ctx, worker, queue)
        command = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": child_queue}
        ctx.expect(await ctx.complete(task, [command]), 200, what="complete with start_child_workflow")
        child_task = await lease_wf(ctx, child_worker, child_queue)
        child_run_id = child_task.get("run_id")
        ctx.expect(await ctx.complete(child_task, [closing]), 200, what=f"the child's {closing['type']}")
        woken = await lease_wf(ctx, worker, queue)
        context = {
            k: woken.get(k)
            for k in (
                "workflow_id",
                "workflow_wait_kind",
                "resume_source_kind",
                "child_workflow_run_id",
                "workflow_event_type",
            )
        }
        expected = {
            "workflow_id": workflow_id,
            "workflow_wait_kind": "child",
            "resume_source_kind": "child_workflow_run",
            "child_workflow_run_id": child_run_id,
            "workflow_event_type": event_type,
        }
        call_id = woken.get("child_call_id")
        ctx.require(
            context == expected and isinstance(call_id, str) and bool(call_id),
            f"the parent's task after the child's {closing['type']} carries the child resume context",
            expected={**expected, "child_call_id": "<id>"},
            received={**context, "child_call_id": call_id},
        )
        recorded = [e.get("event_type") for e in await ctx.history(workflow_id, run_id)]
        ctx.require(
            event_type in recorded,
            f"the parent's history records {event_type}",
            expected=event_type,
            received=recorded,
        )


@check("CHILD-PARENT-CLOSE-POLICIES")
async def parent_close_closes_children(ctx: CheckContext) -> None:
    """A parent completing with a terminate child and a request_cancel child closes both as their policy says."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    workflow_id, run_id = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    commands: list[dict[str, Any]] = [
        {
            "type": "start_child_workflow",
            "workflow_type": "conformance.Child",
            "queue": ctx.uid("cq"),
            "parent_close_policy": policy,
        }
        for policy in ("terminate", "request_cancel")
    ]
    ctx.expect(await ctx.complete(task, [*commands, {"type": "complete_workflow"}]), 200)
    scheduled = [e for e in await ctx.history(workflow_id, run_id) if e.get("event_type") == "ChildWorkflowScheduled"]
    children = {payload(e).get("parent_close_policy"): payload(e).get("child_workflow_id") for e in scheduled}
    ctx.require(
        all(isinstance(children.get(p), str) for p in ("terminate", "request_cancel")),
        "ChildWorkflowScheduled names each child with its policy",
        received=scheduled,
    )
    for policy, status in (("terminate", "terminated"), ("request_cancel", "cancelled")):
        child_id = str(children[policy])

        async def closed(child_id: str = child_id) -> str | None:
            found = (await ctx.describe(child_id)).get("status")
            return str(found) if found in ("terminated", "cancelled", "completed", "failed") else None

        got = await ctx.wait_until(closed, timeout=10, what=f"the {policy} child closed")
        ctx.require_equal(got, status, f"the parent's close leaves its {policy} child {status}")


# -- a child's retries and timeouts ----------------------------------------------------------------------------


@dataclass
class ChildWorld:
    """A parent whose first task started one child, and a worker on each side."""

    parent_id: str
    parent_run: str
    child_queue: str
    child_worker: str
    child: dict[str, Any]  # the child's first workflow task, leased
    started_at: datetime  # on the target's clock, once the start was acknowledged: the run started before
    queue: str  # the parent's, and its worker there
    worker: str


async def parent_and_child(
    ctx: CheckContext, child_fields: dict[str, Any], *, invalid_first: bool = False
) -> ChildWorld:
    """A parent that starts one child under ``child_fields``; with ``invalid_first``, the same start with an
    invalid parent_close_policy is sent first and must be refused as an invalid batch."""
    queue, child_queue = ctx.uid("q"), ctx.uid("cq")
    worker, child_worker = await ctx.register(queue), await ctx.register(child_queue)
    parent_id, parent_run = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    command = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": child_queue}
    command.update(child_fields)
    if invalid_first:
        refused = await ctx.complete(task, [{**command, "parent_close_policy": "not-a-policy"}])
        reason = "invalid_commands" if refused.status == 409 else None
        ctx.expect(refused, (409, 422), reason, what="a start_child_workflow with an invalid parent_close_policy")
    ctx.expect(await ctx.complete(task, [command]), 200, what="complete with start_child_workflow")
    started_at = ctx.now()
    child = await lease_wf(ctx, child_worker, child_queue)
    return ChildWorld(parent_id, parent_run, child_queue, child_worker, child, started_at, queue, worker)


async def parent_events(ctx: CheckContext, world: ChildWorld, event_type: str) -> list[dict[str, Any]]:
    return [e for e in await ctx.history(world.parent_id, world.parent_run) if e.get("event_type") == event_type]


async def fail_child_run(ctx: CheckContext, task: dict[str, Any]) -> datetime:
    """Fail the child run of ``task`` with fail_workflow; the instant just before it was sent (no later than the
    target's failure, so a backoff measured from it is never shortened by the answer's own delay)."""
    closing = {"type": "fail_workflow", "message": "child run failed"}
    sent = ctx.now()
    ctx.expect(await ctx.complete(task, [closing]), 200, what="the child run's fail_workflow")
    return sent


@check("CHILD-RETRY-BACKOFF", capability="child_workflow_retry_policy", slow=True)
async def child_retried_after_backoff(ctx: CheckContext) -> None:
    """A failed child run under max_attempts 2, backoff 3 s gets a second run no sooner than 3 s later."""
    backoff, tolerance = 3, 0.5
    ctx.needs_short(backoff + 10, "a 3-second child retry backoff plus 10 s of slack")
    world = await parent_and_child(ctx, {"retry_policy": {"max_attempts": 2, "backoff_seconds": [backoff]}})
    failed_at = await fail_child_run(ctx, world.child)
    retried = await lease_wf(ctx, world.child_worker, world.child_queue, within=backoff + 10)
    message = f"the child's second run must not start before its {backoff} s backoff has passed"
    ctx.require_not_sooner(failed_at, backoff, tolerance, message, "the failed run")
    ctx.require(
        retried.get("workflow_id") == world.child.get("workflow_id") and retried.get("run_id") != world.child["run_id"],
        "the retry is a new run of the same child workflow",
        expected={"workflow_id": world.child.get("workflow_id"), "run_id": f"not {world.child.get('run_id')}"},
        received={k: retried.get(k) for k in ("workflow_id", "run_id")},
    )
    failed = await parent_events(ctx, world, "ChildRunFailed")
    ctx.require(not failed, "a child run that is retried records no ChildRunFailed in its parent", received=failed)


@check("CHILD-INVALID-START-NO-ATTEMPT", capability="child_workflow_retry_policy")
async def invalid_child_start_spends_no_attempt(ctx: CheckContext) -> None:
    """After a refused start, the same child started validly under max_attempts 2 is still retried once."""
    policy = {"max_attempts": 2, "backoff_seconds": [0]}
    world = await parent_and_child(ctx, {"retry_policy": policy}, invalid_first=True)
    await fail_child_run(ctx, world.child)

    async def outcome() -> str | None:
        reply = await ctx.poll("workflow", world.child_worker, world.child_queue, 1)
        task = ctx.expect(reply, 200, what="workflow-task poll").get("task")
        if isinstance(task, dict):
            return "retried"
        return "not retried" if await parent_events(ctx, world, "ChildRunFailed") else None

    got = await ctx.wait_until(outcome, timeout=READY_WITHIN, what="the child's second run or its parent's verdict")
    ctx.require_equal(
        got,
        "retried",
        "the child's first failed run is retried under max_attempts 2: the refused start spent no attempt",
    )


async def closed_child(ctx: CheckContext, child_id: str, within: float) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await ctx.describe(child_id)
        return found if found.get("status") in ("completed", "failed", "cancelled", "terminated") else None

    return await ctx.wait_until(probe, timeout=within, what=f"child {child_id} closed")


def require_timed_out(ctx: CheckContext, described: dict[str, Any], why: str) -> None:
    got = {k: described.get(k) for k in ("status", "closed_reason")}
    ctx.require_equal(got, {"status": "failed", "closed_reason": "timed_out"}, why)


@check("CHILD-RUN-TIMEOUT", capability="child_workflow_timeouts", slow=True)
async def child_run_timeout_enforced(ctx: CheckContext) -> None:
    """A child run of run_timeout_seconds 2, parked on a long timer, is closed as timed out; its parent hears."""
    limit = 2
    ctx.needs_short(limit + 10, "a 2-second child run timeout plus 10 s of slack")
    world = await parent_and_child(ctx, {"run_timeout_seconds": limit})
    child_id = str(world.child.get("workflow_id"))
    parked = [{"type": "start_timer", "delay_seconds": 3600}]
    ctx.expect(await ctx.complete(world.child, parked), 200, what="the child's first task")
    early = await ctx.describe(child_id)
    ctx.require(
        early.get("status") not in ("completed", "failed", "cancelled", "terminated"),
        "a child run is not timed out before its run_timeout_seconds",
        expected="an open child",
        received={k: early.get(k) for k in ("status", "closed_reason")},
    )
    require_timed_out(ctx, await closed_child(ctx, child_id, limit + 10), "a child run past its run timeout")

    async def told() -> list[dict[str, Any]] | None:
        return await parent_events(ctx, world, "ChildRunFailed") or None

    await ctx.wait_until(told, timeout=10, what="ChildRunFailed in the parent's history")


@check("CHILD-EXECUTION-TIMEOUT", capability="child_workflow_timeouts", slow=True)
async def child_execution_timeout_spans_retries(ctx: CheckContext) -> None:
    """A child of execution_timeout_seconds 5 whose first run failed and was retried after 3 s is closed as timed
    out 5 s after its first run started (within 1.5 s), not retried again, and its parent records ChildRunFailed."""
    limit, backoff, slack = 5, 3, 1.5
    ctx.needs_short(limit + slack + 10, "a 5-second child execution timeout plus slack")
    policy = {"max_attempts": 5, "backoff_seconds": [backoff]}
    world = await parent_and_child(ctx, {"execution_timeout_seconds": limit, "retry_policy": policy})
    child_id = str(world.child.get("workflow_id"))
    await fail_child_run(ctx, world.child)
    retried = await lease_wf(ctx, world.child_worker, world.child_queue, within=backoff + 10)
    parked = [{"type": "start_timer", "delay_seconds": 3600}]
    ctx.expect(await ctx.complete(retried, parked), 200, what="the retried child run's first task")
    await ctx.wait(until=world.started_at + timedelta(seconds=limit + slack))
    described = await ctx.describe(child_id)
    require_timed_out(ctx, described, f"a child still open {limit} s after its first run started, its retry included")

    async def told() -> list[dict[str, Any]] | None:
        return await parent_events(ctx, world, "ChildRunFailed") or None

    failed = await ctx.wait_until(told, timeout=10, what="ChildRunFailed in the parent's history")
    runs = await parent_events(ctx, world, "ChildRunStarted")
    ctx.require(
        len(failed) == 1 and len(runs) == 2,
        "a child past its execution timeout is not retried: two runs started, one ChildRunFailed",
        expected={"ChildRunStarted": 2, "ChildRunFailed": 1},
        received={"ChildRunStarted": len(runs), "ChildRunFailed": len(failed)},
    )


@check("CHILD-FAILURE-NON-RETRYABLE")
async def child_non_retryable_failure_not_retried(ctx: CheckContext) -> None:
    """A child with three attempts that fails non_retryable on its first: the parent is woken by ChildRunFailed with
    the child's message and exception_type, and no retry is scheduled."""
    req = "CHILD-FAILURE-NON-RETRYABLE"
    world = await parent_and_child(ctx, {"retry_policy": {"max_attempts": 3, "backoff_seconds": [0]}})
    workflow_id, run_id, child_task = world.parent_id, world.parent_run, world.child
    failure = {"message": "child failed for good", "exception_type": "Conformance.Fatal"}
    closing = {"type": "fail_workflow", **failure, "exception_class": "ConformanceFatalError", "non_retryable": True}
    ctx.expect(await ctx.complete(child_task, [closing]), 200, what="the child's non-retryable fail_workflow")

    async def decided() -> list[dict[str, Any]] | None:  # the parent told of the failure, or a retry scheduled
        events = await ctx.history(workflow_id, run_id)
        kinds = {e.get("event_type") for e in events}
        return events if kinds & {"ChildRunFailed", "ChildWorkflowRetryScheduled"} else None

    events = await ctx.wait_until(
        decided, timeout=READY_WITHIN, what="the parent's history to record the child's failure"
    )
    failed = [e for e in events if e.get("event_type") == "ChildRunFailed"]
    retried = [e for e in events if e.get("event_type") == "ChildWorkflowRetryScheduled"]
    ctx.require(
        len(failed) == 1 and not retried and carrying(failed[0].get("payload"), failure) is not None,
        "a child failed with non_retryable true is not retried: ChildRunFailed carries its message and exception_type",
        expected={"ChildRunFailed": failure, "ChildWorkflowRetryScheduled": "none"},
        received={"ChildRunFailed": [e.get("payload") for e in failed], "ChildWorkflowRetryScheduled": len(retried)},
        requirement=req,
    )
    woken = await lease_wf(ctx, world.worker, world.queue, within=READY_WITHIN)
    ctx.require_equal(woken.get("run_id"), run_id, "the child's final failure wakes its parent", requirement=req)
