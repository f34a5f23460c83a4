"""The workflow-lease machine's child sweep: after the run sweep, the child and cooperative-cancellation cells
(:mod:`suite.protocol.coverage`) no example reaches (no rule starts a child).

Each instance is a parent on a queue of its own whose first workflow task starts one child (two for a second
result) on a queue of its own, with a worker on each queue. The sweep brings the child into each state with cold
cells — running; completed, failed, cancelled or terminated with its parent open; waiting out a retry backoff;
its parent closed while it ran, under each parent-close policy (``abandon`` by omitting it, the default); the
parent's second child result — and makes each cold call there: the parent's worker reading what the child did (the
resume context of the task the result woke, or a history read), the child's worker closing the child run
(complete or fail, fenced where its run is closed), the operator closing the parent, cancelling or terminating the
child, and the server's clock starting the child's next run after its backoff.

A parent closed under ``request_cancellation`` asks its child to clean up: the cooperative cancellation request.
The sweep brings one into each state — requested (no delivery committed), delivered on the first child task that
carries it, carried again by a later child task, past its cleanup deadline (the server closed the child), resolved
by the child — and makes each cold call there: a child task carrying it and its holder committing the delivery
(again, on a later task: the committed one answers), the child closing itself, the operator reading the parent's
history, and the clock's cleanup deadline. The instances whose deadline must pass wait it out together, last.

Every answer is judged by the model — the fencing guard for every workflow-task call, the parent-close policies
(:data:`suite.protocol.lifecycles.PARENT_CLOSE_EFFECTS`) for the children a parent's close leaves, the resume
context a child's result gives its parent — and every history by the history oracle, which knows what a parent's
and a child's histories must record of them (:mod:`suite.protocol.oracle`). Only against a target that advertises
child workflows (and, for the requests, cooperative cancellation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from suite.outcomes import CheckFailure
from suite.protocol.commands import RetryPolicy
from suite.protocol.coverage import Actor
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.lifecycles import (
    CHILD_CLOSED_EVENTS,
    PARENT_CLOSE_EFFECTS,
    CancellationRequestEvent,
    CancellationRequestStatus,
    ChildEvent,
    ChildStatus,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
)
from suite.protocol.oracle import Kind
from suite.protocol.promises import advertised

from .base import EXPIRY_STEP
from .cells import Calls, Plan, cancellation_state, child_state, plan_cold_cells
from .world import ChildShadow, RequestShadow, RunShadow

# The machine and its task shadows are those of suite.machines.workflow_leases (which imports this module).
WorkflowLeaseMachine = Any
TaskM = Any

__all__ = ["CHILD_REQUIREMENTS", "cancellation_plan", "child_plan", "sweep_child_cells"]

# The requirements the sweep judges, each passed only once the sweep reached the state it names (the machine's
# REQUIREMENTS): a child's result read from the task it woke (the parent's second result too), each parent-close
# policy applied to a child the operator's cancel of its parent left, a child's next run after its backoff; a
# cooperative request carried by a later task, its delivery repeated, a delivered child closed at its deadline, a
# child that closed itself, the outcome in the parent's history.
CHILD_REQUIREMENTS: dict[str, str | None] = {
    "CHILD-RESULT-WAKES-PARENT": "child_result_read",
    "CHILD-PARENT-CLOSE-DEFAULT": "abandoned_child_outlived_parent",
    "CHILD-PARENT-CLOSE-POLICIES": "parent_close_policy_applied",
    "CHILD-POLICY-RECORDED": "child_result_read",
    "CHILD-RETRY-BACKOFF": "child_restarted_after_backoff",
    "CANCEL-COOPERATIVE-REQUEST": "cancellation_carried_again",
    "CANCEL-COOPERATIVE-CLEANUP": "cooperative_child_closed_itself",
    "CANCEL-COOPERATIVE-DEADLINE": "delivered_child_closed_at_deadline",
    "CANCEL-COOPERATIVE-OUTCOME": "cancellation_outcome_read",
    "CANCEL-COOPERATIVE-DELIVERY": "delivery_repeated",
}


CHILD_ORDER = (
    "parent_reads_result",
    "child_completes",
    "child_fails",
    "cancel_child",
    "terminate_child",
    "close_parent",
    "restart",
)
# The states whose set-ups reach the most of the others' cells first (a completed child's set-up is the running
# child's complete), so the instances after them have fewer cold calls left.
CHILD_STATES = (
    "completed",
    "failed",
    "cancelled",
    "terminated",
    "backoff",
    "parent_closing_abandon",
    "parent_closing_request_cancel",
    "parent_closing_terminate",
    "parent_closing_request_cancellation",
    "second_result",
    "running",
)
CANCEL_ORDER = ("read_parent_history", "child_task", "child_closes", "deadline")
CANCEL_STATES = ("resolved", "delivered", "delivered_again", "requested", "past_deadline")
OPEN_CHILD = ("running", "parent_closing_abandon", "parent_closing_request_cancellation")
LIVE_REQUEST = ("requested", "delivered", "delivered_again")
CLOSED = frozenset({"completed", "failed", "cancelled", "terminated"})
# A child started with a retry policy: a failed run is retried once, after this backoff.
BACKOFF_SECONDS = 2
RETRY = RetryPolicy(max_attempts=2, backoff_seconds=(BACKOFF_SECONDS,))
RESULT_KINDS = {
    ChildStatus.COMPLETED: Kind.CHILD_COMPLETED,
    ChildStatus.FAILED: Kind.CHILD_FAILED,
    ChildStatus.CANCELLED: Kind.CHILD_CANCELLED,
    ChildStatus.TERMINATED: Kind.CHILD_TERMINATED,
}
RESULT_EVENTS = {
    ChildStatus.COMPLETED: "ChildRunCompleted",
    ChildStatus.FAILED: "ChildRunFailed",
    ChildStatus.CANCELLED: "ChildRunCancelled",
    ChildStatus.TERMINATED: "ChildRunTerminated",
}
# Who must catch a wrong answer to a parent's close, by the child's policy.
POLICY_REQUIREMENTS = {
    "abandon": "CHILD-PARENT-CLOSE-DEFAULT",  # the sweep's abandon children omit the policy: the default
    "request_cancellation": "CANCEL-COOPERATIVE-REQUEST",
    "request_cancel": "CHILD-PARENT-CLOSE-POLICIES",
    "terminate": "CHILD-PARENT-CLOSE-POLICIES",
}


def _child_changes(state: str, operation: str, actor: Actor) -> bool:
    if operation in ("child_completes", "child_fails", "cancel_child", "terminate_child"):
        return state in OPEN_CHILD
    if operation == "close_parent":
        return not state.startswith("parent_closing")
    return operation == "restart"


def _cancel_changes(state: str, operation: str, actor: Actor) -> bool:
    if operation == "child_task":
        return state == "requested"
    return operation in ("child_closes", "deadline") and state in LIVE_REQUEST


child_plan: Callable[[Mapping[str, int]], Plan] = partial(
    plan_cold_cells, "child", CHILD_STATES, CHILD_ORDER, _child_changes
)
cancellation_plan: Callable[[Mapping[str, int]], Plan] = partial(
    plan_cold_cells, "cancellation_request", CANCEL_STATES, CANCEL_ORDER, _cancel_changes
)


@dataclass(eq=False)
class Side:
    """One child of an instance: its shadow, its queue and worker, its workflow task as last leased."""

    child: ChildShadow
    queue: str
    worker: str
    retry: bool = False
    task: TaskM | None = None
    attempts: int = 1
    failed_at: datetime | None = None


@dataclass(eq=False)
class Instance:
    """A parent and its children brought into one state on queues of their own, and the calls to make there."""

    entity: str
    state: str
    calls: Calls
    parent: RunShadow
    queue: str
    worker: str
    task: TaskM | None
    sides: list[Side] = field(default_factory=list)
    unread: list[Side] = field(default_factory=list)  # children whose result woke the parent, not yet read
    request: RequestShadow | None = None

    @property
    def side(self) -> Side:
        """The child the state is about (of two, the second)."""
        return self.sides[-1]


def sweep_child_cells(m: WorkflowLeaseMachine) -> None:
    """Every cold child cell, then every cold cooperative-cancellation cell, against a target that has them."""
    caps = m.target.server_capabilities if m.target is not None else {}
    commands = caps.get("supported_workflow_task_commands")
    starts = isinstance(commands, list) and "start_child_workflow" in commands
    if not (starts and advertised(caps.get("parent_close_policy"))):
        return  # the child entity is not applicable (the matrix says so): no child cell to reach
    for state, instances in child_plan(m.cells).items():
        for calls in instances:
            _one(m, "child", state, calls)
    if not advertised(caps.get("cooperative_cancellation")):
        return
    deadline: list[tuple[Instance, Calls]] = []
    plan = cancellation_plan(m.cells)
    after = [c for calls in plan.pop("past_deadline", []) for c in calls]
    for state, instances in plan.items():
        for calls in instances:
            if ("deadline", Actor.CLOCK) in calls:
                inst = m.sweep_start(lambda s=state: _bring(m, "cancellation_request", s))
                if inst is not None:
                    deadline.append((inst, calls))
            else:
                _one(m, "cancellation_request", state, calls)
    if after and not any(i.state == "requested" for i, _ in deadline):
        inst = m.sweep_start(lambda: _bring(m, "cancellation_request", "requested"))
        if inst is not None:
            deadline.append((inst, [("deadline", Actor.CLOCK)]))
    _past_deadline(m, deadline, after)


def _cold(m: WorkflowLeaseMachine, entity: str, state: str, calls: Calls) -> Calls:
    return [(op, actor) for op, actor in calls if not m.cells.get(f"{entity}/{state}/{op}/{actor}")]


def _one(m: WorkflowLeaseMachine, entity: str, state: str, calls: Calls) -> None:
    """One instance: brought into ``state``, then its calls still cold made there in order."""
    calls = _cold(m, entity, state, calls)
    if not calls:
        return  # an earlier instance's set-up reached them
    inst = m.sweep_start(lambda: _bring(m, entity, state))
    if inst is None:
        return
    for op, _ in calls:
        if not inst.sides or inst.parent.uncertain or any(s.child.uncertain for s in inst.sides):
            break
        _act(m, inst, op)
    m.check_touched_histories(m.run_by_id, partial(_judge_resolution, m, inst))


# -- set-up ------------------------------------------------------------------------------------------------


def _policy_for(state: str) -> str | None:
    """The parent-close policy a state's child is started with (None: omitted, the default abandon)."""
    if state.startswith("parent_closing_"):
        policy = state.removeprefix("parent_closing_")
        return None if policy == "abandon" else policy
    return None


