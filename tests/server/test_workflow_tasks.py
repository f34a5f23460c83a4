"""The workflow-task surface through the in-process handler: docs/reference.md: Long poll (polls), §8.4–§8.9 (history,
heartbeat, complete, fail and the rejection matrix), §9 (leases and redelivery) and worker deregistration (Python SDK
2.12.0).

Time is a fake clock (see ``harness.py``): a lease expires because the test moves the clock to
``lease_expires_at``, never because it waited. Every rejection is also checked to leave the database unchanged
(invariant 68), and every worker-plane answer to keep the worker envelope (§2.1).
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from datetime import timedelta
from typing import Any

import pytest

from suite.protocol.fencing import parse_rfc3339, rfc3339
from tests.server.harness import RESUME_KEYS, Harness, HarnessFactory, h, make

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

VERBS = ("history", "heartbeat", "complete", "fail")
VALID_BODY: dict[str, dict[str, Any]] = {
    "history": {},
    "heartbeat": {},
    "complete": {"commands": [{"type": "complete_workflow"}]},
    "fail": {"failure": {"message": "replay failed"}},
}
TIMER = {"type": "start_timer", "delay_seconds": 30}


def assert_worker_envelope(doc: dict[str, Any]) -> None:
    assert doc["protocol_version"] == "1.20"
    assert isinstance(doc["server_capabilities"], dict)
    assert "control_plane" not in doc


def assert_rejected(result: tuple[int, dict[str, Any]], status: int, reason: str) -> dict[str, Any]:
    got_status, doc = result
    assert (got_status, doc.get("reason")) == (status, reason), doc
    assert_worker_envelope(doc)
    return doc


def verb_call(h: Harness, verb: str, task: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
    return h.task_call(verb, task, **{**VALID_BODY[verb], **kw})


def rejected_unchanged(
    h: Harness, verb: str, task: dict[str, Any], status: int, reason: str, **kw: Any
) -> dict[str, Any]:
    """The call is rejected with (status, reason) and changes no row (invariant 68)."""
    before = h.snapshot()
    doc = assert_rejected(verb_call(h, verb, task, **kw), status, reason)
    assert h.snapshot() == before, f"a rejected {verb} changed state"
    return doc


def started_and_leased(h: Harness, workflow_id: str = "wf-1", worker_id: str = "w1") -> dict[str, Any]:
    h.start(workflow_id)
    return h.lease(worker_id)


# -- §8.9 row 1: unknown task -------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_unknown_task_is_404_task_not_found(h: Harness, verb: str) -> None:
    started_and_leased(h)
    ghost = {"task_id": "01NOSUCHTASK0000000000000", "lease_owner": "w1", "workflow_task_attempt": 3}
    doc = rejected_unchanged(h, verb, ghost, 404, "task_not_found")
    assert (doc["task_id"], doc["workflow_task_attempt"]) == (ghost["task_id"], 3)


@pytest.mark.parametrize("verb", VERBS)
def test_a_task_of_another_namespace_is_not_found(h: Harness, verb: str) -> None:
    """§4.2: a task id from namespace A used with ``X-Namespace: B`` behaves as not found."""
    task = started_and_leased(h)
    h.server.run_tx(lambda t: t.db.execute("INSERT INTO namespaces (name, created_at) VALUES ('other', 0)"))
    headers = {"X-Namespace": "other", "X-Durable-Workflow-Protocol-Version": "1.20"}
    body = {"lease_owner": "w1", "workflow_task_attempt": 1, **VALID_BODY[verb]}
    before = h.snapshot()
    result = h.worker(f"/workflow-tasks/{task['task_id']}/{verb}", body, headers=headers)
    assert_rejected(result, 404, "task_not_found")
    assert h.snapshot() == before


# -- §8.9 row 2: run_closed, with its exact body ------------------------------------------------------------


def envelope_free(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("protocol_version", "server_capabilities")}


def run_closed_body(
    task: dict[str, Any], run_status: str, stop_reason: str, closed_at: str, *, cancel_requested: bool
) -> dict[str, Any]:
    """The §8.9 row 2 body without its task fields (status, lease owner and expiry)."""
    return {
        "reason": "run_closed",
        "error": "Workflow run is already closed.",
        "message": "Workflow run is already closed.",
        "task_id": task["task_id"],
        "can_continue": False,
        "cancel_requested": cancel_requested,
        "stop_reason": stop_reason,
        "run_status": run_status,
        "run_closed_reason": run_status,
        "run_closed_at": closed_at,
    }


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    ("close", "run_status", "stop_reason"),
    [("cancel", "cancelled", "run_cancelled"), ("terminate", "terminated", "run_terminated")],
)
def test_cancel_or_terminate_during_a_lease_gives_run_closed(
    h: Harness, verb: str, close: str, run_status: str, stop_reason: str
) -> None:
    """§8.9 row 2 and invariant 49: every call of the lease holder answers run_closed with the exact body."""
    task = started_and_leased(h)
    h.clock.advance(3)
    h.close("wf-1", close)
    closed_at = rfc3339(h.now())
    h.clock.advance(1)
    doc = rejected_unchanged(h, verb, task, 409, "run_closed")
    assert envelope_free(doc) == run_closed_body(task, run_status, stop_reason, closed_at, cancel_requested=True) | {
        "task_status": "cancelled",
        "lease_owner": "w1",
        "lease_expires_at": task["lease_expires_at"],
    }
    assert "outcome" not in doc


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    ("terminal", "run_status", "stop_reason"),
    [
        ({"type": "complete_workflow"}, "completed", "run_completed"),
        ({"type": "fail_workflow", "message": "boom"}, "failed", "run_failed"),
    ],
)
def test_a_second_call_after_closing_the_run_gives_run_closed(
    h: Harness, verb: str, terminal: dict[str, Any], run_status: str, stop_reason: str
) -> None:
    """Invariant 29: after a complete that closed the run, the same lease answers run_closed, never 200."""
    task = started_and_leased(h)
    h.completed(task, terminal)
    closed_at = rfc3339(h.now())
    doc = rejected_unchanged(h, verb, task, 409, "run_closed")
    assert envelope_free(doc) == run_closed_body(task, run_status, stop_reason, closed_at, cancel_requested=False) | {
        "task_status": "completed",
        "lease_owner": None,
        "lease_expires_at": None,
    }
    terminal_events = [e for e in h.event_types("wf-1") if e in ("WorkflowCompleted", "WorkflowFailed")]
    assert len(terminal_events) == 1


@pytest.mark.parametrize("verb", VERBS)
def test_run_closed_comes_before_the_owner_and_attempt_checks(h: Harness, verb: str) -> None:
    """§8.9 notes: "The run-closed check comes before the owner and attempt checks, so every caller sees
    `run_closed`" — also a stranger with a wrong attempt, and also once the old lease has expired."""
    task = started_and_leased(h)
    h.close("wf-1", "terminate")
    h.clock.advance(120)  # well past the lease
    doc = rejected_unchanged(h, verb, task, 409, "run_closed", owner="intruder", attempt=7)
    assert (doc["stop_reason"], doc["lease_owner"]) == ("run_terminated", "w1")


