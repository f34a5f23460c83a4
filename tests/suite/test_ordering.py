"""Failures first (``suite.ordering``): the broad, cheap checks lead, the other checks follow by measured cost,
the machines and fuzz groups come last, longest first; ``--area-order`` keeps the registry's order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from suite.ordering import BROAD_AREAS, BROAD_CHECKS, MODES, costs, failures_first, sort_key
from suite.outcomes import Kind
from suite.registry import Check, entries


def _ids(order: list[Check]) -> list[str]:
    return [e.test_id for e in order]


def test_every_item_runs_once_and_broad_checks_lead_in_both_modes() -> None:
    registry = entries()
    for mode in MODES:
        order = failures_first(registry, mode, entry_of=lambda e: e)
        assert sorted(_ids(order)) == sorted(_ids(registry))
        broad = [e.primary.area in BROAD_AREAS or e.name in BROAD_CHECKS for e in order if e.kind is Kind.CHECK]
        assert broad == sorted(broad, reverse=True), "a broad check runs after a narrower one"
        assert order[0].primary.area is BROAD_AREAS[0]


def test_checks_by_cost_then_machines_and_fuzz_longest_first() -> None:
    registry = entries()
    for mode in MODES:
        table = costs()[mode]
        order = failures_first(registry, mode, entry_of=lambda e: e)
        kinds = [e.kind is Kind.CHECK for e in order]
        assert kinds == sorted(kinds, reverse=True), "a machine or fuzz group runs before a check"
        rest = [e for e in order if e.kind is Kind.CHECK and sort_key(e, 0, mode)[0] == 1]
        measured = [table[e.test_id] for e in rest if e.test_id in table]
        assert measured == sorted(measured)
        tail = [table[e.test_id] for e in order if e.kind is not Kind.CHECK and e.test_id in table]
        assert tail == sorted(tail, reverse=True)


def test_the_slow_checks_come_later_without_a_test_clock() -> None:
    registry = entries()
    clock = _ids(failures_first(registry, "test-clock", entry_of=lambda e: e))
    real = _ids(failures_first(registry, "real-time", entry_of=lambda e: e))
    slow = [e.test_id for e in registry if e.slow]
    assert slow
    assert sum(real.index(i) for i in slow) > sum(clock.index(i) for i in slow)


def test_costs_name_only_registry_entries() -> None:
    known = set(_ids(entries()))
    for mode in MODES:
        stale = sorted(set(costs()[mode]) - known)
        assert not stale, f"suite/costs.json ({mode}) names items the registry no longer has: {stale}"


def _collected(tmp_path: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--target=embedded", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return [line for line in proc.stdout.splitlines() if line.startswith("dw::")]


def test_the_plugin_runs_failures_first_unless_area_order_is_asked_for(tmp_path: Path) -> None:
    # The registry's order as collected: an item per entry under a collector per primary requirement or kind.
    groups: dict[str, list[Check]] = {}
    for entry in entries():
        groups.setdefault(entry.group, []).append(entry)
    collected = [e for members in groups.values() for e in members]
    assert _collected(tmp_path, "--area-order") == _ids(collected)
    assert _collected(tmp_path) == _ids(failures_first(collected, "test-clock", entry_of=lambda e: e))