def _bring(m: WorkflowLeaseMachine, entity: str, state: str) -> Instance:
    if entity == "cancellation_request":
        return _bring_request(m, state)
    children = 2 if state == "second_result" else 1
    inst = _start(m, entity, state, _policy_for(state), children=children, retry=state == "backoff")
    if not inst.sides:
        return inst  # its parent's first task was lost or refused (judged there): nothing to bring about
    side = inst.side
    if state in ("completed", "second_result"):
        if state == "second_result":
            first = inst.sides[0]
            _child_closes(m, inst, first, "child_completes")
            _parent_reads(m, inst, first)
            _parent_waits(m, inst)
        _child_closes(m, inst, side, "child_completes")
    elif state in ("failed", "backoff"):
        _child_closes(m, inst, side, "child_fails")
    elif state in ("cancelled", "terminated"):
        _control_child(m, inst, side, "cancel" if state == "cancelled" else "terminate")
    elif state.startswith("parent_closing_"):
        _close_parent(m, inst, side)
    return inst


def _bring_request(m: WorkflowLeaseMachine, state: str) -> Instance:
    """A child asked to clean up (its parent closed under request_cancellation before the child's first lease),
    then brought into ``state``."""
    inst = _start(m, "cancellation_request", state, "request_cancellation", lease=False)
    if not inst.sides:
        return inst
    _close_parent(m, inst, inst.side)
    if inst.request is None:
        return inst
    if state == "requested":
        return inst
    _carried(m, inst)
    if state == "resolved":
        _child_closes(m, inst, inst.side, "child_completes")
    elif state in ("delivered", "delivered_again", "past_deadline"):
        _deliver(m, inst)
    if state == "delivered_again":
        # The child goes on (a timer opened), a signal wakes it: its next task must carry the request again.
        _parent_waits(m, inst, inst.side)
        if inst.side.child.run is not None:
            m.signal(inst.side.child.run)
        _carried(m, inst)
    return inst


