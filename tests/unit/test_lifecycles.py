"""Every lifecycle table, walked pair by pair (exhaustively and with Hypothesis), plus the spec's key rows."""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite.protocol import lifecycles
from suite.protocol.errors import IllegalTransition
from suite.protocol.lifecycles import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_EXECUTION,
    ACTIVITY_TASK,
    ALL_LIFECYCLES,
    QUERY_TASK,
    RUN,
    RUN_CLOSED_REASONS,
    RUN_TERMINAL_STATUSES,
    WORKFLOW_TASK,
    WORKFLOW_TASK_LEASE,
    AttemptEvent,
    AttemptStatus,
    ExecutionEvent,
    ExecutionStatus,
    LeaseEvent,
    LeaseState,
    Lifecycle,
    QueryTaskEvent,
    QueryTaskStatus,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
    lease_attempt_after,
    lease_state_at,
)
from suite.protocol.sessions import SESSION

Machine = Lifecycle[Any, Any]
# The worker-session table lives beside its rules (suite.protocol.sessions) and is walked here too.
MACHINES = (*ALL_LIFECYCLES, SESSION)
IDS = [m.name for m in MACHINES]


def test_exported_names_exist() -> None:
    for name in lifecycles.__all__:
        assert hasattr(lifecycles, name), name


def test_machine_names_are_unique() -> None:
    assert len(set(IDS)) == len(IDS)


# ---------------------------------------------------------------------------------------------------------
# Structural properties, exhaustively
# ---------------------------------------------------------------------------------------------------------


def _check_pair(machine: Machine, state: Any, event: Any) -> None:
    """The one property every (state, event) pair must have."""
    before = state
    if (state, event) in machine.table:
        after = machine.step(state, event)
        assert after in set(machine.states)
        assert machine.can(state, event)
        assert event in machine.allowed(state)
    else:
        assert not machine.can(state, event)
        assert event not in machine.allowed(state)
        with pytest.raises(IllegalTransition) as info:
            machine.step(state, event)
        err = info.value
        assert err.machine == machine.name
        assert err.state is state
        assert err.event is event
        text = str(err)
        assert machine.name in text
        assert state.value in text
        assert event.value in text
    assert state is before  # a pure function: the input value is untouched


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_every_pair_exhaustively(machine: Machine) -> None:
    for state in machine.states:
        for event in machine.events:
            _check_pair(machine, state, event)


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_terminal_states_have_no_outgoing_transitions(machine: Machine) -> None:
    assert machine.terminal <= set(machine.states)
    assert machine.initial not in machine.terminal
    for state in machine.terminal:
        assert machine.allowed(state) == frozenset(), state
        assert machine.is_terminal(state)


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_non_terminal_states_are_not_dead_ends(machine: Machine) -> None:
    for state in machine.states:
        if state not in machine.terminal:
            assert machine.allowed(state), f"{machine.name}: {state} has no way out and is not terminal"


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_every_state_is_reachable_from_initial(machine: Machine) -> None:
    seen = {machine.initial}
    queue = deque([machine.initial])
    while queue:
        state = queue.popleft()
        for event in machine.allowed(state):
            target = machine.step(state, event)
            if target not in seen:
                seen.add(target)
                queue.append(target)
    assert seen == set(machine.states)


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_every_event_is_used(machine: Machine) -> None:
    used = {event for (_, event) in machine.table}
    if machine is WORKFLOW_TASK:
        # TIME_OUT belongs to the shared TaskEvent enum but only activity tasks time out.
        assert set(machine.events) - used == {TaskEvent.TIME_OUT}
    elif machine is ACTIVITY_TASK:
        # Activity tasks close through COMPLETE whatever the reported outcome (§9.1); FAIL and ABANDON (a holder
        # that deregistered) are workflow-only.
        assert set(machine.events) - used == {TaskEvent.FAIL, TaskEvent.ABANDON}
    else:
        assert used == set(machine.events)


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_tables_are_read_only(machine: Machine) -> None:
    state, event = next(iter(machine.table))
    with pytest.raises(TypeError):
        machine.table[(state, event)] = state  # type: ignore[index]


