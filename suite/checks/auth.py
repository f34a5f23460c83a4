"""Authentication, roles and namespace scoping (§4): auth is checked before the version, roles keep
each plane to its own token, a full-access token serves both, and a task id used under another namespace is
not found and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.outcomes import NotCovered, Unimplemented
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    PROBE_BODY,
    WORKFLOW_TASK_VERBS,
    activity_call,
    activity_cmd,
    count_events,
    event_types,
    lease_task,
    lease_workflow_task,
    next_activity,
    renew_lease,
    require_open,
    settle,
    verb_body,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.AUTH,)


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
    task, _ = await lease_workflow_task(ctx, worker, queue)
    await _foreign_workflow_calls(ctx, task, worker, other)
    act_type = ctx.uid("act")
    ctx.expect(
        await ctx.complete(task, [activity_cmd(act_type)]),
        200,
        what="the owner's complete in its own namespace after the foreign calls",
    )
    act, _ = await next_activity(ctx, worker, queue)
    await _foreign_activity_calls(ctx, act, other)
    answer = await _foreign_query_calls(ctx, wid, worker, queue, other)
    ctx.expect(answer, 200, what="the control-plane query")
    events = await ctx.history(wid, run_id)
    ctx.require(
        "foreign" not in json.dumps(answer.json()) and count_events(events, "ActivityFailed") == 0,
        "calls under another namespace had no effect",
        expected="the home namespace's answers only",
        received={"query": answer.json().get("result"), "events": event_types(events)},
        replies=[answer],
    )


async def _foreign_workflow_calls(ctx: CheckContext, task: dict[str, Any], worker: str, other: str) -> None:
    """Every workflow-task verb under ``other`` is 404; the lease still renews at home after each."""
    not_found = ("task_not_found", "namespace_not_found")
    for verb in WORKFLOW_TASK_VERBS:
        payload = {
            "lease_owner": worker,
            "workflow_task_attempt": task.get("workflow_task_attempt"),
            **verb_body(verb),
        }
        reply = await ctx.client.worker(f"/workflow-tasks/{task['task_id']}/{verb}", payload, namespace=other)
        ctx.expect(
            reply,
            404,
            not_found,
            what=f"workflow-task {verb} under X-Namespace {other}",
            requirement="NAMESPACE-SCOPED",
        )
        await renew_lease(ctx, task, f"at home after the foreign {verb}", "NAMESPACE-SCOPED")


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

        def still_waiting() -> None:
            require_open(ctx, query)

        qtask, _ = await lease_task(
            ctx, "query", worker, queue, within=timeout, what="a query task", before=still_waiting
        )
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
        await settle(query)
    return answer


@check("VERSION-BEFORE-NAMESPACE", "NAMESPACE-NOT-FOUND")
async def check_order_version_then_namespace(ctx: CheckContext) -> None:
    """No version header + unknown namespace is 400; a good header + unknown namespace is 404 namespace_not_found."""
    ns = ctx.uid("no-such-namespace")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None, namespace=ns)
    ctx.expect(reply, 400, "missing_protocol_version", requirement="VERSION-BEFORE-NAMESPACE")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, namespace=ns)
    ctx.expect(reply, 404, "namespace_not_found", requirement="NAMESPACE-NOT-FOUND")


def _auth(ctx: CheckContext) -> None:
    if not ctx.target.auth_enabled:  # the run's tokens were probed first: the target itself has auth off
        raise NotCovered(
            "the target has auth off: it accepts requests without a token",
            "auth turned on in the server's configuration (reference server: --worker-token and --operator-token)",
        )


@check("AUTH-BEFORE-VERSION", "AUTH-MISSING-TOKEN", "AUTH-BAD-TOKEN")
async def auth_checked_first(ctx: CheckContext) -> None:
    """No token or a bad token is 401 unauthorized, before the version check, in the worker envelope."""
    _auth(ctx)
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, token=None)
    ctx.expect(reply, 401, "unauthorized", requirement="AUTH-MISSING-TOKEN")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, token="not-a-valid-token")
    ctx.expect(reply, 401, "unauthorized", requirement="AUTH-BAD-TOKEN")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, token="not-a-valid-token", version=None)
    ctx.expect(reply, 401, "unauthorized", requirement="AUTH-BEFORE-VERSION")


@check("AUTH-ROLE-FORBIDDEN")
async def auth_operator_on_worker_route(ctx: CheckContext) -> None:
    """An operator token on a worker route is 403 forbidden."""
    _auth(ctx)
    if not ctx.target.operator_token or ctx.target.operator_token == ctx.target.worker_token:
        raise NotCovered("needs distinct worker and operator tokens", "--operator-token different from --worker-token")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, token=ctx.target.operator_token)
    ctx.expect(reply, 403, "forbidden")


@check("AUTH-FULL-ACCESS-TOKEN")
async def auth_full_access_token(ctx: CheckContext) -> None:
    """A declared full-access token (--auth-token) is accepted on the control plane, and on the worker plane when
    it is the run's only token; beside role tokens the worker plane may keep it off (403, upstream's rule), never
    refuse it as unknown. A server without one is not judged: the token is a server's option."""
    full = ctx.target.full_token
    if not full:
        raise Unimplemented(
            "full-access token",
            "the target declares no full-access token (--auth-token not given): a server's option, not judged",
        )
    _auth(ctx)
    alone = full == ctx.target.worker_token == ctx.target.operator_token
    reply = await ctx.client.control("GET", f"/workflows/{ctx.uid('absent')}", token=full)
    ctx.expect(reply, 404, what="a control-plane call with the full-access token")
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, token=full)
    allowed = "not 401/403" if alone else "not 401 (403 allowed: admin-only beside role tokens)"
    ctx.require(
        reply.status != 401 and (reply.status != 403 or not alone),
        "the full-access token is accepted on the worker plane"
        + ("" if alone else ", or kept off it as admin-only (403)"),
        expected=allowed,
        received=f"{reply.status} {reply.body.get('reason') if isinstance(reply.body, dict) else ''}",
        replies=[reply],
    )
