"""The state machines catch broken servers on their own (not only the plain checks): each named fault
below makes the named machine fail with the expected requirement ID.

Shrinking is switched off here (``--no-machine-shrink``): it replays the failing sequence against the server
many times, which proves nothing more about detection; test_machine_replay.py covers shrinking and replay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, SuiteRun, run_suite

pytestmark = pytest.mark.slow

# fault -> (machine, requirement IDs any of which the machine may report for it)
CAUGHT: dict[str, tuple[str, frozenset[str]]] = {
    "claim-not-conditional": (
        "workflow_leases",
        frozenset({"LEASE-EXCLUSIVE", "LEASE-NOT-SHARED-WHILE-LIVE", "DISPATCH-ONE-LEASE-PER-DELIVERY"}),
    ),
    "accept-stale-attempt": ("workflow_leases", frozenset({"FENCE-ATTEMPT"})),
    "accept-wrong-lease-owner": ("workflow_leases", frozenset({"FENCE-OWNER"})),
    "expired-never-redelivered": ("workflow_leases", frozenset({"EXPIRY-REDELIVER-SAME-TASK"})),
    "skip-run-closed-guard": ("workflow_leases", frozenset({"CANCEL-TASK-RUN-CLOSED"})),
    "retry-past-max-attempts": ("activities", frozenset({"RETRY-FAILED-ATTEMPTS-BOUNDED"})),
    "retry-non-retryable": ("activities", frozenset({"RETRY-NON-RETRYABLE-FLAG", "RETRY-NON-RETRYABLE-TYPE"})),
    "query-writes-history": ("queries_signals", frozenset({"QUERY-READ-ONLY"})),
    "session-shared-lease": ("worker_sessions", frozenset({"SESSION-SINGLE-OWNER"})),
    "session-stale-holder-renews": ("worker_sessions", frozenset({"SESSION-STALE-HOLDER-FENCED"})),
    # Bugs only a multi-step history shows, each found by reading back the full history of a leased task (or
    # the activity numbering) against what the run had acknowledged: exactly the declared requirement.
    "signal-left-out-after-lease": ("queries_signals", frozenset({"HISTORY-PAGINATION-COMPLETE"})),
    "update-accepted-repeated": ("queries_signals", frozenset({"HISTORY-PAGINATION-COMPLETE"})),
    "retry-attempt-restarts-after-heartbeat": ("activities", frozenset({"RETRY-ATTEMPTS-CONTIGUOUS"})),
    "redelivery-history-stale": ("workflow_leases", frozenset({"HISTORY-PAGINATION-COMPLETE"})),
    "continue-as-new-chain-old-run": ("workflow_leases", frozenset({"COMMANDS-CONTINUE-AS-NEW"})),
    "heartbeat-records-first-attempt": ("activities", frozenset({"RETRY-ATTEMPTS-CONTIGUOUS"})),
}
HISTORY_FAULTS = (
    "signal-left-out-after-lease",
    "update-accepted-repeated",
    "retry-attempt-restarts-after-heartbeat",
    "redelivery-history-stale",
    "continue-as-new-chain-old-run",
    "heartbeat-records-first-attempt",
)

# With the test clock: the machines' waits for expiries and backoffs move the server's clock instead of
# taking real time (one suite process per server, so the clock is the machine's alone).
SERVER_ARGS = ("--lease-seconds", "3", "--activity-lease-seconds", "3", "--query-timeout", "3", "--test-clock")


# Through --faults standard an example that meets a fault in its setup is discarded and replaced, lost answers cut
# the hard histories short, and Hypothesis' swarm testing switches a hard-history rule off in some examples: the
# activity machine's retry after a heartbeat came 2-8 times in 24 examples over four fault seeds (four runs side
# by side on two cores), and not once in 24 on a loaded CI machine. The run stops at its first failure, so a
# budget ample for the rarest history costs only the examples until the fault shows.
FAULT_EXAMPLES = 64


def run_machine(url: str, machine: str, tmp_path: Path, *options: str, examples: int = 12) -> SuiteRun:
    """The one machine against ``url``: ``examples`` examples, the fixed seed; returns once the suite has judged."""
    return run_suite(
        url,
        tmp_path / "reports",
        f"dw::machine::{machine}",
        "--machine-examples",
        str(examples),
        *options,
        env={"DW_CONFORMANCE_SEED": "20261129"},
    )


def failed_requirements(run: SuiteRun) -> set[str]:
    assert run.returncode == 1, run.stdout[-3000:]
    assert run.results is not None
    return {r["id"] for r in run.results["requirements"] if r["verdict"] == "failed"}


@pytest.mark.parametrize(("fault", "machine", "requirements"), [(f, m, r) for f, (m, r) in sorted(CAUGHT.items())])
def test_machine_catches_fault(
    fault: str,
    machine: str,
    requirements: frozenset[str],
    server_factory: Callable[..., ServerProcess],
    tmp_path: Path,
) -> None:
    server = server_factory("--fault", fault, *SERVER_ARGS)
    run = run_machine(server.url, machine, tmp_path, "--no-machine-shrink")
    failed = failed_requirements(run)
    assert failed & requirements, f"{fault}: machine {machine} reported {sorted(failed)}\n{run.stdout[-3000:]}"
    if fault in HISTORY_FAULTS:
        assert failed == requirements, f"{fault}: only its rule is broken, not {sorted(failed - requirements)}"
    replay = sorted((tmp_path / "reports").glob(f"*/replay/{machine}/replay.py"))
    assert replay, "a failing machine writes its replay bundle"


@pytest.mark.parametrize(
    "fault",
    [
        # accept-wrong-lease-owner: tests/suite/test_campaign.py runs it through the same faults, storing the failure
        "retry-past-max-attempts",
        "query-writes-history",
        *HISTORY_FAULTS,
    ],
)
def test_machine_catches_fault_through_every_network_fault(
    fault: str, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Under --faults standard (lost answers, duplicates, resets, delays) a machine still finds the bug: its
    model allows every outcome a fault leaves possible, and the violation it meets is kept even when
    Hypothesis' replay of the example meets other faults."""
    machine, requirements = CAUGHT[fault]
    server = server_factory("--fault", fault, *SERVER_ARGS)
    run = run_machine(
        server.url, machine, tmp_path, "--faults", "standard", "--fault-seed", "1", examples=FAULT_EXAMPLES
    )
    failed = failed_requirements(run)
    assert failed & requirements, f"{fault}: machine {machine} reported {sorted(failed)}\n{run.stdout[-3000:]}"


def test_replay_bundle_reproduces_against_any_url(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """The replay script of a failing machine run fails again against a server with the same bug and runs
    clean against a correct one: the verdict is recomputed by the model, not recorded."""
    import subprocess
    import sys

    broken = server_factory("--fault", "accept-wrong-lease-owner", *SERVER_ARGS)
    run = run_machine(broken.url, "workflow_leases", tmp_path, "--no-machine-shrink")
    assert run.returncode == 1, run.stdout[-3000:]
    (script,) = sorted((tmp_path / "reports").glob("*/replay/workflow_leases/replay.py"))

    def replay(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=300)

    again = replay(server_factory("--fault", "accept-wrong-lease-owner", *SERVER_ARGS).url)
    assert again.returncode != 0
    assert "lease_owner_mismatch" in again.stderr
    clean = replay(server_factory(*SERVER_ARGS).url)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "replayed without a violation" in clean.stdout
