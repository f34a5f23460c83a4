"""The query, signal and update machine's judges: pure functions over what the machine sent and the target
answered (no I/O, no clock: time is an argument). Each raises :class:`~suite.protocol.errors.Violation` naming
the requirement a wrong answer breaks; the machine attaches the exchanges.

Some §12.2 rules had no requirement ID when the machine was written; :data:`PROPOSED` names the ID the machine
judges and the nearest registered ID it reports under until the registry has it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from suite.protocol.codec import encode_blob
from suite.protocol.errors import Violation
from suite.protocol.fencing import QueryTaskView, guard_query_task, outcome
from suite.protocol.history import RUN_TERMINAL_EVENTS
from suite.protocol.lifecycles import QueryTaskStatus
from suite.protocol.requirements import REGISTRY
from suite.text import plural

from .world import RunShadow, TaskShadow

__all__ = [
    "BATCHES",
    "BATCH_DRAWS",
    "PROPOSED",
    "QUERY_ANSWERS",
    "QUERY_REQUIREMENT_FOR",
    "SIGNAL_CLOSED",
    "SIGNAL_RECORDED",
    "UPDATE_CLOSED",
    "UPDATE_ONCE",
    "UPDATE_RECORDED",
    "UPDATE_WAIT_REQ",
    "WF_REQUIREMENT_FOR",
    "MessageRun",
    "MessageTask",
    "Slot",
    "batch",
    "judge_messages",
    "judge_query_reply",
    "judge_read_only",
    "judge_slot",
    "judge_update_reply",
    "query_outcomes",
]

# A lease repair may legitimately add this while a query runs (§9 "a repair adds RepairRequested").
NOT_QUERY_EVENTS = frozenset({"RepairRequested"})

# Proposed requirement ID -> (the registered ID reported until the proposed one exists, ledger state).
PROPOSED: dict[str, tuple[str, str]] = {
    # §12.2 signal row: "**409** for any other rejection, e.g. a closed run (`rejected_not_active`)".
    "SIGNAL-CLOSED-RUN-REJECTED": ("CONTROL-CANCEL-CLOSES-RUN", "signal_closed_run_refused"),
    # §12.2 "**202** `{…, outcome:"signal_received"}`"; Python SDK 2.12.0, Replay "Create a workflow task after each
    # external history change: … signal received".
    # Judged on every history read back; passed once a signal and an update accepted while a run's task was
    # leased were read in the next task's full history.
    "SIGNAL-RECORDED-AND-WAKES": ("DISPATCH-LOST-NOTIFICATION", "signal_and_update_while_leased_read"),
    # §12.2 update row: "409 for other rejections (closed run)".
    "UPDATE-CLOSED-RUN-REJECTED": ("CONTROL-CANCEL-CLOSES-RUN", "update_closed_run_refused"),
    # §12.2 "**202** with `update_status:"accepted"` when it returns at acceptance".
    # Passed once a task history holding two or more accepted updates of its run was read in full.
    "UPDATE-ACCEPTED-RECORDED": ("DISPATCH-LOST-NOTIFICATION", "two_updates_on_one_run_read"),
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
# The ledger state a judged query answer reaches.
QUERY_STATES = {
    "complete": "query_result_roundtrip",
    "unknown": "query_unknown_404",
    "rejected": "query_rejected_409",
    "custom": "query_rejected_409",
}
BATCHES = ("timer", "complete", "complete_update", "fail_update", "timer_and_update", "close_update_again")
# What complete_task draws from: closing an update twice is drawn twice as often (it needs a closed update).
BATCH_DRAWS = (*BATCHES, "close_update_again")


class Slot(Enum):
    """The run's one workflow-task slot (Python SDK 2.12.0, Replay "Keep at most one outstanding task per run")."""

    NONE = "none"  # no open task: the run waits (or is closed)
    READY = "ready"  # exactly one open task, not leased (its id is not known yet)
    LEASED = "leased"  # exactly one open task, MessageRun.task (its lease may have expired)
    MAYBE = "maybe"  # the protocol allows no task or one (a closed update was the only news)


