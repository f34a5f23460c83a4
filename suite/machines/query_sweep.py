"""The query sweep of the query, signal and update machine: a deterministic phase after its examples over the
query-task cells (:mod:`suite.protocol.coverage`) the examples left cold.

The sweep brings one query task into each state with cold cells — leased, answered (completed), failed by its
worker, timed out (its caller's wait ended first), and still pending when its run closes or its caller's wait
ends — on a task queue of its own with three workers, and makes each cold call there: a poll, a complete and a
fail by the task's holder and by a worker that never held it, the operator closing the run. Calls that leave the
task as it is come first; the holder's answer ends an instance. The reports are judged by the query fencing
model as the examples' are; a poll of the queue may lease the task only while it is pending (a query task is
never handed out again); the caller's answer is judged as the examples judge it.

A pending task a worker can name (its lease lapsed before the caller's wait ended) needs a query-task lease
shorter than the query timeout. On a target whose query-task lease is not shorter (the reference server's test
profile makes the two equal) those cells, and the clock's expiry of a query lease, are impossible: the matrix
makes them not applicable to that target, with the reason (``suite.protocol.coverage.target_ruled_out``). On a
target whose lease is shorter they are reachable, and this sweep does not reach them yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from suite.client import Reply
from suite.outcomes import HarnessError
from suite.protocol.coverage import Actor
from suite.protocol.fencing import QueryTaskView, parse_rfc3339
from suite.protocol.lifecycles import QueryTaskStatus

from .base import EXPIRY_STEP, note
from .cells import Calls, Plan, one_change_each, plan_cold_cells
from .query_worker import outcome_of, settle

# The machine is suite.machines.queries_signals', which imports this module: typed loosely.
QuerySignalMachine = Any

__all__ = ["cold_plan", "sweep_query_cells"]

# A poll holds the target's clock for a second: polls come after the reports, so those land well before the
# caller's deadline.
ORDER = ("fail", "complete", "close_run", "poll", "time_out")
SWEPT_STATES = ("pending", "leased", "completed", "failed", "timed_out")
_Q = QueryTaskStatus


def _changes(state: str, operation: str, actor: Actor) -> bool:
    if operation == "time_out" or state == "pending":
        return operation in ("poll", "close_run", "time_out")
    return state == "leased" and actor is Actor.HOLDER and operation in ("complete", "fail")


def _swept(state: str, operation: str) -> bool:
    # A pending task is named by a worker only after a lease lapsed: its reports are not planned here.
    return not (state == "pending" and operation in ("complete", "fail"))


def _arrange(state: str, keep: Calls, ending: Calls) -> list[Calls]:
    polls = [oa for oa in keep if oa[0] == "poll"]
    if state != "leased" or not polls or len(keep) == len(polls):
        return one_change_each(state, keep, ending)
    # The holder's answer lands right after the reports and the run's close: the polls, which hold the
    # target's clock, go with the instance that waits out the caller's deadline anyway.
    keep = [oa for oa in keep if oa[0] != "poll"]
    ending = [oa for oa in ending if oa[0] != "time_out"] + [*polls, ("time_out", Actor.CLOCK)]
    return [keep + ending[:1], *([oa] for oa in ending[1 : -1 - len(polls)]), ending[-1 - len(polls) :]]


def cold_plan(hits: Mapping[str, int]) -> Plan:
    """Per state, the instances to make: each a list of (operation, actor), the one call that changes the task
    (if any) last. A pending task is named by a worker only after a lease lapsed: not planned here."""
    return plan_cold_cells(
        "query_task", SWEPT_STATES, ORDER, _changes, hits, swept=_swept, holder_last=True, arrange=_arrange
    )


@dataclass(eq=False)
class Query:
    """One query of the sweep: its caller's call in the background, and its task as the model holds it."""

    run: Any
    name: str
    call: asyncio.Task[Reply]
    sent: datetime
    workers: list[str]
    view: QueryTaskView | None = None
    deadline: tuple[datetime, datetime] | None = None
    answered: bool | None = None  # the holder's answer landed (None: none given, or unknown)
    verb: str = ""
    result: dict[str, str] | None = None  # the result envelope the holder's complete carries


