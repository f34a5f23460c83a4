"""The coverage model: every (state × operation or event × actor) cell of every entity with a lifecycle.

A machine that only reaches the histories someone named misses the bug that hides in a combination nobody named.
This module enumerates the combinations from the protocol model's own tables, so a run can say which it reached,
which the protocol rules out, and which it never reached.

- An :class:`Entity` wraps one lifecycle of :mod:`suite.protocol.lifecycles` (or the session machine of
  :mod:`suite.protocol.sessions`). Its :class:`CoverState` s are the lifecycle's states, some split into the
  transient states a judge must tell apart (a lease expired but not yet polled again, a task redelivered to another
  worker, a session reacquired, a child whose parent is closing under each parent-close policy, a cancellation
  delivered again or past its deadline). Every state of the lifecycle is covered by at least one cover state.
- Its :class:`Operation` s are the lifecycle's events, each given to the channel that causes it (a worker's call, an
  operator's control-plane call, the server's own clock), plus the calls that change no state (a history read, a
  heartbeat, a query). Every event of the lifecycle is given to an operation (:func:`validate`).
- The :class:`Actor` s: on the worker channel the lease holder, a former holder and another worker; on the control
  plane the operator; the clock alone fires clock events.

A cell is ruled out, with the sentence that says why, when its actor cannot exist in its state (there is no former
holder of a task nobody has held twice) or when it is a clock event the lifecycle's table has no row for in that
state. Every other cell is reachable: a worker's call in any state is answered, accepted or fenced, and that answer
is judged. A few reachable cells are impossible on a target by the values it advertises (its test profile): those
are not applicable there, with the sentence (:func:`target_ruled_out`), and no run against it is asked to reach
them. :func:`cells` is pure; :func:`matrix` folds a run's hit counts into per-entity rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from suite.protocol.commands import PARENT_CLOSE_POLICIES
from suite.protocol.lifecycles import (
    ACTIVITY_ATTEMPT,
    CANCELLATION_REQUEST,
    CHILD,
    QUERY_TASK,
    RUN,
    UPDATE,
    WORKFLOW_TASK,
    WORKFLOW_TASK_LEASE,
    AttemptEvent,
    AttemptStatus,
    CancellationRequestEvent,
    CancellationRequestStatus,
    ChildEvent,
    ChildStatus,
    LeaseEvent,
    LeaseState,
    Lifecycle,
    QueryTaskEvent,
    QueryTaskStatus,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
    UpdateEvent,
    UpdateStatus,
)
from suite.protocol.promises import advertised
from suite.protocol.sessions import SESSION, SessionEvent, SessionStatus
from suite.protocol.wording import plural

__all__ = [
    "ENTITIES",
    "Actor",
    "Cell",
    "Channel",
    "CoverState",
    "Entity",
    "EntityRow",
    "Operation",
    "applicable_entities",
    "cell_key",
    "cells",
    "known_cell",
    "matrix",
    "not_reached",
    "target_ruled_out",
    "validate",
]


class Actor(StrEnum):
    HOLDER = "holder"
    """The worker that holds (or last held) the entity's lease."""
    FORMER_HOLDER = "former_holder"
    """A worker that held it before, lost it, and another worker took it over."""
    OTHER_WORKER = "other_worker"
    """A registered worker that never held it."""
    OPERATOR = "operator"
    """A caller of the control plane."""
    CLOCK = "clock"
    """The server's own clock: expiries, timeouts, backoffs and deadlines."""


class Channel(StrEnum):
    WORKER = "worker"
    CONTROL = "control"
    CLOCK = "clock"


WORKER_ACTORS: Final = (Actor.HOLDER, Actor.FORMER_HOLDER, Actor.OTHER_WORKER)
ACTORS_OF: Final[Mapping[Channel, tuple[Actor, ...]]] = MappingProxyType(
    {Channel.WORKER: WORKER_ACTORS, Channel.CONTROL: (Actor.OPERATOR,), Channel.CLOCK: (Actor.CLOCK,)}
)

