"""Worker sessions (docs/reference.md: Worker sessions; the runtime schema; requirements ``SESSION-*``).

Every check runs only against a target that advertises ``worker_sessions`` (otherwise: unimplemented). Each
builds its own world: session ids, queues and workers from ``ctx.uid``. Sessions expire on their own
``lease_seconds`` (an option of the session, not a server setting), so the expiry checks wait a second or two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.outcomes import NotCovered
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import ACTIVITY_TYPE, lease_task, lease_wf, poll_activity, still_within

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.SESSIONS,)

__all__: list[str] = []

CAP = "worker_sessions"


async def session_call(ctx: CheckContext, method: str, path: str, body: dict[str, Any]) -> Reply:
    return await ctx.client.worker("/sessions" + path, body, method=method)


async def create(ctx: CheckContext, worker: str, session_id: str, **options: Any) -> Reply:
    return await session_call(ctx, "POST", "", {"worker_id": worker, "session_id": session_id, **options})


async def heartbeat(ctx: CheckContext, worker: str, session_id: str, **body: Any) -> Reply:
    return await session_call(ctx, "POST", f"/{session_id}/heartbeat", {"worker_id": worker, **body})


async def close(ctx: CheckContext, worker: str, session_id: str) -> Reply:
    return await session_call(ctx, "DELETE", f"/{session_id}", {"worker_id": worker, "reason": "worker_shutdown"})


SessionCall = Callable[[CheckContext, str, str], Awaitable[Reply]]


def status_of(body: dict[str, Any]) -> Any:
    session = body.get("session")
    return session.get("status") if isinstance(session, dict) else None


async def workers(ctx: CheckContext, *capabilities: list[str]) -> tuple[str, list[str]]:
    """A fresh activity queue and one registered worker per capability list."""
    queue = ctx.uid("sq")
    ids = [await ctx.register(queue, capabilities=list(caps)) for caps in capabilities]
    return queue, ids


async def schedule_in_session(ctx: CheckContext, queue: str, *sessions: dict[str, Any]) -> tuple[str, str]:
    """Start a run and complete its first task with one in-session ``schedule_activity`` per ``sessions``."""
    wf_queue = ctx.uid("q")
    wf_worker = await ctx.register(wf_queue)
    workflow_id, run_id = await ctx.start(wf_queue)
    task = await lease_wf(ctx, wf_worker, wf_queue)
    commands = [
        {
            "type": "schedule_activity",
            "activity_type": ACTIVITY_TYPE,
            "queue": queue,
            "arguments": ctx.envelope(["x"]),
            "worker_session": dict(s),
        }
        for s in sessions
    ]
    ctx.expect(await ctx.complete(task, commands), 200, what="complete with in-session schedule_activity")
    return workflow_id, run_id


async def leased(ctx: CheckContext, worker: str, queue: str) -> dict[str, Any] | None:
    body = ctx.expect(await poll_activity(ctx, worker, queue), 200, what="activity poll")
    task = body.get("task")
    return task if isinstance(task, dict) else None


async def lease_within(ctx: CheckContext, worker: str, queue: str, requirement: str) -> dict[str, Any]:
    what = f"an in-session activity task for {worker}"
    task, _reply = await lease_task(ctx, "activity", worker, queue, what=what, requirement=requirement)
    return task


def attempt_lease(ctx: CheckContext) -> float:
    value = ctx.target.test_profile.get("activity_task_lease_seconds")
    return float(value) if isinstance(value, (int, float)) else 300.0


@check("SESSION-ADVERTISED", capability=CAP)
async def sessions_advertised_everywhere(ctx: CheckContext) -> None:
    """worker_session_verbs and worker_sessions come in cluster/info and in a session route's own envelope."""
    caps = ctx.target.server_capabilities
    ctx.require(
        set(caps.get("worker_session_verbs") or []) >= {"create", "heartbeat", "close"},
        "worker_session_verbs names create, heartbeat and close",
        expected=["create", "heartbeat", "close"],
        received=caps.get("worker_session_verbs"),
    )
    _queue, [worker] = await workers(ctx, [])
    reply = await create(ctx, worker, ctx.uid("s"))
    body = ctx.expect(reply, (200, 201), what="explicit session create")
    envelope_caps = body.get("server_capabilities") or {}
    ctx.require(
        isinstance(envelope_caps, dict) and envelope_caps.get("worker_sessions") == caps.get("worker_sessions"),
        "the worker envelope carries the same worker_sessions contract as cluster/info",
        expected=caps.get("worker_sessions"),
        received=envelope_caps.get("worker_sessions") if isinstance(envelope_caps, dict) else envelope_caps,
        replies=[reply],
    )