def _start(
    m: WorkflowLeaseMachine,
    entity: str,
    state: str,
    policy: str | None,
    *,
    children: int = 1,
    retry: bool = False,
    lease: bool = True,
) -> Instance:
    """A parent whose first task starts ``children`` children under ``policy``, each on a queue of its own; the
    parent's ChildWorkflowScheduled and ChildRunStarted events name them; each child's first task leased."""
    queue = m.ctx.uid("q")
    worker = m.run(m.ctx.register(queue))
    queues = [m.ctx.uid("cq") for _ in range(children)]
    workers = [m.run(m.ctx.register(q)) for q in queues]
    wid, run_id = m.run(m.ctx.start(queue))
    parent = RunShadow(workflow_id=wid, run_id=run_id)
    m.run_by_id[run_id] = parent
    m.ack(run_id, Kind.START)
    inst = Instance(entity, state, [], parent, queue, worker, None)
    inst.task = _poll(m, queue, worker)
    if inst.task is None:
        parent.uncertain = True
        return inst
    commands: list[dict[str, Any]] = []
    for q in queues:
        command: dict[str, Any] = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": q}
        if policy is not None:
            command["parent_close_policy"] = policy
        if retry:
            command["retry_policy"] = {"max_attempts": RETRY.max_attempts, "backoff_seconds": [BACKOFF_SECONDS]}
        commands.append(command)
    if _complete(m, inst.task, commands, "start_child_workflow (sweep)") != "ok":
        return inst
    m.hit_run(parent, "open_waits", Actor.HOLDER)
    inst.task.step(TaskEvent.COMPLETE)
    parent.step(RunEvent.BATCH_OPEN_WAITS)
    events = m.run(m.ctx.history(wid, run_id))
    scheduled = [e for e in events if e.get("event_type") == "ChildWorkflowScheduled"]
    started = {
        str(_payload(e).get("child_call_id")): str(_payload(e).get("child_workflow_run_id"))
        for e in events
        if e.get("event_type") == "ChildRunStarted"
    }
    if len(scheduled) != children or len(started) != children:
        raise m.violation(
            "CHILD-POLICY-RECORDED",
            f"a batch of {children} accepted start_child_workflow commands is recorded as "
            f"{len(scheduled)} ChildWorkflowScheduled and {len(started)} ChildRunStarted",
            expected=f"{children} of each",
            received=[e.get("event_type") for e in events],
        )
    for event, q, w in zip(scheduled, queues, workers, strict=True):
        p = _payload(event)
        call_id, child_wid = str(p.get("child_call_id")), str(p.get("child_workflow_id"))
        child_run = RunShadow(workflow_id=child_wid, run_id=started.get(call_id, ""))
        child = ChildShadow(parent=parent, policy=policy or "abandon", workflow_id=child_wid, call_id=call_id)
        child.run = child_run
        m.run_by_id[child_run.run_id] = child_run
        m.ack(child_run.run_id, Kind.START)
        m.ack(run_id, Kind.CHILD_SCHEDULED, child_wid, fields=(("parent_close_policy", child.policy),))
        m.touched.update({run_id, child_run.run_id})
        inst.sides.append(Side(child, q, w, retry))
    if lease:
        for side in inst.sides:
            side.task = _poll(m, side.queue, side.worker)
    return inst


