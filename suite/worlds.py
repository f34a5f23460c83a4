"""The worlds checks build, in one place: each check reads setup → act → judge.

A world is what a check needs before it can ask its question — a run with its first workflow task leased,
a run that scheduled activities and the worker that serves them, a run parked so it can be queried — on a
queue, with workflow and worker ids, of its own (``CheckContext.uid``), so checks stay independent and safe
under ``pytest -n``. The calls a worker makes inside such a world (fenced activity and query reports, polls
until a task is leased) are here too, and so are the commands, bodies and judgements several check modules
share, so no check module imports another's helpers. The fuzzer's live worlds (``suite.fuzz.live``) are these
worlds too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from suite.text import plural

from .client import Reply
from .context import CheckContext, fenced_body, lease_seconds
from .outcomes import CheckFailure, Indeterminate
from .protocol.errors import Violation
from .protocol.fencing import parse_rfc3339
from .protocol.lifecycles import RUN_LIVE_STATUSES
from .protocol.oracle import Accepted, Page, join_pages, judge_history, page_of

__all__ = [
    "ACTIVITY_TYPE",
    "ACT_LEASE",
    "DEFAULT_QUERY_TIMEOUT",
    "LIVE_RUN_STATUSES",
    "PAGINATION",
    "POLL_PATH",
    "QUERY_ARGS",
    "READY_WITHIN",
    "SCHEDULED",
    "SLACK",
    "STATE_FIELDS",
    "TASK_ATTEMPT",
    "TASK_ID",
    "TASK_KINDS",
    "WF_LEASE",
    "WORKFLOW_TASK_VERBS",
    "ActivityRun",
    "ContestedLease",
    "LeasedRun",
    "QueryRun",
    "activity_call",
    "activity_cmd",
    "advertised_lease",
    "attributed",
    "carrying",
    "complete_bodies",
    "complete_cmd",
    "contested_lease",
    "count_events",
    "event_types",
    "expect_run_cancelled",
    "expect_run_closed",
    "fenced_report",
    "instant",
    "int_or_none",
    "judge_task_history",
    "judged_by_oracle",
    "lease_activity",
    "lease_activity_at",
    "lease_length",
    "lease_query",
    "lease_task",
    "lease_wf",
    "lease_workflow_task",
    "leased_activity",
    "leased_run",
    "next_activity",
    "poll_activity",
    "poll_query",
    "polled_task",
    "query_call",
    "query_timeout",
    "race",
    "read_in_full",
    "refused_without_effect",
    "renew_lease",
    "require_fields",
    "require_no_task",
    "require_no_trace",
    "require_open",
    "require_run_open",
    "require_run_status",
    "require_same_state",
    "require_taken_over",
    "run_state",
    "same_json",
    "schedule_activities",
    "send_poll",
    "settle",
    "shortest_lease",
    "side_effect_cmd",
    "start_query",
    "started_with_activities",
    "still_within",
    "task_key",
    "task_of",
    "task_summary",
    "verb_body",
    "wait_out_lease",
    "waiting_run",
    "without_redeliveries",
]

ACTIVITY_TYPE = "conformance.act"
SCHEDULED = "ACTIVITY-SCHEDULED-LEASABLE"
# How long a ready task may take to show up on a poll: generous, because only a broken server waits it out.
READY_WITHIN = 10.0
# A lease a check waits out: the test_profile key that advertises it, what it is, the setting that shortens it.
WF_LEASE = ("workflow_task_lease_seconds", "the workflow-task lease", "workflow_task_lease_seconds")
ACT_LEASE = ("activity_task_lease_seconds", "the activity-task lease", "activity_task_lease_seconds")
QUERY_ARGS = ["conformance", 7]
# Added to every lease-derived deadline: scheduling jitter, a busy target, xdist neighbours.
SLACK = 10.0
# The four workflow-task verbs fenced by §8.9.
WORKFLOW_TASK_VERBS = ("heartbeat", "complete", "fail", "history")
LIVE_RUN_STATUSES = tuple(sorted(status.value for status in RUN_LIVE_STATUSES))
# A worker-plane body that needs no state: a poll by an unregistered worker. Whatever the version or auth check
# decides, nothing is created.
PROBE_BODY: dict[str, Any] = {
    "worker_id": "conformance-version-probe",
    "task_queue": "conformance-version-probe",
}
# The three kinds of task a worker polls for: the poll route, and the fields of a leased task that say which
# task and which attempt it is.
TASK_KINDS = ("workflow", "activity", "query")
POLL_PATH = {"workflow": "/workflow-tasks/poll", "activity": "/activity-tasks/poll", "query": "/query-tasks/poll"}
TASK_ID = {"workflow": "task_id", "activity": "task_id", "query": "query_task_id"}
TASK_ATTEMPT = {"workflow": "workflow_task_attempt", "activity": "attempt_number", "query": "query_task_attempt"}
# When the target does not advertise its query timeout: the documented default (§10.1, DW_QUERY_TASK_TIMEOUT).
DEFAULT_QUERY_TIMEOUT = 30.0

T = TypeVar("T")


# -- polling until a task is leased ------------------------------------------------------------------------


async def lease_task(
    ctx: CheckContext,
    kind: str,
    worker: str,
    queue: str,
    *,
    within: float = READY_WITHIN,
    timeout: int = 1,
    what: str | None = None,
    requirement: str | None = None,
    before: Callable[[], None] | None = None,
    **extra: Any,
) -> tuple[dict[str, Any], Reply]:
    """Poll ``kind`` ("workflow", "activity" or "query") tasks as ``worker`` on ``queue`` until one is leased:
    the task and the poll reply that leased it. ``extra`` fields go into every poll body; ``before`` runs before
    each poll (it raises to give up). A poll answered other than 200, or no task within ``within`` seconds, fails
    ``requirement`` (None: the check's first)."""

    async def probe() -> tuple[dict[str, Any], Reply] | None:
        if before is not None:
            before()
        reply = await ctx.poll(kind, worker, queue, timeout, **extra)
        task = ctx.expect(reply, 200, what=f"{kind}-task poll", requirement=requirement).get("task")
        return (task, reply) if isinstance(task, dict) else None

    waited = ctx.wait_until(probe, timeout=within, what=what or f"a {kind} task for {worker} on {queue}")
    return await (waited if requirement is None else attributed(waited, requirement))


async def lease_workflow_task(
    ctx: CheckContext, worker: str, queue: str, *, within: float = READY_WITHIN, timeout: int = 1, **extra: Any
) -> tuple[dict[str, Any], Reply]:
    """Poll until a workflow task is leased to ``worker``: the task and the poll's reply."""
    return await lease_task(ctx, "workflow", worker, queue, within=within, timeout=timeout, **extra)


async def lease_wf(
    ctx: CheckContext, worker: str, queue: str, *, within: float = READY_WITHIN, **extra: Any
) -> dict[str, Any]:
    """Poll until a workflow task is leased to ``worker``; the task object."""
    task, _reply = await lease_task(
        ctx, "workflow", worker, queue, within=within, what=f"a workflow task on {queue}", **extra
    )
    return task


async def send_poll(
    ctx: CheckContext,
    kind: str,
    worker: str | None,
    queue: str | None,
    timeout: int | None = 1,
    *,
    real: bool = False,
    **extra: Any,
) -> Reply:
    """One poll of ``kind``, as it is given: ``None`` leaves a field out of the body (``CheckContext.poll`` sends a
    whole one). With a test clock an empty poll's hold is ended by moving the clock (``ctx.held``); ``real``: a
    check that times the hold itself."""
    body: dict[str, Any] = {"worker_id": worker, "task_queue": queue, "timeout_seconds": timeout, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    hold = timeout if timeout is not None and timeout > 0 else 1
    request = ctx.client.worker(POLL_PATH[kind], body, timeout=min(hold, 60) + 20)
    default = ctx.target.test_profile.get("long_poll_default_seconds")
    if timeout is None:
        hold = int(default) if isinstance(default, int) and not isinstance(default, bool) else 30
    return await (request if real else ctx.held(request, ctx.poll_hold(hold)))


def task_of(reply: Reply) -> dict[str, Any] | None:
    """The task a poll's answer leased, or None."""
    task = reply.json().get("task")
    return task if isinstance(task, dict) else None


def polled_task(ctx: CheckContext, reply: Reply, what: str, requirement: str | None = None) -> dict[str, Any] | None:
    """The task of a poll that must be 200 (``None`` when nothing was leased)."""
    ctx.expect(reply, 200, what=what, requirement=requirement)
    return task_of(reply)


def task_key(task: dict[str, Any], kind: str = "workflow") -> tuple[Any, Any]:
    """Which task and which attempt a lease is."""
    return task.get(TASK_ID[kind]), task.get(TASK_ATTEMPT[kind])


async def race(coros: Iterable[Awaitable[T]]) -> list[T]:
    """Run the requests concurrently, released together behind a barrier."""
    pending = list(coros)
    barrier = asyncio.Barrier(len(pending))

    async def go(coro: Awaitable[T]) -> T:
        await barrier.wait()
        return await coro

    return list(await asyncio.gather(*(go(c) for c in pending)))


def advertised_lease(ctx: CheckContext) -> float | None:
    """The workflow-task lease the target advertises (test_profile.workflow_task_lease_seconds), or None."""
    return lease_seconds(ctx.target.test_profile, "workflow-tasks")


def still_within(ctx: CheckContext, since: datetime, seconds: float, what: str) -> None:
    """Timing evidence for a judgement: the server's clock cannot have moved more than ``ctx.now()`` (the local
    clock, plus every test-clock advance) since ``since`` (taken before the request that started the clock).
    When that bound reaches ``seconds`` the lease or timeout in question may have lapsed on its own — delays
    (a loaded machine, a distant target), not the target, decide the answer, so the check cannot judge and runs
    again in a fresh world."""
    if (ctx.now() - since).total_seconds() >= seconds:
        raise Indeterminate(f"{what} may have lapsed on its own: {seconds:g}s passed before the probe answered")


def shortest_lease(ctx: CheckContext) -> float:
    """The shorter of the workflow-task and activity-task leases the target advertises (300 s when it
    advertises neither, the protocol's default)."""
    leases = [lease_seconds(ctx.target.test_profile, kind) for kind in ("workflow-tasks", "activity-tasks")]
    return min((v for v in leases if v is not None), default=300.0)


# -- a lease two workers contend for -----------------------------------------------------------------------


@dataclass
class ContestedLease:
    """A run's first workflow task leased to ``holder``, with a second worker, ``rival``, on the same queue."""

    queue: str
    holder: str
    rival: str
    workflow_id: str
    run_id: str
    task: dict[str, Any]
    reply: Reply

    def lease(self, ctx: CheckContext) -> float:
        """The lease's length in seconds; the check is not covered when it is longer than ``--max-wait``."""
        return lease_length(ctx, self.task, self.reply, WF_LEASE)


async def contested_lease(ctx: CheckContext) -> ContestedLease:
    """Register two workers on a fresh queue, start a run there and lease its first task to the first."""
    queue = ctx.uid("q")
    holder = await ctx.register(queue)
    rival = await ctx.register(queue)
    wid, rid = await ctx.start(queue)
    task, reply = await lease_workflow_task(ctx, holder, queue)
    return ContestedLease(queue, holder, rival, wid, rid, task, reply)


def require_taken_over(
    ctx: CheckContext,
    before: dict[str, Any],
    after: dict[str, Any],
    owner: str | None,
    message: str,
    requirement: str | None = None,
) -> None:
    """``after`` is ``before``'s workflow task leased again: the same task_id with the next attempt (to ``owner``,
    unless it is None)."""
    want: dict[str, Any] = {
        "task_id": before["task_id"],
        "workflow_task_attempt": int(before.get("workflow_task_attempt") or 0) + 1,
    }
    if owner is not None:
        want["lease_owner"] = owner
    ctx.require_equal({k: after.get(k) for k in want}, want, message, requirement=requirement)


async def fenced_report(
    ctx: CheckContext, task: dict[str, Any], verb: str, body: dict[str, Any], *, what: str, requirement: str
) -> Reply:
    """``verb`` with ``task``'s lease after the task was leased again: 409 by owner or by attempt (§8.9)."""
    reply = await ctx.wf_call(task, verb, body)
    ctx.expect(
        reply, 409, ("lease_owner_mismatch", "workflow_task_attempt_mismatch"), what=what, requirement=requirement
    )
    return reply


def require_no_trace(
    ctx: CheckContext, events: list[dict[str, Any]], marker: str, message: str, requirement: str
) -> None:
    """No event of ``events`` mentions ``marker``, which only rejected reports carried."""
    ctx.require(
        marker not in json.dumps(events),
        message,
        expected=f"no event mentioning {marker}",
        received=event_types(events),
        requirement=requirement,
    )


# -- a run with its first workflow task leased -------------------------------------------------------------


@dataclass
class LeasedRun:
    """One workflow run of a check's own queue, with the workflow task currently leased to ``worker``."""

    queue: str
    worker: str
    workflow_id: str
    run_id: str
    task: dict[str, Any]


async def leased_run(ctx: CheckContext, **start: Any) -> LeasedRun:
    """Register a worker on a fresh queue, start a run there (``start`` fields), lease its first task."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, rid = await ctx.start(queue, **start)
    task = await lease_wf(ctx, worker, queue)
    return LeasedRun(queue, worker, wid, rid, task)


async def leased_activity(ctx: CheckContext, run: LeasedRun, **command: Any) -> dict[str, Any]:
    """Complete the run's leased task with one ``schedule_activity`` (``command`` fields over a plain one on
    the run's queue) and return the activity task the run's worker then leases."""
    schedule = {"type": "schedule_activity", "activity_type": ACTIVITY_TYPE, "arguments": ctx.envelope([]), **command}
    ctx.expect(await ctx.complete(run.task, [schedule]), 200, what="schedule_activity")
    task, _reply = await next_activity(ctx, run.worker, run.queue)
    return task


async def next_activity(
    ctx: CheckContext, worker: str, queue: str, *, within: float = READY_WITHIN
) -> tuple[dict[str, Any], Reply]:
    """Poll activity tasks as ``worker`` until one is leased: the task and the poll reply that leased it."""
    return await lease_task(ctx, "activity", worker, queue, within=within)


def instant(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the target's, or None when it is missing or malformed."""
    try:
        return parse_rfc3339(value)
    except (TypeError, ValueError):
        return None


def lease_length(ctx: CheckContext, task: dict[str, Any], reply: Reply, kind: tuple[str, str, str]) -> float:
    """The advertised lease, else ``lease_expires_at`` minus the reply's Date; not covered if too long."""
    key, what, setting = kind
    advertised = ctx.target.test_profile.get(key)
    seconds: float | None = None
    if isinstance(advertised, int | float) and not isinstance(advertised, bool) and advertised > 0:
        seconds = float(advertised)
    else:
        expires, now = instant(task.get("lease_expires_at")), reply.server_date
        if expires is not None and now is not None:
            seconds = max(0.0, (expires - now).total_seconds())
    return ctx.needs_short(seconds, what, setting)


async def wait_out_lease(
    ctx: CheckContext,
    leased: dict[str, Any],
    reply: Reply,
    kind: tuple[str, str, str],
    *,
    what: str,
    requirement: str | None = None,
) -> float:
    """Wait until the target's clock is past the ``lease_expires_at`` of ``leased`` (a poll's task or a
    heartbeat's answer, ``reply`` the answer that carried it); returns the lease's length. Not covered when the
    lease is longer than the run may wait; a missing or malformed instant fails ``requirement``."""
    lease = lease_length(ctx, leased, reply, kind)
    expires = instant(leased.get("lease_expires_at"))
    if expires is None:
        raise ctx.fail(
            f"{what} carries lease_expires_at (RFC 3339)",
            expected="a timestamp",
            received=leased.get("lease_expires_at"),
            replies=[reply],
            requirement=requirement,
        )
    await ctx.wait_past(expires, within=lease + READY_WITHIN, what="the server clock to pass lease_expires_at")
    return lease


# -- a run that scheduled activities -----------------------------------------------------------------------


@dataclass
class ActivityRun:
    """A run whose first workflow task scheduled activities on ``queue``, served by ``worker``."""

    queue: str
    worker: str
    workflow_id: str
    run_id: str
    arguments: dict[str, str]
    completion: dict[str, Any]


async def schedule_activities(
    ctx: CheckContext,
    *,
    count: int = 1,
    retry_policy: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    arguments: dict[str, str] | None = None,
    requirement: str = SCHEDULED,
) -> ActivityRun:
    """Start a run, lease its first workflow task and complete it with ``count`` ``schedule_activity``."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    workflow_id, run_id = await ctx.start(queue)
    task = await attributed(lease_wf(ctx, worker, queue), requirement)
    args = arguments if arguments is not None else ctx.envelope([1, "x"])
    command: dict[str, Any] = {
        "type": "schedule_activity",
        "activity_type": ACTIVITY_TYPE,
        "queue": queue,
        "arguments": args,
    }
    if retry_policy is not None:
        command["retry_policy"] = retry_policy
    command.update(options or {})
    reply = await ctx.complete(task, [dict(command) for _ in range(count)])
    body = ctx.expect(reply, 200, what="a workflow-task complete scheduling activities", requirement=requirement)
    return ActivityRun(queue, worker, workflow_id, run_id, args, body)


async def attributed(awaitable: Awaitable[T], requirement: str) -> T:
    """Await ``awaitable``; a failure that names no requirement is attributed to ``requirement``."""
    try:
        return await awaitable
    except CheckFailure as failure:
        if failure.requirement is None:
            failure.requirement = requirement
        raise


async def poll_activity(ctx: CheckContext, worker: str, queue: str, timeout: int = 1, **extra: Any) -> Reply:
    return await ctx.poll("activity", worker, queue, timeout, **extra)


def require_no_task(ctx: CheckContext, reply: Reply, *, what: str, requirement: str, why: str) -> None:
    """``reply``, a poll (``what``), is 200 with no task, or the check fails ``requirement`` saying ``why``."""
    task = ctx.expect(reply, 200, what=what, requirement=requirement).get("task")
    ctx.require(
        task is None,
        why,
        expected="task: null",
        received=task_summary(task),
        replies=[reply],
        requirement=requirement,
    )


def task_summary(task: Any) -> str:
    """The ids of a leased task, as a failure shows what it received."""
    if not isinstance(task, dict):
        return repr(task)
    keys = ("task_id", "run_id", "activity_execution_id", "attempt_number", "workflow_task_attempt")
    return "a task " + ", ".join(f"{k}={task[k]}" for k in keys if k in task)


async def lease_activity_at(
    ctx: CheckContext,
    run: ActivityRun,
    *,
    within: float = READY_WITHIN,
    requirement: str = SCHEDULED,
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], datetime]:
    """Poll until an activity task is leased; return it and when its lease arrived (on ``ctx.now()``: the
    target's clock). ``extra`` fields go into every poll body."""
    what = f"an activity task on {run.queue}"
    task, _reply = await lease_task(
        ctx, "activity", run.worker, run.queue, within=within, what=what, requirement=requirement, **(extra or {})
    )
    return task, ctx.now()


async def lease_activity(ctx: CheckContext, run: ActivityRun, **options: Any) -> dict[str, Any]:
    """:func:`lease_activity_at` without the time."""
    task, _ = await lease_activity_at(ctx, run, **options)
    return task


async def activity_call(
    ctx: CheckContext,
    task: dict[str, Any],
    verb: str,
    body: dict[str, Any] | None = None,
    *,
    owner: str | None = None,
    attempt_id: str | None = None,
    task_id: str | None = None,
    namespace: str | None = None,
) -> Reply:
    """``POST /activity-tasks/{task_id}/{verb}`` fenced with the lease's attempt id and owner (§11.2)."""
    payload = fenced_body(task, body, activity_attempt_id=attempt_id, lease_owner=owner)
    path = f"/activity-tasks/{task_id or task['task_id']}/{verb}"
    return await ctx.client.worker(path, payload, namespace=namespace)


# -- a run parked on a timer, to be queried ----------------------------------------------------------------


@dataclass
class QueryRun:
    queue: str
    worker: str
    workflow_id: str
    run_id: str


def query_timeout(ctx: CheckContext) -> tuple[float, bool]:
    """The target's query timeout and whether it is advertised (test_profile.query_task_timeout_seconds)."""
    value = ctx.target.test_profile.get("query_task_timeout_seconds")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value), True
    return DEFAULT_QUERY_TIMEOUT, False


async def waiting_run(ctx: CheckContext, *, register: bool = True) -> QueryRun:
    """A run parked on a long timer (no open workflow task), on a queue served by one registered worker."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue) if register else ctx.uid("w")
    workflow_id, run_id = await ctx.start(queue, input=["query-me"])
    if register:
        task = await lease_wf(ctx, worker, queue)
        ctx.expect(
            await ctx.complete(task, [{"type": "start_timer", "delay_seconds": 3600}]),
            200,
            what="workflow-task complete parking the run on a timer",
        )
    return QueryRun(queue, worker, workflow_id, run_id)


def start_query(ctx: CheckContext, run: QueryRun, name: str) -> asyncio.Task[Reply]:
    """The blocking control-plane query, running concurrently with the worker side of the check."""
    timeout, _ = query_timeout(ctx)
    return asyncio.create_task(
        ctx.client.control(
            "POST", f"/workflows/{run.workflow_id}/query/{name}", {"input": QUERY_ARGS}, timeout=timeout + 15
        )
    )


async def settle(call: asyncio.Task[Reply]) -> None:
    """Cancel a query call the check no longer waits for."""
    if not call.done():
        call.cancel()
    with contextlib.suppress(BaseException):
        await call


def require_open(ctx: CheckContext, call: asyncio.Task[Reply], requirement: str | None = None) -> None:
    """Fail when the control-plane query ``call`` ended before a worker leased its query task."""
    if call.done():
        ended = call.result()
        raise ctx.fail(
            "the control-plane query ended before a worker leased its query task",
            expected="a query task waiting for a worker",
            received=f"{ended.status} {ended.reason}",
            replies=[ended],
            requirement=requirement,
        )


async def poll_query(ctx: CheckContext, run: QueryRun) -> Reply:
    """A one-second query-task poll as the run's worker (with a test clock, an empty one ends at once)."""
    return await ctx.poll("query", run.worker, run.queue)


async def lease_query(
    ctx: CheckContext, run: QueryRun, call: asyncio.Task[Reply], *, requirement: str
) -> dict[str, Any]:
    """Poll query tasks as the run's worker until one is leased (or the control-plane call gave up)."""
    task, _reply = await lease_task(
        ctx,
        "query",
        run.worker,
        run.queue,
        what=f"a query task on {run.queue}",
        requirement=requirement,
        before=lambda: require_open(ctx, call, requirement),
    )
    return task


async def query_call(
    ctx: CheckContext,
    task: dict[str, Any],
    verb: str,
    body: dict[str, Any],
    *,
    owner: str | None = None,
    attempt: int | None = None,
) -> Reply:
    """``POST /query-tasks/{query_task_id}/{verb}`` fenced with the lease's owner and attempt (§10.6)."""
    payload = fenced_body(task, body, lease_owner=owner, query_task_attempt=attempt)
    return await ctx.client.worker(f"/query-tasks/{task['query_task_id']}/{verb}", payload)


# -- commands, bodies and judgements several check modules share ---------------------------------------


def complete_cmd(value: Any = "done") -> dict[str, Any]:
    return {"type": "complete_workflow", "result": CheckContext.envelope(value)}


def activity_cmd(activity_type: str, **extra: Any) -> dict[str, Any]:
    return {"type": "schedule_activity", "activity_type": activity_type, **extra}


def verb_body(verb: str, commands: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if verb == "complete":
        return {"commands": commands if commands is not None else [complete_cmd()]}
    if verb == "fail":
        return {"failure": {"message": "conformance probe: task failure"}}
    return {}


async def started_with_activities(
    ctx: CheckContext, worker: str, queue: str, activity_types: list[str], **start: Any
) -> tuple[str, str, dict[str, Any]]:
    """Start a run, lease its first workflow task and complete it scheduling one activity per type."""
    wid, run_id = await ctx.start(queue, **start)
    task, reply = await lease_workflow_task(ctx, worker, queue)
    ctx.require_equal(
        task.get("run_id"), run_id, "the only ready task on a fresh queue is the new run's", replies=[reply]
    )
    reply = await ctx.complete(task, [activity_cmd(t) for t in activity_types])
    ctx.expect(reply, 200, what="complete scheduling activities")
    return wid, run_id, task


def same_json(got: Any, want: Any) -> bool:
    """Equal and of the same JSON type (``1`` is not ``true``, ``1.0`` not ``1``)."""
    return type(got) is type(want) and got == want


def carrying(obj: Any, want: dict[str, Any]) -> dict[str, Any] | None:
    """The first object in ``obj`` (itself, or nested at any depth) that holds every field of ``want`` with that value
    and JSON type: where a failure's fields sit in an event or an answer is the server's choice."""
    if isinstance(obj, dict):
        if all(k in obj and same_json(obj[k], v) for k, v in want.items()):
            return obj
        obj = list(obj.values())
    if isinstance(obj, list):
        return next((found for item in obj if (found := carrying(item, want)) is not None), None)
    return None


def require_fields(
    ctx: CheckContext,
    reply: Reply,
    body: dict[str, Any],
    want: dict[str, Any],
    message: str,
    requirement: str | None = None,
) -> None:
    """Fail unless every field of ``want`` stands in ``body`` with that value and JSON type (``"<absent>"``: the
    field must be missing)."""
    got = {k: body.get(k, "<absent>") for k in want}
    ctx.require(
        all(same_json(got[k], v) for k, v in want.items()),
        message,
        expected=want,
        received=got,
        replies=[reply],
        requirement=requirement,
    )


def expect_run_closed(
    ctx: CheckContext,
    reply: Reply,
    *,
    stop_reason: str,
    cancel_requested: bool,
    run_status: str,
    requirement: str,
    what: str,
) -> dict[str, Any]:
    """409 run_closed with the §8.9 row 2 body: exact flags, stop_reason, run_status, no outcome, a
    run_closed_at."""
    body = ctx.expect(reply, 409, "run_closed", what=what, requirement=requirement)
    want: dict[str, Any] = {
        "can_continue": False,
        "cancel_requested": cancel_requested,
        "stop_reason": stop_reason,
        "run_status": run_status,
        "outcome": "<absent>",  # a rejection, not a report's outcome
    }
    require_fields(
        ctx,
        reply,
        body,
        want,
        f"{what}: the run_closed body says why the run stopped, with no outcome key (docs/reference.md: Fencing)",
        requirement,
    )
    ctx.require(
        instant(body.get("run_closed_at")) is not None,
        f"{what}: run_closed carries the RFC 3339 instant the run closed in run_closed_at",
        expected="an RFC 3339 timestamp",
        received=body.get("run_closed_at", "<absent>"),
        replies=[reply],
        requirement=requirement,
    )
    return body


def expect_run_cancelled(ctx: CheckContext, reply: Reply, *, what: str, requirement: str) -> dict[str, Any]:
    """409 run_closed for a run cancelled from the control plane (:func:`expect_run_closed`)."""
    return expect_run_closed(
        ctx,
        reply,
        stop_reason="run_cancelled",
        cancel_requested=True,
        run_status="cancelled",
        requirement=requirement,
        what=what,
    )


async def require_run_status(
    ctx: CheckContext, workflow_id: str, status: str, message: str, requirement: str | None = None
) -> dict[str, Any]:
    """The run's describe, whose status must be ``status``."""
    described = await ctx.describe(workflow_id)
    ctx.require_equal(described.get("status"), status, message, requirement=requirement)
    return described


async def require_run_open(
    ctx: CheckContext, workflow_id: str, message: str, requirement: str | None = None
) -> dict[str, Any]:
    """The run's describe, whose status must be a live one (the run is not closed)."""
    described = await ctx.describe(workflow_id)
    ctx.require(
        described.get("status") in LIVE_RUN_STATUSES,
        message,
        expected=f"one of {LIVE_RUN_STATUSES}",
        received=described.get("status"),
        requirement=requirement,
    )
    return described


async def renew_lease(ctx: CheckContext, task: dict[str, Any], what: str, requirement: str) -> None:
    """The owner's heartbeat: proves the lease is intact and keeps a short test lease alive under load."""
    reply = await ctx.wf_call(task, "heartbeat")
    ctx.expect(reply, 200, what=f"the owner's heartbeat {what}", requirement=requirement)


def count_events(events: list[dict[str, Any]], event_type: str) -> int:
    return sum(1 for e in events if e.get("event_type") == event_type)


def event_types(events: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("event_type")) for e in events]


def without_redeliveries(ctx: CheckContext, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leases of ``tasks`` less those granted after an earlier lease of the same task had expired.

    A poll resent after a lost answer (under --faults) can reach the server seconds after its race began and
    get the task again once the first lease expired: a redelivery, not a second live lease. A lease of a
    later attempt counts as a redelivery only when it was granted (its lease_expires_at less the advertised
    lease) no earlier than the earlier lease's expiry, so two leases live at once are never hidden.
    """
    lease = advertised_lease(ctx)
    if lease is None:
        return tasks
    kept: list[dict[str, Any]] = []
    for task in sorted(tasks, key=lambda t: str(t.get("lease_expires_at"))):
        try:
            granted = parse_rfc3339(task.get("lease_expires_at")) - timedelta(seconds=lease)
            same = [k for k in kept if k.get("task_id") == task.get("task_id")]
            earlier = [parse_rfc3339(k.get("lease_expires_at")) for k in same]
        except (TypeError, ValueError):
            kept.append(task)
            continue
        if earlier and all(granted >= expiry for expiry in earlier):
            continue
        kept.append(task)
    return kept


# -- a rejected request changes nothing ---------------------------------------------------------------------


# Describe fields a rejected batch must leave alone (§12.3); a missing field reads as None both times.
STATE_FIELDS = (
    "run_id",
    "status",
    "is_terminal",
    "closed_reason",
    "closed_at",
    "output_envelope",
    "run_number",
    "run_count",
    "search_attributes",
)


async def run_state(ctx: CheckContext, run: LeasedRun) -> dict[str, Any]:
    """What a rejected request must not change: the describe fields and the run's event list."""
    desc = await ctx.describe(run.workflow_id)
    events = await ctx.history(run.workflow_id, run.run_id)
    return {
        "describe": {k: desc.get(k) for k in STATE_FIELDS},
        "history": [(e.get("sequence"), e.get("event_type")) for e in events],
    }


def require_same_state(
    ctx: CheckContext,
    before: dict[str, Any],
    after: dict[str, Any],
    what: str,
    replies: list[Reply],
    requirement: str,
) -> None:
    """Fail ``requirement`` unless the run's state ``after`` a rejected ``what`` is its state ``before``."""
    added = after["history"][len(before["history"]) :]
    ctx.require(
        after["history"] == before["history"],
        f"{what} was rejected, so nothing of it may be applied: history changed",
        expected=f"the same {plural(len(before['history']), 'event')}",
        received=f"new or changed events {added}",
        replies=replies,
        requirement=requirement,
    )
    changed = {
        k: (before["describe"][k], after["describe"][k])
        for k in STATE_FIELDS
        if before["describe"][k] != after["describe"][k]
    }
    ctx.require(
        not changed,
        f"{what} was rejected, so the run must be unchanged: describe changed",
        expected="the same describe",
        received=f"(before, after) = {changed}",
        replies=replies,
        requirement=requirement,
    )


async def refused_without_effect(
    ctx: CheckContext,
    run: LeasedRun,
    bodies: Iterable[tuple[str, dict[str, Any]]],
    judge: Callable[[Reply, str], None],
    what: str,
    requirement: str,
) -> None:
    """Complete the run's leased task with each body; ``judge`` each refusal; then the run must be as before."""
    before = await run_state(ctx, run)
    replies = []
    for label, body in bodies:
        reply = await ctx.wf_call(run.task, "complete", body)
        judge(reply, label)
        replies.append(reply)
    require_same_state(ctx, before, await run_state(ctx, run), what, replies, requirement)


def complete_bodies(cases: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, dict[str, Any]]]:
    """Labelled command lists as workflow-task complete bodies."""
    return [(label, {"commands": commands}) for label, commands in cases]


def side_effect_cmd(value: Any) -> dict[str, Any]:
    return {"type": "record_side_effect", "result": CheckContext.envelope(value)}


# -- a history read back in full and judged by the oracle -------------------------------------------------


PAGINATION = "HISTORY-PAGINATION-COMPLETE"


@contextmanager
def judged_by_oracle(ctx: CheckContext, replies: Iterable[Reply] = ()) -> Iterator[None]:
    """The oracle's :class:`Violation` as this check's failure, with the requirement the oracle names."""
    try:
        yield
    except Violation as v:
        raise ctx.fail(
            v.message, expected=v.expected, received=v.received, replies=list(replies), requirement=v.requirement
        ) from None


async def read_in_full(
    ctx: CheckContext, task: Mapping[str, Any], *, inline: int | None, page_size: int, token: bool = False
) -> tuple[list[dict[str, Any]], list[Reply]]:
    """Every event of a leased task's worker-plane history: its inline page (asked with ``history_page_size``
    ``inline``), then each page its cursor names, ``page_size`` at a time, by ``after_sequence`` or, with
    ``token``, by ``next_history_page_token``. Returns the events and the history replies."""
    replies: list[Reply] = []
    with judged_by_oracle(ctx, replies):
        pages: list[Page] = [page_of(task, after=0, page_size=inline)]
        limit = int(task.get("last_history_sequence") or 0) + 2
        while pages[-1].has_more:
            if len(pages) > limit:
                raise ctx.fail(
                    f"the history cursor did not end after {limit} pages",
                    expected=f"at most {limit} pages",
                    replies=replies[-2:],
                    requirement=PAGINATION,
                )
            last = pages[-1]
            cursor: dict[str, Any] = {"after_sequence": last.next_after}
            if token and last.token:
                cursor = {"next_history_page_token": last.token}
            reply = await ctx.wf_call(dict(task), "history", {**cursor, "page_size": page_size})
            replies.append(reply)
            body = ctx.expect(reply, 200, what=f"history page after sequence {last.next_after}", requirement=PAGINATION)
            pages.append(page_of(body, after=int(last.next_after or 0), page_size=page_size))
        return join_pages(pages), replies


async def judge_task_history(
    ctx: CheckContext, task: Mapping[str, Any], accepted: list[Accepted], *, inline: int | None, page_size: int
) -> None:
    """Read ``task``'s history in full both ways — by ``after_sequence`` and by the token — and judge each
    against what the run acknowledged before the task's poll left."""
    for token in (False, True):
        events, replies = await read_in_full(ctx, task, inline=inline, page_size=page_size, token=token)
        with judged_by_oracle(ctx, replies):
            judge_history(events, accepted, last_sequence=int_or_none(task.get("last_history_sequence")))


def int_or_none(value: Any) -> int | None:
    """A JSON integer (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
