"""Which coverage cell (:mod:`suite.protocol.coverage`) an exchange of a machine hits, from the shadows the machine
already tracks and, where the model cannot tell on its own, the answer.

Each classifier returns the cover state's name, or ``None`` when the shadow is a guess (a request about it went
unanswered) or the moment is too close to a lease expiry for the model to say which side of it the call landed
on and the answer does not settle it: such an exchange is judged but counted in no cell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from suite.protocol.coverage import ENTITIES, Actor, cells
from suite.protocol.lifecycles import AttemptStatus, CancellationRequestStatus, ChildStatus, RunStatus, TaskStatus
from suite.protocol.sessions import SessionEvent, SessionStatus

from .world import ChildShadow, RequestShadow, RunShadow, TaskShadow

if TYPE_CHECKING:
    from .activity_oracle import Attempt
    from .messages import MessageRun
    from .session_shadow import ShadowSession

__all__ = [
    "SESSION_CLOCK_OPERATIONS",
    "Calls",
    "Plan",
    "SweepInstance",
    "attempt_actor",
    "attempt_state",
    "cancellation_state",
    "child_state",
    "one_change_each",
    "plan_cold_cells",
    "run_state",
    "session_actor",
    "session_state",
    "task_actor",
    "task_state",
    "update_state",
]

# Per cover state, the instances a sweep makes: each the (operation, actor) calls made on one entity in that state.
Calls = list[tuple[str, Actor]]
Plan = dict[str, list[Calls]]

_CLOSED_TASK = {TaskStatus.COMPLETED: "completed", TaskStatus.FAILED: "failed", TaskStatus.CANCELLED: "run_closed"}


def task_state(task: TaskShadow, run: RunShadow, now: datetime, margin: float, got: str | None = None) -> str | None:
    """The workflow task's cover state when a call left at ``now`` (``got``: what it answered, if it did)."""
    if task.uncertain or run.uncertain:
        return None
    if task.status in _CLOSED_TASK:
        return _CLOSED_TASK[task.status]
    if not run.open:
        return "run_closed"  # cancelled or terminated with the task ready or leased: the task is closed with it
    if task.status is TaskStatus.READY:
        return "requeued" if task.holders else "ready"
    if abs((task.expires - now).total_seconds()) < margin:
        # Either side of the expiry: the answer says which, or nothing does.
        if got == "lease_expired":
            expired = True
        elif got == "ok":
            expired = False
        else:
            return None
    else:
        expired = task.expires <= now
    if expired:
        return "lease_expired"
    return "redelivered" if len(set(task.holders)) > 1 else "leased"


def task_actor(task: TaskShadow, worker: str) -> Actor:
    """Who ``worker`` is to the task: its (last) holder, a holder before it, or a worker that never held it. A
    task ready again (its holder deregistered) has no holder: its last one is a former holder."""
    if worker == task.owner and task.status is not TaskStatus.READY:
        return Actor.HOLDER
    return Actor.FORMER_HOLDER if worker in task.holders else Actor.OTHER_WORKER


def run_state(run: RunShadow, generation: int = 1) -> str | None:
    """The run's cover state; ``generation`` is its run number (> 1: it began with a continue-as-new)."""
    if run.uncertain:
        return None
    if generation > 1 and run.status is RunStatus.PENDING:
        return "continued"  # the new run resuming, before its first workflow task completed
    return run.status.value


_CLOSED_ATTEMPT = {
    AttemptStatus.COMPLETED: "completed",
    AttemptStatus.FAILED: "failed",
    AttemptStatus.CANCELLED: "cancelled",
    AttemptStatus.EXPIRED: "expired",
}


def redelivered(a: Attempt) -> bool:
    """Whether ``a`` is a new attempt of a task whose earlier attempt lost its lease (not a retry: a retry is
    a task of its own)."""
    return any(b.task_id == a.task_id and b.number < a.number for b in a.execution.attempts)


def attempt_state(a: Attempt, now: datetime, margin: float) -> str | None:
    """The activity attempt's cover state when a call about it left at ``now``. The model learns of an expiry
    from answers; the clock alone says an attempt's lease or start_to_close has run out when it ran out more
    than ``margin`` ago (within it, either side: no cell)."""
    e = a.execution
    if not e.certain:
        return None
    if a.status in _CLOSED_ATTEMPT:
        return _CLOSED_ATTEMPT[a.status]
    ends = [a.expires, *([a.deadline] if a.deadline is not None else [])]
    if any(abs((t - now).total_seconds()) < margin for t in ends):
        return None
    lapsed = any(t <= now for t in ends)
    if not e.run.open:
        # §11.5: closing the run closed the running attempt as cancelled (unless it had run out before).
        return None if lapsed or a.maybe_timed_out else "cancelled"
    if lapsed:
        return "expired"
    return "redelivered" if redelivered(a) else "running"


def attempt_actor(a: Attempt, worker: str, state: str) -> Actor:
    """Who ``worker`` is to attempt ``a``: its holder, the holder of the earlier attempt of its task (while the
    redelivered attempt runs: the one state where the model tells a former holder apart), or another worker."""
    if worker == a.owner:
        return Actor.HOLDER
    earlier = {b.owner for b in a.execution.attempts if b.task_id == a.task_id and b.number < a.number}
    return Actor.FORMER_HOLDER if state == "redelivered" and worker in earlier else Actor.OTHER_WORKER


