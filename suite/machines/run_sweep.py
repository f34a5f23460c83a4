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

Not swept: the clock's timeout of a run (no run is started with an execution timeout).
"""

from __future__ import annotations

from typing import Any

from suite.protocol.coverage import ENTITIES, Actor, cells
from suite.protocol.lifecycles import RunEvent, TaskEvent, TaskStatus
from suite.protocol.oracle import Applied, Kind

from .workflow_sweep import Instance, point_at, poll_instance, signal_instance, start_instance

WorkflowLeaseMachine = Any

__all__ = ["cold_plan", "sweep_run_cells"]

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


def sweep_run_cells(m: WorkflowLeaseMachine) -> None:
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
