"""The workflow-task lease machine: several workers racing over one queue.

Rules start runs, poll (one worker, or several released together), heartbeat, fetch history, complete
(valid and invalid batches), fail, report as a stale holder after a redelivery, wait out a lease, and
cancel or terminate runs from the control plane while their tasks are leased. Every answer is judged by
the pure model: :func:`suite.protocol.fencing.guard_workflow_task` over the machine's own view of each
task says what the protocol allows *before* the target's answer is read.

Time: the model knows each lease's ``lease_expires_at`` (server time). A call made within ``MARGIN``
seconds of an expiry may legitimately land on either side, so both outcomes are accepted there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

from suite.client import Reply
from suite.outcomes import Indeterminate
from suite.protocol.coverage import Actor
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.history import check_sequences
from suite.protocol.lifecycles import RunEvent, RunStatus, TaskEvent, TaskStatus
from suite.protocol.oracle import Applied, Kind

from .base import MachineBase, Polled
from .cells import run_state, task_actor, task_state
from .child_sweep import CHILD_REQUIREMENTS, sweep_child_cells
from .run_sweep import sweep_run_cells
from .workflow_sweep import sweep_cold_cells
from .world import RunShadow, TaskShadow, workflow_view

__all__ = ["WorkflowLeaseMachine"]

WORKERS = 6
MAX_CHAINS = 2  # continue-as-new chains per example

# Which requirement a wrong answer breaks, by the reason the model expected.
REQUIREMENT_FOR = {
    "lease_owner_mismatch": "FENCE-OWNER",
    "workflow_task_attempt_mismatch": "FENCE-ATTEMPT",
    "run_closed": "CANCEL-TASK-RUN-CLOSED",
    "lease_expired": "EXPIRY-HOLDER-FENCED",
    "task_not_leased": "FENCE-AFTER-COMPLETE",
    "task_not_found": "FENCE-UNKNOWN-TASK",
    "invalid_commands": "COMMANDS-ONE-TERMINAL",
    "validation_failed": "COMMANDS-NON-EMPTY",
}
# A batch the model accepts -> how it moves the run (§8.7, §8.7.1), and what its history then holds.
BATCH_EVENTS = {
    "timer": RunEvent.BATCH_OPEN_WAITS,
    "complete": RunEvent.BATCH_COMPLETE,
    "fail_workflow": RunEvent.BATCH_FAIL,
}
# The run operation (suite.protocol.coverage) a valid batch of the complete rule is.
BATCH_OPERATIONS = {"timer": "open_waits", "complete": "complete_workflow", "fail_workflow": "fail_workflow"}
BATCH_KINDS = {"timer": Kind.TIMER, "complete": Kind.COMPLETE, "fail_workflow": Kind.FAIL}


@dataclass(eq=False, kw_only=True)
class TaskM(TaskShadow):
    run: RunShadow


@dataclass(frozen=True)
class Stale:
    """A lease that was taken over: its holder's reports must all be fenced."""

    task: TaskM
    owner: str
    attempt: int


