"""Lifecycles of worker protocol 1.20, written as transition tables.

Every machine is a ``dict[tuple[State, Event], State]`` over two ``StrEnum`` s, wrapped in a
:class:`Lifecycle` that knows its name, initial state and terminal states. ``Lifecycle.step`` is a pure
function: a pair that is not in the table raises :class:`~suite.protocol.errors.IllegalTransition` naming
the machine, the state and the event, and nothing changes (there is nothing to change: states are values).

The machines (the protocol's state machines of tasks, runs and attempts, plus §8.7, §8.8, §10, §11 and §12.2
for the events; docs/reference.md: Leasing, Expiry, Commands, Queries, Activities, Control plane):

=========================  ======================================================================
``WORKFLOW_TASK``          workflow-task row status: ready → leased → completed | failed | cancelled
``ACTIVITY_TASK``          activity-task row status (same states; an activity retry *completes* the task)
``WORKFLOW_TASK_LEASE``    the lease on one workflow task: none → live → expired → none
``RUN``                    run status: pending → running / waiting → completed|failed|cancelled|terminated
``ACTIVITY_ATTEMPT``       one activity attempt: running → completed | failed | cancelled | expired
``ACTIVITY_EXECUTION``     one logical activity: pending → running → …, back to pending between retries
``QUERY_TASK``             one ephemeral query task: pending → leased → completed | failed | timed_out
``TIMER``                  a timer: pending → fired | cancelled
``CONDITION_WAIT``         an open condition wait: open → satisfied | timed_out
``UPDATE``                 an update: accepted → completed | failed | rejected
``CHILD``                  one child-workflow call: running ⇄ backoff → completed | failed | cancelled | …
``CANCELLATION_REQUEST``   a cooperative cancellation request: requested → delivered → resolved
``WORKER``                 a worker registration: active ⇄ deregistered
=========================  ======================================================================

Counters that ride along with a transition (the workflow-task attempt) are given by small pure helpers next
to their table (:func:`lease_attempt_after`), so the table itself stays a plain mapping of states.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from suite.protocol.errors import IllegalTransition

__all__ = [
    "ACTIVITY_ATTEMPT",
    "ACTIVITY_EXECUTION",
    "ACTIVITY_TASK",
    "ALL_LIFECYCLES",
    "CANCELLATION_REQUEST",
    "CHILD",
    "CHILD_CLOSED_EVENTS",
    "CONDITION_WAIT",
    "PARENT_CLOSE_EFFECTS",
    "QUERY_TASK",
    "RUN",
    "RUN_CLOSED_REASONS",
    "RUN_LIVE_STATUSES",
    "RUN_TERMINAL_STATUSES",
    "TIMER",
    "UPDATE",
    "WORKER",
    "WORKFLOW_TASK",
    "WORKFLOW_TASK_LEASE",
    "AttemptEvent",
    "AttemptStatus",
    "CancellationRequestEvent",
    "CancellationRequestStatus",
    "ChildEvent",
    "ChildStatus",
    "ConditionWaitEvent",
    "ConditionWaitStatus",
    "ExecutionEvent",
    "ExecutionStatus",
    "LeaseEvent",
    "LeaseState",
    "Lifecycle",
    "QueryTaskEvent",
    "QueryTaskStatus",
    "RunEvent",
    "RunStatus",
    "TaskEvent",
    "TaskStatus",
    "TimerEvent",
    "TimerStatus",
    "UpdateEvent",
    "UpdateStatus",
    "WorkerEvent",
    "WorkerStatus",
    "lease_attempt_after",
    "lease_state_at",
]

S = TypeVar("S", bound=StrEnum)
E = TypeVar("E", bound=StrEnum)


@dataclass(frozen=True, eq=False)
class Lifecycle(Generic[S, E]):
    """One state machine: name, state and event enums, transition table, initial and terminal states.

    ``terminal`` states have no outgoing row in the table (the unit tests check this for every machine).
    Machines compare and hash by identity: each is a module-level singleton.
    """

    name: str
    states: type[S]
    events: type[E]
    table: Mapping[tuple[S, E], S]
    initial: S
    terminal: frozenset[S]
    _by_state: Mapping[S, frozenset[E]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Freeze the table so a caller cannot edit a machine that both the server and the suite share.
        object.__setattr__(self, "table", MappingProxyType(dict(self.table)))
        by_state: dict[S, set[E]] = {state: set() for state in self.states}
        for (state, event), target in self.table.items():
            if state not in by_state or target not in by_state or not isinstance(event, self.events):
                raise ValueError(f"{self.name}: table row {(state, event)!r} -> {target!r} uses a foreign enum")
            by_state[state].add(event)
        object.__setattr__(
            self, "_by_state", MappingProxyType({state: frozenset(evs) for state, evs in by_state.items()})
        )

    def step(self, state: S, event: E) -> S:
        """The state after ``event`` in ``state``; ``IllegalTransition`` if the table has no such row."""
        try:
            return self.table[(state, event)]
        except KeyError:
            raise IllegalTransition(self.name, state, event) from None

    def can(self, state: S, event: E) -> bool:
        """Whether ``event`` is legal in ``state``."""
        return (state, event) in self.table

    def allowed(self, state: S) -> frozenset[E]:
        """Every event that is legal in ``state``."""
        return self._by_state[state]

    def is_terminal(self, state: S) -> bool:
        """Whether ``state`` is one of the machine's terminal states."""
        return state in self.terminal

    def walk(self, state: S, events: Iterable[E]) -> Iterator[S]:
        """Yield the state after each event; raises ``IllegalTransition`` at the first bad event."""
        for event in events:
            state = self.step(state, event)
            yield state