_ABSENT: Final[Mapping[Actor, str]] = MappingProxyType(
    {
        Actor.HOLDER: "nobody holds or has held it in this state, so there is no holder to act",
        Actor.FORMER_HOLDER: "no worker has lost it to another in this state, so there is no former holder",
        Actor.OTHER_WORKER: "no worker other than its holders exists for it in this state",
    }
)


@dataclass(frozen=True, slots=True)
class CoverState:
    """One state a judge tells apart: ``facets`` gives its value in each lifecycle the entity's clock events use
    (the entity's own lifecycle under its name, and e.g. the lease machine for a workflow task)."""

    name: str
    facets: Mapping[str, StrEnum]
    present: frozenset[Actor]
    description: str
    unnamed: bool = False  # no worker has been told the entity's id yet: only a poll can reach it
    # Operations the protocol's own rules make impossible in this state although the tables allow them in the
    # lifecycle state it stands for, each with the sentence that says why.
    impossible: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Operation:
    """A call or event that can happen to the entity. ``events`` are the lifecycle events it may fire when
    accepted (empty: it changes no state, e.g. a read); a clock operation fires its single event only where the
    named lifecycle's table has a row for it."""

    name: str
    channel: Channel
    events: tuple[StrEnum, ...] = ()
    lifecycle: str = ""  # the lifecycle a clock event steps ("" = the entity's own)
    actors: tuple[Actor, ...] = ()  # worker calls only the holder may make (e.g. a batch): narrower than the channel
    names_entity: bool = True  # False for a poll: it asks for work, it does not name a task

    @property
    def by(self) -> tuple[Actor, ...]:
        return self.actors or ACTORS_OF[self.channel]


