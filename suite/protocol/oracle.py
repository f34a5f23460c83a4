"""The history oracle: what a run's history must hold, given what the run had accepted.

Pure (no I/O, no clock). Its input is what a server acknowledged for one run, in the order it acknowledged it
(:class:`Accepted`: the start, signals, updates and their closing, activity leases, retries and outcomes, timers,
cancel, terminate, complete, fail, continue-as-new); :func:`expected_history` turns that into the events the
history must contain (:class:`Expected`: an event type and the payload fields that name it, and how many times
it may appear), and :func:`judge_history` judges a history read in full against them. Every broken rule is a
:class:`~suite.protocol.errors.Violation` naming its requirement.

The rules, each from the spec:

- §8.2, §8.4, §16.41, §16.45: read in full (every page, either cursor style, compressed or plain), a history is
  the sequences 1..N once each, ascending, N at least the ``last_history_sequence`` the task announced, and no
  event (``id``) twice — ``HISTORY-PAGINATION-COMPLETE``.
- every acceptance acknowledged *before* the task's poll left is in that task's history exactly once: the first
  task that follows an accepted signal or update shows it (Python SDK 2.12.0, Replay "Create a workflow task after each
  external history change"; a redelivery shows it too, §9). One acknowledged later may or may not be there
  (pages are read after the poll), but never twice.
- a "maybe applied" acceptance (its answer was lost) may be there or not: 0 up to the number of deliveries.
- children and cooperative cancellation: a parent's history records each child it started (ChildWorkflowScheduled,
  with the parent_close_policy the command gave or ``abandon``), each child close it was open for (ChildRun*), a
  retried child run as ChildWorkflowRetryScheduled and never as ChildRunFailed, and a cooperative request's outcome
  (ChildCancellationResolved, with how and by whom the child closed); a child's history the close its parent's
  policy or its cleanup deadline made (with that reason), the request and its one committed delivery.
- activity attempt numbers (§11.1, §11.6, §16.55): the leases of one execution are numbered 1, 2, 3, …; every
  event of an attempt carries its lease's number; in sequence order an execution's numbers never go back.

Ordering constraints, only those the spec gives (everything else may come in any order):

- ``StartAccepted`` then ``WorkflowStarted`` (§8.2), and no signal or update of the run before ``WorkflowStarted``
  (the run did not exist before it started);
- an update's ``UpdateAccepted`` before its ``UpdateApplied`` / ``UpdateCompleted`` (§8.7.1: "The update must be
  accepted and open for this run");
- nothing accepted from the control plane after the run's terminal event (§12.2: a closed run refuses);
- an execution's attempt numbers non-decreasing in sequence order (§9: the re-claim is attempt + 1; §11.6: a retry
  follows the failure).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from suite.protocol.errors import Rejection, Violation
from suite.protocol.history import RUN_TERMINAL_EVENTS, decode_page_token, decompress_events
from suite.protocol.wording import plural

__all__ = [
    "Accepted",
    "Applied",
    "Expected",
    "Kind",
    "expected_history",
    "join_pages",
    "judge_history",
]


class Kind(StrEnum):
    """What a server acknowledged for a run."""

    START = "start"  # the run started (a start, or the continue-as-new that made it)
    SIGNAL = "signal"  # key: the signal name (unique per run)
    UPDATE = "update"  # key: the update_id
    UPDATE_CLOSED = "update_closed"  # key: the update_id closed by an accepted complete_update / fail_update
    ATTEMPT = "attempt"  # key: activity_attempt_id; scope: the execution; number: the lease's attempt_number
    TIMER = "timer"  # an accepted start_timer
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"
    TERMINATE = "terminate"
    CONTINUE_AS_NEW = "continue_as_new"
    TIME_OUT = "time_out"  # the run's (or its execution's) timeout closed it, as seen on describe
    # Children and cooperative cancellation: what a parent's or a child's history records of them.
    CHILD_SCHEDULED = "child_scheduled"  # key: child_workflow_id; fields: the parent_close_policy recorded
    CHILD_COMPLETED = "child_completed"  # key: the child run (child_workflow_run_id) that closed with its parent open
    CHILD_FAILED = "child_failed"
    CHILD_CANCELLED = "child_cancelled"
    CHILD_TERMINATED = "child_terminated"
    CHILD_RETRY = "child_retry"  # key: the failed child run a retry follows (and no ChildRunFailed for it)
    PARENT_CANCELLED = "parent_cancelled"  # a child's close by its parent's request_cancel policy
    PARENT_TERMINATED = "parent_terminated"  # a child's close by its parent's terminate policy
    COOPERATIVE_REQUESTED = "cooperative_requested"  # key: the request id (workflow_command_id)
    COOPERATIVE_DELIVERED = "cooperative_delivered"  # key: the request id
    DEADLINE_CANCEL = "deadline_cancel"  # the child closed by the server past its cleanup deadline
    CANCELLATION_RESOLVED = "cancellation_resolved"  # key: the request id; fields: outcome, closed_by


class Applied(StrEnum):
    YES = "yes"  # acknowledged: the server applied it
    MAYBE = "maybe"  # the answer was lost: applied or not


@dataclass(frozen=True)
class Accepted:
    """One acknowledged (or maybe applied) change of a run, in acknowledgement order."""

    kind: Kind
    key: str = ""
    scope: str = ""  # the activity execution an attempt belongs to (its activity_type or execution id)
    number: int | None = None  # an attempt's attempt_number
    applied: Applied = Applied.YES
    copies: int = 1  # deliveries that may each have applied it (a request the network delivered twice)
    fields: tuple[tuple[str, str], ...] = ()  # further payload fields its event must carry (e.g. a child's outcome)


@dataclass(frozen=True)
class Expected:
    """An event a history must (or may) contain: its type, the payload fields that name it, how many times it
    may appear, and the requirement a wrong count breaks."""

    event_type: str
    match: tuple[tuple[str, str], ...]
    counts: frozenset[int]
    requirement: str
    why: str

    def matches(self, event: Mapping[str, Any]) -> bool:
        if event.get("event_type") != self.event_type:
            return False
        payload = _payload(event)
        return all(str(payload.get(k)) == v for k, v in self.match)


# Which requirement a missing or repeated event of each kind breaks, the event that records it, and the
# payload field that names it (None: counted by type alone).
_RECORDS: dict[Kind, tuple[str, str, str | None]] = {
    Kind.SIGNAL: ("SignalReceived", "SIGNAL-RECORDED-AND-WAKES", "signal_name"),
    Kind.UPDATE: ("UpdateAccepted", "UPDATE-ACCEPTED-RECORDED", "update_id"),
    Kind.UPDATE_CLOSED: ("UpdateCompleted", "UPDATE-CLOSED-AT-MOST-ONCE", "update_id"),
    Kind.TIMER: ("TimerScheduled", "COMMANDS-ATOMIC", None),
    Kind.COMPLETE: ("WorkflowCompleted", "COMMANDS-COMPLETE-WORKFLOW", None),
    Kind.FAIL: ("WorkflowFailed", "COMMANDS-FAIL-WORKFLOW", None),
    Kind.CANCEL: ("WorkflowCancelled", "CONTROL-CANCEL-CLOSES-RUN", None),
    Kind.TERMINATE: ("WorkflowTerminated", "CONTROL-CANCEL-CLOSES-RUN", None),
    Kind.CONTINUE_AS_NEW: ("WorkflowContinuedAsNew", "COMMANDS-CONTINUE-AS-NEW", None),
    Kind.TIME_OUT: ("WorkflowTimedOut", "RUN-TIMEOUT-CLOSES-RUN", None),
    Kind.CHILD_SCHEDULED: ("ChildWorkflowScheduled", "CHILD-POLICY-RECORDED", "child_workflow_id"),
    # §8.7.1 ChildRun{Completed,Failed,…}: the parent is told of its child's close, once.
    Kind.CHILD_COMPLETED: ("ChildRunCompleted", "CHILD-RESULT-WAKES-PARENT", "child_workflow_run_id"),
    Kind.CHILD_FAILED: ("ChildRunFailed", "CHILD-RESULT-WAKES-PARENT", "child_workflow_run_id"),
    Kind.CHILD_CANCELLED: ("ChildRunCancelled", "CHILD-RESULT-WAKES-PARENT", "child_workflow_run_id"),
    Kind.CHILD_TERMINATED: ("ChildRunTerminated", "CHILD-RESULT-WAKES-PARENT", "child_workflow_run_id"),
    Kind.CHILD_RETRY: ("ChildWorkflowRetryScheduled", "CHILD-RETRY-BACKOFF", "failed_child_run_id"),
    Kind.PARENT_CANCELLED: ("WorkflowCancelled", "CHILD-PARENT-CLOSE-POLICIES", "reason"),
    Kind.PARENT_TERMINATED: ("WorkflowTerminated", "CHILD-PARENT-CLOSE-POLICIES", "reason"),
    Kind.COOPERATIVE_REQUESTED: (
        "CooperativeCancellationRequested",
        "CANCEL-COOPERATIVE-REQUEST",
        "workflow_command_id",
    ),
    Kind.COOPERATIVE_DELIVERED: (
        "CooperativeCancellationDelivered",
        "CANCEL-COOPERATIVE-DELIVERY",
        "workflow_command_id",
    ),
    Kind.DEADLINE_CANCEL: ("WorkflowCancelled", "CANCEL-COOPERATIVE-DEADLINE", "reason"),
    Kind.CANCELLATION_RESOLVED: ("ChildCancellationResolved", "CANCEL-COOPERATIVE-OUTCOME", "request_id"),
}
# The reason a child's closing event names, for the kinds that close a child on its parent's or the clock's behalf.
CLOSING_REASONS: dict[Kind, str] = {
    Kind.PARENT_CANCELLED: "parent_closed",
    Kind.PARENT_TERMINATED: "parent_closed",
    Kind.DEADLINE_CANCEL: "cleanup_deadline_exceeded",
}
_CONTROL_EVENTS = frozenset({"SignalReceived", "UpdateAccepted"})
_UPDATE_CLOSING = frozenset({"UpdateApplied", "UpdateCompleted"})
PAGINATION = "HISTORY-PAGINATION-COMPLETE"
ATTEMPTS = "RETRY-ATTEMPTS-CONTIGUOUS"


def _payload(event: Mapping[str, Any]) -> Mapping[str, Any]:
    payload = event.get("payload")
    return payload if isinstance(payload, Mapping) else {}


def _allowed(a: Accepted, *, required: bool) -> frozenset[int]:
    """How often an acceptance's event may appear: once when acknowledged before the task's poll left, 0 or
    once when acknowledged later; 0 up to its deliveries when its answer was lost."""
    if a.applied is Applied.MAYBE:
        return frozenset(range(a.copies + 1))
    return frozenset({1}) if required else frozenset({0, 1})


# -- what a history must hold ----------------------------------------------------------------------------


def expected_history(accepted: Sequence[Accepted], *, seen_before: int | None = None) -> list[Expected]:
    """The events the history of a run that accepted ``accepted`` must contain. ``seen_before``: how many of
    them were acknowledged before the reading task's poll left (those must be there; the rest may be); None:
    all of them (a history read after everything was acknowledged)."""
    cut = len(accepted) if seen_before is None else seen_before
    out: list[Expected] = []
    timers = [0, 0]  # required, may
    for i, a in enumerate(accepted):
        required = i < cut
        if a.kind is Kind.START:
            if required and a.applied is Applied.YES:
                out.append(Expected("StartAccepted", (), frozenset({1}), "HISTORY-FIRST-TASK-STARTED", "the start"))
                out.append(Expected("WorkflowStarted", (), frozenset({1}), "HISTORY-FIRST-TASK-STARTED", "the start"))
            continue
        if a.kind is Kind.ATTEMPT:
            continue  # judged by its numbering, not by an event count (a redelivered attempt may leave none)
        if a.kind is Kind.TIMER:
            timers[0 if required and a.applied is Applied.YES else 1] += a.copies if a.applied is Applied.MAYBE else 1
            continue
        event_type, requirement, field_name = _RECORDS[a.kind]
        counts = _allowed(a, required=required)
        if a.kind is Kind.UPDATE_CLOSED:
            counts = frozenset({0, 1})  # §8.7.1 names UpdateApplied / UpdateCompleted; at most one close each
        key = CLOSING_REASONS.get(a.kind, a.key)
        match = (((field_name, key),) if field_name else ()) + a.fields
        out.append(Expected(event_type, match, counts, requirement, f"{a.kind.value} {a.key}".strip()))
        if a.kind is Kind.CHILD_RETRY:
            # §14.2: a child run that is retried is not reported to its parent as failed.
            no_failure = (("child_workflow_run_id", a.key),)
            why = f"the retried child run {a.key}"
            out.append(Expected("ChildRunFailed", no_failure, frozenset({0}), requirement, why))
    if timers != [0, 0]:
        counts = frozenset(range(timers[0], timers[0] + timers[1] + 1))
        out.append(Expected("TimerScheduled", (), counts, "COMMANDS-ATOMIC", f"{timers[0]} accepted start_timer"))
    return out


# -- reading pages ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page as read: its events (decompressed when it came compressed), the cursor it was asked from
    (``after``), the page size asked for, whether it came compressed, and where it said the next page starts."""

    events: list[dict[str, Any]]
    after: int
    page_size: int | None
    compressed: bool = False
    has_more: bool = False
    next_after: int | None = None
    token: str | None = None


