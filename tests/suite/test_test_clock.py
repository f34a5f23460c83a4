"""The suite and the target's test clock: every wait moves the clock when the target advertises one and nothing
else shares it, and waits in real time otherwise — with the same verdicts either way.

* both modes judge alike: the time-driven checks against the reference server with ``--test-clock`` (embedded)
  and without it (a URL target waiting in real time) give identical verdicts, on the correct server and on two
  servers broken in a time-driven rule;
* ``--target=embedded -n 2`` starts one server per xdist worker, so a jump by one worker's check never expires a
  lease of the other's (the suite would turn such a jump into a harness error, below), and a URL target shared
  by two workers waits in real time;
* a clock moved by anyone but the process that judges is detected, never judged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from suite.checks import polling
from suite.client import Exchange, ProtocolClient, Reply
from suite.context import CheckContext, TargetInfo
from suite.outcomes import Indeterminate
from suite.target import EMBEDDED_ARGS, REAL_TIME_ARGS, EmbeddedServer, probe_cluster_info
from suite.timing import (
    GRACE_FACTOR,
    GRACE_FLOOR,
    HELD_GRACE,
    LATENCY_SAMPLES,
    REAL_TIME_REASONS,
    TargetClock,
    advertised_route,
)
from tests.conftest import ServerProcess, SuiteRun, run_suite

# Checks whose every wait is time-driven: leases, timers, backoffs, timeouts and long-poll holds.
TIME_CHECKS = (
    "expiry_holder_fenced",
    "dispatch_crash_takeover",
    "dispatch_lost_notification",
    "dispatch_due_work_without_stimulus",
    "expiry_activity_redelivery",
    "cancel_no_redelivery_after_expiry",
    "poll_replay_dropped_after_expiry",
    "long_poll_clamps_max",
    "long_poll_clamps_min",
    "timer_fires_with_resume_context",
    "timer_not_leasable_early",
    "retry_attempts_and_backoff",
    "retry_backoff_schedule",
    "timeout_late_complete_stale",
    "timeout_records_timed_out",
    "timeout_schedule_to_close_terminal",
    "timeout_heartbeat_enforced",
    "timeout_schedule_to_start_enforced",
    "timeout_schedule_to_close_spans_retries",
    "query_timeout_504",
    "query_late_complete_not_leased",
)
SELECT = " or ".join(TIME_CHECKS)


def _verdicts(run: SuiteRun) -> dict[str, str]:
    assert run.results is not None, run.stdout[-3000:]
    return {c["check"]: c["verdict"] for c in run.results["checks"]}


def _time(run: SuiteRun) -> dict[str, object]:
    assert run.results is not None, run.stdout[-3000:]
    time: dict[str, object] = run.results["target"]["time"]
    return time


def test_a_clock_moved_by_another_process_is_detected() -> None:
    server = EmbeddedServer()
    url = server.start()
    try:
        mine, theirs = (
            TargetClock(url=url + "/api/test/clock/advance", token=server.operator_token, skips=True) for _ in "ab"
        )
        mine.read()
        theirs.read()

        async def jump() -> None:
            async with ProtocolClient(url) as http:
                await mine.advance(http, 30)

        asyncio.run(jump())
        assert mine.moved_by_others() is None  # its own jump
        message = theirs.moved_by_others()
        assert message is not None
        assert "+30.000 s" in message
        assert theirs.moved_by_others() is None  # reported once
        assert theirs.offset > 29  # and it now knows the target's time (less the latency of its read)
    finally:
        server.stop()


def test_embedded_and_shared_url_targets_plan_their_time() -> None:
    from suite.timing import plan

    profile = {"clock_advance": "/api/test/clock/advance"}
    assert plan(profile, processes=2, embedded=True, real_time=False) is None
    assert plan(profile, processes=1, embedded=False, real_time=False) is None
    assert plan(profile, processes=2, embedded=False, real_time=False) == REAL_TIME_REASONS["shared"].format(n=2)
    assert plan(profile, processes=1, embedded=True, real_time=True) == REAL_TIME_REASONS["option"]
    assert plan({}, processes=1, embedded=True, real_time=False) == REAL_TIME_REASONS["absent"]
    assert "--test-clock" in EMBEDDED_ARGS
    assert "--test-clock" not in REAL_TIME_ARGS


def test_the_grace_of_a_held_request_follows_the_targets_round_trips() -> None:
    clock = TargetClock()
    assert clock.grace() == HELD_GRACE  # nothing measured yet
    clock.served(0.002)
    assert clock.grace() == HELD_GRACE  # one round trip is no measure
    for _ in range(LATENCY_SAMPLES):
        clock.served(0.002)
    assert clock.grace() == GRACE_FLOOR  # a fast target: the floor
    clock.served(0.03)
    assert clock.grace() == pytest.approx(GRACE_FACTOR * 0.03)  # the slowest recent round trip counts
    clock.served(1.5)
    assert clock.grace() == HELD_GRACE  # never more than before
    for _ in range(LATENCY_SAMPLES):
        clock.served(0.002)
    assert clock.grace() == GRACE_FLOOR  # a slow moment ages out
    # Through a fault proxy that may hold a request back 0.4 s, the clock never moves before the request can have
    # reached the target (a jump to the end of a hold that has not begun fails a long-poll timing check).
    clock.network_hold = 0.4
    assert clock.grace() == pytest.approx(0.4 + GRACE_FLOOR)
    assert clock.long_grace() == pytest.approx(0.4 + HELD_GRACE)


def test_a_hold_is_read_on_the_targets_clock_at_the_answers_arrival() -> None:
    clock = TargetClock()
    clock.moves.extend([(100.0, 5.0), (110.0, 13.0), (120.0, 65.0)])  # read at 100; moved 8 s at 110, 52 s at 120
    clock.offset = 65.0
    assert clock.at(105.0).timestamp() == pytest.approx(110.0)  # before any move: the offset read at the start
    assert clock.at(110.0).timestamp() == pytest.approx(123.0)  # during a move: counted as made
    assert clock.at(119.9).timestamp() == pytest.approx(132.9)  # answered before the next move was sent
    assert clock.at(130.0).timestamp() == pytest.approx(195.0)
    assert clock.at(50.0).timestamp() == pytest.approx(55.0)  # older than what is kept: the oldest offset kept


def _held_seconds(resent: int, arrived: float) -> float:
    """``CheckContext.held_seconds`` of a poll sent at target time 100 whose answer arrived at local ``arrived``,
    on a clock moved 8 s at local 103 and 52 s more at local 104 (after the answer, to judge a duplicate)."""

    async def go() -> float:
        async with ProtocolClient("http://127.0.0.1:9") as client:
            ctx = CheckContext(target=TargetInfo("http://127.0.0.1:9", {}), client=client, check_name="t")
            ctx.target.clock.moves.extend([(90.0, 0.0), (103.0, 8.0), (104.0, 60.0)])
            ctx.target.clock.offset = 60.0
            exchange = Exchange("POST", "http://127.0.0.1:9/api/worker/workflow-tasks/poll", {}, "{}", 200)
            exchange.started_at, exchange.elapsed = 100.0, arrived - 100.0
            reply = Reply(200, httpx.Headers(), {}, "{}", exchange, resent=resent)
            return ctx.held_seconds(datetime.fromtimestamp(100.0, UTC), reply)

    return asyncio.run(go())


def test_a_hold_ends_when_its_answer_arrives_and_a_resent_poll_cannot_be_timed() -> None:
    # Answered just after the clock moved to the end of the clamp; the later move does not lengthen the hold.
    assert _held_seconds(0, 103.01) == pytest.approx(11.01)
    assert _held_seconds(0, 104.01) == pytest.approx(64.01)  # answered only once the clock reached the full hold
    # Sent again after the first answer was lost: its hold began later than the clock can show; the check reruns.
    with pytest.raises(Indeterminate, match="cannot be told"):
        _held_seconds(1, 103.01)


def _answered_at_once(done_after: float, answers_at: tuple[float, ...], grace: float) -> bool:
    """``CheckContext._answered_at_once`` for a request answered after ``done_after`` s (never: inf), while other
    requests of the check are answered at ``answers_at``; timers fire in order, so the outcome is the same on a
    loaded machine."""

    async def go() -> bool:
        async with ProtocolClient("http://127.0.0.1:9") as client:
            ctx = CheckContext(target=TargetInfo("http://127.0.0.1:9", {}), client=client, check_name="t")
            loop = asyncio.get_running_loop()
            for at in answers_at:
                loop.call_later(at, lambda: setattr(client, "last_answer", loop.time()))
            request: asyncio.Future[None] = loop.create_future()
            if done_after != float("inf"):
                loop.call_later(done_after, request.set_result, None)
            return await ctx._answered_at_once(request, grace)

    return asyncio.run(go())


def test_a_held_request_is_given_its_grace_from_the_last_answer_of_its_check() -> None:
    assert _answered_at_once(0.02, (), 0.1)
    assert not _answered_at_once(0.15, (), 0.1)  # no answer within the grace: held, the clock may move
    assert _answered_at_once(0.15, (0.08,), 0.1)  # a racing request answered at 0.08: quiet only from then
    # Answers that never stop do not hold the clock back for longer than HELD_GRACE.
    assert not _answered_at_once(float("inf"), tuple(0.02 * i for i in range(1, 40)), 0.1)


@pytest.mark.slow
def test_both_modes_give_the_same_verdicts(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    skipped = run_suite("embedded", tmp_path / "clock", "-k", SELECT)
    assert _time(skipped)["test_clock_used"] is True
    real_server = server_factory(*REAL_TIME_ARGS)
    # Several xdist workers on one URL target: real time (here the target has no test clock at all). The checks
    # mostly wait out leases and timers; each worker overlaps the waits of the checks it was handed
    # (suite.overlap), and the four workers overlap theirs.
    real = run_suite(real_server.url, tmp_path / "real", "-k", SELECT, "-n", "4")
    assert _time(real) == {
        "test_clock_advertised": False,
        "test_clock_used": False,
        "real_time_reason": REAL_TIME_REASONS["absent"],
    }
    verdicts = _verdicts(skipped)
    assert sorted(verdicts) == sorted(TIME_CHECKS)
    assert set(verdicts.values()) == {"passed"}, verdicts
    assert _verdicts(real) == verdicts
    assert (skipped.returncode, real.returncode) == (0, 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "requirement"),
    [("expired-never-redelivered", "DISPATCH-CRASH-TAKEOVER"), ("ignore-retry-backoff", "ACTIVITY-RETRY-BACKOFF")],
)
def test_both_modes_kill_a_time_driven_fault_alike(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, fault: str, requirement: str
) -> None:
    runs = {
        mode: run_suite(
            server_factory(*args, "--fault", fault).url,
            tmp_path / mode,
            "--requirement",
            requirement,
            "-k",
            "not machine",  # the requirement's checks alone
        )
        for mode, args in (("clock", EMBEDDED_ARGS), ("real", REAL_TIME_ARGS))
    }
    assert _time(runs["clock"])["test_clock_used"] is True
    assert _time(runs["real"])["test_clock_used"] is False
    assert runs["clock"].verdict(requirement) == runs["real"].verdict(requirement) == "failed"
    assert _verdicts(runs["clock"]) == _verdicts(runs["real"])
    assert runs["clock"].returncode == runs["real"].returncode == 1


@pytest.mark.slow
def test_two_xdist_workers_each_move_only_their_own_servers_clock(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Both workers move clocks all through the run; had they shared one server, every check after the other's
    first jump would end as a harness error (``moved_by_others``), never as a failure."""
    run = run_suite("embedded", tmp_path / "embedded", "-k", SELECT, "-n", "2")
    assert _time(run) == {"test_clock_advertised": True, "test_clock_used": True, "real_time_reason": None}
    assert run.returncode == 0, run.stdout[-3000:]
    assert set(_verdicts(run).values()) == {"passed"}
    # A URL target with a test clock shared by two workers waits in real time instead.
    shared = server_factory(*EMBEDDED_ARGS)
    run = run_suite(shared.url, tmp_path / "shared", "-k", "long_poll_clamps_min", "-n", "2")
    assert _time(run)["real_time_reason"] == REAL_TIME_REASONS["shared"].format(n=2)
    assert run.returncode == 0, run.stdout[-3000:]


