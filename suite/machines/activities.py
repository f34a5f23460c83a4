"""The activity machine: retries, lease redelivery, fencing and cancellation of activity attempts.

Each example registers ``WORKERS`` activity workers on one activity queue. A run gets its own workflow queue
and workflow worker: the run is started, its first workflow task is leased and completed with one or two
``schedule_activity`` commands (each with a unique ``activity_type``, so a lease names its execution) carrying
a random retry policy (``max_attempts`` 1..3, ``backoff_seconds`` of 0..1 s, ``non_retryable_error_types``)
and sometimes a short ``start_to_close_timeout``. Rules then poll activity tasks (one worker, or several
released together), heartbeat (owner, wrong owner, unknown attempt id, attempt id of another task), complete
and fail (retryable, non-retryable by flag, by type or by class, always with a ``failure.details`` envelope),
report again as an old attempt, wait out a lease or a start-to-close timeout, cancel or terminate runs, and
probe a run's workflow queue for its resume.

The model keeps, per execution, its attempts (numbers 1, 2, 3, … across retries and redeliveries), which one
holds the task's lease, the retry policy and whether the outcome is final; per run, whether it is closed and
whether a final outcome may have resumed it. For every report it builds an
:class:`~suite.protocol.fencing.ActivityAttemptView` and asks the pure guards (``guard_activity_attempt``,
``guard_activity_report``, ``activity_heartbeat_outcome``) and :class:`~suite.protocol.commands.RetryPolicy`
what the protocol allows *before* it reads the answer. After every step the control-plane history of each
touched run is checked against the model: one terminal event per ``activity_attempt_id``, one outcome per
execution and nothing after it, retries bounded by ``max_attempts``, the event each recorded report must
have left (``ActivityRetryScheduled`` for an intermediate failure, ``ActivityFailed`` only for the final one).

"Resumed only for the final outcome" (§11.6, §14.2) is observed two ways, both black-box:

* describe, around every failure the model says is retried: §9.1 defines ``waiting`` as "no open workflow
  task and an open wait", and creating a workflow task makes the run ``running``; a run that was
  ``waiting`` just before an intermediate failure and ``running`` just after it was given a workflow task by
  that failure (history has no event for a workflow task being created, so it cannot show this);
* the run's own workflow queue (nobody else polls it): a workflow-task poll there leases nothing until a final
  outcome, and leases the resume after one.

Time: the model knows every lease expiry and start-to-close deadline (server time). Within ``MARGIN`` seconds
of one, both sides are accepted, and the answer tells the model which side the server was on. The model
learns that a deadline passed only from an answer (a stale report, a retry leased), never from the clock
alone: preconditions then depend on the step program and the answers, not on how long steps took, so
Hypothesis replays an example the same way when it shrinks it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

from suite.client import Reply
from suite.outcomes import CheckFailure
from suite.protocol.commands import DEFAULT_RETRY_POLICY, RetryPolicy, validate_retry_policy
from suite.protocol.errors import Rejection
from suite.protocol.fencing import (
    ActivityAttemptView,
    HeartbeatDecision,
    activity_heartbeat_outcome,
    guard_activity_attempt,
    guard_activity_report,
    parse_rfc3339,
)
from suite.protocol.history import check_sequences
from suite.protocol.lifecycles import AttemptEvent, AttemptStatus, ExecutionStatus, RunStatus, TaskStatus

from .base import MachineBase, note, race

__all__ = ["ActivityMachine"]

MARGIN = 1.0  # seconds around a lease expiry or a deadline where either outcome is correct
BACKOFF_TOLERANCE = 0.5  # scheduling and network jitter when judging "not leasable before the backoff"
WORKERS = 4
MAX_RUNS = 5  # per example: at most 10 activities, so live leases stay below an admission limit of 16
MAX_LEASE_WAITS = 1  # lease expiries waited out per example (each holds one activity lease, 3 s embedded)
MAX_TIMEOUT_WAITS = 1  # start_to_close deadlines waited out per example
MAX_EMPTY_PROBES = 2  # workflow-task polls per example that may hold a full second
MAX_RACES = 2  # races per example: each one with more pollers than ready tasks holds a second
MAX_CLOSES = 1  # run cancels/terminates per example: a closed run's activities can only be fenced after it
SPENT_REPORTS = 2  # reports on an ended execution before draws on it are steered to live work
START_TO_CLOSE = 2  # seconds: the "short timeout"; used only when it ends before the lease does
ACTIVITY_TYPE = "conformance.act"
NON_RETRYABLE = ("conformance.FatalError", "conformance.BadInput")
RETRYABLE_TYPE = "conformance.TransientError"

OUTCOME_EVENTS = frozenset({"ActivityCompleted", "ActivityFailed", "ActivityTimedOut", "ActivityCancelled"})
# An attempt ends with one of these; ActivityRetryScheduled records the failure of an intermediate attempt.
ATTEMPT_EVENTS = OUTCOME_EVENTS | {"ActivityRetryScheduled"}

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

POLICY = st.fixed_dictionaries(
    {
        "max_attempts": st.sampled_from([3, 2, 3, 2, 1]),
        "backoff_seconds": st.lists(st.sampled_from([1, 0]), min_size=1, max_size=2),
        "non_retryable_error_types": st.lists(st.sampled_from(NON_RETRYABLE), min_size=1, max_size=2, unique=True),
    }
)
# Three in four activities carry a policy (retries and non-retryable failures need one); §11.6: no policy
# means max_attempts = 1.
POLICY_OR_NONE = st.one_of(POLICY, POLICY, POLICY, st.none())
ACTIVITIES = st.lists(st.tuples(POLICY_OR_NONE, st.sampled_from([False, False, True])), min_size=1, max_size=2)


# -- the model -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class RunM:
    workflow_id: str
    run_id: str
    queue: str  # this run's own workflow queue: only its workflow tasks appear there
    worker: str
    status: RunStatus = RunStatus.WAITING
    closed_reason: str | None = None
    uncertain: bool = False
    resumed: bool = False  # a final activity outcome was recorded: a workflow task may (must) exist
    resume_leased: bool = False
    spent: int = 0  # reports made on its activities after it closed
    execs: list[ExecM] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)

    def __repr__(self) -> str:
        return f"RunM({self.workflow_id!r})"


@dataclass(eq=False)
class ExecM:
    """One logical activity (one ``activity_execution_id``)."""

    activity_type: str
    run: RunM
    policy_json: dict[str, Any] | None
    policy: RetryPolicy
    start_to_close: int | None
    execution_id: str | None = None
    status: ExecutionStatus = ExecutionStatus.PENDING
    attempts: list[AttemptM] = field(default_factory=list)
    current_task: str | None = None  # the execution's newest task; a sentinel while a retry is unleased
    task_status: dict[str, TaskStatus] = field(default_factory=dict)
    not_before: datetime | None = None  # a retry must not be leased before this (its backoff)
    backoff: int = 0
    final: str | None = None  # why no attempt may follow: completed/exhausted/flag/type/timeout/cancelled
    snapshot_max: int | None = None  # max_attempts of the lease's retry_policy snapshot (§11.1)
    uncertain: bool = False
    spent: int = 0  # reports made after it ended or its run closed

    @property
    def current(self) -> AttemptM | None:
        return self.attempts[-1] if self.attempts else None

    def holder(self, task_id: str) -> AttemptM | None:
        """The newest attempt of ``task_id``: the one its lease belongs to while it is leased."""
        return next((a for a in reversed(self.attempts) if a.task_id == task_id), None)

    @property
    def certain(self) -> bool:
        return not (self.uncertain or self.run.uncertain)

    def __repr__(self) -> str:  # shown in Hypothesis' step listing
        return f"ExecM({self.activity_type!r})"


@dataclass(eq=False)
class AttemptM:
    """One lease of an activity task (one ``activity_attempt_id``)."""

    execution: ExecM
    attempt_id: str
    task_id: str
    number: int
    owner: str
    expires: datetime
    deadline: datetime | None  # start_to_close
    status: AttemptStatus = AttemptStatus.RUNNING
    end: str | None = None  # how it ended: an EXPECTED_EVENT key, or "expired" (lease lost, redelivered)
    redelivered: bool = False
    details: dict[str, str] | None = None  # the failure.details envelope of its recorded failure
    fenced: list[str] = field(default_factory=list)  # requirements a trace of its refused reports would break
    maybe_timed_out: bool = False  # its run closed within MARGIN of its start_to_close: either may have won

    def __repr__(self) -> str:
        return f"AttemptM({self.execution.activity_type!r}#{self.number})"


@dataclass(frozen=True)
class Branch:
    """What the model allows at one moment of the margin window around a call."""

    out: str  # "ok", "stop:<reason>" (heartbeat 200 that cannot continue) or a rejection reason
    owned: bool  # the §11.2 ownership guard passed
    timed_out: bool  # the named execution's start_to_close had fired at this moment
    decision: HeartbeatDecision | None = None
    rejection: Rejection | None = None


class ActivityMachine(MachineBase):
    name = "activities"
    # requirement -> the ledger state a run must reach before the machine may call it passed
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "RETRY-ATTEMPT-NUMBERS": "retry_leased",
        "RETRY-ATTEMPTS-CONTIGUOUS": "retry_leased",
        "RETRY-EXECUTION-ID-STABLE": "retry_leased",
        "RETRY-ATTEMPT-ID-DISTINCT": "retry_leased",
        "ACTIVITY-RETRY-BACKOFF": "retry_leased_after_backoff",
        "RETRY-FAILED-ATTEMPTS-BOUNDED": "retries_exhausted",
        "RETRY-DEFAULT-NONE": "default_policy_final",
        "RETRY-NON-RETRYABLE-FLAG": "non_retryable_flag",
        "RETRY-NON-RETRYABLE-TYPE": "non_retryable_type",
        "RETRY-RESUME-ONLY-FINAL": "retry_kept_run_waiting",
        "RETRY-ONE-OUTCOME-PER-EXECUTION": "final_outcome_in_history",
        "ACTIVITY-COMPLETE-RECORDED": "activity_completed",
        "ACTIVITY-DUPLICATE-COMPLETE-STALE": "duplicate_complete_stale",
        "ACTIVITY-FAILURE-DETAILS-UNCHANGED": "failure_details_checked",
        "ACTIVITY-FENCE-OWNER": "fenced_owner",
        "ACTIVITY-ATTEMPT-NOT-FOUND": "attempt_not_found",
        "ACTIVITY-TASK-MISMATCH": "task_mismatch",
        "ACTIVITY-HEARTBEAT-RENEWS": "heartbeat_renewed",
        "ACTIVITY-HEARTBEAT-STOP-200": "heartbeat_stopped",
        "ACTIVITY-REDELIVERY-NEW-ATTEMPT": "stale_report_after_redelivery",
        "TIMEOUT-LATE-COMPLETE-STALE": "late_complete_after_timeout",
        "CANCEL-ACTIVITY-HEARTBEAT": "cancel_heartbeat",
        "CANCEL-ACTIVITY-OUTCOME-IGNORED": "outcome_ignored",
        "HISTORY-ONE-TERMINAL-PER-ATTEMPT": "attempt_history_checked",
        "DISPATCH-ONE-LEASE-PER-DELIVERY": "duplicate_claim_raced",
    }

    execs = Bundle("execs")

    def __init__(self) -> None:
        super().__init__()
        self.queue = self.ctx.uid("aq")
        self.workers: list[str] = []
        self.runs: list[RunM] = []
        self.exec_by_type: dict[str, ExecM] = {}
        self.touched: set[str] = set()
        self.seen_attempt_ids: set[str] = set()
        self.lease_waits = 0
        self.timeout_waits = 0
        self.empty_probes = 0
        self.scheduled = 0
        self.closes = 0
        self.races = 0
        profile = self.target.test_profile if self.target else {}
        lease = profile.get("activity_task_lease_seconds")
        self.lease_seconds: float | None = float(lease) if isinstance(lease, int | float) else None
        self.max_wait = self.target.max_wait if self.target else 30.0
        # A start_to_close shorter than the lease always fires first (both run from the same claim), so the
        # model never has to guess which of the two ended an attempt.
        self.short_timeouts = (
            self.lease_seconds is not None
            and self.lease_seconds > START_TO_CLOSE
            and self.max_wait >= START_TO_CLOSE + MARGIN
        )
        self.lease_wait_fits = self.lease_seconds is not None and self.lease_seconds + MARGIN <= self.max_wait

    # -- clock and model helpers ---------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(UTC)

    def all_execs(self) -> list[ExecM]:
        return [e for r in self.runs for e in r.execs]

    def claimable(self, e: ExecM, at: datetime, *, expired: bool = True) -> bool:
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

    def ready_work(self) -> int:
        """Executions with a ready task (fresh or a retry): the poll rules' precondition."""
        at = self.now()
        return sum(1 for e in self.all_execs() if self.claimable(e, at, expired=False))

    def timed_out(self, a: AttemptM, moment: datetime) -> bool:
        """§11.7: the attempt's start_to_close has fired by ``moment`` (a closed run's attempt is cancelled
        instead, which every guard answers before looking at the attempt)."""
        return (
            a.status is AttemptStatus.RUNNING
            and a.deadline is not None
            and a.deadline <= moment
            and a.execution.run.open
        )

    def apply_timeout(self, a: AttemptM) -> None:
        """§11.7: "On expiry the upstream enforcer retries, subject to attempts left and backoff … When no
        retry remains it records a terminal `ActivityTimedOut` … and wakes the workflow"."""
        e = a.execution
        assert a.deadline is not None
        a.status = AttemptStatus.EXPIRED
        e.task_status[a.task_id] = TaskStatus.FAILED
        if e.policy.should_retry(a.number):
            a.end = "timeout_retry"
            e.status = ExecutionStatus.PENDING
            e.current_task = f"retry-after-{a.number}"
            e.backoff = e.policy.backoff_before(a.number + 1)
            e.not_before = a.deadline + timedelta(seconds=e.backoff)
        else:
            a.end = "timeout_final"
            e.status = ExecutionStatus.TIMED_OUT
            e.final = "timeout"
            e.run.resumed = True
        self.touched.add(e.run.run_id)

    def cancel_execution(self, e: ExecM) -> None:
        """§11.5: the run was closed; its still-running attempt, open tasks and the execution are cancelled."""
        for a in e.attempts:
            if a.status is AttemptStatus.RUNNING:
                a.status, a.end = AttemptStatus.CANCELLED, "cancelled"
        for task_id, status in e.task_status.items():
            if status in (TaskStatus.READY, TaskStatus.LEASED):
                e.task_status[task_id] = TaskStatus.CANCELLED
        if e.final is None:
            e.status, e.final = ExecutionStatus.CANCELLED, "cancelled"

    def view(self, a: AttemptM, moment: datetime) -> tuple[ActivityAttemptView, bool]:
        """The §11.2-§11.5 view of attempt ``a`` at ``moment``, and whether a start_to_close fired by then."""
        e, run = a.execution, a.execution.run
        attempt_status = a.status
        task_status = e.task_status.get(a.task_id, TaskStatus.LEASED)
        exec_status, exec_task = e.status, e.current_task
        cur = e.current
        fired = cur is not None and self.timed_out(cur, moment)
        if fired and cur is not None:
            if cur is a:
                attempt_status = AttemptStatus.EXPIRED
            if cur.task_id == a.task_id:
                task_status = TaskStatus.FAILED
            if e.policy.should_retry(cur.number):
                exec_status, exec_task = ExecutionStatus.PENDING, f"retry-after-{cur.number}"
            else:
                exec_status = ExecutionStatus.TIMED_OUT
        holder = e.holder(a.task_id) if task_status is TaskStatus.LEASED else None
        view = ActivityAttemptView(
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
        return view, fired

    def branches(
        self, named: AttemptM | None, verb: str, *, task_id: str, attempt_id: str, owner: str, at: datetime
    ) -> list[Branch]:
        """The outcomes the protocol allows for one report, at both ends of the margin window."""
        out: list[Branch] = []
        for moment in (at - timedelta(seconds=MARGIN), at + timedelta(seconds=MARGIN)):
            view, fired = (None, False) if named is None else self.view(named, moment)
            try:
                checked = guard_activity_attempt(
                    view, task_exists=True, task_id=task_id, activity_attempt_id=attempt_id, lease_owner=owner
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

    def outcome(self, reply: Reply, verb: str) -> str:
        body = reply.json()
        if verb == "heartbeat" and reply.status == 200:
            return "ok" if body.get("can_continue") is True else f"stop:{body.get('reason')}"
        return "ok" if reply.status == 200 else (reply.reason or f"http_{reply.status}")

    def stale_requirement(self, a: AttemptM | None) -> str:
        """The requirement a recorded report of a no-longer-live attempt breaks, by why it is not live."""
        if a is None:
            return "ACTIVITY-ATTEMPT-NOT-FOUND"
        if a.redelivered:
            return "ACTIVITY-REDELIVERY-NEW-ATTEMPT"
        if a.end in ("timeout_retry", "timeout_final") or (a.deadline is not None and a.deadline <= self.now()):
            return "TIMEOUT-LATE-COMPLETE-STALE"
        if a.status in (AttemptStatus.COMPLETED, AttemptStatus.FAILED):
            return "ACTIVITY-DUPLICATE-COMPLETE-STALE"
        if a.status is AttemptStatus.CANCELLED:
            return "CANCEL-ACTIVITY-OUTCOME-IGNORED"
        if a.expires <= self.now():
            return "ACTIVITY-REDELIVERY-NEW-ATTEMPT"  # "An activity lease expiry closes the attempt"
        return "HISTORY-ONE-TERMINAL-PER-ATTEMPT"

    def requirement_for(self, allowed: set[str], got: str, verb: str, named: AttemptM | None) -> str:
        for expected in sorted(allowed):
            if expected in REJECTION_REQUIREMENT:
                return REJECTION_REQUIREMENT[expected]
        stops = {x for x in allowed if x.startswith("stop:")}
        if verb == "heartbeat" and stops and not (got == "ok" or got.startswith("stop:")):
            return "ACTIVITY-HEARTBEAT-STOP-200"  # "still HTTP 200 (only attempt_not_found gives 404)"
        if allowed - {"ok"}:
            return self.stale_requirement(named)
        return "ACTIVITY-HEARTBEAT-RENEWS" if verb == "heartbeat" else "FENCE-NO-STATE-CHANGE"

    def run_status(self, run: RunM) -> str | None:
        reply = self.call(self.client.control("GET", f"/workflows/{run.workflow_id}"))
        if reply is None or reply.status != 200:
            return None
        status = reply.json().get("status")
        return status if isinstance(status, str) else None

    def final_timeout_pending(self, run: RunM) -> bool:
        """A start_to_close of this run may fire within the window: a workflow task may appear legitimately."""
        soon = self.now() + timedelta(seconds=2 * MARGIN + 1)
        return any(
            (a := e.current) is not None
            and a.status is AttemptStatus.RUNNING
            and a.deadline is not None
            and a.deadline <= soon
            for e in run.execs
        )

    # -- polling -------------------------------------------------------------------------------------------

    async def _poll(self, worker: str, timeout: int) -> Reply:
        body = {"worker_id": worker, "task_queue": self.queue, "timeout_seconds": timeout}
        return await self.client.worker("/activity-tasks/poll", body, timeout=timeout + 15)

    def poll_once(self, worker: str, timeout: int = 1) -> tuple[Reply | None, datetime, datetime]:
        sent = self.now()
        reply = self.call(self._poll(worker, timeout))
        if reply is None or reply.resent:
            self.lost_poll()
        return reply, sent, self.now()

    def lost_poll(self) -> None:
        """A poll without an answer may have leased any claimable task: those executions become uncertain."""
        at = self.now() + timedelta(seconds=MARGIN)
        for e in self.all_execs():
            if self.claimable(e, at) or e.status is ExecutionStatus.PENDING:
                e.uncertain = True

    def check_poll_shape(self, reply: Reply) -> dict[str, Any]:
        body = reply.json()
        if reply.status != 200:
            raise self.violation(
                "POLL-STATUS-PRESENT",
                "an activity poll of a registered worker answers 200",
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

    @staticmethod
    def exhausted_requirement(e: ExecM) -> str:
        """Retried past max_attempts: the bound is broken (§11.6 "Retry if … `attempt_number < max_attempts`"),
        unless the activity had no policy and the server's own snapshot (§11.1 ``retry_policy``) shows it applied
        a default other than 1 (§11.6 "Default when no `retry_policy` is given | **`max_attempts = 1`**")."""
        if e.policy_json is None and e.snapshot_max not in (None, 1):
            return "RETRY-DEFAULT-NONE"
        return "RETRY-FAILED-ATTEMPTS-BOUNDED"

    def final_requirement(self, e: ExecM) -> str:
        if e.final in ("exhausted", "timeout"):
            return self.exhausted_requirement(e)
        return {
            "flag": "RETRY-NON-RETRYABLE-FLAG",
            "type": "RETRY-NON-RETRYABLE-TYPE",
            "completed": "RETRY-ONE-OUTCOME-PER-EXECUTION",
            "cancelled": "CANCEL-NO-NEW-LEASES",
        }.get(e.final or "", "RETRY-ONE-OUTCOME-PER-EXECUTION")

    def adopt(
        self, body: dict[str, Any], worker: str, sent: datetime, received: datetime, reply: Reply
    ) -> AttemptM | None:
        """Judge a granted activity lease against the model, then record it. The grant happened between
        ``sent`` and ``received`` (client clock)."""
        sent = self.sent_of(reply, sent)
        task = body.get("task")
        if not isinstance(task, dict):
            return None
        e = self.exec_by_type.get(str(task.get("activity_type")))
        if e is None:
            raise self.violation(
                "ACTIVITY-SCHEDULED-LEASABLE",
                "leased an activity this example never scheduled on its private queue",
                expected=sorted(self.exec_by_type),
                received=task.get("activity_type"),
                replies=[reply],
            )
        if task.get("lease_owner") != worker:
            raise self.violation(
                "LEASE-OWNER-IS-POLLER",
                "lease_owner is the poller",
                expected=worker,
                received=task.get("lease_owner"),
                replies=[reply],
            )
        task_id, attempt_id = str(task.get("task_id")), str(task.get("activity_attempt_id"))
        number = task.get("attempt_number")
        execution_id = task.get("activity_execution_id")
        raw_deadlines = task.get("deadlines")
        deadlines: dict[str, Any] = raw_deadlines if isinstance(raw_deadlines, dict) else {}
        try:
            expires = parse_rfc3339(task.get("lease_expires_at"))
            deadline = parse_rfc3339(deadlines["start_to_close"]) if deadlines.get("start_to_close") else None
        except (ValueError, KeyError) as exc:
            raise self.violation(
                "ACTIVITY-SCHEDULED-LEASABLE",
                f"an activity lease with an unreadable lease_expires_at or deadline: {exc}",
                expected="RFC 3339 timestamps",
                received={"lease_expires_at": task.get("lease_expires_at"), "deadlines": deadlines},
                replies=[reply],
            ) from None
        run = e.run
        cur = e.current
        redelivery = cur is not None and cur.task_id == task_id
        late = received + timedelta(seconds=MARGIN)
        if e.certain:
            self.judge_identity(e, cur, redelivery, task_id, attempt_id, number, execution_id, reply)
        if redelivery and cur is not None:
            if e.certain:
                self.judge_redelivery(e, cur, late, task_id, number, received, reply)
            cur.status, cur.end, cur.redelivered = AttemptStatus.EXPIRED, "expired", True
            self.reached("lease_expired_redelivered")
        elif cur is not None and e.certain:
            self.judge_retry(e, cur, late, task_id, number, received, reply)
        attempt = AttemptM(
            execution=e,
            attempt_id=attempt_id,
            task_id=task_id,
            number=number if isinstance(number, int) else (cur.number + 1 if cur else 1),
            owner=worker,
            expires=expires,
            deadline=deadline,
        )
        e.attempts.append(attempt)
        e.task_status[task_id] = TaskStatus.LEASED
        e.current_task = task_id
        e.status = ExecutionStatus.RUNNING
        e.not_before = None
        e.execution_id = str(execution_id)
        snapshot = task.get("retry_policy")
        if isinstance(snapshot, dict) and isinstance(snapshot.get("max_attempts"), int):
            e.snapshot_max = snapshot["max_attempts"]
        self.seen_attempt_ids.add(attempt_id)
        self.touched.add(run.run_id)
        self.reached("activity_leased")
        return attempt

    def judge_identity(
        self,
        e: ExecM,
        cur: AttemptM | None,
        redelivery: bool,
        task_id: str,
        attempt_id: str,
        number: Any,
        execution_id: Any,
        reply: Reply,
    ) -> None:
        """Whatever the lease is, it must belong to a live execution and continue its numbering."""
        run = e.run
        if not run.open:
            raise self.violation(
                "CANCEL-NO-NEW-LEASES",
                f"an activity of a {run.status.value} run was leased",
                expected="no lease",
                received=task_id,
                replies=[reply],
            )
        if e.final is not None:
            raise self.violation(
                self.final_requirement(e),
                f"execution {e.activity_type} ended ({e.final}, max_attempts {e.policy.max_attempts}) "
                f"but attempt {number} was leased",
                expected="no further attempt",
                received={"task_id": task_id, "attempt_number": number},
                replies=[reply],
            )
        if e.execution_id is not None and execution_id != e.execution_id:
            raise self.violation(
                "RETRY-EXECUTION-ID-STABLE",
                "activity_execution_id changed between attempts",
                expected=e.execution_id,
                received=execution_id,
                replies=[reply],
            )
        if attempt_id in self.seen_attempt_ids:
            raise self.violation(
                "ACTIVITY-REDELIVERY-NEW-ATTEMPT" if redelivery else "RETRY-ATTEMPT-ID-DISTINCT",
                "an activity_attempt_id was leased twice: every lease is a new attempt",
                expected="a new activity_attempt_id",
                received=attempt_id,
                replies=[reply],
            )
        want = cur.number + 1 if cur is not None else 1
        if number != want:
            raise self.violation(
                "ACTIVITY-REDELIVERY-NEW-ATTEMPT" if redelivery else "RETRY-ATTEMPTS-CONTIGUOUS",
                f"attempt numbers of {e.activity_type} must run 1, 2, 3, … without gaps or repeats",
                expected=want,
                received=number,
                replies=[reply],
            )

    def judge_redelivery(
        self, e: ExecM, cur: AttemptM, late: datetime, task_id: str, number: Any, received: datetime, reply: Reply
    ) -> None:
        """The same task again: legal only once the current attempt's lease has expired (§9)."""
        if cur.end in ("retry", "timeout_retry"):
            raise self.violation(
                "RETRY-BACKOFF-SCHEDULE",
                f"the retry of {e.activity_type} reused task {task_id}: a retry is a new task (§11.1, §11.6)",
                expected="a new task_id",
                received=task_id,
                replies=[reply],
            )
        if cur.deadline is not None and cur.end is None:
            # A start_to_close shorter than the lease fires first and makes a retry (a new task_id); a
            # redelivery of the same task means the server ordered them the other way. Not judged here.
            note(f"{e.activity_type}: task redelivered although its start_to_close ended it first")
            e.uncertain = True
            return
        if cur.end is not None or cur.expires > late:
            raise self.violation(
                "DISPATCH-ONE-LEASE-PER-DELIVERY",
                f"task {task_id} was leased again while attempt {cur.number} "
                + (f"had ended ({cur.end})" if cur.end else "still held a live lease"),
                expected=f"no lease before {cur.expires.isoformat()}",
                received={"attempt_number": number, "received_at": received.isoformat()},
                replies=[reply],
            )

    def judge_retry(
        self, e: ExecM, cur: AttemptM, late: datetime, task_id: str, number: Any, received: datetime, reply: Reply
    ) -> None:
        """A new task of an execution that had attempts: legal only as a retry after a failure or a
        start_to_close (§11.6 "A new **ready** activity task (new `task_id`)"), after its backoff."""
        if cur.status is AttemptStatus.RUNNING:
            timed_out = cur.deadline is not None and cur.deadline <= late
            if timed_out and e.policy.should_retry(cur.number):
                self.apply_timeout(cur)
            elif timed_out:
                raise self.violation(
                    self.exhausted_requirement(e),
                    f"{e.activity_type} attempt {cur.number} of {e.policy.max_attempts} timed out with no attempt "
                    "left, yet another attempt was leased",
                    expected="ActivityTimedOut and no further attempt",
                    received={"task_id": task_id, "attempt_number": number},
                    replies=[reply],
                )
            elif cur.expires <= late:
                raise self.violation(
                    "ACTIVITY-REDELIVERY-NEW-ATTEMPT",
                    f"the expired lease of {e.activity_type} came back as a new task: a redelivery keeps the task_id",
                    expected=cur.task_id,
                    received=task_id,
                    replies=[reply],
                )
            else:
                raise self.violation(
                    "DISPATCH-ONE-LEASE-PER-DELIVERY",
                    f"a second task of {e.activity_type} was leased while attempt {cur.number} is live",
                    expected="one live task per execution",
                    received={"task_id": task_id, "attempt_number": number},
                    replies=[reply],
                )
        elif e.status is not ExecutionStatus.PENDING:
            raise self.violation(
                "DISPATCH-ONE-LEASE-PER-DELIVERY",
                f"a new task of {e.activity_type} was leased although no retry was scheduled",
                expected=f"a redelivery of {cur.task_id} or nothing",
                received={"task_id": task_id, "attempt_number": number},
                replies=[reply],
            )
        if e.not_before is not None and e.backoff > 0:
            if received < e.not_before - timedelta(seconds=BACKOFF_TOLERANCE):
                raise self.violation(
                    "ACTIVITY-RETRY-BACKOFF",
                    f"the retry of {e.activity_type} was leased before its {e.backoff}s backoff passed",
                    expected=f"not before {e.not_before.isoformat()}",
                    received=f"leased by {received.isoformat()}",
                    replies=[reply],
                )
            self.reached("retry_leased_after_backoff")
        self.reached("retry_leased")
        if isinstance(number, int) and number >= 3:
            self.reached("third_attempt_leased")

    # -- reports -------------------------------------------------------------------------------------------

    def actor(self, a: AttemptM, who: str) -> tuple[str, str, str, AttemptM | None]:
        """(task_id in the URL, activity_attempt_id, lease_owner, the attempt that id names)."""
        if who == "other":
            return a.task_id, a.attempt_id, next(w for w in self.workers if w != a.owner), a
        if who == "other_task":
            other = next((b for e in self.all_execs() for b in reversed(e.attempts) if b.task_id != a.task_id), None)
            if other is not None:
                return a.task_id, other.attempt_id, other.owner, other
            who = "unknown_attempt"
        if who == "unknown_attempt":
            return a.task_id, f"01CONFORMANCEUNKNOWN{secrets.token_hex(3).upper()}", a.owner, None
        return a.task_id, a.attempt_id, a.owner, a

    def failure_for(self, e: ExecM, kind: str, detail: int) -> tuple[dict[str, Any], str | None, str | None, bool]:
        listed = e.policy.non_retryable_error_types
        failure: dict[str, Any] = {
            "message": f"conformance failure ({kind})",
            "details": self.ctx.envelope({"detail": detail, "kind": kind}),
        }
        ftype: str | None = None
        fclass: str | None = None
        flag = kind == "flag"
        if flag:
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
        return failure, ftype, fclass, flag

    def report(
        self, a: AttemptM, who: str, verb: str, *, kind: str = "retryable", detail: int = 0
    ) -> tuple[str, Reply] | None:
        """One complete, fail or heartbeat, judged by the model; the model follows the answer."""
        e = a.execution
        if not e.run.open:
            e.run.spent += 1
        elif e.final is not None:
            e.spent += 1
        task_id, attempt_id, owner, named = self.actor(a, who)
        body: dict[str, Any] = {"activity_attempt_id": attempt_id, "lease_owner": owner}
        label = ""
        ftype: str | None = None
        fclass: str | None = None
        flag = False
        if verb == "complete":
            body["result"] = self.ctx.envelope({"activity": e.activity_type, "attempt": a.number})
        elif verb == "fail":
            body["failure"], ftype, fclass, flag = self.failure_for(e, kind, detail)
            if e.policy.should_retry(a.number, ftype, fclass, flag):
                label = "retry"
            elif a.number >= e.policy.max_attempts:
                label = "exhausted"
            else:
                label = "flag" if flag else "type"
        else:
            body.update({"message": "conformance", "current": a.number, "total": 3})
        at = self.now()
        branches = self.branches(named, verb, task_id=task_id, attempt_id=attempt_id, owner=owner, at=at)
        allowed = {b.out for b in branches}
        target = named.execution if named is not None else e
        certain = e.certain and target.certain
        check_resume = (
            verb == "fail"
            and label == "retry"
            and "ok" in allowed
            and target is e
            and e.certain
            and e.run.open
            and not e.run.resumed
            and not self.final_timeout_pending(e.run)
        )
        before = self.run_status(e.run) if check_resume else None
        was = a.status
        reply = self.call(self.client.worker(f"/activity-tasks/{task_id}/{verb}", body))
        if reply is None:
            target.uncertain = True
            return None
        got = self.outcome(reply, verb)
        if not certain:
            return got, reply
        if got not in allowed:
            expected = sorted(allowed)
            raise self.violation(
                self.requirement_for(allowed, got, verb, named),
                f"activity {verb} ({who}) of {a!r}: the model allows {expected}",
                expected=" or ".join(expected),
                received=f"{reply.status} {got}",
                replies=[reply],
            )
        matched = [b for b in branches if b.out == got]
        self.check_body(reply, verb, got, matched, named)
        self.touched.add(target.run.run_id)
        self.follow(matched, verb, got, reply, named, label=label, sent=at, details=body.get("failure"))
        self.mark(verb, got, who, named, was)
        if check_resume and got == "ok" and before == "waiting":
            after = self.run_status(e.run)
            if after == "running":
                raise self.violation(
                    "RETRY-RESUME-ONLY-FINAL",
                    f"an intermediate failure of {e.activity_type} (attempt {a.number} of "
                    f"{e.policy.max_attempts}) gave run {e.run.run_id} a workflow task: it went from waiting "
                    "to running (§9.1: waiting means no open workflow task)",
                    expected="waiting (no workflow task until the final outcome)",
                    received=after,
                    replies=[reply],
                )
            if after == "waiting":
                self.reached("retry_kept_run_waiting")
        return got, reply

    def check_body(self, reply: Reply, verb: str, got: str, matched: list[Branch], named: AttemptM | None) -> None:
        body = reply.json()
        if verb == "heartbeat" and reply.status == 200:
            decision = next((b.decision for b in matched if b.decision is not None), None)
            if decision is None:
                return
            want: dict[str, Any] = {
                "can_continue": decision.can_continue,
                "cancel_requested": decision.cancel_requested,
            }
            if not decision.can_continue:
                want["heartbeat_recorded"] = False
            if decision.cancel_requested and named is not None:
                want["run_closed_reason"] = named.execution.run.closed_reason
            wrong = {k: body.get(k) for k, v in want.items() if body.get(k) != v}
            if decision.cancel_requested and body.get("run_closed_at") is None:
                wrong["run_closed_at"] = None
            if wrong:
                cancel = got in ("stop:run_cancelled", "stop:run_terminated")
                raise self.violation(
                    "CANCEL-ACTIVITY-HEARTBEAT" if cancel else "ACTIVITY-HEARTBEAT-STOP-200",
                    f"heartbeat body ({got})",
                    expected={**want, **({"run_closed_at": "non-null"} if decision.cancel_requested else {})},
                    received=wrong,
                    replies=[reply],
                )
            if decision.can_continue and named is not None:
                try:
                    new = parse_rfc3339(body.get("lease_expires_at"))
                except ValueError:
                    new = None
                if new is None or new < named.expires:
                    raise self.violation(
                        "ACTIVITY-HEARTBEAT-RENEWS",
                        "a live heartbeat extends the lease",
                        expected=f"lease_expires_at >= {named.expires.isoformat()}",
                        received=body.get("lease_expires_at"),
                        replies=[reply],
                    )
            return
        if verb == "heartbeat":
            return
        if got == "ok":
            want_outcome = "completed" if verb == "complete" else "failed"
            if body.get("recorded") is not True or body.get("outcome") != want_outcome:
                raise self.violation(
                    "ACTIVITY-COMPLETE-RECORDED",
                    f"an accepted activity {verb} is recorded",
                    expected={"recorded": True, "outcome": want_outcome},
                    received={k: body.get(k) for k in ("recorded", "outcome")},
                    replies=[reply],
                )
        elif got in ("run_cancelled", "run_terminated", "run_closed"):
            want = {"outcome": "ignored", "recorded": False, "can_continue": False}
            if got != "run_closed":
                want["cancel_requested"] = True
            wrong = {k: body.get(k) for k, v in want.items() if body.get(k) != v}
            if wrong:
                raise self.violation(
                    "CANCEL-ACTIVITY-OUTCOME-IGNORED",
                    f"activity {verb} after the run closed is ignored",
                    expected=want,
                    received=wrong,
                    replies=[reply],
                )
        elif got == "stale_attempt" and body.get("recorded") is not False:
            raise self.violation(
                self.stale_requirement(named),
                f"a stale activity {verb} says recorded:false",
                expected={"recorded": False},
                received={"recorded": body.get("recorded")},
                replies=[reply],
            )

    def follow(
        self,
        matched: list[Branch],
        verb: str,
        got: str,
        reply: Reply,
        named: AttemptM | None,
        *,
        label: str,
        sent: datetime,
        details: Any,
    ) -> None:
        """Move the model the way the answer says the server moved."""
        if named is None or not matched or not all(b.owned for b in matched):
            return
        e = named.execution
        cur = e.current
        if all(b.timed_out for b in matched) and cur is not None and cur.status is AttemptStatus.RUNNING:
            self.apply_timeout(cur)
        if verb == "heartbeat":
            decision = matched[0].decision
            if decision is None:
                return
            if got == "ok":
                named.expires = parse_rfc3339(reply.json().get("lease_expires_at"))
            elif all(b.decision is not None and b.decision.closes_attempt is AttemptEvent.CANCEL for b in matched):
                self.cancel_execution(e)
            elif named.status is AttemptStatus.RUNNING and all(
                b.decision is not None and b.decision.closes_attempt is AttemptEvent.EXPIRE for b in matched
            ):
                named.status = AttemptStatus.EXPIRED
            return
        if got in ("run_cancelled", "run_terminated", "run_closed"):
            self.cancel_execution(e)  # §11.5: the refused report closes what was still open as cancelled
            return
        if got != "ok":
            return
        e.task_status[named.task_id] = TaskStatus.COMPLETED
        if verb == "complete":
            named.status, named.end = AttemptStatus.COMPLETED, "completed"
            e.status, e.final = ExecutionStatus.COMPLETED, "completed"
            e.run.resumed = True
            return
        named.status, named.end = AttemptStatus.FAILED, label
        named.details = details.get("details") if isinstance(details, dict) else None
        if label == "retry":
            e.status = ExecutionStatus.PENDING
            e.current_task = f"retry-after-{named.number}"
            e.backoff = e.policy.backoff_before(named.number + 1)
            e.not_before = sent + timedelta(seconds=e.backoff)
        else:
            e.status, e.final = ExecutionStatus.FAILED, label
            e.run.resumed = True

    def mark(self, verb: str, got: str, who: str, named: AttemptM | None, was: AttemptStatus) -> None:
        """Coverage ledger, and what a trace of a refused report would break."""
        if got in ("lease_owner_mismatch", "attempt_not_found", "task_mismatch"):
            self.reached("fenced_owner" if got == "lease_owner_mismatch" else got)
        if verb == "heartbeat":
            if got == "ok":
                self.reached("heartbeat_renewed")
            elif got.startswith("stop:"):
                self.reached("heartbeat_stopped")
                if got in ("stop:run_cancelled", "stop:run_terminated"):
                    self.reached("cancel_heartbeat")
            return
        if named is None:
            return
        if got != "ok" and got not in OWNERSHIP_REASONS:
            named.fenced.append(REJECTION_REQUIREMENT.get(got) or self.stale_requirement(named))
        elif got == "lease_owner_mismatch":
            named.fenced.append("ACTIVITY-FENCE-OWNER")
        if got in ("run_cancelled", "run_terminated"):
            self.reached("outcome_ignored")
        if got == "stale_attempt":
            if verb == "complete" and was is AttemptStatus.COMPLETED:
                self.reached("duplicate_complete_stale")
            if named.redelivered:
                self.reached("stale_report_after_redelivery")
            if verb == "complete" and named.end in ("timeout_retry", "timeout_final"):
                self.reached("late_complete_after_timeout")
        if got != "ok":
            return
        if verb == "complete":
            self.reached("activity_completed")
            return
        e = named.execution
        if named.end == "retry":
            self.reached("retry_scheduled")
        elif named.end == "exhausted":
            self.reached("default_policy_final" if e.policy_json is None else "retries_exhausted")
        elif named.end == "flag":
            self.reached("non_retryable_flag")
        elif named.end == "type":
            self.reached("non_retryable_type")

    def leased_any(self) -> bool:
        return any(e.attempts for e in self.all_execs())

    def running(self, timeouts: bool | None = None) -> list[AttemptM]:
        """Current attempts the model holds running (by the model alone, never the clock), of open runs;
        ``timeouts`` selects those with (True) or without (False) a start_to_close."""
        return [
            a
            for x in self.all_execs()
            if x.certain and x.run.open and (a := x.current) is not None and a.status is AttemptStatus.RUNNING
            if timeouts is None or (a.deadline is not None) == timeouts
        ]

    def running_any(self) -> bool:
        return bool(self.running())

    @staticmethod
    def index(e: ExecM) -> int:
        """The execution's number: picks among candidates deterministically from the drawn execution."""
        return int(e.activity_type.rsplit(".", 1)[1])

    def fresh(self, e: ExecM) -> bool:
        """Leased, and not yet reported on more than SPENT_REPORTS times since it ended or its run closed."""
        return bool(e.attempts) and (e.spent if e.run.open else e.run.spent) < SPENT_REPORTS

    def reportable(self) -> bool:
        return any(self.fresh(e) for e in self.all_execs())

    def open_work(self) -> bool:
        """An activity that may still be leased, retried or reported as its final outcome."""
        return any(e.certain and e.run.open and e.final is None for e in self.all_execs())

    def focus(self, e: ExecM) -> ExecM:
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

    def pick(self, e: ExecM, which: str) -> AttemptM | None:
        e = self.focus(e)
        if not e.attempts:
            return None
        if which == "previous" and len(e.attempts) > 1:
            return e.attempts[-2]
        return e.attempts[-1]

    # -- rules ---------------------------------------------------------------------------------------------

    @initialize()
    def register_workers(self) -> None:
        for i in range(WORKERS):
            self.workers.append(self.run(self.ctx.register(self.queue, worker_id=self.ctx.uid(f"aw{i}"))))

    @precondition(lambda self: len(self.runs) < MAX_RUNS or (len(self.runs) < 2 * MAX_RUNS and not self.open_work()))
    @rule(target=execs, activities=ACTIVITIES)
    def start_run(self, activities: list[tuple[dict[str, Any] | None, bool]]) -> Any:
        """Start a run and complete its first workflow task with schedule_activity commands."""
        queue = self.ctx.uid("q")
        worker = self.run(self.ctx.register(queue, worker_id=self.ctx.uid("ww")))
        workflow_id, run_id = self.run(self.ctx.start(queue))
        try:
            task = self.run(self.ctx.lease_wf(worker, queue))
        except CheckFailure as failure:
            failure.requirement = failure.requirement or "ACTIVITY-SCHEDULED-LEASABLE"
            raise
        run = RunM(workflow_id, run_id, queue, worker)
        commands: list[dict[str, Any]] = []
        for i, (policy_json, short) in enumerate(activities):
            e = ExecM(
                activity_type=f"{ACTIVITY_TYPE}.{self.scheduled + i + 1}",
                run=run,
                policy_json=policy_json,
                policy=validate_retry_policy(policy_json) or DEFAULT_RETRY_POLICY,
                start_to_close=START_TO_CLOSE if short and self.short_timeouts else None,
            )
            run.execs.append(e)
            command: dict[str, Any] = {
                "type": "schedule_activity",
                "activity_type": e.activity_type,
                "queue": self.queue,
                "arguments": self.ctx.envelope([i]),
            }
            if policy_json is not None:
                command["retry_policy"] = policy_json
            if e.start_to_close is not None:
                command["start_to_close_timeout"] = e.start_to_close
            commands.append(command)
        self.scheduled += len(commands)
        self.runs.append(run)
        self.exec_by_type.update((e.activity_type, e) for e in run.execs)
        reply = self.call(self.ctx.complete(task, commands))
        if reply is None:
            run.uncertain = True  # maybe scheduled: its activities may be leased, but are never judged
            return multiple(*run.execs)
        if reply.status != 200:
            raise self.violation(
                "ACTIVITY-SCHEDULED-LEASABLE",
                "a workflow-task complete with valid schedule_activity commands is accepted",
                expected=200,
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
        return multiple(*run.execs)

    @precondition(lambda self: self.ready_work() > 0)
    @rule(first=st.integers(0, WORKERS - 1), n=st.sampled_from([1, 1, 2, 3, WORKERS]))
    def poll(self, first: int, n: int) -> None:
        """One worker polls, or ``n`` workers poll released together: every task is leased at most once
        (seed 003: one valid lease per delivery). Only when the model knows of claimable work: an empty poll
        holds a second."""
        workers = [self.workers[(first + i) % WORKERS] for i in range(n if self.races < MAX_RACES else 1)]
        if len(workers) == 1:
            reply, sent, received = self.poll_once(workers[0])
            if reply is not None:
                self.adopt(self.check_poll_shape(reply), workers[0], sent, received, reply)
            return
        self.races += 1
        ready = self.ready_work()
        sent = self.now()
        results = self.run(race(len(workers), lambda i: self._poll(workers[i], 1)))
        received = self.now()
        granted: dict[str, list[Reply]] = {}
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                self.reached("response_lost")
                note(f"race poll {i}: no response (maybe applied): {res!r}")
                self.lost_poll()
                continue
            if res.resent:
                self.lost_poll()
            note(res.exchange.summary())
            body = self.check_poll_shape(res)
            task = body.get("task")
            if isinstance(task, dict):
                granted.setdefault(str(task.get("task_id")), []).append(res)
                if len(granted[str(task.get("task_id"))]) == 1:
                    self.adopt(body, workers[i], sent, received, res)
        for task_id, replies in granted.items():
            if len(replies) > 1:
                raise self.violation(
                    "DISPATCH-ONE-LEASE-PER-DELIVERY",
                    f"{len(replies)} concurrent polls were granted activity task {task_id}",
                    expected="exactly one lease",
                    received=[r.json().get("task", {}).get("activity_attempt_id") for r in replies],
                    replies=replies,
                )
        if granted and len(workers) > ready:
            self.reached("duplicate_claim_raced")

    @precondition(lambda self: self.leased_any())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "previous"]),
        who=st.sampled_from(["owner", "owner", "other", "unknown_attempt", "other_task"]),
    )
    def heartbeat(self, e: ExecM, which: str, who: str) -> None:
        """A heartbeat by the owner, another worker, an unknown attempt id or the attempt id of another task."""
        a = self.pick(e, which)
        if a is not None:
            self.report(a, who, "heartbeat")

    @precondition(lambda self: self.reportable())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "current", "previous"]),
        who=st.sampled_from(["owner", "owner", "other"]),
        again=st.booleans(),
    )
    def complete(self, e: ExecM, which: str, who: str, again: bool) -> None:
        """A complete; with ``again``, an accepted one is delivered a second time (a duplicate report)."""
        a = self.pick(e, which)
        if a is None:
            return
        res = self.report(a, who, "complete")
        if again and res is not None and res[0] == "ok":
            self.report(a, who, "complete")

    @precondition(lambda self: self.reportable())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "current", "previous"]),
        who=st.sampled_from(["owner", "owner", "owner", "other", "other_task"]),
        kind=st.sampled_from(["retryable", "retryable", "unlisted", "flag", "type", "class"]),
        detail=st.integers(0, 2**31),
    )
    def fail(self, e: ExecM, which: str, who: str, kind: str, detail: int) -> None:
        """A fail (retryable, non-retryable by flag, by listed type or class, or of an unlisted type)."""
        a = self.pick(e, which)
        if a is not None:
            self.report(a, who, "fail", kind=kind, detail=detail)

    def decisive_attempt(self, e: ExecM, kind: str) -> AttemptM:
        """A running attempt with attempts left (so the failure kind, not the count, decides), preferring the
        drawn execution's, and one whose policy lists error types when the failure names one."""
        live = self.running()

        def decisive(a: AttemptM) -> bool:
            policy = a.execution.policy
            listed = bool(policy.non_retryable_error_types) or kind not in ("type", "class")
            return a.number < policy.max_attempts and listed

        pool = [a for a in live if decisive(a)] or live
        return e.current if e.current in pool and e.current is not None else pool[self.index(e) % len(pool)]

    @precondition(lambda self: self.running_any())
    @rule(e=execs, kind=st.sampled_from(["retryable", "unlisted"]), detail=st.integers(0, 2**31), pickup=st.booleans())
    def fail_retryable(self, e: ExecM, kind: str, detail: int, pickup: bool) -> None:
        """The owner fails a running attempt that has attempts left with a retryable failure (no type, or a type
        the policy does not list): a retry. With ``pickup`` a worker then long-polls for the retry, which must
        not arrive before its backoff."""
        a = self.decisive_attempt(e, kind)
        res = self.report(a, "owner", "fail", kind=kind, detail=detail)
        if pickup and res is not None and res[0] == "ok" and a.end == "retry":
            worker = self.workers[(self.workers.index(a.owner) + 1) % WORKERS]
            reply, sent, received = self.poll_once(worker, 2)
            if reply is not None:
                self.adopt(self.check_poll_shape(reply), worker, sent, received, reply)

    @precondition(lambda self: self.running_any())
    @rule(e=execs, by=st.sampled_from(["flag", "type", "class"]), detail=st.integers(0, 2**31))
    def fail_non_retryable(self, e: ExecM, by: str, detail: int) -> None:
        """The owner fails a running attempt that has attempts left with ``non_retryable: true``, or a
        ``failure.type`` / ``failure.class`` the policy lists: the activity ends there (§11.6)."""
        a = self.decisive_attempt(e, by)
        self.report(a, "owner", "fail", kind=by, detail=detail)

    def closable(self, run: RunM) -> bool:
        """An open run with an activity attempt still running (the interesting moment to close it)."""
        return (
            run.open
            and not run.uncertain
            and any((a := e.current) is not None and a.status is AttemptStatus.RUNNING for e in run.execs)
        )

    @precondition(lambda self: self.closes < MAX_CLOSES and self.running_any())
    @rule(
        e=execs,
        kind=st.sampled_from(["cancel", "terminate"]),
        then=st.sampled_from(["heartbeat", "heartbeat", "complete", "fail", "nothing"]),
    )
    def close_run(self, e: ExecM, kind: str, then: str) -> None:
        """Cancel or terminate a run while one of its activities is leased; then its worker heartbeats
        (200, cancel_requested, can_continue false) and reports (409 outcome "ignored"), or stays silent
        and is left to later rules."""
        closable = [r for r in self.runs if self.closable(r)]
        run = e.run if e.run in closable else closable[0]
        reply = self.call(
            self.client.control("POST", f"/workflows/{run.workflow_id}/{kind}", {"reason": "conformance"})
        )
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
            self.closes += 1
            run.status = RunStatus.CANCELLED if kind == "cancel" else RunStatus.TERMINATED
            run.closed_reason = run.status.value
            now = self.now()
            held = [
                a
                for x in run.execs
                if (a := x.current) is not None and a.status is AttemptStatus.RUNNING and a.expires > now
            ]
            for x in run.execs:
                a = x.current
                if a is not None and a.status is AttemptStatus.RUNNING and a.deadline is not None:
                    a.maybe_timed_out = a.deadline <= now + timedelta(seconds=MARGIN)
            if held:
                self.reached("closed_while_leased")
            if held and then != "nothing":
                if then == "heartbeat":
                    self.report(held[0], "owner", "heartbeat")
                self.report(held[0], "owner", "fail" if then == "fail" else "complete")
        elif reply.status != 409:
            raise self.violation(
                "CONTROL-CANCEL-CLOSES-RUN",
                f"{kind} of a closed run is refused",
                expected=409,
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )

    def _lease_wait_target(self) -> AttemptM | None:
        held = self.running(timeouts=False)
        return min(held, key=lambda a: a.expires) if held else None

    def can_wait_lease(self) -> bool:
        return self.lease_wait_fits and self.lease_waits < MAX_LEASE_WAITS and bool(self.running(timeouts=False))

    def can_wait_timeout(self) -> bool:
        return self.timeout_waits < MAX_TIMEOUT_WAITS and bool(self.running(timeouts=True))

    @precondition(lambda self: self.can_wait_lease() or self.can_wait_timeout())
    @rule(
        what=st.sampled_from(["lease", "timeout"]), then=st.sampled_from(["complete", "complete", "fail", "heartbeat"])
    )
    def wait_out(self, what: str, then: str) -> None:
        """Let time pass: a lease expires (the holder crashed) or a start_to_close deadline passes (the holder
        overran); the old attempt then reports."""
        if (what == "lease" and self.can_wait_lease()) or not self.can_wait_timeout():
            self.wait_out_lease(then)
        else:
            self.wait_out_timeout("complete" if then == "heartbeat" else then)

    def wait_out_lease(self, then: str) -> None:
        """The holder "crashes": once its lease expires the task is redelivered to another worker with a new
        activity_attempt_id and attempt_number + 1 (§9 "Activity redelivery"); then the old holder comes
        back and reports (stale, recorded false)."""
        a = self._lease_wait_target()
        if a is None or self.lease_seconds is None:
            return
        self.lease_waits += 1
        taker = next(w for w in self.workers if w != a.owner)
        deadline = time.monotonic() + max(0.0, (a.expires - self.now()).total_seconds()) + self.lease_seconds + 5
        while time.monotonic() < deadline:
            hold = max(1, min(10, int(deadline - time.monotonic())))
            reply, sent, received = self.poll_once(taker, hold)
            if reply is None:
                return
            got = self.adopt(self.check_poll_shape(reply), taker, sent, received, reply)
            if got is not None and got.task_id == a.task_id and got is not a:
                self.report(a, "owner", then)
                return
            if not a.execution.certain or a.end is not None:
                return
        raise self.violation(
            "ACTIVITY-REDELIVERY-NEW-ATTEMPT",
            f"activity task {a.task_id} was never redelivered after its lease expired at {a.expires.isoformat()}",
            expected=f"a lease of {a.task_id} with attempt_number {a.number + 1}",
            received="none",
        )

    def _timeout_wait_target(self) -> AttemptM | None:
        running = self.running(timeouts=True)
        return min(running, key=lambda a: a.deadline or a.expires) if running else None

    def wait_out_timeout(self, then: str) -> None:
        """The holder overruns its start_to_close: its heartbeat stops answering can_continue (§11.7), and
        its late report is stale (409 stale_attempt, recorded false)."""
        a = self._timeout_wait_target()
        if a is None or a.deadline is None:
            return
        self.timeout_waits += 1
        deadline = time.monotonic() + max(0.0, (a.deadline - self.now()).total_seconds()) + MARGIN + 5
        while time.monotonic() < deadline:
            res = self.report(a, "owner", "heartbeat")
            if res is None or not a.execution.certain:
                return
            if res[0] != "ok":
                if a.end in ("timeout_retry", "timeout_final"):
                    self.reached("timeout_waited")
                    self.report(a, "owner", then)
                return
            self.run(asyncio.sleep(0.25))
        raise self.violation(
            "TIMEOUT-LATE-COMPLETE-STALE",
            f"attempt {a.attempt_id} still can_continue well after its start_to_close deadline",
            expected=f"can_continue false after {a.deadline.isoformat()}",
            received="can_continue true",
        )

    def _probe_target(self) -> RunM | None:
        for run in self.runs:
            if not run.open or run.uncertain or any(not e.certain for e in run.execs):
                continue
            if run.resumed and not run.resume_leased:
                return run
            retried = any(a.end in ("retry", "timeout_retry") for e in run.execs for a in e.attempts)
            if retried and not run.resumed and self.empty_probes < MAX_EMPTY_PROBES:
                return run
        return None

    @precondition(lambda self: self._probe_target() is not None)
    @rule()
    def probe_resume(self) -> None:
        """Poll the run's own workflow queue: a workflow task appears only after a final activity outcome."""
        run = self._probe_target()
        if run is None:
            return
        resumed, pending = run.resumed, self.final_timeout_pending(run)
        reply = self.call(self.ctx.poll_wf(run.worker, run.queue, 1))
        if reply is None:
            run.uncertain = True
            return
        task = reply.json().get("task")
        if not isinstance(task, dict):
            if not resumed:
                self.empty_probes += 1
                self.reached("no_resume_between_retries")
            elif not pending and all(e.final != "timeout" for e in run.execs):
                raise self.violation(
                    "RETRY-FINAL-RESUMES-WORKFLOW",
                    f"run {run.run_id} had a final activity outcome but its queue holds no workflow task",
                    expected="a workflow task resuming the run",
                    received=f"{reply.status} poll_status {reply.json().get('poll_status')}",
                    replies=[reply],
                )
            return
        run.resume_leased = True
        self.touched.add(run.run_id)
        event_type = task.get("workflow_event_type")
        if not resumed and not pending:
            raise self.violation(
                "RETRY-RESUME-ONLY-FINAL",
                f"run {run.run_id} got a workflow task although none of its activities has a final outcome",
                expected="no workflow task between retries",
                received={"task_id": task.get("task_id"), "workflow_event_type": event_type},
                replies=[reply],
            )
        if event_type == "ActivityRetryScheduled":
            raise self.violation(
                "RETRY-RESUME-ONLY-FINAL",
                "a workflow task was resumed by an intermediate retry",
                expected="workflow_event_type of a final outcome",
                received=event_type,
                replies=[reply],
            )
        self.reached("resume_leased")

    # -- invariants ----------------------------------------------------------------------------------------

    @invariant()
    def histories_agree(self) -> None:
        """Every touched run's history holds exactly the activity events the model's recorded reports left."""
        if not self.touched:
            return
        for run_id in sorted(self.touched):
            run = next(r for r in self.runs if r.run_id == run_id)
            events = self.run(self.ctx.history(run.workflow_id, run.run_id))
            problem = check_sequences([ev.get("sequence") for ev in events])
            if problem:
                raise self.violation("HISTORY-SEQUENCE-CONTIGUOUS", f"run {run_id}: {problem}")
            self.check_run_history(run, events)
        note(f"checked {len(self.touched)} run histories")
        self.touched.clear()

    def check_run_history(self, run: RunM, events: list[dict[str, Any]]) -> None:
        by_attempt: dict[str, list[dict[str, Any]]] = {}
        by_execution: dict[str, list[dict[str, Any]]] = {}
        for ev in events:
            kind = ev.get("event_type")
            raw = ev.get("payload")
            payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if kind in ATTEMPT_EVENTS:
                by_execution.setdefault(str(payload.get("activity_execution_id")), []).append(ev)
                if payload.get("activity_attempt_id"):
                    by_attempt.setdefault(str(payload["activity_attempt_id"]), []).append(ev)
        attempts = {a.attempt_id: a for e in run.execs for a in e.attempts}
        now = self.now()
        # 1. What the model knows each attempt's reports left behind.
        for e in run.execs:
            if not e.certain:
                continue
            for a in e.attempts:
                self.check_attempt(a, [str(ev.get("event_type")) for ev in by_attempt.get(a.attempt_id, [])], now)
                failed = [ev for ev in by_attempt.get(a.attempt_id, []) if ev.get("event_type") == "ActivityFailed"]
                if failed and a.details is not None:
                    payload = failed[0].get("payload") or {}
                    if payload.get("details") != a.details:
                        raise self.violation(
                            "ACTIVITY-FAILURE-DETAILS-UNCHANGED",
                            f"ActivityFailed of attempt {a.attempt_id} does not carry failure.details unchanged",
                            expected=a.details,
                            received=payload.get("details"),
                        )
                    self.reached("failure_details_checked")
        # 2. Structure, whatever the model knows: one terminal event per attempt, one outcome per execution
        # and nothing after it, retries bounded by max_attempts.
        for attempt_id, evs in by_attempt.items():
            if len(evs) > 1:
                holder = attempts.get(attempt_id)
                raise self.violation(
                    holder.fenced[0] if holder is not None and holder.fenced else "HISTORY-ONE-TERMINAL-PER-ATTEMPT",
                    f"attempt {attempt_id} has {len(evs)} terminal events",
                    expected="at most one",
                    received=[(ev.get("sequence"), ev.get("event_type")) for ev in evs],
                )
        if by_attempt:
            self.reached("attempt_history_checked")
        known = {e.execution_id: e for e in run.execs if e.execution_id is not None}
        for execution_id, evs in by_execution.items():
            outcomes = [ev for ev in evs if ev.get("event_type") in OUTCOME_EVENTS]
            if len(outcomes) > 1:
                raise self.violation(
                    "RETRY-ONE-OUTCOME-PER-EXECUTION",
                    f"execution {execution_id} has {len(outcomes)} outcomes",
                    expected="exactly one terminal outcome",
                    received=[(ev.get("sequence"), ev.get("event_type")) for ev in outcomes],
                )
            if outcomes:
                last = outcomes[0].get("sequence")
                later = [ev for ev in evs if isinstance(last, int) and (ev.get("sequence") or 0) > last]
                if later:
                    raise self.violation(
                        "RETRY-ONE-OUTCOME-PER-EXECUTION",
                        f"execution {execution_id} has attempt events after its outcome "
                        f"{outcomes[0].get('event_type')} (an intermediate attempt was recorded as final)",
                        expected="nothing after the final outcome",
                        received=[(ev.get("sequence"), ev.get("event_type")) for ev in [outcomes[0], *later]],
                    )
                self.reached("final_outcome_in_history")
            ex = known.get(execution_id)
            if ex is None:
                continue
            after = [
                (ev.get("payload") or {}).get("retry_after_attempt")
                for ev in evs
                if ev.get("event_type") == "ActivityRetryScheduled"
            ]
            # §11.6 "Retry if … `attempt_number < max_attempts`": each retry follows an attempt below the cap.
            past = [n for n in after if not isinstance(n, int) or n >= ex.policy.max_attempts]
            if len(after) > ex.policy.max_attempts - 1 or past:
                raise self.violation(
                    self.exhausted_requirement(ex),
                    f"execution {execution_id} was retried {len(after)} times with max_attempts "
                    f"{ex.policy.max_attempts}",
                    expected=f"at most {ex.policy.max_attempts - 1} retries, each after an attempt < max_attempts",
                    received={"retry_after_attempt": after},
                )

    def check_attempt(self, a: AttemptM, found: list[str], now: datetime) -> None:
        e, run = a.execution, a.execution.run
        allowed: set[str | None] = set()
        if a.end in EXPECTED_EVENT:
            allowed.add(EXPECTED_EVENT[a.end])
        if a.end is None or a.end in LAZY_ENDS or a.end == "expired":
            allowed.add(None)
        if a.status is AttemptStatus.RUNNING and not run.open:
            allowed |= {"ActivityCancelled", None}
        near = (
            a.status is AttemptStatus.RUNNING
            and a.deadline is not None
            and a.deadline <= now + timedelta(seconds=MARGIN)
        )
        if near or a.maybe_timed_out:
            # The start_to_close fired, or may have fired before the run closed: its event, or none yet.
            allowed |= {"ActivityRetryScheduled" if e.policy.should_retry(a.number) else "ActivityTimedOut", None}
        event = found[0] if found else None
        if event in allowed:
            return
        if event is None:
            requirement = {
                "completed": "ACTIVITY-COMPLETE-RECORDED",
                "retry": "RETRY-BACKOFF-SCHEDULE",
            }.get(a.end or "", "RETRY-ONE-OUTCOME-PER-EXECUTION")
            message = f"attempt {a.number} of {e.activity_type} ended ({a.end}) but history has no event for it"
        elif a.end in ("exhausted", "flag", "type") and event == "ActivityRetryScheduled":
            requirement = {
                "exhausted": self.exhausted_requirement(e),
                "flag": "RETRY-NON-RETRYABLE-FLAG",
                "type": "RETRY-NON-RETRYABLE-TYPE",
            }[a.end]
            policy = "no retry_policy, so" if e.policy_json is None else "retry_policy"
            message = (
                f"attempt {a.number} of {e.activity_type} ({policy} max_attempts {e.policy.max_attempts}, "
                f"non_retryable_error_types {list(e.policy.non_retryable_error_types)}) failed finally ({a.end}) "
                "but was retried"
            )
        elif a.end == "retry" and event == "ActivityFailed":
            requirement = "RETRY-ATTEMPT-NUMBERS"
            message = (
                f"attempt {a.number} of {e.activity_type} failed retryably with max_attempts "
                f"{e.policy.max_attempts}, but the failure was recorded as final"
            )
        elif a.end == "completed":
            requirement = "ACTIVITY-COMPLETE-RECORDED"
            message = f"the accepted complete of attempt {a.number} of {e.activity_type} left {event}"
        else:
            requirement = a.fenced[0] if a.fenced else self.stale_requirement(a)
            message = (
                f"attempt {a.number} of {e.activity_type} ({a.status.value}, {a.end or 'no outcome'}) "
                f"has {event} in history although no report of it was accepted"
            )
        raise self.violation(
            requirement,
            message,
            expected=sorted(str(x) for x in allowed),
            received=found,
        )