def test_a_run_closed_before_its_first_lease_answers_run_closed(h: Harness) -> None:
    run_id = h.start("wf-1")
    h.close("wf-1", "cancel")
    [task_row] = h.rows("SELECT * FROM workflow_tasks WHERE run_id = ?", run_id)
    assert task_row["status"] == "cancelled"
    h.assert_empty()  # invariant 50: a closed run's task is never leased
    task = {"task_id": task_row["task_id"], "lease_owner": "w1", "workflow_task_attempt": 1}
    doc = rejected_unchanged(h, "heartbeat", task, 409, "run_closed")
    assert (doc["task_status"], doc["lease_owner"], doc["lease_expires_at"]) == ("cancelled", None, None)


# -- §8.9 row 3: task_not_leased ----------------------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_a_completed_task_of_a_live_run_is_not_leased(h: Harness, verb: str) -> None:
    task = started_and_leased(h)
    h.completed(task, TIMER)
    assert h.describe("wf-1")["status"] == "waiting"
    doc = rejected_unchanged(h, verb, task, 409, "task_not_leased")
    assert doc["task_status"] == "completed"


@pytest.mark.parametrize("verb", VERBS)
def test_a_failed_task_is_not_leased(h: Harness, verb: str) -> None:
    """§8.8: "A later complete, fail or heartbeat of that attempt gets 409 `task_not_leased`"; the run stays open."""
    task = started_and_leased(h)
    status, doc = h.fail(task)
    assert (status, doc["outcome"], doc["recorded"], doc["next_task_id"]) == (200, "failed", True, None), doc
    assert h.describe("wf-1")["status"] not in ("failed", "completed")
    out = rejected_unchanged(h, verb, task, 409, "task_not_leased")
    assert out["task_status"] == "failed"