# ---------------------------------------------------------------------------------------------------------
# Task status: workflow and activity tasks (§9.1 "Task status (workflow, activity and timer tasks)")
# ---------------------------------------------------------------------------------------------------------


class TaskStatus(StrEnum):
    """§9.1: "`ready`, `leased`, `completed`, `failed`, `cancelled`"."""

    READY = "ready"
    LEASED = "leased"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskEvent(StrEnum):
    """What happens to a task row."""

    CLAIM = "claim"
    """A poll leased the task ("Claim by a poll: `attempt_count += 1`, `lease_owner`, `lease_expires_at`
    set")."""
    EXPIRE = "expire"
    """Lease expiry was discovered and the task recovered ("Lease expiry, then recovery. Same task_id")."""
    COMPLETE = "complete"
    """A complete (workflow) or any recorded outcome (activity) closed the task."""
    FAIL = "fail"
    """Workflow-task ``fail`` ("`leased` → `failed`: Workflow-task `fail`")."""
    TIME_OUT = "time_out"
    """Activity only: the §11.7 timeout enforcer closed the task while no outcome was reported."""
    CANCEL = "cancel"
    """The run was closed with the task open: §9.1 "The run was cancelled or terminated (observed on the next
    call)", or a workflow that completed, failed or continued as new with an activity still open."""
    ABANDON = "abandon"
    """Workflow only: the lease holder deregistered, so its lease is given up at once and the task is ready
    again (Python SDK 2.12.0, Worker handshake ``DELETE /worker/registrations``: ``recovered_workflow_task_count``);
    the next claim bumps the attempt."""


_T = TaskStatus
_TE = TaskEvent

# §9.1 task-status table, verbatim rows:
#   ready (available_at ≤ now) → leased     "Claim by a poll"
#   leased → ready                          "Lease expiry, then recovery. Same task_id; the next claim bumps
#                                            the attempt"
#   leased → completed                      "Complete accepted"
#   leased → failed                         "Workflow-task `fail`"
#   leased or ready → cancelled             "The run was cancelled or terminated (observed on the next call)"
WORKFLOW_TASK_TRANSITIONS: dict[tuple[TaskStatus, TaskEvent], TaskStatus] = {
    (_T.READY, _TE.CLAIM): _T.LEASED,
    (_T.READY, _TE.CANCEL): _T.CANCELLED,
    (_T.LEASED, _TE.EXPIRE): _T.READY,
    (_T.LEASED, _TE.ABANDON): _T.READY,
    (_T.LEASED, _TE.COMPLETE): _T.COMPLETED,
    (_T.LEASED, _TE.FAIL): _T.FAILED,
    (_T.LEASED, _TE.CANCEL): _T.CANCELLED,
}
# Decision: a failed workflow task is terminal. §8.8: "Upstream does not retry a failed workflow task
# automatically; repair handles it. The RS MAY schedule a fresh attempt" — the RS does not, so `failed` has
# no way out, and an RS that chose to retry would create a new task row rather than reopen this one.

WORKFLOW_TASK: Lifecycle[TaskStatus, TaskEvent] = Lifecycle(
    name="workflow_task",
    states=TaskStatus,
    events=TaskEvent,
    table=WORKFLOW_TASK_TRANSITIONS,
    initial=TaskStatus.READY,
    terminal=frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
)

