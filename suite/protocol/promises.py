"""What each advertised capability promises: the behaviours the protocol ties to it, and the requirements whose
verdicts exercise each one.

A discovery flag is a promise, not a proof. A run certifies a capability only when every behaviour the capability
promises was exercised — judged by at least one record of one of its requirements (passed, failed, or working
though unadvertised); a record that could not judge (not covered, unimplemented, an error) exercises nothing. An
advertised capability with a behaviour never exercised keeps the run from CONFORMANT (``suite.results``).

The table is data. To add a behaviour, append a :class:`Behaviour` to its capability's tuple in
:data:`PROMISES` (or add the capability), naming the requirements that exercise it; ``validate_promises`` refuses
an unknown requirement or a behaviour that names none. :func:`ledger` is pure: the capabilities as advertised
and, per requirement, how many records exercised it, in; the ledger rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from suite.protocol.requirements import REGISTRY, applicable

__all__ = [
    "PROMISES",
    "Behaviour",
    "BehaviourRow",
    "CapabilityRow",
    "advertised",
    "ledger",
    "unexercised",
    "validate_promises",
]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One thing a capability promises. ``name`` is stable (reports key on it); ``requirements`` exercise it."""

    name: str
    description: str
    requirements: tuple[str, ...]
    # The server's option (a MAY): not applicable to a server whose checks showed it does not use it. Any other
    # behaviour of an advertised capability must be exercised, whatever its checks found.
    option: bool = False


def _b(name: str, description: str, *requirements: str, option: bool = False) -> Behaviour:
    return Behaviour(name, description, requirements, option)


