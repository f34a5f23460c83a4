"""The activity machine's model and judges: pure (no I/O, no clock — every moment is an argument).

The model keeps, per execution (one ``activity_execution_id``), its attempts (numbers 1, 2, 3, … across retries
and redeliveries), which one holds the task's lease, the retry policy and whether the outcome is final; per run,
whether it is closed and whether a final outcome may have resumed it. Every shadow status moves through the
model's lifecycle tables (``ACTIVITY_ATTEMPT``, ``ACTIVITY_EXECUTION``, ``ACTIVITY_TASK``, ``RUN``) with
:func:`suite.machines.world.advance`.

For every report the machine asks :func:`branches` what the protocol allows at both ends of the margin window
around the call (from the pure guards ``guard_activity_attempt``, ``guard_activity_report`` and
``activity_heartbeat_outcome`` over an :class:`~suite.protocol.fencing.ActivityAttemptView` of the model), then
:func:`check_body` and :func:`follow` move the model the way the answer says the target moved. A lease is judged by
:func:`judge_identity`, :func:`judge_redelivery` and :func:`judge_retry`; a run's control-plane history by
:func:`check_run_history`. Every judge raises :class:`~suite.protocol.errors.Violation` naming the requirement,
and returns the coverage-ledger states it reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from suite.protocol.codec import encode_blob
from suite.protocol.commands import RetryPolicy
from suite.protocol.errors import Rejection, Violation
from suite.protocol.fencing import (
    ActivityAttemptView,
    HeartbeatDecision,
    activity_heartbeat_outcome,
    guard_activity_attempt,
    guard_activity_report,
    parse_rfc3339,
)
from suite.protocol.history import ACTIVITY_ATTEMPT_EVENTS, ACTIVITY_OUTCOME_EVENTS
from suite.protocol.lifecycles import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_EXECUTION,
    ACTIVITY_TASK,
    RUN,
    AttemptEvent,
    AttemptStatus,
    ExecutionEvent,
    ExecutionStatus,
    RunEvent,
    RunStatus,
    TaskEvent,
    TaskStatus,
)
from suite.text import plural

from .world import RunShadow, advance

__all__ = [
    "BACKOFF_TOLERANCE",
    "SPENT_REPORTS",
    "ActivityRun",
    "ActivityWorld",
    "Attempt",
    "Branch",
    "Execution",
    "apply_timeout",
    "branches",
    "cancel_execution",
    "check_body",
    "check_run_history",
    "exhausted_requirement",
    "follow",
    "judge_identity",
    "judge_lease",
    "judge_redelivery",
    "judge_retry",
    "mark",
    "outcome",
    "report_body",
    "requirement_for",
    "stale_requirement",
]

SPENT_REPORTS = 2  # reports on an ended execution before draws on it are steered to live work
NON_RETRYABLE = ("conformance.FatalError", "conformance.BadInput")
RETRYABLE_TYPE = "conformance.TransientError"
BACKOFF_TOLERANCE = 0.5  # scheduling and network jitter when judging "not leasable before the backoff"

# How an attempt ended (the model's label) -> the history event that records it.
EXPECTED_EVENT = {
    "completed": "ActivityCompleted",
    "retry": "ActivityRetryScheduled",
    "exhausted": "ActivityFailed",
    "flag": "ActivityFailed",
    "type": "ActivityFailed",
    "timeout_retry": "ActivityRetryScheduled",
    "timeout_final": "ActivityTimedOut",
    "cancelled": "ActivityCancelled",
}
# Ends whose event a server may write lazily (a timeout enforcer, a cancel noticed on the next call).
LAZY_ENDS = frozenset({"timeout_retry", "timeout_final", "cancelled"})

# Which requirement a wrong answer breaks, by the rejection the model expected.
REJECTION_REQUIREMENT = {
    "lease_owner_mismatch": "ACTIVITY-FENCE-OWNER",
    "attempt_not_found": "ACTIVITY-ATTEMPT-NOT-FOUND",
    "task_mismatch": "ACTIVITY-TASK-MISMATCH",
    "task_not_found": "FENCE-UNKNOWN-TASK",
    "run_cancelled": "CANCEL-ACTIVITY-OUTCOME-IGNORED",
    "run_terminated": "CANCEL-ACTIVITY-OUTCOME-IGNORED",
    "run_closed": "CANCEL-ACTIVITY-OUTCOME-IGNORED",
    "stop:run_cancelled": "CANCEL-ACTIVITY-HEARTBEAT",
    "stop:run_terminated": "CANCEL-ACTIVITY-HEARTBEAT",
}
OWNERSHIP_REASONS = frozenset({"task_not_found", "attempt_not_found", "task_mismatch", "lease_owner_mismatch"})
RUN_CLOSED_REASONS = ("run_cancelled", "run_terminated", "run_closed")

# An activity run is born waiting: its first workflow task completed with schedule_activity commands only.
_BORN_WAITING = RUN.step(RunStatus.PENDING, RunEvent.BATCH_OPEN_WAITS)


# -- the model -------------------------------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class ActivityRun(RunShadow):
    queue: str  # this run's own workflow queue: only its workflow tasks appear there
    worker: str
    status: RunStatus = _BORN_WAITING
    resumed: bool = False  # a final activity outcome was recorded: a workflow task may (must) exist
    resume_leased: bool = False
    spent: int = 0  # reports made on its activities after it closed
    execs: list[Execution] = field(default_factory=list)


@dataclass(eq=False)
class Execution:
    """One logical activity (one ``activity_execution_id``)."""

    activity_type: str
    run: ActivityRun
    policy_json: dict[str, Any] | None
    policy: RetryPolicy
    start_to_close: int | None
    execution_id: str | None = None
    status: ExecutionStatus = ExecutionStatus.PENDING
    attempts: list[Attempt] = field(default_factory=list)
    current_task: str | None = None  # the execution's newest task; a sentinel while a retry is unleased
    task_status: dict[str, TaskStatus] = field(default_factory=dict)
    not_before: datetime | None = None  # a retry must not be leased before this (its backoff)
    backoff: int = 0
    final: str | None = None  # why no attempt may follow: completed/exhausted/flag/type/timeout/cancelled
    snapshot_max: int | None = None  # max_attempts of the lease's retry_policy snapshot (§11.1)
    uncertain: bool = False
    spent: int = 0  # reports made after it ended or its run closed

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def holder(self, task_id: str) -> Attempt | None:
        """The newest attempt of ``task_id``: the one its lease belongs to while it is leased."""
        return next((a for a in reversed(self.attempts) if a.task_id == task_id), None)

    @property
    def certain(self) -> bool:
        return not (self.uncertain or self.run.uncertain)

    def step(self, event: ExecutionEvent) -> None:
        self.status = advance(ACTIVITY_EXECUTION, self.status, event, not self.certain)

    def step_task(self, task_id: str, event: TaskEvent) -> None:
        """An activity task this execution leased moves through ``ACTIVITY_TASK`` (a task is first known
        when it is leased: ready, then claimed)."""
        before = self.task_status.get(task_id, TaskStatus.READY)
        self.task_status[task_id] = advance(ACTIVITY_TASK, before, event, not self.certain)

    def __repr__(self) -> str:  # shown in Hypothesis' step listing
        return f"Execution({self.activity_type!r})"


@dataclass(eq=False)
class Attempt:
    """One lease of an activity task (one ``activity_attempt_id``)."""

    execution: Execution
    attempt_id: str
    task_id: str
    number: int
    owner: str
    expires: datetime
    deadline: datetime | None  # start_to_close
    status: AttemptStatus = ACTIVITY_ATTEMPT.initial
    end: str | None = None  # how it ended: an EXPECTED_EVENT key, or "expired" (lease lost, redelivered)
    redelivered: bool = False
    details: dict[str, str] | None = None  # the failure.details envelope of its recorded failure
    fenced: list[str] = field(default_factory=list)  # requirements a trace of its refused reports would break
    maybe_timed_out: bool = False  # its run closed within MARGIN of its start_to_close: either may have won
    heartbeated: bool = False  # a heartbeat of it was recorded (200, can_continue)

    def step(self, event: AttemptEvent) -> None:
        self.status = advance(ACTIVITY_ATTEMPT, self.status, event, not self.execution.certain)

    def __repr__(self) -> str:
        return f"Attempt({self.execution.activity_type!r}#{self.number})"


@dataclass(frozen=True)
class Branch:
    """What the model allows at one moment of the margin window around a call."""

    out: str  # "ok", "stop:<reason>" (heartbeat 200 that cannot continue) or a rejection reason
    owned: bool  # the §11.2 ownership guard passed
    timed_out: bool  # the named execution's start_to_close had fired at this moment
    decision: HeartbeatDecision | None = None
    rejection: Rejection | None = None


class ActivityWorld:
    """Every run, execution and attempt of one example, and the questions rules ask of them (by the model
    alone, never the clock unless a moment is given: preconditions then depend on the step program and the
    answers, so Hypothesis replays an example the same way when it shrinks it)."""

    def __init__(self) -> None:
        self.runs: list[ActivityRun] = []
        self.run_by_id: dict[str, ActivityRun] = {}
        self.exec_by_type: dict[str, Execution] = {}
        self.seen_attempt_ids: set[str] = set()  # every activity_attempt_id leased so far

    def add(self, run: ActivityRun) -> None:
        self.runs.append(run)
        self.run_by_id[run.run_id] = run
        self.exec_by_type.update((e.activity_type, e) for e in run.execs)

    def lost_poll(self, at: datetime) -> list[Execution]:
        """A poll without an answer may have leased any claimable task: those executions become uncertain."""
        marked = [e for e in self.all_execs() if self.claimable(e, at) or e.status is ExecutionStatus.PENDING]
        for e in marked:
            e.uncertain = True
        return marked

    def all_execs(self) -> list[Execution]:
        return [e for r in self.runs for e in r.execs]

    def claimable(self, e: Execution, at: datetime, *, expired: bool = True) -> bool:
        """Whether a poll at ``at`` may lease a task of ``e`` (a hint, never a verdict). ``expired=False``
        leaves out redeliveries of expired leases: preconditions then depend on the model alone, not the
        clock, so Hypothesis replays an example the same way when it shrinks it."""
        if not e.certain or not e.run.open or e.final is not None:
            return False
        if e.status is ExecutionStatus.PENDING:
            return True  # fresh, or a retry whose backoff (at most 1 s) a one-second long poll outlasts
        cur = e.current
        return (
            expired
            and cur is not None
            and cur.end is None
            and cur.status in (AttemptStatus.RUNNING, AttemptStatus.EXPIRED)
            and cur.deadline is None
            and cur.expires <= at
        )

    def ready_work(self, at: datetime) -> int:
        """Executions with a ready task (fresh or a retry): the poll rules' precondition."""
        return sum(1 for e in self.all_execs() if self.claimable(e, at, expired=False))

    def leased_any(self) -> bool:
        return any(e.attempts for e in self.all_execs())

    def running(self, timeouts: bool | None = None) -> list[Attempt]:
        """Current attempts the model holds running (by the model alone, never the clock), of open runs;
        ``timeouts`` selects those with (True) or without (False) a start_to_close."""
        return [
            a
            for x in self.all_execs()
            if x.certain and x.run.open and (a := x.current) is not None and a.status is AttemptStatus.RUNNING
            if timeouts is None or (a.deadline is not None) == timeouts
        ]

    def retryable(self) -> list[Attempt]:
        """Running attempts (no start_to_close racing them) with attempts left: a retryable failure retries."""
        return [a for a in self.running(timeouts=False) if a.number < a.execution.policy.max_attempts]

    def running_any(self) -> bool:
        return bool(self.running())

    def decisive_any(self) -> bool:
        """A running attempt with attempts left: a non-retryable failure of it ends the activity by its kind,
        not by the count (the only moment the non-retryable rules can be judged)."""
        return any(a.number < a.execution.policy.max_attempts for a in self.running())

    @staticmethod
    def index(e: Execution) -> int:
        """The execution's number: picks among candidates deterministically from the drawn execution."""
        return int(e.activity_type.rsplit(".", 1)[1])

    def fresh(self, e: Execution) -> bool:
        """Leased, and not yet reported on more than SPENT_REPORTS times since it ended or its run closed."""
        return bool(e.attempts) and (e.spent if e.run.open else e.run.spent) < SPENT_REPORTS

    def reportable(self) -> bool:
        return any(self.fresh(e) for e in self.all_execs())

    def open_work(self) -> bool:
        """An activity that may still be leased, retried or reported as its final outcome."""
        return any(e.certain and e.run.open and e.final is None for e in self.all_execs())

    def focus(self, e: Execution) -> Execution:
        """As an example goes on, draws land more and more on ended executions. After a few reports on one
        (duplicates, late reports, reports after a cancel), steer the draw to an execution with a running
        attempt, chosen by the drawn one so the step program stays deterministic."""
        if self.fresh(e):
            return e
        live = [
            x
            for x in self.all_execs()
            if x.certain
            and x.run.open
            and x.final is None
            and (a := x.current) is not None
            and a.status is AttemptStatus.RUNNING
        ]
        if not live:
            live = [x for x in self.all_execs() if self.fresh(x)]
        return live[self.index(e) % len(live)] if live else e

    def pick(self, e: Execution, which: str) -> Attempt | None:
        e = self.focus(e)
        if not e.attempts:
            return None
        if which == "previous" and len(e.attempts) > 1:
            return e.attempts[-2]
        return e.attempts[-1]

    def decisive_attempt(self, e: Execution, kind: str) -> Attempt:
        """A running attempt with attempts left (so the failure kind, not the count, decides), preferring the
        drawn execution's, and one whose policy lists error types when the failure names one."""
        live = self.running()

        def decisive(a: Attempt) -> bool:
            policy = a.execution.policy
            listed = bool(policy.non_retryable_error_types) or kind not in ("type", "class")
            return a.number < policy.max_attempts and listed

        pool = [a for a in live if decisive(a)] or live
        return e.current if e.current in pool and e.current is not None else pool[self.index(e) % len(pool)]

    def closable(self, run: ActivityRun) -> bool:
        """An open run with an activity attempt still running (the interesting moment to close it)."""
        return (
            run.open
            and not run.uncertain
            and any((a := e.current) is not None and a.status is AttemptStatus.RUNNING for e in run.execs)
        )

    def lease_wait_target(self) -> Attempt | None:
        held = self.running(timeouts=False)
        return min(held, key=lambda a: a.expires) if held else None

    def timeout_wait_target(self) -> Attempt | None:
        running = self.running(timeouts=True)
        return min(running, key=lambda a: a.deadline or a.expires) if running else None

    def probe_target(self, may_probe: bool) -> ActivityRun | None:
        for run in self.runs:
            if not run.open or run.uncertain or any(not e.certain for e in run.execs):
                continue
            if run.resumed and not run.resume_leased:
                return run
            retried = any(a.end in ("retry", "timeout_retry") for e in run.execs for a in e.attempts)
            if retried and not run.resumed and may_probe:
                return run
        return None


