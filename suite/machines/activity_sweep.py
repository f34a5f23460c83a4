"""The activity machine's sweep: a deterministic phase after its examples over the activity-attempt cells
(:mod:`suite.protocol.coverage`) the examples left cold.

The sweep brings one activity attempt into each state that still has cold cells — running, redelivered to
another worker after its lease lapsed, its lease lapsed and not yet redelivered, completed, failed, its run
cancelled — and makes each cold call there by each actor: the holder, the worker that held the task before (a
redelivered attempt only), a worker that never held it, the operator closing the run. Each state gets a queue
of its own and three workers, so a poll there is about that one attempt. Calls that leave the attempt as it is
come first; a call that changes it (the holder's complete or fail, closing the run) ends its instance, and each
further one gets a fresh instance. Every call goes through the machine's own report and close steps, so the
activity model judges every answer as it judges the examples', and the histories the sweep touched are read
back and judged by the history oracle.

A target whose activity leases are longer than ``--max-wait`` allows is swept without the states that need an
expiry (their cells stay not reached, and the matrix says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from suite.protocol.coverage import Actor

from .activity_oracle import Attempt
from .base import EXPIRY_STEP
from .cells import Plan, SweepInstance, plan_cold_cells

# The machine is suite.machines.activities', which imports this module: typed loosely so they do not import
# each other.
ActivityMachine = Any

__all__ = ["cold_plan", "sweep_cold_cells"]

ORDER = ("heartbeat", "fail", "complete", "close_run")
WHO = {Actor.HOLDER: "owner", Actor.FORMER_HOLDER: "former", Actor.OTHER_WORKER: "other"}
# The clock's own event (expire) is observed as the other calls meet it: a redelivery, a stale answer.
SWEPT_STATES = ("running", "completed", "failed", "cancelled", "expired", "redelivered")
EXPIRING = ("expired", "redelivered")


def _changes(state: str, operation: str, actor: Actor) -> bool:
    """Whether the call changes the attempt (or closes its run): it then ends its instance."""
    if operation == "close_run":
        return state != "cancelled"
    return operation in ("complete", "fail") and actor is Actor.HOLDER and state in ("running", "redelivered")


# cold_plan(hits): per swept state, the instances to make for the reachable activity-attempt cells not hit yet.
cold_plan: Callable[[Mapping[str, int]], Plan] = partial(
    plan_cold_cells, "activity_attempt", SWEPT_STATES, ORDER, _changes
)


@dataclass(eq=False)
class Instance(SweepInstance):
    """One activity attempt brought into one state, on an activity queue of its own."""

    attempt: Attempt | None = None


def sweep_cold_cells(m: ActivityMachine) -> None:
    """Make every cold activity-attempt call the plan names: the states that need no expiry first, then those
    that need one (every lease of the group waited out once for all)."""
    specs = [(state, calls) for state, instances in cold_plan(m.cells).items() for calls in instances]
    expiring = m.lease_wait_fits
    for needs_expiry in (False, True):
        group = [(s, c) for s, c in specs if (s in EXPIRING) == needs_expiry]
        if not group or (needs_expiry and not expiring):
            continue
        started = [m.sweep_start(lambda s=state, c=calls: _start(m, s, c)) for state, calls in group]
        instances = [i for i in started if i is not None]
        if needs_expiry:
            _wait_expiry(m, [i.attempt for i in instances if i.attempt is not None])
        for inst in instances:
            _settle(m, inst)
            _act(m, inst)
        m.histories_agree()
    if expiring and not m.cells.get(LAPSE_AFTER_REDELIVERY):
        _lapse_after_redelivery(m)


LAPSE_AFTER_REDELIVERY = "activity_attempt/redelivered/expire/clock"


def _lapse_after_redelivery(m: ActivityMachine) -> None:
    """A redelivered attempt whose lease lapses in turn: its holder's heartbeat then learns the clock ended it."""
    inst = m.sweep_start(lambda: _start(m, "redelivered", []))
    if inst is None:
        return
    _wait_expiry(m, [inst.attempt] if inst.attempt is not None else [])
    _settle(m, inst)
    if inst.attempt is None:
        return
    _wait_expiry(m, [inst.attempt])
    _on(m, inst)
    m.report(inst.attempt, "owner", "heartbeat")
    m.histories_agree()


def _on(m: ActivityMachine, inst: Instance) -> None:
    m.queue, m.workers = inst.queue, inst.workers


def _start(m: ActivityMachine, state: str, calls: list[tuple[str, Actor]]) -> Instance:
    """A run on a fresh activity queue scheduling one activity without a retry policy (one attempt: its failure
    is final), leased by the queue's first worker."""
    queue = m.ctx.uid("aq")
    inst = Instance(state, calls, queue, [m.run(m.ctx.register(queue)) for _ in range(3)])
    _on(m, inst)
    m.start_run([(None, False)])
    inst.attempt = m.adopt(m.poll_activity(inst.workers[0]), inst.workers[0])
    return inst


def _wait_expiry(m: ActivityMachine, attempts: list[Attempt]) -> None:
    """Until every lease has lapsed by more than the machine's margin: then the model knows, from the clock,
    that each call after it meets an attempt whose lease ran out."""
    live = [a for a in attempts if a.execution.certain]
    if live:
        latest = max(a.expires for a in live)
        m.run(m.ctx.wait(until=latest + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))


def _settle(m: ActivityMachine, inst: Instance) -> None:
    """Bring the leased attempt from running into the instance's state."""
    a = inst.attempt
    if a is None or not a.execution.certain:
        return
    _on(m, inst)
    if inst.state == "completed":
        m.report(a, "owner", "complete")
    elif inst.state == "failed":
        m.report(a, "owner", "fail")
    elif inst.state == "cancelled":
        m.close_attempts_run(a.execution.run, "cancel")
    elif inst.state == "redelivered":
        # The second worker is handed the task again: a new attempt; the first worker is its former holder.
        again = m.adopt(m.poll_activity(inst.workers[1]), inst.workers[1])
        inst.attempt = again if again is not None and again.task_id == a.task_id else None
        if inst.attempt is not None:
            m.report(inst.attempt, "owner", "heartbeat")  # a fresh lease for the calls that follow


def _act(m: ActivityMachine, inst: Instance) -> None:
    a = inst.attempt
    if a is None:
        return
    _on(m, inst)
    for operation, actor in inst.calls:
        if not a.execution.certain:
            return
        if operation == "close_run":
            m.close_attempts_run(a.execution.run, "cancel")
        else:
            m.report(a, WHO[actor], operation)
