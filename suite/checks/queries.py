"""Query tasks (docs/reference.md: Queries, Control plane, invariants 60-64).

``POST /api/workflows/{id}/query/{name}`` holds the caller until a worker answers, so each check runs the
control-plane call as an asyncio task while it plays the worker: it polls ``/query-tasks/poll`` and
completes or fails the leased query task, then reads what the control-plane caller got.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.protocol.codec import decode_blob, value_to_json
from suite.protocol.requirements import Area
from suite.registry import check
from suite.text import plural
from suite.worlds import (
    QUERY_ARGS,
    QueryRun,
    lease_query,
    poll_query,
    query_call,
    query_timeout,
    require_no_task,
    settle,
    start_query,
    waiting_run,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.QUERIES, Area.FENCING)


async def _snapshot(ctx: CheckContext, run: QueryRun) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return await ctx.describe(run.workflow_id), await ctx.history(run.workflow_id, run.run_id)


@check("QUERY-TASK-CREATED", "QUERY-RESULT-ROUNDTRIP", "QUERY-READ-ONLY")
async def query_task_roundtrip(ctx: CheckContext) -> None:
    """A query becomes a leasable query task; the worker's result_envelope comes back unchanged; the run's
    describe and history do not change and no workflow task appears."""
    run = await waiting_run(ctx)
    before = await _snapshot(ctx, run)
    call = start_query(ctx, run, "status")
    try:
        task = await lease_query(ctx, run, call, requirement="QUERY-TASK-CREATED")
        want = {
            "query_task_attempt": 1,
            "query_name": "status",
            "lease_owner": run.worker,
            "workflow_id": run.workflow_id,
        }
        ctx.require_equal(
            {key: task.get(key) for key in want},
            want,
            "the leased query task names the query that was sent, its run, and the poller as lease_owner",
            requirement="QUERY-TASK-CREATED",
        )
        args = task.get("query_arguments")
        try:
            decoded = value_to_json(decode_blob(args["blob"])) if isinstance(args, dict) else None
        except Exception:  # any decode problem is the target's malformed blob
            decoded = "<undecodable>"
        ctx.require(
            isinstance(args, dict) and args.get("codec") == "avro" and decoded == QUERY_ARGS,
            "the leased query task carries the query's arguments",
            expected=f"avro {QUERY_ARGS!r}",
            received=f"query_arguments={args!r} (decodes to {decoded!r})",
            requirement="QUERY-TASK-CREATED",
        )
        result = ctx.envelope({"state": "parked", "count": 3})
        done = await query_call(ctx, task, "complete", {"result_envelope": result})
        ctx.expect(done, 200, what="query-task complete by the owner", requirement="QUERY-RESULT-ROUNDTRIP")
        reply = await call
    finally:
        await settle(call)
    body = ctx.expect(
        reply,
        200,
        what="the control-plane query after the worker answered",
        requirement="QUERY-RESULT-ROUNDTRIP",
    )
    got = body.get("result_envelope")
    ctx.require(
        isinstance(got, dict) and got.get("codec") == "avro" and got.get("blob") == result["blob"],
        "the control-plane caller gets the worker's result_envelope unchanged",
        expected=result,
        received=got,
        replies=[reply],
        requirement="QUERY-RESULT-ROUNDTRIP",
    )
    after = await _snapshot(ctx, run)
    ctx.require(
        after[1] == before[1],
        "a query appends nothing to history",
        expected=f"{plural(len(before[1]), 'event')}, unchanged",
        received=plural(len(after[1]), "event"),
        requirement="QUERY-READ-ONLY",
    )
    ctx.require_equal(after[0], before[0], "a query changes nothing that describe shows", requirement="QUERY-READ-ONLY")
    require_no_task(
        ctx,
        await ctx.poll_wf(run.worker, run.queue, 1),
        what="workflow-task poll after the query",
        requirement="QUERY-READ-ONLY",
        why="a query creates no workflow task",
    )


async def _worker_fails_query(ctx: CheckContext, reason: str, requirement: str) -> Reply:
    run = await waiting_run(ctx)
    call = start_query(ctx, run, "conformance_query")
    try:
        task = await lease_query(ctx, run, call, requirement=requirement)
        reply = await query_call(
            ctx, task, "fail", {"failure": {"message": f"conformance: {reason}", "reason": reason}}
        )
        ctx.expect(reply, 200, what=f"query-task fail with reason {reason}", requirement=requirement)
        return await call
    finally:
        await settle(call)


@check("QUERY-UNKNOWN-404")
async def query_unknown_is_404(ctx: CheckContext) -> None:
    """A worker fail with reason rejected_unknown_query makes the query 404 rejected_unknown_query."""
    reply = await _worker_fails_query(ctx, "rejected_unknown_query", "QUERY-UNKNOWN-404")
    ctx.expect(reply, 404, "rejected_unknown_query", what="the control-plane query")


@check("QUERY-REJECTED-409")
async def query_rejected_is_409(ctx: CheckContext) -> None:
    """A worker fail with reason query_rejected (or any other reason) makes the query 409."""
    reply = await _worker_fails_query(ctx, "query_rejected", "QUERY-REJECTED-409")
    ctx.expect(reply, 409, "query_rejected", what="the control-plane query")
    reply = await _worker_fails_query(ctx, "conformance_custom_failure", "QUERY-REJECTED-409")
    ctx.expect(reply, 409, what="the control-plane query failed with a custom reason")


@check("QUERY-NO-WORKER-FAST")
async def query_no_worker_fast(ctx: CheckContext) -> None:
    """With no worker registered on the run's queue the query is 409 query_worker_unavailable at once."""
    timeout, _ = query_timeout(ctx)
    await ctx.register(ctx.uid("q-elsewhere"))  # a worker exists, just not on this run's queue
    run = await waiting_run(ctx, register=False)
    started = time.monotonic()
    reply = await ctx.client.control(
        "POST", f"/workflows/{run.workflow_id}/query/status", {"input": QUERY_ARGS}, timeout=timeout + 15
    )
    elapsed = time.monotonic() - started
    ctx.expect(reply, 409, "query_worker_unavailable", what="a query nobody can answer")
    limit = min(timeout / 2, 5.0)
    ctx.require(
        elapsed < limit,
        "query_worker_unavailable comes without waiting for the query timeout",
        expected=f"< {limit:g}s (the query timeout is {timeout:g}s)",
        received=f"{elapsed:.2f}s",
        replies=[reply],
    )


