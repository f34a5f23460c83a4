"""The workflow-lease machine's sweep: a deterministic phase after its examples over the workflow-task cells
(:mod:`suite.protocol.coverage`) the examples left cold.

The examples reach what their random programs happen to make. The sweep then brings a workflow task into each
state that still has cold cells — leased, its lease expired and not yet polled again, redelivered to another
worker, completed, failed, its run closed, ready again after its holder deregistered, or a run whose first task
nobody has leased — and makes each cold call there with each actor: the holder, the former holder, a worker that
never held it, the operator. The holder's deregistration is one of those calls in every state where it holds or
held the task: its answer's ``recovered_workflow_task_count`` is judged, and a task whose live lease it held is
ready again at once — the next poll leases it as the next attempt while the old lease would still run
(``DEREGISTER-RELEASES-LEASES``); there the deregistered worker is the former holder (registered again before it
polls). Every state gets
its own queue and three workers, so a poll is about that one task. Calls that leave the task as it was come first;
a call that changes it (a holder's complete or fail, a poll that takes the task over, closing the run) ends its
instance, and each further one gets a fresh instance. Every answer is judged by the fencing model as the machine
judges its own, and every history the sweep touched is read back and judged by the history oracle.

A target whose leases are longer than ``--max-wait`` allows is swept without the states that need an expiry (their
cells stay not reached, and the matrix says so). A fault that leaves an outcome unknown stops the sweep: the cells
it did not reach say so too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from suite.protocol.coverage import Actor
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.lifecycles import RunEvent, TaskEvent, TaskStatus
from suite.protocol.oracle import Kind

from .base import EXPIRY_STEP
from .cells import Plan, SweepInstance, plan_cold_cells, task_actor, task_state
from .world import RunShadow, TaskShadow

# The machine and its task shadows are those of suite.machines.workflow_leases, which imports this module: they are
# typed loosely here so the two modules do not import each other.
WorkflowLeaseMachine = Any
TaskM = Any

__all__ = [
    "Instance",
    "cold_plan",
    "deregister",
    "point_at",
    "poll_instance",
    "recovered_counts",
    "signal_instance",
    "start_instance",
    "sweep_cold_cells",
]

# The order calls are made in, within one instance: the ones that leave the task as it is first.
ORDER = ("history", "heartbeat", "complete", "fail", "poll", "signal", "deregister", "close_run")
EXPIRING = ("lease_expired", "redelivered")
# Not swept: the clock's own events (observed as the other calls meet them: a lapse in a lease_expired answer, a
# recovery in the poll that takes the task over).
SWEPT_STATES = ("ready", "requeued", "leased", "completed", "failed", "run_closed", *EXPIRING)


def _changes(state: str, operation: str, actor: Actor) -> bool:
    """Whether the call changes the task (or its run): it then ends its instance."""
    if operation == "close_run":
        return state != "run_closed"
    if operation == "deregister":
        return True  # the holder is gone: nothing after it in the instance may be its call
    if operation == "poll":
        return state in ("ready", "requeued", "lease_expired")
    return operation in ("complete", "fail") and actor is Actor.HOLDER and state in ("leased", "redelivered")


# cold_plan(hits): per swept state, the instances to make for the reachable workflow-task cells not hit yet.
cold_plan: Callable[[Mapping[str, int]], Plan] = partial(
    plan_cold_cells, "workflow_task", SWEPT_STATES, ORDER, _changes
)


@dataclass(eq=False)
class Instance(SweepInstance):
    """One task brought into one state on a queue of its own."""

    run: RunShadow
    task: TaskM | None = None
    former: dict[str, int] = field(default_factory=dict)  # former holder -> the attempt it held
    gone: set[str] = field(default_factory=set)  # workers of the instance that deregistered


def sweep_cold_cells(m: WorkflowLeaseMachine) -> None:
    """Make every cold workflow-task call the plan names, in three groups: no expiry needed, one (a lapsed or a
    redelivered lease), two (a redelivered lease that lapsed too); each group waits its expiries once for all."""
    specs = [(state, calls) for state, instances in cold_plan(m.cells).items() for calls in instances]
    expiring = m.lease_seconds is not None and m.lease_seconds <= m.ctx.max_wait
    for waits in (0, 1, 2):
        group = [(s, c) for s, c in specs if _expiries(s, c) == waits]
        if not group or (waits and not expiring):
            continue
        # A fault that leaves a set-up unknown drops that instance alone (the next round plans its cells again).
        started = [m.sweep_start(lambda s=state, c=calls: start_instance(m, s, c)) for state, calls in group]
        instances = [i for i in started if i is not None]
        _lease(m, [i for i in instances if i.state != "ready"])
        _settle(m, instances, waits)
        # Live leases first: every empty poll of the others holds a second of the target's clock.
        for inst in sorted(instances, key=lambda i: i.state not in ("leased", "redelivered")):
            if inst.task is not None or inst.state == "ready":
                _act(m, inst)
        m.check_touched_histories(m.run_by_id)


def _redelivers(state: str, calls: list[tuple[str, Actor]]) -> bool:
    """Whether the instance needs a lease taken over: its state is a redelivery, or a former holder acts in it
    (in ``requeued`` the former holder is the holder that deregistered: no takeover)."""
    if state == "requeued":
        return False
    return state == "redelivered" or any(actor is Actor.FORMER_HOLDER for _, actor in calls)


def _expiries(state: str, calls: list[tuple[str, Actor]]) -> int:
    """How many lease expiries bring a task into ``state`` with the actors of ``calls``."""
    redelivers = _redelivers(state, calls)
    return int(redelivers) + int(state == "lease_expired")


def point_at(m: WorkflowLeaseMachine, inst: Instance) -> None:
    m.queue, m.workers = inst.queue, inst.workers


def start_instance(m: WorkflowLeaseMachine, state: str, calls: list[tuple[str, Actor]], **start: Any) -> Instance:
    """A run on a queue of its own with three workers (``start``: more fields of the start request)."""
    queue = m.ctx.uid("q")
    workers = [m.run(m.ctx.register(queue)) for _ in range(3)]
    wid, run_id = m.run(m.ctx.start(queue, **start))
    run = RunShadow(workflow_id=wid, run_id=run_id)
    m.run_by_id[run_id] = run
    m.ack(run_id, Kind.START)
    return Instance(state, calls, queue, workers, run)


def poll_instance(m: WorkflowLeaseMachine, inst: Instance, worker: str) -> TaskM | None:
    point_at(m, inst)
    polled = m.poll_wf(worker)
    return m.adopt(polled, worker, polled.received)


def _lease(m: WorkflowLeaseMachine, instances: Iterable[Instance]) -> None:
    for inst in instances:
        inst.task = poll_instance(m, inst, inst.workers[0])


def _wait_expiry(m: WorkflowLeaseMachine, tasks: list[TaskM]) -> None:
    """Until every lease has lapsed by more than the machine's margin: then the model knows, without an answer,
    that each call after it meets an expired lease."""
    live = [t for t in tasks if not t.uncertain]
    if live:
        latest: datetime = max(t.expires for t in live)
        m.run(m.ctx.wait(until=latest + timedelta(seconds=m.MARGIN) + EXPIRY_STEP))


def _settle(m: WorkflowLeaseMachine, instances: list[Instance], waits: int) -> None:
    """Bring every leased instance from ``leased`` into its state: wait out the leases (``waits`` times; a
    takeover by the second worker between), then close what the state closes."""
    leased = [i for i in instances if i.task is not None]
    for n in range(waits):
        _wait_expiry(m, [i.task for i in leased if i.task is not None])
        if n == 0:
            for inst in leased:
                if _redelivers(inst.state, inst.calls):
                    _redeliver(m, inst)
    for inst in leased:
        task = inst.task
        if task is None:
            continue
        if inst.state == "completed":
            _call(m, inst, "complete", task.owner)
        elif inst.state == "failed":
            _call(m, inst, "fail", task.owner)
        elif inst.state == "run_closed":
            m.close_run(inst.run, "cancel")
        elif inst.state == "requeued":
            holder, attempt = task.owner, task.attempt
            if deregister(m, inst, holder):
                inst.former[holder] = attempt


def _redeliver(m: WorkflowLeaseMachine, inst: Instance) -> None:
    """The second worker takes the lapsed lease over; the first becomes the former holder."""
    if inst.task is None:
        return
    first, attempt = inst.task.owner, inst.task.attempt
    inst.task = poll_instance(m, inst, inst.workers[1])
    if inst.task is not None and inst.task.owner != first:
        inst.former[first] = attempt


def _worker(inst: Instance, actor: Actor) -> tuple[str, int] | None:
    task = inst.task
    if task is None:
        return None
    if actor is Actor.HOLDER:
        return task.owner, task.attempt
    if actor is Actor.FORMER_HOLDER:
        return next(iter(inst.former.items()), None)
    never = [w for w in inst.workers if w not in task.holders]
    return (never[0], task.attempt) if never else None


def _act(m: WorkflowLeaseMachine, inst: Instance) -> None:
    if inst.state in ("leased", "redelivered") and inst.task is not None:
        _call(m, inst, "heartbeat", inst.task.owner)  # a fresh lease for the calls that follow
    for operation, actor in inst.calls:
        point_at(m, inst)
        if operation == "signal":
            signal_instance(m, inst)
        elif operation == "close_run":
            was_open = inst.run.open
            m.close_run(inst.run, "cancel")
            if inst.task is None and was_open and not (inst.run.open or inst.run.uncertain):
                m.hit("workflow_task", "ready", "close_run", Actor.OPERATOR)  # its first task never leased
        elif operation == "poll" and inst.state == "ready":
            inst.task = poll_instance(m, inst, inst.workers[2])
        elif operation == "deregister":
            if inst.task is not None:
                deregister(m, inst, inst.task.owner)
        elif operation == "poll" and inst.state == "requeued":
            who = _worker(inst, actor)
            if who is not None:
                _poll_requeued(m, inst, who[0], actor)
        else:
            who = _worker(inst, actor)
            if who is None:
                continue
            if operation == "poll":
                _poll_about(m, inst, who[0])
            else:
                _call(m, inst, operation, who[0], who[1])


def _poll_about(m: WorkflowLeaseMachine, inst: Instance, worker: str) -> None:
    """A poll of the instance's queue: about its one task. ``adopt`` judges a lease (and counts a takeover)."""
    task = inst.task
    assert task is not None
    if inst.state in ("leased", "redelivered"):
        # An empty poll holds for a second of the target's clock: renew first, so the lease is still live.
        _call(m, inst, "heartbeat", task.owner)
    at = m.now()
    got = poll_instance(m, inst, worker)
    if got is None or got is not task:
        m.hit_task(task, "poll", task_actor(task, worker), at, "ok" if got is None else None)


