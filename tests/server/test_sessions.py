"""Worker sessions on the reference server, through the handler with a fake clock: the three worker routes,
lazy creation at the first admitted in-session claim, one owner, admission by capabilities, renewal by
activity heartbeats, lease and TTL expiry, orphaned holders, reacquisition, limits, visibility, durability."""

from __future__ import annotations

from typing import Any

import pytest

from reference_server.config import Settings
from reference_server.server import Server
from suite.protocol.codec import encode_blob
from tests.server.harness import Harness, HarnessFactory, h, make

__all__ = ["h", "make"]  # the fixtures

ARGS = {"codec": "avro", "blob": encode_blob(["x"])}


def session(session_id: str = "gpu-1", **options: Any) -> dict[str, Any]:
    return {"session_id": session_id, **options}


def schedule(h: Harness, *sessions: dict[str, Any], workflow_id: str = "wf") -> None:
    """Start ``workflow_id`` and complete its first task with one in-session activity per ``sessions``."""
    h.register("wf-worker", queue="q")
    h.start(workflow_id)
    commands = [
        {"type": "schedule_activity", "activity_type": "act", "queue": "aq", "arguments": ARGS, "worker_session": s}
        for s in sessions
    ]
    h.completed(h.lease("wf-worker"), *commands)


def register(h: Harness, worker_id: str, *capabilities: str, **extra: Any) -> None:
    h.register(worker_id, queue="aq", capabilities=list(capabilities), **extra)


def poll(h: Harness, worker_id: str) -> dict[str, Any] | None:
    status, doc = h.worker("/activity-tasks/poll", {"worker_id": worker_id, "task_queue": "aq", "timeout_seconds": 0})
    assert status == 200, doc
    task: dict[str, Any] | None = doc["task"]
    return task


def sess_call(h: Harness, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return h.call(method, "/api/worker/sessions" + path, body)


def visible(h: Harness, session_id: str = "gpu-1") -> dict[str, Any]:
    status, doc = h.control("GET", f"/worker-sessions/{session_id}")
    assert status == 200, doc
    snapshot: dict[str, Any] = doc["session"]
    return snapshot


def test_capability_is_advertised_in_discovery_and_worker_responses(h: Harness) -> None:
    _status, info = h.call("GET", "/api/cluster/info")
    caps = info["worker_protocol"]["server_capabilities"]
    assert caps["worker_session_verbs"] == ["create", "heartbeat", "close"]
    assert caps["worker_sessions"]["feature"] == "worker_sessions"
    register(h, "w1")
    _, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session()})
    assert doc["server_capabilities"]["worker_sessions"]["ownership"] == "single_worker_lease_owner"


def test_lazy_creation_at_the_first_admitted_claim(h: Harness) -> None:
    schedule(h, session(requirements=["gpu"]))
    register(h, "plain")
    register(h, "gpu-worker", "gpu")
    assert poll(h, "plain") is None  # not admitted: lacks the requirement; the task stays ready
    task = poll(h, "gpu-worker")
    assert task is not None
    affinity = task["worker_session"]
    assert (affinity["session_id"], affinity["status"], affinity["lease_owner"]) == ("gpu-1", "active", "gpu-worker")
    snap = visible(h)
    assert (snap["status"], snap["lease_owner"], snap["active_activity_count"]) == ("active", "gpu-worker", 1)
    [scheduled] = h.events("wf", "ActivityScheduled")
    assert scheduled["payload"]["worker_session"]["session_id"] == "gpu-1"


def test_one_owner_and_the_activity_limit(h: Harness) -> None:
    schedule(h, session(), session())
    register(h, "a")
    register(h, "b")
    first = poll(h, "a")
    assert first is not None
    assert poll(h, "b") is None  # another worker holds the session
    assert poll(h, "a") is None  # max_concurrent_activities 1: the second waits for the first
    h.activity_report("complete", first, result=ARGS)
    second = poll(h, "a")
    assert second is not None
    assert second["worker_session"]["lease_owner"] == "a"


