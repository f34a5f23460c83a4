"""The workflow-lease machine's run sweep: after the workflow-task sweep, the run cells
(:mod:`suite.protocol.coverage`) the examples left cold.

A run is brought into each state with cold cells — its first task leased (pending), woken by a signal after
waiting with its next task leased (running), the first run after a continue-as-new with its first task leased
(continued), waiting with no open task, completed, failed, cancelled, terminated — on a queue of its own, and
each cold call is made there: a workflow-task complete of each batch the run entity tells apart (a wait opened,
the workflow completed, failed, continued as new) and a workflow-task fail, all by the worker holding (or last
holding) the run's task; a signal, a history read, a cancel and a terminate by the operator. In a state with no
live task the holder's calls are stale and must be fenced. Calls that leave the run as it is come first; one that
changes it ends its instance. Every answer is judged by the fencing model and the run's history by the history
oracle, as the machine judges its own.

The clock's timeout of a run is swept last: a run of its own is started with a timeout of ``TIMEOUT`` seconds
for each live state whose timeout cell is cold — run_timeout_seconds for a pending, running or waiting run;
execution_timeout_seconds for a run that then continues as new, so that the run after it, resuming, closes at the
deadline the first run's start set. Every run is brought into its state, its timeout is waited out once for all,
and describe must then show it failed with closed_reason timed_out (``RUN-TIMEOUT-CLOSES-RUN``); its history,
read back, holds one WorkflowTimedOut. Describe before the wait shows it still open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from suite.protocol.coverage import ENTITIES, Actor, cell_key, cells
from suite.protocol.lifecycles import RunEvent, TaskEvent, TaskStatus
from suite.protocol.oracle import Applied, Kind

from .workflow_sweep import Instance, point_at, poll_instance, signal_instance, start_instance

WorkflowLeaseMachine = Any

__all__ = ["TIMEOUT", "cold_plan", "sweep_run_cells", "timeout_plan"]

ORDER = (
    "read_history",
    "signal",
    "open_waits",
    "complete_workflow",
    "fail_workflow",
    "continue_as_new",
    "task_fail",
    "cancel",
    "terminate",
)
SWEPT_STATES = ("pending", "running", "continued", "waiting", "completed", "failed", "cancelled", "terminated")
LIVE = ("pending", "running", "continued")
BATCHES: dict[str, tuple[dict[str, Any], RunEvent, Kind]] = {
    "open_waits": ({"type": "start_timer", "delay_seconds": 3600}, RunEvent.BATCH_OPEN_WAITS, Kind.TIMER),
    "complete_workflow": ({"type": "complete_workflow"}, RunEvent.BATCH_COMPLETE, Kind.COMPLETE),
    "fail_workflow": ({"type": "fail_workflow", "message": "conformance sweep"}, RunEvent.BATCH_FAIL, Kind.FAIL),
}


def _changes(state: str, operation: str) -> bool:
    if operation in ("cancel", "terminate"):
        return state in LIVE or state == "waiting"
    if operation == "signal":
        return state == "waiting"  # a signal gives a waiting run a task: running
    return state in LIVE and operation not in ("read_history",)


def cold_plan(hits: dict[str, int] | Any) -> dict[str, list[list[str]]]:
    """Per state, the instances to make: each a list of operations, the one that changes the run last."""
    entity = next(e for e in ENTITIES if e.name == "run")
    plan: dict[str, list[list[str]]] = {}
    for state in SWEPT_STATES:
        cold = [
            c.operation
            for c in cells(entity)
            if c.state == state and c.ruled_out is None and c.actor is not Actor.CLOCK and not hits.get(c.key)
        ]
        cold.sort(key=ORDER.index)
        keep = [op for op in cold if not _changes(state, op)]
        ending = [op for op in cold if _changes(state, op)]
        instances = [keep + ending[:1], *([op] for op in ending[1:])] if cold else []
        if instances:
            plan[state] = instances
    return plan


# seconds: the timeout a sweep run is started with. Long enough for every timed run to be brought into its state
# (a few requests each) well before the first deadline, short enough that waiting it out once costs little.
TIMEOUT = 5
# seconds the first run of the continued instance waits before it continues as new: a run that counted the
# execution timeout from its own start would close this much later than the execution's deadline.
PAUSE = 3
# seconds past a deadline by which the run must show it closed (the child timeout checks allow as much)
SLACK = 1.5
TIMED_STATES = ("pending", "running", "waiting", "continued")


def timeout_plan(hits: dict[str, int] | Any) -> list[str]:
    """The live run states whose clock timeout cell nothing has reached yet."""
    return [s for s in TIMED_STATES if not hits.get(cell_key("run", s, "time_out", Actor.CLOCK))]


def sweep_run_cells(m: WorkflowLeaseMachine) -> None:
    _sweep_calls(m)
    sweep_run_timeouts(m)


def _sweep_calls(m: WorkflowLeaseMachine) -> None:
    for state, instances in cold_plan(m.cells).items():
        for ops in instances:
            inst = m.sweep_start(lambda s=state: _bring(m, s))
            if inst is None or inst.task is None:
                continue
            for op in ops:
                if inst.run.uncertain or inst.task.uncertain:
                    break
                _act(m, inst, op)
            m.check_touched_histories(m.run_by_id)


def _bring(m: WorkflowLeaseMachine, state: str) -> Instance:
    """A run on a queue of its own with its first task leased, then brought into ``state``."""
    inst = start_instance(m, state, [])
    inst.task = poll_instance(m, inst, inst.workers[0])
    if inst.task is None or state == "pending":
        return inst
    if state == "continued":
        point_at(m, inst)
        nxt = m.continue_run(inst.task)  # judged there; the new run's first task leased and read back
        inst.task = nxt
        if nxt is not None:
            inst.run = nxt.run
        return inst
    if state in ("running", "waiting"):
        _batch(m, inst, "open_waits")
        if state == "running":
            signal_instance(m, inst)
            inst.task = poll_instance(m, inst, inst.workers[0]) or inst.task
    elif state in ("completed", "failed"):
        _batch(m, inst, "complete_workflow" if state == "completed" else "fail_workflow")
    else:
        m.close_run(inst.run, "cancel" if state == "cancelled" else "terminate")
    return inst


def _batch(m: WorkflowLeaseMachine, inst: Instance, op: str) -> None:
    """The holder completes the run's task with the batch ``op`` stands for, judged by the fencing model."""
    task = inst.task
    assert task is not None
    if op == "continue_as_new" and task.status is TaskStatus.LEASED and inst.run.open:
        m.continue_run(task)  # judged and counted there; the new run's first task is leased and read
        return
    command = (
        {"type": "continue_as_new", "arguments": m.ctx.envelope([inst.run.run_id])}
        if op == "continue_as_new"
        else dict(BATCHES[op][0])
    )
    if command["type"] == "complete_workflow":
        command["result"] = m.ctx.envelope("done")
    at = m.now()
    allowed = m.expected(task, task.owner, task.attempt, at)
    reply = m.call(m.ctx.complete({"task_id": task.task_id}, [command], owner=task.owner, attempt=task.attempt))
    if reply is None:
        task.uncertain = inst.run.uncertain = True
        if op != "continue_as_new":  # maybe applied: its history may show the batch, once
            m.ack(inst.run.run_id, BATCHES[op][2], applied=Applied.MAYBE)
        else:
            m.ack(inst.run.run_id, Kind.CONTINUE_AS_NEW, applied=Applied.MAYBE)
        return
    got = m.judge(task, allowed, reply, f"complete ({op}, sweep)")
    m.hit_task(task, "complete", Actor.HOLDER, at, got)
    m.hit_run(inst.run, op, Actor.HOLDER)
    m.touched.add(inst.run.run_id)
    if got != "ok" or op == "continue_as_new":
        return  # the model allowed only the refusal (a live continue_as_new goes through continue_run)
    task.step(TaskEvent.COMPLETE)
    inst.run.step(BATCHES[op][1])
    m.ack(inst.run.run_id, BATCHES[op][2])
    if op == "fail_workflow":
        m.check_touched_histories(m.run_by_id)  # its WorkflowFailed, judged by the history oracle
        m.reached("fail_workflow_read_back")


