"""CheckContext.lapsed_on_its_own: waiting in real time, a lease reported run out is the target's failure only
when the check's call reached it within a lease of the task's last answered poll or heartbeat (the local clock
bounds both ends); past that, a correct target may have let it run out, and the check cannot judge."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from suite.client import Exchange, Reply
from suite.context import CheckContext
from suite.outcomes import CheckFailure, Indeterminate

BASE = "http://t/api/worker"
TASK = "01TASK"
PROFILE = {"workflow_task_lease_seconds": 3, "activity_task_lease_seconds": 3}


def _exchange(url: str, at: float, status: int = 200, body: Any = None, elapsed: float = 0.05) -> Exchange:
    return Exchange("POST", url, {}, None, status=status, response_body=body, started_at=at, elapsed=elapsed)


def _context(exchanges: list[Exchange], *, skips: bool = False) -> CheckContext:
    target: Any = SimpleNamespace(clock=SimpleNamespace(skips=skips), test_profile=PROFILE)
    client: Any = SimpleNamespace(exchanges=exchanges)
    return CheckContext(target=target, client=client, check_name="c")


def _expired(at: float, elapsed: float = 0.05) -> tuple[Exchange, Reply]:
    body = {"reason": "lease_expired"}
    ex = _exchange(f"{BASE}/workflow-tasks/{TASK}/complete", at, 409, body, elapsed)
    return ex, Reply(409, httpx.Headers(), body, "", ex)


def _polled(at: float) -> Exchange:
    return _exchange(f"{BASE}/workflow-tasks/poll", at, body={"task": {"task_id": TASK}})


def test_a_lease_reported_run_out_within_its_length_of_the_last_renewal_is_the_targets_failure() -> None:
    ex, reply = _expired(at=102.0)
    ctx = _context([_polled(100.0), _exchange(f"{BASE}/workflow-tasks/{TASK}/heartbeat", 101.0), ex])
    with pytest.raises(CheckFailure):
        ctx.expect(reply, 200, what="complete")


def test_a_call_that_may_have_arrived_a_whole_lease_after_the_last_renewal_cannot_judge() -> None:
    ex, reply = _expired(at=102.5, elapsed=0.6)  # sent 2.5 s after the heartbeat, answered 0.6 s later
    ctx = _context([_polled(99.0), _exchange(f"{BASE}/workflow-tasks/{TASK}/heartbeat", 100.0), ex])
    with pytest.raises(Indeterminate, match="may have run out on its own"):
        ctx.expect(reply, 200, what="complete")


def test_a_refused_heartbeat_is_no_renewal_and_a_test_clock_always_judges() -> None:
    refused = _exchange(f"{BASE}/workflow-tasks/{TASK}/heartbeat", 101.0, status=409)
    ex, reply = _expired(at=104.0)
    with pytest.raises(Indeterminate):  # renewed last by the poll at 100 s
        _context([_polled(100.0), refused, ex]).expect(reply, 200)
    with pytest.raises(CheckFailure):  # with a test clock only the check moves time: the answer is the target's
        _context([_polled(100.0), refused, ex], skips=True).expect(reply, 200)
