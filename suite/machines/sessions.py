"""The worker-session machine: create, heartbeat and close sessions from several registered workers, race
two workers for one session, and lose a holder (deregistration) so another worker may reacquire.

The model is :mod:`suite.protocol.sessions`: for every step it computes the answer the rules allow —
:func:`~suite.protocol.sessions.admit`, :func:`~suite.protocol.sessions.heartbeat_decision`,
:func:`~suite.protocol.sessions.close_decision` over a shadow :class:`SessionView` — and steps the shadow
through the ``SESSION`` lifecycle table (:func:`suite.machines.world.advance`, the one transition function
of every shadow), before it reads what the target answered. Leases are long (an hour)
so no session lapses on its own inside an example: expiry is the plain checks' business, and the machine
stays deterministic under shrinking. A step whose answer never arrived leaves its session *maybe applied*:
the machine stops judging that session.
"""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from suite.client import Reply
from suite.outcomes import NotCovered
from suite.protocol import sessions as model
from suite.protocol.coverage import Actor
from suite.protocol.sessions import SESSION, SessionEvent, SessionOptions, SessionStatus, WorkerFacts

from .base import MachineBase, note, race
from .cells import SESSION_CLOCK_OPERATIONS, session_actor, session_state
from .session_shadow import LEASE, ShadowSession
from .session_sweep import sweep_cold_cells
from .world import advance

__all__ = ["SessionMachine"]

WORKERS = 3
SESSIONS = 3