def _fail(m: WorkflowLeaseMachine, inst: Instance) -> None:
    """The holder fails the run's task (a replay failure), judged by the fencing model."""
    task = inst.task
    assert task is not None
    at = m.now()
    allowed = m.expected(task, task.owner, task.attempt, at)
    body = {"failure": {"message": "replay failed (conformance sweep)"}}
    reply = m.call(m.ctx.wf_call({"task_id": task.task_id}, "fail", body, owner=task.owner, attempt=task.attempt))
    if reply is None:
        task.uncertain = inst.run.uncertain = True
        return
    got = m.judge(task, allowed, reply, "fail (sweep)")
    m.hit_task(task, "fail", Actor.HOLDER, at, got)
    m.hit_run(inst.run, "task_fail", Actor.HOLDER)
    m.touched.add(inst.run.run_id)
    if got == "ok":
        task.step(TaskEvent.FAIL)
        inst.run.step(RunEvent.TASK_FAIL)


def _act(m: WorkflowLeaseMachine, inst: Instance, op: str) -> None:
    task = inst.task
    assert task is not None
    m.queue, m.workers = inst.queue, inst.workers
    if op == "read_history":
        m.touched.add(inst.run.run_id)
        m.check_touched_histories(m.run_by_id)
    elif op == "signal":
        signal_instance(m, inst)
    elif op in ("cancel", "terminate"):
        m.close_run(inst.run, op)
    elif op == "task_fail":
        _fail(m, inst)
    else:
        _batch(m, inst, op)


@dataclass(eq=False)
class Timed:
    """A run started with a timeout, brought into ``state``; its deadline (its execution's: its first run's start
    plus ``TIMEOUT``) lies between ``earliest`` and ``latest``, the moments before the start left and after it was
    answered."""

    inst: Instance
    state: str
    earliest: datetime
    latest: datetime