def page_of(body: Mapping[str, Any], *, after: int, page_size: int | None) -> Page:
    """Read one page of a poll answer's task or a history answer (§8.2, §8.4, §8.5): plain or compressed
    events, and where the next page starts, by either cursor style (``next_after_sequence`` or the token)."""
    compressed = body.get("history_events_compressed")
    if compressed is not None:
        try:
            events = decompress_events(str(body.get("history_events_encoding")), str(compressed))
        except ValueError as exc:
            raise Violation(
                "COMPRESSION-ROUNDTRIP",
                f"history_events_compressed does not decode: {exc}",
                expected="base64 of the gzip or raw-deflate JSON array",
                received=body.get("history_events_encoding"),
            ) from None
        if body.get("history_events") not in ([], None):
            raise Violation(
                "COMPRESSION-ROUNDTRIP",
                "a compressed page carries history_events too",
                expected="history_events: []",
                received=len(body.get("history_events") or []),
            )
    else:
        raw = body.get("history_events")
        events = raw if isinstance(raw, list) else []
    token = body.get("next_history_page_token")
    token = token if isinstance(token, str) and token else None
    nxt = body.get("next_after_sequence")
    has_more = body.get("has_more")
    more = has_more if isinstance(has_more, bool) else token is not None
    next_after = nxt if isinstance(nxt, int) and not isinstance(nxt, bool) else None
    if more and next_after is None and token is not None:
        try:
            next_after = decode_page_token(token)
        except Rejection:
            raise Violation(
                PAGINATION, "the server sent a history page token it cannot have made", received=token
            ) from None
    if more and next_after is None:
        raise Violation(
            PAGINATION,
            "a history page says more follow but names no cursor",
            expected="next_after_sequence or next_history_page_token",
            received={k: body.get(k) for k in ("has_more", "next_after_sequence", "next_history_page_token")},
        )
    return Page(
        [e for e in events if isinstance(e, dict)], after, page_size, compressed is not None, more, next_after, token
    )


