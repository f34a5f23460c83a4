"""A poll and what it leases (§7, §8, §9; invariants 14-25 and 32): long-poll holds and clamps, poll_status on
every answer (empty, throttled, unavailable, draining), one lease per ready task with its fields, duration and
renewal, and a repeated poll_request_id answered by the same lease.

Every check builds its own task queue, so the admission limit, drains and races of one check never touch
another. Races are released together behind an ``asyncio.Barrier``; durations that the protocol states
are judged on the server's own clock (``lease_expires_at`` against the response ``Date`` header), and
long-poll holds, which are a timing rule of the request itself, with a monotonic clock around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.outcomes import HarnessError, Indeterminate, NotCovered, profile_setting
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    POLL_PATH,
    TASK_KINDS,
    advertised_lease,
    lease_task,
    lease_wf,
    polled_task,
    race,
    require_open,
    send_poll,
    task_key,
    task_of,
    without_redeliveries,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.LONG_POLL, Area.POLL_STATUS, Area.LEASING, Area.IDEMPOTENCY)


# §7.4: every poll_status but "leased" comes with task:null.
NULL_TASK_STATUSES = ("empty", "throttled", "unavailable", "draining")


SCHEDULE_ACTIVITY = {"type": "schedule_activity", "activity_type": "conformance.Activity"}


THROTTLE_SETTING = profile_setting("max_active_leases_per_queue")


async def _schedule_activity(ctx: CheckContext, worker: str, queue: str) -> str:
    """Start a workflow and complete its first task with schedule_activity: one ready activity task."""
    workflow_id, _ = await ctx.start(queue)
    task, _ = await lease_task(ctx, "workflow", worker, queue)
    reply = await ctx.complete(task, [{**SCHEDULE_ACTIVITY, "queue": queue}])
    ctx.expect(reply, 200, what="workflow-task complete with schedule_activity")
    return workflow_id


@contextlib.asynccontextmanager
async def _open_query(ctx: CheckContext, workflow_id: str) -> AsyncIterator[asyncio.Task[Reply]]:
    """A control-plane query held open (it blocks until a worker answers); cancelled if still open at exit."""
    timeout = ctx.target.test_profile.get("query_task_timeout_seconds")
    limit = float(timeout) if isinstance(timeout, int | float) else 30.0
    call = asyncio.create_task(
        ctx.client.control(
            "POST", f"/workflows/{workflow_id}/query/conformance.status", {"input": []}, timeout=limit + 20
        )
    )
    try:
        yield call
    finally:
        if not call.done():
            call.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await call


async def _answer_query(ctx: CheckContext, task: dict[str, Any], call: asyncio.Task[Reply]) -> None:
    reply = await ctx.client.worker(
        f"/query-tasks/{task.get('query_task_id')}/complete",
        {
            "lease_owner": task.get("lease_owner"),
            "query_task_attempt": task.get("query_task_attempt"),
            "result_envelope": ctx.envelope("ok"),
        },
    )
    ctx.expect(reply, 200, what="query-task complete")
    ctx.expect(await call, 200, what="the control-plane query after the worker answered")


async def _leased_of_every_kind(ctx: CheckContext) -> dict[str, tuple[str, Reply, datetime]]:
    """One leased workflow, activity and query task: kind → (poller, poll reply, send time on ``ctx.now()``)."""
    queue = ctx.uid("q")
    workers = {kind: await ctx.register(queue, capabilities=["query_tasks"]) for kind in TASK_KINDS}
    out: dict[str, tuple[str, Reply, datetime]] = {}
    workflow_id, _ = await ctx.start(queue)
    sent = ctx.now()
    task, reply = await lease_task(ctx, "workflow", workers["workflow"], queue)
    out["workflow"] = (workers["workflow"], reply, sent)
    done = await ctx.complete(task, [{**SCHEDULE_ACTIVITY, "queue": queue}])
    ctx.expect(done, 200, what="workflow-task complete with schedule_activity")
    sent = ctx.now()
    _, reply = await lease_task(ctx, "activity", workers["activity"], queue)
    out["activity"] = (workers["activity"], reply, sent)
    async with _open_query(ctx, workflow_id) as call:
        sent = ctx.now()
        task, reply = await lease_task(ctx, "query", workers["query"], queue, before=lambda: require_open(ctx, call))
        out["query"] = (workers["query"], reply, sent)
        await _answer_query(ctx, task, call)
    return out


def _judge_poll_status(ctx: CheckContext, reply: Reply, kind: str) -> str:
    """§7.4 on one poll response: poll_status present, task null for the non-leased states, task ⇔ leased."""
    body = reply.json()
    status = body.get("poll_status")
    ctx.require(
        isinstance(status, str) and bool(status),
        f"every {kind} poll response carries poll_status",
        expected="poll_status: leased | empty | throttled | unavailable | draining",
        received=repr(status),
        replies=[reply],
        requirement="POLL-STATUS-PRESENT",
    )
    assert isinstance(status, str)
    task = body.get("task")
    if status in NULL_TASK_STATUSES:
        ctx.require(
            "task" in body and task is None,
            f"a {status!r} {kind} poll carries task: null",
            expected="task: null",
            received="no task key" if "task" not in body else repr(task)[:200],
            replies=[reply],
            requirement="POLL-STATUS-NULL-TASK",
        )
    ctx.require(
        (task is not None) == (status == "leased"),
        f"a {kind} poll has a task if and only if poll_status is 'leased'",
        expected="task object with 'leased', null otherwise",
        received=f"poll_status {status!r} with task {'object' if task is not None else 'null'}",
        replies=[reply],
        requirement="POLL-STATUS-TASK-IFF-LEASED",
    )
    return status


def _build_ids_path(queue: str, verb: str) -> str:
    return f"/task-queues/{queue}/build-ids/{verb}"


async def _drain(ctx: CheckContext, queue: str, build_id: str | None, verb: str, requirement: str) -> None:
    reply = await ctx.client.control("POST", _build_ids_path(queue, verb), {"build_id": build_id})
    ctx.expect(reply, 200, what=f"{verb} build id {build_id!r} on {queue}", requirement=requirement)


def _require_status_without_task(
    ctx: CheckContext, reply: Reply, status: str, message: str, requirement: str | None = None
) -> None:
    """A poll answered ``poll_status`` ``status`` with ``task: null`` (the key present)."""
    body = reply.json()
    ctx.require(
        body.get("poll_status") == status and "task" in body and body.get("task") is None,
        message,
        expected=f"poll_status: {status}, task: null",
        received=f"poll_status {body.get('poll_status')!r}, task {repr(body.get('task', '<absent>'))[:120]}",
        replies=[reply],
        requirement=requirement,
    )


def _expect_draining(ctx: CheckContext, reply: Reply, kind: str, requirement: str) -> None:
    ctx.expect(
        reply, 409, "worker_draining", what=f"{kind} poll by a draining build-id cohort", requirement=requirement
    )
    message = f"a drained {kind} poll says poll_status 'draining' with task: null"
    _require_status_without_task(ctx, reply, "draining", message, "POLL-STATUS-DRAINING-409")


async def _timed(
    ctx: CheckContext, kind: str, worker: str, queue: str, timeout: int | None, *, limit: float, requirement: str
) -> tuple[Reply, float]:
    """A poll (``timeout`` None: without timeout_seconds) and how long the server held it; no answer within
    ``limit`` seconds breaks ``requirement``."""
    body: dict[str, Any] = {"worker_id": worker, "task_queue": queue}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    start = time.monotonic()
    try:
        reply = await ctx.client.worker(POLL_PATH[kind], body, timeout=limit)
    except HarnessError:
        elapsed = time.monotonic() - start
        if elapsed < limit - 0.5:
            raise  # the connection broke: the harness's problem, not a hold that was too long
        raise ctx.fail(
            f"a {kind} poll with timeout_seconds {timeout} got no answer",
            expected=f"an answer within {limit:g} s",
            received=f"nothing after {elapsed:.1f} s",
            requirement=requirement,
        ) from None
    # The hold of the delivery that was answered: under --faults a poll whose connection was reset is sent
    # again, and the time before the resend is the network's, not the server's.
    return reply, reply.exchange.elapsed


async def _held_for(
    ctx: CheckContext, worker: str, queue: str, timeout: int, clamp: float, *, limit: float, requirement: str
) -> tuple[Reply, float]:
    """An empty workflow poll whose hold should be ``clamp`` s, and how long it was held on the target's clock.

    Without a test clock that is the real hold (as :func:`_timed` measures it). With one, the clock is moved to
    the end of the expected hold once the poll is waiting there: a target that clamps as it should answers
    at once; one that holds longer keeps the poll in real time until it answers or ``limit`` passes.
    """
    started = ctx.now()
    timed = _timed(ctx, "workflow", worker, queue, timeout, limit=limit, requirement=requirement)
    # Released at the expected end; a poll still held then is released at the end of what it asked for.
    asked = max(clamp, min(float(timeout), 60.0))
    reply, real = await ctx.held(timed, asked, until=started + timedelta(seconds=clamp))
    return reply, real if not ctx.target.clock.skips else ctx.held_seconds(started, reply)


@check("LONGPOLL-HOLD", "POLL-STATUS-EMPTY")
async def long_poll_holds_for_timeout(ctx: CheckContext) -> None:
    """An empty queue polled with timeout_seconds t ∈ {1, 2} answers 200 empty after t s (t-0.5 … t+3), per request."""
    queue = ctx.uid("q")
    plan = [("workflow", 1), ("workflow", 2), ("activity", 2), ("query", 2)]
    workers = [await ctx.register(queue) for _ in plan]
    results = await race(
        _timed(ctx, kind, w, queue, t, limit=t + 8, requirement="LONGPOLL-HOLD")
        for (kind, t), w in zip(plan, workers, strict=True)
    )
    for (kind, t), (reply, elapsed) in zip(plan, results, strict=True):
        ctx.expect(reply, 200, what=f"{kind} poll of an empty queue", requirement="POLL-STATUS-EMPTY")
        message = f"an expired {kind} long poll is the normal envelope with task: null and poll_status 'empty'"
        _require_status_without_task(ctx, reply, "empty", message, "POLL-STATUS-EMPTY")
        ctx.require(
            t - 0.5 <= elapsed <= t + 3,
            f"an empty {kind} poll with timeout_seconds {t} holds about {t} s",
            expected=f"{t - 0.5:g} s … {t + 3:g} s",
            received=f"{elapsed:.2f} s",
            replies=[reply],
            requirement="LONGPOLL-HOLD",
        )


@check("LONGPOLL-CLAMP-MAX", slow=True)
async def long_poll_clamps_max(ctx: CheckContext) -> None:
    """timeout_seconds 120 is clamped to 60 (or the shorter clamp a test profile declares): the empty poll
    returns within that plus slack."""
    declared = ctx.target.test_profile.get("long_poll_max_seconds")
    clamp = declared if isinstance(declared, int) and 1 <= declared <= 60 else 60
    ctx.needs_short(clamp + 5, f"a poll with timeout_seconds 120, which may hold {clamp} s,", "long_poll_max_seconds")
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    reply, elapsed = await _held_for(ctx, wid, queue, 120, clamp, limit=clamp + 20, requirement="LONGPOLL-CLAMP-MAX")
    ctx.expect(reply, 200, what="poll with timeout_seconds 120")
    ctx.require(
        elapsed <= clamp + 5,
        f"timeout_seconds above the maximum is clamped to {clamp} s",
        expected=f"≤ {clamp + 5} s",
        received=f"{elapsed:.1f} s",
        replies=[reply],
    )


# The long poll's default hold (the worker protocol's long-poll table: timeout_seconds default 30, 1 … 60).
DEFAULT_POLL_SECONDS = 30


def _declared_clamp(ctx: CheckContext) -> int:
    """The longest hold: 60 s, or the shorter long_poll_max_seconds a test profile declares."""
    declared = ctx.target.test_profile.get("long_poll_max_seconds")
    return declared if isinstance(declared, int) and not isinstance(declared, bool) and 1 <= declared <= 60 else 60


@check("LONGPOLL-DEFAULT-HOLD", slow=True)
async def long_poll_default_hold(ctx: CheckContext) -> None:
    """An empty queue polled without timeout_seconds holds the default 30 s (or the default and clamp a test profile
    declares, long_poll_default_seconds and long_poll_max_seconds) before answering empty, judged on the target's
    clock."""
    declared = ctx.target.test_profile.get("long_poll_default_seconds")
    default = declared if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1 else None
    hold = min(default or DEFAULT_POLL_SECONDS, _declared_clamp(ctx))
    ctx.needs_short(hold + 5, f"a poll without timeout_seconds, which holds {hold} s,", "long_poll_max_seconds")
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    req = "LONGPOLL-DEFAULT-HOLD"
    started = ctx.now()
    timed = _timed(ctx, "workflow", wid, queue, None, limit=hold + 20, requirement=req)
    # With a test clock the clock first stops a second short of the hold's end: a poll answered there held too
    # short a default (moved straight to the end, a 1-s hold could not be told from the right one).
    reply, real = await ctx.held(timed, hold, until=started + timedelta(seconds=max(0.0, hold - 1.0)))
    elapsed = ctx.held_seconds(started, reply) if ctx.target.clock.skips else real
    body = ctx.expect(reply, 200, what="poll without timeout_seconds")
    ctx.require(
        body.get("task") is None and hold - 0.5 <= elapsed <= hold + 5,
        f"an empty poll without timeout_seconds holds the default {hold} s",
        expected=f"task null after {hold - 0.5:g} s … {hold + 5:g} s",
        received={"task": repr(body.get("task"))[:80], "held": f"{elapsed:.2f} s"},
        replies=[reply],
    )


@check("LONGPOLL-CLAMP-MIN")
async def long_poll_clamps_min(ctx: CheckContext) -> None:
    """timeout_seconds 0 or -5 is clamped to 1: the empty poll returns within 1 s plus slack."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    for value in (0, -5):
        reply, elapsed = await _held_for(ctx, wid, queue, value, 1, limit=10, requirement="LONGPOLL-CLAMP-MIN")
        body = ctx.expect(reply, 200, what=f"poll with timeout_seconds {value}")
        ctx.require(
            body.get("task") is None,
            f"a poll of an empty queue with timeout_seconds {value} has no task",
            expected="task: null",
            received=repr(body.get("task"))[:80],
            replies=[reply],
            requirement="POLL-STATUS-NULL-TASK",
        )
        ctx.require(
            elapsed <= 3.0,
            f"timeout_seconds {value} is clamped to 1 s",
            expected="≤ 1 s + 2 s slack",
            received=f"{elapsed:.2f} s",
            replies=[reply],
        )


