"""The test clock (``--test-clock``): ``POST /api/test/clock/advance`` moves the server's one clock, and every
time-driven rule follows it — lease expiry and redelivery, timers, retry backoff, query deadlines, long-poll
holds, update waits, worker liveness — while the offset is durable and never shrinks. Without the flag the
route does not exist and nothing is advertised.

In process, on a :class:`FakeClock` that the test never moves by hand: every jump here goes through the route.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reference_server.clock import OFFSET_KEY, ServerClock
from reference_server.config import CLOCK_ADVANCE_PATH, Settings
from reference_server.server import Server
from reference_server.store import to_us
from suite.protocol.fencing import parse_rfc3339
from tests.server.harness import DEADLINE, Harness, HarnessFactory, h, make, run_async

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

ADVANCE = CLOCK_ADVANCE_PATH.removeprefix("/api")


@pytest.fixture
def tc(make: HarnessFactory) -> Harness:
    return make(test_clock=True, lease_seconds=5, long_poll_max_seconds=60)


def advance(h: Harness, seconds: float) -> dict[str, Any]:
    status, doc = h.control("POST", ADVANCE, {"seconds": seconds})
    assert status == 200, doc
    return doc


def server_now(h: Harness) -> int:
    return h.server.clock.now_us()


async def held(h: Harness, path: str, body: dict[str, Any], *, control: bool = False) -> asyncio.Future[Any]:
    """Start a call that must block; it runs in process up to its wait on the hub within a few loop turns."""
    call = asyncio.ensure_future(h.acall("POST", path, body, control=control))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not call.done(), f"{path} answered at once: {call.result()}"
    return call


async def aadvance(h: Harness, seconds: float) -> None:
    status, doc = await h.acall("POST", CLOCK_ADVANCE_PATH, {"seconds": seconds}, control=True)
    assert status == 200, doc
    for _ in range(20):  # let the woken waiters run
        await asyncio.sleep(0)


def test_without_the_flag_the_route_is_absent_and_not_advertised(h: Harness) -> None:
    status, doc = h.control("POST", ADVANCE, {"seconds": 10})
    assert (status, doc["reason"]) == (404, "route_not_found"), doc
    profile = h.call("GET", "/api/cluster/info", headers={})[1]["worker_protocol"]["test_profile"]
    assert "clock_advance" not in profile
    assert h.server.clock.offset_us == 0


def test_the_flag_advertises_the_route_in_the_test_profile(tc: Harness) -> None:
    profile = tc.call("GET", "/api/cluster/info", headers={})[1]["worker_protocol"]["test_profile"]
    assert profile["clock_advance"] == CLOCK_ADVANCE_PATH


@pytest.mark.parametrize("seconds", [-1, "10", None, True, [5], 366 * 86_400 + 1])
def test_a_bad_advance_is_422_and_moves_nothing(tc: Harness, seconds: Any) -> None:
    before = server_now(tc)
    body = {} if seconds is None else {"seconds": seconds}
    status, doc = tc.control("POST", ADVANCE, body)
    assert (status, doc["reason"]) == (422, "validation_failed"), doc
    assert "seconds" in doc["errors"]
    assert server_now(tc) == before
    assert tc.rows("SELECT * FROM meta WHERE key = ?", OFFSET_KEY) == []


def test_an_advance_moves_the_clock_by_exactly_that_much_and_zero_reads_it(tc: Harness) -> None:
    before = server_now(tc)
    doc = advance(tc, 12.5)
    assert doc["advanced_seconds"] == 12.5
    assert doc["offset_seconds"] == 12.5
    assert to_us(parse_rfc3339(doc["now"])) == before + 12_500_000
    read = advance(tc, 0)
    assert read["now"] == doc["now"]
    assert read["offset_seconds"] == 12.5


def test_the_route_is_the_control_planes_and_needs_its_header(tc: Harness) -> None:
    status, doc = tc.call("POST", CLOCK_ADVANCE_PATH, {"seconds": 1})  # worker headers, no control header
    assert status == 400, doc
    assert tc.server.clock.offset_us == 0


def test_an_advance_expires_a_lease_and_the_task_is_redelivered(tc: Harness) -> None:
    tc.start("wf-1")
    task = tc.lease("w1")
    tc.register("w2")
    tc.assert_empty("w2")
    expires = to_us(parse_rfc3339(task["lease_expires_at"]))
    advance(tc, (expires - server_now(tc)) / 1e6 + 0.001)
    again = tc.lease("w2")
    assert (again["task_id"], again["workflow_task_attempt"]) == (task["task_id"], 2)
    status, doc = tc.complete(task)
    assert (status, doc["reason"]) == (409, "lease_owner_mismatch"), doc


def test_an_advance_fires_a_due_timer_before_it_answers(tc: Harness) -> None:
    tc.start("wf-1")
    task = tc.lease("w1")
    tc.completed(task, {"type": "start_timer", "delay_seconds": 3600})
    tc.assert_empty("w1")
    advance(tc, 3599)
    assert "TimerFired" not in tc.event_types("wf-1")
    advance(tc, 1)
    assert "TimerFired" in tc.event_types("wf-1")  # the scheduler ran inside the advance
    assert tc.lease("w1")["workflow_task_attempt"] == 1


def test_an_advance_ends_a_held_long_poll_at_its_hold(tc: Harness) -> None:
    tc.register("w1")

    async def scenario() -> None:
        body = {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 30}
        poll = await held(tc, "/api/worker/workflow-tasks/poll", body)
        await aadvance(tc, 29)
        assert not poll.done(), "a hold of 30 s ended after 29 s"
        await aadvance(tc, 1.5)
        status, doc = await asyncio.wait_for(poll, DEADLINE)
        assert (status, doc["poll_status"]) == (200, "empty"), doc

    run_async(scenario())


def test_an_advance_wakes_a_held_poll_when_a_lease_it_waits_for_expires(tc: Harness) -> None:
    tc.start("wf-1")
    task = tc.lease("w1")
    tc.register("w2")

    async def scenario() -> None:
        body = {"worker_id": "w2", "task_queue": "q", "timeout_seconds": 60}
        poll = await held(tc, "/api/worker/workflow-tasks/poll", body)
        await aadvance(tc, 6)
        status, doc = await asyncio.wait_for(poll, DEADLINE)
        assert (status, doc["task"]["task_id"]) == (200, task["task_id"]), doc

    run_async(scenario())


def test_an_advance_ends_an_update_wait_at_its_timeout(tc: Harness) -> None:
    tc.start("wf-1")

    async def scenario() -> None:
        body = {"wait_for": "completed", "wait_timeout_seconds": 10}
        call = await held(tc, "/api/workflows/wf-1/update/u", body, control=True)
        await aadvance(tc, 9)
        assert not call.done(), "a wait of 10 s ended after 9 s"
        await aadvance(tc, 1)
        status, doc = await asyncio.wait_for(call, DEADLINE)
        assert (status, doc.get("wait_timed_out")) == (202, True), doc

    run_async(scenario())


def test_an_advance_times_out_a_waiting_query(make: HarnessFactory) -> None:
    h = make(test_clock=True, query_timeout_seconds=30)
    h.start("wf-1")
    h.register("w1", capabilities=["query_tasks"])

    async def scenario() -> None:
        call = await held(h, "/api/workflows/wf-1/query/status", {}, control=True)
        await aadvance(h, 31)
        status, doc = await asyncio.wait_for(call, DEADLINE)
        assert (status, doc["reason"]) == (504, "query_worker_timeout"), doc

    run_async(scenario())


def test_an_advance_makes_a_silent_worker_stale(make: HarnessFactory) -> None:
    h = make(test_clock=True, stale_worker_seconds=60)
    h.start("wf-1")
    h.register("w1", capabilities=["query_tasks"])
    advance(h, 61)
    status, doc = h.control("POST", "/workflows/wf-1/query/status", {})
    # No live worker can answer: refused at once, not held until the query timeout (§10.5).
    assert (status, doc["reason"]) == (409, "query_worker_unavailable"), doc
    assert h.rows("SELECT * FROM query_tasks") == []


def test_the_offset_is_durable_and_applies_without_the_flag(tc: Harness) -> None:
    advance(tc, 3600)
    stored = tc.rows("SELECT value FROM meta WHERE key = ?", OFFSET_KEY)
    assert stored == [{"value": "3600000000"}]
    path = tc.server.settings.db_path
    tc.server.store.close()
    for flag in (True, False):
        again = Server(Settings(db_path=path, test_clock=flag), clock=tc.clock)
        try:
            assert again.clock.now_us() == tc.clock.now_us() + 3_600_000_000
        finally:
            again.store.close()


def test_the_offset_never_shrinks() -> None:
    clock = ServerClock(base=type("Zero", (), {"now_us": lambda self: 0})(), offset_us=10)
    clock.apply(5)
    assert clock.now_us() == 10
    clock.apply(20)
    assert clock.now_us() == 20