def _payload(event: Mapping[str, Any]) -> Mapping[str, Any]:
    value = event.get("payload")
    return value if isinstance(value, Mapping) else {}


# -- worker calls ------------------------------------------------------------------------------------------


def _poll(m: WorkflowLeaseMachine, queue: str, worker: str, timeout: int = 1) -> TaskM | None:
    task, _ = _poll_raw(m, queue, worker, timeout)
    return task


def _poll_raw(m: WorkflowLeaseMachine, queue: str, worker: str, timeout: int = 1) -> tuple[TaskM | None, Any]:
    """A poll of ``queue`` (about its one run's task), the lease judged and its history read back by the
    machine; the shadow and the task as the answer gave it."""
    m.queue, m.workers = queue, [worker]
    polled = m.poll_wf(worker, timeout)
    return m.adopt(polled, worker, polled.received), polled.task


def _complete(m: WorkflowLeaseMachine, task: TaskM, commands: list[dict[str, Any]], what: str) -> str | None:
    """The holder completes ``task`` with ``commands``, judged by the fencing model; the outcome (None: lost)."""
    at = m.now()
    allowed = m.expected(task, task.owner, task.attempt, at)
    reply = m.call(m.ctx.complete({"task_id": task.task_id}, commands, owner=task.owner, attempt=task.attempt))
    if reply is None:
        task.uncertain = task.run.uncertain = True
        return None
    got: str = m.judge(task, allowed, reply, what)
    m.hit_task(task, "complete", Actor.HOLDER, at, got)
    m.touched.add(task.run.run_id)
    return got


def _history_call(m: WorkflowLeaseMachine, task: TaskM) -> None:
    """The holder reads its task's history: judged by the fencing model (refused once the task or run closed)."""
    at = m.now()
    allowed = m.expected(task, task.owner, task.attempt, at)
    body = {"after_sequence": 0, "page_size": 1000}
    reply = m.call(m.ctx.wf_call({"task_id": task.task_id}, "history", body, owner=task.owner, attempt=task.attempt))
    if reply is None:
        return
    got = m.judge(task, allowed, reply, "history (sweep)")
    m.hit_task(task, "history", Actor.HOLDER, at, got)


def _parent_waits(m: WorkflowLeaseMachine, inst: Instance, side: Side | None = None) -> None:
    """The holder of the parent's task (or of ``side``'s child task) completes it with a long timer: the run
    waits again, open."""
    task = inst.task if side is None else side.task
    if task is None or task.status is not TaskStatus.LEASED:
        return
    if _complete(m, task, [{"type": "start_timer", "delay_seconds": 3600}], "start_timer (sweep)") == "ok":
        m.hit_run(task.run, "open_waits", Actor.HOLDER)
        task.step(TaskEvent.COMPLETE)
        task.run.step(RunEvent.BATCH_OPEN_WAITS)
        m.ack(task.run.run_id, Kind.TIMER)


# -- the child's operations --------------------------------------------------------------------------------


def _act(m: WorkflowLeaseMachine, inst: Instance, op: str) -> None:
    side = inst.side
    if op == "parent_reads_result":
        _parent_reads(m, inst, side)
    elif op in ("child_completes", "child_fails"):
        _child_closes(m, inst, side, op)
    elif op in ("cancel_child", "terminate_child"):
        _control_child(m, inst, side, op.removesuffix("_child"))
    elif op == "close_parent":
        _close_parent(m, inst, side)
    elif op == "restart":
        _restart(m, inst, side)
    elif op == "child_task":
        if inst.request is not None and inst.request.status is not CancellationRequestStatus.RESOLVED:
            _carried(m, inst)
        _deliver(m, inst)
    elif op == "child_closes":
        if inst.request is not None and inst.request.status is CancellationRequestStatus.REQUESTED:
            _carried(m, inst)
        _child_closes(m, inst, side, "child_completes")
    elif op == "read_parent_history":
        _read_parent_history(m, inst)


def _states(m: WorkflowLeaseMachine, inst: Instance, side: Side) -> tuple[str | None, str | None]:
    """The child's and its request's cover states now."""
    request = inst.request if inst.request is not None and inst.request.child is side.child else None
    return child_state(side.child), (cancellation_state(request, m.now(), m.MARGIN) if request else None)