@dataclass(eq=False, kw_only=True)
class MessageTask(TaskShadow):
    run: MessageRun


@dataclass(eq=False, kw_only=True)
class MessageRun(RunShadow):
    """A run, its one task slot, the news that arrived while its task was leased, and its messages."""

    slot: Slot = Slot.READY
    task: MessageTask | None = None
    pending: set[str] = field(default_factory=set)  # wakes that arrived while its task was leased
    news_while_leased: set[str] = field(default_factory=set)  # kinds (signal, update) accepted during a live lease
    coalesced: int = 0  # wakes that arrived while an open task existed
    queried: bool = False  # a query touched it since its slot last emptied
    open_updates: dict[str, str] = field(default_factory=dict)  # update_id -> name
    closed_updates: set[str] = field(default_factory=set)
    signals: dict[str, bool | None] = field(default_factory=dict)  # name -> accepted (None: unknown)
    signal_copies: dict[str, int] = field(default_factory=dict)  # name -> how often it may have been applied
    refused_updates: set[str] = field(default_factory=set)  # names refused on a closed run
    accepted_updates: dict[str, str] = field(default_factory=dict)  # update_id -> name
    update_outcomes: dict[str, str] = field(default_factory=dict)  # closed update_id -> completed | failed


# -- workflow tasks of a run ----------------------------------------------------------------------------


def judge_slot(run: MessageRun, task_id: str, attempt: int, received: datetime, margin: float) -> None:
    """At most one open workflow task per run, and a live lease is never handed out again. ``received`` is when
    the lease's answer arrived: the server granted it no later than that (a long poll sent while the current
    lease was live may be granted the task once it expired)."""
    if not run.open:
        raise Violation(
            "CANCEL-NO-NEW-LEASES",
            f"a task of {run.status.value} run {run.run_id} was leased",
            expected="no lease",
            received=task_id,
        )
    current = run.task if run.slot is Slot.LEASED else None
    if current is not None:
        _judge_lease_again(run, current, task_id, attempt, received, margin)
        return
    if run.slot is Slot.NONE:
        if run.coalesced:
            req, why = (
                "LEASE-NOT-SHARED-WHILE-LIVE",
                f"{plural(run.coalesced, 'wake')} arrived while a task was open; one of them made a second task",
            )
        elif run.queried:
            req, why = "QUERY-READ-ONLY", "a query made a workflow task"
        else:
            req, why = "COMMANDS-NON-TERMINAL-WAITING", "a non-terminal batch left the run with a task"
        raise Violation(
            req,
            f"run {run.run_id} has no pending change, yet task {task_id} was leased: {why}",
            expected="no task for a waiting run",
            received=f"{task_id}#{attempt}",
        )


def _judge_lease_again(
    run: MessageRun, current: MessageTask, task_id: str, attempt: int, received: datetime, margin: float
) -> None:
    """A lease of a run whose task the model holds: only that task again, once its lease expired, as the
    next attempt (§9)."""
    if task_id != current.task_id:
        raise Violation(
            "LEASE-NOT-SHARED-WHILE-LIVE",
            f"run {run.run_id} got a second open workflow task {task_id} while {current.task_id} "
            f"(attempt {current.attempt}, leased to {current.owner} until {current.expires}) is still open: "
            f"{plural(run.coalesced, 'wake')} arrived while a task was open and must have been coalesced into it",
            expected=f"no task, or {current.task_id} again once its lease expired",
            received=f"{task_id}#{attempt}",
        )
    if current.expires > received + timedelta(seconds=margin):
        raise Violation(
            "LEASE-NOT-SHARED-WHILE-LIVE",
            f"task {task_id} was leased again while its lease to {current.owner} was live",
            expected=f"no lease before {current.expires}",
            received=f"{task_id}#{attempt}",
        )
    if attempt != current.attempt + 1:
        raise Violation(
            "EXPIRY-REDELIVER-SAME-TASK",
            f"redelivery of {task_id} after its lease expired",
            expected=f"attempt {current.attempt + 1}",
            received=attempt,
        )