class SessionMachine(MachineBase):
    """Worker sessions created, renewed, closed, raced for and reacquired from several workers, judged by the
    session rules."""

    name = "worker_sessions"
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "SESSION-EXPLICIT-LIFECYCLE": "created",
        "SESSION-SINGLE-OWNER": "refused_owned",
        "SESSION-CLOSE-TERMINAL": "already_closed",
        "SESSION-STALE-HOLDER-FENCED": "stale_holder_fenced",
        "SESSION-ORPHANED": "reacquired",
        "SESSION-REACQUIRE-DISALLOWED": "reacquire_disallowed",
        # Reached by the sweep: its sessions lapse and reach their absolute TTL.
        "SESSION-LEASE-EXPIRY": "expired",
        "SESSION-TTL-TERMINAL": "ttl",
        # Reached by the sweep's in-session activities: a claim creates a session; a heartbeat renews it; one of a
        # closed run's activity still stops it.
        "SESSION-LAZY-CREATE": "lazily_created",
        "SESSION-ACTIVITY-HEARTBEAT-RENEWS": "activity_heartbeat_renewed",
        "SESSION-ATTEMPT-LEASE-INDEPENDENT": "in_session_cancel_seen",
    }
    REQUIREMENT_CELLS: ClassVar[dict[str, tuple[str, ...]]] = {
        "SESSION-TTL-TERMINAL": ("worker_session/*/ttl_expire/clock",),
        "SESSION-LEASE-EXPIRY": ("worker_session/*/lease_expire/clock",),
        "SESSION-STALE-HOLDER-FENCED": ("worker_session/*/*/former_holder", "worker_session/*/*/other_worker"),
    }

    def __init__(self) -> None:
        super().__init__()
        self.gone: set[str] = set()  # deregistered: never registered again, so staleness stays certain
        # One session of each example forbids reacquisition, the others allow it: losing a holder then reaches
        # both outcomes of a reacquire in every run (reacquired, refused for good).
        self.sessions = [ShadowSession(self.ctx.uid("s"), allow_reacquire=i > 0) for i in range(SESSIONS)]

    @initialize()
    def setup(self) -> None:
        if not self.target or not self.target.server_capabilities.get("worker_sessions"):
            raise NotCovered("the target does not advertise worker_sessions")
        self.register_workers(WORKERS)

    # -- the model ---------------------------------------------------------------------------------------

    def facts(self, worker: str, session: ShadowSession) -> WorkerFacts | None:
        if worker in self.gone:
            return None
        held = sum(
            1 for s in self.sessions if s is not session and s.owner == worker and s.status is SessionStatus.ACTIVE
        )
        return WorkerFacts(worker, self.queue, frozenset(), held, None)

    def settle(self, session: ShadowSession) -> None:
        """The expiry or holder-loss event the target applies before answering (a deregistered holder is stale),
        counted in its clock cell: the next judged answer shows it."""
        before = session_state(session)
        due = model.due_event(session.view(), self.now(), holder_stale=session.owner in self.gone)
        if due is not None:
            session.status = advance(SESSION, session.status, due[0])
            session.ttl_closed = due[0] is SessionEvent.TTL_EXPIRE
            if before is not None:
                # Counted with the next judged answer (hit_session): an answer lost shows nothing.
                session.clock_cells.append((before, SESSION_CLOCK_OPERATIONS[due[0]]))
            self.reached(
                {SessionStatus.ORPHANED: "orphaned", SessionStatus.EXPIRED: "expired", SessionStatus.CLOSED: "ttl"}.get(
                    session.status, "failed"
                )
            )

    def hit_session(self, session: ShadowSession, verb: str, worker: str) -> None:
        """Count a judged session call in its cell (the session as settled before the call)."""
        for before, event in session.clock_cells:
            self.hit("worker_session", before, event, Actor.CLOCK)
        session.clock_cells.clear()
        state = session_state(session)
        if state is not None:
            self.hit("worker_session", state, verb, session_actor(session, worker, state))

    def judge(self, session: ShadowSession, reply: Reply | None, decision: model.Admission, verb: str) -> None:
        if reply is None:
            session.unsure = True
            return
        body = reply.json()
        requirement = {
            "session_owned_by_another_worker": "SESSION-SINGLE-OWNER",
            "session_reacquire_disallowed": "SESSION-REACQUIRE-DISALLOWED",
            "session_owner_mismatch": "SESSION-STALE-HOLDER-FENCED",
            "session_closed": "SESSION-TTL-TERMINAL" if session.ttl_closed else "SESSION-CLOSE-TERMINAL",
        }.get(decision.reason or "", "SESSION-EXPLICIT-LIFECYCLE")
        if session.ttl_closed and decision.reason in ("session_not_active", "session_closed"):
            requirement = "SESSION-TTL-TERMINAL"  # what its TTL closed stays closed
        elif decision.reason == "session_not_active" and session.status is SessionStatus.EXPIRED:
            requirement = "SESSION-LEASE-EXPIRY"  # a lapsed session's holder is refused until it is reacquired
        if decision.admitted:
            ok = reply.status in (200, 201) and body.get("outcome") == decision.outcome
            expected: Any = f"2xx outcome {decision.outcome}"
        else:
            ok = reply.status == decision.status and reply.reason == decision.reason
            expected = f"{decision.status} {decision.reason}"
        if not ok:
            message = f"session {verb}: the answer the session rules allow"
            raise self.unexpected(reply, requirement, message, expected, f"outcome={body.get('outcome')!r}")

    def ask(
        self, session: ShadowSession, decision: model.Admission, verb: str, request: Coroutine[Any, Any, Reply]
    ) -> Reply | None:
        """Send ``request`` (a session ``verb``) and judge its answer by ``decision``; None when it never came."""
        reply = self.call(request)
        self.judge(session, reply, decision, verb)
        return reply

    # -- rules -------------------------------------------------------------------------------------------

    def pick(self, i: int) -> ShadowSession | None:
        session = self.sessions[i % SESSIONS]
        return None if session.unsure else session

    def existing(self, i: int) -> ShadowSession | None:
        """The session ``i`` once it has been created (settled to now), or None: a heartbeat or close of a session
        nobody created is not a step of the lifecycle."""
        session = self.pick(i)
        if session is None or session.status is SessionStatus.NONE:
            return None
        self.settle(session)
        return session

    @rule(w=st.integers(0, WORKERS - 1), s=st.integers(0, SESSIONS - 1))
    def create(self, w: int, s: int) -> None:
        session = self.pick(s)
        if session is not None:
            self.do_create(session, self.workers[w])

    def do_create(self, session: ShadowSession, worker: str) -> None:
        """An explicit create of ``session`` by ``worker``, judged by the admission rules."""
        self.settle(session)
        allow = session.allow_reacquire  # the options of the call that creates it stay with the session
        options = SessionOptions(
            session.session_id,
            lease_seconds=session.lease,
            allow_reacquire_after_failure=allow,
            ttl_seconds=session.ttl if session.ttl is not None else int(model.DEFAULTS["ttl_seconds"]),
        )
        decision = model.admit(session.view(), options, self.facts(worker, session), explicit=True)
        body = {"worker_id": worker, **options.to_json()}
        body = {k: v for k, v in body.items() if v is not None}
        at = self.now()
        reply = self.ask(session, decision, "create", self.ctx.client.worker("/sessions", body))
        if reply is not None:
            self.hit_session(session, "create", worker)
        if reply is None or not decision.admitted:
            self.reached_refusal(decision)
            return
        if decision.event is SessionEvent.CREATE:
            # The default TTL (half an hour) never comes due inside a run: left out of the shadow.
            session.ttl_until = at + timedelta(seconds=session.ttl) if session.ttl is not None else None
            session.holders = [worker]
            session.leased(at)
        elif decision.event is SessionEvent.REACQUIRE:
            session.holders.append(worker)
            session.leased(at)
        elif session.owner == worker:
            session.leased(at)  # reused: the holder's lease renewed
        if decision.event is not None:
            session.status, session.owner = advance(SESSION, session.status, decision.event), worker
        self.reached(str(decision.outcome))

    @rule(w=st.integers(0, WORKERS - 1), s=st.integers(0, SESSIONS - 1))
    def heartbeat(self, w: int, s: int) -> None:
        session = self.existing(s)
        if session is not None:
            self.do_heartbeat(session, self.workers[w])

    def do_heartbeat(self, session: ShadowSession, worker: str, lease: int | None = None) -> None:
        """An explicit session heartbeat by ``worker`` (renewing for ``lease`` seconds, default the session's)."""
        self.settle(session)
        decision = model.heartbeat_decision(session.view(), worker)
        path = f"/sessions/{session.session_id}/heartbeat"
        seconds = session.lease if lease is None else lease
        body = {"worker_id": worker, "lease_seconds": seconds}
        at = self.now()
        reply = self.ask(session, decision, "heartbeat", self.ctx.client.worker(path, body))
        if reply is not None:
            self.hit_session(session, "heartbeat", worker)
            self.reached("heartbeat_recorded" if decision.admitted else str(decision.reason))
            if decision.reason == "session_owner_mismatch":
                self.reached("stale_holder_fenced")
            if decision.admitted:
                session.leased(at, seconds)

    @rule(w=st.integers(0, WORKERS - 1), s=st.integers(0, SESSIONS - 1))
    def close(self, w: int, s: int) -> None:
        session = self.existing(s)
        if session is not None:
            self.do_close(session, self.workers[w])

    def do_close(self, session: ShadowSession, worker: str) -> None:
        """An explicit close by ``worker``, judged by the close rule."""
        self.settle(session)
        decision = model.close_decision(session.view(), worker)
        body = {"worker_id": worker, "reason": "worker_shutdown"}
        path = f"/sessions/{session.session_id}"
        reply = self.ask(session, decision, "close", self.ctx.client.worker(path, body, method="DELETE"))
        if reply is not None:
            self.hit_session(session, "close", worker)
        if reply is None or not decision.admitted:
            if reply is not None and decision.reason == "session_owner_mismatch":
                self.reached("stale_holder_fenced")
            return
        if decision.event is not None:
            session.status = advance(SESSION, session.status, decision.event)
        self.reached(str(decision.outcome))

    @precondition(lambda self: any(s.status is SessionStatus.NONE and not s.unsure for s in self.sessions))
    @rule()
    def race_two_workers(self) -> None:
        """Two workers create one new session together: exactly one is admitted."""
        session = next(s for s in self.sessions if s.status is SessionStatus.NONE and not s.unsure)
        contenders = [w for w in self.workers if w not in self.gone][:2]
        if len(contenders) < 2:
            return
        body = {
            "session_id": session.session_id,
            "lease_seconds": LEASE,
            "allow_reacquire_after_failure": session.allow_reacquire,
        }

        async def one(i: int) -> Reply:
            return await self.ctx.client.worker("/sessions", {"worker_id": contenders[i], **body})

        outcomes = self.run(race(2, one))
        replies = [r for r in outcomes if isinstance(r, Reply)]
        if len(replies) < 2:
            session.unsure = True
            return
        for reply in replies:
            note(reply.exchange.summary())
        won = [r for r in replies if r.status in (200, 201)]
        lost = [r for r in replies if r.status == 409 and r.reason == "session_owned_by_another_worker"]
        if len(won) != 1 or len(lost) != 1:
            raise self.violation(
                "SESSION-SINGLE-OWNER",
                "two workers racing to create one session: exactly one holds it",
                expected="one 201 created, one 409 session_owned_by_another_worker",
                received=[f"{r.status} {r.reason or r.json().get('outcome')}" for r in replies],
                replies=replies,
            )
        session.status = advance(SESSION, session.status, model.SessionEvent.CREATE)
        session.owner = contenders[replies.index(won[0])]
        session.holders = [session.owner]
        self.reached("refused_owned")

    def held(self) -> list[ShadowSession]:
        """Active sessions whose holder is still in the pool (a holder that left is replaced there)."""
        return [
            x for x in self.sessions if x.owner in self.workers and x.status is SessionStatus.ACTIVE and not x.unsure
        ]

    @precondition(lambda self: bool(self.held()))
    @rule(s=st.integers(0, SESSIONS - 1))
    def holder_leaves(self, s: int) -> None:
        """The holder of a session deregisters; a fresh worker joins the pool in its place and asks for the
        holder's sessions."""
        held = self.held()
        if not held:
            return
        holder = held[s % len(held)].owner
        assert holder is not None
        self.deregister(holder)
        slot = self.workers.index(holder)
        self.workers[slot] = self.run(self.ctx.register(self.queue))
        # The worker that took its place asks at once for each session the holder left behind: reacquired, or
        # refused for good when it was created with allow_reacquire_after_failure false (the model judges both).
        for i, x in enumerate(self.sessions):
            if x.owner == holder and not x.unsure:
                self.create(slot, i)

    def deregister(self, worker: str) -> None:
        """``worker`` deregisters: it is stale from then on, and so is its hold on every session it holds."""
        reply = self.call(self.ctx.client.worker(f"/registrations/{worker}", method="DELETE"))
        if reply is None or reply.status != 200:
            # Maybe deregistered: the holder's sessions may be orphaned or not, and the worker may be gone.
            for x in self.sessions:
                if x.owner == worker:
                    x.unsure = True
        self.gone.add(worker)

    # -- the sweep over cold cells -----------------------------------------------------------------------

    def sweep(self) -> None:
        """After the examples: every explicit-call and clock cell they left cold, made deterministically
        (:mod:`suite.machines.session_sweep`)."""
        self.setup()
        self.sweep_rounds(lambda: sweep_cold_cells(self))

    def reached_refusal(self, decision: model.Admission) -> None:
        if decision.reason == "session_owned_by_another_worker":
            self.reached("refused_owned")
        elif decision.reason == "session_reacquire_disallowed":
            self.reached("reacquire_disallowed")
        elif decision.reason:
            self.reached(decision.reason)
