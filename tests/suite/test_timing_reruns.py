"""A check that cannot judge because delays, not the target, decided an answer (an ``Indeterminate``: a lease
that may have lapsed on its own while a loaded machine held the check back) runs again in a fresh world, also
without ``--faults``; one that never can is a harness error, never the target's failure."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from suite import run
from suite.outcomes import Indeterminate, Kind, Verdict
from suite.registry import Check

CHECK = Check(kind=Kind.CHECK, name="c", requirements=("VERSION-TRIM",), fn=None, capability=None, slow=False, doc="")
TARGET: Any = SimpleNamespace(certified_minor=20, server_capabilities={}, fault_ledger=None, strict=False)


def _attempts(monkeypatch: pytest.MonkeyPatch, outcomes: list[BaseException | None]) -> list[int]:
    made: list[int] = []

    async def attempt(check: Check, target: Any) -> tuple[Any, BaseException | None]:
        made.append(len(made))
        return SimpleNamespace(exchanges=[]), outcomes[min(len(made) - 1, len(outcomes) - 1)]

    monkeypatch.setattr(run, "_attempt", attempt)
    return made


def test_a_check_that_could_not_judge_once_runs_again_and_is_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _attempts(monkeypatch, [Indeterminate("the lease may have lapsed on its own"), None])
    [record] = asyncio.run(run.check_records(CHECK, TARGET))
    assert len(made) == 2
    assert record.verdict is Verdict.PASSED
    assert record.fault_reruns == 1


def test_a_check_that_never_could_judge_is_a_harness_error_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _attempts(monkeypatch, [Indeterminate("the lease may have lapsed on its own")])
    [record] = asyncio.run(run.check_records(CHECK, TARGET))
    assert len(made) == run.TIMING_ATTEMPTS
    assert record.verdict is Verdict.ERROR
    assert "3 attempts in a row could not judge" in record.message
