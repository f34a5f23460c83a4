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

The model and its judges are pure, in :mod:`suite.machines.activity_oracle`; this module draws, sends, and
hands every answer to them. After every step the control-plane history of each touched run is checked against
the model (:func:`~suite.machines.activity_oracle.check_run_history`).

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

import secrets
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

import suite.machines.activity_oracle as oracle
from suite.client import Reply
from suite.outcomes import CheckFailure
from suite.protocol.commands import DEFAULT_RETRY_POLICY, validate_retry_policy
from suite.protocol.coverage import Actor
from suite.protocol.errors import Violation
from suite.protocol.lifecycles import AttemptStatus
from suite.protocol.oracle import Applied, Kind
from suite.worlds import lease_wf

from .activity_oracle import ActivityRun, ActivityWorld, Attempt, Execution
from .activity_sweep import sweep_cold_cells
from .base import MachineBase, Polled, note
from .cells import attempt_actor, attempt_state, redelivered

__all__ = ["ActivityMachine"]

WORKERS = 4
MAX_RUNS = 5  # per example: at most 10 activities, so live leases stay below an admission limit of 16
MAX_LEASE_WAITS = 1  # lease expiries waited out per example (each holds one activity lease, 3 s embedded)
MAX_TIMEOUT_WAITS = 1  # start_to_close deadlines waited out per example
MAX_EMPTY_PROBES = 2  # workflow-task polls per example that may hold a full second
MAX_RACES = 2  # races per example: each one with more pollers than ready tasks holds a second
MAX_HEARTBEAT_RETRIES = 2  # heartbeat_then_fail per example: the hard history, then room for the other rules
# Polls for a retry: one per task the model knows is ready (other ready tasks may come first), and one more.
RETRY_PICKUP_POLLS = 2 * MAX_RUNS + 1
MAX_CLOSES = 1  # run cancels/terminates per example: a closed run's activities can only be fenced after it
START_TO_CLOSE = 2  # seconds: the "short timeout"; used only when it ends before the lease does
ACTIVITY_TYPE = "conformance.act"
NON_RETRYABLE = oracle.NON_RETRYABLE
# A worker that does not hold an attempt is fenced: judged where one reports (heartbeat, complete, fail).
FENCE_CELLS: dict[str, tuple[str, ...]] = {
    "ACTIVITY-FENCE-OWNER": ("activity_attempt/*/*/other_worker", "activity_attempt/*/*/former_holder")
}
# Reports whose worker the coverage model can name: the holder, a worker that held the task before, another.
ACTORS = ("owner", "former", "other")

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