# Activity tasks use the same states. §9.1: "`leased` → `completed`: Complete accepted. An activity retry
# also completes the old task and creates a new `ready` one". So every *reported* outcome (complete, a
# retryable fail, a final fail) closes the task with COMPLETE: the outcome itself lives on the attempt and
# the execution, and a retry is a new task row (§11.1 "A **new** task_id for each retry").
# Decision: `failed` is reached only through TIME_OUT, the §11.7 enforcer closing a task nobody reported on
# (schedule_to_start while ready, or start_to_close / heartbeat while leased). A timeout that still has
# attempts left also creates the retry as a new ready task.
ACTIVITY_TASK_TRANSITIONS: dict[tuple[TaskStatus, TaskEvent], TaskStatus] = {
    (_T.READY, _TE.CLAIM): _T.LEASED,
    (_T.READY, _TE.TIME_OUT): _T.FAILED,
    (_T.READY, _TE.CANCEL): _T.CANCELLED,
    (_T.LEASED, _TE.EXPIRE): _T.READY,
    (_T.LEASED, _TE.COMPLETE): _T.COMPLETED,
    (_T.LEASED, _TE.TIME_OUT): _T.FAILED,
    (_T.LEASED, _TE.CANCEL): _T.CANCELLED,
}

ACTIVITY_TASK: Lifecycle[TaskStatus, TaskEvent] = Lifecycle(
    name="activity_task",
    states=TaskStatus,
    events=TaskEvent,
    table=ACTIVITY_TASK_TRANSITIONS,
    initial=TaskStatus.READY,
    terminal=frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
)


# ---------------------------------------------------------------------------------------------------------
# Workflow-task lease (§7.3, §8.6, §8.9 row 4, §9)
# ---------------------------------------------------------------------------------------------------------


class LeaseState(StrEnum):
    """The lease on one workflow task, as a fencing judge sees it at a given ``now``."""

    NONE = "none"
    """No lease: the task is ready, or closed."""
    LIVE = "live"
    """Leased and ``now < lease_expires_at``."""
    EXPIRED = "expired"
    """Still recorded as leased but ``lease_expires_at ≤ now``; nobody has recovered the task yet."""


class LeaseEvent(StrEnum):
    """What happens to a lease."""

    CLAIM = "claim"
    """A poll leased the task: the attempt counter goes up by one (:func:`lease_attempt_after`)."""
    REPLAY_POLL = "replay_poll"
    """A duplicate poll with the same ``poll_request_id`` while the lease is live: same task and attempt."""
    RENEW = "renew"
    """Owner heartbeat: ``lease_expires_at := now + lease_duration``."""
    LAPSE = "lapse"
    """Time passed ``lease_expires_at`` (observed, never stored)."""
    RECOVER = "recover"
    """The expired lease is cleared and the task goes back to ``ready``."""
    RELEASE = "release"
    """The task left ``leased``: complete, fail, the run was closed, or the holder deregistered."""


_L = LeaseState
_LE = LeaseEvent

# §9 "Workflow attempt numbering": "`attempt_count` starts at 0 and the **claim increments it**, so the first
# lease is attempt 1. … Duplicate polls with the same `poll_request_id` do **not** increment it". §7.3: "while
# the lease is live return **the same task_id and the same attempt** … Once the task is completed, failed or
# expired, the cached result is dropped" — so REPLAY_POLL exists only in LIVE. §8.6: "The new expiry is **now
# + lease duration** … It is set fresh" — RENEW only in LIVE; an expired lease is rejected (§8.9 row 4: "An
# expired lease that **nobody has reclaimed** is still rejected"). §9: "On lease expiry: The task goes back to
# `ready` with the **same task_id** … The next poll … leases it with attempt+1" — RECOVER then CLAIM.
WORKFLOW_TASK_LEASE_TRANSITIONS: dict[tuple[LeaseState, LeaseEvent], LeaseState] = {
    (_L.NONE, _LE.CLAIM): _L.LIVE,
    (_L.LIVE, _LE.REPLAY_POLL): _L.LIVE,
    (_L.LIVE, _LE.RENEW): _L.LIVE,
    (_L.LIVE, _LE.LAPSE): _L.EXPIRED,
    (_L.LIVE, _LE.RELEASE): _L.NONE,
    (_L.EXPIRED, _LE.RECOVER): _L.NONE,
    # A run cancelled or terminated while the lease had lapsed closes the task too (§9.1 "`leased` or
    # `ready` → `cancelled`"), which clears the lease without a recovery.
    (_L.EXPIRED, _LE.RELEASE): _L.NONE,
}

WORKFLOW_TASK_LEASE: Lifecycle[LeaseState, LeaseEvent] = Lifecycle(
    name="workflow_task_lease",
    states=LeaseState,
    events=LeaseEvent,
    table=WORKFLOW_TASK_LEASE_TRANSITIONS,
    initial=LeaseState.NONE,
    # A lease cycles for as long as its task lives; whether the task is closed is the task machine's business.
    terminal=frozenset(),
)