# -- moving the model ------------------------------------------------------------------------------------


def timed_out(a: Attempt, moment: datetime) -> bool:
    """§11.7: the attempt's start_to_close has fired by ``moment`` (a closed run's attempt is cancelled
    instead, which every guard answers before looking at the attempt)."""
    return (
        a.status is AttemptStatus.RUNNING and a.deadline is not None and a.deadline <= moment and a.execution.run.open
    )


def apply_timeout(a: Attempt) -> None:
    """§11.7: "On expiry the upstream enforcer retries, subject to attempts left and backoff … When no
    retry remains it records a terminal `ActivityTimedOut` … and wakes the workflow"."""
    e = a.execution
    assert a.deadline is not None
    a.step(AttemptEvent.EXPIRE)
    e.step_task(a.task_id, TaskEvent.TIME_OUT)
    if e.policy.should_retry(a.number):
        a.end = "timeout_retry"
        e.step(ExecutionEvent.RETRY)
        e.current_task = f"retry-after-{a.number}"
        e.backoff = e.policy.backoff_before(a.number + 1)
        e.not_before = a.deadline + timedelta(seconds=e.backoff)
    else:
        a.end = "timeout_final"
        e.step(ExecutionEvent.TIME_OUT)
        e.final = "timeout"
        e.run.resumed = True