# The worker-session operation that stands for each clock event of the session table.
SESSION_CLOCK_OPERATIONS = {
    SessionEvent.LEASE_EXPIRE: "lease_expire",
    SessionEvent.HOLDER_STALE: "holder_stale",
    SessionEvent.FAIL: "lost",
    SessionEvent.TTL_EXPIRE: "ttl_expire",
}


def session_state(session: ShadowSession) -> str | None:
    """The worker session's cover state as the shadow holds it (settled to the call's moment)."""
    if session.unsure:
        return None
    if session.status is SessionStatus.ACTIVE:
        if session.reacquired:
            return "reacquired"
        return "active_cancelled_activity" if session.cancelled_activity else "active"
    return session.status.value


def session_actor(session: ShadowSession, worker: str, state: str) -> Actor:
    """Who ``worker`` is to the session: its (last) holder, a worker that held it before another reacquired it
    (where the model tells one apart), or a worker that never held it."""
    if worker == session.owner and state != "none":
        return Actor.HOLDER
    former = worker in session.holders and state in ("reacquired", "closed", "failed")
    return Actor.FORMER_HOLDER if former else Actor.OTHER_WORKER


def update_state(run: MessageRun, update_id: str) -> str | None:
    """The update's cover state: accepted and open, closed by a workflow task (completed or failed), or left
    open when its run closed (rejected); None when the model cannot say."""
    if run.uncertain:
        return None
    if update_id in run.closed_updates:
        return run.update_outcomes.get(update_id)
    if update_id in run.open_updates:
        return "accepted" if run.open else "rejected"
    return None


def child_state(child: ChildShadow) -> str | None:
    """The child call's cover state: its parent closed with it open (under the policy it was started with), then
    by its own status; a completed child is the parent's second result when another child of that parent closed
    before it. None when a request about the parent or the child went unanswered."""
    if child.uncertain:
        return None
    if child.closing is not None:
        return f"parent_closing_{child.closing}"
    if child.status is ChildStatus.COMPLETED and child.second:
        return "second_result"
    return child.status.value


def cancellation_state(request: RequestShadow, now: datetime, margin: float) -> str | None:
    """The cooperative cancellation request's cover state when a call left at ``now``: resolved by the child or
    by its deadline (past_deadline), else by whether a delivery was committed and a later child task carried it.
    Within ``margin`` of the cleanup deadline either side may hold (no cell); past it, an unresolved request is one
    the model has not yet seen resolved (no cell either)."""
    if request.uncertain:
        return None
    if request.status is CancellationRequestStatus.RESOLVED:
        return "past_deadline" if request.by_deadline else "resolved"
    if (request.deadline - now).total_seconds() < margin:
        return None
    if request.status is CancellationRequestStatus.REQUESTED:
        return "requested"
    return "delivered_again" if request.later else "delivered"


def one_change_each(state: str, keep: Calls, ending: Calls) -> list[Calls]:
    """The usual instances of a state: the calls that leave the entity as it is, then the first that changes it;
    every further changing call an instance of its own."""
    return [keep + ending[:1], *([oa] for oa in ending[1:])]


def plan_cold_cells(
    entity: str,
    states: Sequence[str],
    order: Sequence[str],
    changes: Callable[[str, str, Actor], bool],
    hits: Mapping[str, int],
    *,
    swept: Callable[[str, str], bool] | None = None,
    holder_last: bool = False,
    arrange: Callable[[str, Calls, Calls], list[Calls]] = one_change_each,
) -> Plan:
    """The reachable cells of ``entity`` in ``states`` that ``hits`` has not counted, for the operations in
    ``order`` (and, where given, those ``swept(state, operation)`` allows), as the instances a sweep makes. Per
    state the cold calls go in ``order`` (with ``holder_last``, the holder's after the others' of the same
    operation), split into those that leave the entity as it is and those that ``changes`` (each ends an
    instance), and ``arrange`` makes the instances of them."""
    model = next(e for e in ENTITIES if e.name == entity)
    plan: Plan = {}
    for state in states:
        cold = [
            (c.operation, c.actor)
            for c in cells(model)
            if c.state == state
            and c.ruled_out is None
            and c.operation in order
            and (swept is None or swept(state, c.operation))
            and not hits.get(c.key)
        ]
        if not cold:
            continue
        cold.sort(key=lambda oa: (order.index(oa[0]), holder_last and oa[1] is Actor.HOLDER))
        keep = [oa for oa in cold if not changes(state, *oa)]
        ending = [oa for oa in cold if changes(state, *oa)]
        plan[state] = arrange(state, keep, ending)
    return plan


@dataclass(eq=False)
class SweepInstance:
    """One entity a sweep brings into one ``state``, on a queue of its own with its own ``workers``, and the
    ``calls`` of the plan to make on it there."""

    state: str
    calls: list[tuple[str, Actor]]
    queue: str
    workers: list[str]