def test_foreign_enum_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="foreign enum"):
        Lifecycle(
            name="broken",
            states=TaskStatus,
            events=TaskEvent,
            table={(TaskStatus.READY, RunEvent.WAKE): TaskStatus.LEASED},  # type: ignore[dict-item]
            initial=TaskStatus.READY,
            terminal=frozenset(),
        )


# ---------------------------------------------------------------------------------------------------------
# The same properties under Hypothesis, plus random walks
# ---------------------------------------------------------------------------------------------------------

machines = st.sampled_from(ALL_LIFECYCLES)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Machine, Any, Any]:
    machine = draw(machines)
    return machine, draw(st.sampled_from(list(machine.states))), draw(st.sampled_from(list(machine.events)))


@given(pairs())
def test_every_pair_property(pair: tuple[Machine, Any, Any]) -> None:
    _check_pair(*pair)


@st.composite
def walks(draw: st.DrawFn) -> tuple[Machine, list[Any]]:
    machine = draw(machines)
    return machine, draw(st.lists(st.sampled_from(list(machine.events)), max_size=40))


@given(walks())
def test_random_walk_never_leaves_the_state_set(walk: tuple[Machine, list[Any]]) -> None:
    machine, events = walk
    state = machine.initial
    for event in events:
        if machine.can(state, event):
            state = machine.step(state, event)
        else:
            with pytest.raises(IllegalTransition):
                machine.step(state, event)
        assert state in set(machine.states)
        if machine.is_terminal(state):
            assert machine.allowed(state) == frozenset()


@given(walks())
def test_walk_matches_step(walk: tuple[Machine, list[Any]]) -> None:
    machine, events = walk
    legal: list[Any] = []
    state = machine.initial
    for event in events:
        if machine.can(state, event):
            legal.append(event)
            state = machine.step(state, event)
    assert list(machine.walk(machine.initial, legal))[-1:] == ([state] if legal else [])


# ---------------------------------------------------------------------------------------------------------
# Rows the spec states outright
# ---------------------------------------------------------------------------------------------------------


def test_workflow_task_rows_of_section_9_1() -> None:
    t, e = TaskStatus, TaskEvent
    assert WORKFLOW_TASK.step(t.READY, e.CLAIM) is t.LEASED
    assert WORKFLOW_TASK.step(t.LEASED, e.EXPIRE) is t.READY  # same task_id, back to ready
    assert WORKFLOW_TASK.step(t.LEASED, e.COMPLETE) is t.COMPLETED
    assert WORKFLOW_TASK.step(t.LEASED, e.FAIL) is t.FAILED
    assert WORKFLOW_TASK.step(t.READY, e.CANCEL) is t.CANCELLED
    assert WORKFLOW_TASK.step(t.LEASED, e.CANCEL) is t.CANCELLED
    with pytest.raises(IllegalTransition):
        WORKFLOW_TASK.step(t.READY, e.COMPLETE)  # cannot complete a task nobody leased
    with pytest.raises(IllegalTransition):
        WORKFLOW_TASK.step(t.COMPLETED, e.CLAIM)


def test_activity_retry_completes_the_old_task() -> None:
    # §9.1: "An activity retry also completes the old task and creates a new `ready` one".
    assert ACTIVITY_TASK.step(TaskStatus.LEASED, TaskEvent.COMPLETE) is TaskStatus.COMPLETED
    assert ACTIVITY_TASK.initial is TaskStatus.READY
    assert ACTIVITY_EXECUTION.step(ExecutionStatus.RUNNING, ExecutionEvent.RETRY) is ExecutionStatus.PENDING
    assert ACTIVITY_EXECUTION.step(ExecutionStatus.PENDING, ExecutionEvent.CLAIM) is ExecutionStatus.RUNNING


def test_lease_attempt_counter() -> None:
    # §9: "the claim increments it … Duplicate polls with the same poll_request_id do not increment it".
    attempt, state = 0, WORKFLOW_TASK_LEASE.initial
    for event in (
        LeaseEvent.CLAIM,
        LeaseEvent.REPLAY_POLL,
        LeaseEvent.RENEW,
        LeaseEvent.LAPSE,
        LeaseEvent.RECOVER,
    ):
        state = WORKFLOW_TASK_LEASE.step(state, event)
        attempt = lease_attempt_after(event, attempt)
    assert (state, attempt) == (LeaseState.NONE, 1)
    state = WORKFLOW_TASK_LEASE.step(state, LeaseEvent.CLAIM)
    attempt = lease_attempt_after(LeaseEvent.CLAIM, attempt)
    assert (state, attempt) == (LeaseState.LIVE, 2)
    with pytest.raises(ValueError, match=">= 0"):
        lease_attempt_after(LeaseEvent.CLAIM, -1)