# Let the poll reach the server and start waiting before the work appears; nothing black-box announces
# that a poll is being held, and the spec's own recipe is "poll with 30 s, start after 1 s" (§16.16).
POLL_SETTLE_SECONDS = 1.0


async def _settle(ctx: CheckContext, waiting: asyncio.Task[Reply], kind: str, *, settled: bool = False) -> None:
    """Let ``waiting`` reach the server (unless that time has passed already); it must still be held."""
    if not settled:
        await ctx.wait(POLL_SETTLE_SECONDS, real=True)
    if waiting.done():
        raise ctx.fail(
            f"an empty {kind} queue polled with timeout_seconds 20 holds the poll",
            expected="a poll still waiting after 1 s",
            received="the poll had already answered",
            replies=[waiting.result()],
            requirement="LONGPOLL-HOLD",
        )


async def _delivered(
    ctx: CheckContext, waiting: asyncio.Task[Reply], started: float, workflow_id: str, names: tuple[str, str, str]
) -> dict[str, Any]:
    """The task the ``waiting`` poll leased: one of ``workflow_id``'s, answered within 5 s of ``started`` (when
    the work was made ready). ``names``: the poll's kind, what it leases, what made it ready."""
    kind, leased, cause = names
    reply = await waiting
    elapsed = time.monotonic() - started
    task = polled_task(ctx, reply, f"the waiting {kind} poll")
    ctx.require(
        task is not None and task.get("workflow_id") == workflow_id,
        f"the waiting {kind} poll leases {leased} of the workflow made ready meanwhile",
        expected=f"{leased} of {workflow_id}",
        received=repr(task)[:200],
        replies=[reply],
    )
    ctx.require(
        elapsed < 5.0,
        f"{leased} that becomes ready during a long poll is returned immediately",
        expected=f"< 5 s after {cause}",
        received=f"{elapsed:.2f} s",
        replies=[reply],
    )
    assert task is not None
    return task