def state_of(m: QuerySignalMachine, q: Query, at: datetime) -> str | None:
    """The task's cover state at ``at``: a live task past its caller's deadline is timed out; within the
    margin of the deadline window the model cannot say."""
    if q.view is None or q.deadline is None:
        return "pending"
    status = q.view.status
    if status in (_Q.PENDING, _Q.LEASED):
        earliest, latest = q.deadline
        if earliest - timedelta(seconds=m.MARGIN) <= at <= latest + timedelta(seconds=m.MARGIN):
            return None
        if at > latest:
            return "timed_out"
    return status.value


def sweep_query_cells(m: QuerySignalMachine) -> None:
    for state, instances in cold_plan(m.cells).items():
        for calls in instances:
            q = m.sweep_start(lambda s=state, c=calls: _start(m, s, c))
            if q is None:
                continue
            try:
                _act(m, q, calls)
            finally:
                m.run(settle(q.call))
            m.histories_are_sound()


def _start(m: QuerySignalMachine, state: str, calls: list[tuple[str, Actor]]) -> Query | None:
    """A run on a queue of its own, queried; its task leased by the first worker unless the instance is about
    a pending task, then brought into ``state``."""
    m.queue = m.ctx.uid("q")
    m.workers = [m.run(m.ctx.register(m.queue)) for _ in range(3)]
    run = m.new_run()
    name = m.unique("qry")
    sent = m.now()
    call = m.loop.create_task(
        m.ctx.client.control(
            "POST", f"/workflows/{run.workflow_id}/query/{name}", {"input": [name]}, timeout=m.query_timeout + 15
        )
    )
    q = Query(run, name, call, sent, list(m.workers))
    if state == "pending":
        return q
    task = m.lease_query(run, name, call, m.workers[0])
    if task is None:
        m.run(settle(call))
        return None
    m.hit("query_task", "pending", "poll", Actor.OTHER_WORKER)
    timeout = timedelta(seconds=m.query_timeout)
    q.deadline = (sent + timeout, m.now() + timeout)
    q.view = QueryTaskView(
        str(task["query_task_id"]),
        _Q.LEASED,
        int(task["query_task_attempt"]),
        m.workers[0],
        parse_rfc3339(task.get("lease_expires_at")),
    )
    if state in ("completed", "failed"):
        _report(m, q, "complete" if state == "completed" else "fail", Actor.HOLDER)
    elif state == "timed_out":
        m.run(m.ctx.wait(until=q.deadline[1] + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))
    return q


def _body(m: QuerySignalMachine, q: Query, verb: str) -> dict[str, Any]:
    if verb == "complete":
        q.result = q.result or m.ctx.envelope({"query": q.name})
        return {"result_envelope": q.result}
    return {"failure": {"message": "conformance sweep", "reason": "query_rejected"}}


def _report(m: QuerySignalMachine, q: Query, verb: str, actor: Actor) -> None:
    """A complete or fail of the task by its holder or by a worker that never held it, judged by the model."""
    assert q.view is not None
    assert q.deadline is not None
    at = m.now()
    state = state_of(m, q, at)
    owner = q.workers[0] if actor is Actor.HOLDER else q.workers[2]
    got = m.query_report(q.view, verb, _body(m, q, verb), owner, q.view.attempt, q.deadline)
    if got is None:
        q.run.uncertain = True
        return
    if state is not None:
        m.hit("query_task", state, verb, actor)
    if got == "ok" and actor is Actor.HOLDER and q.view.status is _Q.LEASED:
        status = _Q.COMPLETED if verb == "complete" else _Q.FAILED
        q.view = QueryTaskView(q.view.query_task_id, status, q.view.attempt, owner, q.view.lease_expires_at)
        q.answered, q.verb = True, verb
    elif got != "ok" and actor is Actor.HOLDER and q.view.status is _Q.LEASED:
        q.answered = False  # too late: the caller timed out