def cancel_execution(e: Execution) -> None:
    """§11.5: the run was closed; its still-running attempt, open tasks and the execution are cancelled."""
    for a in e.attempts:
        if a.status is AttemptStatus.RUNNING:
            a.step(AttemptEvent.CANCEL)
            a.end = "cancelled"
    for task_id, status in list(e.task_status.items()):
        if status in (TaskStatus.READY, TaskStatus.LEASED):
            e.step_task(task_id, TaskEvent.CANCEL)
    if e.final is None:
        e.step(ExecutionEvent.CANCEL)
        e.final = "cancelled"


def adopt_lease(e: Execution, attempt: Attempt, snapshot: Any) -> None:
    """Record a judged lease: a redelivery expires the attempt that held the task (§9 "A lease expiry closes
    the attempt"), the task is claimed again, the execution runs the new attempt."""
    cur = e.current
    if cur is not None and cur.task_id == attempt.task_id:
        if cur.status is AttemptStatus.RUNNING:
            cur.step(AttemptEvent.EXPIRE)
        cur.end, cur.redelivered = "expired", True
        if e.task_status.get(attempt.task_id) is TaskStatus.LEASED:
            e.step_task(attempt.task_id, TaskEvent.EXPIRE)
        if e.status is ExecutionStatus.RUNNING:
            e.step(ExecutionEvent.LEASE_LOST)
    e.attempts.append(attempt)
    e.step_task(attempt.task_id, TaskEvent.CLAIM)
    e.current_task = attempt.task_id
    e.step(ExecutionEvent.CLAIM)
    e.not_before = None
    if isinstance(snapshot, dict) and isinstance(snapshot.get("max_attempts"), int):
        e.snapshot_max = snapshot["max_attempts"]


def follow(
    matched: list[Branch],
    verb: str,
    got: str,
    body: Mapping[str, Any],
    named: Attempt | None,
    *,
    label: str,
    sent: datetime,
    details: Any,
) -> None:
    """Move the model the way the answer says the target moved."""
    if named is None or not matched or not all(b.owned for b in matched):
        return
    e = named.execution
    cur = e.current
    if all(b.timed_out for b in matched) and cur is not None and cur.status is AttemptStatus.RUNNING:
        apply_timeout(cur)
    if verb == "heartbeat":
        _follow_heartbeat(matched, got, body, named)
        return
    if got in RUN_CLOSED_REASONS:
        cancel_execution(e)  # §11.5: the refused report closes what was still open as cancelled
        return
    if got != "ok":
        return
    e.step_task(named.task_id, TaskEvent.COMPLETE)  # §9.1: "An activity retry also completes the old task"
    if verb == "complete":
        named.step(AttemptEvent.COMPLETE)
        named.end = "completed"
        e.step(ExecutionEvent.COMPLETE)
        e.final = "completed"
        e.run.resumed = True
        return
    named.step(AttemptEvent.FAIL)
    named.end = label
    named.details = details.get("details") if isinstance(details, dict) else None
    if label == "retry":
        e.step(ExecutionEvent.RETRY)
        e.current_task = f"retry-after-{named.number}"
        e.backoff = e.policy.backoff_before(named.number + 1)
        e.not_before = sent + timedelta(seconds=e.backoff)
    else:
        e.step(ExecutionEvent.FAIL)
        e.final = label
        e.run.resumed = True