@check("LONGPOLL-IMMEDIATE-DELIVERY")
async def long_poll_delivers_immediately(ctx: CheckContext) -> None:
    """Work that becomes ready while a 20 s poll waits is delivered at once (workflow and activity polls)."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    # Real holds: these polls must still be waiting when the work appears (a test clock is not moved here).
    wf_poll = asyncio.create_task(send_poll(ctx, "workflow", wid, queue, 20, real=True))
    act_poll = asyncio.create_task(send_poll(ctx, "activity", wid, queue, 20, real=True))
    try:
        await _settle(ctx, wf_poll, "workflow")
        await _settle(ctx, act_poll, "activity", settled=True)
        started = time.monotonic()
        workflow_id, _ = await ctx.start(queue)
        task = await _delivered(ctx, wf_poll, started, workflow_id, ("workflow", "a task", "the start"))
        # The activity becomes ready when the workflow task completes.
        started = time.monotonic()
        done = await ctx.complete(task, [{**SCHEDULE_ACTIVITY, "queue": queue}])
        ctx.expect(done, 200, what="workflow-task complete with schedule_activity")
        await _delivered(ctx, act_poll, started, workflow_id, ("activity", "an activity", "the schedule"))
    finally:
        for waiting in (wf_poll, act_poll):
            if not waiting.done():
                waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await waiting


@check("POLL-STATUS-PRESENT", "POLL-STATUS-TASK-IFF-LEASED", "POLL-STATUS-NULL-TASK")
async def poll_status_on_every_poll(ctx: CheckContext) -> None:
    """Empty and leased workflow, activity and query polls all carry poll_status; task ⇔ 'leased'."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    empties = await race(send_poll(ctx, kind, wid, queue, 1) for kind in TASK_KINDS)
    for kind, reply in zip(TASK_KINDS, empties, strict=True):
        ctx.expect(reply, 200, what=f"{kind} poll of an empty queue")
        status = _judge_poll_status(ctx, reply, kind)
        ctx.require_equal(
            status, "empty", f"an empty {kind} poll says 'empty'", replies=[reply], requirement="POLL-STATUS-EMPTY"
        )
    for kind, (_, reply, _) in (await _leased_of_every_kind(ctx)).items():
        status = _judge_poll_status(ctx, reply, kind)
        ctx.require_equal(
            status,
            "leased",
            f"a {kind} poll that returns a task says 'leased'",
            replies=[reply],
            requirement="POLL-STATUS-TASK-IFF-LEASED",
        )


