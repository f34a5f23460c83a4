"""The query, signal and update machine: control-plane messages against runs whose workflow tasks are leased.

Rules start runs, lease and complete workflow tasks (hour-long timers, ``complete_workflow``,
``complete_update`` / ``fail_update`` and batches that close an update twice), signal and update running and
closed runs, block on an update with ``wait_for:"completed"`` while the machine plays the worker that closes
it, query running and closed runs while the machine plays the query worker (fenced intruders, wrong attempts,
the answer, a late second report), and cancel or terminate runs.

The model keeps, per run, its status, the one workflow-task *slot* the protocol allows (none, ready,
leased, or "maybe" where the protocol allows either), the history changes that arrived while its task was
leased, its open and closed updates, and every signal and update name it sent. It says what each answer
must be before the answer is read:

- a query never changes history or describe (snapshots taken right before and right after the query, inside
  the query rule, so signals and updates elsewhere cannot blur the comparison);
- a signal or update to an open run is accepted and recorded once, to a closed run refused (409) and never
  recorded;
- at most one workflow task per run is open: a wake that arrives while a task is ready or leased is
  coalesced into it, and no poll ever leases a second task of the same run while the first is open;
- an update is closed at most once; histories are gap-free with at most one terminal event.

Some §12.2 rules have no requirement ID yet; :data:`PROPOSED` names the ID this machine would judge and the
nearest registered ID it reports under until the registry has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, precondition, rule

from suite.client import Reply
from suite.outcomes import HarnessError, Indeterminate
from suite.protocol.errors import Rejection
from suite.protocol.fencing import (
    QueryTaskView,
    WorkflowTaskView,
    guard_query_task,
    guard_workflow_task,
    parse_rfc3339,
)
from suite.protocol.history import check_sequences
from suite.protocol.lifecycles import QueryTaskStatus, RunStatus, TaskStatus
from suite.protocol.requirements import REGISTRY

from .base import MachineBase, note, race

__all__ = ["PROPOSED", "QuerySignalMachine"]

MARGIN = 1.0  # seconds around a lease expiry or query deadline where either outcome is correct
WORKERS = 4
UPDATE_WAIT = 10  # wait_timeout_seconds of a blocking update
PROBES_PER_EXAMPLE = 1  # empty-queue polls (each holds the 1 s long-poll minimum)
DEFAULT_QUERY_TIMEOUT = 30.0
TERMINAL_EVENTS = frozenset(
    {
        "WorkflowCompleted",
        "WorkflowFailed",
        "WorkflowCancelled",
        "WorkflowTerminated",
        "WorkflowContinuedAsNew",
        "WorkflowTimedOut",
    }
)
# A lease repair may legitimately add this while a query runs (§9 "a repair adds RepairRequested").
NOT_QUERY_EVENTS = frozenset({"RepairRequested"})

# Proposed requirement ID -> (the registered ID reported until the proposed one exists, ledger state).
PROPOSED: dict[str, tuple[str, str]] = {
    # §12.2 signal row: "**409** for any other rejection, e.g. a closed run (`rejected_not_active`)".
    "SIGNAL-CLOSED-RUN-REJECTED": ("CONTROL-CANCEL-CLOSES-RUN", "signal_closed_run_refused"),
    # §12.2 "**202** `{…, outcome:"signal_received"}`"; SDK-INTEROP §6.2 "Create a workflow task after each
    # external history change: … signal received".
    "SIGNAL-RECORDED-AND-WAKES": ("DISPATCH-LOST-NOTIFICATION", "signal_recorded"),
    # §12.2 update row: "409 for other rejections (closed run)".
    "UPDATE-CLOSED-RUN-REJECTED": ("CONTROL-CANCEL-CLOSES-RUN", "update_closed_run_refused"),
    # §12.2 "**202** with `update_status:"accepted"` when it returns at acceptance".
    "UPDATE-ACCEPTED-RECORDED": ("DISPATCH-LOST-NOTIFICATION", "update_accepted"),
    # §8.7.1 complete_update: "The update must be accepted and open for this run, otherwise it is invalid".
    "UPDATE-CLOSED-AT-MOST-ONCE": ("COMMANDS-REQUIRED-FIELDS", "update_double_close_rejected"),
    # §12.2 "An update with `wait_for:"completed"` blocks until the worker completes a workflow task
    # containing `complete_update` or `fail_update` for that `update_id`"; 200 with the result, 422 when failed.
    "UPDATE-WAIT-COMPLETED": ("PAYLOAD-RESULT-UNCHANGED", "update_wait_completed"),
}


def _rid(proposed: str) -> str:
    return proposed if proposed in REGISTRY else PROPOSED[proposed][0]


SIGNAL_CLOSED = _rid("SIGNAL-CLOSED-RUN-REJECTED")
SIGNAL_RECORDED = _rid("SIGNAL-RECORDED-AND-WAKES")
UPDATE_CLOSED = _rid("UPDATE-CLOSED-RUN-REJECTED")
UPDATE_RECORDED = _rid("UPDATE-ACCEPTED-RECORDED")
UPDATE_ONCE = _rid("UPDATE-CLOSED-AT-MOST-ONCE")
UPDATE_WAIT_REQ = _rid("UPDATE-WAIT-COMPLETED")

# Which requirement a wrong workflow-task answer breaks, by the rejection the model expected.
WF_REQUIREMENT_FOR = {
    "run_closed": "CANCEL-TASK-RUN-CLOSED",
    "lease_expired": "EXPIRY-HOLDER-FENCED",
    "task_not_leased": "FENCE-AFTER-COMPLETE",
    "lease_owner_mismatch": "FENCE-OWNER",
    "workflow_task_attempt_mismatch": "FENCE-ATTEMPT",
}
# Which requirement a wrong query-task answer breaks, by the rejection the model expected.
QUERY_REQUIREMENT_FOR = {
    "lease_owner_mismatch": "QUERY-FENCE-OWNER",
    "query_task_attempt_mismatch": "QUERY-FENCE-ATTEMPT",
    "query_task_not_leased": "QUERY-LATE-COMPLETE-NOT-LEASED",
    "lease_expired": "QUERY-LATE-COMPLETE-NOT-LEASED",
}
# What the control-plane query answers once the worker's answer landed (§10.4).
QUERY_ANSWERS: dict[str, tuple[str | None, int, str]] = {
    # answer -> (failure.reason sent, status the caller gets, requirement)
    "complete": (None, 200, "QUERY-RESULT-ROUNDTRIP"),
    "unknown": ("rejected_unknown_query", 404, "QUERY-UNKNOWN-404"),
    "rejected": ("query_rejected", 409, "QUERY-REJECTED-409"),
    "custom": ("conformance_custom_failure", 409, "QUERY-REJECTED-409"),
}
BATCHES = ("timer", "complete", "complete_update", "fail_update", "timer_and_update", "close_update_again")


class Slot(Enum):
    """The run's one workflow-task slot (SDK-INTEROP §6.2 "Keep at most one outstanding task per run")."""

    NONE = "none"  # no open task: the run waits (or is closed)
    READY = "ready"  # exactly one open task, not leased (its id is not known yet)
    LEASED = "leased"  # exactly one open task, RunM.task (its lease may have expired)
    MAYBE = "maybe"  # the protocol allows no task or one (a closed update was the only news)


