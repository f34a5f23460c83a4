"""The worker-session sweep's in-session activities: the runs that schedule activities in a sweep session, the
claims of them (an activity poll of the session's queue), the heartbeats of their attempts, and their runs' close.

A claim is judged by the session admission rules (:func:`suite.protocol.sessions.admit` of an in-session claim):
an admitted one leases an in-session task carrying the session, active and held by the claiming worker
(``SESSION-LAZY-CREATE``) — it creates the session, reacquires it or reuses it, and the shadow steps the same way;
a refused one leases none of the session's tasks (``SESSION-SINGLE-OWNER`` for a held session, the terminal
requirement for a closed or failed one), and a deregistered worker's poll is refused as not registered. The
lease itself is judged by the activity model (:func:`suite.machines.activity_oracle.judge_lease`).

A heartbeat of an in-session attempt is judged by the activity model (its own lease and cancellation: the session
changes neither); a recorded one renews the session only when its worker holds the active session, and the
session the answer shows (when it shows one) is the session the model holds: a heartbeat never brings an expired,
orphaned or closed session back (``SESSION-LEASE-EXPIRY``, ...) nor takes a reacquired one back
(``SESSION-STALE-HOLDER-FENCED``). Closing an in-session activity's run leaves the session as it was; an active
session is then ``active_cancelled_activity``. Every run's history is read back and judged by the activity model.

A refused claim is an empty poll, which holds a second of the target's clock: those are made last, all at once.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import suite.machines.activity_oracle as oracle
from suite.client import Reply
from suite.outcomes import HarnessError
from suite.protocol import sessions as model
from suite.protocol.commands import DEFAULT_RETRY_POLICY
from suite.protocol.coverage import Actor
from suite.protocol.errors import Rejection, Violation
from suite.protocol.fencing import guard_activity_attempt
from suite.protocol.oracle import Kind
from suite.protocol.sessions import SESSION, SessionEvent, SessionOptions, SessionStatus
from suite.worlds import lease_wf

from .activity_oracle import ActivityRun, ActivityWorld, Attempt, Execution
from .base import note, race
from .cells import session_actor, session_state
from .session_shadow import ShadowSession
from .world import advance

# The session machine (suite.machines.sessions) and the sweep's instances (suite.machines.session_sweep), typed
# loosely: those modules import this one.
SessionMachine = Any
Instance = Any

__all__ = [
    "IN_SESSION",
    "InSession",
    "claim",
    "claim_refused",
    "claims_at_once",
    "close_run",
    "heartbeat",
    "judge_histories",
    "shown_requirement",
    "start",
]

IN_SESSION = ("claim_in_session", "activity_heartbeat_in_session", "close_run")
TASKS = 4  # in-session activities per run: more than the claims one instance makes
# Room for every attempt an instance leases: the activity limit is not what the sweep judges here.
MAX_ACTIVITIES = 10
ACTIVITY_TYPE = "conformance.session"


@dataclass(eq=False)
class InSession:
    """An instance's in-session activities: its runs (the first the one closed when a recipe closes a run), the
    activity model of their attempts, and the attempt each worker last leased."""

    runs: list[ActivityRun] = field(default_factory=list)
    world: ActivityWorld = field(default_factory=ActivityWorld)
    held: dict[str, Attempt] = field(default_factory=dict)


def options_of(session: ShadowSession) -> SessionOptions:
    ttl = session.ttl if session.ttl is not None else int(model.DEFAULTS["ttl_seconds"])
    return SessionOptions(
        session.session_id,
        lease_seconds=session.lease,
        ttl_seconds=ttl,
        max_concurrent_activities=MAX_ACTIVITIES,
        allow_reacquire_after_failure=session.allow_reacquire,
    )


def start(m: SessionMachine, inst: Instance, runs: int) -> InSession:
    """``runs`` runs, each on a workflow queue of its own, whose first task schedules ``TASKS`` activities in the
    instance's session on the instance's activity queue."""
    acts = InSession()
    wanted = {k: v for k, v in options_of(inst.session).to_json().items() if v not in (None, [])}
    for _ in range(runs):
        queue = m.ctx.uid("q")
        worker = m.run(m.ctx.register(queue))
        workflow_id, run_id = m.run(m.ctx.start(queue))
        m.ack(run_id, Kind.START)
        task = m.run(lease_wf(m.ctx, worker, queue))
        run = ActivityRun(workflow_id=workflow_id, run_id=run_id, queue=queue, worker=worker)
        commands = []
        for _ in range(TASKS):
            e = Execution(m.ctx.uid(ACTIVITY_TYPE), run, None, DEFAULT_RETRY_POLICY, None)
            run.execs.append(e)
            commands.append(
                {
                    "type": "schedule_activity",
                    "activity_type": e.activity_type,
                    "queue": inst.queue,
                    "arguments": m.ctx.envelope([e.activity_type]),
                    "worker_session": wanted,
                }
            )
        acts.world.add(run)
        acts.runs.append(run)
        reply = m.call(m.ctx.complete(task, commands))
        if reply is None:
            run.uncertain = inst.session.unsure = True  # maybe scheduled
            continue
        m.expect_status(reply, 200, "SESSION-LAZY-CREATE", "a complete scheduling in-session activities")
    return acts


# -- claims ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    worker: str
    decision: model.Admission
    state: str | None
    at: datetime


def claim_refused(state: str, actor: Actor) -> bool:
    """Whether the admission rules refuse an in-session claim by ``actor`` in ``state`` with a poll that finds
    nothing (a deregistered holder's poll is refused at once, as not registered)."""
    if state in ("closed", "failed"):
        return True
    if state in ("active", "active_cancelled_activity"):
        return actor is Actor.OTHER_WORKER
    return state == "reacquired" and actor is not Actor.HOLDER


def _prepare(m: SessionMachine, inst: Instance, worker: str) -> Claim:
    session = inst.session
    m.settle(session)
    facts = m.facts(worker, session)
    decision = model.admit(session.view(), options_of(session), facts, explicit=False, queue=inst.queue)
    return Claim(worker, decision, session_state(session), m.now())


def _poll(m: SessionMachine, inst: Instance, worker: str) -> Coroutine[Any, Any, Reply]:
    poll: Coroutine[Any, Any, Reply] = m.ctx.poll("activity", worker, inst.queue, 1)
    return poll


def claim(m: SessionMachine, inst: Instance, worker: str) -> None:
    """One in-session claim by ``worker``, judged by the admission rules."""
    if inst.session.unsure:
        return
    prepared = _prepare(m, inst, worker)
    _judge_claim(m, inst, prepared, m.call(_poll(m, inst, worker)))


def claims_at_once(m: SessionMachine, claims: list[tuple[Instance, str]]) -> None:
    """The refused claims, all released together: each empty poll holds the same second of the target's clock."""
    claims = [(inst, w) for inst, w in claims if not inst.session.unsure]
    if not claims:
        return
    prepared = [_prepare(m, inst, w) for inst, w in claims]
    answers = m.run(race(len(claims), lambda i: _poll(m, claims[i][0], claims[i][1])))
    for (inst, _), p, answer in zip(claims, prepared, answers, strict=True):
        if isinstance(answer, HarnessError):
            _judge_claim(m, inst, p, None)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            note(answer.exchange.summary())
            _judge_claim(m, inst, p, answer)


def _refusal_requirement(decision: model.Admission) -> str:
    return {
        "session_owned_by_another_worker": "SESSION-SINGLE-OWNER",
        "session_closed": "SESSION-CLOSE-TERMINAL",
        "session_reacquire_disallowed": "SESSION-REACQUIRE-DISALLOWED",
        "session_requirements_not_met": "SESSION-REQUIREMENTS",
    }.get(decision.reason or "", "SESSION-EXPLICIT-LIFECYCLE")


def _judge_claim(m: SessionMachine, inst: Instance, p: Claim, reply: Reply | None) -> None:
    session, acts = inst.session, inst.acts
    if reply is None or reply.resent:
        session.unsure = True  # the poll may have leased an in-session task (and created or reacquired)
        for e in acts.world.all_execs():
            e.uncertain = True
        return
    if p.decision.reason == "worker_not_registered":
        m.expect_status(reply, 412, "POLL-NOT-REGISTERED", "a poll of a worker that deregistered")
        _count(m, session, p)
        return
    body = m.check_poll_shape(reply, "activity")
    task = body.get("task")
    if not p.decision.admitted:
        if isinstance(task, dict):
            raise m.violation(
                _refusal_requirement(p.decision),
                f"an in-session task of session {session.session_id} ({p.state}) was leased to {p.worker}, whom the "
                f"session rules refuse ({p.decision.reason})",
                expected="no in-session task",
                received={k: task.get(k) for k in ("task_id", "worker_session")},
                replies=[reply],
            )
        _count(m, session, p)
        m.reached(f"claim_refused_{p.decision.reason}")
        return
    if not isinstance(task, dict):
        raise m.violation(
            "SESSION-LAZY-CREATE",
            f"{p.worker} was leased no in-session task of session {session.session_id} ({p.state}), though the "
            f"session rules admit it ({p.decision.outcome}) and its tasks are ready",
            expected=f"an in-session task, the session {p.decision.outcome}",
            received=body.get("poll_status"),
            replies=[reply],
        )
    with m.judged(reply):
        attempt, states = oracle.judge_lease(acts.world, task, p.worker, m.now(), m.MARGIN)
        _judge_affinity(task, session.session_id, p.worker)
    for state in states:
        m.reached(state)
    e = attempt.execution
    m.ack(e.run.run_id, Kind.ATTEMPT, attempt.attempt_id, scope=e.activity_type, number=attempt.number)
    m.touched.add(e.run.run_id)
    acts.held[p.worker] = attempt
    _count(m, session, p)
    _admitted(m, session, p)


def _judge_affinity(task: dict[str, Any], session_id: str, worker: str) -> None:
    affinity = task.get("worker_session")
    got = {k: affinity.get(k) for k in ("session_id", "status", "lease_owner")} if isinstance(affinity, dict) else None
    want = {"session_id": session_id, "status": "active", "lease_owner": worker}
    if got != want:
        raise Violation(
            "SESSION-LAZY-CREATE",
            "an admitted in-session claim's task carries its worker_session, active and held by the claiming worker",
            expected=want,
            received=got,
        )


def _count(m: SessionMachine, session: ShadowSession, p: Claim) -> None:
    """The claim in the cell of the session as settled before it (the clock cells its answer shows first)."""
    for before, event in session.clock_cells:
        m.hit("worker_session", before, event, Actor.CLOCK)
    session.clock_cells.clear()
    if p.state is not None:
        m.hit("worker_session", p.state, "claim_in_session", session_actor(session, p.worker, p.state))


def _admitted(m: SessionMachine, session: ShadowSession, p: Claim) -> None:
    """The shadow follows an admitted claim: created (lazily), reacquired, or reused by its holder."""
    event, worker, at = p.decision.event, p.worker, p.at
    if event is SessionEvent.CREATE:
        session.ttl_until = at + timedelta(seconds=session.ttl) if session.ttl is not None else None
        session.holders = [worker]
        m.reached("lazily_created")
    elif event is SessionEvent.REACQUIRE:
        session.holders.append(worker)
        m.reached("reacquired_by_claim")
    if event is not None:
        session.status, session.owner = advance(SESSION, session.status, event), worker
    session.leased(at)


# -- heartbeats -----------------------------------------------------------------------------------------


def _attempt_for(acts: InSession, session: ShadowSession, worker: str) -> Attempt | None:
    """The attempt ``worker`` heartbeats: its own newest, else the holder's, else any the instance leased."""
    if worker in acts.held:
        return acts.held[worker]
    owner = session.owner
    if owner is not None and owner in acts.held:
        return acts.held[owner]
    return next(iter(acts.held.values()), None)


def shown_requirement(session: ShadowSession, worker: str) -> str:
    """The requirement a heartbeat answer breaks when the session it shows is not the session the model holds."""
    if session.status is SessionStatus.ACTIVE:
        return "SESSION-ACTIVITY-HEARTBEAT-RENEWS" if session.owner == worker else "SESSION-STALE-HOLDER-FENCED"
    return {
        SessionStatus.EXPIRED: "SESSION-LEASE-EXPIRY",
        SessionStatus.ORPHANED: "SESSION-ORPHANED",
        SessionStatus.FAILED: "SESSION-REACQUIRE-DISALLOWED",
        SessionStatus.CLOSED: "SESSION-TTL-TERMINAL" if session.ttl_closed else "SESSION-CLOSE-TERMINAL",
    }.get(session.status, "SESSION-EXPLICIT-LIFECYCLE")


def heartbeat(m: SessionMachine, inst: Instance, worker: str) -> None:
    """``worker`` heartbeats an in-session attempt (its own if it holds one), judged by the activity model; a
    recorded one renews the session only for the holder of the active session."""
    session, acts = inst.session, inst.acts
    if session.unsure:
        return
    m.settle(session)
    a = _attempt_for(acts, session, worker)
    at = m.now()
    if a is None:
        _unknown_attempt(m, inst, worker)
        return
    body = {"activity_attempt_id": a.attempt_id, "lease_owner": worker}
    branches = oracle.branches(
        a, "heartbeat", task_id=a.task_id, attempt_id=a.attempt_id, owner=worker, at=at, margin=m.MARGIN
    )
    allowed = {b.out for b in branches}
    reply = m.call(m.client.worker(f"/activity-tasks/{a.task_id}/heartbeat", body))
    if reply is None:
        a.execution.uncertain = session.unsure = True  # maybe recorded: maybe renewed
        return
    answer = reply.json()
    got = oracle.outcome(reply.status, reply.reason, answer, "heartbeat")
    if not a.execution.certain:
        return
    with m.judged(reply):
        if got not in allowed:
            raise Violation(
                oracle.requirement_for(allowed, got, "heartbeat", a, m.now()),
                f"in-session activity heartbeat by {worker} of {a!r}: the model allows {sorted(allowed)}",
                expected=" or ".join(sorted(allowed)),
                received=f"{reply.status} {got}",
            )
        matched = [b for b in branches if b.out == got]
        oracle.check_body(reply.status, answer, "heartbeat", got, matched, a, m.now())
        oracle.follow(matched, "heartbeat", got, answer, a, label="", sent=at, details=None)
    m.touched.add(a.execution.run.run_id)
    m.hit_session(session, "activity_heartbeat_in_session", worker)
    if got == "ok" and session.status is SessionStatus.ACTIVE and session.owner == worker:
        session.leased(at)  # SESSION-ACTIVITY-HEARTBEAT-RENEWS
        m.reached("activity_heartbeat_renewed")
    elif got.startswith("stop:run_"):
        m.reached("in_session_cancel_seen")  # the session hides no cancel_requested
    if got == "ok":
        _judge_shown(m, session, worker, answer.get("worker_session"), reply)


def _judge_shown(m: SessionMachine, session: ShadowSession, worker: str, shown: Any, reply: Reply) -> None:
    """The session a recorded heartbeat's answer shows is the model's: no heartbeat revives a session that is not
    active, and none moves an active one to another holder."""
    if not isinstance(shown, dict) or session.unsure:
        return
    want = {"status": session.status.value, "lease_owner": session.owner}
    got = {k: shown.get(k) for k in want}
    if session.status is not SessionStatus.ACTIVE:
        want.pop("lease_owner")
        got.pop("lease_owner")
    if got != want:
        raise m.violation(
            shown_requirement(session, worker),
            f"after {worker}'s recorded in-session activity heartbeat, the answer shows session "
            f"{session.session_id} other than the session rules leave it",
            expected=want,
            received=got,
            replies=[reply],
        )


def _unknown_attempt(m: SessionMachine, inst: Instance, worker: str) -> None:
    """No attempt of the session exists yet: the worker names a task nobody leased (404 task_not_found)."""
    task_id, attempt_id = m.ctx.uid("unleased"), m.ctx.uid("unleased")
    body = {"activity_attempt_id": attempt_id, "lease_owner": worker}
    reply = m.call(m.client.worker(f"/activity-tasks/{task_id}/heartbeat", body))
    if reply is None:
        return
    try:
        guard_activity_attempt(
            None, task_exists=False, task_id=task_id, activity_attempt_id=attempt_id, lease_owner=worker
        )
    except Rejection as rej:
        if (reply.status, reply.reason) != (rej.status, rej.reason):
            raise m.unexpected(
                reply,
                "FENCE-UNKNOWN-TASK",
                "a heartbeat of an activity task nobody leased",
                f"{rej.status} {rej.reason}",
            ) from None
    m.hit_session(inst.session, "activity_heartbeat_in_session", worker)


# -- the run's close ------------------------------------------------------------------------------------


def close_run(m: SessionMachine, inst: Instance, which: int = -1) -> None:
    """The operator cancels the run of in-session activities: the session is left as it was (an active one now
    has an in-session activity whose run closed); the run's attempts are cancelled."""
    session, acts = inst.session, inst.acts
    live = [r for r in acts.runs if r.open and not r.uncertain]
    if session.unsure or not live:
        return
    run = live[which] if which < len(live) else live[-1]
    m.settle(session)
    state = session_state(session)
    clock = list(session.clock_cells)
    if m.close_by_control(run, "cancel") is None:
        session.unsure = True  # the model no longer knows which attempts were cancelled
        return
    for before, event in clock:
        m.hit("worker_session", before, event, Actor.CLOCK)
    session.clock_cells.clear()
    if state is not None:
        m.hit("worker_session", state, "close_run", Actor.OPERATOR)
    for e in run.execs:
        oracle.cancel_execution(e)
    session.cancelled_activity = True
    m.reached("in_session_run_closed")


def judge_histories(m: SessionMachine, instances: list[Instance]) -> None:
    """Every in-session run's history, read back and judged by the activity model."""
    runs = {r.run_id: r for inst in instances if inst.acts is not None for r in inst.acts.runs}
    m.touched &= set(runs)

    def judge(run: ActivityRun, events: list[dict[str, Any]]) -> None:
        with m.judged():
            for state in oracle.check_run_history(run, events, m.now(), m.MARGIN):
                m.reached(state)

    if m.touched:
        m.check_touched_histories(runs, judge)
