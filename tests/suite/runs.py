"""Runs of the suite built by hand, for the tests of verdicts, reports and bundles.

``complete_records()`` is what a run that executed every item of the registry and passed everything
records; the tests change one thing in it (a failure, a harness error, a requirement not covered, a
selection) and show the verdict rule that change must trip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from suite.context import TargetInfo
from suite.outcomes import Kind, Record, Verdict
from suite.protocol.coverage import applicable_entities, cells
from suite.registry import entries
from suite.results import Completeness, build_results

RUN = {
    "run_id": "20260101T000000Z-abc123",
    "started_at": "2026-01-01T00:00:00+00:00",
    "finished_at": "2026-01-01T00:02:10+00:00",
    "seed": 7,
    "command": "pytest --target=http://127.0.0.1:9 --worker-token <redacted>",
}
OPTIONS = {"target": "http://127.0.0.1:9", "worker_token": "<set>", "operator_token": None, "strict": False}
UNREACHABLE = "http://127.0.0.1:1"  # nothing listens: a run that got past its checks would end in a harness error


def target(*, strict: bool = False, minor: str = "1.20", embedded: bool = False) -> TargetInfo:
    return TargetInfo(
        url="http://127.0.0.1:9",
        cluster_info={
            "version": "0.1.0",
            "server_id": "srv-1",
            "worker_protocol": {"version": "1.20", "server_capabilities": {"poll_status": True}},
        },
        strict=strict,
        protocol_version=minor,
        embedded=embedded,
    )


def all_cells(capabilities: dict[str, Any] | None = None) -> dict[str, int]:
    """One hit on every reachable coverage cell of the entities ``capabilities`` (the test target's) bring in."""
    caps = target().server_capabilities if capabilities is None else capabilities
    return {c.key: 1 for e in applicable_entities(caps) for c in cells(e) if c.ruled_out is None}


def complete_records() -> list[Record]:
    """One passing record for every item of the registry, on all of its requirements; the machines together
    reach every reachable coverage cell of the entities the test target's capabilities bring in."""
    out = []
    reached = all_cells()
    for entry in entries():
        fuzz = None
        if entry.kind is Kind.FUZZ:
            from suite.outcomes import FuzzStats

            fuzz = FuzzStats(operation=f"op_{entry.name}", group=entry.name, cases=12, requests=30, seconds=0.5)
        out.append(
            Record(
                kind=entry.kind,
                check=entry.record_name,
                test_id=entry.test_id,
                requirements=entry.requirements,
                verdict=Verdict.PASSED,
                duration_seconds=0.1,
                requests=2,
                fuzz=fuzz,
                ledger={"lease_granted": 3} if entry.kind is Kind.MACHINE else None,
                cells=reached if entry.kind is Kind.MACHINE else None,
            )
        )
    return out


def changed(records: list[Record], test_id: str, **changes: Any) -> list[Record]:
    """``records`` with the record of ``test_id`` changed."""
    assert any(r.test_id == test_id for r in records), test_id
    return [replace(r, **changes) if r.test_id == test_id else r for r in records]


def results_of(
    records: list[Record],
    *,
    strict: bool = False,
    completeness: Completeness | None = None,
    minor: str = "1.20",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    items = len(entries())
    return build_results(
        target(strict=strict, minor=minor),
        records,
        RUN,
        options={**OPTIONS, "strict": strict, **(options or {})},
        completeness=completeness or Completeness(items=items),
    )


@dataclass
class Cli:
    returncode: int
    output: str


def pytest_cli(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Cli:
    """``python -m pytest ARGS`` from ``cwd`` (no project configuration applies), as a user runs it."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    environ = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DW_"))}, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environ)
    return Cli(proc.returncode, proc.stdout + proc.stderr)