def join_pages(pages: Sequence[Page]) -> list[dict[str, Any]]:
    """The history a worker reads by following the cursor until ``has_more`` is false: every page starts after
    the cursor it was asked from and holds at most the page size asked for (§16.45); a compressed page holds at
    least 50 events (§8.5 "< 50 events MUST NOT be compressed")."""
    events: list[dict[str, Any]] = []
    for n, page in enumerate(pages):
        if page.page_size is not None and len(page.events) > min(page.page_size, 1000):
            raise Violation(
                PAGINATION,
                f"history page {n + 1} holds {plural(len(page.events), 'event')}, more than the page size asked for",
                expected=f"at most {min(page.page_size, 1000)}",
                received=len(page.events),
            )
        if page.compressed and len(page.events) < 50:
            raise Violation(
                "COMPRESSION-BELOW-THRESHOLD",
                f"history page {n + 1} came compressed with {plural(len(page.events), 'event')}",
                expected="uncompressed below 50 events",
                received=len(page.events),
            )
        first = page.events[0].get("sequence") if page.events else None
        if isinstance(first, int) and first <= page.after:
            raise Violation(
                PAGINATION,
                f"history page {n + 1}, asked for the events after sequence {page.after}, starts at {first}",
                expected=f"sequence > {page.after}",
                received=first,
            )
        events.extend(page.events)
    return events