def lease_attempt_after(event: LeaseEvent, attempt: int) -> int:
    """The workflow-task attempt after ``event``: +1 on ``CLAIM`` only.

    §9: "the **claim increments it** … Duplicate polls with the same `poll_request_id` do **not**
    increment it".
    """
    if attempt < 0:
        raise ValueError(f"attempt count must be >= 0, got {attempt}")
    return attempt + 1 if event is LeaseEvent.CLAIM else attempt


def lease_state_at(lease_expires_at: datetime | None, now: datetime) -> LeaseState:
    """Classify a recorded lease at ``now``: none, live, or expired (``lease_expires_at ≤ now``, §8.9)."""
    if lease_expires_at is None:
        return LeaseState.NONE
    return LeaseState.EXPIRED if lease_expires_at <= now else LeaseState.LIVE


# ---------------------------------------------------------------------------------------------------------
# Run status (§9.1 "Run status", §8.7, §12.2)
# ---------------------------------------------------------------------------------------------------------


class RunStatus(StrEnum):
    """§12.3: "Run status values: `pending, running, waiting, completed, failed, cancelled, terminated`"."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"


class RunEvent(StrEnum):
    """What happens to a run."""

    WAKE = "wake"
    """A new workflow task was created for the run (signal, update, timer, activity or child outcome)."""
    BATCH_OPEN_WAITS = "batch_open_waits"
    """A workflow task completed with only non-terminal commands."""
    BATCH_COMPLETE = "batch_complete"
    """A workflow task completed with ``complete_workflow``."""
    BATCH_FAIL = "batch_fail"
    """A workflow task completed with ``fail_workflow``."""
    BATCH_CONTINUE_AS_NEW = "batch_continue_as_new"
    """A workflow task completed with ``continue_as_new``."""
    TASK_FAIL = "task_fail"
    """A workflow task failed and no new history arrived during its lease: no task is open, the run waits
    (§8.8 "a task failure is a replay problem, not a workflow failure"; repair or a new event wakes it)."""
    CANCEL = "cancel"
    """Control-plane cancel was accepted."""
    TERMINATE = "terminate"
    """Control-plane terminate was accepted."""
    TIME_OUT = "time_out"
    """The run's execution or run timeout passed (``WorkflowTimedOut``; §8.7 "409 `run_timed_out`")."""


_R = RunStatus
_RE = RunEvent

RUN_TERMINAL_STATUSES: frozenset[RunStatus] = frozenset({_R.COMPLETED, _R.FAILED, _R.CANCELLED, _R.TERMINATED})
"""§9.1: "`completed` | `failed` | `cancelled` | `terminated`. The last four are terminal"."""

RUN_LIVE_STATUSES: frozenset[RunStatus] = frozenset({_R.PENDING, _R.RUNNING, _R.WAITING})
"""§8.2: "`run_status` … `pending`, `running` or `waiting` for live runs"."""

# §9.1: "`pending` (started, first workflow task not yet completed) → `running` / `waiting` (waiting means no
# open workflow task and an open wait) → `completed` | `failed` | `cancelled` | `terminated`".
# §8.7: "With only non-terminal commands, the run becomes `waiting` and the task `completed`."
# §8.7.1: complete_workflow → "Run becomes `completed`"; fail_workflow → "Run becomes `failed`";
#         continue_as_new → "The current run becomes `completed` with `closed_reason:"continued"`".
# §12.2: "Cancel and terminate close the run immediately (`status` `cancelled` or `terminated`)".
# Decisions:
# - WAKE is legal in every live state so the server can fire it whenever it creates a workflow task. It
#   moves `waiting` to `running` and leaves `pending` / `running` as they are ("pending" lasts until the
#   first workflow task completes, whatever else happens meanwhile).
# - A batch can only complete (and a task only fail) from `pending` or `running`: either needs a leased
#   workflow task, and a run with an open workflow task is never `waiting`.
# - TIME_OUT closes the run as `failed` with closed_reason "timed_out": the run-status enum has no timed-out
#   value, and a timed-out run did not succeed.
RUN_TRANSITIONS: dict[tuple[RunStatus, RunEvent], RunStatus] = {
    (_R.PENDING, _RE.WAKE): _R.PENDING,
    (_R.RUNNING, _RE.WAKE): _R.RUNNING,
    (_R.WAITING, _RE.WAKE): _R.RUNNING,
    **{
        (source, event): target
        for source in (_R.PENDING, _R.RUNNING)
        for event, target in (
            (_RE.BATCH_OPEN_WAITS, _R.WAITING),
            (_RE.BATCH_COMPLETE, _R.COMPLETED),
            (_RE.BATCH_FAIL, _R.FAILED),
            (_RE.BATCH_CONTINUE_AS_NEW, _R.COMPLETED),
            (_RE.TASK_FAIL, _R.WAITING),
        )
    },
    **{
        (source, event): target
        for source in (_R.PENDING, _R.RUNNING, _R.WAITING)
        for event, target in (
            (_RE.CANCEL, _R.CANCELLED),
            (_RE.TERMINATE, _R.TERMINATED),
            (_RE.TIME_OUT, _R.FAILED),
        )
    },
}

