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

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

from suite.client import Reply
from suite.protocol.errors import Rejection
from suite.protocol.fencing import WorkflowTaskView, guard_workflow_task, parse_rfc3339
from suite.protocol.history import check_sequences
from suite.protocol.lifecycles import RunStatus, TaskStatus

from .base import MachineBase, note, race

__all__ = ["WorkflowLeaseMachine"]

MARGIN = 1.0  # seconds around a lease expiry where either outcome is correct
WORKERS = 6
TERMINAL_EVENTS = {
    "WorkflowCompleted",
    "WorkflowFailed",
    "WorkflowCancelled",
    "WorkflowTerminated",
    "WorkflowContinuedAsNew",
    "WorkflowTimedOut",
}

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


@dataclass
class RunM:
    workflow_id: str
    run_id: str
    status: RunStatus = RunStatus.PENDING
    closed_reason: str | None = None
    uncertain: bool = False  # a command on it got no answer: maybe applied

    @property
    def open(self) -> bool:
        return self.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)


@dataclass
class TaskM:
    task_id: str
    run: RunM
    status: TaskStatus = TaskStatus.LEASED
    attempt: int = 1
    owner: str | None = None
    expires: datetime | None = None
    uncertain: bool = False
    past_holders: list[tuple[str, int]] = field(default_factory=list)

    def __repr__(self) -> str:  # shown in Hypothesis' step listing
        return f"TaskM({self.task_id!r})"


@dataclass(frozen=True)
class Stale:
    """A lease that was taken over: its holder's reports must all be fenced."""

    task: TaskM
    owner: str
    attempt: int