@check("SESSION-EXPLICIT-LIFECYCLE", "SESSION-CLOSE-TERMINAL", capability=CAP)
async def session_create_heartbeat_close(ctx: CheckContext) -> None:
    """Create (201 created, then 200 reused), heartbeat, close (closed, then already_closed); only the holder."""
    _, [holder, other] = await workers(ctx, [], [])
    sid = ctx.uid("s")
    terminal = "SESSION-CLOSE-TERMINAL"
    # The call, by whom, the status, reason and body fields it must answer, what it is, the requirement it judges.
    steps: list[tuple[SessionCall, str, int, str | None, dict[str, Any], str, str | None]] = [
        (create, holder, 201, None, {"outcome": "created"}, "first create", None),
        (create, holder, 200, None, {"outcome": "reused"}, "create again by the holder", None),
        (heartbeat, holder, 200, None, {"outcome": "heartbeat_recorded"}, "session heartbeat", None),
        (close, other, 409, "session_owner_mismatch", {}, "close by a worker that does not hold the session", terminal),
        (close, holder, 200, None, {"outcome": "closed"}, "close by the holder", None),
        (close, holder, 200, None, {"outcome": "already_closed"}, "second close", terminal),
        (create, holder, 409, "session_closed", {}, "create of a closed session id", terminal),
    ]
    # The outcomes that change the session's status, and the status each leaves in the answer's session.
    leaves = {"created": "active", "closed": "closed"}
    for call, worker, status, reason, fields, what, requirement in steps:
        reply = await call(ctx, worker, sid)
        body = ctx.expect(reply, status, reason, what=what, requirement=requirement, fields=fields)
        if fields.get("outcome") in leaves:
            want = leaves[fields["outcome"]]
            ctx.require_equal(status_of(body), want, f"{what}: the session is {want}", requirement=requirement)
    ctx.expect(await heartbeat(ctx, holder, ctx.uid("absent")), 404, "session_not_found", what="unknown session")


@check("SESSION-LAZY-CREATE", "SESSION-REQUIREMENTS", capability=CAP)
async def session_lazy_creation_by_capable_worker(ctx: CheckContext) -> None:
    """The first claim by a capable worker creates the session; a worker lacking a requirement is leased nothing."""
    need = ctx.uid("gpu")
    queue, [plain, capable] = await workers(ctx, [], [need])
    sid = ctx.uid("s")
    await schedule_in_session(ctx, queue, {"session_id": sid, "requirements": [need]})
    ctx.expect(
        await create(ctx, plain, ctx.uid("other"), requirements=[need]),
        409,
        "session_requirements_not_met",
        what="create by a worker lacking a requirement",
        requirement="SESSION-REQUIREMENTS",
    )
    ctx.require(
        await leased(ctx, plain, queue) is None,
        "a worker lacking the session requirement is leased no in-session task",
        requirement="SESSION-REQUIREMENTS",
    )
    task = await lease_within(ctx, capable, queue, "SESSION-LAZY-CREATE")
    affinity = task.get("worker_session")
    ctx.require(
        isinstance(affinity, dict)
        and affinity.get("session_id") == sid
        and affinity.get("status") == "active"
        and affinity.get("lease_owner") == capable,
        "the leased task carries its worker_session, active and owned by the claiming worker",
        expected={"session_id": sid, "status": "active", "lease_owner": capable},
        received=affinity,
    )
    body = ctx.expect(await heartbeat(ctx, capable, sid), 200, what="the lazily created session is renewable")
    ctx.require(status_of(body) == "active", "the session exists and is active", received=body.get("session"))