# -- §8.9 row 4: lease_expired ------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_an_expired_lease_nobody_reclaimed_is_rejected(h: Harness, verb: str) -> None:
    task = started_and_leased(h)
    expires = parse_rfc3339(task["lease_expires_at"])
    assert expires == h.now() + timedelta(seconds=60)
    h.clock.advance(60)  # lease_expires_at <= now: expired at the exact instant
    doc = rejected_unchanged(h, verb, task, 409, "lease_expired")
    assert (doc["task_status"], doc["lease_owner"], doc["lease_expires_at"]) == (
        "leased",
        "w1",
        task["lease_expires_at"],
    )
    # §9: recovery needs nothing else — the next poll (any eligible worker) redelivers the task.
    again = h.lease("w2")
    assert (again["task_id"], again["workflow_task_attempt"]) == (task["task_id"], 2)


def test_a_lease_is_live_until_its_last_microsecond(h: Harness) -> None:
    task = started_and_leased(h)
    h.clock.advance(60 - 0.000001)
    status, doc = h.task_call("history", task)
    assert status == 200, doc
    h.clock.advance(0.000001)
    assert_rejected(h.task_call("history", task), 409, "lease_expired")


# -- §8.9 rows 5 and 6: owner and attempt -------------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_a_wrong_owner_is_told_the_current_owner(h: Harness, verb: str) -> None:
    task = started_and_leased(h)
    doc = rejected_unchanged(h, verb, task, 409, "lease_owner_mismatch", owner="intruder")
    assert doc["lease_owner"] == "w1"
    # Invariant 26: the rejected call changed nothing, so the real owner still completes.
    h.completed(task, {"type": "complete_workflow"})


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("delta", [1, -1])
def test_a_wrong_attempt_is_told_the_current_attempt(h: Harness, verb: str, delta: int) -> None:
    h.start("wf-1")
    h.lease("w1")
    h.clock.advance(60)
    task = h.lease("w1")  # the same worker re-leases after expiry: attempt 2
    assert task["workflow_task_attempt"] == 2
    doc = rejected_unchanged(h, verb, task, 409, "workflow_task_attempt_mismatch", attempt=2 + delta)
    assert doc["current_attempt"] == 2


@pytest.mark.parametrize("verb", VERBS)
def test_a_stale_holder_after_takeover_is_fenced_by_owner(h: Harness, verb: str) -> None:
    """§8.9 notes: a stale attempt is fenced with row 5 when another worker re-leased the task, and its
    commands leave no trace (§14.1 S3)."""
    stale = started_and_leased(h)
    h.clock.advance(61)
    fresh = h.lease("w2")
    assert (fresh["task_id"], fresh["workflow_task_attempt"], fresh["lease_owner"]) == (stale["task_id"], 2, "w2")
    doc = rejected_unchanged(h, verb, stale, 409, "lease_owner_mismatch")
    assert doc["lease_owner"] == "w2"
    h.completed(fresh, {"type": "complete_workflow"})
    assert h.event_types("wf-1").count("WorkflowCompleted") == 1


# -- §8.9 row 7: 422 for the fencing and body fields --------------------------------------------------------


BAD_FENCING = [
    {"lease_owner": None},
    {"lease_owner": ""},
    {"lease_owner": 5},
    {"workflow_task_attempt": None},
    {"workflow_task_attempt": 0},
    {"workflow_task_attempt": -1},
    {"workflow_task_attempt": "1"},
    {"workflow_task_attempt": True},
    {"workflow_task_attempt": 1.0},
]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("bad", BAD_FENCING, ids=lambda b: json.dumps(b))
def test_invalid_fencing_fields_are_422(h: Harness, verb: str, bad: dict[str, Any]) -> None:
    task = started_and_leased(h)
    body = {"lease_owner": "w1", "workflow_task_attempt": 1, **VALID_BODY[verb], **bad}
    body = {k: v for k, v in body.items() if v is not None}
    before = h.snapshot()
    doc = assert_rejected(h.worker(f"/workflow-tasks/{task['task_id']}/{verb}", body), 422, "validation_failed")
    [field] = bad
    assert field in doc["errors"]
    assert doc["errors"] == doc["validation_errors"]
    assert h.snapshot() == before