def _follow_heartbeat(matched: list[Branch], got: str, body: Mapping[str, Any], named: Attempt) -> None:
    decision = matched[0].decision
    if decision is None:
        return
    if got == "ok":
        named.expires = parse_rfc3339(body.get("lease_expires_at"))
        named.heartbeated = True
    elif all(b.decision is not None and b.decision.closes_attempt is AttemptEvent.CANCEL for b in matched):
        cancel_execution(named.execution)
    elif named.status is AttemptStatus.RUNNING and all(
        b.decision is not None and b.decision.closes_attempt is AttemptEvent.EXPIRE for b in matched
    ):
        named.step(AttemptEvent.EXPIRE)


# -- what the protocol allows ----------------------------------------------------------------------------


def view(a: Attempt, moment: datetime) -> tuple[ActivityAttemptView, bool]:
    """The §11.2-§11.5 view of attempt ``a`` at ``moment``, and whether a start_to_close fired by then (the
    model then shows the states the §11.7 timeout leads to)."""
    e, run = a.execution, a.execution.run
    attempt_status = a.status
    task_status = e.task_status.get(a.task_id, TaskStatus.LEASED)
    exec_status, exec_task = e.status, e.current_task
    cur = e.current
    fired = cur is not None and timed_out(cur, moment)
    if fired and cur is not None:
        if cur is a:
            attempt_status = ACTIVITY_ATTEMPT.step(attempt_status, AttemptEvent.EXPIRE)
        if cur.task_id == a.task_id:
            task_status = advance(ACTIVITY_TASK, task_status, TaskEvent.TIME_OUT, True)
        retry = e.policy.should_retry(cur.number)
        exec_status = advance(
            ACTIVITY_EXECUTION, exec_status, ExecutionEvent.RETRY if retry else ExecutionEvent.TIME_OUT, True
        )
        if retry:
            exec_task = f"retry-after-{cur.number}"
    holder = e.holder(a.task_id) if task_status is TaskStatus.LEASED else None
    seen = ActivityAttemptView(
        attempt_id=a.attempt_id,
        task_id=a.task_id,
        attempt_number=a.number,
        attempt_status=attempt_status,
        lease_owner=a.owner,
        lease_expires_at=a.expires,
        task_status=task_status,
        task_current_attempt_id=holder.attempt_id if holder is not None else None,
        execution_status=exec_status,
        execution_current_task_id=exec_task,
        run_status=run.status,
        run_closed_reason=run.closed_reason,
        run_closed_at=None,
    )
    return seen, fired


def branches(
    named: Attempt | None, verb: str, *, task_id: str, attempt_id: str, owner: str, at: datetime, margin: float
) -> list[Branch]:
    """The outcomes the protocol allows for one report, at both ends of the margin window."""
    out: list[Branch] = []
    for moment in (at - timedelta(seconds=margin), at + timedelta(seconds=margin)):
        seen, fired = (None, False) if named is None else view(named, moment)
        try:
            checked = guard_activity_attempt(
                seen, task_exists=True, task_id=task_id, activity_attempt_id=attempt_id, lease_owner=owner
            )
        except Rejection as rej:
            out.append(Branch(rej.reason, False, fired, rejection=rej))
            continue
        if verb == "heartbeat":
            decision = activity_heartbeat_outcome(checked, now=moment)
            label = "ok" if decision.can_continue else f"stop:{decision.reason}"
            out.append(Branch(label, True, fired, decision=decision))
            continue
        try:
            guard_activity_report(checked, verb="complete" if verb == "complete" else "fail", now=moment)
            out.append(Branch("ok", True, fired))
        except Rejection as rej:
            out.append(Branch(rej.reason, True, fired, rejection=rej))
    return out


def outcome(status: int, reason: str | None, body: Mapping[str, Any], verb: str) -> str:
    """The answer as a branch label: 'ok', 'stop:<reason>' (a heartbeat that cannot continue) or a reason."""
    if verb == "heartbeat" and status == 200:
        return "ok" if body.get("can_continue") is True else f"stop:{body.get('reason')}"
    return "ok" if status == 200 else (reason or f"http_{status}")


def final_timeout_pending(run: ActivityRun, now: datetime, margin: float) -> bool:
    """A start_to_close of this run may fire within the window: a workflow task may appear legitimately."""
    soon = now + timedelta(seconds=2 * margin + 1)
    return any(
        (a := e.current) is not None
        and a.status is AttemptStatus.RUNNING
        and a.deadline is not None
        and a.deadline <= soon
        for e in run.execs
    )


# -- what the machine reports -------------------------------------------------------------------------


def _envelope(value: Any) -> dict[str, str]:
    return {"codec": "avro", "blob": encode_blob(value)}


def failure_for(e: Execution, kind: str, detail: int) -> dict[str, Any]:
    """The failure body for ``kind`` (§11.4): a retryable one, non-retryable by flag, by a listed type or
    class, or of a type the policy does not list; always with a ``details`` envelope."""
    listed = e.policy.non_retryable_error_types
    failure: dict[str, Any] = {
        "message": f"conformance failure ({kind})",
        "details": _envelope({"detail": detail, "kind": kind}),
    }
    ftype: str | None = None
    fclass: str | None = None
    if kind == "flag":
        failure["non_retryable"] = True
    elif kind == "type":
        ftype = listed[0] if listed else NON_RETRYABLE[0]
    elif kind == "class":
        fclass = listed[-1] if listed else NON_RETRYABLE[1]
    elif kind == "unlisted":
        ftype = RETRYABLE_TYPE
    if ftype is not None:
        failure["type"] = ftype
    if fclass is not None:
        failure["class"] = fclass
    return failure


def failure_label(e: Execution, number: int, ftype: str | None, fclass: str | None, flag: bool) -> str:
    """How the model says a failure ends attempt ``number`` (§11.6)."""
    if e.policy.should_retry(number, ftype, fclass, flag):
        return "retry"
    if number >= e.policy.max_attempts:
        return "exhausted"
    return "flag" if flag else "type"