@check("SESSION-SINGLE-OWNER", "SESSION-ACTIVITY-LIMIT", capability=CAP)
async def session_one_owner_race(ctx: CheckContext) -> None:
    """Two capable workers race for one session: exactly one is admitted; the other gets no in-session task."""
    queue, [a, b] = await workers(ctx, [], [])
    sid = ctx.uid("s")
    replies = await asyncio.gather(create(ctx, a, sid), create(ctx, b, sid))
    admitted = [r for r in replies if r.status in (200, 201)]
    refused = [r for r in replies if r.status == 409 and r.reason == "session_owned_by_another_worker"]
    ctx.require(
        len(admitted) == 1 and len(refused) == 1,
        "two workers racing to create one session: one admitted, one session_owned_by_another_worker",
        expected="one 201 and one 409 session_owned_by_another_worker",
        received=[f"{r.status} {r.reason}" for r in replies],
        replies=replies,
    )
    owner = a if admitted[0] is replies[0] else b
    loser = b if owner == a else a
    await schedule_in_session(ctx, queue, {"session_id": sid}, {"session_id": sid})
    started = ctx.now()
    first = await lease_within(ctx, owner, queue, "SESSION-SINGLE-OWNER")
    # The second task is ready now: the other worker and the holder poll for it side by side, so both empty
    # holds fit in one stretch of the first attempt's lease (one after the other, a server whose holds run
    # long would leave the lease no time to judge the holder's answer in).
    loser_poll, extra = await asyncio.gather(leased(ctx, loser, queue), leased(ctx, owner, queue))
    ctx.require(loser_poll is None, "the worker that does not hold the session is leased none of its tasks")
    if extra is not None:
        still_within(ctx, started, attempt_lease(ctx), "the first in-session attempt's lease")
    ctx.require(
        extra is None,
        "max_concurrent_activities 1: the second in-session task waits while the first is leased",
        received=extra,
        requirement="SESSION-ACTIVITY-LIMIT",
    )
    done = {"activity_attempt_id": first["activity_attempt_id"], "lease_owner": owner, "result": ctx.envelope("ok")}
    completed = await ctx.client.worker(f"/activity-tasks/{first['task_id']}/complete", done)
    if completed.status != 200:
        still_within(ctx, started, attempt_lease(ctx), "the first in-session attempt's lease")
    ctx.expect(completed, 200)
    second = await lease_within(ctx, owner, queue, "SESSION-ACTIVITY-LIMIT")
    ctx.require(second["task_id"] != first["task_id"], "the second in-session task follows", received=second)


@check("SESSION-ACTIVITY-HEARTBEAT-RENEWS", capability=CAP)
async def session_renewed_by_activity_heartbeat(ctx: CheckContext) -> None:
    """Heartbeats of an in-session activity keep a 2 s session lease alive past its first expiry."""
    ctx.needs_short(4, "the session lease this check schedules")
    queue, [worker] = await workers(ctx, [])
    sid = ctx.uid("s")
    await schedule_in_session(ctx, queue, {"session_id": sid, "lease_seconds": 2})
    started = ctx.now()
    task = await lease_within(ctx, worker, queue, "SESSION-ACTIVITY-HEARTBEAT-RENEWS")
    first = (task.get("worker_session") or {}).get("lease_expires_at")
    beat = {"activity_attempt_id": task["activity_attempt_id"], "lease_owner": worker}
    last: Reply | None = None
    renewed_since = started
    for _ in range(4):  # 4 × 1 s: twice the session lease
        await ctx.wait(1.0)
        sent = ctx.now()
        last = await ctx.client.worker(f"/activity-tasks/{task['task_id']}/heartbeat", beat)
        ctx.expect(last, 200, what="in-session activity heartbeat")
        still_within(ctx, renewed_since, 2.0, "the 2 s session lease between two heartbeats")
        renewed_since = sent
    assert last is not None
    shown = last.json().get("worker_session") or {}
    reply = await heartbeat(ctx, worker, sid)
    if reply.status != 200:
        still_within(ctx, renewed_since, 2.0, "the 2 s session lease after the last heartbeat")
    ctx.require(
        reply.status == 200 and status_of(reply.json()) == "active",
        "after 4 s of activity heartbeats the 2 s session lease is still live",
        expected="200 active",
        received=f"{reply.status} {reply.reason or status_of(reply.json())}",
        replies=[last, reply],
    )
    if isinstance(first, str) and isinstance(shown.get("lease_expires_at"), str):
        ctx.require(
            parse_rfc3339(shown["lease_expires_at"]) > parse_rfc3339(first),
            "the heartbeat answer shows the renewed session lease",
            expected=f"> {first}",
            received=shown.get("lease_expires_at"),
            replies=[last],
        )