@pytest.mark.parametrize("verb", VERBS)
def test_fencing_field_validation_precedes_the_task_lookup(h: Harness, verb: str) -> None:
    """§2.3: body validation (422) comes before the domain checks, the task lookup (404) among them."""
    result = h.worker("/workflow-tasks/01NOSUCHTASK0000000000000/" + verb, {"workflow_task_attempt": 1})
    assert_rejected(result, 422, "validation_failed")


@pytest.mark.parametrize(
    "failure", [None, {}, {"message": ""}, {"message": 5}, "boom"], ids=["missing", "empty", "blank", "int", "str"]
)
def test_fail_without_a_failure_message_is_422(h: Harness, failure: Any) -> None:
    task = started_and_leased(h)
    body = {} if failure is None else {"failure": failure}
    before = h.snapshot()
    doc = assert_rejected(h.task_call("fail", task, **body), 422, "validation_failed")
    assert "failure.message" in doc["errors"]
    assert h.snapshot() == before
    assert h.task_call("heartbeat", task)[0] == 200  # still leased


@pytest.mark.parametrize("commands", [None, [], "x", [{}], [{"type": 5}], [5]], ids=str)
def test_complete_with_a_malformed_command_list_is_422(h: Harness, commands: Any) -> None:
    task = started_and_leased(h)
    body = {} if commands is None else {"commands": commands}
    before = h.snapshot()
    assert_rejected(h.task_call("complete", task, **body), 422, "validation_failed")
    assert h.snapshot() == before
    h.completed(task, {"type": "complete_workflow"})


# -- heartbeat (§8.6) ---------------------------------------------------------------------------------------


def test_heartbeat_renews_the_lease_from_now(h: Harness) -> None:
    task = started_and_leased(h)
    h.clock.advance(45)
    status, doc = h.task_call("heartbeat", task)
    assert status == 200, doc
    assert_worker_envelope(doc)
    assert envelope_free(doc) == {
        "task_id": task["task_id"],
        "workflow_task_attempt": 1,
        "lease_owner": "w1",
        "renewed": True,
        "lease_expires_at": rfc3339(h.now() + timedelta(seconds=60)),
        "run_status": "pending",
        "task_status": "leased",
        "reason": None,
    }
    h.clock.advance(59)  # past the original expiry, inside the renewed one
    h.completed(task, {"type": "complete_workflow"})


# -- poll preconditions (§7.4, §7.5) ------------------------------------------------------------------------


def test_an_unregistered_worker_gets_412(h: Harness) -> None:
    h.start("wf-1")
    doc = assert_rejected(
        h.worker("/workflow-tasks/poll", {"worker_id": "ghost", "task_queue": "q", "timeout_seconds": 0}),
        412,
        "worker_not_registered",
    )
    assert doc["worker_id"] == "ghost"


def test_a_queue_mismatch_is_409(h: Harness) -> None:
    h.register("w1", queue="q")
    h.start("wf-1")
    doc = assert_rejected(
        h.worker("/workflow-tasks/poll", {"worker_id": "w1", "task_queue": "other", "timeout_seconds": 0}),
        409,
        "task_queue_mismatch",
    )
    assert (doc["registered_task_queue"], doc["requested_task_queue"]) == ("q", "other")


def test_a_build_id_mismatch_is_409(h: Harness) -> None:
    h.register("w1", build_id="b1")
    h.start("wf-1")
    doc = assert_rejected(h.poll("w1", build_id="b2"), 409, "build_id_mismatch")
    assert (doc["registered_build_id"], doc["requested_build_id"]) == ("b1", "b2")
    assert h.lease("w1", build_id="b1")["workflow_id"] == "wf-1"


@pytest.mark.parametrize(
    "body",
    [
        {"task_queue": "q"},
        {"worker_id": "w1"},
        {"worker_id": "", "task_queue": "q"},
        {"worker_id": "w1", "task_queue": 7},
        {"worker_id": "w1", "task_queue": "q", "timeout_seconds": "soon"},
        {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 1.5},
        {"worker_id": "w1", "task_queue": "q", "history_page_size": 0},
        {"worker_id": "w1", "task_queue": "q", "history_page_size": 1001},
        {"worker_id": "w1", "task_queue": "q", "poll_request_id": "p" * 256},
        {"worker_id": "w1", "task_queue": "q", "build_id": 3},
    ],
    ids=lambda b: json.dumps(b)[:60],
)
def test_malformed_polls_are_422_and_lease_nothing(h: Harness, body: dict[str, Any]) -> None:
    h.register("w1")
    h.start("wf-1")
    before = h.snapshot()
    assert_rejected(h.worker("/workflow-tasks/poll", body), 422, "validation_failed")
    assert h.snapshot() == before


