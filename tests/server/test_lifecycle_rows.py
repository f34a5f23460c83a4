"""Rows of the lifecycle tables that only a particular order of events reaches (§9.1, §8.7.1, §12.2).

A run is ``running`` only between a completed first task and a batch that leaves it waiting: these tests put
a run there (a signal arrives while the first task is leased, so its completion creates a follow-up task) and
close it every way the RUN table allows from there. The others reach a run timeout before the first task
completes or while the run waits, a re-registration of a live worker, a run closed while its task's lease had
lapsed, and a parent closed while its child waited out a retry backoff. ``test_transitions.py`` proves that
together with the other server tests they use every row of every table.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.harness import Harness, HarnessFactory, h, make

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

WAIT = {"type": "start_timer", "delay_seconds": 3600}


def running_run(h: Harness, workflow_id: str = "wf-1", **start: Any) -> dict[str, Any]:
    """A run whose first task completed while a signal arrived: it is ``running`` with a follow-up task."""
    h.start(workflow_id, **start)
    first = h.lease()
    h.signal(workflow_id)
    out = h.completed(first, WAIT)
    assert out["run_status"] == "running"
    return h.lease()


def test_a_running_run_is_cancelled(h: Harness) -> None:
    task = running_run(h)
    h.close("wf-1", "cancel")
    described = h.describe("wf-1")
    assert (described["status"], described["closed_reason"]) == ("cancelled", "cancelled")
    assert h.open_tasks(described["run_id"]) == []
    status, doc = h.complete(task, {"type": "complete_workflow"})
    assert (status, doc["reason"]) == (409, "run_closed"), doc


@pytest.mark.parametrize(
    ("command", "status", "closed_reason"),
    [
        ({"type": "fail_workflow", "message": "boom"}, "failed", "failed"),
        ({"type": "continue_as_new"}, "completed", "continued"),
    ],
)
def test_a_running_run_closes_by_its_batch(
    h: Harness, command: dict[str, Any], status: str, closed_reason: str
) -> None:
    task = running_run(h)
    out = h.completed(task, command)
    described = h.describe("wf-1", task["run_id"])
    assert (out["run_status"], described["status"], described["closed_reason"]) == (status, status, closed_reason)


def test_a_running_run_waits_after_its_task_fails_with_no_new_history(h: Harness) -> None:
    task = running_run(h)
    status, doc = h.fail(task)
    assert (status, doc["next_task_id"]) == (200, None), doc
    assert h.describe("wf-1")["status"] == "waiting"


@pytest.mark.parametrize("phase", ["pending", "running", "waiting"])
def test_a_run_times_out_in_every_live_state(make: HarnessFactory, phase: str) -> None:
    h = make(lease_seconds=60)
    if phase == "pending":
        h.start("wf-1", run_timeout_seconds=5)
    elif phase == "running":
        running_run(h, run_timeout_seconds=5)
    else:
        h.start("wf-1", run_timeout_seconds=5)
        h.completed(h.lease(), WAIT)
    assert h.describe("wf-1")["status"] == phase
    h.elapse(5)
    described = h.describe("wf-1")
    assert (described["status"], described["closed_reason"]) == ("failed", "timed_out")
    assert h.event_types("wf-1")[-1] == "WorkflowTimedOut"


def test_a_live_worker_registers_again(h: Harness) -> None:
    h.register("w1")
    h.register("w1", build_id="b2")
    [row] = h.rows("SELECT status, build_id FROM workers WHERE worker_id = 'w1'")
    assert row == {"status": "active", "build_id": "b2"}


def test_a_run_closed_while_its_lease_had_lapsed_cancels_the_task(h: Harness) -> None:
    h.start("wf-1")
    task = h.lease()
    h.clock.advance(61)  # past the 60 s lease; nobody polled, so the task is still recorded as leased
    h.close("wf-1", "terminate")
    [row] = h.rows("SELECT status FROM workflow_tasks WHERE task_id = ?", task["task_id"])
    assert row["status"] == "cancelled"
    h.assert_empty()


def test_a_parent_closed_during_a_child_backoff_starts_no_further_child(make: HarnessFactory) -> None:
    h = make(lease_seconds=60, scheduler_max_sleep_seconds=1e6)
    h.register("cw", queue="cq")
    h.start("parent")
    policy = {"max_attempts": 3, "backoff_seconds": [30]}
    h.completed(
        h.lease(), {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", "retry_policy": policy}
    )
    h.completed(h.lease("cw"), {"type": "fail_workflow", "message": "flaky"})
    [call] = h.rows("SELECT child_call_id, status FROM children")
    assert call["status"] == "backoff"
    h.close("parent", "cancel")
    h.elapse(30)
    assert h.rows("SELECT status FROM children") == [{"status": "cancelled"}]
    assert len(h.events("parent", "ChildRunStarted")) == 1


# -- worker sessions that lost their holder (A.2): closed by that holder, or by their TTL --------------------


def _session(h: Harness, **options: Any) -> None:
    h.register("w1", queue="aq")
    status, doc = h.call("POST", "/api/worker/sessions", {"worker_id": "w1", "session_id": "s1", **options})
    assert status == 201, doc


def _session_status(h: Harness) -> str:
    status, doc = h.control("GET", "/worker-sessions/s1")
    assert status == 200, doc
    return str(doc["session"]["status"])


def _lose_holder(h: Harness, how: str) -> None:
    """The session's holder lets the lease lapse (expired) or stops heartbeating its registration (orphaned)."""
    if how == "expired":
        h.clock.advance(11)
    else:
        h.clock.advance(25)
        h.register("w2", queue="aq")
        h.maintain()
    assert _session_status(h) == how


@pytest.mark.parametrize("how", ["expired", "orphaned"])
def test_a_session_without_its_holder_is_closed_by_the_last_holder(make: HarnessFactory, how: str) -> None:
    h = make(stale_worker_seconds=20)
    _session(h, lease_seconds=10 if how == "expired" else 600)
    _lose_holder(h, how)
    status, doc = h.call("DELETE", "/api/worker/sessions/s1", {"worker_id": "w1"})
    assert (status, doc["outcome"], doc["session"]["status"]) == (200, "closed", "closed"), doc


@pytest.mark.parametrize("how", ["expired", "orphaned"])
def test_a_session_without_its_holder_closes_at_its_ttl(make: HarnessFactory, how: str) -> None:
    h = make(stale_worker_seconds=20)
    _session(h, lease_seconds=10 if how == "expired" else 600, ttl_seconds=100)
    _lose_holder(h, how)
    h.elapse(100)
    status, doc = h.control("GET", "/worker-sessions/s1")
    assert (status, doc["session"]["status"], doc["session"]["failure_reason"]) == (200, "closed", "ttl_expired")