RUN: Lifecycle[RunStatus, RunEvent] = Lifecycle(
    name="run",
    states=RunStatus,
    events=RunEvent,
    table=RUN_TRANSITIONS,
    initial=RunStatus.PENDING,
    terminal=RUN_TERMINAL_STATUSES,
)

RUN_CLOSED_REASONS: Mapping[RunEvent, str] = MappingProxyType(
    {
        _RE.BATCH_COMPLETE: "completed",
        _RE.BATCH_FAIL: "failed",
        # §8.7.1: "`completed` with `closed_reason:"continued"`".
        _RE.BATCH_CONTINUE_AS_NEW: "continued",
        # §12.2: "with `closed_reason` the same value".
        _RE.CANCEL: "cancelled",
        _RE.TERMINATE: "terminated",
        _RE.TIME_OUT: "timed_out",
    }
)
"""``closed_reason`` recorded on the run by each closing event; events that keep the run open are absent."""


# ---------------------------------------------------------------------------------------------------------
# Activity attempt (§9.1 "Activity attempt status", §9 "Activity redelivery", §11.5)
# ---------------------------------------------------------------------------------------------------------


class AttemptStatus(StrEnum):
    """§9.1: "`running` → `completed` | `failed` | `cancelled` | `expired` (lease lost)"."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class AttemptEvent(StrEnum):
    """What happens to an activity attempt. An attempt is born ``running`` when a claim creates it."""

    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"
    """Run cancelled/terminated or activity cancelled (§11.5 "closes the attempt as cancelled")."""
    EXPIRE = "expire"
    """The lease was lost (§9 "A lease expiry closes the attempt (status `expired`)"), or a §11.7 per-attempt
    timeout fired: either way the attempt lost the right to report."""


_A = AttemptStatus
_AE = AttemptEvent

ACTIVITY_ATTEMPT_TRANSITIONS: dict[tuple[AttemptStatus, AttemptEvent], AttemptStatus] = {
    (_A.RUNNING, _AE.COMPLETE): _A.COMPLETED,
    (_A.RUNNING, _AE.FAIL): _A.FAILED,
    (_A.RUNNING, _AE.CANCEL): _A.CANCELLED,
    (_A.RUNNING, _AE.EXPIRE): _A.EXPIRED,
}

ACTIVITY_ATTEMPT: Lifecycle[AttemptStatus, AttemptEvent] = Lifecycle(
    name="activity_attempt",
    states=AttemptStatus,
    events=AttemptEvent,
    table=ACTIVITY_ATTEMPT_TRANSITIONS,
    initial=AttemptStatus.RUNNING,
    terminal=frozenset({_A.COMPLETED, _A.FAILED, _A.CANCELLED, _A.EXPIRED}),
)


# ---------------------------------------------------------------------------------------------------------
# Activity execution (§9.1 "Activity execution status", §11.6, §11.7)
# ---------------------------------------------------------------------------------------------------------


class ExecutionStatus(StrEnum):
    """§9.1: "`pending` → `running` → `completed` | `failed` | `cancelled`", plus ``timed_out`` (§11.7)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


class ExecutionEvent(StrEnum):
    """What happens to one logical activity (one ``activity_execution_id``)."""

    CLAIM = "claim"
    """A poll leased the execution's current task (a new attempt began)."""
    LEASE_LOST = "lease_lost"
    """The attempt's lease expired and the task went back to ready; redelivery is not a retry (§11.6)."""
    RETRY = "retry"
    """A retryable failure or timeout with attempts left: a new ready task after the backoff (§11.6)."""
    COMPLETE = "complete"
    FAIL = "fail"
    """A final failure: non-retryable, or no attempts left (``ActivityFailed``)."""
    CANCEL = "cancel"
    TIME_OUT = "time_out"
    """A terminal timeout: ``schedule_to_close`` ("always terminal"), or any timeout with no retry left."""


_X = ExecutionStatus
_XE = ExecutionEvent