def test_explicit_create_heartbeat_close(h: Harness) -> None:
    register(h, "w1")
    register(h, "w2")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=30)})
    assert (status, doc["admitted"], doc["outcome"], doc["session"]["status"]) == (201, True, "created", "active")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=30)})
    assert (status, doc["outcome"]) == (200, "reused")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w2", **session()})
    assert (status, doc["reason"], doc["lease_owner"]) == (409, "session_owned_by_another_worker", "w1")
    h.clock.advance(20)
    status, doc = sess_call(h, "POST", "/gpu-1/heartbeat", {"worker_id": "w1", "lease_seconds": 30})
    assert (status, doc["outcome"]) == (200, "heartbeat_recorded")
    status, doc = sess_call(h, "POST", "/gpu-1/heartbeat", {"worker_id": "w2"})
    assert (status, doc["reason"]) == (409, "session_owner_mismatch")
    status, doc = sess_call(h, "DELETE", "/gpu-1", {"worker_id": "w2"})
    assert (status, doc["reason"]) == (409, "session_owner_mismatch")
    status, doc = sess_call(h, "DELETE", "/gpu-1", {"worker_id": "w1", "reason": "worker_shutdown"})
    assert (status, doc["outcome"], doc["session"]["status"]) == (200, "closed", "closed")
    status, doc = sess_call(h, "DELETE", "/gpu-1", {"worker_id": "w1"})
    assert (status, doc["outcome"]) == (200, "already_closed")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session()})
    assert (status, doc["reason"]) == (409, "session_closed")
    status, doc = sess_call(h, "POST", "/nope/heartbeat", {"worker_id": "w1"})
    assert (status, doc["reason"]) == (404, "session_not_found")


def test_lease_expiry_and_reacquisition_fence_the_old_holder(h: Harness) -> None:
    register(h, "w1")
    register(h, "w2")
    sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=10)})
    h.clock.advance(11)
    assert visible(h)["status"] == "expired"
    assert visible(h)["failure_reason"] == "lease_expired"
    status, doc = sess_call(h, "POST", "/gpu-1/heartbeat", {"worker_id": "w1"})
    assert (status, doc["reason"], doc["session_status"]) == (409, "session_not_active", "expired")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w2", **session(lease_seconds=10)})
    assert (status, doc["outcome"], doc["session"]["lease_owner"]) == (200, "reacquired", "w2")
    status, doc = sess_call(h, "POST", "/gpu-1/heartbeat", {"worker_id": "w1"})
    assert (status, doc["reason"]) == (409, "session_owner_mismatch")


def test_reacquisition_forbidden_makes_the_session_failed(h: Harness) -> None:
    register(h, "w1")
    register(h, "w2")
    sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=10, allow_reacquire_after_failure=False)})
    h.clock.advance(11)
    assert visible(h)["status"] == "failed"
    status, doc = sess_call(h, "POST", "", {"worker_id": "w2", **session()})
    assert (status, doc["reason"]) == (409, "session_reacquire_disallowed")


def test_ttl_is_absolute_and_terminal(h: Harness) -> None:
    register(h, "w1")
    sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=30, ttl_seconds=50)})
    h.clock.advance(25)
    sess_call(h, "POST", "/gpu-1/heartbeat", {"worker_id": "w1", "lease_seconds": 300})
    assert visible(h)["lease_expires_at"] == visible(h)["ttl_expires_at"]  # never past the TTL
    h.elapse(26)
    snap = visible(h)
    assert (snap["status"], snap["failure_reason"]) == ("closed", "ttl_expired")
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session()})
    assert (status, doc["reason"]) == (409, "session_closed")


def test_an_orphaned_session_is_reacquired_by_a_capable_worker(make: HarnessFactory) -> None:
    h = make(stale_worker_seconds=20)
    register(h, "w1")
    sess_call(h, "POST", "", {"worker_id": "w1", **session(lease_seconds=600)})
    h.clock.advance(25)  # w1 never heartbeats its registration again
    register(h, "w2")
    h.maintain()
    snap = visible(h)
    assert (snap["status"], snap["failure_reason"], snap["holder"]["is_stale"]) == (
        "orphaned",
        "worker_heartbeat_stale",
        True,
    )
    status, doc = sess_call(h, "POST", "", {"worker_id": "w2", **session()})
    assert (status, doc["outcome"]) == (200, "reacquired")