@dataclass(eq=False)
class TaskM:
    task_id: str
    run: RunM
    attempt: int
    owner: str
    expires: datetime
    status: TaskStatus = TaskStatus.LEASED
    uncertain: bool = False

    def __repr__(self) -> str:
        return f"TaskM({self.task_id!r}#{self.attempt})"


@dataclass(eq=False)
class RunM:
    workflow_id: str
    run_id: str
    status: RunStatus = RunStatus.PENDING
    closed_reason: str | None = None
    slot: Slot = Slot.READY
    task: TaskM | None = None
    pending: set[str] = field(default_factory=set)  # wakes that arrived while its task was leased
    coalesced: int = 0  # wakes that arrived while an open task existed
    queried: bool = False  # a query touched it since its slot last emptied
    open_updates: dict[str, str] = field(default_factory=dict)  # update_id -> name
    closed_updates: set[str] = field(default_factory=set)
    signals: dict[str, bool | None] = field(default_factory=dict)  # name -> accepted (None: unknown)
    signal_copies: dict[str, int] = field(default_factory=dict)  # name -> how often it may have been applied
    refused_updates: set[str] = field(default_factory=set)  # names refused on a closed run
    accepted_updates: dict[str, str] = field(default_factory=dict)  # update_id -> name
    uncertain: bool = False  # a request about it got no answer: maybe applied

    @property
    def open(self) -> bool:
        return self.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)

    def __repr__(self) -> str:
        return f"RunM({self.workflow_id!r})"