def test_drain_refuses_leases_and_resume_restores_them(h: Harness) -> None:
    h.register("w1", build_id="b1")
    h.register("unversioned")
    h.start("wf-1")
    status, drained = h.control("POST", "/task-queues/q/build-ids/drain", {"build_id": "b1"})
    assert status == 200, drained
    assert (drained["namespace"], drained["task_queue"], drained["build_id"], drained["drain_intent"]) == (
        "default",
        "q",
        "b1",
        "draining",
    )
    assert parse_rfc3339(drained["drained_at"]) == h.now()
    before = h.snapshot()
    doc = assert_rejected(h.poll("w1"), 409, "worker_draining")
    assert (doc["poll_status"], doc["task"]) == ("draining", None)
    assert h.snapshot() == before  # ready work exists, and still nothing was leased
    # Idempotent: a second drain keeps the first drained_at.
    h.clock.advance(5)
    assert (
        h.control("POST", "/task-queues/q/build-ids/drain", {"build_id": "b1"})[1]["drained_at"]
        == (drained["drained_at"])
    )
    status, resumed = h.control("POST", "/task-queues/q/build-ids/resume", {"build_id": "b1"})
    assert (status, resumed["drain_intent"], resumed["drained_at"]) == (200, "active", None)
    assert h.lease("w1")["workflow_id"] == "wf-1"


def test_draining_the_unversioned_cohort_spares_versioned_workers(h: Harness) -> None:
    h.register("plain")
    h.register("versioned", build_id="b1")
    h.start("wf-1")
    assert h.control("POST", "/task-queues/q/build-ids/drain", {"build_id": None})[0] == 200
    assert_rejected(h.poll("plain"), 409, "worker_draining")
    assert h.lease("versioned")["workflow_id"] == "wf-1"


def test_drain_validates_build_id(h: Harness) -> None:
    status, doc = h.control("POST", "/task-queues/q/build-ids/drain", {"build_id": 5})
    assert (status, doc["reason"]) == (422, "validation_failed")


# -- poll_request_id (§7.3) ---------------------------------------------------------------------------------


def test_a_repeated_poll_request_id_replays_the_same_task_and_attempt(h: Harness) -> None:
    h.start("wf-1")
    h.start("wf-2")
    first = h.lease("w1", poll_request_id="p-1")
    h.clock.advance(20)
    again = h.lease("w1", poll_request_id="p-1")
    assert (again["task_id"], again["workflow_task_attempt"]) == (first["task_id"], 1)
    # §7.3: the replay returns the refreshed lease.
    assert parse_rfc3339(again["lease_expires_at"]) == h.now() + timedelta(seconds=60)
    [row] = h.rows("SELECT attempt FROM workflow_tasks WHERE task_id = ?", first["task_id"])
    assert row["attempt"] == 1
    # The refreshed lease is real: 50 s later (past the first expiry) attempt 1 still completes.
    h.clock.advance(50)
    h.completed(first, {"type": "complete_workflow"})


def test_another_worker_with_the_same_poll_request_id_gets_no_replay(h: Harness) -> None:
    h.start("wf-1")
    first = h.lease("w1", poll_request_id="p-1")
    h.register("w2")
    status, doc = h.poll("w2", poll_request_id="p-1")
    assert (status, doc["poll_status"], doc["task"]) == (200, "empty", None)
    h.start("wf-2")
    other = h.lease("w2", poll_request_id="p-1")
    assert other["task_id"] != first["task_id"]


def test_the_cached_poll_is_dropped_once_the_task_completes(h: Harness) -> None:
    h.start("wf-1")
    first = h.lease("w1", poll_request_id="p-1")
    h.completed(first, TIMER)
    h.assert_empty()
    status, doc = h.poll("w1", poll_request_id="p-1")
    assert (status, doc["task"]) == (200, None), "a completed task must never be replayed"
    h.signal("wf-1")
    nxt = h.lease("w1", poll_request_id="p-1")
    assert nxt["task_id"] != first["task_id"]
    assert nxt["workflow_task_attempt"] == 1