def _child_closes(m: WorkflowLeaseMachine, inst: Instance, side: Side, op: str) -> None:
    """The holder of the child's task closes the child run (complete_workflow, after a cleanup step when asked
    to cancel; or fail_workflow): accepted while the child run is open and its task leased, else fenced."""
    task = side.task
    if task is None:
        return
    state, request_state = _states(m, inst, side)
    cleanup = {"type": "record_side_effect", "result": m.ctx.envelope("cleaned")["blob"]}
    commands = (
        [*([cleanup] if inst.request is not None else []), {"type": "complete_workflow", "result": m.ctx.envelope(1)}]
        if op == "child_completes"
        else [{"type": "fail_workflow", "message": "child failed (conformance sweep)"}]
    )
    got = _complete(m, task, commands, f"{op} (sweep)")
    if got is None:
        side.child.unsure = True
        return
    if state is not None:
        m.hit("child", state, op, Actor.HOLDER)
    if request_state is not None:
        m.hit("cancellation_request", request_state, "child_closes", Actor.HOLDER)
    if got != "ok":
        return
    run = task.run
    m.hit_run(run, "complete_workflow" if op == "child_completes" else "fail_workflow", Actor.HOLDER)
    task.step(TaskEvent.COMPLETE)
    run.step(RunEvent.BATCH_COMPLETE if op == "child_completes" else RunEvent.BATCH_FAIL)
    m.ack(run.run_id, Kind.COMPLETE if op == "child_completes" else Kind.FAIL)
    _child_run_closed(m, inst, side, RunStatus.COMPLETED if op == "child_completes" else RunStatus.FAILED)


def _child_run_closed(
    m: WorkflowLeaseMachine, inst: Instance, side: Side, status: RunStatus, *, by_deadline: bool = False
) -> None:
    """The child run closed with ``status``: with its parent open the parent is told (or the failed run is
    retried by its policy, §8.7.1); with its parent closed, an open cooperative request is resolved."""
    child, parent = side.child, inst.parent
    assert child.run is not None
    if parent.open:
        if status is RunStatus.FAILED and side.retry and RETRY.should_retry(side.attempts):
            child.step(ChildEvent.RETRY)
            side.failed_at = m.now()
            m.ack(parent.run_id, Kind.CHILD_RETRY, child.run.run_id)
            return
        child.step(CHILD_CLOSED_EVENTS[status])
        child.second = any(s.child.status in CLOSED for s in inst.sides if s is not side)
        m.ack(parent.run_id, RESULT_KINDS[child.status], child.run.run_id)
        inst.unread.append(side)
        m.touched.add(parent.run_id)
        return
    if child.status is ChildStatus.RUNNING:
        child.step(CHILD_CLOSED_EVENTS[status])
    request = inst.request
    if request is not None and request.child is child and request.status is not CancellationRequestStatus.RESOLVED:
        request.step(CancellationRequestEvent.RESOLVE)
        request.by_deadline = by_deadline
        closed_by = "cleanup_deadline" if by_deadline else "child"
        fields = (("outcome", status.value), ("closed_by", closed_by))
        m.ack(parent.run_id, Kind.CANCELLATION_RESOLVED, request.request_id, fields=fields)
        m.touched.add(parent.run_id)
        if status in (RunStatus.COMPLETED, RunStatus.FAILED):
            m.reached("cooperative_child_closed_itself")


def _parent_reads(m: WorkflowLeaseMachine, inst: Instance, side: Side) -> None:
    """The parent's worker reads what the child did: the task a child's result woke (its resume context must
    name that child, CHILD-RESULT-WAKES-PARENT) or, with nothing to wake it, the task a signal gives it, each read
    back in full by the machine; a closed parent's holder reads its last task's history (fenced)."""
    parent = inst.parent
    if parent.uncertain or inst.task is None:
        return
    state, _ = _states(m, inst, side)
    if not parent.open:
        _history_call(m, inst.task)
    else:
        woken = inst.unread[0] if inst.unread else None
        if woken is None:
            m.signal(parent)
        task, body = _poll_raw(m, inst.queue, inst.worker)
        if task is None:
            raise m.violation(
                "CHILD-RESULT-WAKES-PARENT" if woken is not None else "SIGNAL-RECORDED-AND-WAKES",
                f"the parent {parent.workflow_id} was given no workflow task after "
                + ("its child's result" if woken is not None else "a signal"),
                expected="a workflow task of the parent",
                received="an empty poll",
            )
        inst.task = task
        if woken is not None:
            _judge_wake(m, woken, body)
            inst.unread.clear()
    if state is not None:
        m.hit("child", state, "parent_reads_result", Actor.HOLDER)