@dataclass(frozen=True, slots=True)
class Entity:
    name: str
    capability: str | None  # advertised capability that brings it into a run (None: every 1.20 server)
    lifecycles: tuple[Lifecycle[Any, Any], ...]  # its own first
    states: tuple[CoverState, ...]
    operations: tuple[Operation, ...]
    lifecycle_by_name: Mapping[str, Lifecycle[Any, Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lifecycle_by_name", MappingProxyType({lc.name: lc for lc in self.lifecycles}))

    @property
    def lifecycle(self) -> Lifecycle[Any, Any]:
        return self.lifecycles[0]

    def state(self, name: str) -> CoverState:
        return next(s for s in self.states if s.name == name)

    def operation(self, name: str) -> Operation:
        return next(o for o in self.operations if o.name == name)


@dataclass(frozen=True, slots=True)
class Cell:
    entity: str
    state: str
    operation: str
    actor: Actor
    ruled_out: str | None  # the sentence that says why the protocol makes this cell impossible

    @property
    def key(self) -> str:
        return cell_key(self.entity, self.state, self.operation, self.actor)


def cell_key(entity: str, state: str, operation: str, actor: Actor | str) -> str:
    return f"{entity}/{state}/{operation}/{actor}"


def _st(
    name: str,
    facets: Mapping[str, StrEnum],
    present: Iterable[Actor],
    description: str,
    *,
    unnamed: bool = False,
    impossible: Mapping[str, str] | None = None,
) -> CoverState:
    return CoverState(
        name,
        MappingProxyType(dict(facets)),
        frozenset(present),
        description,
        unnamed,
        MappingProxyType(impossible or {}),
    )


_H, _F, _O = Actor.HOLDER, Actor.FORMER_HOLDER, Actor.OTHER_WORKER
_ALL_WORKERS = (_H, _F, _O)


# ---------------------------------------------------------------------------------------------------------
# The entities
# ---------------------------------------------------------------------------------------------------------


def _wt(status: TaskStatus, lease: LeaseState) -> dict[str, StrEnum]:
    return {WORKFLOW_TASK.name: status, WORKFLOW_TASK_LEASE.name: lease}


_T, _L = TaskStatus, LeaseState
WORKFLOW_TASK_ENTITY: Final = Entity(
    "workflow_task",
    None,
    (WORKFLOW_TASK, WORKFLOW_TASK_LEASE),
    (
        _st("ready", _wt(_T.READY, _L.NONE), (_O,), "ready and never leased", unnamed=True),
        _st("requeued", _wt(_T.READY, _L.NONE), (_F, _O), "ready again after its lease expired or its holder left"),
        _st("leased", _wt(_T.LEASED, _L.LIVE), (_H, _O), "leased by its first holder, lease live"),
        # A redelivered lease can expire too, so a former holder may be about.
        _st("lease_expired", _wt(_T.LEASED, _L.EXPIRED), _ALL_WORKERS, "the lease expired and no poll took it yet"),
        _st("redelivered", _wt(_T.LEASED, _L.LIVE), _ALL_WORKERS, "leased again, to another worker, after expiry"),
        _st("completed", _wt(_T.COMPLETED, _L.NONE), _ALL_WORKERS, "completed by its holder"),
        _st("failed", _wt(_T.FAILED, _L.NONE), _ALL_WORKERS, "failed by its holder"),
        _st("run_closed", _wt(_T.CANCELLED, _L.NONE), _ALL_WORKERS, "its run was cancelled or terminated"),
    ),
    (
        Operation("poll", Channel.WORKER, (TaskEvent.CLAIM,), names_entity=False),
        Operation("history", Channel.WORKER),
        Operation("heartbeat", Channel.WORKER),
        Operation("complete", Channel.WORKER, (TaskEvent.COMPLETE,)),
        Operation("fail", Channel.WORKER, (TaskEvent.FAIL,)),
        Operation("deregister", Channel.WORKER, (TaskEvent.ABANDON,), actors=(_H,)),
        Operation("signal", Channel.CONTROL),
        Operation("close_run", Channel.CONTROL, (TaskEvent.CANCEL,)),
        Operation("lapse", Channel.CLOCK, (LeaseEvent.LAPSE,), WORKFLOW_TASK_LEASE.name),
        # Recovery clears the expired lease (the lease table) and puts the task back to ready (the task table).
        Operation("recover", Channel.CLOCK, (LeaseEvent.RECOVER, TaskEvent.EXPIRE), WORKFLOW_TASK_LEASE.name),
    ),
)
# LeaseEvent rows a workflow-task operation stands for (validate() checks every lease event is given to one).
_LEASE_EVENTS_BY_OPERATION: Final[Mapping[str, tuple[LeaseEvent, ...]]] = MappingProxyType(
    {
        "poll": (LeaseEvent.CLAIM, LeaseEvent.REPLAY_POLL),
        "heartbeat": (LeaseEvent.RENEW,),
        "lapse": (LeaseEvent.LAPSE,),
        "recover": (LeaseEvent.RECOVER,),
        "complete": (LeaseEvent.RELEASE,),
        "fail": (LeaseEvent.RELEASE,),
        "deregister": (LeaseEvent.RELEASE,),
        "close_run": (LeaseEvent.RELEASE,),
    }
)

_R = RunStatus
RUN_ENTITY: Final = Entity(
    "run",
    None,
    (RUN,),
    (
        _st("pending", {RUN.name: _R.PENDING}, (_H,), "started, its first workflow task not yet completed"),
        _st("running", {RUN.name: _R.RUNNING}, (_H,), "a workflow task is open after the first"),
        _st("waiting", {RUN.name: _R.WAITING}, (_H,), "no open workflow task, an open wait"),
        _st("continued", {RUN.name: _R.RUNNING}, (_H,), "the first run after a continue-as-new, resuming"),
        _st("completed", {RUN.name: _R.COMPLETED}, (_H,), "completed"),
        _st("failed", {RUN.name: _R.FAILED}, (_H,), "failed (or timed out)"),
        _st("cancelled", {RUN.name: _R.CANCELLED}, (_H,), "cancelled from the control plane"),
        _st("terminated", {RUN.name: _R.TERMINATED}, (_H,), "terminated from the control plane"),
    ),
    (
        Operation("open_waits", Channel.WORKER, (RunEvent.BATCH_OPEN_WAITS,), actors=(_H,)),
        Operation("complete_workflow", Channel.WORKER, (RunEvent.BATCH_COMPLETE,), actors=(_H,)),
        Operation("fail_workflow", Channel.WORKER, (RunEvent.BATCH_FAIL,), actors=(_H,)),
        Operation("continue_as_new", Channel.WORKER, (RunEvent.BATCH_CONTINUE_AS_NEW,), actors=(_H,)),
        Operation("task_fail", Channel.WORKER, (RunEvent.TASK_FAIL,), actors=(_H,)),
        Operation("signal", Channel.CONTROL, (RunEvent.WAKE,)),
        Operation("read_history", Channel.CONTROL),
        Operation("cancel", Channel.CONTROL, (RunEvent.CANCEL,)),
        Operation("terminate", Channel.CONTROL, (RunEvent.TERMINATE,)),
        Operation("time_out", Channel.CLOCK, (RunEvent.TIME_OUT,)),
    ),
)

_A = AttemptStatus
ACTIVITY_ATTEMPT_ENTITY: Final = Entity(
    "activity_attempt",
    None,
    (ACTIVITY_ATTEMPT,),
    (
        _st("running", {ACTIVITY_ATTEMPT.name: _A.RUNNING}, (_H, _O), "claimed, lease live"),
        _st("redelivered", {ACTIVITY_ATTEMPT.name: _A.RUNNING}, _ALL_WORKERS, "a new attempt after a lease loss"),
        _st("completed", {ACTIVITY_ATTEMPT.name: _A.COMPLETED}, (_H, _O), "completed by its holder"),
        _st("failed", {ACTIVITY_ATTEMPT.name: _A.FAILED}, (_H, _O), "failed by its holder"),
        _st("cancelled", {ACTIVITY_ATTEMPT.name: _A.CANCELLED}, (_H, _O), "its run was cancelled or terminated"),
        _st("expired", {ACTIVITY_ATTEMPT.name: _A.EXPIRED}, (_H, _O), "its lease was lost or a timeout fired"),
    ),
    (
        Operation("heartbeat", Channel.WORKER),
        Operation("complete", Channel.WORKER, (AttemptEvent.COMPLETE,)),
        Operation("fail", Channel.WORKER, (AttemptEvent.FAIL,)),
        Operation("close_run", Channel.CONTROL, (AttemptEvent.CANCEL,)),
        Operation("expire", Channel.CLOCK, (AttemptEvent.EXPIRE,)),
    ),
)

_Q = QueryTaskStatus
QUERY_TASK_ENTITY: Final = Entity(
    "query_task",
    "query_tasks",
    (QUERY_TASK,),
    (
        _st("pending", {QUERY_TASK.name: _Q.PENDING}, (_O,), "asked, not leased yet"),
        _st("leased", {QUERY_TASK.name: _Q.LEASED}, (_H, _O), "leased by a worker"),
        _st("completed", {QUERY_TASK.name: _Q.COMPLETED}, (_H, _O), "answered"),
        _st("failed", {QUERY_TASK.name: _Q.FAILED}, (_H, _O), "failed by its worker, or its run closed first"),
        _st("timed_out", {QUERY_TASK.name: _Q.TIMED_OUT}, (_H, _O), "the caller's wait ended first"),
    ),
    (
        Operation("poll", Channel.WORKER, (QueryTaskEvent.CLAIM,), names_entity=False),
        Operation("complete", Channel.WORKER, (QueryTaskEvent.COMPLETE,)),
        Operation("fail", Channel.WORKER, (QueryTaskEvent.FAIL,)),
        Operation("close_run", Channel.CONTROL, (QueryTaskEvent.RUN_CLOSED,)),
        Operation("expire", Channel.CLOCK, (QueryTaskEvent.EXPIRE,)),
        Operation("time_out", Channel.CLOCK, (QueryTaskEvent.TIME_OUT,)),
    ),
)

_S = SessionStatus
WORKER_SESSION_ENTITY: Final = Entity(
    "worker_session",
    "worker_sessions",
    (SESSION,),
    (
        _st("none", {SESSION.name: _S.NONE}, (_O,), "no session with that id yet"),
        _st("active", {SESSION.name: _S.ACTIVE}, (_H, _O), "held by its creator"),
        _st(
            "active_cancelled_activity",
            {SESSION.name: _S.ACTIVE},
            (_H, _O),
            "held, an in-session activity's run closed",
        ),
        _st(
            "reacquired",
            {SESSION.name: _S.ACTIVE},
            _ALL_WORKERS,
            "held by a worker that took it over",
            impossible={
                "lost": "only a session that allows reacquisition is reacquired, and such a session that loses its "
                "lease or holder again is expired or orphaned, never failed."
            },
        ),
        _st("expired", {SESSION.name: _S.EXPIRED}, (_H, _O), "its lease was not renewed"),
        _st("orphaned", {SESSION.name: _S.ORPHANED}, (_H, _O), "its holder's registration went stale"),
        _st("closed", {SESSION.name: _S.CLOSED}, _ALL_WORKERS, "closed, or past its TTL"),
        # A session that forbids reacquisition is never reacquired: nobody held it before its one holder.
        _st("failed", {SESSION.name: _S.FAILED}, (_H, _O), "lost while reacquisition was not allowed"),
    ),
    (
        Operation("create", Channel.WORKER, (SessionEvent.CREATE, SessionEvent.REACQUIRE)),
        Operation("heartbeat", Channel.WORKER, (SessionEvent.RENEW,)),
        Operation("close", Channel.WORKER, (SessionEvent.CLOSE,)),
        Operation("claim_in_session", Channel.WORKER),
        Operation("activity_heartbeat_in_session", Channel.WORKER, (SessionEvent.RENEW,)),
        Operation("close_run", Channel.CONTROL),
        Operation("lease_expire", Channel.CLOCK, (SessionEvent.LEASE_EXPIRE,)),
        Operation("holder_stale", Channel.CLOCK, (SessionEvent.HOLDER_STALE,)),
        Operation("lost", Channel.CLOCK, (SessionEvent.FAIL,)),
        Operation("ttl_expire", Channel.CLOCK, (SessionEvent.TTL_EXPIRE,)),
    ),
)

_C = ChildStatus
CHILD_ENTITY: Final = Entity(
    "child",
    "parent_close_policy",
    (CHILD,),
    (
        _st("running", {CHILD.name: _C.RUNNING}, (_H,), "the child run is open, its parent open"),
        # A run closing with open children, once under each policy the command table accepts.
        *(
            _st(
                f"parent_closing_{policy}",
                {CHILD.name: _C.RUNNING},
                (_H,),
                f"the parent closed with the child open, policy {policy}",
            )
            for policy in sorted(PARENT_CLOSE_POLICIES)
        ),
        _st("second_result", {CHILD.name: _C.COMPLETED}, (_H,), "a second child of the same parent has closed"),
        _st("backoff", {CHILD.name: _C.BACKOFF}, (_H,), "the child run failed, a retry waits out its backoff"),
        _st("completed", {CHILD.name: _C.COMPLETED}, (_H,), "the child run completed"),
        _st("failed", {CHILD.name: _C.FAILED}, (_H,), "the child run failed"),
        _st("cancelled", {CHILD.name: _C.CANCELLED}, (_H,), "the child run was cancelled"),
        _st("terminated", {CHILD.name: _C.TERMINATED}, (_H,), "the child run was terminated"),
    ),
    (
        # The holder here is the worker holding the parent's workflow task: it reads what the child did.
        Operation("parent_reads_result", Channel.WORKER, actors=(_H,)),
        Operation("child_completes", Channel.WORKER, (ChildEvent.CHILD_COMPLETED,), actors=(_H,)),
        Operation("child_fails", Channel.WORKER, (ChildEvent.CHILD_FAILED, ChildEvent.RETRY), actors=(_H,)),
        Operation("close_parent", Channel.CONTROL, (ChildEvent.PARENT_CLOSED,)),
        Operation("cancel_child", Channel.CONTROL, (ChildEvent.CHILD_CANCELLED,)),
        Operation("terminate_child", Channel.CONTROL, (ChildEvent.CHILD_TERMINATED,)),
        Operation("restart", Channel.CLOCK, (ChildEvent.RESTART,)),
    ),
)

_X = CancellationRequestStatus
CANCELLATION_REQUEST_ENTITY: Final = Entity(
    "cancellation_request",
    "cooperative_cancellation",
    (CANCELLATION_REQUEST,),
    (
        _st("requested", {CANCELLATION_REQUEST.name: _X.REQUESTED}, (_H,), "asked, no child task carried it yet"),
        _st("delivered", {CANCELLATION_REQUEST.name: _X.DELIVERED}, (_H,), "the first child task carrying it"),
        _st("delivered_again", {CANCELLATION_REQUEST.name: _X.DELIVERED}, (_H,), "a later child task, still open"),
        # Past its cleanup deadline the request is resolved by the deadline itself (the server closes the child
        # then): the deadline fires once, counted in the state the request was in when it passed.
        _st(
            "past_deadline",
            {CANCELLATION_REQUEST.name: _X.RESOLVED},
            (_H,),
            "its cleanup deadline passed with the child open, and the server closed the child",
        ),
        _st("resolved", {CANCELLATION_REQUEST.name: _X.RESOLVED}, (_H,), "the child closed"),
    ),
    (
        # The holder here is the worker holding the child's workflow task.
        Operation("child_task", Channel.WORKER, (CancellationRequestEvent.DELIVER,), actors=(_H,)),
        Operation("child_closes", Channel.WORKER, (CancellationRequestEvent.RESOLVE,), actors=(_H,)),
        Operation("read_parent_history", Channel.CONTROL),
        Operation("deadline", Channel.CLOCK, (CancellationRequestEvent.RESOLVE,)),
    ),
)

_U = UpdateStatus
UPDATE_ENTITY: Final = Entity(
    "update",
    None,
    (UPDATE,),
    (
        _st("accepted", {UPDATE.name: _U.ACCEPTED}, (_H, _O), "accepted, its workflow task not completed yet"),
        _st("completed", {UPDATE.name: _U.COMPLETED}, (_H, _O), "completed by a workflow task"),
        _st("failed", {UPDATE.name: _U.FAILED}, (_H, _O), "failed by a workflow task"),
        _st("rejected", {UPDATE.name: _U.REJECTED}, (_H, _O), "its run closed first"),
    ),
    (
        Operation("complete_update", Channel.WORKER, (UpdateEvent.COMPLETE,)),
        Operation("fail_update", Channel.WORKER, (UpdateEvent.FAIL,)),
        Operation("describe", Channel.CONTROL),
        Operation("close_run", Channel.CONTROL, (UpdateEvent.RUN_CLOSED,)),
    ),
)

ENTITIES: Final[tuple[Entity, ...]] = (
    WORKFLOW_TASK_ENTITY,
    RUN_ENTITY,
    ACTIVITY_ATTEMPT_ENTITY,
    QUERY_TASK_ENTITY,
    WORKER_SESSION_ENTITY,
    CHILD_ENTITY,
    CANCELLATION_REQUEST_ENTITY,
    UPDATE_ENTITY,
)


# ---------------------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------------------


def _ruled_out(entity: Entity, state: CoverState, op: Operation, actor: Actor) -> str | None:
    if op.name in state.impossible:
        return state.impossible[op.name]
    if actor in WORKER_ACTORS and actor not in state.present:
        return f"{_ABSENT[actor]} ({entity.name} {state.name}: {state.description})."
    if state.unnamed and op.channel is Channel.WORKER and op.names_entity:
        return f"a {entity.name} id reaches a worker only in a lease, and nobody has leased it in {state.name}."
    if op.channel is Channel.CLOCK:
        lifecycle = entity.lifecycle_by_name[op.lifecycle] if op.lifecycle else entity.lifecycle
        value = state.facets[lifecycle.name]
        if not any(lifecycle.can(value, event) for event in op.events):
            return (
                f"the {lifecycle.name} table has no row for {', '.join(map(str, op.events))} in {value}, "
                f"so the server's clock cannot fire {op.name} in {state.name}."
            )
    return None


def cells(entity: Entity) -> tuple[Cell, ...]:
    """Every cell of ``entity``, in state, operation, actor order; the ruled-out ones carry their reason."""
    return tuple(
        Cell(entity.name, state.name, op.name, actor, _ruled_out(entity, state, op, actor))
        for state in entity.states
        for op in entity.operations
        for actor in op.by
    )


_ALL_KEYS: Final[frozenset[str]] = frozenset(c.key for e in ENTITIES for c in cells(e))
_REACHABLE: Final[frozenset[str]] = frozenset(c.key for e in ENTITIES for c in cells(e) if c.ruled_out is None)


def _query_lease_never_lapses(profile: Mapping[str, Any]) -> str | None:
    """Why no query-task lease lapses on a target whose query-task lease is not shorter than its query timeout."""
    lease, timeout = profile.get("query_task_lease_seconds"), profile.get("query_task_timeout_seconds")
    if (
        not isinstance(lease, int | float)
        or not isinstance(timeout, int | float)
        or bool in (type(lease), type(timeout))
    ):
        return None  # the target does not say
    if lease < timeout:
        return None
    return (
        f"the target's query-task lease ({lease} s) is not shorter than its query timeout ({timeout} s): a lease runs "
        "from its claim, which comes after the query was asked, so it never ends before the query's deadline — the "
        "task times out first, no lease of it lapses, and no worker is ever told of a pending task."
    )


# Reachable cells a target's advertised values can make impossible, and the rule that says when, with the sentence.
_TARGET_RULES: Final[Mapping[str, Any]] = MappingProxyType(
    {
        cell_key("query_task", "leased", "expire", Actor.CLOCK): _query_lease_never_lapses,
        cell_key("query_task", "pending", "complete", Actor.OTHER_WORKER): _query_lease_never_lapses,
        cell_key("query_task", "pending", "fail", Actor.OTHER_WORKER): _query_lease_never_lapses,
    }
)


def target_ruled_out(key: str, profile: Mapping[str, Any]) -> str | None:
    """The sentence that makes reachable cell ``key`` impossible on a target advertising ``profile`` (its
    ``worker_protocol.test_profile``), or None."""
    rule = _TARGET_RULES.get(key)
    return None if rule is None else rule(profile)


def known_cell(key: str) -> bool:
    """Whether ``key`` names a cell of the model (ruled out or not)."""
    return key in _ALL_KEYS


def applicable_entities(capabilities: Mapping[str, Any]) -> tuple[Entity, ...]:
    """The entities a target's advertised capabilities bring into a run."""
    return tuple(e for e in ENTITIES if e.capability is None or advertised(capabilities.get(e.capability)))


@dataclass(frozen=True, slots=True)
class EntityRow:
    """One entity in a run: how often each reachable cell was hit, and the cells the protocol rules out."""

    entity: str
    applicable: bool
    reached: Mapping[str, int]  # cell key -> hits (> 0)
    not_reached: tuple[str, ...]
    ruled_out: Mapping[str, str]  # cell key -> why
    # Reachable cells this target's advertised values make impossible (cell key -> why): never not reached.
    not_applicable: Mapping[str, str] = field(default_factory=dict)

    @property
    def impossible_hits(self) -> tuple[str, ...]:
        """Ruled-out cells a machine said it hit: its classifier is wrong (never the target's failure), and cells
        the target's own values make impossible that a machine said it hit (the target did what it says it
        cannot)."""
        return tuple(k for k in self.reached if k in self.ruled_out or k in self.not_applicable)

    def to_json(self) -> dict[str, Any]:
        return {
            "entity": self.entity,
            "applicable": self.applicable,
            "reached": dict(self.reached),
            "not_reached": list(self.not_reached),
            "ruled_out": dict(self.ruled_out),
            "not_applicable": dict(self.not_applicable),
            "impossible_hits": list(self.impossible_hits),
        }

    def line(self) -> str:
        total = len(self.reached) + len(self.not_reached)
        head = f"{self.entity}: {len(self.reached)}/{total} cells reached ({plural(sum(self.reached.values()), 'hit')})"
        tail = f", {len(self.ruled_out)} ruled out, {len(self.not_reached)} not reached"
        if self.not_applicable:
            tail += f", {len(self.not_applicable)} not applicable to this target"
        return head + tail + ("" if self.applicable else " (capability not advertised)")


def matrix(
    hits: Mapping[str, int], capabilities: Mapping[str, Any], profile: Mapping[str, Any] | None = None
) -> tuple[EntityRow, ...]:
    """The coverage matrix of a run: ``hits`` maps a cell key to how often the run hit it; ``profile`` is the
    target's test profile (the cells its values make impossible are not applicable). A hit on a ruled-out cell is
    kept under ``reached`` (a machine that classifies one there has a bug the unit tests look for)."""
    applicable = {e.name for e in applicable_entities(capabilities)}
    rows = []
    for entity in ENTITIES:
        all_cells = cells(entity)
        here = {
            c.key: why
            for c in all_cells
            if c.ruled_out is None and (why := target_ruled_out(c.key, profile or {})) is not None
        }
        rows.append(
            EntityRow(
                entity.name,
                entity.name in applicable,
                {c.key: int(hits[c.key]) for c in all_cells if hits.get(c.key, 0) > 0},
                tuple(
                    c.key for c in all_cells if c.ruled_out is None and hits.get(c.key, 0) <= 0 and c.key not in here
                ),
                {c.key: c.ruled_out for c in all_cells if c.ruled_out is not None},
                MappingProxyType(here),
            )
        )
    return tuple(rows)


def not_reached(rows: Iterable[EntityRow]) -> list[str]:
    """Every reachable cell of an applicable entity the run did not reach (what keeps ``--certify`` from passing)."""
    return [key for row in rows if row.applicable for key in row.not_reached]


def validate() -> None:
    """Raise ``ValueError`` listing every gap between the coverage model and the lifecycle tables: a lifecycle
    state no cover state stands for, a lifecycle event no operation fires, an unknown lifecycle, a name twice."""
    problems: list[str] = []
    for entity in ENTITIES:
        own = entity.lifecycle
        names = [s.name for s in entity.states]
        problems += [f"{entity.name}: state {n!r} twice" for n in sorted({n for n in names if names.count(n) > 1})]
        ops = [o.name for o in entity.operations]
        problems += [f"{entity.name}: operation {n!r} twice" for n in sorted({n for n in ops if ops.count(n) > 1})]
        problems += [
            f"{entity.name}.{st.name}: ruled out operation {o!r} is not an operation"
            for st in entity.states
            for o in st.impossible
            if o not in ops
        ]
        for lc in entity.lifecycles:
            covered = {s.facets.get(lc.name) for s in entity.states}
            used = {lc.initial, *(src for src, _ in lc.table), *lc.table.values()}
            problems += [f"{entity.name}: {lc.name} state {v} has no cover state" for v in used if v not in covered]
            problems += [
                f"{entity.name}: a state lacks its {lc.name} facet" for s in entity.states if lc.name not in s.facets
            ]
        fired = {ev for o in entity.operations for ev in o.events if isinstance(ev, own.events)}
        table_events = {ev for _, ev in own.table}
        problems += [f"{entity.name}: {own.name} event {ev} fired by no operation" for ev in table_events - fired]
        for op in entity.operations:
            if op.lifecycle and op.lifecycle not in entity.lifecycle_by_name:
                problems.append(f"{entity.name}.{op.name}: unknown lifecycle {op.lifecycle}")
            if op.channel is Channel.CLOCK and len(op.events) == 0:
                problems.append(f"{entity.name}.{op.name}: a clock operation fires no event")
    problems += [f"target rule for {k}, which is not a reachable cell" for k in _TARGET_RULES if k not in _REACHABLE]
    lease_given = {ev for evs in _LEASE_EVENTS_BY_OPERATION.values() for ev in evs}
    problems += [f"workflow_task: lease event {ev} given to no operation" for ev in LeaseEvent if ev not in lease_given]
    if problems:
        raise ValueError("coverage model is unsound:\n  " + "\n  ".join(problems))