def test_a_redelivery_to_the_other_worker_is_no_replay_and_the_check_cannot_judge_it(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``poll_replay_not_for_other_worker`` when the owner's lease runs out before the other worker's poll is
    answered (a poll resent late under ``--faults``, a slow machine): the other worker gets the task as a
    redelivery (attempt 2), which is not a replay of the owner's lease, and the owner holds no lease left to
    judge. The check says it cannot judge (Indeterminate, so it runs again), never IDEMPOTENT-POLL-OTHER-WORKER.
    The target's test clock makes the lease run out between the two polls."""
    server = server_factory(*EMBEDDED_ARGS)
    seen: list[dict[str, Any] | None] = []
    real_poll = polling.send_poll

    # The owner's lease comes from suite.worlds.lease_task; the one poll the check sends itself is the other
    # worker's, with the owner's poll_request_id.
    async def poll_late(ctx: CheckContext, kind: str, worker: str | None, *args: Any, **kwargs: Any) -> Reply:
        await ctx.wait(float(ctx.target.test_profile["workflow_task_lease_seconds"]) + 1)
        reply = await real_poll(ctx, kind, worker, *args, **kwargs)
        seen.append(reply.body.get("task") if isinstance(reply.body, dict) else None)
        return reply

    monkeypatch.setattr(polling, "send_poll", poll_late)

    async def go() -> None:
        target = TargetInfo(server.url, probe_cluster_info(server.url, None))
        route = advertised_route(target.test_profile)
        assert route is not None
        target.clock = TargetClock(url=server.url + route, skips=True)
        async with ProtocolClient(server.url) as client:
            ctx = CheckContext(target=target, client=client, check_name="poll_replay_not_for_other_worker")
            with pytest.raises(Indeterminate, match="expired before the other worker's poll"):
                await polling.poll_replay_not_for_other_worker(ctx)

    asyncio.run(go())
    # The other worker really got the owner's task, as its second attempt: without the redelivery rule the check
    # would have reported that lease as a replay handed to the wrong worker.
    (task,) = seen
    assert task is not None
    assert task["workflow_task_attempt"] == 2