class ActivityMachine(MachineBase):
    """Activity attempts under random retry policies: leases, redelivery, retries after heartbeats, stale and
    foreign reports, timeouts and cancellation, judged by the activity model."""

    name = "activities"
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "RETRY-ATTEMPT-NUMBERS": "retry_leased",
        # Attempt numbers across a heartbeat, a failure and the retry; judged on every lease and history too.
        "RETRY-ATTEMPTS-CONTIGUOUS": "retry_after_heartbeat_leased",
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

    REQUIREMENT_CELLS: ClassVar[dict[str, tuple[str, ...]]] = FENCE_CELLS

    execs = Bundle("execs")

    def __init__(self) -> None:
        super().__init__()
        self.world = ActivityWorld()
        self.lease_waits = 0
        self.timeout_waits = 0
        self.empty_probes = 0
        self.scheduled = 0
        self.closes = 0
        self.races = 0
        self.heartbeat_retries = 0
        profile = self.target.test_profile if self.target else {}
        lease = profile.get("activity_task_lease_seconds")
        self.lease_seconds: float | None = float(lease) if isinstance(lease, int | float) else None
        self.max_wait = self.ctx.max_wait
        # A start_to_close shorter than the lease always fires first (both run from the same claim), so the
        # model never has to guess which of the two ended an attempt.
        self.short_timeouts = (
            self.lease_seconds is not None
            and self.lease_seconds > START_TO_CLOSE
            and self.max_wait >= START_TO_CLOSE + self.MARGIN
        )
        self.lease_wait_fits = self.lease_seconds is not None and self.lease_seconds + self.MARGIN <= self.max_wait

    # -- model helpers -------------------------------------------------------------------------------------

    def run_status(self, run: ActivityRun) -> str | None:
        reply = self.call(self.client.control("GET", f"/workflows/{run.workflow_id}"))
        if reply is None or reply.status != 200:
            return None
        status = reply.json().get("status")
        return status if isinstance(status, str) else None

    def timeout_pending(self, run: ActivityRun) -> bool:
        return oracle.final_timeout_pending(run, self.now(), self.MARGIN)

    # -- polling -------------------------------------------------------------------------------------------

    async def _poll(self, worker: str, timeout: int, until: datetime | None = None) -> Reply:
        return await self.ctx.poll("activity", worker, self.queue, timeout, until=until)

    def poll_activity(self, worker: str, timeout: int = 1, until: datetime | None = None) -> Polled:
        return self.poll_once(self._poll(worker, timeout, until), "activity")

    def lost_poll(self) -> None:
        """A poll without an answer may have leased any claimable task: those executions become uncertain, and
        an attempt number of theirs may go unseen."""
        for e in self.world.lost_poll(self.now() + timedelta(seconds=self.MARGIN)):
            self.ack(e.run.run_id, Kind.ATTEMPT, scope=e.activity_type, applied=Applied.MAYBE)

    def adopt(self, polled: Polled, worker: str) -> Attempt | None:
        """Judge a granted activity lease against the model, then record it. The grant happened between
        ``polled.sent`` and ``polled.received`` (client clock)."""
        task, reply = polled.task, polled.reply
        if task is None or reply is None:
            return None
        with self.judged(reply):
            attempt, states = oracle.judge_lease(self.world, task, worker, polled.received, self.MARGIN)
        for state in states:
            self.reached(state)
        e = attempt.execution
        if "lease_expired_redelivered" in states and e.certain and len(e.attempts) > 1:
            lost = e.attempts[-2]  # the attempt whose lease the clock ended: the redelivery shows it
            self.hit("activity_attempt", "redelivered" if redelivered(lost) else "running", "expire", Actor.CLOCK)
        self.ack(e.run.run_id, Kind.ATTEMPT, attempt.attempt_id, scope=e.activity_type, number=attempt.number)
        if "lease_expired_redelivered" in states and not attempt.execution.certain:
            note(f"{attempt.execution.activity_type}: redelivered, not judged (its start_to_close may have won)")
        self.touched.add(attempt.execution.run.run_id)
        return attempt

    # -- reports -------------------------------------------------------------------------------------------

    def actor(self, a: Attempt, who: str) -> tuple[str, str, str, Attempt | None]:
        """(task_id in the URL, activity_attempt_id, lease_owner, the attempt that id names)."""
        if who in ("other", "former"):
            earlier = [b.owner for b in a.execution.attempts if b.task_id == a.task_id and b.number < a.number]
            if who == "former" and earlier:
                return a.task_id, a.attempt_id, earlier[-1], a
            # A worker that never held the task when there is one, else any worker but the holder.
            others = [w for w in self.workers if w != a.owner]
            never = [w for w in others if w not in earlier]
            return a.task_id, a.attempt_id, (never or others)[0], a
        if who == "other_task":
            other = next(
                (b for e in self.world.all_execs() for b in reversed(e.attempts) if b.task_id != a.task_id), None
            )
            if other is not None:
                return a.task_id, other.attempt_id, other.owner, other
            who = "unknown_attempt"
        if who == "unknown_attempt":
            return a.task_id, f"01CONFORMANCEUNKNOWN{secrets.token_hex(3).upper()}", a.owner, None
        return a.task_id, a.attempt_id, a.owner, a

    def report(
        self, a: Attempt, who: str, verb: str, *, kind: str = "retryable", detail: int = 0
    ) -> tuple[str, Reply] | None:
        """One complete, fail or heartbeat, judged by the model; the model follows the answer."""
        e = a.execution
        if not e.run.open:
            e.run.spent += 1
        elif e.final is not None:
            e.spent += 1
        task_id, attempt_id, owner, named = self.actor(a, who)
        extra, label = oracle.report_body(a, verb, kind, detail)
        body: dict[str, Any] = {"activity_attempt_id": attempt_id, "lease_owner": owner, **extra}
        at = self.now()
        branches = oracle.branches(
            named, verb, task_id=task_id, attempt_id=attempt_id, owner=owner, at=at, margin=self.MARGIN
        )
        allowed = {b.out for b in branches}
        target = named.execution if named is not None else e
        check_resume = (
            verb == "fail"
            and label == "retry"
            and "ok" in allowed
            and target is e
            and e.certain
            and e.run.open
            and not e.run.resumed
            and not self.timeout_pending(e.run)
        )
        certain = e.certain and target.certain
        before = self.run_status(e.run) if check_resume else None
        was = a.status
        # The cell: the attempt the id names, as the model holds it when the call leaves (a call naming another
        # task's attempt, or no attempt at all, is about no attempt's lifecycle: no cell).
        cell = attempt_state(named, at, self.MARGIN) if named is not None and who in ACTORS else None
        reply = self.call(self.client.worker(f"/activity-tasks/{task_id}/{verb}", body))
        if reply is None:
            target.uncertain = True
            return None
        reply_body = reply.json()
        got = oracle.outcome(reply.status, reply.reason, reply_body, verb)
        if not certain:
            return got, reply
        # A heartbeat past the lease expires the attempt (stale_attempt, §11.3); when the answer of a copy that
        # did so was lost, the resent copy finds the attempt closed. The model follows that first copy.
        second = bool(reply.resent) and verb == "heartbeat" and got == "stop:attempt_closed"
        if second and "stop:stale_attempt" in allowed:
            got = "stop:stale_attempt"
        with self.judged(reply):
            if got not in allowed:
                expected = sorted(allowed)
                raise Violation(
                    oracle.requirement_for(allowed, got, verb, named, self.now()),
                    f"activity {verb} ({who}) of {a!r}: the model allows {expected}",
                    expected=" or ".join(expected),
                    received=f"{reply.status} {got}",
                )
            matched = [b for b in branches if b.out == got]
            if not second:
                oracle.check_body(reply.status, reply_body, verb, got, matched, named, self.now())
        self.touched.add(target.run.run_id)
        if cell is not None and named is not None:
            self.hit("activity_attempt", cell, verb, attempt_actor(named, owner, cell))
        live = named is not None and named.status is AttemptStatus.RUNNING
        oracle.follow(matched, verb, got, reply_body, named, label=label, sent=at, details=body.get("failure"))
        if live and named is not None and named.status is AttemptStatus.EXPIRED:
            # The answer showed the clock had ended the attempt (its lease or its start_to_close).
            self.hit("activity_attempt", "redelivered" if redelivered(named) else "running", "expire", Actor.CLOCK)
        for state in oracle.mark(verb, got, named, was, self.now()):
            self.reached(state)
        if check_resume and got == "ok" and before == "waiting":
            self.judge_still_waiting(a, reply)
        return got, reply

    def judge_still_waiting(self, a: Attempt, reply: Reply) -> None:
        """§11.6 "No workflow task is created for a retry", seen through describe: a run waiting before an
        intermediate failure is still waiting after it (§9.1: waiting means no open workflow task)."""
        e = a.execution
        after = self.run_status(e.run)
        if after == "running":
            raise self.violation(
                "RETRY-RESUME-ONLY-FINAL",
                f"an intermediate failure of {e.activity_type} (attempt {a.number} of "
                f"{e.policy.max_attempts}) gave run {e.run.run_id} a workflow task: it went from waiting "
                "to running (docs/reference.md: Leasing: waiting means no open workflow task)",
                expected="waiting (no workflow task until the final outcome)",
                received=after,
                replies=[reply],
            )
        if after == "waiting":
            self.reached("retry_kept_run_waiting")

    # -- rules ---------------------------------------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        self.register_workers(WORKERS)

    @precondition(
        lambda self: (
            len(self.world.runs) < MAX_RUNS or (len(self.world.runs) < 2 * MAX_RUNS and not self.world.open_work())
        )
    )
    @rule(target=execs, activities=ACTIVITIES)
    def start_run(self, activities: list[tuple[dict[str, Any] | None, bool]]) -> Any:
        """Start a run and complete its first workflow task with schedule_activity commands."""
        queue = self.ctx.uid("q")
        worker = self.run(self.ctx.register(queue, worker_id=self.ctx.uid("ww")))
        workflow_id, run_id = self.run(self.ctx.start(queue))
        self.ack(run_id, Kind.START)
        sent = self.now()
        try:
            task = self.run(lease_wf(self.ctx, worker, queue))
        except CheckFailure as failure:
            failure.requirement = failure.requirement or "ACTIVITY-SCHEDULED-LEASABLE"
            raise
        self.read_back(
            task, Polled(None, {}, sent, self.now(), {run_id: 1}), worker, int(task["workflow_task_attempt"])
        )
        run = ActivityRun(workflow_id=workflow_id, run_id=run_id, queue=queue, worker=worker)
        commands: list[dict[str, Any]] = []
        for i, (policy_json, short) in enumerate(activities):
            e = Execution(
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
        self.world.add(run)
        reply = self.call(self.ctx.complete(task, commands))
        if reply is None:
            run.uncertain = True  # maybe scheduled: its activities may be leased, but are never judged
            return multiple(*run.execs)
        message = "a workflow-task complete with valid schedule_activity commands is accepted"
        self.expect_status(reply, 200, "ACTIVITY-SCHEDULED-LEASABLE", message)
        return multiple(*run.execs)

    @precondition(lambda self: self.world.ready_work(self.now()) > 0)
    @rule(first=st.integers(0, WORKERS - 1), n=st.sampled_from([1, 1, 2, 3, WORKERS]))
    def poll(self, first: int, n: int) -> None:
        """One worker polls, or ``n`` workers poll released together: every task is leased at most once
        (Dispatch, Lease and Hooks: one valid lease per delivery). Only when the model knows of claimable work: an
        empty poll holds a second."""
        workers = [self.workers[(first + i) % WORKERS] for i in range(n if self.races < MAX_RACES else 1)]
        if len(workers) == 1:
            self.adopt(self.poll_activity(workers[0]), workers[0])
            return
        self.races += 1
        ready = self.world.ready_work(self.now())
        polls = self.poll_race(len(workers), lambda i: self._poll(workers[i], 1), "activity")
        # One delivery is one attempt: two polls granted the same attempt break the rule at once; the same task
        # as two attempts is a redelivery, judged by the model in grant order (legal once the first lease expired
        # on the target's clock, which a race's held polls may move).
        self.granted_once(
            polls,
            lambda t: f"activity task {t.get('task_id')} attempt {t.get('activity_attempt_id')}",
            "DISPATCH-ONE-LEASE-PER-DELIVERY",
        )
        ordered = sorted((ip for ip in polls if ip[1].task is not None), key=lambda ip: _attempt_number(ip[1].task))
        granted = [self.adopt(p, workers[i]) for i, p in ordered]
        if granted and len(workers) > ready:
            self.reached("duplicate_claim_raced")

    @precondition(lambda self: self.world.leased_any())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "previous"]),
        who=st.sampled_from(["owner", "owner", "other", "unknown_attempt", "other_task"]),
    )
    def heartbeat(self, e: Execution, which: str, who: str) -> None:
        """A heartbeat by the owner, another worker, an unknown attempt id or the attempt id of another task."""
        a = self.world.pick(e, which)
        if a is not None:
            self.report(a, who, "heartbeat")

    @precondition(lambda self: self.world.reportable())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "current", "previous"]),
        who=st.sampled_from(["owner", "owner", "other"]),
        again=st.booleans(),
    )
    def complete(self, e: Execution, which: str, who: str, again: bool) -> None:
        """A complete; with ``again``, an accepted one is delivered a second time (a duplicate report)."""
        a = self.world.pick(e, which)
        if a is None:
            return
        res = self.report(a, who, "complete")
        if again and res is not None and res[0] == "ok":
            self.report(a, who, "complete")

    @precondition(lambda self: self.world.reportable())
    @rule(
        e=execs,
        which=st.sampled_from(["current", "current", "previous"]),
        who=st.sampled_from(["owner", "owner", "owner", "other", "other_task"]),
        kind=st.sampled_from(["retryable", "retryable", "unlisted", "flag", "type", "class"]),
        detail=st.integers(0, 2**31),
    )
    def fail(self, e: Execution, which: str, who: str, kind: str, detail: int) -> None:
        """A fail (retryable, non-retryable by flag, by listed type or class, or of an unlisted type)."""
        a = self.world.pick(e, which)
        if a is not None:
            self.report(a, who, "fail", kind=kind, detail=detail)

    @precondition(lambda self: self.world.running_any())
    @rule(
        e=execs,
        kind=st.sampled_from(["retryable", "unlisted"]),
        detail=st.integers(0, 2**31),
        pickup=st.booleans(),
        beat=st.booleans(),
    )
    def fail_retryable(self, e: Execution, kind: str, detail: int, pickup: bool, beat: bool) -> None:
        """The owner fails a running attempt that has attempts left with a retryable failure (no type, or a type
        the policy does not list): a retry. With ``beat`` it heartbeats first (§11.6: the retry is still
        attempt n + 1); with ``pickup`` a worker then long-polls for the retry, which must not arrive before
        its backoff."""
        a = self.world.decisive_attempt(e, kind)
        if beat:
            renewed = self.report(a, "owner", "heartbeat")
            if renewed is None or renewed[0] != "ok":
                return
        res = self.report(a, "owner", "fail", kind=kind, detail=detail)
        if pickup and res is not None and res[0] == "ok" and a.end == "retry":
            self.pick_up_retry(a)

    @precondition(lambda self: self.heartbeat_retries < MAX_HEARTBEAT_RETRIES and bool(self.world.retryable()))
    @rule(e=execs, detail=st.integers(0, 2**31))
    def heartbeat_then_fail(self, e: Execution, detail: int) -> None:
        """The owner heartbeats a running attempt that has attempts left, then fails it retryably; a worker
        long-polls for the retry and heartbeats it in turn: the retry is attempt n + 1 (§11.6), and every event
        of both attempts names its own number."""
        self.heartbeat_retries += 1
        pool = self.world.retryable()
        a = e.current if e.current in pool and e.current is not None else pool[self.world.index(e) % len(pool)]
        beat = self.report(a, "owner", "heartbeat")
        if beat is None or beat[0] != "ok":
            return
        res = self.report(a, "owner", "fail", kind="retryable", detail=detail)
        if res is None or res[0] != "ok" or a.end != "retry":
            return
        retry = self.pick_up_retry(a)
        if retry is not None:
            self.report(retry, "owner", "heartbeat")

    def pick_up_retry(self, a: Attempt) -> Attempt | None:
        """Another worker long-polls for the retry of ``a``; the retry's attempt, or ``None`` when it did not
        come (a lost answer, or the model lost track). Other ready tasks of the queue may come first: each is an
        ordinary lease, judged and kept, and the worker polls on (the ones ``a``'s retry queued behind)."""
        worker = self.workers[(self.workers.index(a.owner) + 1) % WORKERS]
        for _ in range(min(RETRY_PICKUP_POLLS, self.world.ready_work(self.now()) + 1)):
            got = self.adopt(self.poll_activity(worker, 2), worker)
            if got is None or not a.execution.certain:
                return None
            if got.execution is a.execution:
                return got
        return None

    # Hypothesis draws rules uniformly: listed twice, this one is drawn twice as often (a hard history).
    heartbeat_then_fail_weight = heartbeat_then_fail

    # Drawn only while an attempt has attempts left: on a last attempt every failure ends the activity, so the
    # non-retryable rules (and a server that retries such a failure) would go unjudged.
    @precondition(lambda self: self.world.decisive_any())
    # The flag half the time: "type" and "class" both reach the type rule's state.
    @rule(e=execs, by=st.sampled_from(["flag", "flag", "type", "class"]), detail=st.integers(0, 2**31))
    def fail_non_retryable(self, e: Execution, by: str, detail: int) -> None:
        """The owner fails a running attempt that has attempts left with ``non_retryable: true``, or a
        ``failure.type`` / ``failure.class`` the policy lists: the activity ends there (§11.6)."""
        a = self.world.decisive_attempt(e, by)
        self.report(a, "owner", "fail", kind=by, detail=detail)

    # Drawn twice as often: most attempts are already their activity's last, where this rule cannot judge.
    fail_non_retryable_weight = fail_non_retryable

    @precondition(lambda self: self.closes < MAX_CLOSES and self.world.running_any())
    @rule(
        e=execs,
        kind=st.sampled_from(["cancel", "terminate"]),
        then=st.sampled_from(["heartbeat", "heartbeat", "complete", "fail", "nothing"]),
    )
    def close_run(self, e: Execution, kind: str, then: str) -> None:
        """Cancel or terminate a run while one of its activities is leased; then its worker heartbeats
        (200, cancel_requested, can_continue false) and reports (409 outcome "ignored"), or stays silent
        and is left to later rules."""
        closable = [r for r in self.world.runs if self.world.closable(r)]
        run = e.run if e.run in closable else closable[0]
        was_open = run.open
        if not self.close_attempts_run(run, kind) or not was_open:
            return
        self.closes += 1
        now = self.now()
        held = [
            a
            for x in run.execs
            if (a := x.current) is not None and a.status is AttemptStatus.RUNNING and a.expires > now
        ]
        for x in run.execs:
            a = x.current
            if a is not None and a.status is AttemptStatus.RUNNING and a.deadline is not None:
                a.maybe_timed_out = a.deadline <= now + timedelta(seconds=self.MARGIN)
        if held:
            self.reached("closed_while_leased")
        if held and then != "nothing":
            if then == "heartbeat":
                self.report(held[0], "owner", "heartbeat")
            self.report(held[0], "owner", "fail" if then == "fail" else "complete")

    def close_attempts_run(self, run: ActivityRun, kind: str) -> bool:
        return close_attempts_run(self, run, kind)

    def can_wait_lease(self) -> bool:
        return self.lease_wait_fits and self.lease_waits < MAX_LEASE_WAITS and bool(self.world.running(timeouts=False))

    def can_wait_timeout(self) -> bool:
        return self.timeout_waits < MAX_TIMEOUT_WAITS and bool(self.world.running(timeouts=True))

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
        a = self.world.lease_wait_target()
        if a is None or self.lease_seconds is None:
            return
        self.lease_waits += 1
        taker = next(w for w in self.workers if w != a.owner)
        for polled in self.polls_past_expiry(a.expires, self.lease_seconds, partial(self.poll_activity, taker)):
            if polled.reply is None:
                return
            got = self.adopt(polled, taker)
            if got is not None and got.task_id == a.task_id and got is not a:
                self.report(a, "owner", then)
                return
            if not a.execution.certain or a.end is not None:
                return
        attempt = f"attempt_number {a.number + 1}"
        raise self.redelivery_overdue(
            "ACTIVITY-REDELIVERY-NEW-ATTEMPT", f"activity task {a.task_id}", a.expires, attempt
        )

    def wait_out_timeout(self, then: str) -> None:
        """The holder overruns its start_to_close: its heartbeat stops answering can_continue (§11.7), and
        its late report is stale (409 stale_attempt, recorded false)."""
        a = self.world.timeout_wait_target()
        if a is None or a.deadline is None:
            return
        self.timeout_waits += 1
        deadline = max(a.deadline, self.now()) + timedelta(seconds=self.MARGIN + 5)
        while self.now() < deadline:
            res = self.report(a, "owner", "heartbeat")
            if res is None or not a.execution.certain:
                return
            if res[0] != "ok":
                if a.end in ("timeout_retry", "timeout_final"):
                    self.reached("timeout_waited")
                    self.report(a, "owner", then)
                return
            self.run(self.ctx.wait(0.25))
        raise self.violation(
            "TIMEOUT-LATE-COMPLETE-STALE",
            f"attempt {a.attempt_id} still can_continue well after its start_to_close deadline",
            expected=f"can_continue false after {a.deadline.isoformat()}",
            received="can_continue true",
        )

    @precondition(lambda self: self.world.probe_target(self.empty_probes < MAX_EMPTY_PROBES) is not None)
    @rule()
    def probe_resume(self) -> None:
        """Poll the run's own workflow queue: a workflow task appears only after a final activity outcome."""
        run = self.world.probe_target(self.empty_probes < MAX_EMPTY_PROBES)
        if run is None:
            return
        resumed, pending = run.resumed, self.timeout_pending(run)
        style = self.next_read()
        polled = self.poll_once(self.ctx.poll_wf(run.worker, run.queue, 1, **style.poll_fields()), style=style)
        if polled.reply is None:
            run.uncertain = True
            return
        self.judge_resume(run, resumed, pending, polled.reply)
        if polled.task is not None:
            self.read_back(polled.task, polled, run.worker, int(polled.task.get("workflow_task_attempt") or 1))

    def judge_resume(self, run: ActivityRun, resumed: bool, pending: bool, reply: Reply) -> None:
        """§11.6, §14.2: the run's own queue holds a workflow task only after a final activity outcome, and
        that task names the final outcome, never an intermediate retry."""
        task = reply.json().get("task")
        if not isinstance(task, dict):
            if not resumed:
                self.empty_probes += 1
                self.reached("no_resume_between_retries")
            elif not pending and all(e.final != "timeout" for e in run.execs):
                raise self.unexpected(
                    reply,
                    "RETRY-FINAL-RESUMES-WORKFLOW",
                    f"run {run.run_id} had a final activity outcome but its queue holds no workflow task",
                    "a workflow task resuming the run",
                    f"poll_status {reply.json().get('poll_status')}",
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

    # -- the sweep over cold cells -------------------------------------------------------------------------

    def sweep(self) -> None:
        """After the examples: every activity-attempt cell they left cold, made deterministically
        (:mod:`suite.machines.activity_sweep`)."""
        self.sweep_rounds(lambda: sweep_cold_cells(self))

    # -- invariants ----------------------------------------------------------------------------------------

    @invariant()
    def histories_agree(self) -> None:
        """Every touched run's history holds exactly the activity events the model's recorded reports left."""
        if self.touched:
            self.check_touched_histories(self.world.run_by_id, self.judge_history)

    def judge_history(self, run: ActivityRun, events: list[dict[str, Any]]) -> None:
        with self.judged():
            for state in oracle.check_run_history(run, events, self.now(), self.MARGIN):
                self.reached(state)


def close_attempts_run(m: ActivityMachine, run: ActivityRun, kind: str) -> bool:
    """Cancel or terminate ``run`` (judged by ``close_by_control``), counting the call in the cell of each of its
    activities' newest attempt; whether the model could judge the answer."""
    at = m.now()
    cells = [attempt_state(a, at, m.MARGIN) for x in run.execs if (a := x.current) is not None]
    if m.close_by_control(run, kind) is None:
        return False
    for cell in cells:
        if cell is not None:
            m.hit("activity_attempt", cell, "close_run", Actor.OPERATOR)
    return True


def _attempt_number(task: dict[str, Any] | None) -> int:
    """A granted lease's attempt_number (0 when it names none: the model judges that)."""
    number = (task or {}).get("attempt_number")
    return number if isinstance(number, int) and not isinstance(number, bool) else 0