@check("POLL-STATUS-DRAINING-409", "DRAIN-REFUSES-LEASE")
async def drain_refuses_lease(ctx: CheckContext) -> None:
    """After drain {build_id: b}, polls of b's workers are 409 worker_draining/draining and never lease ready work."""
    queue = ctx.uid("q")
    build = "conformance-drain-b1"
    wid = await ctx.register(queue, build_id=build, capabilities=["query_tasks"])
    workflow_id = await _schedule_activity(ctx, wid, queue)  # a ready activity task
    await ctx.start(queue)  # and a ready workflow task
    await _drain(ctx, queue, build, "drain", "DRAIN-REFUSES-LEASE")
    for kind in ("workflow", "activity", "workflow", "activity"):
        _expect_draining(ctx, await send_poll(ctx, kind, wid, queue, 1), kind, "DRAIN-REFUSES-LEASE")
    # A query of the drained cohort's run: either refused at once (no worker can answer) or left waiting;
    # the query poll is draining either way.
    async with _open_query(ctx, workflow_id):
        _expect_draining(ctx, await send_poll(ctx, "query", wid, queue, 1), "query", "DRAIN-REFUSES-LEASE")


@check("DRAIN-RESUME")
async def drain_resume_restores_leasing(ctx: CheckContext) -> None:
    """After resume {build_id: b}, the drained worker leases the ready work again."""
    queue = ctx.uid("q")
    build = "conformance-drain-b1"
    wid = await ctx.register(queue, build_id=build)
    await _drain(ctx, queue, build, "drain", "DRAIN-RESUME")
    workflow_id, _ = await ctx.start(queue)
    _expect_draining(ctx, await send_poll(ctx, "workflow", wid, queue, 1), "workflow", "DRAIN-REFUSES-LEASE")
    await _drain(ctx, queue, build, "resume", "DRAIN-RESUME")
    task, reply = await lease_task(ctx, "workflow", wid, queue, within=5.0)
    ctx.require_equal(
        task.get("workflow_id"), workflow_id, "after resume the worker leases the waiting work", replies=[reply]
    )


@check("DRAIN-IDEMPOTENT")
async def drain_is_idempotent(ctx: CheckContext) -> None:
    """Drain and resume twice are both fine; build_id null drains only the unversioned cohort."""
    queue = ctx.uid("q")
    build = "conformance-drain-b1"
    versioned = await ctx.register(queue, build_id=build)
    unversioned = await ctx.register(queue)
    for _ in range(2):
        await _drain(ctx, queue, build, "drain", "DRAIN-IDEMPOTENT")
    _expect_draining(ctx, await send_poll(ctx, "workflow", versioned, queue, 1), "workflow", "DRAIN-IDEMPOTENT")
    for _ in range(2):
        await _drain(ctx, queue, build, "resume", "DRAIN-IDEMPOTENT")
    ctx.expect(
        await send_poll(ctx, "workflow", versioned, queue, 1),
        200,
        what="poll after resuming twice",
        requirement="DRAIN-IDEMPOTENT",
    )
    await _drain(ctx, queue, None, "drain", "DRAIN-IDEMPOTENT")
    _expect_draining(ctx, await send_poll(ctx, "workflow", unversioned, queue, 1), "workflow", "DRAIN-IDEMPOTENT")
    ctx.expect(
        await send_poll(ctx, "workflow", versioned, queue, 1),
        200,
        what=f"poll of the {build!r} cohort while the unversioned cohort drains",
        requirement="DRAIN-IDEMPOTENT",
    )
    await _drain(ctx, queue, None, "resume", "DRAIN-IDEMPOTENT")
    workflow_id, _ = await ctx.start(queue)
    task, reply = await lease_task(ctx, "workflow", unversioned, queue, within=5.0)
    ctx.require_equal(
        task.get("workflow_id"),
        workflow_id,
        "after resume {build_id: null} the unversioned worker leases",
        replies=[reply],
        requirement="DRAIN-IDEMPOTENT",
    )