def test_the_cached_poll_is_dropped_once_the_lease_expires(h: Harness) -> None:
    h.start("wf-1")
    first = h.lease("w1", poll_request_id="p-1")
    h.clock.advance(60)
    again = h.lease("w1", poll_request_id="p-1")
    # A fresh poll under the normal rules: the expired task is redelivered as attempt 2, not replayed as 1.
    assert (again["task_id"], again["workflow_task_attempt"]) == (first["task_id"], 2)


def test_a_replay_is_not_throttled(make: HarnessFactory) -> None:
    h = make(lease_seconds=60, max_active_leases_per_queue=1)
    h.start("wf-1")
    first = h.lease("w1", poll_request_id="p-1")
    again = h.lease("w1", poll_request_id="p-1")
    assert again["task_id"] == first["task_id"]


# -- redelivery, admission and matching ---------------------------------------------------------------------


def test_an_expired_task_is_redelivered_with_the_same_id_and_the_next_attempt(h: Harness) -> None:
    first = started_and_leased(h)
    h.clock.advance(30)
    h.assert_empty("w2")  # LEASE-NOT-SHARED-WHILE-LIVE
    h.clock.advance(30)
    second = h.lease("w2")
    assert (second["task_id"], second["workflow_task_attempt"], second["lease_owner"]) == (first["task_id"], 2, "w2")
    assert parse_rfc3339(second["lease_expires_at"]) == h.now() + timedelta(seconds=60)
    h.clock.advance(60)
    third = h.lease("w1")
    assert (third["task_id"], third["workflow_task_attempt"]) == (first["task_id"], 3)


def test_the_admission_limit_throttles(make: HarnessFactory) -> None:
    h = make(lease_seconds=60, max_active_leases_per_queue=1)
    h.start("wf-1")
    h.start("wf-2")
    first = h.lease("w1")
    status, doc = h.poll("w2")
    assert (status, doc["poll_status"], doc["task"]) == (200, "throttled", None), doc
    assert doc["retry_after_seconds"] >= 0
    assert_worker_envelope(doc)
    h.completed(first, TIMER)
    assert h.lease("w2")["workflow_id"] != first["workflow_id"]


def test_an_expired_lease_does_not_count_against_the_admission_limit(make: HarnessFactory) -> None:
    h = make(lease_seconds=60, max_active_leases_per_queue=1)
    h.start("wf-1")
    h.lease("w1")
    h.clock.advance(60)
    assert h.lease("w2")["workflow_task_attempt"] == 2


def test_the_matching_switch_makes_polls_unavailable(h: Harness) -> None:
    h.register("w1")
    h.start("wf-1")
    status, doc = h.control("POST", "/task-queues/q/matching", {"available": False})
    assert (status, doc["matching_available"]) == (200, False), doc
    response = h.respond(
        "POST", "/api/worker/workflow-tasks/poll", {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 0}
    )
    assert response.header("X-Durable-Workflow-Protocol-Version") == "1.20"
    doc = assert_rejected((response.status, response.json()), 503, "matching_unavailable")
    assert (doc["poll_status"], doc["task"]) == ("unavailable", None)
    assert h.control("POST", "/task-queues/other/matching", {"available": True})[0] == 200
    assert_rejected(h.poll("w1"), 503, "matching_unavailable")  # other queues do not affect q
    assert h.control("POST", "/task-queues/q/matching", {"available": True})[0] == 200
    assert h.lease("w1")["workflow_id"] == "wf-1"
    status, doc = h.control("POST", "/task-queues/q/matching", {"available": "no"})
    assert (status, doc["reason"]) == (422, "validation_failed")


# -- the leased task (§8.1–§8.3) ----------------------------------------------------------------------------