@check("QUERY-TIMEOUT-504")
async def query_timeout_504(ctx: CheckContext) -> None:
    """With a registered worker that never polls, the query is 504 query_worker_timeout after ~the timeout."""
    req = "QUERY-TIMEOUT-504"
    timeout, advertised = query_timeout(ctx)
    ctx.needs_short(timeout, "the query timeout", "query_task_timeout_seconds")
    queue = ctx.uid("q")
    await ctx.register(queue)  # registered and fresh, but it never polls
    workflow_id, _ = await ctx.start(queue)
    started = ctx.now()
    call = ctx.client.control(
        "POST", f"/workflows/{workflow_id}/query/status", {"input": QUERY_ARGS}, timeout=timeout + 15
    )
    # With a test clock the target's clock is moved to the timeout; without one this waits it out.
    reply = await ctx.held(call, until=started + timedelta(seconds=timeout))
    elapsed = ctx.held_seconds(started, reply)
    ctx.expect(reply, 504, "query_worker_timeout", what="a query no worker picks up", requirement=req)
    low, high = (timeout - 0.5, timeout + 5.0) if advertised else (1.0, timeout + 5.0)
    ctx.require(
        low <= elapsed <= high,
        "query_worker_timeout comes after about the configured query timeout",
        expected=f"{low:g}s … {high:g}s",
        received=f"{elapsed:.2f}s",
        replies=[reply],
        requirement=req,
    )


