"""Failures first: the order a run's items go in, so ``-x`` and server CI see a first failure in seconds.

A broken server usually shows it in its first answers: the discovery document, the envelope and version
headers, authentication, the codec, the schema of the first responses, input any client may get wrong. Those
checks are cheap (a few requests each) and broad (every other check depends on them), so they run first. The
other checks follow by cost, cheapest first — shortest first is the order that makes the time until the first
failing check shortest on average — and last the state machines and fuzz groups, the longest of those first,
so that under ``pytest -n`` the workers finish together rather than one running the longest item alone. In
real time the checks that restart the target come right after the broad ones: a restart runs alone, and every
item after it may then overlap (suite.overlap), the machines from the start.

Costs are the seconds each item took against the reference server (``suite/costs.json``), in the mode the run
uses: with the target's test clock, or waiting in real time, where the lease, timer and timeout checks take
seconds. An item without a measured cost counts as the median of its kind. Ties keep the registry's order
(area, then name), so an order is the same from run to run. ``--area-order`` keeps the registry's order
throughout (checks by area, then machines, then fuzzing).

``python -m suite.ordering results.json --mode test-clock|real-time`` writes the costs of a run into
``suite/costs.json`` (run it after adding checks; a test keeps every name in it a registry entry).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from suite.protocol.requirements import Area
from suite.text import plural

from .outcomes import Kind
from .registry import Check

__all__ = ["BROAD_AREAS", "BROAD_CHECKS", "MODES", "costs", "failures_first", "main", "sort_key"]

# Areas whose checks are cheap and broad, in this order: a server broken here is broken for every other check.
BROAD_AREAS = (Area.DISCOVERY, Area.ENVELOPE, Area.VERSIONING, Area.AUTH, Area.CODEC)
# Cheap checks of other areas that judge the first answers of any server: their schemas and the input any
# client may get wrong (missing fields, unknown workers, unknown fields); and a waiting poll woken by new work,
# which every worker relies on and which ends a held poll when the suite moves a test clock (a server that
# ignores wake-ups holds every later check's polls for their whole time, and the checks that time a lease
# cannot judge).
BROAD_CHECKS = frozenset(
    {
        "responses_match_schemas",
        "register_validation",
        "poll_missing_fields",
        "poll_unregistered_worker",
        "unknown_fields_ignored",
        "long_poll_delivers_immediately",
    }
)
MODES = ("test-clock", "real-time")
COSTS_FILE = "costs.json"

T = TypeVar("T")


@functools.cache
def costs() -> dict[str, dict[str, float]]:
    """mode → item id (``dw::…``) → seconds, as measured against the reference server."""
    text = resources.files("suite").joinpath(COSTS_FILE).read_text(encoding="utf-8")
    doc = json.loads(text)
    return {mode: {k: float(v) for k, v in doc.get(mode, {}).items()} for mode in MODES}


def sort_key(entry: Check, index: int, mode: str) -> tuple[int, float, int]:
    """(class, cost, registry position): lower runs earlier."""
    table = costs()[mode]
    kind_costs = [v for k, v in table.items() if _kind_of(k) is entry.kind]
    cost = table.get(entry.test_id, statistics.median(kind_costs) if kind_costs else 0.0)
    if entry.kind is not Kind.CHECK:
        return 2, -cost, index  # the machines and fuzz groups: longest first
    if entry.primary.area in BROAD_AREAS:
        return 0, float(BROAD_AREAS.index(entry.primary.area)), index
    if entry.name in BROAD_CHECKS:
        return 0, float(len(BROAD_AREAS)), index
    if entry.restarts and mode == "real-time":
        # A restart runs alone (suite.overlap): done right after the broad checks, everything after it overlaps.
        return 0, float(len(BROAD_AREAS) + 1), index
    return 1, cost, index


def failures_first(
    items: Sequence[T], mode: str, entry_of: Callable[[T], Any] = lambda item: getattr(item, "entry", None)
) -> list[T]:
    """``items`` in failures-first order for a run in ``mode`` (``test-clock`` or ``real-time``); items without
    a registry entry keep their place after all the others."""

    def key(pair: tuple[int, T]) -> tuple[int, float, int]:
        index, item = pair
        entry = entry_of(item)
        return sort_key(entry, index, mode) if isinstance(entry, Check) else (3, 0.0, index)

    return [item for _, item in sorted(enumerate(items), key=key)]


def _kind_of(test_id: str) -> Kind:
    group = test_id.split("::")[1] if test_id.count("::") >= 2 else ""
    return {Kind.MACHINE.value: Kind.MACHINE, Kind.FUZZ.value: Kind.FUZZ}.get(group, Kind.CHECK)


def measured(results: dict[str, Any]) -> dict[str, float]:
    """Item id → seconds from a run's ``results.json``: a check's duration, a fuzz group's operations added
    up, a machine's run once (each of its records carries the whole run)."""
    seconds: dict[str, float] = defaultdict(float)
    for record in results.get("checks", []):
        test_id, duration = str(record.get("test_id") or ""), float(record.get("duration_seconds") or 0.0)
        if not test_id:
            continue
        if record.get("kind") == Kind.MACHINE.value:
            seconds[test_id] = max(seconds[test_id], duration)
        else:
            seconds[test_id] += duration
    return {k: round(v, 3) for k, v in sorted(seconds.items())}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m suite.ordering",
        description="Write the item costs of a run (its results.json) into suite/costs.json for one mode.",
    )
    p.add_argument("results", help="results.json of a full run against the reference server")
    p.add_argument("--mode", choices=MODES, required=True, help="how that run let time pass")
    p.add_argument("--out", default=str(Path(__file__).with_name(COSTS_FILE)), help="default: suite/costs.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    doc = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    doc[args.mode] = measured(json.loads(Path(args.results).read_text(encoding="utf-8")))
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{out}: {plural(len(doc[args.mode]), 'item')} ({args.mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
