"""Verdicts, and the typed exceptions a check raises to reach one.

The tree::

    Exception
    ├── CheckFailure (AssertionError)   the target broke a rule: verdict failed (MUST) or non-strict (SHOULD)
    ├── NotCovered                      the check could not run here (e.g. needs a lease shorter than --max-wait)
    ├── Unimplemented                   an optional capability the target does not advertise
    └── HarnessError                    the harness or the network broke: never the target's failure
        └── Indeterminate               a fault left a request's outcome unknown: the check runs again

Every failure carries the exchanges that show it, so a report can print the request, the response and a
``curl`` line that reproduces it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import Exchange

__all__ = [
    "VERDICT_ORDER",
    "CheckFailure",
    "HarnessError",
    "Indeterminate",
    "NotCovered",
    "Unimplemented",
    "Verdict",
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
}


def worst(verdicts: list[Verdict]) -> Verdict:
    return max(verdicts, key=VERDICT_ORDER.__getitem__) if verdicts else Verdict.NOT_COVERED


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


class NotCovered(Exception):
    """The check cannot run against this target. ``setting`` names what would cover it."""

    def __init__(self, reason: str, setting: str | None = None) -> None:
        self.reason = reason
        self.setting = setting
        super().__init__(reason if setting is None else f"{reason} (to cover it: {setting})")


class Unimplemented(Exception):
    """The target does not advertise the optional capability this check needs."""

    def __init__(self, capability: str) -> None:
        self.capability = capability
        super().__init__(f"capability {capability!r} is not advertised by the target")


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
