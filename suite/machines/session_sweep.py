"""The worker-session machine's sweep: a deterministic phase after its examples over the worker-session cells
(:mod:`suite.protocol.coverage`) of explicit create, heartbeat and close, and of the clock's events, that the
examples left cold.

The examples hold hour-long leases, so no session lapses there. The sweep brings one session into each state
with cold cells, each with three workers of its own: never created; active; reacquired by a second worker after
its one-second lease lapsed (the first worker then its former holder); expired; orphaned by its holder's
deregistration; closed; failed (a lapse of a session that forbids reacquisition). Others are made for the clock's
events from each state: a lease that lapses again after a reacquisition, a holder that leaves after one, and an
absolute TTL that ends an active, a reacquired, an expired and an orphaned session. Each makes its cold calls there
by each actor, the ones that leave the session as it is first; a call that changes it ends its instance. Every
answer goes through the machine's own steps, so the session rules judge it as they judge the examples'.

The in-session cells (:mod:`suite.machines.session_activities`) are swept the same way: an instance with an
in-session call gets an activity queue of its own and runs that schedule activities in its session, and its
recipe claims where the others create, so its holder holds an attempt. In each state the session's holder, a
former holder and another worker claim an in-session task and heartbeat an in-session attempt, and the operator
closes an in-session activity's run; a session whose in-session activity's run closed (a second run's tasks left
to claim) is swept like every other state, its clock's events included. The claims the rules refuse are made
last, together (each empty poll holds a second of the target's clock).

All instances move together: what they need of the clock (a lapse, a TTL) is waited out once per phase for all.
A session whose lease or TTL would come due within the machine's margin of a call is never called then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from suite.protocol.coverage import ENTITIES, Actor, cells

from .base import EXPIRY_STEP
from .cells import Calls, one_change_each, plan_cold_cells
from .session_activities import (
    IN_SESSION,
    InSession,
    claim,
    claim_refused,
    claims_at_once,
    close_run,
    heartbeat,
    judge_histories,
)
from .session_activities import (
    start as start_activities,
)
from .session_shadow import LEASE, ShadowSession

# The machine is suite.machines.sessions', which imports this module: typed loosely so they do not import each
# other.
SessionMachine = Any

__all__ = ["RECIPES", "cold_plan", "sweep_cold_cells"]

ORDER = ("activity_heartbeat_in_session", "heartbeat", "claim_in_session", "close_run", "close", "create")
ACA = "active_cancelled_activity"
SHORT = 1  # seconds: the lease (or TTL) a sweep session lets lapse
TTL = 5  # seconds: an absolute TTL that ends after a first lapse, and the calls after it, by more than the margin

# A recipe brings a session into its state: ("create", worker), ("heartbeat", worker, lease seconds),
# ("close", worker), ("leave", worker: its deregistration), ("poke", worker: any call, so the target settles the
# session now), ("claim", worker: an in-session claim; an instance with in-session calls claims where a recipe
# creates), ("close_run",: the operator cancels the first in-session run), ("wait", "lease" | "ttl" | "phase": the
# phase ends, and the clock passes the session's lease or TTL, or what the other sessions wait for).
Step = tuple[Any, ...]


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]
    lease: int = LEASE
    ttl: int | None = None
    allow_reacquire: bool = True
    clock: tuple[tuple[str, str], ...] = ()  # the clock cells (state, operation) its first call after a wait meets
    runs: int = 1  # in-session runs, when the instance has in-session activities (one is closed, one left open)


_REACQUIRE = (("create", 0), ("wait", "lease"), ("create", 1), ("heartbeat", 1, LEASE))
RECIPES: dict[str, Recipe] = {
    "none": Recipe(()),
    "active": Recipe((("create", 0),)),
    "reacquired": Recipe(_REACQUIRE, lease=SHORT, clock=(("active", "lease_expire"),)),
    "expired": Recipe((("create", 0), ("wait", "lease")), lease=SHORT, clock=(("active", "lease_expire"),)),
    "orphaned": Recipe((("create", 0), ("leave", 0)), clock=(("active", "holder_stale"),)),
    # Closed by the worker that reacquired it: the first worker is its former holder.
    "closed": Recipe((*_REACQUIRE, ("close", 1)), lease=SHORT, clock=(("active", "lease_expire"),)),
    "failed": Recipe(
        (("create", 0), ("wait", "lease")), lease=SHORT, allow_reacquire=False, clock=(("active", "lost"),)
    ),
    ACA: Recipe((("claim", 0), ("close_run",)), runs=2),
}
# Sessions made only for a clock event: (state it fires in, event) -> recipe ending in the state it leads to.
CLOCK_RECIPES: dict[tuple[str, str], Recipe] = {
    ("active", "ttl_expire"): Recipe((("create", 0), ("wait", "ttl")), ttl=SHORT),
    ("reacquired", "lease_expire"): Recipe(
        (("create", 0), ("wait", "lease"), ("create", 1), ("wait", "lease")), lease=SHORT
    ),
    ("reacquired", "holder_stale"): Recipe((*_REACQUIRE, ("leave", 1)), lease=SHORT),
    ("reacquired", "ttl_expire"): Recipe(
        (("create", 0), ("wait", "lease"), ("create", 1), ("heartbeat", 1, LEASE), ("wait", "ttl")),
        lease=SHORT,
        ttl=TTL,
    ),
    ("expired", "ttl_expire"): Recipe(
        (("create", 0), ("wait", "lease"), ("poke", 2), ("wait", "ttl")), lease=SHORT, ttl=TTL
    ),
    ("orphaned", "ttl_expire"): Recipe(
        (("create", 0), ("leave", 0), ("poke", 2), ("wait", "phase"), ("wait", "ttl")), ttl=TTL
    ),
    (ACA, "lease_expire"): Recipe((("claim", 0), ("close_run",), ("wait", "lease")), lease=SHORT),
    (ACA, "holder_stale"): Recipe((("claim", 0), ("close_run",), ("leave", 0))),
    (ACA, "lost"): Recipe((("claim", 0), ("close_run",), ("wait", "lease")), lease=SHORT, allow_reacquire=False),
    (ACA, "ttl_expire"): Recipe((("claim", 0), ("close_run",), ("wait", "ttl")), ttl=SHORT),
}


def _changes(state: str, operation: str, actor: Actor) -> bool:
    """Whether the call changes the session's state (or leaves no in-session task to claim): it then ends its
    instance."""
    if operation == "close_run":
        return True  # an active session has an in-session activity whose run closed; no task of it to claim
    if operation == "claim_in_session":
        # An admitted claim creates the session, or reacquires an expired or orphaned one (its holder that left
        # is refused as not registered).
        return state in ("none", "expired") or (state == "orphaned" and actor is not Actor.HOLDER)
    if operation == "create":
        # A create makes a new session, or reacquires an expired or orphaned one — except for the holder that
        # left (deregistered: it is refused as not registered).
        return state in ("none", "expired") or (state == "orphaned" and actor is not Actor.HOLDER)
    return operation == "close" and actor is Actor.HOLDER and state in ("active", "reacquired", "expired", "orphaned")


def _arrange(state: str, keep: Calls, ending: Calls) -> list[Calls]:
    """The usual instances, and the claims the rules refuse in an instance of their own: those are made last, all
    together (each is an empty poll that holds the target's clock)."""
    refused = [oa for oa in keep if oa[0] == "claim_in_session" and claim_refused(state, oa[1])]
    keep = [oa for oa in keep if oa not in refused]
    return [*(one_change_each(state, keep, ending) if keep or ending else []), *([refused] if refused else [])]


def deferred(state: str, calls: list[tuple[str, Actor]]) -> bool:
    """Whether an instance's calls are all claims the rules refuse (made together, after every phase)."""
    return bool(calls) and all(op == "claim_in_session" and claim_refused(state, actor) for op, actor in calls)


def cold_plan(hits: dict[str, int] | Any) -> list[tuple[Recipe, str, list[tuple[str, Actor]]]]:
    """The instances to make: (recipe, state, calls), each call list with the one call that changes the session
    (if any) last; then one instance per cold clock cell, with a heartbeat by the holder as its call."""
    entity = next(e for e in ENTITIES if e.name == "worker_session")
    reachable = {c.key for c in cells(entity) if c.ruled_out is None}
    plan: list[tuple[Recipe, str, list[tuple[str, Actor]]]] = []
    covered: set[tuple[str, str]] = set()
    for state, instances in plan_cold_cells(
        "worker_session", list(RECIPES), ORDER, _changes, hits, arrange=_arrange
    ).items():
        recipe = RECIPES[state]
        plan.extend((recipe, state, calls) for calls in instances)
        covered.update(recipe.clock)
    for (state, event), recipe in CLOCK_RECIPES.items():
        key = f"worker_session/{state}/{event}/{Actor.CLOCK}"
        if key in reachable and not hits.get(key) and (state, event) not in covered:
            plan.append((recipe, "closed", [("heartbeat", Actor.HOLDER)]))
    return plan


@dataclass(eq=False)
class Instance:
    recipe: Recipe
    state: str
    calls: list[tuple[str, Actor]]
    workers: list[str]
    session: ShadowSession
    queue: str
    segments: list[list[Step]] = field(default_factory=list)
    waits: list[str] = field(default_factory=list)
    acts: InSession | None = None  # its in-session activities, when it has in-session calls


def sweep_cold_cells(m: SessionMachine) -> None:
    """Make every cold call and clock event the plan names; the instances advance together, phase by phase."""
    plan = cold_plan(m.cells)
    if not plan:
        return
    started = [m.sweep_start(lambda r=r, s=s, c=c: _start(m, r, s, c)) for r, s, c in plan]
    instances = [i for i in started if i is not None]
    if not instances:
        return
    phases = max(len(i.segments) for i in instances)
    later: list[tuple[Instance, str]] = []  # the refused claims, made together at the end
    for phase in range(phases):
        for inst in instances:
            if phase < len(inst.segments):
                for step in inst.segments[phase]:
                    _step(m, inst, step)
                if phase == len(inst.segments) - 1:
                    _act(m, inst, later)
        due = [_due(i, i.waits[phase]) for i in instances if phase < len(i.waits) and not i.session.unsure]
        known = [d for d in due if d is not None]
        if known:
            m.run(m.ctx.wait(until=max(known) + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))
    if later:
        back = _on_all(m, [inst for inst, _ in later])
        try:
            claims_at_once(m, later)
        finally:
            back()
    judge_histories(m, instances)


def _start(m: SessionMachine, recipe: Recipe, state: str, calls: list[tuple[str, Actor]]) -> Instance:
    in_session = any(op in IN_SESSION for op, _ in calls) or any(s[0] in ("claim", "close_run") for s in recipe.steps)
    # In-session activities are routed by queue: such an instance has an activity queue of its own.
    queue = m.ctx.uid("q") if in_session else m.queue
    workers = [m.run(m.ctx.register(queue)) for _ in range(3)]
    session = ShadowSession(m.ctx.uid("s"), allow_reacquire=recipe.allow_reacquire, lease=recipe.lease, ttl=recipe.ttl)
    inst = Instance(recipe, state, calls, workers, session, queue)
    if in_session:
        inst.acts = start_activities(m, inst, recipe.runs)
    steps = [("claim", *s[1:]) if in_session and s[0] == "create" else s for s in recipe.steps]
    segment: list[Step] = []
    for step in steps:
        if step[0] == "wait":
            inst.segments.append(segment)
            inst.waits.append(step[1])
            segment = []
        else:
            segment.append(step)
    inst.segments.append(segment)
    return inst


def _due(inst: Instance, what: str) -> datetime | None:
    s = inst.session
    return {"lease": s.lease_until, "ttl": s.ttl_until}.get(what)


def _on(m: SessionMachine, inst: Instance) -> Callable[[], None]:
    """Point the machine at the instance's workers and session (its rules read them), and back."""
    return _on_all(m, [inst])


def _on_all(m: SessionMachine, instances: list[Instance]) -> Callable[[], None]:
    """Point the machine at the workers and sessions of ``instances`` (each worker is one instance's), and back."""
    workers, sessions = m.workers, m.sessions
    m.workers = [w for inst in instances for w in inst.workers]
    m.sessions = list({id(inst.session): inst.session for inst in instances}.values())

    def back() -> None:
        m.workers, m.sessions = workers, sessions

    return back


def _step(m: SessionMachine, inst: Instance, step: Step) -> None:
    if inst.session.unsure:
        return
    back = _on(m, inst)
    try:
        if step[0] == "close_run":
            close_run(m, inst, 0)
            return
        verb, worker = step[0], inst.workers[step[1]]
        if verb == "create":
            m.do_create(inst.session, worker)
        elif verb == "heartbeat":
            m.do_heartbeat(inst.session, worker, step[2])
        elif verb == "close":
            m.do_close(inst.session, worker)
        elif verb == "poke":
            m.do_heartbeat(inst.session, worker)  # refused; the target settles the session first
        elif verb == "leave":
            m.deregister(worker)
        elif verb == "claim":
            claim(m, inst, worker)
    finally:
        back()


def _worker(inst: Instance, actor: Actor) -> str | None:
    s = inst.session
    if actor is Actor.HOLDER:
        return s.owner
    if actor is Actor.FORMER_HOLDER:
        return next((w for w in reversed(s.holders) if w != s.owner), None)
    return next((w for w in inst.workers if w not in s.holders), None)


def _act(m: SessionMachine, inst: Instance, later: list[tuple[Instance, str]]) -> None:
    back = _on(m, inst)
    try:
        for operation, actor in inst.calls:
            worker = _worker(inst, actor)
            if inst.session.unsure:
                return
            if operation == "close_run":
                close_run(m, inst)
                continue
            if worker is None:
                continue
            if operation == "claim_in_session" and deferred(inst.state, inst.calls):
                later.append((inst, worker))
            elif operation == "claim_in_session":
                claim(m, inst, worker)
            elif operation == "activity_heartbeat_in_session":
                heartbeat(m, inst, worker)
            elif operation == "create":
                m.do_create(inst.session, worker)
            elif operation == "heartbeat":
                m.do_heartbeat(inst.session, worker)
            else:
                m.do_close(inst.session, worker)
    finally:
        back()