# Capability key (as in worker_protocol.server_capabilities) → the behaviours it promises.
PROMISES: Final[Mapping[str, tuple[Behaviour, ...]]] = MappingProxyType(
    {
        "poll_status": (
            _b("leased-or-empty", "every poll answer says leased or empty", "POLL-STATUS-PRESENT", "POLL-STATUS-EMPTY"),
            _b("throttled", "a poll refused by admission says throttled, with a retry hint", "POLL-STATUS-THROTTLED"),
            _b("unavailable", "a poll of a queue whose matching is down says unavailable", "POLL-STATUS-UNAVAILABLE"),
        ),
        "long_poll_timeout": (
            _b("default-hold", "a poll without timeout_seconds holds the default", "LONGPOLL-DEFAULT-HOLD"),
        ),
        "history_page_size_default": (
            _b(
                "inline-default",
                "a poll without a page size gets the advertised default page",
                "HISTORY-INLINE-DEFAULT-PAGE",
            ),
        ),
        "default_history_page_size": (
            _b(
                "inline-default",
                "a poll without a page size gets the advertised default page",
                "HISTORY-INLINE-DEFAULT-PAGE",
            ),
        ),
        "workflow_task_poll_request_idempotency": (
            _b("replay", "a repeated poll_request_id returns the same lease", "IDEMPOTENT-POLL-REPLAY"),
            _b("owner-only", "another worker's poll never gets the owner's lease", "IDEMPOTENT-POLL-OTHER-WORKER"),
        ),
        "history_compression": (
            _b(
                "above-threshold",
                "an opted-in page at the threshold may be compressed",
                "COMPRESSION-ABOVE-THRESHOLD",
                option=True,
            ),
            _b("below-threshold", "a page below the threshold is sent plain", "COMPRESSION-BELOW-THRESHOLD"),
            _b("roundtrip", "a compressed page decodes to the plain events", "COMPRESSION-ROUNDTRIP", option=True),
        ),
        "query_tasks": (
            _b("query-answered", "a query reaches a worker and its result comes back", "QUERY-RESULT-ROUNDTRIP"),
            _b("read-only", "answering a query writes no history", "QUERY-READ-ONLY"),
            _b("timeout", "an unanswered query times out (504)", "QUERY-TIMEOUT-504"),
        ),
        "activity_retry_policy": (
            _b("attempts-bounded", "failed attempts stop at max_attempts", "RETRY-FAILED-ATTEMPTS-BOUNDED"),
            _b("backoff", "a retry waits out its backoff", "ACTIVITY-RETRY-BACKOFF", "RETRY-BACKOFF-SCHEDULE"),
        ),
        "activity_timeouts": (
            _b(
                "schedule-to-close",
                "an attempt past schedule_to_close_timeout ends the execution timed out",
                "TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL",
                "TIMEOUT-TIMED-OUT-EVENT",
            ),
            _b(
                "schedule-to-close-whole-execution",
                "schedule_to_close_timeout runs from scheduling, across retries",
                "TIMEOUT-SCHEDULE-TO-CLOSE-WHOLE-EXECUTION",
            ),
            _b(
                "start-to-close",
                "an attempt past start_to_close_timeout is timed out, and its late complete is stale",
                "TIMEOUT-TIMED-OUT-EVENT",
                "TIMEOUT-LATE-COMPLETE-STALE",
            ),
            _b(
                "heartbeat",
                "an attempt whose heartbeats stop for heartbeat_timeout is timed out and retried or ended",
                "TIMEOUT-HEARTBEAT-ENFORCED",
            ),
            _b(
                "schedule-to-start",
                "a task not claimed within schedule_to_start_timeout is timed out",
                "TIMEOUT-SCHEDULE-TO-START-ENFORCED",
            ),
        ),
        "non_retryable_failures": (
            _b("flag", "a failure with non_retryable true is not retried", "RETRY-NON-RETRYABLE-FLAG"),
            _b("type", "a failure of a non-retryable error type is not retried", "RETRY-NON-RETRYABLE-TYPE"),
            _b(
                "activity-contract",
                "a final activity failure records the failure contract, the stack trace kept out of it",
                "ACTIVITY-FAILURE-CONTRACT",
                "ACTIVITY-FAILURE-DETAILS-UNCHANGED",
            ),
            _b("workflow-failure", "fail_workflow's failure fields are recorded", "COMMANDS-FAIL-WORKFLOW-FAILURE"),
            _b("child-flag", "a child failed with non_retryable true is not retried", "CHILD-FAILURE-NON-RETRYABLE"),
            _b("update-failure", "fail_update's optional failure fields are kept", "UPDATE-FAIL-FIELDS"),
        ),
        "parent_close_policy": (
            _b("default-abandon", "a child without a policy outlives its parent", "CHILD-PARENT-CLOSE-DEFAULT"),
            _b("recorded", "the policy given is the one recorded", "CHILD-POLICY-RECORDED"),
            _b(
                "closes-children",
                "a parent's close terminates or cancels its children as their policy says",
                "CHILD-PARENT-CLOSE-POLICIES",
            ),
        ),
        "child_workflow_retry_policy": (
            _b("backoff", "a failed child run is retried after its backoff", "CHILD-RETRY-BACKOFF"),
            _b(
                "invalid-start",
                "an invalid child start is a protocol error and spends no attempt",
                "CHILD-INVALID-START-NO-ATTEMPT",
            ),
        ),
        "child_workflow_timeouts": (
            _b("run-timeout", "a child run past run_timeout_seconds is closed as timed out", "CHILD-RUN-TIMEOUT"),
            _b(
                "execution-timeout",
                "a child past execution_timeout_seconds is closed, its retries included",
                "CHILD-EXECUTION-TIMEOUT",
            ),
        ),
        "cooperative_cancellation": (
            _b("request", "a parent's close asks its child to cancel cooperatively", "CANCEL-COOPERATIVE-REQUEST"),
            _b("cleanup", "the child cleans up and closes itself", "CANCEL-COOPERATIVE-CLEANUP"),
            _b("deadline", "a child past its cleanup deadline is closed", "CANCEL-COOPERATIVE-DEADLINE"),
            _b("outcome", "the parent's history records how it ended", "CANCEL-COOPERATIVE-OUTCOME"),
            _b("client-request", "a client asks a run to clean up, once per run", "CANCEL-CLIENT-REQUEST"),
        ),
        "worker_session_verbs": (_b("verbs", "create, heartbeat and close a session", "SESSION-EXPLICIT-LIFECYCLE"),),
        "worker_sessions": (
            _b("single-owner", "one worker holds a session at a time", "SESSION-SINGLE-OWNER"),
            _b("admission", "only a worker meeting the requirements is admitted", "SESSION-REQUIREMENTS"),
            _b("expiry", "an unrenewed session expires and can be reacquired", "SESSION-LEASE-EXPIRY"),
            _b("stale-holder", "an old holder is fenced after reacquisition", "SESSION-STALE-HOLDER-FENCED"),
            _b(
                "holder-lost",
                "a session whose holder deregistered or stopped heartbeating is orphaned and reacquirable",
                "SESSION-ORPHANED",
            ),
            _b("activity-limit", "in-session attempts stay within the limit", "SESSION-ACTIVITY-LIMIT"),
        ),
    }
)