def test_the_first_task_has_every_field_and_a_null_resume_context(h: Harness) -> None:
    run_id = h.start("wf-1", input=["hello", 42])
    status, doc = h.poll("w1")
    assert (status, doc["poll_status"]) == (200, "leased")
    assert_worker_envelope(doc)
    task = doc["task"]
    assert task["run_id"] == run_id
    assert task["workflow_id"] == "wf-1"
    assert task["workflow_type"] == "wf"
    assert task["workflow_task_attempt"] == 1
    assert task["lease_owner"] == "w1"
    assert task["payload_codec"] == "avro"
    assert task["task_queue"] == "q"
    assert task["run_status"] == "pending"
    assert [e["event_type"] for e in task["history_events"]] == ["StartAccepted", "WorkflowStarted"]
    assert [e["sequence"] for e in task["history_events"]] == [1, 2]
    assert task["last_history_sequence"] == task["total_history_events"] == 2
    assert (task["has_more"], task["next_after_sequence"], task["next_history_page_token"]) == (False, None, None)
    assert len(RESUME_KEYS) == 20
    assert {key: task[key] for key in RESUME_KEYS} == dict.fromkeys(RESUME_KEYS)


# -- history paging (§8.4) ----------------------------------------------------------------------------------


def run_with_events(h: Harness, total: int, workflow_id: str = "wf-1") -> None:
    """A run whose history holds ``total`` events: start (2) and signals, before any poll (so one task)."""
    h.start(workflow_id)
    for i in range(total - 2):
        h.signal(workflow_id, f"s{i}")


def test_inline_first_page_and_both_cursor_styles(h: Harness) -> None:
    run_with_events(h, 12)
    task = h.lease("w1", history_page_size=5)
    assert [e["sequence"] for e in task["history_events"]] == [1, 2, 3, 4, 5]
    assert (task["has_more"], task["next_after_sequence"]) == (True, 5)
    assert base64.b64decode(task["next_history_page_token"]) == b"5"
    assert task["total_history_events"] == 12

    def walk(cursor_of: Any) -> list[int]:
        seen = [e["sequence"] for e in task["history_events"]]
        page: dict[str, Any] = task
        while page["has_more"]:
            status, page = h.task_call("history", task, page_size=5, **cursor_of(page))
            assert status == 200, page
            assert len(page["history_events"]) <= 5
            assert page["next_history_page_token"] == (
                None
                if page["next_after_sequence"] is None
                else base64.b64encode(b"%d" % page["next_after_sequence"]).decode()
            )
            seen += [e["sequence"] for e in page["history_events"]]
        assert page["next_history_page_token"] is None
        return seen

    before = h.snapshot()
    assert walk(lambda p: {"after_sequence": p["next_after_sequence"]}) == list(range(1, 13))
    assert walk(lambda p: {"next_history_page_token": p["next_history_page_token"]}) == list(range(1, 13))
    assert walk(lambda p: {"page_token": p["next_history_page_token"]}) == list(range(1, 13))
    assert h.snapshot() == before  # reading history changes nothing


def test_history_without_a_cursor_starts_at_the_beginning(h: Harness) -> None:
    run_with_events(h, 4)
    task = h.lease("w1")
    status, doc = h.task_call("history", task)
    assert status == 200, doc
    assert [e["sequence"] for e in doc["history_events"]] == [1, 2, 3, 4]
    assert (doc["has_more"], doc["next_after_sequence"], doc["next_history_page_token"]) == (False, None, None)
    assert (doc["task_id"], doc["workflow_task_attempt"], doc["total_history_events"]) == (task["task_id"], 1, 4)


def test_a_history_page_never_exceeds_1000_events(h: Harness) -> None:
    run_with_events(h, 1003)
    task = h.lease("w1", history_page_size=1000)
    assert len(task["history_events"]) == 1000
    status, doc = h.task_call("history", task, page_size=5000)
    assert status in (200, 422), doc
    if status == 200:
        assert len(doc["history_events"]) == 1000
        assert doc["has_more"] is True


@pytest.mark.parametrize(
    "token",
    [
        "!!!",
        "MQ",
        base64.b64encode(b"abc").decode(),
        base64.b64encode(b"-1").decode(),
        base64.b64encode(b" 1").decode(),
        5,
    ],
    ids=str,
)
def test_an_invalid_page_token_is_400(h: Harness, token: Any) -> None:
    run_with_events(h, 3)
    task = h.lease("w1")
    before = h.snapshot()
    assert_rejected(h.task_call("history", task, next_history_page_token=token), 400, "invalid_page_token")
    assert h.snapshot() == before


@pytest.mark.parametrize(
    "body", [{"after_sequence": -1}, {"after_sequence": "1"}, {"page_size": 0}, {"history_page_size": "5"}], ids=str
)
def test_invalid_history_cursor_fields_are_422(h: Harness, body: dict[str, Any]) -> None:
    run_with_events(h, 3)
    task = h.lease("w1")
    assert_rejected(h.task_call("history", task, **body), 422, "validation_failed")


