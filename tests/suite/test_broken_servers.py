"""The suite catches deliberately broken servers: each named fault of the reference server makes the
requirement it breaks fail, with a readable message, and the correct server passes the same run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, run_suite

# fault -> the requirement whose check must fail against it
CAUGHT = {
    "ignore-version-header": "VERSION-MISSING",
    "drop-poll-status": "POLL-STATUS-PRESENT",
    "accept-wrong-lease-owner": "FENCE-OWNER",
    "history-page-gap": "HISTORY-PAGINATION-COMPLETE",
    "compress-below-threshold": "COMPRESSION-BELOW-THRESHOLD",
}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("fault", "requirement"), sorted(CAUGHT.items()))
def test_fault_is_caught(
    fault: str, requirement: str, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--fault", fault)
    # The plain checks only: the state machines prove themselves in test_machine_mutants.py (they shrink
    # a failure, which takes minutes against a real server).
    run = run_suite(server.url, tmp_path / "reports", "--requirement", requirement, "-k", "test_conformance")
    assert run.returncode == 1, run.stdout[-3000:]
    assert run.verdict(requirement) == "failed", run.stdout[-3000:]
    failure = next(r for r in run.results["requirements"] if r["id"] == requirement)  # type: ignore[index]
    assert failure["exchanges"], "a failure carries the exchanges that show it"
    assert requirement in run.stdout  # the terminal summary names the broken requirement


def test_correct_server_passes_the_same_requirements(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory()
    args = [a for req in CAUGHT.values() for a in ("--requirement", req)]
    run = run_suite(server.url, tmp_path / "reports", *args, "-k", "test_conformance")
    assert run.returncode == 0, run.stdout[-3000:]
    for requirement in CAUGHT.values():
        assert run.verdict(requirement) == "passed", (requirement, run.stdout[-3000:])