@check("SESSION-LEASE-EXPIRY", "SESSION-STALE-HOLDER-FENCED", "SESSION-ATTEMPT-LEASE-INDEPENDENT", capability=CAP)
async def session_expiry_and_reacquisition(ctx: CheckContext) -> None:
    """A 1 s session lapses; the old holder's heartbeat is refused; another worker reacquires it; the old holder
    is then fenced (owner mismatch) while its own activity attempt stays live."""
    ctx.needs_short(3, "the session lease this check schedules")
    queue, [old, new] = await workers(ctx, [], [])
    sid = ctx.uid("s")
    await schedule_in_session(ctx, queue, {"session_id": sid, "lease_seconds": 1})
    started = ctx.now()
    task = await lease_within(ctx, old, queue, "SESSION-LEASE-EXPIRY")
    await ctx.wait(1.5)
    reply = await session_call(ctx, "POST", f"/{sid}/heartbeat", {"worker_id": old})
    ctx.expect(
        reply, 409, "session_not_active", what="heartbeat of a lapsed session", requirement="SESSION-LEASE-EXPIRY"
    )
    body = ctx.expect(await create(ctx, new, sid, lease_seconds=30), 200, what="reacquire by another worker")
    ctx.require(
        body.get("outcome") == "reacquired" and (body.get("session") or {}).get("lease_owner") == new,
        "a capable worker reacquires the expired session",
        received=body,
        requirement="SESSION-LEASE-EXPIRY",
    )
    ctx.expect(
        await heartbeat(ctx, old, sid),
        409,
        "session_owner_mismatch",
        what="heartbeat from the worker that lost the session",
        requirement="SESSION-STALE-HOLDER-FENCED",
    )
    beat = {"activity_attempt_id": task["activity_attempt_id"], "lease_owner": old}
    out = ctx.expect(
        await ctx.client.worker(f"/activity-tasks/{task['task_id']}/heartbeat", beat),
        200,
        what="the old holder's in-flight attempt",
        requirement="SESSION-ATTEMPT-LEASE-INDEPENDENT",
    )
    if out.get("can_continue") is not True:
        still_within(ctx, started, attempt_lease(ctx), "the in-flight attempt's own lease")
    ctx.require(
        out.get("can_continue") is True,
        "the attempt's own lease outlives the session it was leased in",
        received=out.get("can_continue"),
        requirement="SESSION-ATTEMPT-LEASE-INDEPENDENT",
    )
    shown = out.get("worker_session") or {}
    ctx.require(
        shown.get("lease_owner") in (None, new),
        "the old holder's activity heartbeat does not take the session back",
        expected=new,
        received=shown.get("lease_owner"),
        requirement="SESSION-STALE-HOLDER-FENCED",
    )


@check("SESSION-REACQUIRE-DISALLOWED", capability=CAP)
async def session_reacquire_disallowed(ctx: CheckContext) -> None:
    """A lapsed session with allow_reacquire_after_failure false is reacquired by nobody."""
    ctx.needs_short(3, "the session lease this check schedules")
    _, [holder, other] = await workers(ctx, [], [])
    sid = ctx.uid("s")
    ctx.expect(await create(ctx, holder, sid, lease_seconds=1, allow_reacquire_after_failure=False), 201)
    await ctx.wait(1.5)
    reply = await create(ctx, other, sid)
    ctx.expect(reply, 409, "session_reacquire_disallowed", what="reacquire a session that forbids it")


