"""Cooperative cancellation of a child (parent_close_policy request_cancellation) through the handler with a
fake clock: the request with its identity and deadline, cleanup by the child, the delivery route, the deadline,
and the outcome in the parent's history."""

from __future__ import annotations

from typing import Any

from suite.protocol.fencing import parse_rfc3339
from tests.server.harness import Harness, HarnessFactory, h, make

__all__ = ["h", "make"]  # the fixtures

COMPLETE = {"type": "complete_workflow"}


def parent_closes_with_cooperative_child(h: Harness) -> tuple[str, str]:
    """Parent ``parent`` starts a child (request_cancellation) and completes; returns (child id, child run)."""
    h.register("cw", queue="cq")
    h.start("parent")
    kid = {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq"}
    out = h.completed(h.lease(), {**kid, "parent_close_policy": "request_cancellation"}, COMPLETE)
    child_run = h.run_of(out["created_task_ids"][0])
    [scheduled] = h.events("parent", "ChildWorkflowScheduled")
    return scheduled["payload"]["child_workflow_id"], child_run


def resolved(h: Harness) -> dict[str, Any]:
    [event] = h.events("parent", "ChildCancellationResolved")
    payload: dict[str, Any] = event["payload"]
    return payload


def test_the_child_is_asked_not_closed(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=30)
    child_wid, child_run = parent_closes_with_cooperative_child(h)
    assert h.describe(child_wid)["status"] == "pending"
    [requested] = h.events(child_wid, "CooperativeCancellationRequested")
    payload = requested["payload"]
    assert payload["workflow_run_id"] == child_run
    deadline = parse_rfc3339(payload["cleanup_deadline_at"])
    assert (deadline - parse_rfc3339(payload["requested_at"])).total_seconds() == 30
    task = h.lease("cw")
    assert task["cancel_requested"] is True
    observed = task["cancellation_request"]
    assert observed["request_id"] == payload["workflow_command_id"]
    assert observed["cleanup_deadline_at"] == payload["cleanup_deadline_at"]
    assert h.events("parent", "ChildCancellationResolved") == []


def test_the_child_cleans_up_and_closes_itself(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=30)
    child_wid, _ = parent_closes_with_cooperative_child(h)
    task = h.lease("cw")
    status, doc = h.task_call(
        "deliver-cancellation",
        task,
        request_id=task["cancellation_request"]["request_id"],
        sequence=1,
        call_kind="condition",
    )
    assert (status, doc["delivered"], doc["sequence"], doc["call_kind"]) == (200, True, 1, "condition"), doc
    again = h.task_call("deliver-cancellation", task, request_id=doc["request_id"], sequence=2, call_kind="timer")[1]
    assert (again["sequence"], again["call_kind"]) == (1, "condition")  # the committed delivery, once
    assert len(h.events(child_wid, "CooperativeCancellationDelivered")) == 1
    h.completed(task, {"type": "start_timer", "delay_seconds": 1})  # cleanup work before closing
    h.elapse(2)
    h.completed(h.lease("cw"), COMPLETE)
    assert h.describe(child_wid)["status"] == "completed"
    out = resolved(h)
    assert (out["outcome"], out["closed_by"]) == ("completed", "child")


def test_past_the_deadline_the_server_closes_the_child(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=5)
    child_wid, _ = parent_closes_with_cooperative_child(h)
    h.elapse(4)
    assert h.describe(child_wid)["status"] == "pending"
    h.elapse(2)
    assert h.describe(child_wid)["status"] == "cancelled"
    [closed] = h.events(child_wid, "WorkflowCancelled")
    assert closed["payload"]["reason"] == "cleanup_deadline_exceeded"
    out = resolved(h)
    assert (out["outcome"], out["closed_by"]) == ("cancelled", "cleanup_deadline")


def test_delivery_is_fenced_and_names_the_open_request(h: Harness) -> None:
    parent_closes_with_cooperative_child(h)
    task = h.lease("cw")
    status, doc = h.task_call("deliver-cancellation", task, request_id="other", sequence=1, call_kind="condition")
    assert (status, doc["reason"]) == (409, "cancellation_request_not_found")
    status, doc = h.task_call(
        "deliver-cancellation", task, owner="someone", request_id="x", sequence=1, call_kind="condition"
    )
    assert status == 409, doc
    status, doc = h.task_call("deliver-cancellation", task, request_id="x", sequence=0, call_kind="nope")
    assert (status, doc["reason"]) == (422, "validation_failed")


def test_cooperative_cancellation_is_advertised(h: Harness) -> None:
    _, info = h.call("GET", "/api/cluster/info")
    assert info["worker_protocol"]["server_capabilities"]["cooperative_cancellation"] is True


# -- a client's request (SDK 2.12.0 request_workflow_cancellation) -----------------------------------------


def request(h: Harness, path: str, **body: Any) -> tuple[int, dict[str, Any]]:
    return h.control("POST", f"{path}/request-cancellation", body)


def test_a_clients_request_is_recorded_once_and_reaches_the_run(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=30)
    h.register("w1")
    run_id = h.start("wf")
    status, first = request(h, f"/workflows/wf/runs/{run_id}", cleanup_timeout_seconds=90, reason="ops")
    assert status == 200, first
    assert (first["accepted"], first["duplicate"], first["workflow_id"], first["run_id"]) == (True, False, "wf", run_id)
    observed = first["cancellation_request"]
    span = parse_rfc3339(observed["cleanup_deadline_at"]) - parse_rfc3339(observed["requested_at"])
    assert span.total_seconds() == 90
    h.elapse(1)
    status, again = request(h, "/workflows/wf", cleanup_timeout_seconds=5)
    assert (status, again["duplicate"], again["cancellation_request"]) == (200, True, observed)
    [asked] = h.events("wf", "CooperativeCancellationRequested")
    assert (asked["payload"]["workflow_command_id"], asked["payload"]["reason"]) == (observed["request_id"], "ops")
    assert h.describe("wf")["status"] == "pending"
    task = h.lease("w1")
    assert task["cancel_requested"] is True
    assert task["cancellation_request"]["request_id"] == observed["request_id"]


def test_a_clients_request_without_a_timeout_uses_the_servers_cleanup_deadline(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=7)
    h.start("wf")
    observed = request(h, "/workflows/wf")[1]["cancellation_request"]
    span = parse_rfc3339(observed["cleanup_deadline_at"]) - parse_rfc3339(observed["requested_at"])
    assert span.total_seconds() == 7


def test_a_run_that_closes_first_resolves_the_request_and_leaves_the_scheduler_idle(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=5)
    h.register("w1")
    h.start("wf")
    request(h, "/workflows/wf")
    h.completed(h.lease("w1"), COMPLETE)
    h.elapse(6)  # the deadline passes after the close: the request is resolved, nothing is closed again
    assert h.describe("wf")["status"] == "completed"
    assert h.rows("SELECT status, outcome, closed_by FROM cancellation_requests") == [
        {"status": "resolved", "outcome": "completed", "closed_by": "run"}
    ]
    assert h.elapse(1) >= 1.0  # no overdue request keeps the scheduler busy


def test_past_the_deadline_the_server_closes_a_run_a_client_asked(make: HarnessFactory) -> None:
    h = make(cancellation_cleanup_seconds=60)
    h.start("wf")
    request(h, "/workflows/wf", cleanup_timeout_seconds=3)
    h.elapse(4)
    assert h.describe("wf")["status"] == "cancelled"
    [closed] = h.events("wf", "WorkflowCancelled")
    assert closed["payload"]["reason"] == "cleanup_deadline_exceeded"
    assert h.events("wf", "ChildCancellationResolved") == []  # no parent to tell


def test_a_bad_request_or_a_closed_run_changes_nothing(make: HarnessFactory) -> None:
    h = make()
    h.start("wf")
    for body in ({"cleanup_timeout_seconds": 0}, {"cleanup_timeout_seconds": 3601}, {"cleanup_timeout_seconds": "5"}):
        status, doc = request(h, "/workflows/wf", **body)
        assert (status, doc["reason"]) == (422, "validation_failed"), doc
    status, doc = request(h, "/workflows/nope")
    assert status == 404, doc
    assert h.rows("SELECT * FROM cancellation_requests") == []
    h.close("wf", "cancel")
    status, doc = request(h, "/workflows/wf")
    assert (status, doc["reason"]) == (409, "rejected_not_active"), doc


def test_the_heartbeat_interval_is_a_setting_in_the_test_profile(make: HarnessFactory) -> None:
    h = make(heartbeat_interval_seconds=2)
    status, doc = h.worker("/register", {"worker_id": "w9", "task_queue": "q", "runtime": "python"})
    assert (status, doc["heartbeat_interval_seconds"]) == (201, 2)
    assert h.worker("/heartbeat", {"worker_id": "w9"})[1]["heartbeat_interval_seconds"] == 2
    info = h.call("GET", "/api/cluster/info")[1]
    assert info["worker_protocol"]["test_profile"]["heartbeat_interval_seconds"] == 2
