"""Every status the reference server writes is the model's answer: one transition function, one row writer.

h11 keeps "everything that affects the state machine" in ``_state.py`` and sends every event through one
function; this module is that function for the server. :func:`step` looks ``(state, event)`` up in a table
of :mod:`suite.protocol.lifecycles` and raises the model's ``IllegalTransition`` for a pair the table does
not have — a server bug, loud, and the transaction rolls back. :func:`move` and :func:`move_all` write the
answer, conditionally on the row still being in the state the caller saw (``… WHERE status = ?``), so an
interleaving can never move a row the table would not. Initial statuses come from the machine
(:func:`initial`); no module writes a status literal (``tests/architecture`` checks it).

With ``RS_TRANSITION_TRACE=<file>`` in the environment every pair :func:`step` answers is appended to that
file when the process exits (one ``machine state event`` line each), so a test can run the server's tests
and prove that every row of every table is used by some code path.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

from suite.protocol.lifecycles import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_EXECUTION,
    ACTIVITY_TASK,
    CANCELLATION_REQUEST,
    CHILD,
    CONDITION_WAIT,
    QUERY_TASK,
    RUN,
    TIMER,
    UPDATE,
    WORKER,
    WORKFLOW_TASK,
    Lifecycle,
)
from suite.protocol.sessions import SESSION

from .tx import T

__all__ = [
    "ACTIVITY_ATTEMPTS",
    "ACTIVITY_EXECUTIONS",
    "ACTIVITY_TASKS",
    "CANCELLATION_REQUESTS",
    "CHILDREN",
    "CONDITION_WAITS",
    "QUERY_TASKS",
    "RUNS",
    "TIMERS",
    "TRACE_ENV",
    "UPDATES",
    "WORKERS",
    "WORKER_SESSIONS",
    "WORKFLOW_TASKS",
    "BulkMove",
    "Rows",
    "claim",
    "initial",
    "move",
    "move_all",
    "pending_moves",
    "step",
]

TRACE_ENV = "RS_TRANSITION_TRACE"

S = TypeVar("S", bound=StrEnum)
E = TypeVar("E", bound=StrEnum)


class _Trace:
    """The pairs answered by :func:`step` in this process, written out at exit (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pairs: set[tuple[str, str, str]] = set()
        atexit.register(self.flush)

    def flush(self) -> None:
        if self.pairs:
            with open(self.path, "a", encoding="utf-8") as out:
                out.writelines(f"{m} {s} {e}\n" for m, s, e in sorted(self.pairs))
            self.pairs.clear()


_TRACE = _Trace(os.environ[TRACE_ENV]) if os.environ.get(TRACE_ENV) else None


@dataclass(frozen=True)
class Rows(Generic[S, E]):
    """Where one machine's rows live (observers see the machine's name as the entity)."""

    machine: Lifecycle[S, E]
    table: str
    key: str


RUNS = Rows(RUN, "runs", "run_id")
WORKFLOW_TASKS = Rows(WORKFLOW_TASK, "workflow_tasks", "task_id")
ACTIVITY_TASKS = Rows(ACTIVITY_TASK, "activity_tasks", "task_id")
ACTIVITY_ATTEMPTS = Rows(ACTIVITY_ATTEMPT, "activity_attempts", "attempt_id")
ACTIVITY_EXECUTIONS = Rows(ACTIVITY_EXECUTION, "activity_executions", "execution_id")
QUERY_TASKS = Rows(QUERY_TASK, "query_tasks", "query_task_id")
TIMERS = Rows(TIMER, "timers", "timer_id")
CONDITION_WAITS = Rows(CONDITION_WAIT, "condition_waits", "condition_wait_id")
UPDATES = Rows(UPDATE, "updates", "update_id")
CHILDREN = Rows(CHILD, "children", "child_call_id")
WORKERS = Rows(WORKER, "workers", "worker_id")
CANCELLATION_REQUESTS = Rows(CANCELLATION_REQUEST, "cancellation_requests", "request_id")
WORKER_SESSIONS = Rows(SESSION, "worker_sessions", "session_id")


def step(machine: Lifecycle[S, E], state: S | str, event: E) -> S:
    """The state after ``event`` in ``state`` by ``machine``'s table; ``IllegalTransition`` if it has no row."""
    source = machine.states(state)
    target = machine.step(source, event)
    if _TRACE is not None:
        _TRACE.pairs.add((machine.name, source.value, event.value))
    return target


def initial(rows: Rows[S, E]) -> str:
    """The status a new row of ``rows`` is inserted with."""
    return rows.machine.initial.value


def move(
    t: T,
    rows: Rows[S, E],
    key: str,
    state: S | str,
    *events: E,
    also: str = "",
    args: Iterable[Any] = (),
    where: str = "",
    where_args: Iterable[Any] = (),
    quiet: bool = False,
    **note: Any,
) -> S | None:
    """Move the row ``key`` from ``state`` through ``events`` (one write, where the walk ends): the new
    status, or ``None`` when the row was no longer in ``state`` (or ``where`` no longer held), in which case
    nothing was written.

    ``also`` is more of the ``SET`` clause (with ``args``); ``where`` more of the condition (with
    ``where_args``). Unless ``quiet``, observers are offered the transition with ``note`` as its extra fields.
    A self-loop with nothing else to write writes nothing.
    """
    source = rows.machine.states(state)
    target = source
    for event in events:
        target = step(rows.machine, target, event)
    if target == source and not also:
        return target
    cur = t.db.execute(
        f"UPDATE {rows.table} SET status = ?{', ' + also if also else ''}"
        f" WHERE {rows.key} = ? AND status = ?{' AND ' + where if where else ''}",
        (target.value, *args, key, source.value, *where_args),
    )
    if cur.rowcount != 1:
        return None
    if not quiet:
        t.fx.transition(rows.machine.name, key, source.value, target.value, **note)
    return target


def claim(
    t: T,
    rows: Rows[S, E],
    key: str,
    state: S | str,
    *,
    also: str,
    args: Iterable[Any],
    where: str = "",
    where_args: Iterable[Any] = (),
) -> S | None:
    """A poll's claim of a workflow, activity or query task, by its table: a ready (pending) task is claimed;
    one still recorded as leased whose lease expired is recovered first (``expire``, then ``claim``; §9 "the
    task goes back to ready with the same task_id … the next poll leases it"). Conditional like :func:`move`
    (a leased one only while its lease is still expired); quiet: each kind tells observers itself."""
    events, lapsed = rows.machine.events, state == "leased"
    walk = (events("expire"), events("claim")) if lapsed else (events("claim"),)
    conditions = " AND ".join(c for c in (where, "lease_expires_at <= ?" if lapsed else "") if c)
    extra = (*where_args, *((t.now,) if lapsed else ()))
    return move(t, rows, key, state, *walk, also=also, args=args, where=conditions, where_args=extra, quiet=True)


def sources(rows: Rows[S, E], event: E, states: Iterable[S] | None = None) -> list[S]:
    """The states of ``rows`` (or of ``states`` only) that have a row for ``event`` in the table."""
    machine = rows.machine
    return [source for source in (states if states is not None else machine.states) if machine.can(source, event)]


def move_all(
    t: T,
    rows: Rows[S, E],
    event: E,
    where: str,
    args: Iterable[Any] = (),
    *,
    states: Iterable[S] | None = None,
    also: str = "",
    also_args: Iterable[Any] = (),
) -> int:
    """Move every row matching ``where`` whose status has a row for ``event`` in the table (optionally only
    rows in ``states``); rows in any other state are left as they are. Returns how many moved. Bulk moves are
    not offered to observers one by one."""
    machine = rows.machine
    where_args, set_args = tuple(args), tuple(also_args)
    moved = 0
    for source in sources(rows, event, states):
        target = machine.table[(source, event)]
        cur = t.db.execute(
            f"UPDATE {rows.table} SET status = ?{', ' + also if also else ''} WHERE status = ? AND ({where})",
            (target.value, *set_args, source.value, *where_args),
        )
        if cur.rowcount:
            step(machine, source, event)
            moved += cur.rowcount
    return moved


class BulkMove(NamedTuple):
    """One :func:`move_all` to make: ``event`` on the rows of ``rows`` (only those in ``states``, when given),
    with ``also`` (and ``also_args``) more of its ``SET`` clause."""

    rows: Rows[Any, Any]
    event: StrEnum
    states: tuple[StrEnum, ...] | None = None
    also: str = ""
    also_args: tuple[Any, ...] = ()

    def apply(self, t: T, where: str, args: tuple[Any, ...]) -> int:
        return move_all(
            t, self.rows, self.event, where, args, states=self.states, also=self.also, also_args=self.also_args
        )


def pending_moves(t: T, moves: Sequence[BulkMove], where: str, args: tuple[Any, ...]) -> list[BulkMove]:
    """The ``moves`` that would move a row matching ``where``, found by one statement: a close usually leaves
    nothing open, and one read costs less than an ``UPDATE`` per table and state that moves nothing."""
    shape = (where, *((bulk.rows.table, bulk.event, bulk.states) for bulk in moves))
    probe = _PROBES.get(shape)
    if probe is None:
        probe = _PROBES[shape] = _probe(moves, where)
    sql, conditions = probe
    found = t.db.execute(sql, args * conditions).fetchone()
    return [bulk for bulk, holds in zip(moves, found, strict=True) if holds]


# The statement of pending_moves for each shape of moves (their tables, events and states) and condition, with how
# many times the condition appears in it: a handful of shapes, each built once.
_PROBES: dict[tuple[Any, ...], tuple[str, int]] = {}


def _probe(moves: Sequence[BulkMove], where: str) -> tuple[str, int]:
    columns = []
    conditions = 0
    for bulk in moves:
        # One index lookup per state (an IN list would build a temporary table each time). The states are the
        # model's names (identifiers, never input), written out so that no bound value decides which index of a
        # table with partial indexes the statement may use.
        states = [source.value for source in sources(bulk.rows, bulk.event, bulk.states)]
        assert all(state.isidentifier() for state in states), states
        exists = [
            f"EXISTS (SELECT 1 FROM {bulk.rows.table} WHERE status = '{state}' AND ({where}))" for state in states
        ]
        columns.append(f"({' OR '.join(exists)})")
        conditions += len(states)
    return f"SELECT {', '.join(columns)}", conditions