class WorkflowLeaseMachine(MachineBase):
    """Several workers racing over one queue: polls, heartbeats, completes, stale reports after a redelivery,
    waited-out leases and runs closed while leased, judged by the fencing model."""

    name = "workflow_leases"
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "LEASE-EXCLUSIVE": "duplicate_claim_raced",
        "DISPATCH-ONE-LEASE-PER-DELIVERY": "duplicate_claim_raced",
        "LEASE-NOT-SHARED-WHILE-LIVE": "lease_granted",
        "LEASE-OWNER-IS-POLLER": "lease_granted",
        "FENCE-OWNER": "fenced_other",
        "FENCE-ATTEMPT": "fenced_next_attempt",
        "FENCE-AFTER-COMPLETE": "lease_granted",
        "EXPIRY-REDELIVER-SAME-TASK": "lease_expired_redelivered",
        "DISPATCH-CRASH-TAKEOVER": "lease_expired_redelivered",
        "DISPATCH-LATE-EVENT-FENCED": "stale_report_after_reclaim",
        "EXPIRY-HOLDER-FENCED": "stale_report_after_reclaim",
        "DISPATCH-LOST-NOTIFICATION": "long_poll_woken_by_expiry",
        "CANCEL-TASK-RUN-CLOSED": "report_on_closed_run",
        "CANCEL-NO-NEW-LEASES": "closed_while_leased",
        "COMMANDS-ONE-TERMINAL": "invalid_batch_rejected",
        "HISTORY-SEQUENCE-CONTIGUOUS": None,
        "HISTORY-ONE-TERMINAL-PER-RUN": None,
        # Judged on the full history of every leased task, against what its run had acknowledged (the oracle).
        "HISTORY-PAGINATION-COMPLETE": "redelivery_read_in_full",
        "SIGNAL-RECORDED-AND-WAKES": "redelivery_read_in_full",
        "COMMANDS-CONTINUE-AS-NEW": "continue_as_new_chain",
        # The sweeps': a signal to each closed run refused; a fail_workflow accepted (in every run state the run
        # entity tells apart, a continued run's included) and its run's history read back.
        "SIGNAL-CLOSED-RUN-REJECTED": "signal_closed_run_refused",
        "COMMANDS-FAIL-WORKFLOW": "fail_workflow_read_back",
        # The run sweep's timed runs: each live state's run closed by its timeout, its history read back.
        "RUN-TIMEOUT-CLOSES-RUN": "run_timed_out",
        # The workflow-task sweep's deregistrations: the holder's count judged, its task leased again at once.
        "DEREGISTER-RELEASES-LEASES": "requeued_leased_at_once",
        **CHILD_REQUIREMENTS,  # the child sweep's
    }

    runs = Bundle("runs")
    tasks = Bundle("tasks")
    stale = Bundle("stale")

    def __init__(self) -> None:
        super().__init__()
        self.task_by_id: dict[str, TaskM] = {}
        self.run_by_id: dict[str, RunShadow] = {}
        profile = self.target.test_profile if self.target else {}
        lease = profile.get("workflow_task_lease_seconds")
        self.lease_seconds: float | None = float(lease) if isinstance(lease, int | float) else None
        self.expiry_waits = 0
        self.continued: dict[
            str, RunShadow
        ] = {}  # workflow id -> its run that continued as new, until the next is seen
        self.generation: dict[str, int] = {}  # run id -> its run number, once more than 1
        self.chains = 0
        self.redeliveries_read = 0
        self.successor: dict[str, RunShadow] = {}  # run id -> the run it continued as
        self.lapsed: set[tuple[str, int]] = set()  # (task, attempt) whose lease lapse the machine has counted

    # -- coverage cells ------------------------------------------------------------------------------

    def hit_task(self, task: TaskM, operation: str, actor: Actor, at: datetime, got: str | None = None) -> None:
        """Count an exchange about ``task`` in its cell (the state when the call left at ``at``)."""
        state = task_state(task, task.run, at, self.MARGIN, got)
        if state is not None:
            self.hit("workflow_task", state, operation, actor)
            if state == "lease_expired":
                self.hit_lapse(task)

    def hit_lapse(self, task: TaskM) -> None:
        """The server's clock let the lease of this attempt lapse (seen in an answer or a redelivery): once."""
        key = (task.task_id, task.attempt)
        if key not in self.lapsed:
            self.lapsed.add(key)
            self.hit("workflow_task", "redelivered" if len(set(task.holders)) > 1 else "leased", "lapse", Actor.CLOCK)

    def run_generation(self, run: RunShadow) -> int:
        return self.generation.get(run.run_id, 1)

    # -- helpers -------------------------------------------------------------------------------------

    def ready_work(self) -> int:
        """Runs the model knows have a claimable workflow task (polling an empty queue holds ≥ 1 s)."""
        now = self.now()
        leased = {t.run.run_id for t in self.task_by_id.values() if t.status is TaskStatus.LEASED and t.expires > now}
        return sum(
            1
            for r in self.run_by_id.values()
            if r.open and not r.uncertain and r.status is not RunStatus.WAITING and r.run_id not in leased
        )

    def live_leases(self) -> list[TaskM]:
        now = self.now()
        return [
            t
            for t in self.task_by_id.values()
            if t.status is TaskStatus.LEASED and t.run.open and not (t.uncertain or t.run.uncertain) and t.expires > now
        ]

    def expected(self, task: TaskM, owner: str, attempt: int, at: datetime) -> set[str]:
        """The outcomes the protocol allows ('ok' or a reason), accounting for expiry near ``at``."""
        return self.workflow_outcomes(workflow_view(task, task.run), owner, attempt, at)

    def judge(self, task: TaskM, allowed: set[str], reply: Reply, verb: str) -> str:
        got = self.outcome(reply)
        if task.uncertain or task.run.uncertain:
            return got  # maybe applied earlier: the model cannot say which answer is right
        if got not in allowed:
            rejections = sorted(allowed - {"ok"})
            if task.status is TaskStatus.READY:
                # Ready again because its holder deregistered: no call about it may land as the holder's.
                req = "DEREGISTER-RELEASES-LEASES"
            elif rejections and (got == "ok" or "ok" not in allowed):
                # The target answered differently where the protocol demands a rejection.
                req = next((REQUIREMENT_FOR[r] for r in rejections if r in REQUIREMENT_FOR), "FENCE-NO-STATE-CHANGE")
            else:
                # The target refused a call the live lease entitles.
                req = "LEASE-HEARTBEAT-RENEWS" if verb == "heartbeat" else "FENCE-NO-STATE-CHANGE"
            raise self.disallowed(req, f"workflow-task {verb}", allowed, reply)
        if got == "run_closed":
            body = reply.json()
            want_cancel = task.run.status in (RunStatus.CANCELLED, RunStatus.TERMINATED)
            if body.get("can_continue") is not False or body.get("cancel_requested") is not want_cancel:
                raise self.violation(
                    "CANCEL-TASK-RUN-CLOSED",
                    "run_closed body fields",
                    expected=f"can_continue false, cancel_requested {want_cancel}",
                    received={k: body.get(k) for k in ("can_continue", "cancel_requested")},
                    replies=[reply],
                )
        return got

    def actor(self, task: TaskM, who: str) -> tuple[str, int]:
        owner = task.owner
        if who == "owner":
            return owner, task.attempt
        if who == "other":
            return next(w for w in self.workers if w != owner), task.attempt
        if who == "next_attempt":
            return owner, task.attempt + 1
        return owner, max(1, task.attempt - 1)  # "previous_attempt"

    def adopt(self, polled: Polled, worker: str, received_at: datetime) -> TaskM | None:
        """Judge a granted lease against the model, then record it. ``received_at`` bounds the grant: a
        long poll may be granted at any moment of its hold, but never after its answer arrived."""
        task_obj, reply = polled.task, polled.reply
        if task_obj is None or reply is None:
            return None
        run = self.leased_run(task_obj, worker, self.continuation(task_obj), reply)
        task_id = str(task_obj.get("task_id"))
        attempt = task_obj.get("workflow_task_attempt")
        known = self.task_by_id.get(task_id)
        if run.closed_reason == "continued" and not run.uncertain:
            raise self.violation(
                "COMMANDS-CONTINUE-AS-NEW",
                f"a workflow task of run {run.run_id}, which continued as new, was leased: the first task after a "
                "continue_as_new belongs to the new run",
                expected=f"a task of a new run of {run.workflow_id}",
                received={"task_id": task_id, "run_id": run.run_id},
                replies=[reply],
            )
        if not run.open and not run.uncertain:
            raise self.violation(
                "CANCEL-NO-NEW-LEASES",
                f"a task of a {run.status.value} run was leased",
                expected="no lease",
                received=task_id,
                replies=[reply],
            )
        if known is None and attempt != 1 and not run.uncertain:
            raise self.violation(
                "LEASE-FIRST-ATTEMPT", "first delivery is attempt 1", expected=1, received=attempt, replies=[reply]
            )
        redelivery = known is not None and not (known.uncertain or run.uncertain)
        if known is not None and redelivery and known.status is TaskStatus.READY:
            # Ready again (its holder deregistered): leased at once, as the next attempt.
            judge_next_attempt(self, known, attempt, reply)
            self.hit("workflow_task", "requeued", "poll", task_actor(known, worker))
            self.reached("requeued_leased_at_once")
        elif known is not None and redelivery:
            judge_redelivery(self, known, attempt, worker, received_at, reply)
            self.reached("lease_expired_redelivered")
            # The lease had lapsed and the server's clock recovered the task; this poll took it over.
            self.hit_lapse(known)
            self.hit("workflow_task", "lease_expired", "recover", Actor.CLOCK)
            self.hit("workflow_task", "lease_expired", "poll", task_actor(known, worker))
        elif known is None and not run.uncertain:
            self.hit("workflow_task", "ready", "poll", Actor.OTHER_WORKER)
        self.reached("lease_granted")
        expires = parse_rfc3339(task_obj.get("lease_expires_at"))
        if known is None:
            number = int(attempt) if isinstance(attempt, int) else 1
            known = TaskM(task_id=task_id, run=run, owner=worker, attempt=number, expires=expires)
            self.task_by_id[task_id] = known
        else:
            known.claim(worker, int(attempt) if isinstance(attempt, int) else known.attempt + 1, expires)
        if known.run.status is RunStatus.WAITING:
            known.run.step(RunEvent.WAKE)  # a task was created for the waiting run
        self.touched.add(run.run_id)
        if self.read_back(task_obj, polled, worker, known.attempt) is not None and redelivery:
            self.reached("redelivery_read_in_full")
            self.redeliveries_read += 1
        return known

    def continuation(self, task_obj: dict[str, Any]) -> dict[str, RunShadow]:
        """The runs a lease may belong to: those the machine started, and the new run of a workflow one of them
        continued as new (§8.7.1 "A **new run_id** with the same workflow_id … starts with WorkflowStarted and a
        new workflow task"), learnt from its first task."""
        run_id, wid = str(task_obj.get("run_id")), task_obj.get("workflow_id")
        old = self.continued.get(str(wid))
        if run_id not in self.run_by_id and old is not None and run_id != old.run_id:
            new = RunShadow(workflow_id=old.workflow_id, run_id=run_id)
            self.run_by_id[run_id] = new
            self.successor[old.run_id] = new
            self.ack(run_id, Kind.START)  # acknowledged with the continue_as_new
            if old.open:  # a continue_as_new whose answer was lost did apply
                old.step(RunEvent.BATCH_CONTINUE_AS_NEW, unsure=True)
            del self.continued[old.workflow_id]
            self.generation[run_id] = self.generation.get(old.run_id, 1) + 1
        return self.run_by_id

    def poll_wf(self, worker: str, timeout: int = 1, until: datetime | None = None) -> Polled:
        style = self.next_read()
        send = self.ctx.poll_wf(worker, self.queue, timeout, until=until, **style.poll_fields())
        return self.poll_once(send, style=style)

    def lost_poll(self) -> None:
        """A poll without an answer (or resent after one was lost) may have leased a ready task the model does
        not know of: the open runs without a known live lease become uncertain."""
        self.reached("response_lost")
        live = self.now() + timedelta(seconds=1)
        held = {t.run.run_id for t in self.task_by_id.values() if t.status is TaskStatus.LEASED and t.expires > live}
        for run in self.run_by_id.values():
            if run.open and run.run_id not in held:
                run.uncertain = True

    # -- rules ---------------------------------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        self.register_workers(WORKERS)

    @rule(target=runs)
    def start(self) -> RunShadow:
        wid, run_id = self.run(self.ctx.start(self.queue))
        run = RunShadow(workflow_id=wid, run_id=run_id)
        self.run_by_id[run_id] = run
        self.ack(run_id, Kind.START)
        return run

    @precondition(lambda self: self.ready_work() > 0)
    @rule(target=tasks, worker=st.integers(0, WORKERS - 1))
    def poll(self, worker: int) -> Any:
        polled = self.poll_wf(self.workers[worker])
        task = self.adopt(polled, self.workers[worker], polled.received)
        return multiple(task) if task is not None else multiple()

    @precondition(lambda self: self.ready_work() > 0)
    @rule(target=tasks, n=st.integers(2, WORKERS))
    def race_polls(self, n: int) -> Any:
        """n workers poll at once: every task is leased at most once (Dispatch, Lease and Hooks: one valid lease)."""
        ready = sum(1 for r in self.run_by_id.values() if r.open) - sum(
            1 for t in self.task_by_id.values() if t.status is TaskStatus.LEASED and t.run.open
        )
        style = self.next_read()
        send = style.poll_fields()
        polls = self.poll_race(n, lambda i: self.ctx.poll_wf(self.workers[i], self.queue, 1, **send), style=style)
        self.granted_once(polls, lambda t: f"{t.get('task_id')}#{t.get('workflow_task_attempt')}", "LEASE-EXCLUSIVE")
        adopted = [t for i, p in polls if (t := self.adopt(p, self.workers[i], p.received)) is not None]
        if adopted and n > max(ready, 0):
            self.reached("duplicate_claim_raced")
        return multiple(*adopted)

    def _fenced_call(self, task: TaskM, who: str, verb: str, body: dict[str, Any]) -> tuple[str, Reply] | None:
        owner, attempt = self.actor(task, who)
        at = self.now()
        allowed = self.expected(task, owner, attempt, at)
        reply = self.call(self.ctx.wf_call({"task_id": task.task_id}, verb, body, owner=owner, attempt=attempt))
        if reply is None:
            task.uncertain = True
            return None
        got = self.judge(task, allowed, reply, verb)
        self.hit_task(task, verb, task_actor(task, owner), at, got)
        if who == "owner" and verb == "fail":
            self.hit_run(task.run, "task_fail", Actor.HOLDER)
        if got == "lease_expired" and not task.uncertain:
            self.reached("lease_expired_on_report")
        if got == "run_closed":
            self.reached("report_on_closed_run")
        if who != "owner" and got != "ok":
            self.reached(f"fenced_{who}")
        return got, reply

    @rule(task=tasks, who=st.sampled_from(["owner", "other", "next_attempt", "previous_attempt"]))
    def heartbeat(self, task: TaskM, who: str) -> None:
        previous = task.expires
        res = self._fenced_call(task, who, "heartbeat", {})
        if res is None or res[0] != "ok":
            return
        body = res[1].json()
        new = parse_rfc3339(body.get("lease_expires_at"))
        if body.get("renewed") is not True or (previous is not None and new < previous):
            raise self.violation(
                "LEASE-HEARTBEAT-RENEWS",
                "a heartbeat renews the lease",
                expected=f"renewed true, expiry >= {previous}",
                received=body,
                replies=[res[1]],
            )
        task.expires = new

    @rule(task=tasks, who=st.sampled_from(["owner", "other", "next_attempt"]))
    def history(self, task: TaskM, who: str) -> None:
        res = self._fenced_call(task, who, "history", {"after_sequence": 0, "page_size": 1000})
        if res is None or res[0] != "ok":
            return
        seqs = [e.get("sequence") for e in res[1].json().get("history_events", []) if isinstance(e, dict)]
        problem = check_sequences(seqs)
        if problem:
            raise self.violation(
                "HISTORY-SEQUENCE-CONTIGUOUS", problem, expected="1..N", received=seqs, replies=[res[1]]
            )

    @rule(
        task=tasks,
        who=st.sampled_from(["owner", "owner", "other", "previous_attempt"]),
        batch=st.sampled_from(["timer", "complete", "fail_workflow", "two_terminals", "empty", "unknown_type"]),
    )
    def complete(self, task: TaskM, who: str, batch: str) -> None:
        batches: dict[str, list[dict[str, Any]]] = {
            "timer": [{"type": "start_timer", "delay_seconds": 3600}],
            "complete": [{"type": "complete_workflow", "result": self.ctx.envelope("done")}],
            "fail_workflow": [{"type": "fail_workflow", "message": "conformance"}],
            "two_terminals": [{"type": "complete_workflow"}, {"type": "fail_workflow", "message": "x"}],
            "empty": [],
            "unknown_type": [{"type": "start_timer", "delay_seconds": 1}, {"type": "no_such_command"}],
        }
        commands = batches[batch]
        owner, attempt = self.actor(task, who)
        at = self.now()
        allowed = self.expected(task, owner, attempt, at)
        invalid = batch in ("two_terminals", "empty", "unknown_type")
        if invalid and "ok" in allowed:
            allowed = (allowed - {"ok"}) | {"invalid_commands", "validation_failed"}
        reply = self.call(self.ctx.complete({"task_id": task.task_id}, commands, owner=owner, attempt=attempt))
        if reply is None:
            task.uncertain = task.run.uncertain = True
            if not invalid:
                self.ack(task.run.run_id, BATCH_KINDS[batch], applied=Applied.MAYBE)
            return
        got = self.judge(task, allowed, reply, f"complete ({batch})")
        self.hit_task(task, "complete", task_actor(task, owner), at, got)
        if who == "owner" and batch in BATCH_OPERATIONS:
            self.hit_run(task.run, BATCH_OPERATIONS[batch], Actor.HOLDER)
        self.touched.add(task.run.run_id)
        if got == "run_closed":
            self.reached("complete_on_closed_run")
        if got != "ok":
            if invalid and got in ("invalid_commands", "validation_failed"):
                self.reached("invalid_batch_rejected")
            return
        unsure = task.uncertain or task.run.uncertain
        task.step(TaskEvent.COMPLETE, unsure=unsure)
        task.run.step(BATCH_EVENTS[batch], unsure=unsure)
        self.ack(task.run.run_id, BATCH_KINDS[batch])

    @rule(task=tasks, who=st.sampled_from(["owner", "other", "next_attempt"]))
    def fail(self, task: TaskM, who: str) -> None:
        res = self._fenced_call(task, who, "fail", {"failure": {"message": "replay failed (conformance)"}})
        if res is not None and res[0] == "ok":
            task.step(TaskEvent.FAIL, unsure=task.run.uncertain)
            # §8.8: the run stays open; the machine forgets it for new leases (the server MAY retry it).
            task.run.uncertain = True

    @rule(run=runs, kind=st.sampled_from(["cancel", "terminate"]))
    def close_run(self, run: RunShadow, kind: str) -> None:
        # Cancel and terminate name a workflow id: they reach its current run (a continuation, if any).
        while run.run_id in self.successor:
            run = self.successor[run.run_id]
        if run.closed_reason == "continued" or run.workflow_id in self.continued:
            return  # its (maybe) new run is not known yet: the model could not tell which run the call closes
        was_open = run.open
        at = self.now()
        before = [task_state(t, run, at, self.MARGIN) for t in self.task_by_id.values() if t.run is run]
        run_before = run_state(run, self.run_generation(run))
        answered = self.close_by_control(run, kind, "x") is not None
        if answered:
            if run_before is not None:
                self.hit("run", run_before, kind, Actor.OPERATOR)
            for state in before:
                if state is not None:
                    self.hit("workflow_task", state, "close_run", Actor.OPERATOR)
        closed = answered and was_open
        if closed and any(t.run is run and t.status is TaskStatus.LEASED for t in self.task_by_id.values()):
            self.reached("closed_while_leased")

    def _expiry_fits(self) -> bool:
        return bool(self.live_leases()) and (
            self.lease_seconds is not None and self.lease_seconds <= self.ctx.max_wait and self.expiry_waits < 2
        )

    @precondition(lambda self: self._expiry_fits())
    @rule(target=stale, task=tasks)
    def wait_out_lease(self, task: TaskM) -> Any:
        """The holder "crashes": another worker takes the task over once the lease expires
        (Dispatch, Lease and Hooks)."""
        if task.status is not TaskStatus.LEASED or not task.run.open or task.uncertain or task.run.uncertain:
            live = self.live_leases()
            if self.redeliveries_read or not live:
                return multiple()
            task = live[0]  # no redelivery read in full yet in this example: wait out a live lease instead
        assert self.lease_seconds is not None
        self.expiry_waits += 1
        self.signal(task.run)  # news the redelivery must show (the first task that follows its acceptance)
        old_owner, old_attempt = task.owner, task.attempt
        taker = next(w for w in self.workers if w != old_owner)
        started_before_expiry = self.now() < task.expires
        for polled in self.polls_past_expiry(task.expires, self.lease_seconds, partial(self.poll_wf, taker)):
            if polled.reply is None:
                task.uncertain = True
                return multiple()
            if self.adopt(polled, taker, polled.received) is task:
                if started_before_expiry:
                    self.reached("long_poll_woken_by_expiry")
                return multiple(Stale(task, old_owner, old_attempt))
        attempt = f"workflow_task_attempt {old_attempt + 1}"
        raise self.redelivery_overdue(
            "EXPIRY-REDELIVER-SAME-TASK", f"workflow task {task.task_id}", task.expires, attempt
        )

    def signal(self, run: RunShadow) -> None:
        """Signal an open run (§12.2: 202 signal_received): every task leased after the answer shows it once."""
        name = self.ctx.uid("sig")
        at = self.now()
        before = [task_state(t, run, at, self.MARGIN) for t in self.task_by_id.values() if t.run is run]
        reply = self.call(self.client.control("POST", f"/workflows/{run.workflow_id}/signal/{name}", {"input": [name]}))
        if reply is None:
            self.ack(run.run_id, Kind.SIGNAL, name, applied=Applied.MAYBE, copies=2)
            return
        self.hit_run(run, "signal", Actor.OPERATOR)
        for state in before:
            if state is not None:
                self.hit("workflow_task", state, "signal", Actor.OPERATOR)
        self.touched.add(run.run_id)
        self.expect_signal_received(reply, run)
        self.ack(run.run_id, Kind.SIGNAL, name)

    @precondition(lambda self: bool(self.live_leases()) and self.chains < MAX_CHAINS)
    @rule(target=tasks, links=st.integers(2, 3))
    def continue_as_new(self, links: int) -> Any:
        """The holder of a live lease continues its run as new, and the holder of the new run's first task
        does the same, ``links`` times: each run closes (completed, "continued") and the first task after it
        names a new run of the same workflow whose history starts afresh (§8.7.1, §16.37)."""
        task = self.live_leases()[0]
        self.chains += 1
        leased: list[TaskM] = []
        for _ in range(links):
            nxt = self.continue_run(task)
            if nxt is None:
                break
            leased.append(nxt)
            task = nxt
        if len(leased) >= 2:
            self.reached("continue_as_new_chain")
        return multiple(*leased)

    def continue_run(self, task: TaskM) -> TaskM | None:
        """Complete ``task`` with continue_as_new, then lease and read the new run's first task."""
        run = task.run
        at = self.now()
        allowed = self.expected(task, task.owner, task.attempt, at)
        commands = [{"type": "continue_as_new", "arguments": self.ctx.envelope([run.run_id])}]
        reply = self.call(
            self.ctx.complete({"task_id": task.task_id}, commands, owner=task.owner, attempt=task.attempt)
        )
        if reply is None:
            task.uncertain = run.uncertain = True
            self.ack(run.run_id, Kind.CONTINUE_AS_NEW, applied=Applied.MAYBE)
            self.continued[run.workflow_id] = run  # maybe continued: a lease may name its new run
            return None
        self.touched.add(run.run_id)
        answer = self.judge(task, allowed, reply, "complete (continue_as_new)")
        self.hit_task(task, "complete", Actor.HOLDER, at, answer)
        self.hit_run(run, "continue_as_new", Actor.HOLDER)
        if answer != "ok":
            return None
        unsure = task.uncertain or run.uncertain
        task.step(TaskEvent.COMPLETE, unsure=unsure)
        run.step(RunEvent.BATCH_CONTINUE_AS_NEW, unsure=unsure)
        self.ack(run.run_id, Kind.CONTINUE_AS_NEW)
        self.continued[run.workflow_id] = run
        for i in range(len(self.run_by_id) + 2):
            worker = self.workers[i % WORKERS]
            polled = self.poll_wf(worker)
            if polled.reply is None:
                return None
            got = self.adopt(polled, worker, polled.received)
            if got is not None and got.run.workflow_id == run.workflow_id and got.run is not run:
                self.judge_continued(got.run, reply)
                return got
        if run.uncertain:
            return None
        raise self.violation(
            "COMMANDS-CONTINUE-AS-NEW",
            f"run {run.run_id} continued as new, but no workflow task of a new run of {run.workflow_id} came",
            expected="the new run's first workflow task",
            received="none",
        )

    def judge_continued(self, new: RunShadow, reply: Reply) -> None:
        """§16.37: describe shows the new run, with the next run number, under the same workflow id."""
        described = self.run(self.ctx.describe(new.workflow_id))
        want = {"run_id": new.run_id, "run_number": self.generation.get(new.run_id)}
        got = {k: described.get(k) for k in want}
        if got != want and not new.uncertain:
            raise self.violation(
                "COMMANDS-CONTINUE-AS-NEW",
                f"after continue_as_new, describe of {new.workflow_id} does not show the run its first task named",
                expected=want,
                received=got,
                replies=[reply],
            )
        self.reached("continued_run_first_task_read")

    @rule(old=stale, verb=st.sampled_from(["heartbeat", "complete", "fail", "history"]))
    def stale_report(self, old: Stale, verb: str) -> None:
        """The crashed holder comes back: every report is fenced and leaves no trace."""
        task = old.task
        at = self.now()
        allowed = self.expected(task, old.owner, old.attempt, at)
        bodies: dict[str, dict[str, Any]] = {
            "complete": {"commands": [{"type": "complete_workflow"}]},
            "fail": {"failure": {"message": "late"}},
            "history": {"after_sequence": 0},
            "heartbeat": {},
        }
        body = bodies[verb]
        reply = self.call(self.ctx.wf_call({"task_id": task.task_id}, verb, body, owner=old.owner, attempt=old.attempt))
        if reply is None:
            task.uncertain = True
            return
        got = self.judge(task, allowed, reply, f"stale {verb}")
        self.hit_task(task, verb, task_actor(task, old.owner), at, got)
        if got == "ok" and not task.uncertain:
            raise self.violation(
                "DISPATCH-LATE-EVENT-FENCED",
                "a report of a taken-over lease was accepted",
                expected="409",
                received=reply.status,
                replies=[reply],
            )
        self.reached("stale_report_after_reclaim")

    # -- the sweep over cold cells -----------------------------------------------------------------------

    def sweep(self) -> None:
        """After the examples: every workflow-task cell they left cold, made deterministically
        (:mod:`suite.machines.workflow_sweep`), then every run cell they left cold (:mod:`suite.machines.run_sweep`),
        then every child and cooperative-cancellation cell (:mod:`suite.machines.child_sweep`)."""
        for phase in (sweep_cold_cells, sweep_run_cells, sweep_child_cells):
            self.sweep_rounds(partial(self._guarded, phase))

    def _guarded(self, phase: Any) -> None:
        """One round of a sweep phase. A fault that left an outcome unknown ends the round: its runs are not judged
        further, and the next round (planned from the cells still cold, on queues and runs of its own) goes on."""
        try:
            phase(self)
        except Indeterminate:
            self.ledger["sweep_stopped_by_faults"] += 1
            self.touched.clear()

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def histories_are_sound(self) -> None:
        """Every touched run's history is gap-free with at most one terminal event."""
        self.check_touched_histories(self.run_by_id)