def report_body(a: Attempt, verb: str, kind: str, detail: int) -> tuple[dict[str, Any], str]:
    """The body of ``verb`` for attempt ``a`` (without the fencing fields), and the failure's label."""
    e = a.execution
    if verb == "complete":
        return {"result": _envelope({"activity": e.activity_type, "attempt": a.number})}, ""
    if verb == "fail":
        failure = failure_for(e, kind, detail)
        ftype, fclass = failure.get("type"), failure.get("class")
        return {"failure": failure}, failure_label(e, a.number, ftype, fclass, kind == "flag")
    return {"message": "conformance", "current": a.number, "total": 3}, ""


# -- which requirement a wrong answer breaks -------------------------------------------------------------


def stale_requirement(a: Attempt | None, now: datetime) -> str:
    """The requirement a recorded report of a no-longer-live attempt breaks, by why it is not live."""
    if a is None:
        return "ACTIVITY-ATTEMPT-NOT-FOUND"
    if a.redelivered:
        return "ACTIVITY-REDELIVERY-NEW-ATTEMPT"
    if a.end in ("timeout_retry", "timeout_final") or (a.deadline is not None and a.deadline <= now):
        return "TIMEOUT-LATE-COMPLETE-STALE"
    if a.status in (AttemptStatus.COMPLETED, AttemptStatus.FAILED):
        return "ACTIVITY-DUPLICATE-COMPLETE-STALE"
    if a.status is AttemptStatus.CANCELLED:
        return "CANCEL-ACTIVITY-OUTCOME-IGNORED"
    if a.expires <= now:
        return "ACTIVITY-REDELIVERY-NEW-ATTEMPT"  # "An activity lease expiry closes the attempt"
    return "HISTORY-ONE-TERMINAL-PER-ATTEMPT"


def requirement_for(allowed: set[str], got: str, verb: str, named: Attempt | None, now: datetime) -> str:
    for expected in sorted(allowed):
        if expected in REJECTION_REQUIREMENT:
            return REJECTION_REQUIREMENT[expected]
    stops = {x for x in allowed if x.startswith("stop:")}
    if verb == "heartbeat" and stops and not (got == "ok" or got.startswith("stop:")):
        return "ACTIVITY-HEARTBEAT-STOP-200"  # "still HTTP 200 (only attempt_not_found gives 404)"
    if allowed - {"ok"}:
        return stale_requirement(named, now)
    return "ACTIVITY-HEARTBEAT-RENEWS" if verb == "heartbeat" else "FENCE-NO-STATE-CHANGE"


def exhausted_requirement(e: Execution) -> str:
    """Retried past max_attempts: the bound is broken (§11.6 "Retry if … `attempt_number < max_attempts`"),
    unless the activity had no policy and the server's own snapshot (§11.1 ``retry_policy``) shows it applied
    a default other than 1 (§11.6 "Default when no `retry_policy` is given | **`max_attempts = 1`**")."""
    if e.policy_json is None and e.snapshot_max not in (None, 1):
        return "RETRY-DEFAULT-NONE"
    return "RETRY-FAILED-ATTEMPTS-BOUNDED"


def final_requirement(e: Execution) -> str:
    if e.final in ("exhausted", "timeout"):
        return exhausted_requirement(e)
    return {
        "flag": "RETRY-NON-RETRYABLE-FLAG",
        "type": "RETRY-NON-RETRYABLE-TYPE",
        "completed": "RETRY-ONE-OUTCOME-PER-EXECUTION",
        "cancelled": "CANCEL-NO-NEW-LEASES",
    }.get(e.final or "", "RETRY-ONE-OUTCOME-PER-EXECUTION")


# -- judging a lease -------------------------------------------------------------------------------------


def judge_lease(
    world: ActivityWorld, task: Mapping[str, Any], worker: str, received: datetime, margin: float
) -> tuple[Attempt, list[str]]:
    """Judge a granted activity lease (§11.1) against the model, then record it: it names an activity this
    example scheduled, leased to the poller, and continues its execution — a redelivery of its task after the
    lease expired, or a retry. ``received``: when the answer arrived (client clock). Returns the new attempt and
    the coverage-ledger states reached."""
    e = world.exec_by_type.get(str(task.get("activity_type")))
    if e is None:
        raise Violation(
            "ACTIVITY-SCHEDULED-LEASABLE",
            "leased an activity this example never scheduled on its private queue",
            expected=sorted(world.exec_by_type),
            received=task.get("activity_type"),
        )
    if task.get("lease_owner") != worker:
        raise Violation(
            "LEASE-OWNER-IS-POLLER", "lease_owner is the poller", expected=worker, received=task.get("lease_owner")
        )
    attempt = attempt_of(e, task, worker)
    cur = e.current
    redelivery = cur is not None and cur.task_id == attempt.task_id
    late = received + timedelta(seconds=margin)
    reported, execution_id = task.get("attempt_number"), task.get("activity_execution_id")
    if e.certain:
        judge_identity(
            e, redelivery, attempt.task_id, attempt.attempt_id, reported, execution_id, world.seen_attempt_ids
        )
    states: list[str] = []
    if redelivery and cur is not None:
        if e.certain:
            judge_redelivery(e, cur, late, attempt.task_id, reported, received)
        states.append("lease_expired_redelivered")
    elif cur is not None and e.certain:
        states.extend(judge_retry(e, cur, late, attempt.task_id, reported, received))
        if cur.heartbeated and cur.end == "retry":
            states.append("retry_after_heartbeat_leased")  # §11.6 numbering across a heartbeat and a failure
    adopt_lease(e, attempt, task.get("retry_policy"))
    e.execution_id = str(execution_id)
    world.seen_attempt_ids.add(attempt.attempt_id)
    states.append("activity_leased")
    return attempt, states