async def _throttled_poll(ctx: CheckContext) -> Reply:
    """Fill a fresh queue to the advertised admission limit with live leases; return the next poll."""
    limit = ctx.target.test_profile.get("max_active_leases_per_queue")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise NotCovered("the target advertises no admission limit, so throttling cannot be provoked", THROTTLE_SETTING)
    if limit > 64:
        raise NotCovered(
            f"the advertised admission limit is {limit} live leases per queue; the check fills at most 64",
            THROTTLE_SETTING + " ≤ 64",
        )
    lease = advertised_lease(ctx) or 300.0
    for _ in range(3):
        queue = ctx.uid("q")
        workers = [await ctx.register(queue) for _ in range(limit + 1)]
        for _ in range(limit + 1):
            await ctx.start(queue)
        started = ctx.now()
        fills = await race(send_poll(ctx, "workflow", w, queue, 1) for w in workers[:limit])
        throttled = [r for r in fills if r.json().get("poll_status") == "throttled"]
        if throttled:
            return throttled[0]  # the target pushed back already: that answer is the one to judge
        leased = [task_of(r) for r in fills if task_of(r) is not None]
        if len(leased) < limit:
            # Fewer live leases than advertised: the next poll proves nothing about this limit.
            raise ctx.fail(
                f"{limit} concurrent polls of {limit + 1} ready workflow tasks leased only {len(leased)}",
                expected=f"{limit} leases (the advertised max_active_leases_per_queue)",
                received=[f"{r.status} {r.json().get('poll_status')}" for r in fills],
                replies=fills[:4],
                requirement="LEASE-ONE-PER-POLL",
            )
        reply = await send_poll(ctx, "workflow", workers[limit], queue, 1)
        if task_of(reply) is None or (ctx.now() - started).total_seconds() < lease - 0.5:
            return reply
        # A lease may have expired before the probe reached the server; the probe is inconclusive.
    raise NotCovered(f"the {lease:g} s leases expired before the queue could be filled three times", THROTTLE_SETTING)


@check("POLL-STATUS-THROTTLED")
async def poll_throttled_at_admission_limit(ctx: CheckContext) -> None:
    """At the admission limit, a poll of a queue with ready work is 200 'throttled' with task: null, not 'empty'."""
    reply = await _throttled_poll(ctx)
    ctx.expect(reply, 200, what="poll beyond the admission limit")
    message = "a poll refused by the admission limit says 'throttled' with task: null, even with ready work"
    _require_status_without_task(ctx, reply, "throttled", message)


@check("POLL-STATUS-RETRY-AFTER")
async def poll_throttled_has_retry_after(ctx: CheckContext) -> None:
    """A throttled poll SHOULD carry retry_after_seconds."""
    reply = await _throttled_poll(ctx)
    body = reply.json()
    if body.get("poll_status") != "throttled":
        raise NotCovered("the target did not throttle at its advertised limit (see poll_throttled_at_admission_limit)")
    value = body.get("retry_after_seconds")
    ctx.require(
        isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
        "a throttled poll carries retry_after_seconds",
        expected="a number ≥ 0",
        received=repr(value),
        replies=[reply],
    )