# §9.1: "It goes back to `pending` between retries." §11.7: "On expiry the upstream enforcer retries …
# **except** for `schedule_to_close`, which is always terminal. When no retry remains it records a terminal
# `ActivityTimedOut`". schedule_to_start and schedule_to_close can fire before any claim, hence the `pending`
# rows.
ACTIVITY_EXECUTION_TRANSITIONS: dict[tuple[ExecutionStatus, ExecutionEvent], ExecutionStatus] = {
    (_X.PENDING, _XE.CLAIM): _X.RUNNING,
    (_X.PENDING, _XE.CANCEL): _X.CANCELLED,
    (_X.PENDING, _XE.TIME_OUT): _X.TIMED_OUT,
    (_X.RUNNING, _XE.LEASE_LOST): _X.PENDING,
    (_X.RUNNING, _XE.RETRY): _X.PENDING,
    (_X.RUNNING, _XE.COMPLETE): _X.COMPLETED,
    (_X.RUNNING, _XE.FAIL): _X.FAILED,
    (_X.RUNNING, _XE.CANCEL): _X.CANCELLED,
    (_X.RUNNING, _XE.TIME_OUT): _X.TIMED_OUT,
}

ACTIVITY_EXECUTION: Lifecycle[ExecutionStatus, ExecutionEvent] = Lifecycle(
    name="activity_execution",
    states=ExecutionStatus,
    events=ExecutionEvent,
    table=ACTIVITY_EXECUTION_TRANSITIONS,
    initial=ExecutionStatus.PENDING,
    terminal=frozenset({_X.COMPLETED, _X.FAILED, _X.CANCELLED, _X.TIMED_OUT}),
)


# ---------------------------------------------------------------------------------------------------------
# Query task (§10)
# ---------------------------------------------------------------------------------------------------------


class QueryTaskStatus(StrEnum):
    """§10.6: "Not leased (completed, failed, timed out or pending)" plus ``leased``."""

    PENDING = "pending"
    LEASED = "leased"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


class QueryTaskEvent(StrEnum):
    """What happens to a query task."""

    CLAIM = "claim"
    EXPIRE = "expire"
    """The query lease (60 s default) lapsed before the control-plane timeout; the next poll re-leases it."""
    COMPLETE = "complete"
    FAIL = "fail"
    TIME_OUT = "time_out"
    """The control-plane caller's wait ended (§10.5 ``query_worker_timeout``)."""
    RUN_CLOSED = "run_closed"
    """The run closed while the task was still pending: nobody had leased it, and it is failed with
    ``query_rejected`` so the waiting caller gets 409 at once rather than a timeout."""


_Q = QueryTaskStatus
_QE = QueryTaskEvent

# §10.5: "After a timeout the query task is marked `timed_out`, and a late complete gets 409
# `query_task_not_leased`." §10.1: query tasks "are **not retried** after the control-plane timeout" —
# timed_out is terminal. §10.6: "A second complete or fail after a terminal one gets 409
# `query_task_not_leased`." Decision: a task still pending when its run closes is failed (RUN_CLOSED); a
# leased one is left to its worker, which can still answer from the complete history.
QUERY_TASK_TRANSITIONS: dict[tuple[QueryTaskStatus, QueryTaskEvent], QueryTaskStatus] = {
    (_Q.PENDING, _QE.CLAIM): _Q.LEASED,
    (_Q.PENDING, _QE.TIME_OUT): _Q.TIMED_OUT,
    (_Q.PENDING, _QE.RUN_CLOSED): _Q.FAILED,
    (_Q.LEASED, _QE.EXPIRE): _Q.PENDING,
    (_Q.LEASED, _QE.COMPLETE): _Q.COMPLETED,
    (_Q.LEASED, _QE.FAIL): _Q.FAILED,
    (_Q.LEASED, _QE.TIME_OUT): _Q.TIMED_OUT,
}

QUERY_TASK: Lifecycle[QueryTaskStatus, QueryTaskEvent] = Lifecycle(
    name="query_task",
    states=QueryTaskStatus,
    events=QueryTaskEvent,
    table=QUERY_TASK_TRANSITIONS,
    initial=QueryTaskStatus.PENDING,
    terminal=frozenset({_Q.COMPLETED, _Q.FAILED, _Q.TIMED_OUT}),
)


# ---------------------------------------------------------------------------------------------------------
# What a run waits on: timers, condition waits, updates, child workflows (§8.7.1, §12.2, Python SDK 2.12.0, Replay)
# ---------------------------------------------------------------------------------------------------------


class TimerStatus(StrEnum):
    """A ``start_timer`` (or a condition wait's timeout): pending until it fires or its run or wait ends."""

    PENDING = "pending"
    FIRED = "fired"
    CANCELLED = "cancelled"


class TimerEvent(StrEnum):
    FIRE = "fire"
    """``fire_at`` passed: ``TimerFired`` and a wake of the run."""
    CANCEL = "cancel"
    """The run closed, or the condition wait the timer bounds was satisfied first."""