# -- judging a history -----------------------------------------------------------------------------------


def judge_history(
    events: Sequence[Mapping[str, Any]],
    accepted: Sequence[Accepted],
    *,
    seen_before: int | None = None,
    last_sequence: int | None = None,
) -> None:
    """Judge a history read in full against what its run accepted (see the module docstring); raises the first
    :class:`Violation`."""
    _judge_sequences(events, last_sequence)
    for e in expected_history(accepted, seen_before=seen_before):
        n = sum(1 for ev in events if e.matches(ev))
        if n not in e.counts:
            raise Violation(
                e.requirement,
                f"{e.event_type} ({e.why}) appears {plural(n, 'time')} in the history",
                expected=" or ".join(str(c) for c in sorted(e.counts)),
                received=n,
            )
    _judge_order(events)
    _judge_attempts(events, accepted)


def _judge_sequences(events: Sequence[Mapping[str, Any]], last_sequence: int | None) -> None:
    seqs = [ev.get("sequence") for ev in events]
    for i, seq in enumerate(seqs):
        if seq != i + 1:
            problem = (
                f"sequence {seq} appears again at position {i + 1}"
                if seq in seqs[:i]
                else f"position {i + 1} holds sequence {seq}"
            )
            raise Violation(
                PAGINATION,
                f"the history read in full is not the sequences 1..N once each, in order: {problem}",
                expected=f"sequence {i + 1}",
                received=seqs[max(0, i - 3) : i + 4],
            )
    if last_sequence is not None and len(seqs) < last_sequence:
        raise Violation(
            PAGINATION,
            f"the history read in full ends at sequence {len(seqs)}, but the task's last_history_sequence is "
            f"{last_sequence}",
            expected=f"every sequence 1..{last_sequence}",
            received=len(seqs),
        )
    ids = [ev.get("id") for ev in events if ev.get("id") is not None]
    if len(ids) != len(set(ids)):
        twice = sorted({str(i) for i in ids if ids.count(i) > 1})
        raise Violation(
            PAGINATION, f"event ids {twice} appear twice in the history", expected="each once", received=twice
        )