@check("POLL-STATUS-UNAVAILABLE")
async def poll_status_unavailable(ctx: CheckContext) -> None:
    """An 'unavailable' poll is 503 (or 200) with task: null and a reason."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    switch = ctx.target.test_profile.get("matching_switch")
    if isinstance(switch, str) and "{queue}" in switch and switch.startswith("/api/"):
        # The target offers the Appendix C switch: turn matching off for this queue only.
        path = switch.removeprefix("/api").replace("{queue}", queue)
        ctx.expect(await ctx.client.control("POST", path, {"available": False}), 200, what="matching switch")
        try:
            replies = await race(send_poll(ctx, kind, wid, queue, 1) for kind in TASK_KINDS)
            for reply in replies:
                ctx.require(
                    reply.json().get("poll_status") == "unavailable",
                    "a poll of a queue whose matching layer is down answers poll_status 'unavailable'",
                    expected="unavailable",
                    received=f"{reply.status} {reply.json().get('poll_status')}",
                    replies=[reply],
                )
        finally:
            await ctx.client.control("POST", path, {"available": True})
        await ctx.start(queue)
        leased = await lease_wf(ctx, wid, queue)
        ctx.require(bool(leased), "leasing resumes once matching is available again")
    else:
        replies = await race(send_poll(ctx, kind, wid, queue, 1) for kind in TASK_KINDS)
    seen = [r for r in replies if r.json().get("poll_status") == "unavailable"]
    if not seen:
        raise NotCovered(
            "poll_status 'unavailable' needs a matching layer that cannot coordinate; a black-box "
            "client cannot cause that and the target advertises no switch for it",
            profile_setting("matching_switch"),
        )
    for reply in seen:
        body = ctx.expect(reply, (503, 200), what="an unavailable poll")
        ctx.require(
            "task" in body and body.get("task") is None and isinstance(body.get("reason"), str),
            "an unavailable poll has task: null and a reason",
            expected="task: null, reason: str",
            received={k: body.get(k) for k in ("task", "reason")},
            replies=[reply],
        )


def _require_poller_owns(ctx: CheckContext, task: dict[str, Any], worker: str, reply: Reply, what: str) -> None:
    """LEASE-OWNER-IS-POLLER: ``task``, leased by ``reply`` to a poll of ``worker``, names that worker as owner."""
    message = f"{what}'s lease_owner is the poller's worker_id"
    ctx.require_equal(task.get("lease_owner"), worker, message, replies=[reply], requirement="LEASE-OWNER-IS-POLLER")


def _leases(ctx: CheckContext, replies: list[Reply], workers: list[str], requirement: str) -> list[dict[str, Any]]:
    """The leased tasks of concurrent polls; each 200, each lease owned by its poller, no (task, attempt) twice."""
    tasks: list[dict[str, Any]] = []
    seen: dict[tuple[Any, Any], str] = {}
    for worker, reply in zip(workers, replies, strict=True):
        ctx.expect(reply, 200, what="concurrent poll", requirement=requirement)
        task = task_of(reply)
        if task is None:
            continue
        _require_poller_owns(ctx, task, worker, reply, "a leased task")
        key = task_key(task)
        ctx.require(
            key not in seen,
            "two concurrent polls never both lease the same (task_id, workflow_task_attempt)",
            expected="one lease per (task_id, attempt)",
            received=f"{key} leased to {seen.get(key)} and {worker}",
            replies=replies,
            requirement="LEASE-NO-DUPLICATE-ATTEMPT",
        )
        seen[key] = worker
        tasks.append(task)
    return without_redeliveries(ctx, tasks)


@check("LEASE-EXCLUSIVE", "LEASE-NO-DUPLICATE-ATTEMPT")
async def lease_exclusive_among_racing_pollers(ctx: CheckContext) -> None:
    """8 pollers racing for one ready workflow task: exactly one is leased, the other polls are empty."""
    queue = ctx.uid("q")
    workers = [await ctx.register(queue) for _ in range(8)]
    await ctx.start(queue)
    replies = await race(send_poll(ctx, "workflow", w, queue, 1) for w in workers)
    tasks = _leases(ctx, replies, workers, "LEASE-EXCLUSIVE")
    ctx.require(
        len(tasks) == 1,
        "exactly one of 8 racing polls leases the single ready task",
        expected=1,
        received=f"{len(tasks)} leased: {[task_key(t) for t in tasks]}",
        replies=replies,
        requirement="LEASE-EXCLUSIVE",
    )


@check("LEASE-EACH-TASK-ONCE", "LEASE-NO-DUPLICATE-ATTEMPT")
async def lease_each_ready_task_once(ctx: CheckContext) -> None:
    """4 ready tasks and 8 racing pollers: every task is leased exactly once, 4 leases in all."""
    queue = ctx.uid("q")
    workers = [await ctx.register(queue) for _ in range(8)]
    started = {(await ctx.start(queue))[0] for _ in range(4)}
    replies = await race(send_poll(ctx, "workflow", w, queue, 1) for w in workers)
    tasks = _leases(ctx, replies, workers, "LEASE-EACH-TASK-ONCE")
    leased = sorted(str(t.get("workflow_id")) for t in tasks)
    ctx.require_equal(
        leased,
        sorted(started),
        "each of the 4 ready tasks is leased exactly once",
        replies=replies,
        requirement="LEASE-EACH-TASK-ONCE",
    )


@check("LEASE-ONE-PER-POLL")
async def lease_claim_race_moves_on(ctx: CheckContext) -> None:
    """6 pollers racing for 6 ready tasks each get exactly one: a lost claim moves on to the next candidate."""
    queue = ctx.uid("q")
    workers = [await ctx.register(queue) for _ in range(6)]
    started = {(await ctx.start(queue))[0] for _ in range(6)}
    replies = await race(send_poll(ctx, "workflow", w, queue, 1) for w in workers)
    for reply in replies:
        ctx.expect(reply, 200, what="racing poll")
        task = reply.json().get("task")
        ctx.require(
            isinstance(task, dict),
            "with as many ready tasks as pollers every poll leases one task object",
            expected="task: {…} (one task)",
            received=repr(task)[:200],
            replies=[reply],
        )
    tasks = _leases(ctx, replies, workers, "LEASE-ONE-PER-POLL")
    leased = sorted(str(t.get("workflow_id")) for t in tasks)
    ctx.require_equal(leased, sorted(started), "the racing polls lease the 6 ready tasks, one each", replies=replies)


@check("LEASE-OWNER-IS-POLLER", "LEASE-FIRST-ATTEMPT", "LEASE-EXPIRY-IN-FUTURE")
async def lease_fields_on_first_delivery(ctx: CheckContext) -> None:
    """A first lease names the poller as lease_owner, has attempt 1 and a lease_expires_at after the request."""
    for kind, (worker, reply, sent) in (await _leased_of_every_kind(ctx)).items():
        task = task_of(reply)
        assert task is not None
        _require_poller_owns(ctx, task, worker, reply, f"a leased {kind} task")
        expires = ctx.lease_expiry(task, reply, "LEASE-EXPIRY-IN-FUTURE")
        date = reply.server_date
        # The server's Date (floored to the second) is at or after it received the poll; without one, allow
        # a minute of clock skew against the local send time.
        floor, what = (
            (date, "the response Date")
            if date is not None
            else (sent - timedelta(seconds=60), "the local send time minus 60 s of skew")
        )
        ctx.require(
            expires > floor,
            f"a leased {kind} task's lease_expires_at is later than the request",
            expected=f"after {floor.isoformat()} ({what})",
            received=task.get("lease_expires_at"),
            replies=[reply],
            requirement="LEASE-EXPIRY-IN-FUTURE",
        )
        if kind == "workflow":
            ctx.require_equal(
                task.get("workflow_task_attempt"),
                1,
                "the first delivery is workflow_task_attempt 1",
                replies=[reply],
                requirement="LEASE-FIRST-ATTEMPT",
            )


@check("LEASE-DEFAULT-DURATION")
async def lease_default_duration(ctx: CheckContext) -> None:
    """The workflow-task lease is 300 s ± 5 s, or the shorter test lease the target advertises."""
    advertised = advertised_lease(ctx)
    expected, tolerance = (advertised, 1.5) if advertised is not None and advertised < 300 else (300.0, 5.0)
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    await ctx.start(queue)
    task, reply = await lease_task(ctx, "workflow", wid, queue)
    date = reply.server_date
    if date is None:
        raise NotCovered(
            "the target sends no Date header, so the lease length cannot be read off its own clock",
            "a Date response header",
        )
    length = (ctx.lease_expiry(task, reply, "LEASE-DEFAULT-DURATION") - date).total_seconds()
    # Date is floored to the second: the measured length is the lease plus up to 1 s.
    ctx.require(
        expected - tolerance <= length <= expected + 1 + tolerance,
        "lease_expires_at minus the server's receipt time is the lease length",
        expected=f"{expected:g} s ± {tolerance:g} s" + (" (advertised test lease)" if expected < 300 else ""),
        received=f"{length:.1f} s",
        replies=[reply],
    )


@check("LEASE-NOT-SHARED-WHILE-LIVE")
async def lease_not_shared_while_live(ctx: CheckContext) -> None:
    """While a workflow task's lease is live no other poller gets it."""
    queue = ctx.uid("q")
    owner, other = await ctx.register(queue), await ctx.register(queue)
    await ctx.start(queue)
    task, _ = await lease_task(ctx, "workflow", owner, queue)
    for _ in range(3):
        hb = await ctx.wf_call(task, "heartbeat")
        expires = ctx.lease_expiry(
            ctx.expect(hb, 200, what="owner heartbeat", requirement="LEASE-HEARTBEAT-RENEWS"),
            hb,
            "LEASE-HEARTBEAT-RENEWS",
        )
        reply = await send_poll(ctx, "workflow", other, queue, 1)
        ctx.expect(reply, 200, what="poll by another worker")
        got = task_of(reply)
        if got is None or got.get("task_id") != task.get("task_id"):
            continue
        date = reply.server_date
        # The claim happened before the response, i.e. before Date + 1 s: if that is still before the
        # renewed expiry, the lease was live when the task was handed out again.
        live = date is not None and (expires - date).total_seconds() >= 1
        ctx.require(
            not live,
            "a task whose lease is live is not handed to another poller",
            expected=f"no lease for {other} before {task.get('lease_expires_at')}",
            received=f"{other} leased {task_key(got)} at {reply.headers.get('date')} (owner's lease ran to "
            f"{expires.isoformat()})",
            replies=[hb, reply],
        )
        raise NotCovered(
            "the other worker got the task, but its response Date cannot prove the owner's "
            "renewed lease was still live then",
            "a longer workflow-task lease",
        )


