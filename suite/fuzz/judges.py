"""What every fuzz case is judged by: the response checks, each registered with the suite's registry
(:func:`suite.registry.response_check`) and tied to the requirement IDs of docs/reference.md it judges.

A response check reads one :class:`Answer` — the operation, the recorded exchange and the parsed body — and
raises :class:`FuzzFailure` naming the requirement the answer breaks.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Final

from suite.client import WORKER_HEADER
from suite.context import TargetInfo
from suite.exchange import Exchange
from suite.outcomes import CheckFailure
from suite.registry import response_check, response_checks

from .document import Operation, validator

__all__ = [
    "AFTER_COMPLETE",
    "ALWAYS_ALLOWED",
    "ENVELOPE",
    "ERROR_REASON",
    "FUZZ_REQUIREMENTS",
    "NO_5XX",
    "NO_CHANGE",
    "SCHEMA",
    "STATUS_SET",
    "Answer",
    "FuzzFailure",
    "error_envelope",
    "judge",
    "judged_requirements",
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
]

# A hostile request gets one of the statuses its operation documents (ROBUST-STATUS-SET); an oversized body may
# also meet the HTTP layer's 413 before any route runs, a legitimate answer to a request no server has to buffer.
ALWAYS_ALLOWED: Final = frozenset({413})
# The requirement IDs the fuzz judges.
NO_5XX: Final = "ROBUST-NO-5XX"
STATUS_SET: Final = "ROBUST-STATUS-SET"
SCHEMA: Final = "SCHEMA-RESPONSES"
ENVELOPE: Final = "ROBUST-ENVELOPE-ON-ERROR"
ERROR_REASON: Final = "ENVELOPE-ERROR-REASON"
NO_CHANGE: Final = "ROBUST-REJECTED-NO-STATE-CHANGE"  # judged around rejected cases on a live world
AFTER_COMPLETE: Final = "FENCE-AFTER-COMPLETE"  # judged by the stateful sequence only
FUZZ_REQUIREMENTS: Final = (NO_5XX, STATUS_SET, SCHEMA, ENVELOPE, ERROR_REASON, NO_CHANGE)


class FuzzFailure(CheckFailure):
    """A fuzz check failed on one case; ``exchanges[0]`` is the case as sent, with its curl line."""

    def __init__(
        self,
        check: str,
        message: str,
        *,
        requirement: str,
        exchange: Exchange,
        expected: Any = None,
        received: Any = None,
    ) -> None:
        self.check = check
        super().__init__(
            f"{check}: {message}",
            expected=expected,
            received=received,
            exchanges=[exchange],
            requirement=requirement,
        )


@dataclass
class Answer:
    """What a fuzz check sees: the operation, the exchange and the parsed answer."""

    op: Operation
    exchange: Exchange
    status: int
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None
    path: str  # the raw request path, without the query
    target: TargetInfo
    probe: bool = False  # a method the operation does not have (Schemathesis' unexpected-method cases)

    @property
    def reason(self) -> Any:
        return self.body.get("reason") if isinstance(self.body, dict) else None

    @functools.cached_property
    def schema_problems(self) -> list[str]:
        """The body against the schema documented for the operation and status (validated once per answer:
        the exchange's record and :func:`response_schema_conformance` read the same list)."""
        return list(validator()(self.op.method, self.path, self.status, self.body))

    def received(self) -> str:
        text = json.dumps(self.body)[:300] if self.body is not None else repr(self.exchange.response_body)[:300]
        return f"{self.status} {text}"

    def failure(self, check: str, message: str, requirement: str, expected: Any, received: Any = None) -> FuzzFailure:
        """``check``'s failure of ``requirement`` on this answer: ``message`` after the operation's id, the answer
        (or ``received``) against ``expected``, this exchange as the evidence."""
        return FuzzFailure(
            check,
            f"{self.op.op_id} {message}",
            requirement=requirement,
            exchange=self.exchange,
            expected=expected,
            received=self.received() if received is None else received,
        )


@response_check(NO_5XX)
def not_a_server_error(a: Answer) -> None:
    """ROBUST-NO-5XX: no request, however malformed, gets a 5xx (a documented 503/504 is an answer)."""
    # 501 is the HTTP answer to a method the server does not implement at all.
    if a.status >= 500 and a.status not in a.op.statuses and not (a.probe and a.status == 501):
        raise a.failure("not_a_server_error", "answered a server error", NO_5XX, "a 2xx or 4xx answer, never 5xx")


@response_check(STATUS_SET)
def status_code_conformance(a: Answer) -> None:
    """The status is one the document lists for the operation (or 413 for a body over the size limit)."""
    if a.status < 500 and a.status not in a.op.statuses | ALWAYS_ALLOWED and not a.probe:
        expected = f"one of {sorted(a.op.statuses | ALWAYS_ALLOWED)}"
        raise a.failure("status_code_conformance", "answered an undocumented status", STATUS_SET, expected)


@response_check(SCHEMA)
def response_schema_conformance(a: Answer) -> None:
    """The body matches the schema documented for the operation and status."""
    if a.probe or (a.status >= 500 and a.status not in a.op.statuses):
        return  # a server error is not_a_server_error's finding; its body has no schema
    problems = a.schema_problems
    if problems:
        raise a.failure(
            "response_schema_conformance",
            f"{a.status} does not match its schema: {problems[0]}",
            SCHEMA,
            f"a body valid against the {a.status} response schema of {a.op.op_id}",
            "; ".join(problems[:3]),
        )


@response_check(ENVELOPE, ERROR_REASON)
def error_envelope(a: Answer) -> None:
    """A 4xx carries ``reason`` (ENVELOPE-ERROR-REASON); a worker-route 4xx also the worker envelope
    (ROBUST-ENVELOPE-ON-ERROR)."""
    if a.probe or not 400 <= a.status < 500:
        return
    worker = a.op.plane == "worker"
    req = ENVELOPE if worker else ERROR_REASON
    problems: list[str] = []
    if not (isinstance(a.reason, str) and a.reason):
        problems.append(f"reason={a.reason!r}")
    # The HTTP layer's 413 answers before any route: only its reason is required.
    if worker and a.status != 413:
        advertised = a.target.advertised_version
        body = a.body if isinstance(a.body, dict) else {}
        if a.headers.get(WORKER_HEADER.lower()) != advertised:
            problems.append(f"header {WORKER_HEADER}={a.headers.get(WORKER_HEADER.lower())!r}")
        if body.get("protocol_version") != advertised:
            problems.append(f"protocol_version={body.get('protocol_version')!r}")
        if not isinstance(body.get("server_capabilities"), dict):
            problems.append("no server_capabilities object")
    if problems:
        expected = "reason" + (f", {WORKER_HEADER}, protocol_version, server_capabilities" if worker else "")
        raise a.failure("error_envelope", f"{a.status} lacks " + ", ".join(problems), req, expected)


def judged_requirements(a: Answer) -> set[str]:
    """The requirements a response says something about."""
    if a.probe:
        return {NO_5XX}
    out = {NO_5XX, STATUS_SET, SCHEMA}
    if 400 <= a.status < 500:
        out.add(ENVELOPE if a.op.plane == "worker" else ERROR_REASON)
    return out


def judge(a: Answer) -> list[FuzzFailure]:
    """Every registered response check's failure on ``a``, in registration order."""
    found = []
    for registered in response_checks():
        try:
            registered.fn(a)
        except FuzzFailure as failure:
            found.append(failure)
    return found