def sweep_run_timeouts(m: WorkflowLeaseMachine) -> None:
    """One run per cold timeout cell, each timed out by the server's clock while in its state."""
    states = timeout_plan(m.cells)
    if not states or m.ctx.max_wait < TIMEOUT + SLACK + m.MARGIN:
        return  # a target whose waits are capped below the timeout: the cells stay not reached
    timed = [t for s in states if (t := m.sweep_start(lambda s=s: _bring_timed(m, s))) is not None]
    timed = [t for t in timed if not (t.inst.run.uncertain or t.inst.task is None or t.inst.task.uncertain)]
    if not timed:
        return
    continuing = [t for t in timed if t.state == "continued"]
    if continuing:
        # The first run waits (no task open), then continues as new; every other deadline stays ahead meanwhile.
        others = [t.earliest for t in timed if t.state != "continued"]
        pause = continuing[0].latest - timedelta(seconds=TIMEOUT - PAUSE)
        if others:
            pause = min(pause, min(others) - timedelta(seconds=2 * m.MARGIN))
        m.run(m.ctx.wait(until=pause))
        for t in continuing:
            _continue_timed(m, t)
    timed = [t for t in timed if not (t.inst.run.uncertain or t.inst.task is None or t.inst.task.uncertain)]
    for t in timed:
        if m.now() < t.earliest - timedelta(seconds=m.MARGIN):
            _judge_open(m, t)  # its deadline is still ahead: the run must be open
    m.run(m.ctx.wait(until=max(t.latest for t in timed) + timedelta(seconds=SLACK)))
    for t in timed:
        _judge_timed_out(m, t)
    m.check_touched_histories(m.run_by_id)


def _bring_timed(m: WorkflowLeaseMachine, state: str) -> Timed:
    limit = "execution_timeout_seconds" if state == "continued" else "run_timeout_seconds"
    sent = m.now()
    inst = start_instance(m, state, [], **{limit: TIMEOUT})
    deadline = timedelta(seconds=TIMEOUT)
    timed = Timed(inst, state, sent + deadline, m.now() + deadline)
    inst.task = poll_instance(m, inst, inst.workers[0])
    if inst.task is not None and state in ("running", "waiting", "continued"):
        _batch(m, inst, "open_waits")  # a continued instance's first run waits for its pause
        if state == "running":
            signal_instance(m, inst)
            inst.task = poll_instance(m, inst, inst.workers[0]) or inst.task
    return timed


def _continue_timed(m: WorkflowLeaseMachine, t: Timed) -> None:
    """Wake the waiting first run, lease its task and continue it as new: the new run, resuming, is continued."""
    inst = t.inst
    signal_instance(m, inst)
    task = poll_instance(m, inst, inst.workers[0])
    if task is None:
        inst.run.uncertain = True
        return
    point_at(m, inst)
    nxt = m.continue_run(task)
    inst.task = nxt
    if nxt is not None:
        inst.run = nxt.run


def _describe(m: WorkflowLeaseMachine, t: Timed) -> dict[str, Any] | None:
    reply = m.call(m.client.control("GET", f"/workflows/{t.inst.run.workflow_id}"))
    if reply is None:
        t.inst.run.uncertain = True
        return None
    m.expect_status(reply, 200, "RUN-TIMEOUT-CLOSES-RUN", "describe of a started workflow")
    body: dict[str, Any] = reply.json()
    if body.get("run_id") != t.inst.run.run_id:
        raise m.unexpected(
            reply, "RUN-TIMEOUT-CLOSES-RUN", "describe shows the run the sweep timed", t.inst.run.run_id, ""
        )
    return body


def _judge_open(m: WorkflowLeaseMachine, t: Timed) -> None:
    body = _describe(m, t)
    if body is None:
        return
    if body.get("status") not in ("pending", "running", "waiting"):
        raise m.violation(
            "RUN-TIMEOUT-CLOSES-RUN",
            f"run {t.inst.run.run_id} ({t.state}) closed before its {TIMEOUT} s timeout",
            expected="an open run",
            received={k: body.get(k) for k in ("status", "closed_reason")},
        )


def _judge_timed_out(m: WorkflowLeaseMachine, t: Timed) -> None:
    """``SLACK`` seconds past its deadline the run shows failed, closed_reason timed_out (one look: polling on
    would let the target's clock run on past the moment judged)."""
    run = t.inst.run
    body = _describe(m, t)
    if body is None:
        return
    got = {k: body.get(k) for k in ("status", "closed_reason")}
    if got != {"status": "failed", "closed_reason": "timed_out"}:
        late = (m.now() - t.latest).total_seconds()
        raise m.violation(
            "RUN-TIMEOUT-CLOSES-RUN",
            f"run {run.run_id} ({t.state}, its execution started with a {TIMEOUT} s timeout) is not timed out "
            f"{late:.1f} s past its deadline",
            expected={"status": "failed", "closed_reason": "timed_out"},
            received=got,
        )
    m.hit_run(run, "time_out", Actor.CLOCK)
    run.step(RunEvent.TIME_OUT)
    m.ack(run.run_id, Kind.TIME_OUT)
    m.touched.add(run.run_id)
    m.reached("run_timed_out")
