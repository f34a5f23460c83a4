"""The machines' shadows of the target: runs and workflow tasks as the model believes the target holds them.

A shadow changes state only through the model's lifecycle tables (:mod:`suite.protocol.lifecycles`):
:meth:`RunShadow.step` and :meth:`TaskShadow.step` look the (state, event) pair up in ``RUN`` and
``WORKFLOW_TASK`` and raise :class:`~suite.protocol.errors.IllegalTransition` on a pair the table does not have
(the machine then misread the target: a harness error, never the target's failure). The one exception: after a
step whose answer was lost ("maybe applied") the shadow's state is only a guess; a step the caller marks
``unsure`` whose pair the table lacks takes the one state that event leads to (:func:`advance`): the target's
answer says the event happened. Activity shadows (:mod:`suite.machines.activity_oracle`) step the same way.

Machines extend these with what they track besides (a run's task slot, its activities, its queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from suite.protocol.fencing import WorkflowTaskView
from suite.protocol.lifecycles import (
    CANCELLATION_REQUEST,
    CHILD,
    RUN,
    RUN_CLOSED_REASONS,
    RUN_LIVE_STATUSES,
    WORKFLOW_TASK,
    CancellationRequestEvent,
    CancellationRequestStatus,
    ChildEvent,
    ChildStatus,
    Lifecycle,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
)

__all__ = [
    "CLOSE_EVENTS",
    "ChildShadow",
    "RequestShadow",
    "RunShadow",
    "TaskShadow",
    "advance",
    "workflow_view",
]

S = TypeVar("S", bound=StrEnum)

# Control-plane verb -> the run event it is (§12.2 "Cancel and terminate close the run immediately").
CLOSE_EVENTS: dict[str, RunEvent] = {"cancel": RunEvent.CANCEL, "terminate": RunEvent.TERMINATE}


def advance(machine: Lifecycle[S, Any], state: S, event: StrEnum, unsure: bool = False) -> S:
    """The one transition function of every shadow: ``machine.step(state, event)``. For an ``unsure`` shadow
    whose pair the table lacks, the one state ``event`` leads to from anywhere: the target's answer says the
    event happened, and the shadow's state was a guess."""
    if unsure and not machine.can(state, event):
        targets = {target for (_, e), target in machine.table.items() if e == event}
        if len(targets) == 1:
            return targets.pop()
    return machine.step(state, event)


@dataclass(eq=False, kw_only=True)
class RunShadow:
    """One run: its status (a ``RUN`` state), closed reason, and whether a request about it went unanswered."""

    workflow_id: str
    run_id: str
    status: RunStatus = RunStatus.PENDING
    closed_reason: str | None = None
    uncertain: bool = False  # a request about it got no answer: maybe applied

    @property
    def open(self) -> bool:
        return self.status in RUN_LIVE_STATUSES

    def step(self, event: RunEvent, *, unsure: bool = False) -> None:
        """Move through the ``RUN`` table; a closing event records its closed reason (§12.2, §8.7.1)."""
        self.status = advance(RUN, self.status, event, unsure or self.uncertain)
        if event in RUN_CLOSED_REASONS:
            self.closed_reason = RUN_CLOSED_REASONS[event]

    def __repr__(self) -> str:  # shown in Hypothesis' step listing
        return f"{type(self).__name__}({self.workflow_id!r})"


# A workflow task shadow is born from a lease: ready, then claimed.
_BORN = WORKFLOW_TASK.step(TaskStatus.READY, TaskEvent.CLAIM)


@dataclass(eq=False, kw_only=True)
class TaskShadow:
    """One workflow task as leased to the machine: a ``WORKFLOW_TASK`` state plus the lease fencing fields.

    The machine learns of a task from a lease, so a shadow is born from ``ready`` by a claim."""

    task_id: str
    owner: str
    attempt: int
    expires: datetime
    status: TaskStatus = _BORN
    uncertain: bool = False
    holders: list[str] = field(default_factory=list)  # every worker that leased it, in order (owner last)

    def __post_init__(self) -> None:
        if not self.holders:
            self.holders.append(self.owner)

    def step(self, event: TaskEvent, *, unsure: bool = False) -> None:
        self.status = advance(WORKFLOW_TASK, self.status, event, unsure or self.uncertain)

    def claim(self, owner: str, attempt: int, expires: datetime) -> None:
        """A poll leased the task to ``owner``: a redelivery of a leased task is its expiry, then a claim
        (§9.1 "Lease expiry, then recovery. Same task_id; the next claim bumps the attempt"). The caller has
        judged the lease; a task the shadow holds closed can only be leased again when a maybe-applied report
        left it guessing, so the lease is taken as the target gives it."""
        if self.status is TaskStatus.LEASED:
            self.step(TaskEvent.EXPIRE)
        self.step(TaskEvent.CLAIM, unsure=self.status is not TaskStatus.READY)
        self.owner, self.attempt, self.expires = owner, attempt, expires
        self.holders.append(owner)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.task_id!r}#{self.attempt})"


def workflow_view(task: TaskShadow, run: RunShadow) -> WorkflowTaskView:
    """What the §8.9 guard knows of ``task`` of ``run`` (the model never knows when a run closed)."""
    return WorkflowTaskView(
        task.task_id, task.status, task.attempt, task.owner, task.expires, run.status, run.closed_reason, None
    )


@dataclass(eq=False, kw_only=True)
class ChildShadow:
    """One ``start_child_workflow`` call: a ``CHILD`` state, its parent's run and its current child run.
    ``closing`` is the parent-close policy under which the parent closed while the child run was open (None: the
    parent is open, or closed after the child); ``second``: another child of the same parent closed before it."""

    parent: RunShadow
    policy: str
    workflow_id: str = ""
    call_id: str = ""
    run: RunShadow | None = None
    status: ChildStatus = CHILD.initial
    closing: str | None = None
    second: bool = False
    unsure: bool = False

    @property
    def uncertain(self) -> bool:
        return self.unsure or self.parent.uncertain or self.run is None or self.run.uncertain

    def step(self, event: ChildEvent) -> None:
        self.status = advance(CHILD, self.status, event, self.uncertain)


@dataclass(eq=False, kw_only=True)
class RequestShadow:
    """One cooperative cancellation request to a child: a ``CANCELLATION_REQUEST`` state, its identity and
    deadline as the child's history recorded them, and what the model knows of its deliveries. ``later``: a child
    task after the one the delivery was committed on has carried it; ``by_deadline``: the server resolved it by
    closing the child at its cleanup deadline."""

    child: ChildShadow
    request_id: str
    deadline: datetime
    status: CancellationRequestStatus = CANCELLATION_REQUEST.initial
    delivered_on: str | None = None
    later: bool = False
    by_deadline: bool = False

    @property
    def uncertain(self) -> bool:
        return self.child.uncertain

    def step(self, event: CancellationRequestEvent) -> None:
        self.status = advance(CANCELLATION_REQUEST, self.status, event, self.uncertain)