@check("LEASE-HEARTBEAT-RENEWS")
async def lease_heartbeat_renews(ctx: CheckContext) -> None:
    """An owner heartbeat is 200 renewed: true with a lease_expires_at never earlier and set afresh."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    await ctx.start(queue)
    task, poll = await lease_task(ctx, "workflow", wid, queue)
    first = ctx.lease_expiry(task, poll, "LEASE-EXPIRY-IN-FUTURE")
    previous = first

    async def probe() -> datetime | None:
        nonlocal previous
        reply = await ctx.wf_call(task, "heartbeat")
        body = ctx.expect(reply, 200, what="owner heartbeat", fields={"renewed": True})
        expires = previous = ctx.renewed_lease(body, reply, previous)
        return expires if expires > first else None

    # Heartbeats keep the lease live; as time passes a renewal (now + lease) must move past the first expiry.
    await ctx.wait_until(probe, timeout=3.0, interval=0.25, what="a heartbeat to extend lease_expires_at")


@check("LEASE-HEARTBEAT-RUN-STATUS")
async def lease_heartbeat_reports_run_status(ctx: CheckContext) -> None:
    """A workflow-task heartbeat returns the renewed lease_expires_at and the run's current status."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    workflow_id, _ = await ctx.start(queue)
    task, _ = await lease_task(ctx, "workflow", wid, queue)
    reply = await ctx.wf_call(task, "heartbeat")
    body = ctx.expect(reply, 200, what="owner heartbeat")
    ctx.lease_expiry(body, reply, "LEASE-HEARTBEAT-RUN-STATUS")
    status = (await ctx.describe(workflow_id)).get("status")
    ctx.require(
        body.get("run_status") == status,
        "the heartbeat reports the run's current status",
        expected=f"run_status {status!r} (as described)",
        received=repr(body.get("run_status")),
        replies=[reply],
    )