_BODIES: dict[str, dict[str, Any]] = {
    "history": {"after_sequence": 0, "page_size": 1000},
    "heartbeat": {},
    "fail": {"failure": {"message": "replay failed (conformance sweep)"}},
}


def _call(m: WorkflowLeaseMachine, inst: Instance, verb: str, worker: str, attempt: int | None = None) -> None:
    """One fenced workflow-task call, judged by the §8.9 model; a holder's accepted complete opens a timer."""
    task = inst.task
    assert task is not None
    attempt = task.attempt if attempt is None else attempt
    at = m.now()
    allowed = m.expected(task, worker, attempt, at)
    if verb == "complete":
        commands = [{"type": "start_timer", "delay_seconds": 3600}]
        send = m.ctx.complete({"task_id": task.task_id}, commands, owner=worker, attempt=attempt)
    else:
        send = m.ctx.wf_call({"task_id": task.task_id}, verb, _BODIES[verb], owner=worker, attempt=attempt)
    reply = m.call(send)
    if reply is None:
        task.uncertain = True
        return
    got = m.judge(task, allowed, reply, f"{verb} (sweep)")
    m.hit_task(task, verb, task_actor(task, worker), at, got)
    m.touched.add(task.run.run_id)
    if got != "ok":
        return
    if verb == "complete":
        m.hit_run(task.run, "open_waits", Actor.HOLDER)
        task.step(TaskEvent.COMPLETE)
        task.run.step(RunEvent.BATCH_OPEN_WAITS)
        m.ack(task.run.run_id, Kind.TIMER)
    elif verb == "fail":
        m.hit_run(task.run, "task_fail", Actor.HOLDER)
        task.step(TaskEvent.FAIL)
        task.run.step(RunEvent.TASK_FAIL)
    elif verb == "heartbeat":
        task.expires = parse_rfc3339(reply.json().get("lease_expires_at"))


