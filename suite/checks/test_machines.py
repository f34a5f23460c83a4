"""The stateful machines as pytest items: one item per machine, after the plain checks."""

from __future__ import annotations

import pytest

from suite.context import TargetInfo
from suite.machines import MACHINES, MachineBase
from suite.plugin import run_machine_item


@pytest.mark.parametrize("machine", [pytest.param(m, id=m.name) for m in MACHINES])
def test_machine(machine: type[MachineBase], dw_target: TargetInfo, request: pytest.FixtureRequest) -> None:
    run_machine_item(machine, dw_target, request.node)