def attempt_of(e: Execution, task: Mapping[str, Any], worker: str) -> Attempt:
    """The attempt a lease describes (§11.1); unreadable timestamps break ACTIVITY-SCHEDULED-LEASABLE."""
    raw_deadlines = task.get("deadlines")
    deadlines: dict[str, Any] = raw_deadlines if isinstance(raw_deadlines, dict) else {}
    try:
        expires = parse_rfc3339(task.get("lease_expires_at"))
        deadline = parse_rfc3339(deadlines["start_to_close"]) if deadlines.get("start_to_close") else None
    except (ValueError, KeyError) as exc:
        raise Violation(
            "ACTIVITY-SCHEDULED-LEASABLE",
            f"an activity lease with an unreadable lease_expires_at or deadline: {exc}",
            expected="RFC 3339 timestamps",
            received={"lease_expires_at": task.get("lease_expires_at"), "deadlines": deadlines},
        ) from None
    number = task.get("attempt_number")
    cur = e.current
    return Attempt(
        execution=e,
        attempt_id=str(task.get("activity_attempt_id")),
        task_id=str(task.get("task_id")),
        number=number if isinstance(number, int) else (cur.number + 1 if cur else 1),
        owner=worker,
        expires=expires,
        deadline=deadline,
    )


def judge_identity(
    e: Execution, redelivery: bool, task_id: str, attempt_id: str, number: Any, execution_id: Any, seen: set[str]
) -> None:
    """Whatever the lease is, it must belong to a live execution and continue its numbering (``seen``: every
    activity_attempt_id leased so far)."""
    run, cur = e.run, e.current
    if not run.open:
        raise Violation(
            "CANCEL-NO-NEW-LEASES",
            f"an activity of a {run.status.value} run was leased",
            expected="no lease",
            received=task_id,
        )
    if e.final is not None:
        raise Violation(
            final_requirement(e),
            f"execution {e.activity_type} ended ({e.final}, max_attempts {e.policy.max_attempts}) "
            f"but attempt {number} was leased",
            expected="no further attempt",
            received={"task_id": task_id, "attempt_number": number},
        )
    if e.execution_id is not None and execution_id != e.execution_id:
        raise Violation(
            "RETRY-EXECUTION-ID-STABLE",
            "activity_execution_id changed between attempts",
            expected=e.execution_id,
            received=execution_id,
        )
    if attempt_id in seen:
        raise Violation(
            "ACTIVITY-REDELIVERY-NEW-ATTEMPT" if redelivery else "RETRY-ATTEMPT-ID-DISTINCT",
            "an activity_attempt_id was leased twice: every lease is a new attempt",
            expected="a new activity_attempt_id",
            received=attempt_id,
        )
    want = cur.number + 1 if cur is not None else 1
    if number != want:
        raise Violation(
            "ACTIVITY-REDELIVERY-NEW-ATTEMPT" if redelivery else "RETRY-ATTEMPTS-CONTIGUOUS",
            f"attempt numbers of {e.activity_type} must run 1, 2, 3, … without gaps or repeats",
            expected=want,
            received=number,
        )


def judge_redelivery(e: Execution, cur: Attempt, late: datetime, task_id: str, number: Any, received: datetime) -> bool:
    """The same task again: legal only once the current attempt's lease has expired (§9). False when the
    model cannot judge it (a start_to_close and the lease expiry raced): the execution becomes uncertain."""
    if cur.end in ("retry", "timeout_retry"):
        raise Violation(
            "RETRY-BACKOFF-SCHEDULE",
            f"the retry of {e.activity_type} reused task {task_id}: a retry is a new task"
            " (docs/reference.md: Activities, Retries)",
            expected="a new task_id",
            received=task_id,
        )
    if cur.deadline is not None and cur.end is None:
        # A start_to_close shorter than the lease fires first and makes a retry (a new task_id); a
        # redelivery of the same task means the server ordered them the other way. Not judged here.
        e.uncertain = True
        return False
    if cur.end is not None or cur.expires > late:
        raise Violation(
            "DISPATCH-ONE-LEASE-PER-DELIVERY",
            f"task {task_id} was leased again while attempt {cur.number} "
            + (f"had ended ({cur.end})" if cur.end else "still held a live lease"),
            expected=f"no lease before {cur.expires.isoformat()}",
            received={"attempt_number": number, "received_at": received.isoformat()},
        )
    return True


def judge_retry(e: Execution, cur: Attempt, late: datetime, task_id: str, number: Any, received: datetime) -> list[str]:
    """A new task of an execution that had attempts: legal only as a retry after a failure or a
    start_to_close (§11.6 "A new **ready** activity task (new `task_id`)"), after its backoff."""
    if cur.status is AttemptStatus.RUNNING:
        _judge_retry_of_running(e, cur, late, task_id, number)
    elif e.status is not ExecutionStatus.PENDING:
        raise Violation(
            "DISPATCH-ONE-LEASE-PER-DELIVERY",
            f"a new task of {e.activity_type} was leased although no retry was scheduled",
            expected=f"a redelivery of {cur.task_id} or nothing",
            received={"task_id": task_id, "attempt_number": number},
        )
    states = []
    if e.not_before is not None and e.backoff > 0:
        if received < e.not_before - timedelta(seconds=BACKOFF_TOLERANCE):
            raise Violation(
                "ACTIVITY-RETRY-BACKOFF",
                f"the retry of {e.activity_type} was leased before its {e.backoff}s backoff passed",
                expected=f"not before {e.not_before.isoformat()}",
                received=f"leased by {received.isoformat()}",
            )
        states.append("retry_leased_after_backoff")
    states.append("retry_leased")
    if isinstance(number, int) and number >= 3:
        states.append("third_attempt_leased")
    return states


def _judge_retry_of_running(e: Execution, cur: Attempt, late: datetime, task_id: str, number: Any) -> None:
    """A new task while the model holds the current attempt running: only its start_to_close can explain it."""
    timed = cur.deadline is not None and cur.deadline <= late
    if timed and e.policy.should_retry(cur.number):
        apply_timeout(cur)
    elif timed:
        raise Violation(
            exhausted_requirement(e),
            f"{e.activity_type} attempt {cur.number} of {e.policy.max_attempts} timed out with no attempt "
            "left, yet another attempt was leased",
            expected="ActivityTimedOut and no further attempt",
            received={"task_id": task_id, "attempt_number": number},
        )
    elif cur.expires <= late:
        raise Violation(
            "ACTIVITY-REDELIVERY-NEW-ATTEMPT",
            f"the expired lease of {e.activity_type} came back as a new task: a redelivery keeps the task_id",
            expected=cur.task_id,
            received=task_id,
        )
    else:
        raise Violation(
            "DISPATCH-ONE-LEASE-PER-DELIVERY",
            f"a second task of {e.activity_type} was leased while attempt {cur.number} is live",
            expected="one live task per execution",
            received={"task_id": task_id, "attempt_number": number},
        )


