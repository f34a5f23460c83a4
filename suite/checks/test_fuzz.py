"""OpenAPI-driven fuzzing as pytest items: one item per group of operations, after the checks and machines.

Each item fuzzes its operations with ``--fuzz-examples`` Schemathesis cases each (0 disables the items),
seeded from the session seed, and records one verdict record per judged requirement and operation
(check ``fuzz:<operationId>``) in the format of :func:`suite.plugin.run_check`, so the reports and the
per-requirement verdicts include what the fuzzing found. Each item is parametrized with a
:class:`~suite.registry.Check` naming the requirements, so ``--requirement`` selects it like any check.
"""

from __future__ import annotations

import asyncio

import pytest

from suite.context import CheckContext, TargetInfo
from suite.fuzz import FuzzBudget, FuzzResult, all_groups, fuzz_group, group_members, group_requirements
from suite.plugin import run_fuzz_item
from suite.registry import Check, CheckFn


def _runner(group: str) -> CheckFn:
    """The group as a plain check (first failure raised), for callers that want a single verdict."""

    async def fuzz(ctx: CheckContext) -> None:
        def run() -> list[FuzzResult]:
            return list(fuzz_group(ctx.target, group, FuzzBudget()))

        for result in await asyncio.to_thread(run):
            failure = result.first_failure()
            if failure is not None:
                raise failure

    fuzz.__name__ = f"fuzz_{group.replace('-', '_')}"
    return fuzz


def _group_check(group: str) -> Check:
    members = ", ".join(group_members(group))
    return Check(
        name=f"fuzz:{group}",
        fn=_runner(group),
        requirements=group_requirements(group),
        capability=None,
        slow=False,
        doc=f"Schemathesis cases for {members}: no 5xx, documented statuses and schemas, error envelopes, "
        "rejected calls change nothing.",
    )


@pytest.mark.parametrize("check", [pytest.param(_group_check(g), id=g) for g in all_groups()])
def test_fuzz(check: Check, dw_target: TargetInfo, request: pytest.FixtureRequest) -> None:
    run_fuzz_item(check, dw_target, request.node)