@check("QUERY-LATE-COMPLETE-NOT-LEASED", "QUERY-TIMEOUT-504", "QUERY-READ-ONLY")
async def query_late_complete_not_leased(ctx: CheckContext) -> None:
    """After the query timed out (504), the holder's complete or fail is 409 query_task_not_leased and the
    task is not offered again; a second report after a terminal one is 409 query_task_not_leased too."""
    req = "QUERY-LATE-COMPLETE-NOT-LEASED"
    timeout, _ = query_timeout(ctx)
    ctx.needs_short(timeout, "the query timeout", "query_task_timeout_seconds")
    run = await waiting_run(ctx)
    started = ctx.now()
    call = start_query(ctx, run, "slow")
    try:
        task = await lease_query(ctx, run, call, requirement=req)
        # The worker sits on its lease until the control plane gives up.
        reply = await ctx.held(call, until=started + timedelta(seconds=timeout))
    finally:
        await settle(call)
    ctx.expect(
        reply,
        504,
        "query_worker_timeout",
        what="a leased query the worker never answers",
        requirement="QUERY-TIMEOUT-504",
    )
    late = await query_call(ctx, task, "complete", {"result_envelope": ctx.envelope("too late")})
    ctx.expect(late, 409, "query_task_not_leased", what="query complete after the timeout", requirement=req)
    late = await query_call(ctx, task, "fail", {"failure": {"message": "too late"}})
    ctx.expect(late, 409, "query_task_not_leased", what="query fail after the timeout", requirement=req)
    require_no_task(
        ctx,
        await poll_query(ctx, run),
        what="query-task poll after the timeout",
        requirement="QUERY-READ-ONLY",
        why="a timed-out query task is not retried",
    )
    # A second report after a terminal one.
    call = start_query(ctx, run, "twice")
    try:
        task = await lease_query(ctx, run, call, requirement=req)
        ctx.expect(
            await query_call(ctx, task, "complete", {"result_envelope": ctx.envelope(1)}),
            200,
            what="the first query complete",
            requirement="QUERY-RESULT-ROUNDTRIP",
        )
        second = await query_call(ctx, task, "complete", {"result_envelope": ctx.envelope(2)})
        ctx.expect(second, 409, "query_task_not_leased", what="a second query complete", requirement=req)
        second = await query_call(ctx, task, "fail", {"failure": {"message": "after the fact"}})
        ctx.expect(second, 409, "query_task_not_leased", what="a query fail after its complete", requirement=req)
        ctx.expect(
            await call,
            200,
            what="the control-plane query answered once",
            requirement="QUERY-RESULT-ROUNDTRIP",
        )
    finally:
        await settle(call)


@check("QUERY-FENCE-OWNER", "QUERY-FENCE-ATTEMPT")
async def query_fencing(ctx: CheckContext) -> None:
    """Query complete or fail with a wrong owner is 409 lease_owner_mismatch, with a wrong attempt 409
    query_task_attempt_mismatch; the owner's answer still reaches the caller."""
    run = await waiting_run(ctx)
    call = start_query(ctx, run, "fenced")
    try:
        task = await lease_query(ctx, run, call, requirement="QUERY-FENCE-OWNER")
        attempt = task.get("query_task_attempt")
        intruder = ctx.uid("intruder")
        wrong = attempt + 1 if isinstance(attempt, int) else 2
        reports = {"complete": {"result_envelope": ctx.envelope("stolen")}, "fail": {"failure": {"message": "stolen"}}}
        fences: list[tuple[dict[str, Any], str, str, str]] = [
            ({"owner": intruder}, "lease_owner_mismatch", "by another worker", "QUERY-FENCE-OWNER"),
            ({"attempt": wrong}, "query_task_attempt_mismatch", "with the next attempt number", "QUERY-FENCE-ATTEMPT"),
        ]
        for fence, reason, how, req in fences:
            for verb, body in reports.items():
                reply = await query_call(ctx, task, verb, body, **fence)
                ctx.expect(reply, 409, reason, what=f"query {verb} {how}", requirement=req)
        mine = ctx.envelope("mine")
        ctx.expect(
            await query_call(ctx, task, "complete", {"result_envelope": mine}),
            200,
            what="the owner's complete after the fenced calls",
            requirement="QUERY-FENCE-OWNER",
        )
        reply = await call
    finally:
        await settle(call)
    body = ctx.expect(reply, 200, what="the control-plane query", requirement="QUERY-FENCE-OWNER")
    ctx.require(
        (body.get("result_envelope") or {}).get("blob") == mine["blob"],
        "the caller gets the owner's answer, not an intruder's",
        expected=mine,
        received=body.get("result_envelope"),
        replies=[reply],
        requirement="QUERY-FENCE-OWNER",
    )