def _judge_wake(m: WorkflowLeaseMachine, side: Side, body: Mapping[str, Any]) -> None:
    child = side.child
    assert child.run is not None
    want = {
        "workflow_wait_kind": "child",
        "resume_source_kind": "child_workflow_run",
        "child_call_id": child.call_id,
        "child_workflow_run_id": child.run.run_id,
        "workflow_event_type": RESULT_EVENTS[child.status],
    }
    got = {k: body.get(k) for k in want}
    if got != want:
        raise m.violation(
            "CHILD-RESULT-WAKES-PARENT",
            f"the parent's task woken by child {child.workflow_id} ({child.status.value}"
            + (", its second child result" if child.second else "")
            + ") does not carry that child's resume context",
            expected=want,
            received=got,
        )
    m.reached("child_result_read")


def _control_child(m: WorkflowLeaseMachine, inst: Instance, side: Side, kind: str) -> None:
    """The operator cancels or terminates the child (its workflow id): an open child run closes (§12.2), a
    closed one refuses (409), judged by ``close_run``."""
    child = side.child
    if child.run is None:
        return
    state, _ = _states(m, inst, side)
    run, was_open = child.run, child.run.open
    m.close_run(run, kind)
    if run.uncertain:
        child.unsure = True
        return
    if state is not None:
        m.hit("child", state, f"{kind}_child", Actor.OPERATOR)
    if was_open and not run.open:
        _child_run_closed(m, inst, side, RunStatus.CANCELLED if kind == "cancel" else RunStatus.TERMINATED)


def _close_parent(m: WorkflowLeaseMachine, inst: Instance, side: Side) -> None:
    """The operator cancels the parent: each open child is then closed, left running or asked to clean up, as
    its parent-close policy says (the model's PARENT_CLOSE_EFFECTS), judged by describing it."""
    parent = inst.parent
    state, _ = _states(m, inst, side)
    was_open = parent.open
    m.close_run(parent, "cancel")
    if parent.uncertain:
        return
    if state is not None:
        m.hit("child", state, "close_parent", Actor.OPERATOR)
    if not was_open or parent.open:
        return
    for s in inst.sides:
        child = s.child
        if child.status is ChildStatus.BACKOFF:
            child.step(ChildEvent.PARENT_CLOSED)  # no further child run starts
            continue
        if child.run is None or not child.run.open:
            continue
        effect = PARENT_CLOSE_EFFECTS[child.policy]
        child.closing = child.policy
        if effect is not None:
            child.run.step(effect)
            m.ack(child.run.run_id, Kind.PARENT_CANCELLED if effect is RunEvent.CANCEL else Kind.PARENT_TERMINATED)
            child.step(ChildEvent.CHILD_CANCELLED if effect is RunEvent.CANCEL else ChildEvent.CHILD_TERMINATED)
        m.touched.add(child.run.run_id)
        _judge_left(m, child)
        if child.policy == "request_cancellation":
            _learn_request(m, inst, s)


def _judge_left(m: WorkflowLeaseMachine, child: ChildShadow) -> None:
    """What the parent's close left of ``child``, described: open, terminated or cancelled as the model says."""
    assert child.run is not None
    described = m.run(m.ctx.describe(child.workflow_id))
    got = described.get("status")
    want = child.run.status.value if not child.run.open else "open"
    if (got in CLOSED) != (want != "open") or (want != "open" and got != want):
        raise m.violation(
            POLICY_REQUIREMENTS[child.policy],
            f"a parent cancelled with its child open under parent_close_policy {child.policy} left the child {got}",
            expected=want if want != "open" else "an open child",
            received=got,
        )
    m.reached("abandoned_child_outlived_parent" if child.policy == "abandon" else "parent_close_policy_applied")


def _learn_request(m: WorkflowLeaseMachine, inst: Instance, side: Side) -> None:
    """The cooperative request a request_cancellation child was given: its identity and deadline, from the
    child's history (CANCEL-COOPERATIVE-REQUEST)."""
    child = side.child
    assert child.run is not None
    events = m.run(m.ctx.history(child.workflow_id, child.run.run_id))
    asked = [_payload(e) for e in events if e.get("event_type") == "CooperativeCancellationRequested"]
    first = asked[0] if len(asked) == 1 else {}
    rid, at, deadline = first.get("workflow_command_id"), first.get("requested_at"), first.get("cleanup_deadline_at")
    if not (isinstance(rid, str) and rid and isinstance(at, str) and isinstance(deadline, str)) or parse_rfc3339(
        deadline
    ) <= parse_rfc3339(at):
        raise m.violation(
            "CANCEL-COOPERATIVE-REQUEST",
            "the child of a parent closed under request_cancellation records no single request with its identity "
            "and a deadline after it",
            expected="one CooperativeCancellationRequested{workflow_command_id, requested_at < cleanup_deadline_at}",
            received=asked,
        )
    inst.request = RequestShadow(child=child, request_id=rid, deadline=parse_rfc3339(deadline))
    m.ack(child.run.run_id, Kind.COOPERATIVE_REQUESTED, rid)