# -- judging a report's answer ---------------------------------------------------------------------------


def check_body(
    status: int,
    body: Mapping[str, Any],
    verb: str,
    got: str,
    matched: list[Branch],
    named: Attempt | None,
    now: datetime,
) -> None:
    """The body of an answer the model allowed carries what that branch says (§11.3-§11.5)."""
    if verb == "heartbeat":
        if status == 200:
            _check_heartbeat_body(body, got, matched, named)
        return
    if got == "ok":
        want_outcome = "completed" if verb == "complete" else "failed"
        if body.get("recorded") is not True or body.get("outcome") != want_outcome:
            raise Violation(
                "ACTIVITY-COMPLETE-RECORDED",
                f"an accepted activity {verb} is recorded",
                expected={"recorded": True, "outcome": want_outcome},
                received={k: body.get(k) for k in ("recorded", "outcome")},
            )
    elif got in RUN_CLOSED_REASONS:
        want: dict[str, Any] = {"outcome": "ignored", "recorded": False, "can_continue": False}
        if got != "run_closed":
            want["cancel_requested"] = True
        wrong = {k: body.get(k) for k, v in want.items() if body.get(k) != v}
        if wrong:
            raise Violation(
                "CANCEL-ACTIVITY-OUTCOME-IGNORED",
                f"activity {verb} after the run closed is ignored",
                expected=want,
                received=wrong,
            )
    elif got == "stale_attempt" and body.get("recorded") is not False:
        raise Violation(
            stale_requirement(named, now),
            f"a stale activity {verb} says recorded:false",
            expected={"recorded": False},
            received={"recorded": body.get("recorded")},
        )


def _check_heartbeat_body(body: Mapping[str, Any], got: str, matched: list[Branch], named: Attempt | None) -> None:
    decision = next((b.decision for b in matched if b.decision is not None), None)
    if decision is None:
        return
    want: dict[str, Any] = {"can_continue": decision.can_continue, "cancel_requested": decision.cancel_requested}
    if not decision.can_continue:
        want["heartbeat_recorded"] = False
    if decision.cancel_requested and named is not None:
        want["run_closed_reason"] = named.execution.run.closed_reason
    wrong = {k: body.get(k) for k, v in want.items() if body.get(k) != v}
    if decision.cancel_requested and body.get("run_closed_at") is None:
        wrong["run_closed_at"] = None
    if wrong:
        cancel = got in ("stop:run_cancelled", "stop:run_terminated")
        raise Violation(
            "CANCEL-ACTIVITY-HEARTBEAT" if cancel else "ACTIVITY-HEARTBEAT-STOP-200",
            f"heartbeat body ({got})",
            expected={**want, **({"run_closed_at": "non-null"} if decision.cancel_requested else {})},
            received=wrong,
        )
    if decision.can_continue and named is not None:
        try:
            new = parse_rfc3339(body.get("lease_expires_at"))
        except ValueError:
            new = None
        if new is None or new < named.expires:
            raise Violation(
                "ACTIVITY-HEARTBEAT-RENEWS",
                "a live heartbeat extends the lease",
                expected=f"lease_expires_at >= {named.expires.isoformat()}",
                received=body.get("lease_expires_at"),
            )


def mark(verb: str, got: str, named: Attempt | None, was: AttemptStatus, now: datetime) -> list[str]:
    """The coverage-ledger states a judged answer reached; records what a trace of a refused report would
    break on the attempt it named."""
    states: list[str] = []
    if got in ("lease_owner_mismatch", "attempt_not_found", "task_mismatch"):
        states.append("fenced_owner" if got == "lease_owner_mismatch" else got)
    if verb == "heartbeat":
        if got == "ok":
            states.append("heartbeat_renewed")
        elif got.startswith("stop:"):
            states.append("heartbeat_stopped")
            if got in ("stop:run_cancelled", "stop:run_terminated"):
                states.append("cancel_heartbeat")
        return states
    if named is None:
        return states
    if got != "ok" and got not in OWNERSHIP_REASONS:
        named.fenced.append(REJECTION_REQUIREMENT.get(got) or stale_requirement(named, now))
    elif got == "lease_owner_mismatch":
        named.fenced.append("ACTIVITY-FENCE-OWNER")
    if got in ("run_cancelled", "run_terminated"):
        states.append("outcome_ignored")
    if got == "stale_attempt":
        if verb == "complete" and was is AttemptStatus.COMPLETED:
            states.append("duplicate_complete_stale")
        if named.redelivered:
            states.append("stale_report_after_redelivery")
        if verb == "complete" and named.end in ("timeout_retry", "timeout_final"):
            states.append("late_complete_after_timeout")
    if got == "ok":
        states.extend(_recorded_states(verb, named))
    return states


def _recorded_states(verb: str, named: Attempt) -> list[str]:
    if verb == "complete":
        return ["activity_completed"]
    e = named.execution
    return {
        "retry": ["retry_scheduled"],
        "exhausted": ["default_policy_final" if e.policy_json is None else "retries_exhausted"],
        "flag": ["non_retryable_flag"],
        "type": ["non_retryable_type"],
    }.get(named.end or "", [])


# -- judging a run's control-plane history ---------------------------------------------------------------


def check_run_history(run: ActivityRun, events: list[dict[str, Any]], now: datetime, margin: float) -> list[str]:
    """A run's history holds exactly the activity events the model's recorded reports left: one terminal
    event per attempt, one outcome per execution and nothing after it, retries bounded by max_attempts."""
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    by_execution: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        raw = ev.get("payload")
        payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if ev.get("event_type") in ACTIVITY_ATTEMPT_EVENTS:
            by_execution.setdefault(str(payload.get("activity_execution_id")), []).append(ev)
            if payload.get("activity_attempt_id"):
                by_attempt.setdefault(str(payload["activity_attempt_id"]), []).append(ev)
    states = _check_known_attempts(run, by_attempt, now, margin)
    attempts = {a.attempt_id: a for e in run.execs for a in e.attempts}
    for attempt_id, evs in by_attempt.items():
        if len(evs) > 1:
            holder = attempts.get(attempt_id)
            raise Violation(
                holder.fenced[0] if holder is not None and holder.fenced else "HISTORY-ONE-TERMINAL-PER-ATTEMPT",
                f"attempt {attempt_id} has {plural(len(evs), 'terminal event')}",
                expected="at most one",
                received=[(ev.get("sequence"), ev.get("event_type")) for ev in evs],
            )
    if by_attempt:
        states.append("attempt_history_checked")
    known = {e.execution_id: e for e in run.execs if e.execution_id is not None}
    for execution_id, evs in by_execution.items():
        states.extend(_check_execution_events(execution_id, evs, known.get(execution_id)))
    return states