def _judge_order(events: Sequence[Mapping[str, Any]]) -> None:
    kinds = [str(ev.get("event_type")) for ev in events]
    started = kinds.index("WorkflowStarted") if "WorkflowStarted" in kinds else None
    if started is not None and "StartAccepted" in kinds and kinds.index("StartAccepted") > started:
        raise Violation(
            "HISTORY-FIRST-TASK-STARTED",
            "WorkflowStarted comes before StartAccepted",
            expected="StartAccepted, then WorkflowStarted",
            received=kinds[:4],
        )
    early = [k for k in kinds[: started if started is not None else 0] if k in _CONTROL_EVENTS]
    if early:
        raise Violation(
            "SIGNAL-RECORDED-AND-WAKES" if "SignalReceived" in early else "UPDATE-ACCEPTED-RECORDED",
            f"{early} recorded before the run's WorkflowStarted",
            expected="nothing of the run before it started",
            received=kinds[: (started or 0) + 1],
        )
    terminal = next((i for i, k in enumerate(kinds) if k in RUN_TERMINAL_EVENTS), None)
    if terminal is not None:
        late = [k for k in kinds[terminal + 1 :] if k in _CONTROL_EVENTS]
        if late:
            raise Violation(
                "SIGNAL-CLOSED-RUN-REJECTED" if "SignalReceived" in late else "UPDATE-CLOSED-RUN-REJECTED",
                f"{late} recorded after the run's terminal event {kinds[terminal]}",
                expected="nothing accepted after the run closed",
                received=late,
            )
    accepted_at = {str(_payload(ev).get("update_id")): i for i, ev in enumerate(events) if kinds[i] == "UpdateAccepted"}
    for i, ev in enumerate(events):
        if kinds[i] in _UPDATE_CLOSING:
            uid = str(_payload(ev).get("update_id"))
            if accepted_at.get(uid, len(events)) > i:
                raise Violation(
                    "UPDATE-CLOSED-AT-MOST-ONCE",
                    f"update {uid} is closed ({kinds[i]} at sequence {ev.get('sequence')}) before it was accepted",
                    expected="UpdateAccepted first",
                    received=kinds[i],
                )