def judge_redelivery(
    m: WorkflowLeaseMachine, known: TaskM, attempt: Any, worker: str, received_at: datetime, reply: Reply
) -> None:
    """A known task leased again: only once its lease expired, as the previous attempt + 1 (§9)."""
    if known.status is not TaskStatus.LEASED:
        raise m.violation(
            "FENCE-AFTER-COMPLETE",
            f"a {known.status.value} task was leased again",
            expected="no lease",
            received=known.task_id,
            replies=[reply],
        )
    if known.expires > received_at + timedelta(seconds=m.MARGIN):
        raise m.violation(
            "LEASE-NOT-SHARED-WHILE-LIVE",
            f"task {known.task_id} was leased again while {known.owner}'s lease runs until {known.expires.isoformat()}",
            expected="no lease",
            received=worker,
            replies=[reply],
        )
    judge_next_attempt(m, known, attempt, reply, "EXPIRY-REDELIVER-SAME-TASK")


def judge_next_attempt(
    m: WorkflowLeaseMachine, known: TaskM, attempt: Any, reply: Reply, requirement: str = "DEREGISTER-RELEASES-LEASES"
) -> None:
    """A known task leased again is the previous attempt + 1."""
    if attempt != known.attempt + 1:
        raise m.violation(
            requirement,
            "a redelivery is the previous attempt + 1",
            expected=known.attempt + 1,
            received=attempt,
            replies=[reply],
        )