def test_expired_lease_cannot_be_renewed_or_replayed() -> None:
    for event in (LeaseEvent.RENEW, LeaseEvent.REPLAY_POLL, LeaseEvent.CLAIM):
        with pytest.raises(IllegalTransition):
            WORKFLOW_TASK_LEASE.step(LeaseState.EXPIRED, event)


def test_lease_state_at_boundary() -> None:
    now = datetime(2026, 4, 18, 12, 0, tzinfo=UTC)
    assert lease_state_at(None, now) is LeaseState.NONE
    assert lease_state_at(now + timedelta(microseconds=1), now) is LeaseState.LIVE
    assert lease_state_at(now, now) is LeaseState.EXPIRED  # §8.9 row 4: lease_expires_at ≤ now
    assert lease_state_at(now - timedelta(seconds=1), now) is LeaseState.EXPIRED


def test_run_lifecycle() -> None:
    r, e = RunStatus, RunEvent
    assert RUN.step(r.PENDING, e.BATCH_OPEN_WAITS) is r.WAITING
    assert RUN.step(r.WAITING, e.WAKE) is r.RUNNING
    assert RUN.step(r.PENDING, e.WAKE) is r.PENDING
    assert RUN.step(r.RUNNING, e.BATCH_COMPLETE) is r.COMPLETED
    assert RUN.step(r.RUNNING, e.BATCH_FAIL) is r.FAILED
    # §8.7.1: continue_as_new ends the run as completed with closed_reason "continued".
    assert RUN.step(r.RUNNING, e.BATCH_CONTINUE_AS_NEW) is r.COMPLETED
    assert RUN_CLOSED_REASONS[e.BATCH_CONTINUE_AS_NEW] == "continued"
    for live in (r.PENDING, r.RUNNING, r.WAITING):
        assert RUN.step(live, e.CANCEL) is r.CANCELLED
        assert RUN.step(live, e.TERMINATE) is r.TERMINATED
    with pytest.raises(IllegalTransition):
        RUN.step(r.WAITING, e.BATCH_COMPLETE)  # no open workflow task while waiting
    assert RUN.terminal == RUN_TERMINAL_STATUSES
    for status in RUN_TERMINAL_STATUSES:
        with pytest.raises(IllegalTransition):
            RUN.step(status, e.CANCEL)  # §12.2: "409 when not accepted (already closed)"


def test_every_closing_run_event_has_a_closed_reason() -> None:
    for (_, event), target in RUN.table.items():
        assert (event in RUN_CLOSED_REASONS) == (target in RUN_TERMINAL_STATUSES), event


def test_activity_attempt_rows() -> None:
    for event, target in (
        (AttemptEvent.COMPLETE, AttemptStatus.COMPLETED),
        (AttemptEvent.FAIL, AttemptStatus.FAILED),
        (AttemptEvent.CANCEL, AttemptStatus.CANCELLED),
        (AttemptEvent.EXPIRE, AttemptStatus.EXPIRED),
    ):
        assert ACTIVITY_ATTEMPT.step(AttemptStatus.RUNNING, event) is target


def test_query_task_rows() -> None:
    q, e = QueryTaskStatus, QueryTaskEvent
    for state, event, target in (
        (q.PENDING, e.CLAIM, q.LEASED),
        (q.LEASED, e.COMPLETE, q.COMPLETED),
        (q.LEASED, e.FAIL, q.FAILED),
        (q.LEASED, e.TIME_OUT, q.TIMED_OUT),
    ):
        assert QUERY_TASK.step(state, event) is target
    # §10.6: "A second complete or fail after a terminal one gets 409 query_task_not_leased".
    with pytest.raises(IllegalTransition):
        QUERY_TASK.step(q.COMPLETED, e.COMPLETE)