def _envelope(value: Any) -> dict[str, str]:
    return {"codec": "avro", "blob": encode_blob(value)}


def batch(run: MessageRun, kind: str, unknown_id: str) -> tuple[list[dict[str, Any]], set[str], bool]:
    """The commands of a batch of ``kind``, the update ids it closes, and whether the protocol calls it
    invalid (§8.7.1 complete_update: "The update must be accepted and open for this run"); ``unknown_id``
    names an update the run never had."""
    timer = {"type": "start_timer", "delay_seconds": 3600}
    open_ids = sorted(run.open_updates)
    if kind == "complete":
        return [{"type": "complete_workflow", "result": _envelope("done")}], set(), False
    if kind in ("complete_update", "fail_update", "timer_and_update") and open_ids:
        uid = open_ids[0]
        if kind == "fail_update":
            return [{"type": "fail_update", "update_id": uid, "message": "conformance"}], {uid}, False
        close = {"type": "complete_update", "update_id": uid, "result": _envelope(uid)}
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
        return [{"type": "complete_update", "update_id": unknown_id}], set(), True
    return [timer], set(), False


# -- queries ---------------------------------------------------------------------------------------------


def query_outcomes(
    view: QueryTaskView, owner: str, attempt: int, deadline: tuple[datetime, datetime], at: datetime, margin: float
) -> set[str]:
    """The outcomes §10.6 allows at ``at`` ± ``margin``. Past the query deadline a live task counts as timed
    out; the server set that deadline somewhere in ``deadline`` (between sending the query and leasing it)."""
    earliest, latest = deadline
    outs = set()
    live = view.status in (QueryTaskStatus.PENDING, QueryTaskStatus.LEASED)
    # The earliest moment against the latest deadline, the latest moment against the earliest one.
    for moment, due in ((at - timedelta(seconds=margin), latest), (at + timedelta(seconds=margin), earliest)):
        status = QueryTaskStatus.TIMED_OUT if live and moment >= due else view.status
        seen = QueryTaskView(view.query_task_id, status, view.attempt, view.lease_owner, view.lease_expires_at)
        outs.add(
            outcome(
                guard_query_task, seen, query_task_id=view.query_task_id, lease_owner=owner, attempt=attempt, now=moment
            )
        )
    return outs


def judge_query_reply(
    status: int, reason: str | None, body: Mapping[str, Any], answer: str, result: Mapping[str, str]
) -> str | None:
    """The control-plane query's answer once the worker's ``answer`` landed; the ledger state it reaches."""
    reason_sent, want, req = QUERY_ANSWERS[answer]
    env = body.get("result_envelope")
    blob = env.get("blob") if isinstance(env, dict) else None
    if status != want or (answer == "complete" and blob != result["blob"]):
        expected = f"{want}" + (f" result_envelope.blob={result['blob']}" if answer == "complete" else "")
        raise Violation(
            req,
            f"the control-plane query after the worker's {answer} answer",
            expected=expected,
            received=f"{status} {reason} blob={blob!r}",
        )
    if answer == "unknown" and reason != reason_sent:
        raise Violation(req, "reason of an unknown query", expected=reason_sent, received=reason)
    return QUERY_STATES[answer]