def _restart(m: WorkflowLeaseMachine, inst: Instance, side: Side) -> None:
    """The clock ends the backoff: the child's next run starts, a new run of the same child workflow, and its
    first task is leased to the child's worker (CHILD-RETRY-BACKOFF)."""
    child = side.child
    if child.status is not ChildStatus.BACKOFF or side.failed_at is None or child.run is None:
        return
    due = side.failed_at + timedelta(seconds=RETRY.backoff_before(side.attempts + 1) + m.MARGIN)
    m.run(m.ctx.wait(until=due + EXPIRY_STEP))
    m.queue, m.workers = side.queue, [side.worker]
    polled = m.poll_wf(side.worker, 5)
    body = polled.task
    if polled.reply is None:
        child.unsure = True
        return
    if body is None or body.get("workflow_id") != child.workflow_id or body.get("run_id") == child.run.run_id:
        raise m.violation(
            "CHILD-RETRY-BACKOFF",
            f"child {child.workflow_id} failed under a retry policy with an attempt left, and no new run of it was "
            f"leased after its {BACKOFF_SECONDS} s backoff",
            expected=f"a workflow task of a new run of {child.workflow_id}",
            received=None if body is None else {k: body.get(k) for k in ("workflow_id", "run_id")},
        )
    run = RunShadow(workflow_id=child.workflow_id, run_id=str(body.get("run_id")))
    m.run_by_id[run.run_id] = run
    m.ack(run.run_id, Kind.START)
    child.run = run
    child.step(ChildEvent.RESTART)
    side.attempts += 1
    side.task = m.adopt(polled, side.worker, polled.received)
    m.touched.add(inst.parent.run_id)
    m.hit("child", "backoff", "restart", Actor.CLOCK)
    m.reached("child_restarted_after_backoff")


# -- the cooperative request's operations --------------------------------------------------------------------


def _carried(m: WorkflowLeaseMachine, inst: Instance) -> None:
    """Lease the child's next task unless one is live: it must carry cancel_requested and the request's
    identity and deadline (CANCEL-COOPERATIVE-REQUEST: every task of the child until it closes)."""
    request, side = inst.request, inst.side
    if request is None or request.status is CancellationRequestStatus.RESOLVED:
        return
    if side.task is not None and side.task.status is TaskStatus.LEASED:
        return
    task, body = _poll_raw(m, side.queue, side.worker)
    if task is None:
        return
    side.task = task
    observed = body.get("cancellation_request") if body is not None else None
    got = {
        "cancel_requested": None if body is None else body.get("cancel_requested"),
        "request_id": observed.get("request_id") if isinstance(observed, dict) else None,
        "cleanup_deadline_at": observed.get("cleanup_deadline_at") if isinstance(observed, dict) else None,
    }
    deadline = got["cleanup_deadline_at"]
    if (
        got["cancel_requested"] is not True
        or got["request_id"] != request.request_id
        or not isinstance(deadline, str)
        or parse_rfc3339(deadline) != request.deadline
    ):
        later = " again, on a task after the one its delivery was committed on" if request.delivered_on else ""
        raise m.violation(
            "CANCEL-COOPERATIVE-REQUEST",
            f"a workflow task of child {side.child.workflow_id}, asked to clean up and still open, does not carry "
            f"the request{later}",
            expected={
                "cancel_requested": True,
                "request_id": request.request_id,
                "cleanup_deadline_at": request.deadline.isoformat(),
            },
            received=got,
        )
    if request.delivered_on is not None and task.task_id != request.delivered_on:
        request.later = True
        m.reached("cancellation_carried_again")


def _deliver(m: WorkflowLeaseMachine, inst: Instance) -> None:
    """The holder of the child's task commits the delivery of the request at one call (CANCEL-COOPERATIVE-
    DELIVERY): the first delivery is recorded, a repeated one (also on a later task) answers the committed one,
    and once the child closed the call is fenced like any workflow-task call."""
    request, side = inst.request, inst.side
    task = side.task
    if request is None or task is None:
        return
    _, state = _states(m, inst, side)
    first = request.delivered_on is None
    body = {
        "request_id": request.request_id,
        "sequence": 1 if first else 2,
        "call_kind": "condition" if first else "timer",
    }
    at = m.now()
    allowed = m.expected(task, task.owner, task.attempt, at)
    reply = m.call(
        m.ctx.wf_call({"task_id": task.task_id}, "deliver-cancellation", body, owner=task.owner, attempt=task.attempt)
    )
    if reply is None:
        side.child.unsure = True
        return
    got = m.outcome(reply)
    if allowed == {"ok"} and got != "ok":
        raise m.disallowed("CANCEL-COOPERATIVE-DELIVERY", "the holder's deliver-cancellation", allowed, reply)
    got = m.judge(task, allowed, reply, "deliver-cancellation (sweep)")
    if state is not None:
        m.hit("cancellation_request", state, "child_task", Actor.HOLDER)
    m.touched.add(task.run.run_id)
    if got != "ok":
        return
    answer = reply.json()
    committed = {"delivered": True, "request_id": request.request_id, "sequence": 1, "call_kind": "condition"}
    shown = {k: answer.get(k) for k in committed}
    if shown != committed:
        raise m.unexpected(
            reply,
            "CANCEL-COOPERATIVE-DELIVERY",
            "a delivery answers the one committed first" if not first else "the delivery is committed as sent",
            committed,
            str(shown),
        )
    if first:
        request.step(CancellationRequestEvent.DELIVER)
        request.delivered_on = task.task_id
        m.ack(task.run.run_id, Kind.COOPERATIVE_DELIVERED, request.request_id)
    else:
        m.reached("delivery_repeated")