async def _leased_by_poll_id(ctx: CheckContext, runs: int = 1) -> tuple[str, str, str, dict[str, Any], Reply]:
    """A worker on a fresh queue with ``runs`` runs started, and a workflow task leased to it by a poll with a
    poll_request_id: (queue, worker, poll_request_id, task, the poll's reply)."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    for _ in range(runs):
        await ctx.start(queue)
    prid = ctx.uid("poll")
    task, reply = await lease_task(ctx, "workflow", worker, queue, poll_request_id=prid)
    return queue, worker, prid, task, reply


@check("IDEMPOTENT-POLL-REPLAY")
async def poll_replay_same_task_and_attempt(ctx: CheckContext) -> None:
    """A repeated poll_request_id returns the same task and attempt (not another ready task), attempt unchanged."""
    # A second ready task the replay must not hand out.
    queue, wid, prid, task, first = await _leased_by_poll_id(ctx, runs=2)
    again = await send_poll(ctx, "workflow", wid, queue, 1, poll_request_id=prid)
    replay = polled_task(ctx, again, "poll with the same poll_request_id")
    ctx.require(
        replay is not None and task_key(replay) == task_key(task),
        "a repeated poll_request_id returns the same task_id and workflow_task_attempt",
        expected=task_key(task),
        received=task_key(replay) if replay else None,
        replies=[first, again],
    )
    done = await ctx.complete(task, [{"type": "complete_workflow"}])
    ctx.expect(done, 200, what="complete with the original attempt after the replay (the attempt did not move)")


@check("IDEMPOTENT-POLL-OTHER-WORKER")
async def poll_replay_not_for_other_worker(ctx: CheckContext) -> None:
    """Another worker sending the same poll_request_id does not get that task."""
    queue, _owner, prid, task, _ = await _leased_by_poll_id(ctx)
    other = await ctx.register(queue)
    reply = await send_poll(ctx, "workflow", other, queue, 1, poll_request_id=prid)
    got = polled_task(ctx, reply, "poll by another worker with the same poll_request_id")
    if got is not None and got not in without_redeliveries(ctx, [task, got]):
        # Granted after the owner's lease had expired (a poll resent late under --faults, or a slow machine):
        # a redelivery, not a replay, and the owner no longer holds the lease the check goes on to judge.
        raise Indeterminate("the owner's lease expired before the other worker's poll was answered")
    ctx.require(
        got is None or got.get("task_id") != task.get("task_id"),
        "another worker's poll with the same poll_request_id gets no replay of the task",
        expected=f"not {task.get('task_id')}",
        received=task_key(got) if got else None,
        replies=[reply],
    )
    ctx.expect(await ctx.wf_call(task, "heartbeat"), 200, what="the owner still holds the lease")


@check("IDEMPOTENT-POLL-AFTER-CLOSE")
async def poll_replay_dropped_after_close(ctx: CheckContext) -> None:
    """After the task is completed or failed, a poll with its poll_request_id follows the normal rules."""
    queue, wid, prid, task, _ = await _leased_by_poll_id(ctx)
    ctx.expect(await ctx.complete(task, [{"type": "complete_workflow"}]), 200, what="complete")
    fresh_id, _ = await ctx.start(queue)
    reply = await send_poll(ctx, "workflow", wid, queue, 1, poll_request_id=prid)
    got = polled_task(ctx, reply, "poll with the poll_request_id of a completed task")
    ctx.require(
        got is not None and got.get("workflow_id") == fresh_id and got.get("workflow_task_attempt") == 1,
        "after complete the poll_request_id is forgotten: the poll leases the new ready task",
        expected=f"a first lease of {fresh_id}",
        received=repr(got)[:200] if got else "no task",
        replies=[reply],
    )
    assert got is not None
    fail = await ctx.wf_call(got, "fail", {"failure": {"message": "conformance: replay dropped after fail"}})
    ctx.expect(fail, 200, what="fail")
    reply = await send_poll(ctx, "workflow", wid, queue, 1, poll_request_id=prid)
    again = polled_task(ctx, reply, "poll with the poll_request_id of a failed task")
    ctx.require(
        again is None or task_key(again) != task_key(got),
        "after fail the poll_request_id is forgotten: the failed attempt is never handed out again",
        expected=f"not {task_key(got)}",
        received=task_key(again) if again else None,
        replies=[reply],
    )


@check("IDEMPOTENT-POLL-AFTER-CLOSE", slow=True)
async def poll_replay_dropped_after_expiry(ctx: CheckContext) -> None:
    """After the lease expires, a poll with its poll_request_id gets a new attempt, not the stale replay."""
    queue, wid, prid, task, poll = await _leased_by_poll_id(ctx)
    expires = ctx.lease_expiry(task, poll, "IDEMPOTENT-POLL-AFTER-CLOSE")
    date = poll.server_date
    lease = (expires - date).total_seconds() if date is not None else advertised_lease(ctx)
    ctx.needs_short(
        None if lease is None else lease + 2,
        "a workflow-task lease expiry",
        "workflow_task_lease_seconds",
    )
    assert lease is not None

    if date is None and not ctx.target.clock.skips:
        raise NotCovered(
            "the target sends no Date header, so lease expiry cannot be read off its clock",
            "a Date response header",
        )
    await ctx.wait_past(expires, within=lease + 4, what="the lease to expire on the server's clock")
    reply = await send_poll(ctx, "workflow", wid, queue, 1, poll_request_id=prid)
    got = polled_task(ctx, reply, "poll with the poll_request_id of an expired lease")
    ctx.require(
        got is not None
        and got.get("task_id") == task.get("task_id")
        and isinstance(got.get("workflow_task_attempt"), int)
        and got["workflow_task_attempt"] > task["workflow_task_attempt"],
        "after expiry the cached poll is dropped: a fresh poll redelivers the task with a new attempt",
        expected=f"task {task.get('task_id')} with attempt > {task.get('workflow_task_attempt')}",
        received=task_key(got) if got else "no task",
        replies=[poll, reply],
    )