def advertised(value: Any) -> bool:
    """Whether a capability value advertises it: ``true``, or a non-empty object or list (never ``false``, ``0``,
    ``[]``, ``{}`` or ``null``) — the reading every check's capability guard uses."""
    return bool(value)


@dataclass(frozen=True, slots=True)
class BehaviourRow:
    """One behaviour of an advertised capability in a run: how often each of its requirements exercised it."""

    name: str
    description: str
    exercised_by: Mapping[str, int]  # requirement → records that exercised it (0: none did)
    applicable: bool = True  # False: after the certified minor, or an option the target showed it does not use

    @property
    def exercised(self) -> bool:
        return any(n > 0 for n in self.exercised_by.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "behaviour": self.name,
            "description": self.description,
            "exercised": self.exercised,
            "applicable": self.applicable,
            "requirements": [{"id": req, "exercised": n} for req, n in self.exercised_by.items()],
        }


@dataclass(frozen=True, slots=True)
class CapabilityRow:
    capability: str
    behaviours: tuple[BehaviourRow, ...]

    @property
    def covered(self) -> bool:
        return all(b.exercised or not b.applicable for b in self.behaviours)

    def to_json(self) -> dict[str, Any]:
        return {
            "capability": self.capability,
            "covered": self.covered,
            "behaviours": [b.to_json() for b in self.behaviours],
        }


def ledger(
    capabilities: Mapping[str, Any],
    exercised: Mapping[str, int],
    certified_minor: int,
    unused: Iterable[str] = (),
) -> tuple[CapabilityRow, ...]:
    """The capability ledger of a run: one row per capability the target advertises that :data:`PROMISES` knows,
    in the table's order. ``exercised`` maps a requirement ID to how many records exercised it. A behaviour whose
    requirements all came after ``certified_minor`` is not applicable (the capability is not judged at that
    minor); it neither counts nor blocks. Neither does a behaviour that is the server's option (``Behaviour.option``)
    when the target showed it does not use it: every requirement of it in ``unused`` (its checks found the option
    unused) and none exercised. A server may compress history above the threshold; this one never did."""
    unused = frozenset(unused)
    rows = []
    for capability, behaviours in PROMISES.items():
        if not advertised(capabilities.get(capability)):
            continue
        rows.append(
            CapabilityRow(
                capability,
                tuple(
                    BehaviourRow(
                        b.name,
                        b.description,
                        {req: int(exercised.get(req, 0)) for req in b.requirements},
                        any(applicable(REGISTRY[req], certified_minor) for req in b.requirements)
                        and not (b.option and all(req in unused and not exercised.get(req) for req in b.requirements)),
                    )
                    for b in behaviours
                ),
            )
        )
    return tuple(rows)


def unexercised(rows: Iterable[CapabilityRow]) -> list[tuple[str, str]]:
    """``(capability, behaviour)`` for every applicable behaviour of an advertised capability no record exercised."""
    return [(r.capability, b.name) for r in rows for b in r.behaviours if b.applicable and not b.exercised]


def validate_promises() -> None:
    """Raise ``ValueError`` listing every problem in :data:`PROMISES`: an unknown requirement, a behaviour that
    names none, a behaviour name used twice under one capability."""
    problems = []
    for capability, behaviours in PROMISES.items():
        names = [b.name for b in behaviours]
        problems += [f"{capability}: behaviour {n!r} twice" for n in sorted({n for n in names if names.count(n) > 1})]
        for b in behaviours:
            if not b.requirements:
                problems.append(f"{capability}.{b.name}: names no requirement that exercises it")
            problems += [f"{capability}.{b.name}: unknown requirement {r}" for r in b.requirements if r not in REGISTRY]
    if problems:
        raise ValueError("capability promises are unsound:\n  " + "\n  ".join(problems))