def _read_parent_history(m: WorkflowLeaseMachine, inst: Instance) -> None:
    request = inst.request
    if request is None:
        return
    state = cancellation_state(request, m.now(), m.MARGIN)
    m.touched.add(inst.parent.run_id)
    m.check_touched_histories(m.run_by_id, partial(_judge_resolution, m, inst))
    if state is not None:
        m.hit("cancellation_request", state, "read_parent_history", Actor.OPERATOR)
    if request.status is CancellationRequestStatus.RESOLVED:
        m.reached("cancellation_outcome_read")


def _judge_resolution(m: WorkflowLeaseMachine, inst: Instance, run: RunShadow, events: list[dict[str, Any]]) -> None:
    """The parent's history records no outcome of a request the model holds open (the oracle counts the one a
    resolved request must have)."""
    request = inst.request
    if request is None or run is not inst.parent or request.status is CancellationRequestStatus.RESOLVED:
        return
    if cancellation_state(request, m.now(), m.MARGIN) is None:
        return  # about its deadline: the server may be resolving it
    early = [e for e in events if e.get("event_type") == "ChildCancellationResolved"]
    if early:
        raise m.violation(
            "CANCEL-COOPERATIVE-OUTCOME",
            f"the parent's history records the outcome of request {request.request_id} while its child is open",
            expected="no ChildCancellationResolved yet",
            received=[_payload(e) for e in early],
        )


def _past_deadline(m: WorkflowLeaseMachine, group: list[tuple[Instance, Calls]], after: Calls) -> None:
    """The instances whose cleanup deadline must pass: each made its calls that leave the request as it is, then
    one wait for every deadline, then each child must have been closed as cancelled by the server
    (CANCEL-COOPERATIVE-DEADLINE); then the calls past the deadline, on the one asked and never delivered."""
    seconds = m.target.test_profile.get("cancellation_cleanup_seconds") if m.target is not None else None
    if not isinstance(seconds, int | float) or seconds > m.ctx.max_wait:
        return  # a deadline too far off for this run: those cells stay not reached
    waiting: list[tuple[Instance, str]] = []
    for inst, calls in group:
        if not inst.sides:
            continue
        if inst.state == "requested" and after:
            _carried(m, inst)  # a task for the calls past the deadline; the request stays undelivered
        for op, _ in calls:
            if op != "deadline" and inst.request is not None and not inst.request.uncertain:
                _act(m, inst, op)
        state = cancellation_state(inst.request, m.now(), m.MARGIN) if inst.request is not None else None
        if state is not None and inst.request is not None:
            waiting.append((inst, state))
    if not waiting:
        return
    latest = max(inst.request.deadline for inst, _ in waiting if inst.request is not None)
    m.run(m.ctx.wait(until=latest + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))
    for inst, state in waiting:
        _closed_at_deadline(m, inst, state, float(seconds))
    for inst, _ in waiting:
        if inst.state == "requested":
            for op, _actor in after:
                _act(m, inst, op)
            m.check_touched_histories(m.run_by_id, partial(_judge_resolution, m, inst))
            break
    m.check_touched_histories(m.run_by_id)


def _closed_at_deadline(m: WorkflowLeaseMachine, inst: Instance, state: str, seconds: float) -> None:
    request, side = inst.request, inst.side
    child = side.child
    assert request is not None
    assert child.run is not None

    async def closed() -> dict[str, Any] | None:
        found = await m.ctx.describe(child.workflow_id)
        return found if found.get("status") in CLOSED else None

    try:
        described = m.run(m.ctx.wait_until(closed, timeout=seconds + 10.0, what="the child closed at its deadline"))
    except CheckFailure:  # the wait ran out: the child stayed open
        described = {"status": "open"}
    if described.get("status") != "cancelled":
        delivered = " after its delivery was committed" if request.delivered_on else ""
        raise m.violation(
            "CANCEL-COOPERATIVE-DEADLINE",
            f"child {child.workflow_id}, asked to clean up{delivered}, was not closed as cancelled once its "
            f"cleanup deadline {request.deadline.isoformat()} passed",
            expected="cancelled (WorkflowCancelled, reason cleanup_deadline_exceeded)",
            received=described.get("status"),
        )
    child.run.step(RunEvent.CANCEL)
    m.ack(child.run.run_id, Kind.DEADLINE_CANCEL)
    m.touched.update({child.run.run_id, inst.parent.run_id})
    _child_run_closed(m, inst, side, RunStatus.CANCELLED, by_deadline=True)
    m.hit("cancellation_request", state, "deadline", Actor.CLOCK)
    if state in ("delivered", "delivered_again"):
        m.reached("delivered_child_closed_at_deadline")
