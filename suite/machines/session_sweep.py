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
from .cells import plan_cold_cells
from .session_shadow import LEASE, ShadowSession

# The machine is suite.machines.sessions', which imports this module: typed loosely so they do not import each
# other.
SessionMachine = Any

__all__ = ["RECIPES", "cold_plan", "sweep_cold_cells"]

ORDER = ("heartbeat", "close", "create")
SHORT = 1  # seconds: the lease (or TTL) a sweep session lets lapse
TTL = 5  # seconds: an absolute TTL that ends after a first lapse, and the calls after it, by more than the margin

# A recipe brings a session into its state: ("create", worker), ("heartbeat", worker, lease seconds),
# ("close", worker), ("leave", worker: its deregistration), ("poke", worker: any call, so the target settles the
# session now), ("wait", "lease" | "ttl" | "phase": the phase ends, and the clock passes the session's lease or
# TTL, or what the other sessions wait for).
Step = tuple[Any, ...]


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]
    lease: int = LEASE
    ttl: int | None = None
    allow_reacquire: bool = True
    clock: tuple[tuple[str, str], ...] = ()  # the clock cells (state, operation) its first call after a wait meets


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
}


def _changes(state: str, operation: str, actor: Actor) -> bool:
    """Whether the call changes the session's state: it then ends its instance."""
    if operation == "create":
        # A create makes a new session, or reacquires an expired or orphaned one — except for the holder that
        # left (deregistered: it is refused as not registered).
        return state in ("none", "expired") or (state == "orphaned" and actor is not Actor.HOLDER)
    return operation == "close" and actor is Actor.HOLDER and state in ("active", "reacquired", "expired", "orphaned")


def cold_plan(hits: dict[str, int] | Any) -> list[tuple[Recipe, str, list[tuple[str, Actor]]]]:
    """The instances to make: (recipe, state, calls), each call list with the one call that changes the session
    (if any) last; then one instance per cold clock cell, with a heartbeat by the holder as its call."""
    entity = next(e for e in ENTITIES if e.name == "worker_session")
    reachable = {c.key for c in cells(entity) if c.ruled_out is None}
    plan: list[tuple[Recipe, str, list[tuple[str, Actor]]]] = []
    covered: set[tuple[str, str]] = set()
    for state, instances in plan_cold_cells("worker_session", list(RECIPES), ORDER, _changes, hits).items():
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
    segments: list[list[Step]] = field(default_factory=list)
    waits: list[str] = field(default_factory=list)


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
    for phase in range(phases):
        for inst in instances:
            if phase < len(inst.segments):
                for step in inst.segments[phase]:
                    _step(m, inst, step)
                if phase == len(inst.segments) - 1:
                    _act(m, inst)
        due = [_due(i, i.waits[phase]) for i in instances if phase < len(i.waits) and not i.session.unsure]
        known = [d for d in due if d is not None]
        if known:
            m.run(m.ctx.wait(until=max(known) + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))


def _start(m: SessionMachine, recipe: Recipe, state: str, calls: list[tuple[str, Actor]]) -> Instance:
    workers = [m.run(m.ctx.register(m.queue)) for _ in range(3)]
    session = ShadowSession(m.ctx.uid("s"), allow_reacquire=recipe.allow_reacquire, lease=recipe.lease, ttl=recipe.ttl)
    inst = Instance(recipe, state, calls, workers, session)
    segment: list[Step] = []
    for step in recipe.steps:
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
    workers, sessions = m.workers, m.sessions
    m.workers, m.sessions = inst.workers, [inst.session]

    def back() -> None:
        m.workers, m.sessions = workers, sessions

    return back


def _step(m: SessionMachine, inst: Instance, step: Step) -> None:
    if inst.session.unsure:
        return
    back = _on(m, inst)
    try:
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
    finally:
        back()


def _worker(inst: Instance, actor: Actor) -> str | None:
    s = inst.session
    if actor is Actor.HOLDER:
        return s.owner
    if actor is Actor.FORMER_HOLDER:
        return next((w for w in reversed(s.holders) if w != s.owner), None)
    return next((w for w in inst.workers if w not in s.holders), None)


def _act(m: SessionMachine, inst: Instance) -> None:
    back = _on(m, inst)
    try:
        for operation, actor in inst.calls:
            worker = _worker(inst, actor)
            if inst.session.unsure:
                return
            if worker is None:
                continue
            if operation == "create":
                m.do_create(inst.session, worker)
            elif operation == "heartbeat":
                m.do_heartbeat(inst.session, worker)
            else:
                m.do_close(inst.session, worker)
    finally:
        back()