TIMER: Lifecycle[TimerStatus, TimerEvent] = Lifecycle(
    name="timer",
    states=TimerStatus,
    events=TimerEvent,
    table={
        (TimerStatus.PENDING, TimerEvent.FIRE): TimerStatus.FIRED,
        (TimerStatus.PENDING, TimerEvent.CANCEL): TimerStatus.CANCELLED,
    },
    initial=TimerStatus.PENDING,
    terminal=frozenset({TimerStatus.FIRED, TimerStatus.CANCELLED}),
)


class ConditionWaitStatus(StrEnum):
    """An ``open_condition_wait`` (Python SDK 2.12.0, Replay): open until satisfied or timed out."""

    OPEN = "open"
    SATISFIED = "satisfied"
    TIMED_OUT = "timed_out"


class ConditionWaitEvent(StrEnum):
    SATISFY = "satisfy"
    """A completed batch no longer re-emits the wait: the replayed history satisfied it."""
    TIME_OUT = "time_out"
    """Its timeout timer fired first (``ConditionWaitTimedOut``)."""


CONDITION_WAIT: Lifecycle[ConditionWaitStatus, ConditionWaitEvent] = Lifecycle(
    name="condition_wait",
    states=ConditionWaitStatus,
    events=ConditionWaitEvent,
    table={
        (ConditionWaitStatus.OPEN, ConditionWaitEvent.SATISFY): ConditionWaitStatus.SATISFIED,
        (ConditionWaitStatus.OPEN, ConditionWaitEvent.TIME_OUT): ConditionWaitStatus.TIMED_OUT,
    },
    initial=ConditionWaitStatus.OPEN,
    terminal=frozenset({ConditionWaitStatus.SATISFIED, ConditionWaitStatus.TIMED_OUT}),
)


class UpdateStatus(StrEnum):
    """§12.2 ``update_status``: ``accepted`` until a workflow task completes or fails it, or its run closes."""

    ACCEPTED = "accepted"
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"


class UpdateEvent(StrEnum):
    COMPLETE = "complete"
    """A ``complete_update`` command (``UpdateCompleted`` with outcome ``completed``)."""
    FAIL = "fail"
    """A ``fail_update`` command (``UpdateCompleted`` with outcome ``failed``)."""
    RUN_CLOSED = "run_closed"
    """The run closed first: the update can never complete (409 ``rejected_not_active`` to a waiting caller)."""


UPDATE: Lifecycle[UpdateStatus, UpdateEvent] = Lifecycle(
    name="update",
    states=UpdateStatus,
    events=UpdateEvent,
    table={
        (UpdateStatus.ACCEPTED, UpdateEvent.COMPLETE): UpdateStatus.COMPLETED,
        (UpdateStatus.ACCEPTED, UpdateEvent.FAIL): UpdateStatus.FAILED,
        (UpdateStatus.ACCEPTED, UpdateEvent.RUN_CLOSED): UpdateStatus.REJECTED,
    },
    initial=UpdateStatus.ACCEPTED,
    terminal=frozenset({UpdateStatus.COMPLETED, UpdateStatus.FAILED, UpdateStatus.REJECTED}),
)


class ChildStatus(StrEnum):
    """One ``start_child_workflow`` call: its current child run's outcome, or ``backoff`` between retries."""

    RUNNING = "running"
    BACKOFF = "backoff"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"


class ChildEvent(StrEnum):
    CHILD_COMPLETED = "child_completed"
    CHILD_FAILED = "child_failed"
    CHILD_CANCELLED = "child_cancelled"
    CHILD_TERMINATED = "child_terminated"
    RETRY = "retry"
    """The child run failed and its retry policy allows another attempt: wait out the backoff (§8.7.1)."""
    RESTART = "restart"
    """The backoff passed: the next child run starts."""
    PARENT_CLOSED = "parent_closed"
    """The parent closed while the call waited out a backoff: no further child run starts."""


CHILD_CLOSED_EVENTS: Mapping[RunStatus, ChildEvent] = MappingProxyType(
    {
        RunStatus.COMPLETED: ChildEvent.CHILD_COMPLETED,
        RunStatus.FAILED: ChildEvent.CHILD_FAILED,
        RunStatus.CANCELLED: ChildEvent.CHILD_CANCELLED,
        RunStatus.TERMINATED: ChildEvent.CHILD_TERMINATED,
    }
)
"""The call's event for each status its child run closed with (§8.7.1 ``ChildRun{Completed,Failed,…}``)."""