def test_activity_heartbeats_renew_the_session_lease(h: Harness) -> None:
    schedule(h, session(lease_seconds=30))
    register(h, "a")
    task = poll(h, "a")
    assert task is not None
    before = visible(h)["lease_expires_at"]
    h.clock.advance(20)
    out = h.activity_report("heartbeat", task)
    assert out["worker_session"]["lease_expires_at"] > before
    h.clock.advance(20)  # past the first lease: still active, because the heartbeat renewed it
    assert visible(h)["status"] == "active"


def test_the_attempt_lease_and_cancellation_stay_per_attempt(h: Harness) -> None:
    schedule(h, session(lease_seconds=10))
    register(h, "a")
    task = poll(h, "a")
    assert task is not None
    h.clock.advance(11)
    assert visible(h)["status"] == "expired"  # the session lapsed …
    out = h.activity_report("heartbeat", task)  # … the attempt's own lease (300 s) is still live
    assert (out["can_continue"], out["worker_session"]["status"]) == (True, "expired")
    h.close("wf", "cancel")
    out = h.activity_report("heartbeat", task)
    assert (out["can_continue"], out["cancel_requested"]) == (False, True)


def test_worker_session_limit(h: Harness) -> None:
    register(h, "w1", max_concurrent_worker_sessions=1)
    sess_call(h, "POST", "", {"worker_id": "w1", **session("s1")})
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **session("s2")})
    assert (status, doc["reason"], doc["max_concurrent_worker_sessions"]) == (409, "worker_session_limit_exceeded", 1)


def test_create_if_missing_false_admits_no_lazy_creation(h: Harness) -> None:
    schedule(h, session(create_if_missing=False))
    register(h, "a")
    assert poll(h, "a") is None
    sess_call(h, "POST", "", {"worker_id": "a", **session()})
    assert poll(h, "a") is not None


@pytest.mark.parametrize(
    "bad",
    [{}, {"session_id": ""}, {"session_id": "s", "lease_seconds": 0}, {"session_id": "s", "requirements": [1]}],
)
def test_invalid_options_are_422_and_change_nothing(h: Harness, bad: dict[str, Any]) -> None:
    register(h, "w1")
    before = h.snapshot()
    status, doc = sess_call(h, "POST", "", {"worker_id": "w1", **bad})
    assert (status, doc["reason"]) == (422, "validation_failed")
    assert before["worker_sessions"] == h.snapshot()["worker_sessions"]


def test_an_invalid_worker_session_on_schedule_activity_is_rejected(h: Harness) -> None:
    h.register("wf-worker", queue="q")
    h.start("wf")
    task = h.lease("wf-worker")
    status, doc = h.complete(
        task, {"type": "schedule_activity", "activity_type": "act", "worker_session": {"session_id": 7}}
    )
    assert (status, doc["reason"]) == (422, "validation_failed"), doc
    assert "commands.0.worker_session.session_id" in doc["errors"]


def test_visibility_lists_sessions_with_metrics(h: Harness) -> None:
    register(h, "w1")
    sess_call(h, "POST", "", {"worker_id": "w1", **session("s1")})
    sess_call(h, "POST", "", {"worker_id": "w1", **session("s2")})
    sess_call(h, "DELETE", "/s2", {"worker_id": "w1"})
    status, doc = h.control("GET", "/worker-sessions")
    assert status == 200
    assert (doc["metrics"]["total"], doc["metrics"]["active"], doc["metrics"]["closed"]) == (2, 1, 1)
    assert [s["session_id"] for s in doc["sessions"]] == ["s1", "s2"]


def test_sessions_survive_a_restart(make: HarnessFactory, tmp_path: Any) -> None:
    h = make()
    register(h, "w1")
    sess_call(h, "POST", "", {"worker_id": "w1", **session()})
    db = h.server.store.path
    h.server.store.close()
    again = Server(Settings(db_path=db), clock=h.clock)
    try:
        row = again.store.read().execute("SELECT status, lease_owner FROM worker_sessions").fetchone()
        assert tuple(row) == ("active", "w1")
    finally:
        again.store.close()