def signal_instance(m: WorkflowLeaseMachine, inst: Instance) -> None:
    """Signal the instance's run: accepted while it is open (``m.signal`` judges and counts it), refused once
    closed (409 ``rejected_not_active``, §12.2)."""
    run = inst.run
    if run.uncertain:
        return
    if run.open:
        m.signal(run)
        if inst.task is None:  # nobody leased the run's first task yet
            m.hit("workflow_task", "ready", "signal", Actor.OPERATOR)
        return
    reply = m.call(m.client.control("POST", f"/workflows/{run.workflow_id}/signal/late", {"input": ["late"]}))
    if reply is None:
        return
    m.expect_status(reply, 409, "SIGNAL-CLOSED-RUN-REJECTED", "a signal to a closed run is refused")
    m.reached("signal_closed_run_refused")
    m.hit_run(run, "signal", Actor.OPERATOR)
    if inst.task is not None:
        m.hit_task(inst.task, "signal", Actor.OPERATOR, m.now())


def deregister(m: WorkflowLeaseMachine, inst: Instance, worker: str) -> bool:
    """``worker``, the task's holder, deregisters (``DEREGISTER-RELEASES-LEASES``): 200 ``deregistered``, and
    ``recovered_workflow_task_count`` the live leases it held — this task's, if it held one; the task is then
    ready again. Whether the deregistration was judged (False: no answer, or no such route)."""
    task = inst.task
    assert task is not None
    at = m.now()
    state = task_state(task, task.run, at, m.MARGIN)
    reply = m.call(m.client.worker(f"/registrations/{worker}", method="DELETE"))
    if reply is None:
        task.uncertain = True  # maybe deregistered: the task may be ready again, or not
        return False
    if reply.resent and reply.status == 404 and reply.reason == "worker_not_found":
        # Under --faults: an earlier delivery, whose answer was lost, deregistered the worker; this copy finds it
        # gone. What that delivery recovered is unknown.
        task.uncertain = True
        inst.workers = [w for w in inst.workers if w != worker]
        inst.gone.add(worker)
        return False
    if reply.status in (404, 405) and reply.reason != "worker_not_found":
        m.reached("deregistration_not_served")
        return False
    body = reply.json()
    allowed = recovered_counts(task, task.run, at, m.MARGIN)
    count = body.get("recovered_workflow_task_count")
    if reply.status != 200 or body.get("outcome") != "deregistered" or count not in allowed:
        raise m.unexpected(
            reply,
            "DEREGISTER-RELEASES-LEASES",
            f"the holder of workflow task {task.task_id} ({state or 'about to lapse'}) deregisters",
            f"200 outcome deregistered, recovered_workflow_task_count in {sorted(allowed)}",
            f"outcome={body.get('outcome')!r} recovered_workflow_task_count={count!r}",
        )
    if state is not None:
        m.hit("workflow_task", state, "deregister", Actor.HOLDER)
    if task.status is TaskStatus.LEASED and not task.uncertain:
        task.step(TaskEvent.ABANDON)  # its lease given up at once: the task is ready again
    inst.workers = [w for w in inst.workers if w != worker]
    inst.gone.add(worker)
    m.reached("holder_deregistered")
    return True