def judge_read_only(
    run_id: str,
    before: tuple[Mapping[str, Any], list[tuple[Any, Any]]],
    after: tuple[Mapping[str, Any], list[tuple[Any, Any]]],
) -> None:
    """§10.1, §16.60: history and describe right after a query equal those right before it (a lease repair
    may add ``RepairRequested`` meanwhile; describe is then not compared)."""
    extra = after[1][len(before[1]) :]
    prefix_same = after[1][: len(before[1])] == before[1]
    only_repairs = all(kind in NOT_QUERY_EVENTS for _, kind in extra)
    if not prefix_same or not only_repairs:
        raise Violation(
            "QUERY-READ-ONLY",
            f"a query changed run {run_id}'s history",
            expected=f"{plural(len(before[1]), 'event')}, unchanged",
            received=f"{plural(len(after[1]), 'event')}; new: {extra}" if prefix_same else after[1],
        )
    if not extra and after[0] != before[0]:
        changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
        raise Violation(
            "QUERY-READ-ONLY",
            f"a query changed what describe shows for run {run_id}",
            expected={k: before[0].get(k) for k in changed},
            received={k: after[0].get(k) for k in changed},
        )


# -- updates ---------------------------------------------------------------------------------------------


def judge_update_reply(
    status: int, reason: str | None, body: Mapping[str, Any], verdict: str, result: Mapping[str, str]
) -> None:
    """§12.2: a blocking update returns the worker's result (200) or its failure (422 update_failed)."""
    expected: Any
    if verdict == "complete_update":
        env = body.get("result_envelope")
        blob = env.get("blob") if isinstance(env, dict) else None
        ok = status == 200 and body.get("update_status") == "completed" and blob == result["blob"]
        expected = {"status": 200, "update_status": "completed", "result_envelope.blob": result["blob"]}
    else:
        ok = status == 422 and reason == "update_failed"
        expected = "422 update_failed"
    if not ok:
        raise Violation(
            UPDATE_WAIT_REQ,
            f"the blocking update after the worker's {verdict}",
            expected=expected,
            received={"status": status, **{k: body.get(k) for k in ("reason", "update_status")}},
        )


# -- control-plane history -------------------------------------------------------------------------------


def judge_messages(run: MessageRun, events: list[dict[str, Any]]) -> None:
    """Nothing recorded after the run's terminal event; every accepted signal and update recorded once, every
    refused one never, every update closed at most once."""
    kinds = [str(e.get("event_type")) for e in events]
    terminal = [i for i, k in enumerate(kinds) if k in RUN_TERMINAL_EVENTS]
    if terminal:
        late = [k for k in kinds[terminal[0] + 1 :] if k in ("SignalReceived", "UpdateAccepted")]
        if late:
            raise Violation(
                SIGNAL_CLOSED if "SignalReceived" in late else UPDATE_CLOSED,
                f"run {run.run_id} recorded {late} after its terminal event {kinds[terminal[0]]}",
                expected="nothing recorded after the run closed",
                received=late,
            )
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
        raise Violation(
            UPDATE_ONCE,
            f"run {run.run_id} closed an update more than once",
            expected="UpdateCompleted at most once per update_id",
            received=twice,
        )
    _judge_signals(run, signals)
    for uid in run.accepted_updates:
        if accepted[uid] != 1:
            raise Violation(
                UPDATE_RECORDED,
                f"accepted update {uid} on run {run.run_id} appears {plural(accepted[uid], 'time')} as UpdateAccepted",
                expected=1,
                received=accepted[uid],
            )
    for name in run.refused_updates:
        if accepted_names[name]:
            raise Violation(
                UPDATE_CLOSED,
                f"refused update {name!r} on closed run {run.run_id} was recorded",
                expected=0,
                received=accepted_names[name],
            )


def _judge_signals(run: MessageRun, signals: Counter[str]) -> None:
    for name, ok in run.signals.items():
        # Maybe sent: at most once, or twice when the network delivered it twice (suite.proxy).
        maybe = set(range(run.signal_copies.get(name, 1) + 1))
        want = {True: {1}, False: {0}, None: maybe}[ok]
        if signals[name] not in want:
            raise Violation(
                SIGNAL_CLOSED if ok is False else SIGNAL_RECORDED,
                f"signal {name!r} ({'accepted' if ok else 'refused' if ok is False else 'maybe sent'}) on run "
                f"{run.run_id} appears {plural(signals[name], 'time')} as SignalReceived",
                expected=" or ".join(str(n) for n in sorted(want)),
                received=signals[name],
            )
