"""suite.overlap: checks started ahead of their turn, at most ``limit`` at once, each item taking its own records;
the checks nobody takes are cancelled when the run stops."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from dataclasses import replace
from typing import Any

import pytest

from suite.outcomes import STOPPING, Kind, Record, Stopped, Verdict
from suite.overlap import Overlap
from suite.registry import Check


def _check(name: str, kind: Kind = Kind.CHECK) -> Check:
    return Check(kind=kind, name=name, requirements=("VERSION-TRIM",), fn=None, capability=None, slow=False, doc="")


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


def _machine(name: str) -> Check:
    return _check(name, Kind.MACHINE)


class _Blocks:
    """A runner of machines (synchronous, one thread each) that wait until released or told to stop."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.threads: set[str] = set()
        self.most = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.stop = threading.Event()
        self.stopped: list[str] = []

    def __call__(self, entry: Check) -> list[Record]:
        with self.lock:
            self.running.add(entry.name)
            self.threads.add(threading.current_thread().name)
            self.most = max(self.most, len(self.running))
        try:
            while not self.release.is_set():
                if self.stop.wait(0.005):
                    self.stopped.append(entry.name)
                    raise RuntimeError("stopped")
        finally:
            with self.lock:
                self.running.discard(entry.name)
        return [Record(Kind.MACHINE, entry.name, f"dw::{entry.name}", entry.requirements)]


def test_machines_ahead_run_in_threads_of_their_own_beside_the_checks_at_most_limit_at_once() -> None:
    waits, blocks = _Waits(), _Blocks()
    overlap = Overlap(waits, limit=2, block=blocks, stop=blocks.stop.set)
    ahead = [("dw::c0", _check("c0")), *((f"dw::m{i}", _machine(f"m{i}")) for i in range(3))]
    try:
        taker = threading.Thread(target=lambda: overlap.take("dw::c0", ahead))
        taker.start()
        # The check and two machines (the limit) at once, as soon as the first item is taken.
        _wait_for(lambda: waits.running == {"c0"} and blocks.running == {"m0", "m1"})
        assert len(blocks.threads) == 2
        waits.release.set()
        blocks.release.set()
        taker.join(timeout=10)
        for test_id, entry in ahead[1:]:
            assert [r.check for r in overlap.take(test_id, [])] == [entry.name]
        assert blocks.most == 2
        assert len(blocks.threads) == 3
    finally:
        overlap.close()


def test_a_machine_started_ahead_is_told_to_stop_and_one_not_yet_started_never_starts_when_the_run_stops() -> None:
    waits, blocks = _Waits(), _Blocks()
    overlap = Overlap(waits, limit=1, block=blocks, stop=blocks.stop.set)
    ahead = [("dw::c0", _check("c0")), ("dw::m0", _machine("m0")), ("dw::m1", _machine("m1"))]
    taker = threading.Thread(target=lambda: _swallow(lambda: overlap.take("dw::c0", ahead)), daemon=True)
    taker.start()
    _wait_for(lambda: blocks.running == {"m0"})
    overlap.close()  # as after -x
    assert blocks.stopped == ["m0"]
    assert blocks.running == set()
    assert blocks.threads == {"dw-overlap-m0"}  # m1 waited for a slot and was never run
    taker.join(timeout=10)


def test_without_a_runner_for_machines_only_checks_run_ahead() -> None:
    waits = _Waits()
    overlap = Overlap(waits, limit=2)
    ahead = [("dw::c0", _check("c0")), ("dw::m0", _machine("m0"))]
    waits.release.set()
    try:
        assert not overlap.blocks()
        overlap.take("dw::c0", ahead)
        with pytest.raises(KeyError):  # never started ahead: nothing to take
            overlap.take("dw::m0", [])
    finally:
        overlap.close()


def _swallow(fn: Any) -> None:
    with contextlib.suppress(concurrent.futures.CancelledError):  # the item's check, cancelled as the run stops
        fn()


def test_a_parse_run_from_inside_a_parse_on_the_same_thread_does_not_wait_for_itself() -> None:
    """A parse may collect garbage whose finalizer formats a traceback, which parses again on the same thread:
    the lock that keeps two threads from parsing at once must let that one through."""
    import ast

    from suite import overlap as overlap_module

    overlap_module.one_parse_at_a_time()
    done = threading.Event()

    def nested() -> None:
        with overlap_module._PARSING:  # as the outer parse holds it
            ast.parse("x = 1")
        done.set()

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert done.is_set(), "the nested parse waited for the lock its own thread holds"


class _FailsFast:
    """Checks of which ``slow`` waits until released and every other ends at once, failing when named in
    ``failing``: what reports first under -x is seen, not timed."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.release = threading.Event()

    async def __call__(self, check: Check) -> list[Record]:
        while check.name == "slow" and not self.release.is_set():
            await asyncio.sleep(0.005)
        verdict = Verdict.FAILED if check.name in self.failing else Verdict.PASSED
        return [replace(Record(Kind.CHECK, check.name, f"dw::{check.name}", check.requirements), verdict=verdict)]


def _fails(records: list[Record]) -> bool:
    return any(r.verdict is Verdict.FAILED for r in records)


def test_under_x_a_failure_found_ahead_reports_before_the_item_whose_turn_it_is() -> None:
    checks = _FailsFast({"late"})
    overlap = Overlap(checks, limit=4)
    ahead = [(f"dw::{n}", _check(n)) for n in ("first", "slow", "fine", "late")]
    ids = [test_id for test_id, _ in ahead]
    try:
        assert overlap.next_item(ids, _fails) == "dw::first"  # nothing started yet: the head, which starts all
        overlap.take("dw::first", ahead)
        # "slow" has not finished and "fine" passed: the failing "late" goes first, without waiting for "slow".
        assert overlap.next_item(ids[1:], _fails) == "dw::late"
        assert not checks.release.is_set()
        assert [r.verdict for r in overlap.take("dw::late", [])] == [Verdict.FAILED]
    finally:
        checks.release.set()
        overlap.close()


def test_without_a_failure_ahead_the_items_report_in_the_runs_order() -> None:
    checks = _FailsFast(set())
    overlap = Overlap(checks, limit=4)
    ahead = [(f"dw::{n}", _check(n)) for n in ("first", "slow", "fine")]
    ids = [test_id for test_id, _ in ahead]
    try:
        overlap.take("dw::first", ahead)
        answer: list[str] = []
        waiter = threading.Thread(target=lambda: answer.append(overlap.next_item(ids[1:], _fails)), daemon=True)
        waiter.start()
        _wait_for(lambda: overlap.started == 3)
        waiter.join(timeout=0.2)
        assert answer == []  # "fine" passed: the head's turn is awaited
        checks.release.set()
        waiter.join(timeout=10)
        assert answer == ["dw::slow"]
    finally:
        checks.release.set()
        overlap.close()


def test_a_fuzz_group_started_ahead_ends_at_its_next_request_once_the_run_stops() -> None:
    from suite.fuzz.cases import CaseRunner

    nothing: Any = None  # send() looks at no target, result or lab before the stop
    runner = CaseRunner(nothing, nothing, nothing)
    STOPPING.set()
    try:
        with pytest.raises(Stopped):
            runner.send(nothing, nothing)
    finally:
        STOPPING.clear()