def recovered_counts(task: TaskShadow, run: RunShadow, at: datetime, margin: float) -> set[int]:
    """What ``recovered_workflow_task_count`` may be when the only task its worker held is ``task``: 1 for a live
    lease, 0 for a closed task; for a lapsed lease (or one about to lapse) either — the server may have
    recovered it already."""
    if task.status is not TaskStatus.LEASED or not run.open:
        return {0}
    if task.expires - timedelta(seconds=margin) > at:
        return {1}
    return {0, 1}


def _poll_requeued(m: WorkflowLeaseMachine, inst: Instance, worker: str, actor: Actor) -> None:
    """A poll of a task its holder left: ready at once, so the poll leases it as the next attempt — while the lease
    the holder gave up would still run, so no expiry can be what made it ready."""
    task = inst.task
    assert task is not None
    if worker in inst.gone:
        m.run(m.ctx.register(inst.queue, worker_id=worker))  # the former holder comes back
        inst.gone.discard(worker)
        inst.workers.append(worker)
    before = task.expires
    point_at(m, inst)
    polled = m.poll_wf(worker)
    got = m.adopt(polled, worker, polled.received)
    if got is task or polled.reply is None or task.uncertain or inst.run.uncertain:
        return
    live = polled.received + timedelta(seconds=m.MARGIN) < before
    if polled.body.get("poll_status") in ("throttled", "unavailable") or not live:
        return  # the target may hold the task back for another reason, or the old lease lapsed meanwhile
    raise m.violation(
        "DEREGISTER-RELEASES-LEASES",
        f"workflow task {task.task_id}, whose holder deregistered, was not leased by the next poll "
        f"(the lease it gave up would have run until {before.isoformat()})",
        expected=f"a lease of {task.task_id} with workflow_task_attempt {task.attempt + 1}",
        received=polled.body.get("poll_status"),
        replies=[polled.reply],
    )