def _judge_attempts(events: Sequence[Mapping[str, Any]], accepted: Iterable[Accepted]) -> None:
    """Leases of one execution numbered 1, 2, 3, …; every event of an attempt carries its lease's number; an
    execution's numbers never go back in sequence order."""
    numbers: dict[str, int] = {}
    scope_of: dict[str, str] = {}
    leased: dict[str, list[int]] = {}
    unseen: set[str] = set()  # executions a lost poll may have leased: some of their numbers went unseen
    for a in accepted:
        if a.kind is not Kind.ATTEMPT:
            continue
        if a.applied is Applied.MAYBE:
            unseen.add(a.scope)
        elif a.number is not None:
            numbers[a.key] = a.number
            scope_of[a.key] = a.scope
            leased.setdefault(a.scope, []).append(a.number)
    for scope, got in leased.items():
        if scope not in unseen and got != list(range(1, len(got) + 1)):
            raise Violation(
                ATTEMPTS,
                f"the leases of activity {scope} are numbered {got}",
                expected=list(range(1, len(got) + 1)),
                received=got,
            )
    last: dict[str, tuple[int, Any]] = {}
    for ev in events:
        payload = _payload(ev)
        attempt_id = payload.get("activity_attempt_id")
        number = payload.get("retry_after_attempt", payload.get("attempt_number"))
        if not isinstance(attempt_id, str) or not isinstance(number, int):
            continue
        want = numbers.get(attempt_id)
        if want is not None and number != want:
            raise Violation(
                ATTEMPTS,
                f"{ev.get('event_type')} at sequence {ev.get('sequence')} names attempt {attempt_id} number {number}, "
                f"but that attempt was leased as number {want}",
                expected=want,
                received=number,
            )
        scope = scope_of.get(attempt_id) or str(payload.get("activity_execution_id"))
        before = last.get(scope)
        if before is not None and number < before[0]:
            raise Violation(
                ATTEMPTS,
                f"activity {scope}: {ev.get('event_type')} at sequence {ev.get('sequence')} names attempt {number} "
                f"after attempt {before[0]} (sequence {before[1]})",
                expected=f"attempt >= {before[0]}",
                received=number,
            )
        last[scope] = (number, ev.get("sequence"))