class QuerySignalMachine(MachineBase):
    """Queries, signals and updates against running and closed runs, judged by the model."""

    name = "queries_signals"
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "QUERY-TASK-CREATED": "query_leased",
        "QUERY-READ-ONLY": "query_read_only_checked",
        "QUERY-RESULT-ROUNDTRIP": "query_result_roundtrip",
        "QUERY-UNKNOWN-404": "query_unknown_404",
        "QUERY-REJECTED-409": "query_rejected_409",
        "QUERY-FENCE-OWNER": "query_fenced_owner",
        "QUERY-FENCE-ATTEMPT": "query_fenced_attempt",
        "QUERY-LATE-COMPLETE-NOT-LEASED": "query_late_report_fenced",
        "CONTROL-CANCEL-CLOSES-RUN": "closed_run_command_refused",
        "CANCEL-NO-NEW-LEASES": "run_closed_by_control",
        "LEASE-NOT-SHARED-WHILE-LIVE": "poll_while_wake_coalesced",
        "HISTORY-SEQUENCE-CONTIGUOUS": None,
        "HISTORY-ONE-TERMINAL-PER-RUN": None,
        **{rid: state for rid, (_, state) in PROPOSED.items() if rid in REGISTRY},
    }

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.queue = self.ctx.uid("q")
        self.workers: list[str] = []
        self.all_runs: list[RunM] = []
        self.run_by_id: dict[str, RunM] = {}
        self.task_by_id: dict[str, TaskM] = {}
        self.touched: set[str] = set()
        self.serial = itertools.count(1)
        self.turn = itertools.count()
        profile = self.target.test_profile if self.target else {}
        timeout = profile.get("query_task_timeout_seconds")
        self.query_timeout = DEFAULT_QUERY_TIMEOUT
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
            self.query_timeout = float(timeout)
        self.probes_left = PROBES_PER_EXAMPLE
        self.unprobed = False  # a wake was coalesced or a query ran since the last empty-queue probe

    # -- model helpers -------------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(UTC)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.serial)}"

    def next_worker(self) -> str:
        return self.workers[next(self.turn) % len(self.workers)]

    def ready_runs(self) -> list[RunM]:
        """Runs the model knows have a claimable task: ready, or leased with a lease long expired."""
        before = self.now() - timedelta(seconds=MARGIN)
        return [
            r
            for r in self.all_runs
            if r.open
            and not r.uncertain
            and (r.slot is Slot.READY or (r.slot is Slot.LEASED and r.task is not None and r.task.expires < before))
        ]

    def unsure(self) -> bool:
        """Whether some open run may hold a task the model cannot count."""
        return any(r.open and (r.uncertain or r.slot is Slot.MAYBE) for r in self.all_runs)

    def leased_tasks(self) -> list[TaskM]:
        """Tasks the model holds a lease on (live, expired, or of a run closed since), newest first."""
        return [t for t in reversed(self.task_by_id.values()) if t.status is TaskStatus.LEASED and not t.uncertain]

    def update_candidates(self) -> list[RunM]:
        """Open runs the worker can serve an update on: no lease, or a lease with time to spare."""
        soon = self.now() + timedelta(seconds=MARGIN + 1.5)
        return [
            r
            for r in self.all_runs
            if r.open
            and not r.uncertain
            and (
                r.slot in (Slot.NONE, Slot.READY)
                or (r.slot is Slot.LEASED and r.task is not None and r.task.expires > soon)
            )
        ]

    def wake(self, run: RunM, cause: str) -> None:
        """A signal or update reached an open run: it gets a task, or the news joins its open one."""
        if run.slot is Slot.NONE:
            run.slot = Slot.READY
            if run.status is RunStatus.WAITING:
                run.status = RunStatus.RUNNING
            return
        run.coalesced += 1
        self.unprobed = True
        if run.slot is Slot.LEASED:
            run.pending.add(cause)
            if run.task is not None and run.task.expires > self.now():
                self.reached("wake_coalesced_while_leased")
        else:
            run.slot = Slot.READY  # READY stays READY; MAYBE becomes certain: one task either way
            self.reached("wake_coalesced_while_ready")

    def close(self, run: RunM, status: RunStatus, reason: str) -> None:
        run.status, run.closed_reason = status, reason
        run.slot, run.pending = Slot.NONE, set()

    def wf_outcomes(self, task: TaskM, at: datetime) -> set[str]:
        """The outcomes §8.9 allows for the holder's call at ``at`` ± MARGIN ('ok' or a reason)."""
        run = task.run
        view = WorkflowTaskView(
            task.task_id, task.status, task.attempt, task.owner, task.expires, run.status, run.closed_reason, None
        )
        outs = set()
        for moment in (at - timedelta(seconds=MARGIN), at + timedelta(seconds=MARGIN)):
            try:
                guard_workflow_task(
                    view, task_id=task.task_id, lease_owner=task.owner, attempt=task.attempt, now=moment
                )
                outs.add("ok")
            except Rejection as rej:
                outs.add(rej.reason)
        return outs

    def query_outcomes(
        self, view: QueryTaskView, owner: str, attempt: int, deadline: tuple[datetime, datetime]
    ) -> set[str]:
        """The outcomes §10.6 allows now ± MARGIN. Past the query deadline a live task counts as timed out;
        the server set that deadline somewhere in ``deadline`` (between sending the query and leasing it)."""
        earliest, latest = deadline
        outs = set()
        at = self.now()
        live = view.status in (QueryTaskStatus.PENDING, QueryTaskStatus.LEASED)
        # The earliest moment against the latest deadline, the latest moment against the earliest one.
        for moment, due in ((at - timedelta(seconds=MARGIN), latest), (at + timedelta(seconds=MARGIN), earliest)):
            status = QueryTaskStatus.TIMED_OUT if live and moment >= due else view.status
            seen = QueryTaskView(view.query_task_id, status, view.attempt, view.lease_owner, view.lease_expires_at)
            try:
                guard_query_task(seen, query_task_id=view.query_task_id, lease_owner=owner, attempt=attempt, now=moment)
                outs.add("ok")
            except Rejection as rej:
                outs.add(rej.reason)
        return outs

    @staticmethod
    def outcome(reply: Reply) -> str:
        return "ok" if reply.status == 200 else (reply.reason or f"http_{reply.status}")

    # -- requests ------------------------------------------------------------------------------------

    def history(self, run: RunM) -> list[dict[str, Any]]:
        return self.run(self.ctx.history(run.workflow_id, run.run_id))

    def snapshot(self, run: RunM) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
        describe = self.run(self.ctx.describe(run.workflow_id))
        events = [(e.get("sequence"), e.get("event_type")) for e in self.history(run)]
        return describe, events

    def poll_shape(self, reply: Reply, what: str) -> dict[str, Any]:
        body = reply.json()
        if reply.status != 200 or "poll_status" not in body:
            raise self.violation(
                "POLL-STATUS-PRESENT",
                f"a {what} poll of a registered worker answers 200 with poll_status",
                expected="200 with poll_status",
                received=f"{reply.status} {reply.reason} keys={sorted(body)}",
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

    def note_coalesced_poll(self) -> None:
        live = self.now()
        if any(
            r.open and r.slot is Slot.LEASED and r.pending and r.task is not None and r.task.expires > live
            for r in self.all_runs
        ):
            self.reached("poll_while_wake_coalesced")

    # -- leases --------------------------------------------------------------------------------------

    def adopt(self, task_obj: dict[str, Any], worker: str, sent: datetime, reply: Reply) -> TaskM:
        """Judge a granted workflow-task lease against the run's slot, then record it."""
        sent = self.sent_of(reply, sent)
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
        task_id = str(task_obj.get("task_id"))
        attempt = task_obj.get("workflow_task_attempt")
        expires = parse_rfc3339(task_obj.get("lease_expires_at"))
        if not isinstance(attempt, int):
            raise self.violation(
                "LEASE-FIRST-ATTEMPT", "workflow_task_attempt is an integer", received=attempt, replies=[reply]
            )
        if not run.uncertain:
            self.judge_slot(run, task_id, attempt, sent, reply)
        task = self.task_by_id.get(task_id)
        if task is None:
            task = TaskM(task_id, run, attempt, worker, expires)
            self.task_by_id[task_id] = task
        else:  # a redelivery of the same task after its lease expired
            task.attempt, task.owner, task.expires = attempt, worker, expires
            task.status, task.uncertain = TaskStatus.LEASED, False
        run.task, run.slot, run.pending, run.queried = task, Slot.LEASED, set(), False
        if run.status is RunStatus.WAITING:
            run.status = RunStatus.RUNNING
        self.reached("lease_granted")
        return task

    def judge_slot(self, run: RunM, task_id: str, attempt: int, sent: datetime, reply: Reply) -> None:
        """At most one open workflow task per run, and a live lease is never handed out again."""
        if not run.open:
            raise self.violation(
                "CANCEL-NO-NEW-LEASES",
                f"a task of {run.status.value} run {run.run_id} was leased",
                expected="no lease",
                received=task_id,
                replies=[reply],
            )
        current = run.task if run.slot is Slot.LEASED else None
        if current is not None:
            if task_id != current.task_id:
                raise self.violation(
                    "LEASE-NOT-SHARED-WHILE-LIVE",
                    f"run {run.run_id} got a second open workflow task {task_id} while {current.task_id} "
                    f"(attempt {current.attempt}, leased to {current.owner} until {current.expires}) is still open: "
                    f"{run.coalesced} wake(s) arrived while a task was open and must have been coalesced into it",
                    expected=f"no task, or {current.task_id} again once its lease expired",
                    received=f"{task_id}#{attempt}",
                    replies=[reply],
                )
            if current.expires > sent + timedelta(seconds=MARGIN):
                raise self.violation(
                    "LEASE-NOT-SHARED-WHILE-LIVE",
                    f"task {task_id} was leased again while its lease to {current.owner} was live",
                    expected=f"no lease before {current.expires}",
                    received=f"{task_id}#{attempt}",
                    replies=[reply],
                )
            if attempt != current.attempt + 1:
                raise self.violation(
                    "EXPIRY-REDELIVER-SAME-TASK",
                    f"redelivery of {task_id} after its lease expired",
                    expected=f"attempt {current.attempt + 1}",
                    received=attempt,
                    replies=[reply],
                )
            return
        if run.slot is Slot.NONE:
            if run.coalesced:
                req, why = (
                    "LEASE-NOT-SHARED-WHILE-LIVE",
                    (f"{run.coalesced} wake(s) arrived while a task was open; one of them made a second task"),
                )
            elif run.queried:
                req, why = "QUERY-READ-ONLY", "a query made a workflow task"
            else:
                req, why = "COMMANDS-NON-TERMINAL-WAITING", "a non-terminal batch left the run with a task"
            raise self.violation(
                req,
                f"run {run.run_id} has no pending change, yet task {task_id} was leased: {why}",
                expected="no task for a waiting run",
                received=f"{task_id}#{attempt}",
                replies=[reply],
            )

    def poll_once(self, worker: str) -> tuple[Reply | None, datetime]:
        sent = self.now()
        self.note_coalesced_poll()
        reply = self.call(self.ctx.poll_wf(worker, self.queue, 1))
        if reply is None or reply.resent:
            self.lost_poll()
        return reply, sent

    def lost_poll(self) -> None:
        """A poll without an answer (or resent after one was lost) may have leased any ready run's task."""
        for r in self.all_runs:
            if r.slot is Slot.READY:
                r.uncertain = True

    def lease_run_task(self, run: RunM, why: str) -> TaskM | None:
        """Poll until the run's ready task is leased (adopting any other run's ready task on the way)."""
        for _ in range(len(self.all_runs) + 2):
            worker = self.next_worker()
            reply, sent = self.poll_once(worker)
            if reply is None:
                run.uncertain = True
                return None
            body = self.poll_shape(reply, "workflow-task")
            task_obj = body.get("task")
            if not isinstance(task_obj, dict):
                if body.get("poll_status") == "throttled" or run.uncertain:
                    return None
                raise self.violation(
                    SIGNAL_RECORDED if why == "signal" else UPDATE_RECORDED,
                    f"run {run.run_id} was woken by an accepted {why} but no workflow task could be leased",
                    expected="a leased workflow task of the run",
                    received=body.get("poll_status"),
                    replies=[reply],
                )
            task = self.adopt(task_obj, worker, sent, reply)
            if task.run is run:
                return task
        return None

    # -- the complete path ---------------------------------------------------------------------------

    def batch(self, run: RunM, kind: str) -> tuple[list[dict[str, Any]], set[str], bool]:
        """The commands for ``kind``, the update ids it closes, and whether the protocol calls it invalid."""
        timer = {"type": "start_timer", "delay_seconds": 3600}
        open_ids = sorted(run.open_updates)
        if kind == "complete":
            return [{"type": "complete_workflow", "result": self.ctx.envelope("done")}], set(), False
        if kind in ("complete_update", "fail_update", "timer_and_update") and open_ids:
            uid = open_ids[0]
            if kind == "fail_update":
                return [{"type": "fail_update", "update_id": uid, "message": "conformance"}], {uid}, False
            close = {"type": "complete_update", "update_id": uid, "result": self.ctx.envelope(uid)}
            return ([timer, close] if kind == "timer_and_update" else [close]), {uid}, False
        if kind == "close_update_again":
            if run.closed_updates:
                uid = sorted(run.closed_updates)[0]
                return [{"type": "complete_update", "update_id": uid}], set(), True
            if open_ids:  # the same open update closed twice in one batch
                uid = open_ids[0]
                twice = [{"type": "complete_update", "update_id": uid}, {"type": "fail_update", "update_id": uid}]
                twice[1]["message"] = "twice"
                return twice, set(), True
            return [{"type": "complete_update", "update_id": self.unique("no-such-update")}], set(), True
        return [timer], set(), False

    def complete(
        self, task: TaskM, commands: list[dict[str, Any]], closes: set[str], invalid: bool, label: str
    ) -> str | None:
        """The holder completes ``task`` with ``commands``; judged, then applied to the model."""
        run = task.run
        allowed = self.wf_outcomes(task, self.now())
        if invalid and "ok" in allowed:
            allowed = (allowed - {"ok"}) | {"invalid_commands", "validation_failed"}
        reply = self.call(
            self.ctx.complete({"task_id": task.task_id}, commands, owner=task.owner, attempt=task.attempt)
        )
        if reply is None:
            task.uncertain = run.uncertain = True
            return None
        self.touched.add(run.run_id)
        got = self.outcome(reply)
        if not (task.uncertain or run.uncertain) and got not in allowed:
            rejections = sorted(allowed - {"ok"})
            if invalid and got == "ok":
                req = UPDATE_ONCE
            elif got != "ok" and "ok" in allowed:
                req = UPDATE_RECORDED if closes and got == "invalid_commands" else "FENCE-NO-STATE-CHANGE"
            else:
                req = next((WF_REQUIREMENT_FOR[r] for r in rejections if r in WF_REQUIREMENT_FOR), "FENCE-ORDER")
            raise self.violation(
                req,
                f"workflow-task complete ({label}): the model allows {sorted(allowed)}",
                expected=" or ".join(sorted(allowed)),
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
        if got == "run_closed":
            task.status = TaskStatus.CANCELLED  # §9.1: the run's close cancelled it; stop offering it
            self.reached("complete_on_closed_run")
        if invalid and got in ("invalid_commands", "validation_failed"):
            self.reached("update_double_close_rejected")
        if got != "ok":
            return got
        task.status = TaskStatus.COMPLETED
        for uid in closes:
            run.open_updates.pop(uid, None)
            run.closed_updates.add(uid)
            self.reached("update_closed_by_task")
        if any(c.get("type") == "complete_workflow" for c in commands):
            self.close(run, RunStatus.COMPLETED, "completed")
        else:
            news = run.pending - {f"update:{uid}" for uid in closes}
            if news:
                run.slot = Slot.READY  # coalesced news needs a follow-up task
                self.reached("follow_up_task_expected")
            elif run.pending:
                run.slot = Slot.MAYBE  # the only news was the update this batch just closed
            else:
                run.slot, run.status = Slot.NONE, RunStatus.WAITING
            run.pending, run.task, run.queried = set(), None, False
        return got

    # -- rules: runs and workflow tasks ----------------------------------------------------------------

    @initialize()
    def register_workers(self) -> None:
        for i in range(WORKERS):
            self.workers.append(self.run(self.ctx.register(self.queue, worker_id=self.ctx.uid(f"w{i}"))))

    @rule(target=runs)
    def start(self) -> RunM:
        wid, run_id = self.run(self.ctx.start(self.queue, input=["queries-signals"]))
        run = RunM(wid, run_id)
        self.all_runs.append(run)
        self.run_by_id[run_id] = run
        self.touched.add(run_id)
        return run

    @precondition(lambda self: bool(self.ready_runs()))
    @rule(worker=st.integers(0, WORKERS - 1))
    def poll(self, worker: int) -> None:
        """One poll while the model knows of ready work: it must lease something."""
        wid = self.workers[worker]
        reply, sent = self.poll_once(wid)
        if reply is None:
            return
        body = self.poll_shape(reply, "workflow-task")
        task_obj = body.get("task")
        if isinstance(task_obj, dict):
            self.adopt(task_obj, wid, sent, reply)
            return
        if body.get("poll_status") == "throttled" or self.unsure():
            return
        ready = self.ready_runs()
        if ready:
            raise self.violation(
                SIGNAL_RECORDED,
                f"{len(ready)} run(s) have a ready workflow task (started, or woken by a signal or update), "
                "yet the poll leased nothing",
                expected="a leased task",
                received=body.get("poll_status"),
                replies=[reply],
            )

    @precondition(lambda self: len(self.ready_runs()) >= 2)
    @rule()
    def race_polls(self) -> None:
        """As many workers as there are ready runs poll at once: no run's task is leased twice."""
        n = min(WORKERS, len(self.ready_runs()))
        sent = self.now()
        self.note_coalesced_poll()
        results = self.run(race(n, lambda i: self.ctx.poll_wf(self.workers[i], self.queue, 1)))
        granted: dict[tuple[str, Any], Reply] = {}
        for i, res in enumerate(results):
            if isinstance(res, HarnessError):
                self.reached("response_lost")
                self.lost_poll()
                continue
            if isinstance(res, BaseException):
                raise res
            if res.resent:
                self.lost_poll()
            note(res.exchange.summary())
            task_obj = self.poll_shape(res, "workflow-task").get("task")
            if not isinstance(task_obj, dict):
                continue
            key = (str(task_obj.get("task_id")), task_obj.get("workflow_task_attempt"))
            if key in granted:
                raise self.violation(
                    "LEASE-EXCLUSIVE",
                    f"two concurrent polls were granted {key}",
                    expected="one lease",
                    received=2,
                    replies=[granted[key], res],
                )
            granted[key] = res
            self.adopt(task_obj, self.workers[i], sent, res)
        if len(granted) >= 2:
            self.reached("race_leased_several")

    @precondition(lambda self: self.probes_left > 0 and self.unprobed and not self.ready_runs() and not self.unsure())
    @rule()
    def probe_quiet_queue(self) -> None:
        """Every known task is leased or none is due, after coalesced wakes or queries: two racing polls
        must lease nothing new (a second task of a run, or a task made by a query, would show here)."""
        self.probes_left -= 1
        self.unprobed = False
        sent = self.now()
        self.note_coalesced_poll()
        results = self.run(race(2, lambda i: self.ctx.poll_wf(self.workers[i], self.queue, 1)))
        for i, res in enumerate(results):
            if isinstance(res, HarnessError):
                self.reached("response_lost")
                self.lost_poll()
                continue
            if isinstance(res, BaseException):
                raise res
            if res.resent:
                self.lost_poll()
            note(res.exchange.summary())
            task_obj = self.poll_shape(res, "workflow-task").get("task")
            if isinstance(task_obj, dict):
                self.adopt(task_obj, self.workers[i], sent, res)
        self.reached("quiet_queue_probed")

    @precondition(lambda self: bool(self.leased_tasks()))
    @rule(pick=st.integers(0, 7), kind=st.sampled_from(BATCHES))
    def complete_task(self, pick: int, kind: str) -> None:
        tasks = self.leased_tasks()
        task = tasks[pick % len(tasks)]
        commands, closes, invalid = self.batch(task.run, kind)
        self.complete(task, commands, closes, invalid, kind)

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
            status = RunStatus.CANCELLED if kind == "cancel" else RunStatus.TERMINATED
            self.close(run, status, status.value)
            self.reached("run_closed_by_control")
        elif reply.status != 409:
            raise self.violation(
                "CONTROL-CANCEL-CLOSES-RUN",
                f"{kind} of a closed run is refused",
                expected=409,
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
        else:
            self.reached("closed_run_command_refused")

    # -- rules: signals and updates ------------------------------------------------------------------

    @rule(run=runs, n=st.integers(1, 3))
    def signal(self, run: RunM, n: int) -> None:
        """n signals released together: an open run accepts and records each, a closed one refuses all."""
        names = [self.unique("sig") for _ in range(n)]
        results = self.run(
            race(
                n,
                lambda i: self.ctx.client.control(
                    "POST", f"/workflows/{run.workflow_id}/signal/{names[i]}", {"input": [names[i]]}
                ),
            )
        )
        self.touched.add(run.run_id)
        for name, res in zip(names, results, strict=True):
            if isinstance(res, HarnessError):
                self.reached("response_lost")
                run.uncertain = True
                run.signals[name] = None
                run.signal_copies[name] = res.copies if isinstance(res, Indeterminate) else 1
                continue
            if isinstance(res, BaseException):
                raise res
            note(res.exchange.summary())
            if run.uncertain:
                run.signals[name] = None
                continue
            if run.open:
                body = res.json()
                if res.status != 202 or body.get("outcome") != "signal_received":
                    raise self.violation(
                        SIGNAL_RECORDED,
                        f"a signal to open run {run.run_id} is accepted",
                        expected='202 outcome "signal_received"',
                        received=f"{res.status} {res.reason} outcome={body.get('outcome')!r}",
                        replies=[res],
                    )
                run.signals[name] = True
                self.wake(run, f"signal:{name}")
                self.reached("signal_recorded")
            else:
                if res.status != 409:
                    raise self.violation(
                        SIGNAL_CLOSED,
                        f"a signal to {run.status.value} run {run.run_id} is refused",
                        expected="409 rejected_not_active",
                        received=f"{res.status} {res.reason}",
                        replies=[res],
                    )
                run.signals[name] = False
                self.reached("signal_closed_run_refused")
                self.reached("closed_run_command_refused")

    @rule(run=runs)
    def update_accepted(self, run: RunM) -> None:
        """An update returning at acceptance: 202 and an UpdateAccepted on an open run, 409 on a closed one."""
        name = self.unique("upd")
        reply = self.call(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/update/{name}", {"input": [name], "wait_for": "accepted"}
            )
        )
        if reply is None:
            run.uncertain = True
            return
        self.touched.add(run.run_id)
        body = reply.json()
        if run.uncertain:
            return
        if not run.open:
            if reply.status != 409:
                raise self.violation(
                    UPDATE_CLOSED,
                    f"an update to {run.status.value} run {run.run_id} is refused",
                    expected="409 rejected_not_active",
                    received=f"{reply.status} {reply.reason}",
                    replies=[reply],
                )
            run.refused_updates.add(name)
            self.reached("update_closed_run_refused")
            self.reached("closed_run_command_refused")
            return
        uid = body.get("update_id")
        if reply.status != 202 or body.get("update_status") != "accepted" or not isinstance(uid, str) or not uid:
            raise self.violation(
                UPDATE_RECORDED,
                f"an update with wait_for accepted on open run {run.run_id}",
                expected='202 update_status "accepted" with an update_id',
                received=f"{reply.status} {reply.reason} {body.get('update_status')!r} {uid!r}",
                replies=[reply],
            )
        run.open_updates[uid] = name
        run.accepted_updates[uid] = name
        self.wake(run, f"update:{uid}")
        self.reached("update_accepted")

    def await_accepted(self, run: RunM, name: str, call: asyncio.Task[Reply]) -> str | None:
        """The update_id of a blocking update, read from the run's history once UpdateAccepted is there."""

        async def find() -> str | None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while loop.time() < deadline and not call.done():
                for e in await self.ctx.history(run.workflow_id, run.run_id):
                    payload = e.get("payload")
                    if (
                        e.get("event_type") == "UpdateAccepted"
                        and isinstance(payload, dict)
                        and payload.get("update_name") == name
                        and isinstance(payload.get("update_id"), str)
                    ):
                        return str(payload["update_id"])
                await asyncio.sleep(0.05)
            return None

        found = self.run(find())
        if found is not None:
            return found
        if call.done() and isinstance(call.exception(), HarnessError):
            run.uncertain = True
            return None
        reply = call.result() if call.done() and call.exception() is None else None
        raise self.violation(
            UPDATE_RECORDED,
            f"a blocking update {name!r} on open run {run.run_id} records UpdateAccepted and waits",
            expected="UpdateAccepted in history while the call waits",
            received=f"{reply.status} {reply.reason}" if reply is not None else "no UpdateAccepted within 5 s",
            replies=[reply] if reply is not None else None,
        )

    @precondition(lambda self: bool(self.update_candidates()))
    @rule(pick=st.integers(0, 7), verdict=st.sampled_from(["complete_update", "fail_update"]))
    def update_completed(self, pick: int, verdict: str) -> None:
        """An update with wait_for completed blocks while the machine, as the worker, leases the run's task
        and closes the update; the waiting call then returns the result (200) or the failure (422)."""
        runs = self.update_candidates()
        run = runs[pick % len(runs)]
        name = self.unique("upd")
        body = {"input": [name], "wait_for": "completed", "wait_timeout_seconds": UPDATE_WAIT}
        call = self.loop.create_task(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/update/{name}", body, timeout=UPDATE_WAIT + 15
            )
        )
        try:
            self.touched.add(run.run_id)
            uid = self.await_accepted(run, name, call)
            if uid is None:
                return
            run.open_updates[uid] = name
            run.accepted_updates[uid] = name
            self.wake(run, f"update:{uid}")
            task = run.task if run.slot is Slot.LEASED else self.lease_run_task(run, "update")
            if task is None:
                return
            result = self.ctx.envelope({"update": name})
            if verdict == "complete_update":
                commands = [{"type": "complete_update", "update_id": uid, "result": result}]
            else:
                commands = [{"type": "fail_update", "update_id": uid, "message": f"conformance {name}"}]
            if self.complete(task, commands, {uid}, False, verdict) != "ok":
                return  # a rejection the model allowed: nobody closes the update, the call keeps waiting
            try:
                reply = self.run(outcome_of(call))
            except HarnessError:
                self.reached("response_lost")
                return
            note(reply.exchange.summary())
            self.judge_update_reply(reply, verdict, result)
        finally:
            self.run(settle(call))

    def judge_update_reply(self, reply: Reply, verdict: str, result: dict[str, str]) -> None:
        body = reply.json()
        expected: Any
        if verdict == "complete_update":
            env = body.get("result_envelope")
            blob = env.get("blob") if isinstance(env, dict) else None
            ok = reply.status == 200 and body.get("update_status") == "completed" and blob == result["blob"]
            expected = {"status": 200, "update_status": "completed", "result_envelope.blob": result["blob"]}
        else:
            ok = reply.status == 422 and reply.reason == "update_failed"
            expected = "422 update_failed"
        if not ok:
            raise self.violation(
                UPDATE_WAIT_REQ,
                f"the blocking update after the worker's {verdict}",
                expected=expected,
                received={"status": reply.status, **{k: body.get(k) for k in ("reason", "update_status")}},
                replies=[reply],
            )
        self.reached("update_wait_completed")

    # -- rules: queries ------------------------------------------------------------------------------

    def lease_query(self, run: RunM, name: str, call: asyncio.Task[Reply], worker: str) -> dict[str, Any] | None:
        """Poll query tasks until this query's task is leased to ``worker``."""
        loop_deadline = self.now() + timedelta(seconds=self.query_timeout + 2)
        while self.now() < loop_deadline:
            if call.done():
                if isinstance(call.exception(), HarnessError):
                    return None
                early = call.result()
                raise self.violation(
                    "QUERY-TASK-CREATED",
                    "the query ended before any worker leased its query task",
                    expected="a query task for a registered, polling worker",
                    received=f"{early.status} {early.reason}",
                    replies=[early],
                )
            reply = self.call(
                self.ctx.client.worker(
                    "/query-tasks/poll",
                    {"worker_id": worker, "task_queue": self.queue, "timeout_seconds": 1},
                    timeout=16,
                )
            )
            if reply is None:
                return None
            task = self.poll_shape(reply, "query-task").get("task")
            if not isinstance(task, dict):
                continue
            if task.get("query_name") != name:
                note(f"leased a leftover query task {task.get('query_task_id')} ({task.get('query_name')})")
                continue
            problems = [
                f"{key}={task.get(key)!r}, expected {want!r}"
                for key, want in (
                    ("query_task_attempt", 1),
                    ("lease_owner", worker),
                    ("run_id", run.run_id),
                    ("workflow_id", run.workflow_id),
                )
                if task.get(key) != want
            ]
            if problems:
                raise self.violation(
                    "QUERY-TASK-CREATED",
                    "the leased query task describes the query that was sent",
                    expected="attempt 1, the poller as lease_owner, the queried run",
                    received=problems,
                    replies=[reply],
                )
            self.reached("query_leased")
            return task
        return None

    def query_report(
        self,
        view: QueryTaskView,
        verb: str,
        body: dict[str, Any],
        owner: str,
        attempt: int,
        deadline: tuple[datetime, datetime],
    ) -> str | None:
        allowed = self.query_outcomes(view, owner, attempt, deadline)
        reply = self.call(
            self.ctx.client.worker(
                f"/query-tasks/{view.query_task_id}/{verb}",
                {"lease_owner": owner, "query_task_attempt": attempt, **body},
            )
        )
        if reply is None:
            return None
        got = self.outcome(reply)
        if got not in allowed:
            rejections = sorted(allowed - {"ok"})
            if "ok" in allowed and got != "ok":
                req = "QUERY-RESULT-ROUNDTRIP"
            else:
                req = next(
                    (QUERY_REQUIREMENT_FOR[r] for r in rejections if r in QUERY_REQUIREMENT_FOR), "QUERY-FENCE-OWNER"
                )
            raise self.violation(
                req,
                f"query-task {verb} by {owner} attempt {attempt}: the model allows {sorted(allowed)}",
                expected=" or ".join(sorted(allowed)),
                received=f"{reply.status} {reply.reason}",
                replies=[reply],
            )
        if got != "ok" and reply.json().get("outcome") != "rejected":
            raise self.violation(
                QUERY_REQUIREMENT_FOR.get(got, "QUERY-FENCE-OWNER"),
                f'a fenced query-task {verb} carries outcome "rejected" (§10.6)',
                expected="rejected",
                received=reply.json().get("outcome"),
                replies=[reply],
            )
        return got

    @rule(
        run=runs,
        fence=st.sampled_from(["none", "owner", "attempt", "both"]),
        late=st.sampled_from(["none", "complete", "fail"]),
    )
    def query_answered(self, run: RunM, fence: str, late: str) -> None:
        """A query the worker answers with a result envelope: the caller gets it back unchanged (200)."""
        self.query(run, "complete", fence, late)

    @rule(
        run=runs,
        answer=st.sampled_from(["unknown", "rejected", "custom"]),
        fence=st.sampled_from(["none", "owner", "attempt", "both"]),
        late=st.sampled_from(["none", "complete", "fail"]),
    )
    def query_refused(self, run: RunM, answer: str, fence: str, late: str) -> None:
        """A query the worker fails: rejected_unknown_query is 404 to the caller, any other reason 409."""
        self.query(run, answer, fence, late)

    def query(self, run: RunM, answer: str, fence: str, late: str) -> None:
        """Query a running or closed run: the machine is the query worker (with intruders before and a late
        second report after); the caller gets the answer's status, and neither history nor describe change."""
        name = self.unique("qry")
        if not run.open:
            self.reached("query_on_closed_run")
        elif run.slot is Slot.LEASED and run.task is not None and run.task.expires > self.now():
            self.reached("query_while_leased")
        before = self.snapshot(run)
        worker, intruder = self.workers[0], self.workers[1]
        sent = self.now()
        call = self.loop.create_task(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/query/{name}", {"input": [name]}, timeout=self.query_timeout + 15
            )
        )
        landed: bool | None = None  # did the worker's answer land (None: unknown)
        try:
            task = self.lease_query(run, name, call, worker)
            if task is None:
                return
            leased_at = self.now()
            timeout = timedelta(seconds=self.query_timeout)
            deadline = (sent + timeout, leased_at + timeout)
            attempt = int(task["query_task_attempt"])
            view = QueryTaskView(
                str(task["query_task_id"]),
                QueryTaskStatus.LEASED,
                attempt,
                worker,
                parse_rfc3339(task.get("lease_expires_at")),
            )
            stolen = {"result_envelope": self.ctx.envelope("stolen")}
            if fence in ("owner", "both"):
                got = self.query_report(view, "complete", stolen, intruder, attempt, deadline)
                if got == "lease_owner_mismatch":
                    self.reached("query_fenced_owner")
            if fence in ("attempt", "both"):
                got = self.query_report(view, "complete", stolen, worker, attempt + 1, deadline)
                if got == "query_task_attempt_mismatch":
                    self.reached("query_fenced_attempt")
            reason, want_status, req = QUERY_ANSWERS[answer]
            result = self.ctx.envelope({"query": name})
            if reason is None:
                verb, body = "complete", {"result_envelope": result}
            else:
                verb, body = "fail", {"failure": {"message": f"conformance {answer}", "reason": reason}}
            got = self.query_report(view, verb, body, worker, attempt, deadline)
            landed = None if got is None else got == "ok"
            if landed:
                status = QueryTaskStatus.COMPLETED if verb == "complete" else QueryTaskStatus.FAILED
                view = QueryTaskView(view.query_task_id, status, attempt, worker, view.lease_expires_at)
            if late != "none" and landed:
                late_body = (
                    {"result_envelope": self.ctx.envelope("late")}
                    if late == "complete"
                    else {"failure": {"message": "late"}}
                )
                if self.query_report(view, late, late_body, worker, attempt, deadline) == "query_task_not_leased":
                    self.reached("query_late_report_fenced")
            try:
                reply = self.run(outcome_of(call))
            except HarnessError:
                self.reached("response_lost")
                return
            note(reply.exchange.summary())
            self.judge_query_reply(reply, landed, answer, want_status, req, result)
        finally:
            self.run(settle(call))
            self.unprobed = self.unprobed or run.slot is Slot.NONE
            run.queried = True
        self.judge_read_only(run, before)

    def judge_query_reply(
        self, reply: Reply, landed: bool | None, answer: str, want: int, req: str, result: dict[str, str]
    ) -> None:
        if landed is None:
            return
        if not landed:
            if reply.status != 504:
                raise self.violation(
                    "QUERY-TIMEOUT-504",
                    "a query whose answer came too late times out",
                    expected="504 query_worker_timeout",
                    received=f"{reply.status} {reply.reason}",
                    replies=[reply],
                )
            return
        body = reply.json()
        blob = (
            (body.get("result_envelope") or {}).get("blob") if isinstance(body.get("result_envelope"), dict) else None
        )
        if reply.status != want or (answer == "complete" and blob != result["blob"]):
            expected = f"{want}" + (f" result_envelope.blob={result['blob']}" if answer == "complete" else "")
            raise self.violation(
                req,
                f"the control-plane query after the worker's {answer} answer",
                expected=expected,
                received=f"{reply.status} {reply.reason} blob={blob!r}",
                replies=[reply],
            )
        if answer == "unknown" and reply.reason != "rejected_unknown_query":
            raise self.violation(
                req,
                "reason of an unknown query",
                expected="rejected_unknown_query",
                received=reply.reason,
                replies=[reply],
            )
        self.reached(
            {
                "complete": "query_result_roundtrip",
                "unknown": "query_unknown_404",
                "rejected": "query_rejected_409",
                "custom": "query_rejected_409",
            }[answer]
        )

    def judge_read_only(self, run: RunM, before: tuple[dict[str, Any], list[tuple[Any, Any]]]) -> None:
        """History and describe right after the query equal those right before it."""
        if run.uncertain:
            return
        after = self.snapshot(run)
        extra = after[1][len(before[1]) :]
        prefix_same = after[1][: len(before[1])] == before[1]
        only_repairs = all(kind in NOT_QUERY_EVENTS for _, kind in extra)
        if not prefix_same or not only_repairs:
            raise self.violation(
                "QUERY-READ-ONLY",
                f"a query changed run {run.run_id}'s history",
                expected=f"{len(before[1])} events, unchanged",
                received=f"{len(after[1])} events; new: {extra}" if prefix_same else after[1],
            )
        if not extra and after[0] != before[0]:
            changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
            raise self.violation(
                "QUERY-READ-ONLY",
                f"a query changed what describe shows for run {run.run_id}",
                expected={k: before[0].get(k) for k in changed},
                received={k: after[0].get(k) for k in changed},
            )
        self.reached("query_read_only_checked")

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def histories_are_sound(self) -> None:
        """Touched runs: gap-free, one terminal event at most (exactly one once closed), nothing recorded
        after it, every accepted signal and update recorded once, every refused one never, every update
        closed at most once."""
        for run_id in sorted(self.touched):
            run = self.run_by_id[run_id]
            events = self.history(run)
            problem = check_sequences([e.get("sequence") for e in events])
            if problem:
                raise self.violation("HISTORY-SEQUENCE-CONTIGUOUS", f"run {run_id}: {problem}")
            kinds = [str(e.get("event_type")) for e in events]
            terminal = [i for i, k in enumerate(kinds) if k in TERMINAL_EVENTS]
            if len(terminal) > 1 or (not run.uncertain and not run.open and len(terminal) != 1):
                raise self.violation(
                    "HISTORY-ONE-TERMINAL-PER-RUN",
                    f"run {run_id} ({run.status.value}) has terminal events {[kinds[i] for i in terminal]}",
                    expected="exactly one once closed, none before",
                    received=[kinds[i] for i in terminal],
                )
            if terminal:
                late = [k for k in kinds[terminal[0] + 1 :] if k in ("SignalReceived", "UpdateAccepted")]
                if late:
                    raise self.violation(
                        SIGNAL_CLOSED if "SignalReceived" in late else UPDATE_CLOSED,
                        f"run {run_id} recorded {late} after its terminal event {kinds[terminal[0]]}",
                        expected="nothing recorded after the run closed",
                        received=late,
                    )
            self.judge_messages(run, events)
        note(f"checked {len(self.touched)} run histories")
        self.touched.clear()

    def judge_messages(self, run: RunM, events: list[dict[str, Any]]) -> None:
        signals: Counter[str] = Counter()
        accepted: Counter[str] = Counter()
        accepted_names: Counter[str] = Counter()
        completed: Counter[str] = Counter()
        for e in events:
            payload = e.get("payload") if isinstance(e.get("payload"), dict) else {}
            assert isinstance(payload, dict)
            kind = e.get("event_type")
            if kind == "SignalReceived":
                signals[str(payload.get("signal_name"))] += 1
            elif kind == "UpdateAccepted":
                accepted[str(payload.get("update_id"))] += 1
                accepted_names[str(payload.get("update_name"))] += 1
            elif kind == "UpdateCompleted":
                completed[str(payload.get("update_id"))] += 1
        twice = {uid: n for uid, n in completed.items() if n > 1}
        if twice:
            raise self.violation(
                UPDATE_ONCE,
                f"run {run.run_id} closed an update more than once",
                expected="UpdateCompleted at most once per update_id",
                received=twice,
            )
        for name, ok in run.signals.items():
            # Maybe sent: at most once, or twice when the network delivered it twice (suite.proxy).
            maybe = set(range(run.signal_copies.get(name, 1) + 1))
            want = {True: {1}, False: {0}, None: maybe}[ok]
            if signals[name] not in want:
                raise self.violation(
                    SIGNAL_CLOSED if ok is False else SIGNAL_RECORDED,
                    f"signal {name!r} ({'accepted' if ok else 'refused' if ok is False else 'maybe sent'}) on run "
                    f"{run.run_id} appears {signals[name]} time(s) as SignalReceived",
                    expected=" or ".join(str(n) for n in sorted(want)),
                    received=signals[name],
                )
        for uid in run.accepted_updates:
            if accepted[uid] != 1:
                raise self.violation(
                    UPDATE_RECORDED,
                    f"accepted update {uid} on run {run.run_id} appears {accepted[uid]} time(s) as UpdateAccepted",
                    expected=1,
                    received=accepted[uid],
                )
        for name in run.refused_updates:
            if accepted_names[name]:
                raise self.violation(
                    UPDATE_CLOSED,
                    f"refused update {name!r} on closed run {run.run_id} was recorded",
                    expected=0,
                    received=accepted_names[name],
                )


async def outcome_of(call: asyncio.Task[Reply]) -> Reply:
    """Await a background control-plane call (its HarnessError, if any, propagates)."""
    return await call


async def settle(call: asyncio.Task[Reply]) -> None:
    """Cancel a background control-plane call the rule no longer waits for."""
    if not call.done():
        call.cancel()
    with contextlib.suppress(BaseException):
        await call