def _poll(m: QuerySignalMachine, q: Query, actor: Actor) -> None:
    """A poll of the instance's queue: only a pending task may be leased (a query task is never handed out
    again once leased, answered or timed out)."""
    at = m.now()
    state = state_of(m, q, at)
    worker = q.workers[0] if actor is Actor.HOLDER else q.workers[2]
    reply = m.call(m.ctx.poll("query", worker, m.queue))
    if reply is None:
        q.run.uncertain = True
        return
    task = m.check_poll_shape(reply, "query-task").get("task")
    if isinstance(task, dict) and state is not None:
        raise m.violation(
            "QUERY-READ-ONLY",
            f"a query task that is {state} was leased again to {worker}: query tasks are not retried",
            expected="no query task",
            received={"query_task_id": task.get("query_task_id"), "query_task_attempt": task.get("query_task_attempt")},
            replies=[reply],
        )
    if state is not None:
        m.hit("query_task", state, "poll", actor)


def _act(m: QuerySignalMachine, q: Query, calls: list[tuple[str, Actor]]) -> None:
    for operation, actor in calls:
        if q.run.uncertain:
            return
        if operation == "poll" and q.view is None:
            task = m.lease_query(q.run, q.name, q.call, q.workers[2])
            if task is not None:
                m.hit("query_task", "pending", "poll", Actor.OTHER_WORKER)
            return
        if operation == "poll":
            _poll(m, q, actor)
        elif operation in ("complete", "fail"):
            _report(m, q, operation, actor)
        elif operation == "close_run" and q.view is None:
            _close_pending(m, q)
        elif operation == "close_run":
            state = state_of(m, q, m.now())
            m.close_run(q.run, "cancel")
            if state is not None and not q.run.uncertain:
                m.hit("query_task", state, "close_run", Actor.OPERATOR)
        elif operation == "time_out":
            _wait_out(m, q)
    if q.answered is not None:
        _judge_answer(m, q)


def _close_pending(m: QuerySignalMachine, q: Query) -> None:
    """The run closes while its query waits for a worker. The query's call and the close race: a query task
    pending when the close lands is failed with it (the caller gets 409 at once); a query that lands after the
    close waits for a worker like any query of a closed run, and nobody serves it (504 once its wait ends). Only
    the 409 shows the task was pending at the close: only it is counted in that cell."""
    m.close_run(q.run, "cancel")
    if q.run.uncertain:
        return
    m.run(m.ctx.wait(until=q.sent + timedelta(seconds=m.query_timeout + m.MARGIN) + EXPIRY_STEP))
    try:
        reply = m.run(outcome_of(q.call))
    except HarnessError:
        return
    note(reply.exchange.summary())
    if reply.status == 504 or reply.resent or reply.reason == "query_worker_unavailable":
        return
    m.expect_status(reply, 409, "QUERY-REJECTED-409", "a query pending when its run closes is refused")
    m.hit("query_task", "pending", "close_run", Actor.OPERATOR)


def _wait_out(m: QuerySignalMachine, q: Query) -> None:
    """Nobody answers: the caller's wait ends (504 query_worker_timeout), the task is timed out."""
    # The state the clock's event fires in: the task as nobody has answered it (its deadline is the event).
    state = q.view.status.value if q.view is not None else "pending"
    m.run(m.ctx.wait(until=q.sent + timedelta(seconds=m.query_timeout + m.MARGIN) + EXPIRY_STEP))
    if _judge_caller(m, q, 504, "QUERY-TIMEOUT-504", "a query nobody answers times out") and state is not None:
        m.hit("query_task", state, "time_out", Actor.CLOCK)


def _judge_caller(m: QuerySignalMachine, q: Query, status: int, requirement: str, message: str) -> bool:
    """The caller's answer, judged: ``status`` (with a reason the examples' judges name); False when it never came
    or the target answered that no worker is polling at all (a target's right before it waits). A call the network
    delivered again (its first answer lost) is not judged: the copy may have met another moment of the run."""
    try:
        reply = m.run(outcome_of(q.call))
    except HarnessError:
        q.run.uncertain = True
        return False
    note(reply.exchange.summary())
    if reply.resent or q.run.uncertain:
        return False
    if reply.reason == "query_worker_unavailable":
        return False
    m.expect_status(reply, status, requirement, message)
    return True


def _judge_answer(m: QuerySignalMachine, q: Query) -> None:
    try:
        reply = m.run(outcome_of(q.call))
    except HarnessError:
        return
    note(reply.exchange.summary())
    answer = "complete" if q.verb == "complete" else "rejected"
    m.judge_query_answer(reply, q.answered, answer, q.result or {})