@check("SESSION-TTL-TERMINAL", capability=CAP)
async def session_ttl_is_terminal(ctx: CheckContext) -> None:
    """A renewal never moves the lease past the TTL; after the TTL the id is closed for good."""
    ctx.needs_short(4, "the session TTL this check schedules")
    _, [holder] = await workers(ctx, [])
    sid = ctx.uid("s")
    ctx.expect(await create(ctx, holder, sid, lease_seconds=1, ttl_seconds=2), 201)
    body = ctx.expect(await heartbeat(ctx, holder, sid, lease_seconds=600), 200)
    session = body.get("session") or {}
    lease, ttl = session.get("lease_expires_at"), session.get("ttl_expires_at")
    ctx.require(
        isinstance(lease, str) and isinstance(ttl, str) and parse_rfc3339(lease) <= parse_rfc3339(ttl),
        "a renewed lease never runs past ttl_expires_at",
        expected=f"<= {ttl}",
        received=lease,
    )
    await ctx.wait(2.5)
    ctx.expect(await create(ctx, holder, sid), 409, "session_closed", what="the id after its TTL passed")


@check("SESSION-ORPHANED", capability=CAP)
async def session_orphaned_by_deregistration(ctx: CheckContext) -> None:
    """The holder deregisters: its session is orphaned and a capable worker reacquires it."""
    _, [holder, other] = await workers(ctx, [], [])
    sid = ctx.uid("s")
    ctx.expect(await create(ctx, holder, sid, lease_seconds=600), 201)
    reply = await ctx.client.worker(f"/registrations/{holder}", method="DELETE")
    if reply.status in (404, 405):
        raise NotCovered("the target has no worker deregistration route to lose a holder through")
    ctx.expect(reply, 200, what="holder deregistration")
    body = ctx.expect(await create(ctx, other, sid), 200, what="reacquire an orphaned session")
    ctx.require(body.get("outcome") == "reacquired", "the orphaned session is reacquired", received=body)


@check("SESSION-ORPHANED", capability=CAP, slow=True)
async def session_orphaned_by_stale_heartbeats(ctx: CheckContext) -> None:
    """The holder stays registered but neither polls nor heartbeats past stale_worker_seconds: its session is
    orphaned, and a capable worker registered afterwards reacquires it."""
    declared = ctx.target.test_profile.get("stale_worker_seconds")
    stale = declared if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0 else None
    what = "a worker's registration to go stale"
    wait = ctx.needs_short(None if stale is None else stale + 2, what, "stale_worker_seconds")
    queue, [holder] = await workers(ctx, [])
    sid = ctx.uid("s")
    # The session's own lease outlasts the wait: only the holder's silence can lose it.
    ctx.expect(await create(ctx, holder, sid, lease_seconds=max(600, int(wait) * 4)), 201)
    await ctx.wait(wait)
    other = await ctx.register(queue, capabilities=[])
    body = ctx.expect(await create(ctx, other, sid), 200, what="reacquire the session of a silent holder")
    ctx.require(
        body.get("outcome") == "reacquired",
        f"a session whose holder was silent past stale_worker_seconds ({stale} s) is orphaned and reacquired",
        expected={"outcome": "reacquired"},
        received=body,
    )


@check("SESSION-VISIBILITY", capability=CAP)
async def session_operator_visibility(ctx: CheckContext) -> None:
    """Operators list the namespace's sessions with per-status metrics and read one session."""
    _, [holder] = await workers(ctx, [])
    sid = ctx.uid("s")
    ctx.expect(await create(ctx, holder, sid), 201)
    reply = await ctx.client.control("GET", f"/worker-sessions/{sid}")
    if reply.status == 404 and reply.reason == "route_not_found":
        raise NotCovered("the target has no /api/worker-sessions operator route")
    body = ctx.expect(reply, 200, what="operator session detail")
    session = body.get("session") or {}
    ctx.require(
        session.get("lease_owner") == holder and session.get("status") == "active",
        "the detail shows the holder and status",
        received=session,
    )
    listing = ctx.expect(await ctx.client.control("GET", "/worker-sessions"), 200, what="operator session list")
    ids = [s.get("session_id") for s in listing.get("sessions") or [] if isinstance(s, dict)]
    metrics = listing.get("metrics") or {}
    ctx.require(
        sid in ids and isinstance(metrics.get("active"), int) and metrics["active"] >= 1,
        "the list shows the session and counts it as active",
        received={"metrics": metrics, "has_session": sid in ids},
    )
