"""What a second delivery of the same request may do: the "maybe applied" rules of every operation.

A request whose answer never arrived (a dropped response, a reset long poll, a truncated body) may or may
not have been applied; a request a network delivered twice was applied once and then met again. The protocol
says, operation by operation, what the second delivery must answer (docs/reference.md: Idempotency, Fencing, Activities,
Control plane), and that is all a client may rely on after a lost answer:

- ``IDEMPOTENT`` — reads, registration (an upsert, §16.11), heartbeats, drain and resume (idempotent by §7.6):
  resend freely; the second answer stands for the first.
- ``POLL`` — a poll is idempotent only with a ``poll_request_id`` (§7.3): while the lease it got is live, the
  same poll returns the same task and attempt. Without an id a second delivery may lease another task.
- ``FENCED`` — terminal calls on a lease or attempt (workflow-task, activity and query-task complete and
  fail): after the first was applied, the second must be refused with 409 and change nothing.
- ``DEDUPED`` — start (409 ``rejected_duplicate`` or 200 ``returned_existing_active``, never a second 201),
  cancel and terminate (409 once the run is closed).
- ``UNSAFE`` — signal, update, control-plane query, anything unknown: a second delivery is a second request.

:func:`judge_repeat` says whether a second answer breaks the rule, given the first. Pure: no I/O, no clock —
"while the lease is live" is decided from the server's own timestamps passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "Operation",
    "Repeat",
    "Violation",
    "changes_state",
    "classify",
    "judge_poll_retry",
    "judge_repeat",
    "leased",
]


class Repeat(StrEnum):
    IDEMPOTENT = "idempotent"
    POLL = "poll"
    FENCED = "fenced"
    DEDUPED = "deduped"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class Operation:
    """One operation of the HTTP surface, as far as repeated deliveries are concerned."""

    name: str
    repeat: Repeat
    requirement: str | None = None  # what a wrong second answer breaks (FENCED and DEDUPED operations)
    # A 4xx of this operation may report what happened rather than a refusal: a query the worker rejected
    # (409 query_rejected), an update the worker failed (422 update_failed).
    refusal_is_outcome: bool = False

    def refused(self, status: int | None) -> bool:
        """Whether an answer with ``status`` means the request was refused, so it changed nothing (§3: "a
        rejected request changes nothing") and sending it again is as safe as sending it the first time."""
        return status is not None and 400 <= status < 500 and not self.refusal_is_outcome

    def resendable(self, body: Any) -> bool:
        """Whether the same bytes may be sent again and the answer taken as the answer to the first."""
        if self.repeat is Repeat.IDEMPOTENT:
            return True
        return self.repeat is Repeat.POLL and isinstance(body, dict) and bool(body.get("poll_request_id"))


@dataclass(frozen=True)
class Violation:
    requirement: str
    message: str
    expected: str
    received: str | None = None


_SEG: Final = r"[^/?]+"
_W: Final = "/api/worker"
_TABLE: Final[tuple[tuple[str, str, Operation], ...]] = (
    ("POST", rf"{_W}/register", Operation("register_worker", Repeat.IDEMPOTENT, "REGISTER-IDEMPOTENT")),
    ("POST", rf"{_W}/heartbeat", Operation("heartbeat_worker", Repeat.IDEMPOTENT)),
    ("DELETE", rf"{_W}/registrations/{_SEG}", Operation("deregister_worker", Repeat.IDEMPOTENT)),
    ("POST", rf"{_W}/(workflow|activity|query)-tasks/poll", Operation("poll", Repeat.POLL, "IDEMPOTENT-POLL-REPLAY")),
    ("POST", rf"{_W}/workflow-tasks/{_SEG}/(history|heartbeat)", Operation("workflow_task_read", Repeat.IDEMPOTENT)),
    ("POST", rf"{_W}/activity-tasks/{_SEG}/(heartbeat|status)", Operation("activity_heartbeat", Repeat.IDEMPOTENT)),
    (
        "POST",
        rf"{_W}/workflow-tasks/{_SEG}/complete",
        Operation("complete_workflow_task", Repeat.FENCED, "FENCE-AFTER-COMPLETE"),
    ),
    (
        "POST",
        rf"{_W}/workflow-tasks/{_SEG}/fail",
        Operation("fail_workflow_task", Repeat.FENCED, "FENCE-TASK-FAILED-NOT-LEASED"),
    ),
    (
        "POST",
        rf"{_W}/activity-tasks/{_SEG}/(complete|fail)",
        Operation("report_activity", Repeat.FENCED, "ACTIVITY-DUPLICATE-COMPLETE-STALE"),
    ),
    (
        "POST",
        rf"{_W}/query-tasks/{_SEG}/(complete|fail)",
        Operation("report_query", Repeat.FENCED, "QUERY-LATE-COMPLETE-NOT-LEASED"),
    ),
    ("GET", r"/api/.*", Operation("read", Repeat.IDEMPOTENT)),
    ("POST", r"/api/workflows", Operation("start_workflow", Repeat.DEDUPED, "CONTROL-START")),
    (
        "POST",
        rf"/api/workflows/{_SEG}(/runs/{_SEG})?/(query|update)/{_SEG}",
        Operation("query_or_update", Repeat.UNSAFE, refusal_is_outcome=True),
    ),
    ("POST", rf"/api/workflows/{_SEG}(/runs/{_SEG})?/(cancel|terminate)", Operation("close_run", Repeat.DEDUPED)),
    ("POST", rf"/api/task-queues/{_SEG}/build-ids/(drain|resume)", Operation("drain", Repeat.IDEMPOTENT)),
)
_COMPILED: Final = tuple((method, re.compile(pattern + r"/?"), op) for method, pattern, op in _TABLE)
_UNKNOWN: Final = Operation("other", Repeat.UNSAFE)


def classify(method: str, path: str) -> Operation:
    """The operation a request is (``path`` without the query string); unknown routes are ``UNSAFE``."""
    bare = path.partition("?")[0]
    for m, pattern, op in _COMPILED:
        if m == method.upper() and pattern.fullmatch(bare):
            return op
    return _UNKNOWN


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def judge_repeat(
    op: Operation, first_status: int | None, first: Any, second_status: int | None, second: Any
) -> Violation | None:
    """Does ``second`` (the answer to the same request delivered again, right after ``first`` was answered)
    break the rule of ``op``? ``None`` when it does not, or when the rule says nothing of this pair."""
    second_body = second if isinstance(second, dict) else {}
    if second_status is None or first_status is None:
        return None
    if op.repeat is Repeat.IDEMPOTENT and op.requirement is not None:
        # §16.11: re-registering the same worker id is an upsert that answers 201 again.
        if _ok(first_status) and not _ok(second_status):
            return Violation(op.requirement, f"a repeated {op.name} was refused after it succeeded", "2xx")
        return None
    if op.repeat is Repeat.FENCED and op.requirement is not None and _ok(first_status):
        if op.name == "report_activity":
            # §16.54: one terminal event per attempt; the duplicate gets 409 stale_attempt with recorded:false.
            if _ok(second_status) or second_body.get("recorded") is True:
                return Violation(
                    op.requirement,
                    "a repeated activity complete or fail was recorded again",
                    "409 stale_attempt with recorded:false",
                )
            return None
        if _ok(second_status):
            return Violation(op.requirement, f"a repeated {op.name} was accepted again after it succeeded", "409")
        return None
    # §12.1: the same start again finds the run it made: 409 rejected_duplicate, or 200 with use-existing.
    if op.name == "start_workflow" and first_status == 201 and second_status == 201:
        return Violation(
            "CONTROL-START",
            "a repeated start started a second run of the same workflow id",
            "409 rejected_duplicate (or 200 returned_existing_active)",
        )
    return None


def changes_state(op: Operation, first_status: int | None, second_status: int | None) -> bool:
    """Could the second delivery have changed what the client will see next (beyond what ``first`` did)?

    Only a second delivery that succeeded can: a refused one changed nothing (a rejected request changes
    nothing, §3), and idempotent ones apply the same change again. A poll is judged by what it leased.
    """
    if not _ok(second_status) or op.repeat is Repeat.IDEMPOTENT:
        return False
    return not (op.repeat in (Repeat.FENCED, Repeat.DEDUPED) and _ok(first_status))


def _lease(body: Any) -> tuple[str, str, str | None] | None:
    task = body.get("task") if isinstance(body, dict) else None
    if not isinstance(task, dict):
        return None
    task_id = task.get("task_id") or task.get("query_task_id")
    if not task_id:
        return None
    # The attempt a lease is of: a workflow task's attempt number, an activity's attempt id (a redelivery
    # gets a new one), a query task's attempt.
    attempt = task.get("workflow_task_attempt", task.get("activity_attempt_id", task.get("query_task_attempt")))
    expires = task.get("lease_expires_at")
    return str(task_id), str(attempt), expires if isinstance(expires, str) else None


def leased(body: Any) -> tuple[str, str] | None:
    """The (task id, attempt) a poll answer leased, or ``None`` for an empty poll."""
    got = _lease(body)
    return None if got is None else got[:2]


def judge_poll_retry(
    first_status: int | None,
    first: Any,
    retry_status: int | None,
    retry: Any,
    retry_answered_at: datetime | None,
    parse_time: Any,
) -> Violation | None:
    """§7.3: a poll whose answer was lost, sent again with the same ``poll_request_id``, must get the lease
    the first delivery made while that lease is live.

    ``retry_answered_at`` is the server's clock when it answered the retry (its ``Date`` header, which has
    one-second resolution: a retry is judged only when it was answered more than a second before the first
    lease's ``lease_expires_at``). ``parse_time`` parses the RFC 3339 ``lease_expires_at``.
    """
    if first_status != 200 or retry_status is None:
        return None
    original = _lease(first)
    if original is None or original[2] is None or retry_answered_at is None:
        return None
    try:
        expires: datetime = parse_time(original[2])
    except (TypeError, ValueError):
        return None
    if (expires - retry_answered_at).total_seconds() <= 1.0:
        return None  # the lease may have expired before the retry arrived: the normal rules apply again
    got = leased(retry) if retry_status == 200 else None
    if got == original[:2]:
        return None
    return Violation(
        "IDEMPOTENT-POLL-REPLAY",
        f"a poll retried with the same poll_request_id while its lease was live did not get that lease back "
        f"(first delivery leased {original[0]} attempt {original[1]}, live until {original[2]})",
        f"200 with task {original[0]} attempt {original[1]}",
        f"{retry_status} with " + (f"task {got[0]} attempt {got[1]}" if got else "no task"),
    )