# -- history compression (§8.5) -----------------------------------------------------------------------------


def decompress(doc: dict[str, Any]) -> list[dict[str, Any]]:
    raw = base64.b64decode(doc["history_events_compressed"])
    data = gzip.decompress(raw) if doc["history_events_encoding"] == "gzip" else zlib.decompress(raw, -15)
    events: list[dict[str, Any]] = json.loads(data)
    return events


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [("gzip", "gzip"), ("deflate", "deflate"), ("deflate, gzip", "gzip"), ("DEFLATE", "deflate")],
)
def test_compression_on_opt_in_at_the_threshold(h: Harness, accept: str, encoding: str) -> None:
    run_with_events(h, 60)
    task = h.lease("w1", accept_history_encoding=accept)
    assert task["history_events"] == []
    assert task["history_events_encoding"] == encoding
    plain_status, plain = h.task_call("history", task)
    assert plain_status == 200
    assert "history_events_compressed" not in plain
    assert decompress(task) == plain["history_events"]
    for size in (50, 60):  # "at or above the threshold of 50" (the advertised compression_threshold)
        status, doc = h.task_call("history", task, page_size=size, accept_history_encoding=accept)
        assert status == 200, doc
        assert doc["history_events"] == []
        assert decompress(doc) == plain["history_events"][:size]


def test_no_compression_below_the_threshold_or_without_opt_in(h: Harness) -> None:
    run_with_events(h, 60)
    task = h.lease("w1", accept_history_encoding="gzip", history_page_size=49)
    assert len(task["history_events"]) == 49
    assert "history_events_compressed" not in task
    for body in ({"page_size": 49, "accept_history_encoding": "gzip"}, {}, {"accept_history_encoding": "br"}):
        status, doc = h.task_call("history", task, **body)
        assert status == 200, doc
        assert "history_events_compressed" not in doc
        assert "history_events_encoding" not in doc
        assert doc["history_events"], body


# -- worker deregistration (Python SDK 2.12.0) ---------------------------------------------------------------


def test_deregistration_recovers_the_workers_leases(h: Harness) -> None:
    task = started_and_leased(h)
    h.start("wf-2")
    other = h.lease("w2")
    response = h.respond("DELETE", "/api/worker/registrations/w1")
    doc = response.json()
    assert response.status == 200, doc
    assert response.header("X-Durable-Workflow-Protocol-Version") == "1.20"
    assert_worker_envelope(doc)
    assert envelope_free(doc) == {"worker_id": "w1", "outcome": "deregistered", "recovered_workflow_task_count": 1}
    # Its lease went back to ready: the next poll redelivers the same task as the next attempt.
    again = h.lease("w3")
    assert (again["task_id"], again["workflow_task_attempt"]) == (task["task_id"], 2)
    # Only its own leases: w2's lease is untouched.
    h.completed(other, {"type": "complete_workflow"})
    # The deregistered worker can neither poll nor commit.
    assert_rejected(h.poll("w1"), 412, "worker_not_registered")
    assert_rejected(h.complete(task, {"type": "complete_workflow"}), 409, "lease_owner_mismatch")
    status, doc = h.call("DELETE", "/api/worker/registrations/w1")
    assert (status, doc["reason"], doc["worker_id"]) == (404, "worker_not_found", "w1")
    assert_worker_envelope(doc)


def test_deregistering_an_unknown_worker_is_404(h: Harness) -> None:
    status, doc = h.call("DELETE", "/api/worker/registrations/nobody")
    assert (status, doc["reason"]) == (404, "worker_not_found")


def test_a_deregistered_worker_may_register_again(h: Harness) -> None:
    h.register("w1")
    assert h.call("DELETE", "/api/worker/registrations/w1")[0] == 200
    h.register("w1")
    h.start("wf-1")
    assert h.lease("w1")["workflow_id"] == "wf-1"


def test_every_rejection_keeps_the_worker_header(h: Harness) -> None:
    response = h.respond(
        "POST", "/api/worker/workflow-tasks/nope/heartbeat", {"lease_owner": "w", "workflow_task_attempt": 1}
    )
    assert response.status == 404
    assert response.header("X-Durable-Workflow-Protocol-Version") == "1.20"
    assert response.header("X-Durable-Workflow-Control-Plane-Version") is None
