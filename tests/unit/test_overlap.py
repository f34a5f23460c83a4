"""suite.overlap: checks started ahead of their turn, at most ``limit`` at once, each item taking its own records;
the checks nobody takes are cancelled when the run stops."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

from suite.outcomes import Kind, Record
from suite.overlap import Overlap
from suite.registry import Check


def _check(name: str) -> Check:
    return Check(
        kind=Kind.CHECK, name=name, requirements=("VERSION-TRIM",), fn=None, capability=None, slow=False, doc=""
    )


class _Waits:
    """A start function whose checks wait until released: what overlaps is seen, not timed."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.most = 0
        self.cancelled: list[str] = []
        self.release = threading.Event()

    async def __call__(self, check: Check) -> list[Record]:
        self.running.add(check.name)
        self.most = max(self.most, len(self.running))
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            self.cancelled.append(check.name)
            raise
        finally:
            self.running.discard(check.name)
        return [Record(Kind.CHECK, check.name, f"dw::{check.name}", check.requirements)]


def _wait_for(condition: Any) -> None:
    event = threading.Event()
    for _ in range(2000):  # 10 s at most
        if condition():
            return
        event.wait(0.005)
    raise AssertionError("condition not reached")


def test_checks_ahead_run_at_most_limit_at_once_and_each_item_takes_its_own_records() -> None:
    waits = _Waits()
    overlap = Overlap(waits, limit=3)
    ahead = [(f"dw::c{i}", _check(f"c{i}")) for i in range(7)]
    try:
        first = threading.Thread(target=lambda: overlap.take("dw::c0", ahead))
        first.start()
        _wait_for(lambda: len(waits.running) == 3)
        assert waits.running == {"c0", "c1", "c2"}  # the earliest first, and no more than the limit
        waits.release.set()
        first.join(timeout=10)
        for test_id, check in ahead[1:]:
            records = overlap.take(test_id, ahead[ahead.index((test_id, check)) :])
            assert [r.check for r in records] == [check.name]
        assert waits.most == 3
        assert overlap.started == 7
    finally:
        overlap.close()


def test_the_checks_nobody_takes_are_cancelled_when_the_run_stops() -> None:
    waits = _Waits()
    overlap = Overlap(waits, limit=2)
    ahead = [(f"dw::c{i}", _check(f"c{i}")) for i in range(4)]
    taken: list[BaseException] = []

    def take() -> None:
        try:
            overlap.take("dw::c0", ahead)
        except concurrent.futures.CancelledError as exc:
            taken.append(exc)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    _wait_for(lambda: len(waits.running) == 2)
    overlap.close()  # as after -x: c0's taker is still waiting, c1 runs, c2 and c3 never started
    assert sorted(waits.cancelled) == ["c0", "c1"]
    assert overlap.started == 2
    taker.join(timeout=10)
    assert len(taken) == 1  # the item that waited is told its check was cancelled, not handed records