class WorkflowLeaseMachine(MachineBase):
    name = "workflow_leases"
    # requirement -> the ledger state a run must reach before the machine may call it passed
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
    }

    runs = Bundle("runs")
    tasks = Bundle("tasks")
    stale = Bundle("stale")

    def __init__(self) -> None:
        super().__init__()
        self.queue = self.ctx.uid("q")
        self.workers: list[str] = []
        self.task_by_id: dict[str, TaskM] = {}
        self.run_by_id: dict[str, RunM] = {}
        self.touched: set[str] = set()
        profile = self.target.test_profile if self.target else {}
        lease = profile.get("workflow_task_lease_seconds")
        self.lease_seconds: float | None = float(lease) if isinstance(lease, int | float) else None
        self.expiry_waits = 0

    # -- helpers -------------------------------------------------------------------------------------

    def ready_work(self) -> int:
        """Runs the model knows have a claimable workflow task (polling an empty queue holds ≥ 1 s)."""
        now = self.now()
        leased = {
            t.run.run_id
            for t in self.task_by_id.values()
            if t.status is TaskStatus.LEASED and t.expires is not None and t.expires > now
        }
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
            if t.status is TaskStatus.LEASED
            and t.run.open
            and not (t.uncertain or t.run.uncertain)
            and t.expires is not None
            and t.expires > now
        ]

    def now(self) -> datetime:
        return datetime.now(UTC)

    def view(self, task: TaskM) -> WorkflowTaskView:
        return WorkflowTaskView(
            task.task_id,
            task.status,
            task.attempt,
            task.owner,
            task.expires,
            task.run.status,
            task.run.closed_reason,
            None,
        )

    def expected(self, task: TaskM, owner: str, attempt: int, at: datetime) -> set[str]:
        """The outcomes the protocol allows ('ok' or a reason), accounting for expiry near ``at``."""
        outs = set()
        for moment in (at - timedelta(seconds=MARGIN), at + timedelta(seconds=MARGIN)):
            try:
                guard_workflow_task(
                    self.view(task), task_id=task.task_id, lease_owner=owner, attempt=attempt, now=moment
                )
                outs.add("ok")
            except Rejection as rej:
                outs.add(rej.reason)
        return outs

    def outcome(self, reply: Reply) -> str:
        return "ok" if reply.status == 200 else (reply.reason or f"http_{reply.status}")

    def judge(self, task: TaskM, allowed: set[str], reply: Reply, verb: str) -> str:
        got = self.outcome(reply)
        if task.uncertain or task.run.uncertain:
            return got  # maybe applied earlier: the model cannot say which answer is right
        if got not in allowed:
            expected = sorted(allowed)
            rejections = [r for r in expected if r != "ok"]
            if rejections and (got == "ok" or "ok" not in allowed):
                # The target answered differently where the protocol demands a rejection.
                req = next((REQUIREMENT_FOR[r] for r in rejections if r in REQUIREMENT_FOR), "FENCE-NO-STATE-CHANGE")
            else:
                # The target refused a call the live lease entitles.
                req = "LEASE-HEARTBEAT-RENEWS" if verb == "heartbeat" else "FENCE-NO-STATE-CHANGE"
            raise self.violation(
                req,
                f"workflow-task {verb}: the model allows {expected}",
                expected=" or ".join(expected),
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
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
        owner = task.owner or self.workers[0]
        if who == "owner":
            return owner, task.attempt
        if who == "other":
            return next(w for w in self.workers if w != owner), task.attempt
        if who == "next_attempt":
            return owner, task.attempt + 1
        return owner, max(1, task.attempt - 1)  # "previous_attempt"

    def adopt(self, body: dict[str, Any], worker: str, received_at: datetime, reply: Reply) -> TaskM | None:
        """Judge a granted lease against the model, then record it. ``received_at`` bounds the grant: a
        long poll may be granted at any moment of its hold, but never after its answer arrived."""
        task_obj = body.get("task")
        if not isinstance(task_obj, dict):
            return None
        task_id = str(task_obj.get("task_id"))
        attempt = task_obj.get("workflow_task_attempt")
        run = self.run_by_id.get(str(task_obj.get("run_id")))
        if run is None:
            raise self.violation(
                "LEASE-OWNER-IS-POLLER",
                "leased a task of a run this queue never started",
                expected="a run started on this example's queue",
                received=task_obj.get("run_id"),
                replies=[reply],
            )
        if task_obj.get("lease_owner") != worker:
            raise self.violation(
                "LEASE-OWNER-IS-POLLER",
                "lease_owner is the poller",
                expected=worker,
                received=task_obj.get("lease_owner"),
                replies=[reply],
            )
        known = self.task_by_id.get(task_id)
        if not run.open and not run.uncertain:
            raise self.violation(
                "CANCEL-NO-NEW-LEASES",
                f"a task of a {run.status.value} run was leased",
                expected="no lease",
                received=task_id,
                replies=[reply],
            )
        if known is None:
            if attempt != 1 and not run.uncertain:
                raise self.violation(
                    "LEASE-FIRST-ATTEMPT", "first delivery is attempt 1", expected=1, received=attempt, replies=[reply]
                )
            known = TaskM(task_id, run)
            self.task_by_id[task_id] = known
        elif not (known.uncertain or run.uncertain):
            if known.status is not TaskStatus.LEASED:
                raise self.violation(
                    "FENCE-AFTER-COMPLETE",
                    f"a {known.status.value} task was leased again",
                    expected="no lease",
                    received=task_id,
                    replies=[reply],
                )
            assert known.expires is not None
            if known.expires > received_at + timedelta(seconds=MARGIN):
                raise self.violation(
                    "LEASE-NOT-SHARED-WHILE-LIVE",
                    f"task {task_id} was leased again while {known.owner}'s lease runs until "
                    f"{known.expires.isoformat()}",
                    expected="no lease",
                    received=worker,
                    replies=[reply],
                )
            if attempt != known.attempt + 1:
                raise self.violation(
                    "EXPIRY-REDELIVER-SAME-TASK",
                    "a redelivery is the previous attempt + 1",
                    expected=known.attempt + 1,
                    received=attempt,
                    replies=[reply],
                )
            self.reached("lease_expired_redelivered")
            assert known.owner is not None
            known.past_holders.append((known.owner, known.attempt))
        self.reached("lease_granted")
        known.status = TaskStatus.LEASED
        known.attempt = int(attempt) if isinstance(attempt, int) else known.attempt + 1
        known.owner = worker
        known.expires = parse_rfc3339(task_obj.get("lease_expires_at"))
        if known.run.status is RunStatus.WAITING:
            known.run.status = RunStatus.RUNNING
        self.touched.add(run.run_id)
        return known

    def poll_once(self, worker: str, timeout: int = 1) -> tuple[Reply | None, datetime]:
        reply = self.call(self.ctx.poll_wf(worker, self.queue, timeout))
        if reply is None or reply.resent:
            self.lost_poll()
        return reply, self.now()

    def lost_poll(self) -> None:
        """A poll without an answer (or resent after one was lost) may have leased a ready task the model does
        not know of: the open runs without a known live lease become uncertain."""
        self.reached("response_lost")
        live = self.now() + timedelta(seconds=1)
        held = {
            t.run.run_id
            for t in self.task_by_id.values()
            if t.status is TaskStatus.LEASED and t.expires is not None and t.expires > live
        }
        for run in self.run_by_id.values():
            if run.open and run.run_id not in held:
                run.uncertain = True

    def check_poll_shape(self, reply: Reply) -> dict[str, Any]:
        body = reply.json()
        if reply.status != 200:
            raise self.violation(
                "POLL-STATUS-PRESENT",
                "a poll of a registered worker answers 200",
                expected=200,
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
        if "poll_status" not in body:
            raise self.violation(
                "POLL-STATUS-PRESENT",
                "every poll response has poll_status",
                expected="poll_status",
                received=sorted(body),
                replies=[reply],
            )
        if (body.get("task") is not None) != (body.get("poll_status") == "leased"):
            raise self.violation(
                "POLL-STATUS-TASK-IFF-LEASED",
                "task != null iff poll_status == leased",
                expected="consistent",
                received=body.get("poll_status"),
                replies=[reply],
            )
        return body

    # -- rules ---------------------------------------------------------------------------------------

    @initialize()
    def register_workers(self) -> None:
        for i in range(WORKERS):
            self.workers.append(self.run(self.ctx.register(self.queue, worker_id=self.ctx.uid(f"w{i}"))))

    @rule(target=runs)
    def start(self) -> RunM:
        wid, run_id = self.run(self.ctx.start(self.queue))
        run = RunM(wid, run_id)
        self.run_by_id[run_id] = run
        return run

    @precondition(lambda self: self.ready_work() > 0)
    @rule(target=tasks, worker=st.integers(0, WORKERS - 1))
    def poll(self, worker: int) -> Any:
        reply, sent = self.poll_once(self.workers[worker])
        if reply is None:
            return multiple()
        task = self.adopt(self.check_poll_shape(reply), self.workers[worker], sent, reply)
        return multiple(task) if task is not None else multiple()

    @precondition(lambda self: self.ready_work() > 0)
    @rule(target=tasks, n=st.integers(2, WORKERS))
    def race_polls(self, n: int) -> Any:
        """n workers poll at once: every task is leased at most once (seed 003: one valid lease)."""
        ready = sum(1 for r in self.run_by_id.values() if r.open) - sum(
            1 for t in self.task_by_id.values() if t.status is TaskStatus.LEASED and t.run.open
        )
        results = self.run(race(n, lambda i: self.ctx.poll_wf(self.workers[i], self.queue, 1)))
        received = self.now()
        granted: dict[str, list[Reply]] = {}
        adopted: list[TaskM] = []
        for i, res in enumerate(results):
            if isinstance(res, BaseException) or res.resent:
                self.lost_poll()
            if isinstance(res, BaseException):
                continue
            body = self.check_poll_shape(res)
            task_obj = body.get("task")
            if isinstance(task_obj, dict):
                key = f"{task_obj.get('task_id')}#{task_obj.get('workflow_task_attempt')}"
                granted.setdefault(key, []).append(res)
                if len(granted[key]) == 1:
                    t = self.adopt(body, self.workers[i], received, res)
                    if t is not None:
                        adopted.append(t)
        for key, replies in granted.items():
            if len(replies) > 1:
                raise self.violation(
                    "LEASE-EXCLUSIVE",
                    f"{len(replies)} concurrent polls were granted {key}",
                    expected="exactly one lease",
                    received=len(replies),
                    replies=replies,
                )
        if granted and n > max(ready, 0):
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
            return
        got = self.judge(task, allowed, reply, f"complete ({batch})")
        self.touched.add(task.run.run_id)
        if got == "run_closed":
            self.reached("complete_on_closed_run")
        if got != "ok":
            if invalid and got in ("invalid_commands", "validation_failed"):
                self.reached("invalid_batch_rejected")
            return
        task.status = TaskStatus.COMPLETED
        if batch == "complete":
            task.run.status, task.run.closed_reason = RunStatus.COMPLETED, "completed"
        elif batch == "fail_workflow":
            task.run.status, task.run.closed_reason = RunStatus.FAILED, "failed"
        else:
            task.run.status = RunStatus.WAITING

    @rule(task=tasks, who=st.sampled_from(["owner", "other", "next_attempt"]))
    def fail(self, task: TaskM, who: str) -> None:
        res = self._fenced_call(task, who, "fail", {"failure": {"message": "replay failed (conformance)"}})
        if res is not None and res[0] == "ok":
            task.status = TaskStatus.FAILED
            # §8.8: the run stays open; the machine forgets it for new leases (the server MAY retry it).
            task.run.uncertain = True

    @rule(run=runs, kind=st.sampled_from(["cancel", "terminate"]))
    def close_run(self, run: RunM, kind: str) -> None:
        reply = self.call(self.ctx.client.control("POST", f"/workflows/{run.workflow_id}/{kind}", {"reason": "x"}))
        if reply is None:
            run.uncertain = True
            return
        self.touched.add(run.run_id)
        if run.uncertain:
            return
        if run.open:
            if reply.status != 200:
                raise self.violation(
                    "CONTROL-CANCEL-CLOSES-RUN",
                    f"{kind} of an open run",
                    expected=200,
                    received=f"{reply.status} {reply.reason}",
                    replies=[reply],
                )
            run.status = RunStatus.CANCELLED if kind == "cancel" else RunStatus.TERMINATED
            run.closed_reason = run.status.value
            if any(t.run is run and t.status is TaskStatus.LEASED for t in self.task_by_id.values()):
                self.reached("closed_while_leased")
        elif reply.status != 409:
            raise self.violation(
                "CONTROL-CANCEL-CLOSES-RUN",
                f"{kind} of a closed run is refused",
                expected=409,
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )

    def _expiry_fits(self) -> bool:
        return bool(self.live_leases()) and (
            self.lease_seconds is not None
            and self.lease_seconds <= self.target.max_wait  # type: ignore[union-attr]
            and self.expiry_waits < 2
        )

    @precondition(lambda self: self._expiry_fits())
    @rule(target=stale, task=tasks)
    def wait_out_lease(self, task: TaskM) -> Any:
        """The holder "crashes": another worker takes the task over once the lease expires (seed 003)."""
        if task.status is not TaskStatus.LEASED or not task.run.open or task.uncertain or task.run.uncertain:
            return multiple()
        assert task.expires is not None
        assert self.lease_seconds is not None
        self.expiry_waits += 1
        old_owner, old_attempt = task.owner or "", task.attempt
        taker = next(w for w in self.workers if w != old_owner)
        deadline = time.monotonic() + max(0.0, (task.expires - self.now()).total_seconds()) + self.lease_seconds + 5
        started_before_expiry = self.now() < task.expires
        while time.monotonic() < deadline:
            hold = max(1, min(10, int(deadline - time.monotonic())))
            reply, sent = self.poll_once(taker, hold)
            if reply is None:
                task.uncertain = True
                return multiple()
            got = self.adopt(self.check_poll_shape(reply), taker, sent, reply)
            if got is task:
                if started_before_expiry:
                    self.reached("long_poll_woken_by_expiry")
                return multiple(Stale(task, old_owner, old_attempt))
        raise self.violation(
            "EXPIRY-REDELIVER-SAME-TASK",
            f"task {task.task_id} was never redelivered after its lease expired",
            expected=f"a lease of {task.task_id} with attempt {old_attempt + 1}",
            received="none",
        )

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
        if got == "ok" and not task.uncertain:
            raise self.violation(
                "DISPATCH-LATE-EVENT-FENCED",
                "a report of a taken-over lease was accepted",
                expected="409",
                received=reply.status,
                replies=[reply],
            )
        self.reached("stale_report_after_reclaim")

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def histories_are_sound(self) -> None:
        """Every touched run's history is gap-free with at most one terminal event."""
        for run_id in sorted(self.touched):
            run = self.run_by_id[run_id]
            events = self.run(self.ctx.history(run.workflow_id, run.run_id))
            problem = check_sequences([e.get("sequence") for e in events])
            if problem:
                raise self.violation("HISTORY-SEQUENCE-CONTIGUOUS", f"run {run_id}: {problem}")
            terminal = [e.get("event_type") for e in events if e.get("event_type") in TERMINAL_EVENTS]
            if len(terminal) > 1:
                raise self.violation(
                    "HISTORY-ONE-TERMINAL-PER-RUN",
                    f"run {run_id} has {terminal}",
                    expected="at most one terminal event",
                    received=terminal,
                )
            if not run.uncertain and not run.open and len(terminal) != 1:
                raise self.violation(
                    "HISTORY-ONE-TERMINAL-PER-RUN",
                    f"closed run {run_id} lacks its terminal event",
                    expected="exactly one",
                    received=terminal,
                )
        note(f"checked {len(self.touched)} run histories")
        self.touched.clear()