PARENT_CLOSE_EFFECTS: Mapping[str, RunEvent | None] = MappingProxyType(
    {
        "abandon": None,
        "request_cancellation": None,
        "request_cancel": RunEvent.CANCEL,
        "terminate": RunEvent.TERMINATE,
    }
)
"""What a parent's close does to an open child run, by the policy the child was started with (worker protocol
1.20, start_child_workflow): ``terminate`` terminates it and ``request_cancel`` "closes the child at once" as
cancelled; ``abandon`` leaves it running, and ``request_cancellation`` asks it to clean up (it stays open until it
closes itself or its cleanup deadline passes). None: the child run stays open."""

_C = ChildStatus
CHILD: Lifecycle[ChildStatus, ChildEvent] = Lifecycle(
    name="child",
    states=ChildStatus,
    events=ChildEvent,
    table={
        (_C.RUNNING, ChildEvent.CHILD_COMPLETED): _C.COMPLETED,
        (_C.RUNNING, ChildEvent.CHILD_FAILED): _C.FAILED,
        (_C.RUNNING, ChildEvent.CHILD_CANCELLED): _C.CANCELLED,
        (_C.RUNNING, ChildEvent.CHILD_TERMINATED): _C.TERMINATED,
        (_C.RUNNING, ChildEvent.RETRY): _C.BACKOFF,
        (_C.BACKOFF, ChildEvent.RESTART): _C.RUNNING,
        (_C.BACKOFF, ChildEvent.PARENT_CLOSED): _C.CANCELLED,
    },
    initial=ChildStatus.RUNNING,
    terminal=frozenset({_C.COMPLETED, _C.FAILED, _C.CANCELLED, _C.TERMINATED}),
)


class CancellationRequestStatus(StrEnum):
    """A cooperative cancellation request to a child (worker protocol 1.20 ``request_cancellation``)."""

    REQUESTED = "requested"
    DELIVERED = "delivered"
    RESOLVED = "resolved"


class CancellationRequestEvent(StrEnum):
    DELIVER = "deliver"
    """A worker committed the delivery at one of its calls (``CooperativeCancellationDelivered``)."""
    RESOLVE = "resolve"
    """The child closed, by itself or past its cleanup deadline (``ChildCancellationResolved``)."""


CANCELLATION_REQUEST: Lifecycle[CancellationRequestStatus, CancellationRequestEvent] = Lifecycle(
    name="cancellation_request",
    states=CancellationRequestStatus,
    events=CancellationRequestEvent,
    table={
        (CancellationRequestStatus.REQUESTED, CancellationRequestEvent.DELIVER): CancellationRequestStatus.DELIVERED,
        (CancellationRequestStatus.REQUESTED, CancellationRequestEvent.RESOLVE): CancellationRequestStatus.RESOLVED,
        (CancellationRequestStatus.DELIVERED, CancellationRequestEvent.RESOLVE): CancellationRequestStatus.RESOLVED,
    },
    initial=CancellationRequestStatus.REQUESTED,
    terminal=frozenset({CancellationRequestStatus.RESOLVED}),
)


# ---------------------------------------------------------------------------------------------------------
# Worker registration (§6)
# ---------------------------------------------------------------------------------------------------------


class WorkerStatus(StrEnum):
    ACTIVE = "active"
    DEREGISTERED = "deregistered"


class WorkerEvent(StrEnum):
    REGISTER = "register"
    """A registration (a worker may register again, live or after deregistering, under the same id)."""
    DEREGISTER = "deregister"


WORKER: Lifecycle[WorkerStatus, WorkerEvent] = Lifecycle(
    name="worker",
    states=WorkerStatus,
    events=WorkerEvent,
    table={
        (WorkerStatus.ACTIVE, WorkerEvent.REGISTER): WorkerStatus.ACTIVE,
        (WorkerStatus.ACTIVE, WorkerEvent.DEREGISTER): WorkerStatus.DEREGISTERED,
        (WorkerStatus.DEREGISTERED, WorkerEvent.REGISTER): WorkerStatus.ACTIVE,
    },
    initial=WorkerStatus.ACTIVE,
    # A registration id can always be registered again, so no state is final.
    terminal=frozenset(),
)


ALL_LIFECYCLES: tuple[Lifecycle[Any, Any], ...] = (
    WORKFLOW_TASK,
    ACTIVITY_TASK,
    WORKFLOW_TASK_LEASE,
    RUN,
    ACTIVITY_ATTEMPT,
    ACTIVITY_EXECUTION,
    QUERY_TASK,
    TIMER,
    CONDITION_WAIT,
    UPDATE,
    CHILD,
    CANCELLATION_REQUEST,
    WORKER,
)
"""Every machine of the model, for tests and documentation generators that walk them all."""