def _check_known_attempts(
    run: ActivityRun, by_attempt: dict[str, list[dict[str, Any]]], now: datetime, margin: float
) -> list[str]:
    """What the model knows each attempt's reports left behind."""
    states = []
    for e in run.execs:
        if not e.certain:
            continue
        for a in e.attempts:
            found = by_attempt.get(a.attempt_id, [])
            check_attempt(a, [str(ev.get("event_type")) for ev in found], now, margin)
            failed = [ev for ev in found if ev.get("event_type") == "ActivityFailed"]
            if failed and a.details is not None:
                payload = failed[0].get("payload") or {}
                if payload.get("details") != a.details:
                    raise Violation(
                        "ACTIVITY-FAILURE-DETAILS-UNCHANGED",
                        f"ActivityFailed of attempt {a.attempt_id} does not carry failure.details unchanged",
                        expected=a.details,
                        received=payload.get("details"),
                    )
                states.append("failure_details_checked")
    return states


def _check_execution_events(execution_id: str, evs: list[dict[str, Any]], ex: Execution | None) -> list[str]:
    """One outcome per execution and nothing after it; retries bounded by the model's max_attempts."""
    states = []
    outcomes = [ev for ev in evs if ev.get("event_type") in ACTIVITY_OUTCOME_EVENTS]
    if len(outcomes) > 1:
        raise Violation(
            "RETRY-ONE-OUTCOME-PER-EXECUTION",
            f"execution {execution_id} has {plural(len(outcomes), 'outcome')}",
            expected="exactly one terminal outcome",
            received=[(ev.get("sequence"), ev.get("event_type")) for ev in outcomes],
        )
    if outcomes:
        last = outcomes[0].get("sequence")
        later = [ev for ev in evs if isinstance(last, int) and (ev.get("sequence") or 0) > last]
        if later:
            raise Violation(
                "RETRY-ONE-OUTCOME-PER-EXECUTION",
                f"execution {execution_id} has attempt events after its outcome "
                f"{outcomes[0].get('event_type')} (an intermediate attempt was recorded as final)",
                expected="nothing after the final outcome",
                received=[(ev.get("sequence"), ev.get("event_type")) for ev in [outcomes[0], *later]],
            )
        states.append("final_outcome_in_history")
    if ex is None:
        return states
    after = [
        (ev.get("payload") or {}).get("retry_after_attempt")
        for ev in evs
        if ev.get("event_type") == "ActivityRetryScheduled"
    ]
    # §11.6 "Retry if … `attempt_number < max_attempts`": each retry follows an attempt below the cap.
    past = [n for n in after if not isinstance(n, int) or n >= ex.policy.max_attempts]
    if len(after) > ex.policy.max_attempts - 1 or past:
        raise Violation(
            exhausted_requirement(ex),
            f"execution {execution_id} was retried {plural(len(after), 'time')} with max_attempts "
            f"{ex.policy.max_attempts}",
            expected=f"at most {plural(ex.policy.max_attempts - 1, 'retry', 'retries')}, each after an attempt "
            "< max_attempts",
            received={"retry_after_attempt": after},
        )
    return states


def check_attempt(a: Attempt, found: list[str], now: datetime, margin: float) -> None:
    """The terminal event history holds for attempt ``a`` (``found``) is one the model allows."""
    e, run = a.execution, a.execution.run
    allowed: set[str | None] = set()
    if a.end in EXPECTED_EVENT:
        allowed.add(EXPECTED_EVENT[a.end])
    if a.end is None or a.end in LAZY_ENDS or a.end == "expired":
        allowed.add(None)
    if a.status is AttemptStatus.RUNNING and not run.open:
        allowed |= {"ActivityCancelled", None}
    near = (
        a.status is AttemptStatus.RUNNING and a.deadline is not None and a.deadline <= now + timedelta(seconds=margin)
    )
    if near or a.maybe_timed_out:
        # The start_to_close fired, or may have fired before the run closed: its event, or none yet.
        allowed |= {"ActivityRetryScheduled" if e.policy.should_retry(a.number) else "ActivityTimedOut", None}
    event = found[0] if found else None
    if event in allowed:
        return
    requirement, message = _unexpected_event(a, event, now)
    raise Violation(requirement, message, expected=sorted(str(x) for x in allowed), received=found)


def _unexpected_event(a: Attempt, event: str | None, now: datetime) -> tuple[str, str]:
    e = a.execution
    if event is None:
        requirement = {"completed": "ACTIVITY-COMPLETE-RECORDED", "retry": "RETRY-BACKOFF-SCHEDULE"}.get(
            a.end or "", "RETRY-ONE-OUTCOME-PER-EXECUTION"
        )
        return requirement, f"attempt {a.number} of {e.activity_type} ended ({a.end}) but history has no event for it"
    if a.end in ("exhausted", "flag", "type") and event == "ActivityRetryScheduled":
        requirement = {
            "exhausted": exhausted_requirement(e),
            "flag": "RETRY-NON-RETRYABLE-FLAG",
            "type": "RETRY-NON-RETRYABLE-TYPE",
        }[a.end]
        policy = "no retry_policy, so" if e.policy_json is None else "retry_policy"
        return requirement, (
            f"attempt {a.number} of {e.activity_type} ({policy} max_attempts {e.policy.max_attempts}, "
            f"non_retryable_error_types {list(e.policy.non_retryable_error_types)}) failed finally ({a.end}) "
            "but was retried"
        )
    if a.end == "retry" and event == "ActivityFailed":
        return "RETRY-ATTEMPT-NUMBERS", (
            f"attempt {a.number} of {e.activity_type} failed retryably with max_attempts "
            f"{e.policy.max_attempts}, but the failure was recorded as final"
        )
    if a.end == "completed":
        return (
            "ACTIVITY-COMPLETE-RECORDED",
            f"the accepted complete of attempt {a.number} of {e.activity_type} left {event}",
        )
    return a.fenced[0] if a.fenced else stale_requirement(a, now), (
        f"attempt {a.number} of {e.activity_type} ({a.status.value}, {a.end or 'no outcome'}) "
        f"has {event} in history although no report of it was accepted"
    )
