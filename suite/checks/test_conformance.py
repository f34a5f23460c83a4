"""The one pytest module of the conformance suite: every registered check is one test item.

The plugin points pytest here when ``--target`` is given; the check registry decides what runs.
"""

from __future__ import annotations

import pytest

from suite.context import TargetInfo
from suite.plugin import run_check
from suite.registry import Check, all_checks


@pytest.mark.parametrize("check", [pytest.param(c, id=c.name) for c in all_checks()])
def test_conformance(check: Check, dw_target: TargetInfo, request: pytest.FixtureRequest) -> None:
    run_check(check, dw_target, request.node)
