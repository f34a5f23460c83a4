"""Verdicts, the one record every check, machine and fuzz group produces, and the typed exceptions a check
raises to reach a verdict.

The tree::

    Exception
    ├── CheckFailure (AssertionError)   the target broke a rule: verdict failed (MUST) or non-strict (SHOULD)
    ├── NotCovered                      the check could not run here (e.g. needs a lease shorter than --max-wait)
    ├── Unimplemented                   an optional capability the target does not advertise
    └── HarnessError                    the harness or the network broke: never the target's failure
        └── Indeterminate               a fault left a request's outcome unknown: the check runs again

Every failure carries the exchanges that show it, so a report can print the request, the response and a
``curl`` line that reproduces it.

A run ends in one :class:`RunVerdict`, each with its exit status (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from suite.protocol.requirements import REGISTRY, Level

from .exchange import Exchange

__all__ = [
    "EXIT_CODES",
    "EXIT_HARNESS_ERROR",
    "EXIT_INCOMPLETE_CERTIFY",
    "EXIT_NOT_CONFORMANT",
    "EXIT_USAGE",
    "REFERENCE_FLAGS",
    "STOPPING",
    "VERDICT_ORDER",
    "CheckFailure",
    "FuzzStats",
    "HarnessError",
    "Indeterminate",
    "Kind",
    "NotCovered",
    "Record",
    "RunVerdict",
    "Stopped",
    "Unimplemented",
    "Verdict",
    "broken",
    "exit_status",
    "profile_setting",
    "worst",
]


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # a MUST is broken
    NON_STRICT = "non-strict"  # a SHOULD is broken (fails only under --strict)
    UNIMPLEMENTED = "unimplemented"  # an optional capability is not advertised
    NOT_COVERED = "not-covered"  # the check could not run against this target, with a reason
    ERROR = "error"  # the harness or the network broke
    INFORMATIONAL = "informational"  # works but not advertised
    NOT_APPLICABLE = "not-applicable"  # introduced after the protocol minor being certified


# When several checks judge one requirement, the requirement gets the most severe verdict. A check that
# could not run (not covered) says nothing, so any check that did run and passed covers the requirement.
VERDICT_ORDER: dict[Verdict, int] = {
    Verdict.FAILED: 6,
    Verdict.ERROR: 5,
    Verdict.NON_STRICT: 4,
    Verdict.UNIMPLEMENTED: 3,
    Verdict.INFORMATIONAL: 2,
    Verdict.PASSED: 1,
    Verdict.NOT_COVERED: 0,
    Verdict.NOT_APPLICABLE: -1,
}


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    return max(verdicts, key=VERDICT_ORDER.__getitem__) if verdicts else Verdict.NOT_COVERED


def broken(requirement: str) -> Verdict:
    """The verdict of a broken rule: failed for a MUST, non-strict for a SHOULD or MAY."""
    req = REGISTRY.get(requirement)
    return Verdict.FAILED if req is None or req.level is Level.MUST else Verdict.NON_STRICT


class RunVerdict(StrEnum):
    """How a whole run ends (README "Verdicts"); exactly one per run."""

    CONFORMANT = "CONFORMANT"  # every applicable requirement judged, none failed, nothing narrowed the run
    NOT_CONFORMANT = "NOT CONFORMANT"  # a MUST is broken (or a SHOULD under --strict)
    INCOMPLETE = "INCOMPLETE"  # nothing that ran failed, but the run did not check everything
    HARNESS_ERROR = "HARNESS ERROR"  # the suite or the network broke, or nothing ran: no verdict on the target


EXIT_NOT_CONFORMANT = 1
EXIT_USAGE = 4  # pytest's own code for a usage error: bad options, refused before the first request
EXIT_HARNESS_ERROR = 10
EXIT_INCOMPLETE_CERTIFY = 11  # --certify: the run did not check everything, so it certifies nothing

# What each run verdict exits with; INCOMPLETE exits 0 so server CI can gate on a subset, except under
# --certify (EXIT_INCOMPLETE_CERTIFY).
EXIT_CODES: Mapping[RunVerdict, int] = {
    RunVerdict.CONFORMANT: 0,
    RunVerdict.NOT_CONFORMANT: EXIT_NOT_CONFORMANT,
    RunVerdict.INCOMPLETE: 0,
    RunVerdict.HARNESS_ERROR: EXIT_HARNESS_ERROR,
}


def exit_status(verdict: RunVerdict, *, certify: bool) -> int:
    """The exit status of a run: a certification run exits 0 only when CONFORMANT."""
    if certify and verdict is RunVerdict.INCOMPLETE:
        return EXIT_INCOMPLETE_CERTIFY
    return EXIT_CODES[verdict]


class Kind(StrEnum):
    """What an entry of the registry is; every kind produces the same :class:`Record`."""

    CHECK = "check"  # a plain async function (suite/checks/)
    MACHINE = "machine"  # a Hypothesis state machine (suite/machines/)
    FUZZ = "fuzz"  # a group of OpenAPI operations fuzzed by Schemathesis (suite/fuzz.py)


# The counters of a fuzz run, in the order the report shows them.
FUZZ_COUNTERS = ("cases", "coverage", "positive", "negative", "live", "compared", "unsendable", "sequences", "requests")


@dataclass(frozen=True)
class FuzzStats:
    """What fuzzing one operation (or the stateful sequence) sent and got: a labelled row of the report."""

    operation: str
    group: str
    cases: int = 0
    coverage: int = 0  # Schemathesis coverage-phase cases
    positive: int = 0
    negative: int = 0
    live: int = 0  # cases aimed at a live workflow
    compared: int = 0  # state comparisons before and after a rejected call
    unsendable: int = 0  # cases the HTTP client could not send
    sequences: int = 0  # stateful: start → register → poll → complete sequences
    requests: int = 0
    statuses: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Record:
    """One verdict of one registry entry on its requirements: what checks, machines and fuzz groups all
    produce, what crosses from an xdist worker to the controller, and what every report is written from.

    ``check`` names what judged (a check's function name, ``machine:<name>``, ``fuzz:<operationId>``);
    ``test_id`` is the pytest item that ran it (``dw::VERSION-TRIM::version_trimmed``).
    """

    kind: Kind
    check: str
    test_id: str = ""  # stamped by the item that ran the entry
    requirements: tuple[str, ...] = ()
    verdict: Verdict = Verdict.PASSED
    message: str = ""
    failed_requirement: str | None = None
    doc: str = ""
    capability: str | None = None
    setting: str | None = None  # not covered: what would cover it
    duration_seconds: float = 0.0
    requests: int = 0
    exchanges: tuple[Mapping[str, Any], ...] = ()
    fault_reruns: int = 0
    indeterminate: tuple[str, ...] = ()
    ledger: Mapping[str, int] | None = None  # machines: how often each hard state was reached
    cells: Mapping[str, int] | None = None  # machines: how often each coverage cell was hit
    budget: Mapping[str, Any] | None = None  # machines: examples, steps, seed, shrink
    replay: str | None = None  # machines: the replay bundle of a failure
    fuzz: FuzzStats | None = None
    campaign: Mapping[str, Any] | None = None  # machines under --campaign or --example-db: what was spent, replayed

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind.value
        out["verdict"] = self.verdict.value
        out["requirements"] = list(self.requirements)
        out["exchanges"] = [dict(e) for e in self.exchanges]
        out["indeterminate"] = list(self.indeterminate)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Record:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in doc.items() if k in known}
        values["kind"] = Kind(values["kind"])
        values["verdict"] = Verdict(values["verdict"])
        values["requirements"] = tuple(values["requirements"])
        values["exchanges"] = tuple(values.get("exchanges") or ())
        values["indeterminate"] = tuple(values.get("indeterminate") or ())
        if values.get("fuzz") is not None:
            values["fuzz"] = FuzzStats(**values["fuzz"])
        return cls(**values)


class CheckFailure(AssertionError):
    """The target broke the rule a check enforces.

    ``expected`` and ``received`` are short human strings ("409 lease_owner_mismatch" / "200"); the
    exchanges are the evidence.
    """

    def __init__(
        self,
        message: str,
        *,
        expected: Any = None,
        received: Any = None,
        exchanges: list[Exchange] | None = None,
        requirement: str | None = None,
    ) -> None:
        self.message = message
        self.expected = expected
        self.received = received
        self.exchanges: list[Exchange] = list(exchanges or [])
        self.requirement = requirement
        text = message
        if expected is not None or received is not None:
            text += f"\n  Expected: {expected}\n  Received: {received}"
        super().__init__(text)


# Where the reference server sets each test-profile key (python -m reference_server --help), named in the
# "to cover it" advice beside the key a vendor's server must advertise.
REFERENCE_FLAGS: Mapping[str, str] = {
    "workflow_task_lease_seconds": "--lease-seconds 3",
    "activity_task_lease_seconds": "--activity-lease-seconds 3",
    "query_task_timeout_seconds": "--query-timeout 3",
    "long_poll_max_seconds": "--long-poll-max 8",
    "max_active_leases_per_queue": "--max-active-leases-per-queue 16",
    "cancellation_cleanup_seconds": "--cancellation-cleanup-seconds 3",
    "matching_switch": "always served",
    "stale_worker_seconds": "fixed at 60 s; its test clock covers the wait",
}


def profile_setting(key: str) -> str:
    """The advice for a test-profile key: the key a server advertises, and the reference server's flag."""
    flag = REFERENCE_FLAGS.get(key)
    return f"worker_protocol.test_profile.{key}" + (f" (reference server: {flag})" if flag else "")


class NotCovered(Exception):
    """The check cannot run against this target. ``setting`` names exactly what would cover it: a server
    setting (a test-profile key, see :func:`profile_setting`), an option of the suite with its value
    (``--max-wait 65``), or both."""

    def __init__(self, reason: str, setting: str | None = None) -> None:
        self.reason = reason
        self.setting = setting
        super().__init__(reason if setting is None else f"{reason} (to cover it: {setting})")


class Unimplemented(Exception):
    """The target does not advertise (or declare) the optional capability this check needs; ``reason`` says so in
    other words where the option is not a discovery flag."""

    def __init__(self, capability: str, reason: str | None = None) -> None:
        self.capability = capability
        super().__init__(reason or f"capability {capability!r} is not advertised by the target")


class HarnessError(Exception):
    """The harness could not do its job: target down, connection refused, a network timeout."""


class Indeterminate(HarnessError):
    """A request's outcome is unknown to the check — its answer was lost after the target may have applied
    it, or the network delivered it twice and the second delivery may have changed state — so the check
    cannot go on judging. Under ``--faults`` the check is run again in a fresh world; it is never the
    target's failure. Machines treat it as any lost answer: *maybe applied* — up to ``copies`` times (2 when
    the network delivered the request twice and both deliveries were accepted)."""

    def __init__(self, message: str, *, copies: int = 1) -> None:
        super().__init__(message)
        self.copies = copies


# Set when the run stops (``-x``, an interrupt) while machines and fuzz groups started ahead of their turn are
# still running: each then ends at its next request instead of running out its budget for nobody.
STOPPING = threading.Event()


class Stopped(BaseException):
    """Raised by a machine's or fuzz group's next request once the run has stopped. Not an ``Exception``:
    Hypothesis lets it through at once, as it does an interrupt, without shrinking or replaying anything."""
