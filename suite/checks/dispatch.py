"""Dispatch (§14.1; invariants 30-31): a crashed worker's task is taken over, due work is delivered without a
stimulus or after a lost notification, one delivery gives one lease, and a cancel sent by another client reaches
the worker.

The checks that wait a lease or a delay out read its length from ``worker_protocol.test_profile`` (or measure
it) and are not covered when it exceeds ``--max-wait``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from suite.client import ProtocolClient, Reply
from suite.context import CheckContext, target_client
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    SLACK,
    WF_LEASE,
    activity_call,
    activity_cmd,
    complete_cmd,
    contested_lease,
    expect_run_cancelled,
    fenced_report,
    instant,
    lease_length,
    lease_workflow_task,
    next_activity,
    poll_activity,
    polled_task,
    race,
    renew_lease,
    require_no_trace,
    require_run_status,
    require_taken_over,
    send_poll,
    started_with_activities,
    task_key,
    without_redeliveries,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.DISPATCH,)


def _task_of(body: dict[str, Any]) -> dict[str, Any] | None:
    task = body.get("task")
    return task if isinstance(task, dict) else None


@contextlib.asynccontextmanager
async def _other_client(ctx: CheckContext) -> AsyncIterator[ProtocolClient]:
    """A second client with its own connection pool, recorded into the same exchange list, talking through the
    same fault proxy as the check's own client (with its trace ids and lost-answer handling)."""
    # Through --faults its lost answers are handled like the check's own.
    client = target_client(ctx.target, validator=ctx.client.validator, exchanges=ctx.client.exchanges)
    try:
        yield client
    finally:
        await client.aclose()


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
    world = await contested_lease(ctx)
    task, successor, lease = world.task, world.rival, world.lease(ctx)
    # The crashed worker never calls again; the successor just keeps polling, as any worker would.
    new, _ = await lease_workflow_task(ctx, successor, world.queue, within=lease + SLACK)
    require_taken_over(
        ctx,
        task,
        new,
        successor,
        "the expired task is taken over: same task_id, attempt + 1, the new lease_owner",
        requirement="DISPATCH-CRASH-TAKEOVER",
    )
    # The old worker wakes up and reports.
    marker = ctx.uid("late-marker")
    late: dict[str, dict[str, Any]] = {
        "heartbeat": {},
        "complete": {"commands": [activity_cmd(marker), {"type": "fail_workflow", "message": marker}]},
        "fail": {"failure": {"message": marker}},
        "history": {},
    }
    for verb, body in late.items():
        what = f"the replaced worker's late {verb}"
        reply = await fenced_report(ctx, task, verb, body, what=what, requirement="DISPATCH-LATE-EVENT-FENCED")
        ctx.require(
            reply.reason == "lease_owner_mismatch" and reply.json().get("lease_owner") == successor,
            f"the replaced worker's late {verb} is fenced by owner, checked before the attempt",
            expected=f"lease_owner_mismatch naming {successor}",
            received=f"{reply.reason} {reply.json().get('lease_owner')}",
            replies=[reply],
            requirement="FENCE-ORDER",
        )
        await renew_lease(ctx, new, f"after the replaced worker's late {verb}", "EXPIRY-ONLY-NEW-LEASE-COMMITS")
    ctx.expect(
        await ctx.complete(new, [complete_cmd("winner")]),
        200,
        what="the new holder's complete",
        requirement="EXPIRY-ONLY-NEW-LEASE-COMMITS",
    )
    events = await ctx.history(world.workflow_id, world.run_id)
    require_no_trace(
        ctx, events, marker, "the replaced worker's commands leave no trace in history", "DISPATCH-LATE-EVENT-FENCED"
    )
    ctx.require_counts(
        events,
        {"WorkflowCompleted": 1, "WorkflowFailed": 0},
        "only the new lease committed",
        "EXPIRY-ONLY-NEW-LEASE-COMMITS",
    )
    await require_run_status(
        ctx, world.workflow_id, "completed", "the run ends as the new holder decided", "EXPIRY-ONLY-NEW-LEASE-COMMITS"
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
    task, reply = await lease_workflow_task(ctx, first, queue)
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
    task, _ = await lease_workflow_task(ctx, worker, queue)
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
        await ctx.complete(fired, [activity_cmd(ctx.uid("act"), retry_policy=policy)]),
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


@check("DISPATCH-CANCEL-DURABLE")
async def dispatch_cancel_from_other_client(ctx: CheckContext) -> None:
    """A cancel sent by another client over its own connection reaches the worker: its workflow task sees
    run_closed, its activity heartbeat cancel_requested, and its polls lease nothing more of the run."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, run_id, _ = await started_with_activities(ctx, worker, queue, [ctx.uid("act"), ctx.uid("act")])
    act, _ = await next_activity(ctx, worker, queue)
    ctx.expect(await ctx.client.control("POST", f"/workflows/{wid}/signal/wake", {}), 202, what="signal")
    wf, _ = await lease_workflow_task(ctx, worker, queue)
    async with _other_client(ctx) as operator:
        reply = await operator.control("POST", f"/workflows/{wid}/cancel", {"reason": "conformance: other client"})
        ctx.expect(reply, 200, what="cancel from a separate client")
    reply = await ctx.wf_call(wf, "heartbeat")
    expect_run_cancelled(ctx, reply, what="the worker's workflow-task heartbeat", requirement="DISPATCH-CANCEL-DURABLE")
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


@check("DISPATCH-ONE-LEASE-PER-DELIVERY", "LEASE-NO-DUPLICATE-ATTEMPT")
async def duplicate_polls_yield_one_lease(ctx: CheckContext) -> None:
    """Duplicate concurrent polls (same or no poll_request_id) never yield two leases of one delivery."""
    await _one_worker_one_poll_request_id(ctx)
    await _six_workers_each_their_poll_request_id(ctx)
    await _one_worker_no_poll_request_id(ctx)


async def _one_worker_one_poll_request_id(ctx: CheckContext) -> None:
    # 1. One worker sends the same poll_request_id twice at once, with three ready tasks on the queue.
    queue = ctx.uid("q")
    worker, witness = await ctx.register(queue), await ctx.register(queue)
    started = {(await ctx.start(queue))[0] for _ in range(3)}
    prid = ctx.uid("poll")
    pair = await race(send_poll(ctx, "workflow", worker, queue, 1, poll_request_id=prid) for _ in range(2))
    got = without_redeliveries(ctx, [t for t in (polled_task(ctx, r, "duplicate poll") for r in pair) if t is not None])
    ctx.require(
        len({task_key(t) for t in got}) <= 1,
        "two concurrent polls with one poll_request_id return one lease (same task_id and attempt)",
        expected="one (task_id, attempt)",
        received=[task_key(t) for t in got],
        replies=pair,
    )
    # Nothing else was leased behind the duplicate's back: the other tasks are all still ready.
    held = {str(t.get("workflow_id")) for t in got}
    seen: list[dict[str, Any]] = []
    for _ in range(len(started)):
        reply = await send_poll(ctx, "workflow", witness, queue, 1)
        task = polled_task(ctx, reply, "poll of the remaining tasks")
        if task is None:
            break
        seen.append(task)
    # The duplicate's own task, leased again once its lease expired (a slow target, or a witness poll resent after
    # a lost answer under --faults), is a redelivery, not a lease taken behind the duplicate's back.
    live = {id(t) for t in without_redeliveries(ctx, [*got, *seen])}
    rest = [str(t.get("workflow_id")) for t in seen if id(t) in live]
    ctx.require_equal(
        sorted(rest), sorted(started - held), "a duplicate poll leases nothing beyond the one task it returns"
    )


async def _six_workers_each_their_poll_request_id(ctx: CheckContext) -> None:
    # 2. Six workers each send their own poll_request_id twice at once; three ready tasks.
    queue = ctx.uid("q")
    workers = [await ctx.register(queue) for _ in range(6)]
    for _ in range(3):
        await ctx.start(queue)
    pollers = [w for w in workers for _ in range(2)]
    ids = {w: ctx.uid("poll") for w in workers}
    replies = await race(send_poll(ctx, "workflow", w, queue, 1, poll_request_id=ids[w]) for w in pollers)
    leases = [(w, polled_task(ctx, r, "duplicate poll")) for w, r in zip(pollers, replies, strict=True)]
    live = [id(t) for t in without_redeliveries(ctx, [t for _, t in leases if t is not None])]
    holders: dict[Any, str] = {}
    for worker in workers:
        mine = [r for w, r in zip(pollers, replies, strict=True) if w == worker]
        keys = {task_key(t) for w, t in leases if w == worker and t is not None and id(t) in live}
        ctx.require(
            len(keys) <= 1,
            f"{worker}'s two polls with one poll_request_id return one lease",
            expected="one (task_id, attempt)",
            received=sorted(map(str, keys)),
            replies=mine,
        )
        for task_id, _ in keys:
            ctx.require(
                task_id not in holders,
                "no task is leased to two workers at once",
                expected="each task_id held by one worker",
                received=f"{task_id} leased to {holders.get(task_id)} and {worker}",
                replies=replies,
            )
            holders[task_id] = worker
    ctx.require(
        len(holders) == 3,
        "the duplicate polls lease each of the 3 ready tasks exactly once",
        expected=3,
        received=f"{len(holders)} leased",
        replies=replies,
        requirement="LEASE-EACH-TASK-ONCE",
    )


async def _one_worker_no_poll_request_id(ctx: CheckContext) -> None:
    # 3. One worker polls twice at once without a poll_request_id; one ready task.
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    await ctx.start(queue)
    pair = await race(send_poll(ctx, "workflow", worker, queue, 1) for _ in range(2))
    got = without_redeliveries(
        ctx, [t for t in (polled_task(ctx, r, "concurrent poll") for r in pair) if t is not None]
    )
    ctx.require(
        len(got) == 1,
        "two concurrent polls for one ready task yield exactly one lease",
        expected=1,
        received=[task_key(t) for t in got],
        replies=pair,
    )
