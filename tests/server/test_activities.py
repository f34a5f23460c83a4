"""The activity-task surface through the in-process handler (docs/reference.md: Expiry, Activities, Dispatch; invariants
50–59, 69).

Time is a :class:`FakeClock` the tests step by hand, so lease expiry, retry backoff and the §11.7 timeouts are
exercised deterministically: nothing sleeps and nothing reads the wall clock. Polls hold 0 s
(``long_poll_min_seconds=0`` and ``timeout_seconds: 0``), so an empty queue answers at once. The scheduler
is not running; a test that needs the timeout enforcer runs one maintenance pass itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reference_server.activities import activity_due_in, enforce_activity_timeouts
from reference_server.config import Settings
from reference_server.http import Request
from reference_server.server import Server
from suite.protocol.codec import encode_blob
from suite.protocol.fencing import parse_rfc3339
from tests.server.harness import CONTROL_HEADERS, WORKER_HEADERS, Clocked, FakeClock, harnesses

ARGS = {"codec": "avro", "blob": encode_blob(["order-17", 3])}
RESULT = {"codec": "avro", "blob": encode_blob({"ok": True})}
TERMINAL_ACTIVITY_EVENTS = {"ActivityCompleted", "ActivityFailed", "ActivityTimedOut", "ActivityCancelled"}


class Harness(Clocked):
    """One server, a fake clock, and the calls a worker and an operator make."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.clock = FakeClock()
        self.server = Server(
            Settings(db_path=str(tmp_path / "db.sqlite"), long_poll_min_seconds=0, **settings), clock=self.clock
        )
        self.registered: set[str] = set()

    # -- transport ---------------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, *, control: bool = False) -> tuple[int, dict[str, Any]]:
        request = Request.from_target(
            method,
            path,
            headers=CONTROL_HEADERS if control else WORKER_HEADERS,
            body=b"" if body is None else json.dumps(body).encode(),
        )
        response = asyncio.run(self.server.handle(request))
        doc = response.json()
        assert isinstance(doc, dict)
        return response.status, doc

    # -- control plane -----------------------------------------------------------------------------------

    def start(self, workflow_id: str, queue: str = "q") -> str:
        status, body = self.call(
            "POST",
            "/api/workflows",
            {"workflow_type": "orders", "workflow_id": workflow_id, "task_queue": queue, "input": ["x"]},
            control=True,
        )
        assert status == 201, body
        return str(body["run_id"])

    def history(self, workflow_id: str) -> list[dict[str, Any]]:
        run_id = self.describe(workflow_id)["run_id"]
        path = f"/api/workflows/{workflow_id}/runs/{run_id}/history?page_size=1000"
        status, body = self.call("GET", path, control=True)
        assert status == 200, body
        events: list[dict[str, Any]] = body["events"]
        return events

    def events(self, workflow_id: str, event_type: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.history(workflow_id) if e["event_type"] == event_type]

    def describe(self, workflow_id: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/api/workflows/{workflow_id}", control=True)
        assert status == 200, body
        return body

    def close_run(self, workflow_id: str, verb: str) -> None:
        status, body = self.call("POST", f"/api/workflows/{workflow_id}/{verb}", {"reason": "test"}, control=True)
        assert status == 200, body

    # -- worker plane ------------------------------------------------------------------------------------

    def register(self, worker_id: str, *, queue: str = "q", activity_types: list[str] | None = None) -> None:
        status, body = self.call(
            "POST",
            "/api/worker/register",
            {
                "worker_id": worker_id,
                "task_queue": queue,
                "runtime": "python",
                "supported_activity_types": activity_types or [],
            },
        )
        assert status == 201, body
        self.registered.add(worker_id)

    def poll_workflow(self, worker_id: str = "w1") -> dict[str, Any] | None:
        status, body = self.call(
            "POST", "/api/worker/workflow-tasks/poll", {"worker_id": worker_id, "task_queue": "q", "timeout_seconds": 0}
        )
        assert status == 200, body
        task: dict[str, Any] | None = body["task"]
        return task

    def schedule(self, workflow_id: str = "wf-1", **commands: dict[str, Any]) -> str:
        """Start a run and let its first workflow task schedule the given activities (name → command)."""
        if "w1" not in self.registered:
            self.register("w1")
        run_id = self.start(workflow_id)
        task = self.poll_workflow("w1")
        assert task is not None
        assert task["run_id"] == run_id
        batch = [
            {"type": "schedule_activity", "activity_type": "charge", "arguments": ARGS, **c} for c in commands.values()
        ]
        status, body = self.call(
            "POST",
            f"/api/worker/workflow-tasks/{task['task_id']}/complete",
            {"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"], "commands": batch},
        )
        assert status == 200, body
        return run_id

    def poll(self, worker_id: str = "w1", **extra: Any) -> tuple[int, dict[str, Any]]:
        if worker_id not in self.registered:
            self.register(worker_id)
        return self.call(
            "POST",
            "/api/worker/activity-tasks/poll",
            {"worker_id": worker_id, "task_queue": "q", "timeout_seconds": 0, **extra},
        )

    def lease(self, worker_id: str = "w1", **extra: Any) -> dict[str, Any]:
        status, body = self.poll(worker_id, **extra)
        assert status == 200, body
        assert body["poll_status"] == "leased", body
        task: dict[str, Any] = body["task"]
        return task

    def assert_empty(self, worker_id: str = "w1") -> None:
        status, body = self.poll(worker_id)
        assert (status, body["poll_status"], body["task"]) == (200, "empty", None)

    def report(self, verb: str, task: dict[str, Any], **body: Any) -> tuple[int, dict[str, Any]]:
        doc = {"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"], **body}
        return self.call("POST", f"/api/worker/activity-tasks/{task['task_id']}/{verb}", doc)

    def complete(self, task: dict[str, Any], **body: Any) -> tuple[int, dict[str, Any]]:
        return self.report("complete", task, **{"result": RESULT, **body})

    def fail(self, task: dict[str, Any], **failure: Any) -> tuple[int, dict[str, Any]]:
        return self.report("fail", task, failure={"message": "boom", "type": "RuntimeError", **failure})

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row an activity call could touch, to prove a rejected call changed nothing (invariant 68)."""
        db = self.server.store.read()
        tables = ("activity_executions", "activity_tasks", "activity_attempts", "history", "workflow_tasks", "runs")
        return {name: [tuple(r) for r in db.execute(f"SELECT * FROM {name} ORDER BY 1, 2")] for name in tables}

    def row(self, table: str, key: str, value: str) -> dict[str, Any]:
        row = self.server.store.read().execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
        assert row is not None
        return dict(row)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Build a harness with extra settings; every one is closed after the test."""
    yield from harnesses(tmp_path, Harness)


@pytest.fixture
def h(make: Callable[..., Harness]) -> Harness:
    return make(activity_lease_seconds=60)


def resumed_task(h: Harness) -> dict[str, Any]:
    task = h.poll_workflow()
    assert task is not None, "the final activity outcome must resume the workflow"
    return task


def assert_one_terminal_event_per_attempt(h: Harness, workflow_id: str) -> None:
    """Invariant 69: never two terminal events for one activity_attempt_id."""
    seen: list[str] = [
        e["payload"]["activity_attempt_id"]
        for e in h.history(workflow_id)
        if e["event_type"] in TERMINAL_ACTIVITY_EVENTS and e["payload"].get("activity_attempt_id")
    ]
    assert len(seen) == len(set(seen)), seen


# -- poll (§11.1, §7) ----------------------------------------------------------------------------------------


def test_lease_carries_the_section_11_1_fields(h: Harness) -> None:
    h.schedule(a={"start_to_close_timeout": 30, "heartbeat_timeout": 10, "schedule_to_close_timeout": 120})
    task = h.lease()

    assert task["attempt_number"] == task["attempt"] == 1
    assert task["activity_attempt_id"]
    assert task["activity_execution_id"]
    assert task["task_id"]
    assert task["arguments"] == ARGS  # invariant 52: byte for byte the scheduled envelope
    assert task["payload_codec"] == "avro"
    assert task["activity_type"] == "charge"
    assert task["lease_owner"] == "w1"
    assert task["workflow_id"] == "wf-1"
    assert task["task_queue"] == "q"
    assert parse_rfc3339(task["lease_expires_at"]) == h.now() + timedelta(seconds=60)
    policy = task["retry_policy"]
    assert policy["snapshot_version"] == 1
    assert policy["max_attempts"] == 1
    assert policy["start_to_close_timeout"] == 30
    assert policy["heartbeat_timeout"] == 10
    deadlines = {k: parse_rfc3339(v) for k, v in task["deadlines"].items()}
    assert deadlines == {
        "start_to_close": h.now() + timedelta(seconds=30),
        "heartbeat": h.now() + timedelta(seconds=10),
        "schedule_to_close": h.now() + timedelta(seconds=120),
    }
    h.assert_empty("w2")  # LEASE-NOT-SHARED-WHILE-LIVE


def test_poll_request_id_replays_the_same_task_and_attempt(h: Harness) -> None:
    h.schedule(a={})
    first = h.lease(poll_request_id="p-1")
    h.clock.advance(5)
    again = h.lease(poll_request_id="p-1")

    assert (again["task_id"], again["activity_attempt_id"], again["attempt_number"]) == (
        first["task_id"],
        first["activity_attempt_id"],
        1,
    )
    # §7.3: the replay returns the refreshed lease.
    assert parse_rfc3339(again["lease_expires_at"]) == h.now() + timedelta(seconds=60)
    # A different worker using the same poll_request_id gets no replay.
    status, body = h.poll("w2", poll_request_id="p-1")
    assert (status, body["task"]) == (200, None)


def test_supported_activity_types_filter_the_claim(h: Harness) -> None:
    h.schedule(a={})
    h.register("picky", activity_types=["ship"])
    h.assert_empty("picky")
    h.register("charger", activity_types=["charge"])
    assert h.lease("charger")["activity_type"] == "charge"


def test_admission_limit_throttles(make: Callable[..., Harness]) -> None:
    h = make(max_active_leases_per_queue=1)
    h.schedule(a={}, b={})
    h.lease()
    status, body = h.poll()
    assert (status, body["poll_status"], body["task"]) == (200, "throttled", None)


def test_poll_due_time_covers_backoff_and_lease_expiry_for_this_worker_only(h: Harness) -> None:
    """The long poll sleeps until durable state makes a task claimable (§14.1 "A retry with backoff becomes
    pollable once `available_at` passes, with no extra stimulus"), and never spins on one it cannot take."""
    h.schedule(a={"retry_policy": {"max_attempts": 2, "backoff_seconds": [7]}})
    h.register("picky", activity_types=["ship"])
    db = h.server.store.read()

    def due(worker_id: str) -> float | None:
        worker = db.execute("SELECT * FROM workers WHERE worker_id = ?", (worker_id,)).fetchone()
        return activity_due_in(db, worker, "q", h.clock.us)

    task = h.lease()
    assert due("w1") == pytest.approx(60.0)  # the lease expiry (redelivery)
    assert due("picky") is None
    h.fail(task)
    assert due("w1") == pytest.approx(7.0)  # the retry's backoff
    h.clock.advance(7)
    assert h.lease()["attempt_number"] == 2


def test_a_poll_enforces_due_timeouts_before_it_claims(h: Harness) -> None:
    h.schedule(a={"start_to_close_timeout": 10, "retry_policy": {"max_attempts": 2}})
    first = h.lease()
    h.clock.advance(10)  # no maintenance pass: the poll itself must notice the timeout
    second = h.lease("w2")
    assert second["attempt_number"] == 2
    assert second["task_id"] != first["task_id"]  # a timeout retry is a new task, not a redelivery
    [retry] = h.events("wf-1", "ActivityRetryScheduled")
    assert (retry["timeout_type"], retry["retry_backoff_seconds"]) == ("start_to_close", 0)


# -- ownership guard (§11.2, invariant 53) ----------------------------------------------------------------


def test_wrong_owner_is_fenced_and_changes_nothing(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    before = h.snapshot()
    status, body = h.complete({**task, "lease_owner": "intruder"})
    assert (status, body["reason"], body["lease_owner"]) == (409, "lease_owner_mismatch", "w1")
    assert h.snapshot() == before
    assert h.complete(task)[0] == 200  # the real owner still can


def test_unknown_task_and_unknown_attempt_are_404(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    status, body = h.complete({**task, "task_id": "NOPE"})
    assert (status, body["reason"]) == (404, "task_not_found")
    status, body = h.complete({**task, "activity_attempt_id": "NOPE"})
    assert (status, body["reason"]) == (404, "attempt_not_found")
    status, body = h.report("heartbeat", {**task, "activity_attempt_id": "NOPE"})
    assert (status, body["reason"]) == (404, "attempt_not_found")


def test_attempt_under_another_tasks_id_is_task_mismatch(h: Harness) -> None:
    h.schedule(a={}, b={})
    first, second = h.lease(), h.lease()
    status, body = h.complete({**first, "task_id": second["task_id"]})
    assert (status, body["reason"]) == (409, "task_mismatch")


# -- complete (§11.3, invariant 54) ------------------------------------------------------------------------


def test_complete_records_once_and_resumes_the_workflow_with_the_activity_context(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    status, body = h.complete(task)
    assert status == 200
    assert (body["outcome"], body["recorded"], body["reason"]) == ("completed", True, None)

    [event] = h.events("wf-1", "ActivityCompleted")
    assert event["result"] == RESULT["blob"]
    assert event["payload_codec"] == "avro"
    assert event["activity_execution_id"] == task["activity_execution_id"]
    assert event["activity_attempt_id"] == task["activity_attempt_id"]
    assert event["activity_type"] == "charge"
    [scheduled] = h.events("wf-1", "ActivityScheduled")
    assert event["sequence"] == scheduled["sequence"]  # the step, shared by every event of the activity

    resumed = resumed_task(h)
    assert resumed["task_id"] == body["next_task_id"]
    completed_seq = next(e["sequence"] for e in h.history("wf-1") if e["event_type"] == "ActivityCompleted")
    assert {k: resumed[k] for k in ("workflow_wait_kind", "open_wait_id", "resume_source_kind")} == {
        "workflow_wait_kind": "activity",
        "open_wait_id": f"activity:{task['activity_execution_id']}",
        "resume_source_kind": "activity_execution",
    }
    assert resumed["resume_source_id"] == resumed["activity_execution_id"] == task["activity_execution_id"]
    assert resumed["activity_attempt_id"] == task["activity_attempt_id"]
    assert resumed["activity_type"] == "charge"
    assert (resumed["workflow_sequence"], resumed["workflow_event_type"]) == (completed_seq, "ActivityCompleted")


def test_duplicate_complete_is_stale_attempt_and_records_nothing(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    assert h.complete(task)[0] == 200
    before = h.snapshot()
    for verb, call in (("completed", h.complete), ("failed", h.fail)):
        status, body = call(task)
        assert (status, body["reason"], body["recorded"], body["outcome"]) == (409, "stale_attempt", False, verb)
    assert h.snapshot() == before
    assert len(h.events("wf-1", "ActivityCompleted")) == 1
    assert_one_terminal_event_per_attempt(h, "wf-1")


@pytest.mark.parametrize("result", [RESULT["blob"], None], ids=["bare-blob", "null"])
def test_complete_accepts_a_bare_blob_or_null(h: Harness, result: Any) -> None:
    h.schedule(a={})
    status, _ = h.complete(h.lease(), result=result)
    assert status == 200
    assert h.events("wf-1", "ActivityCompleted")[0]["result"] == result


# -- fail and retry (§11.4, §11.6, §14.2, invariants 55–58) ----------------------------------------------


def test_retry_attempts_are_numbered_and_only_the_final_failure_resumes(h: Harness) -> None:
    h.schedule(a={"retry_policy": {"max_attempts": 3, "backoff_seconds": [2]}})
    leases: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []
    for n in range(3):
        if n:
            # §11.6: a retry is never leasable before its backoff, and creates no workflow task.
            assert h.poll_workflow() is None
            h.assert_empty()
            h.clock.advance(1.999)
            h.assert_empty()
            h.clock.advance(0.001)
        task = h.lease()
        if n:
            assert task["task_id"] == replies[-1]["next_task_id"]  # the retry task the fail named
        leases.append(task)
        status, body = h.fail(task, message=f"boom {n + 1}")
        assert (status, body["outcome"], body["recorded"]) == (200, "failed", True)
        replies.append(body)

    assert [t["attempt_number"] for t in leases] == [1, 2, 3]
    assert len({t["activity_execution_id"] for t in leases}) == 1
    assert len({t["activity_attempt_id"] for t in leases}) == 3
    assert len({t["task_id"] for t in leases}) == 3  # §11.1: a new task_id for each retry

    retries = h.events("wf-1", "ActivityRetryScheduled")
    assert [r["retry_after_attempt"] for r in retries] == [1, 2]
    assert all(r["retry_backoff_seconds"] == 2 and r["max_attempts"] == 3 for r in retries)
    [failed] = h.events("wf-1", "ActivityFailed")
    assert failed["activity_attempt_id"] == leases[-1]["activity_attempt_id"]
    assert (failed["message"], failed["failure_category"], failed["exception_type"]) == (
        "boom 3",
        "application",
        "RuntimeError",
    )
    assert failed["non_retryable"] is False
    resumed = resumed_task(h)
    assert resumed["task_id"] == replies[-1]["next_task_id"]
    assert resumed["workflow_event_type"] == "ActivityFailed"
    assert_one_terminal_event_per_attempt(h, "wf-1")


@pytest.mark.parametrize(
    "failure",
    [
        {"non_retryable": True},
        {"type": "CardDeclined"},
        {"type": "Other", "class": "billing.CardDeclined"},
    ],
    ids=["flag", "type-listed", "class-listed"],
)
def test_non_retryable_failure_is_final_at_once(h: Harness, failure: dict[str, Any]) -> None:
    policy = {
        "max_attempts": 5,
        "backoff_seconds": [1],
        "non_retryable_error_types": ["CardDeclined", "billing.CardDeclined"],
    }
    h.schedule(a={"retry_policy": policy})
    task = h.lease()
    status, body = h.fail(task, **failure)
    assert status == 200
    [failed] = h.events("wf-1", "ActivityFailed")
    assert failed["non_retryable"] is True  # the effective flag, whichever rule made it so
    assert h.events("wf-1", "ActivityRetryScheduled") == []
    h.clock.advance(10)
    h.assert_empty()
    assert resumed_task(h)["task_id"] == body["next_task_id"]  # invariant 56: the next task is the resume


def test_without_a_retry_policy_one_failure_is_final(h: Harness) -> None:
    h.schedule(a={})
    h.fail(h.lease())
    assert len(h.events("wf-1", "ActivityFailed")) == 1
    assert h.events("wf-1", "ActivityRetryScheduled") == []
    h.assert_empty()


def test_failure_contract_and_details_are_stored_unchanged(h: Harness) -> None:
    details = {"codec": "avro", "blob": encode_blob({"card": "visa", "attempts": [1, 2]})}
    h.schedule(a={})
    task = h.lease()
    status, _ = h.fail(
        task,
        message="declined",
        type="CardDeclined",
        **{"class": "billing.CardDeclined"},
        code=402,
        stack_trace="Traceback ...",
        details=details,
        kind="application",
    )
    assert status == 200
    [failed] = h.events("wf-1", "ActivityFailed")
    assert failed["details"] == details  # invariant 58: same blob, same codec
    assert failed["details_payload_codec"] == "avro"
    assert {k: failed[k] for k in ("exception_type", "exception_class", "message", "code", "activity_type")} == {
        "exception_type": "CardDeclined",
        "exception_class": "billing.CardDeclined",
        "message": "declined",
        "code": 402,
        "activity_type": "charge",
    }
    assert (failed["activity_execution_id"], failed["activity_attempt_id"]) == (
        task["activity_execution_id"],
        task["activity_attempt_id"],
    )
    assert "stack_trace" not in failed  # diagnostic only (§11.4)
    assert failed["diagnostics"] == {"stack_trace": "Traceback ..."}


@pytest.mark.parametrize(
    ("kind", "category"), [("timeout", "timeout"), ("cancellation", "cancelled"), ("handler_crash", "activity")]
)
def test_failure_kind_sets_the_category(h: Harness, kind: str, category: str) -> None:
    h.schedule(a={})
    h.fail(h.lease(), kind=kind)
    assert h.events("wf-1", "ActivityFailed")[0]["failure_category"] == category


# -- heartbeat and status (§11.5, invariant 59) ----------------------------------------------------------


def test_heartbeat_renews_the_lease_and_records_progress(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    h.clock.advance(40)
    progress = {"message": "half", "current": 5, "total": 10.0, "unit": "rows", "details": {"cursor": "abc"}}
    status, body = h.report("heartbeat", task, **progress)
    assert status == 200
    assert (body["can_continue"], body["cancel_requested"], body["heartbeat_recorded"], body["reason"]) == (
        True,
        False,
        True,
        None,
    )
    assert parse_rfc3339(body["lease_expires_at"]) == h.now() + timedelta(seconds=60)
    assert parse_rfc3339(body["lease_expires_at"]) >= parse_rfc3339(task["lease_expires_at"])
    assert parse_rfc3339(body["last_heartbeat_at"]) == h.now()
    [recorded] = h.events("wf-1", "ActivityHeartbeatRecorded")
    assert recorded["progress"] == progress
    assert recorded["activity_attempt_id"] == task["activity_attempt_id"]
    # The renewed lease is what counts: past the original expiry the owner still completes.
    h.clock.advance(30)
    assert h.complete(task)[0] == 200
    assert h.poll_workflow() is not None  # a heartbeat never resumed the workflow; the completion did, once


def test_status_observes_without_renewing_or_recording(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    h.clock.advance(10)
    before = h.snapshot()
    status, body = h.report("status", task)
    assert status == 200
    assert (body["can_continue"], body["heartbeat_recorded"], body["cancel_requested"]) == (True, False, False)
    assert body["lease_expires_at"] == task["lease_expires_at"]
    assert h.snapshot() == before


@pytest.mark.parametrize(
    "progress",
    [{"current": "5"}, {"total": True}, {"details": ["not", "an", "object"]}, {"message": 7}, {"unit": {}}],
    ids=["current-string", "total-bool", "details-list", "message-int", "unit-object"],
)
def test_invalid_progress_is_422_never_5xx(h: Harness, progress: dict[str, Any]) -> None:
    h.schedule(a={})
    task = h.lease()
    before = h.snapshot()
    status, body = h.report("heartbeat", task, **progress)
    assert (status, body["reason"]) == (422, "validation_failed")
    assert set(body["errors"]) == set(progress)
    assert h.snapshot() == before


# -- lease expiry and redelivery (§9, invariants 30–31 for activities) --------------------------------------


def test_lease_expiry_redelivers_the_same_task_as_a_new_attempt(h: Harness) -> None:
    h.schedule(a={})
    old = h.lease("w1")
    h.clock.advance(60)  # exactly lease_expires_at: expired (≤ now)

    before = h.snapshot()
    status, body = h.complete(old)
    assert (status, body["reason"], body["recorded"]) == (409, "stale_attempt", False)
    assert h.snapshot() == before  # a rejected report changes nothing

    new = h.lease("w2")
    assert new["task_id"] == old["task_id"]
    assert new["attempt_number"] == 2
    assert new["activity_attempt_id"] != old["activity_attempt_id"]
    assert new["activity_execution_id"] == old["activity_execution_id"]
    assert h.row("activity_attempts", "attempt_id", old["activity_attempt_id"])["status"] == "expired"

    # §9: "A late completion of the old attempt gets 409 `stale_attempt`"; its heartbeat cannot continue.
    assert h.complete(old)[1]["reason"] == "stale_attempt"
    status, body = h.report("heartbeat", old)
    assert (status, body["can_continue"], body["heartbeat_recorded"], body["reason"]) == (
        200,
        False,
        False,
        "stale_attempt",
    )
    assert h.events("wf-1", "ActivityRetryScheduled") == []  # redelivery is not a retry (§11.6)
    assert h.complete(new)[0] == 200
    assert len(h.events("wf-1", "ActivityCompleted")) == 1
    assert_one_terminal_event_per_attempt(h, "wf-1")


def test_heartbeat_after_expiry_closes_the_attempt_and_keeps_the_task_claimable(h: Harness) -> None:
    h.schedule(a={})
    old = h.lease()
    h.clock.advance(61)
    status, body = h.report("heartbeat", old)
    assert (status, body["can_continue"], body["reason"]) == (200, False, "stale_attempt")
    assert h.row("activity_attempts", "attempt_id", old["activity_attempt_id"])["status"] == "expired"
    assert h.lease("w2")["attempt_number"] == 2


# -- cancel and terminate (§11.5, invariants 50–51) --------------------------------------------------------


def test_cancelled_run_heartbeat_asks_to_stop_and_later_reports_are_ignored(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    h.close_run("wf-1", "cancel")

    status, body = h.report("heartbeat", task)
    assert status == 200
    assert (body["cancel_requested"], body["can_continue"], body["reason"], body["heartbeat_recorded"]) == (
        True,
        False,
        "run_cancelled",
        False,
    )
    assert body["run_closed_reason"] == "cancelled"
    assert body["run_closed_at"] is not None
    [cancelled] = h.events("wf-1", "ActivityCancelled")
    assert cancelled["activity_attempt_id"] == task["activity_attempt_id"]

    for call in (h.complete, h.fail):
        status, body = call(task)
        assert status == 409
        assert (body["outcome"], body["recorded"], body["reason"], body["cancel_requested"]) == (
            "ignored",
            False,
            "run_cancelled",
            True,
        )
        assert body["error"] == "Activity outcome ignored because the workflow run is already closed."
    assert h.events("wf-1", "ActivityCompleted") == []
    assert h.events("wf-1", "ActivityFailed") == []
    assert len(h.events("wf-1", "ActivityCancelled")) == 1
    assert_one_terminal_event_per_attempt(h, "wf-1")


def test_terminated_run_ignores_the_outcome_and_closes_the_activity(h: Harness) -> None:
    h.schedule(a={})
    task = h.lease()
    h.close_run("wf-1", "terminate")

    status, body = h.complete(task)
    assert (status, body["reason"], body["outcome"], body["lease_expires_at"]) == (
        409,
        "run_terminated",
        "ignored",
        None,
    )
    assert (body["activity_status"], body["attempt_status"], body["task_status"]) == ("cancelled",) * 3
    # §11.5: closed as cancelled "in the same transaction" as the ignored report.
    assert h.row("activity_attempts", "attempt_id", task["activity_attempt_id"])["status"] == "cancelled"
    assert h.row("activity_tasks", "task_id", task["task_id"])["status"] == "cancelled"
    assert h.row("activity_executions", "execution_id", task["activity_execution_id"])["status"] == "cancelled"
    assert len(h.events("wf-1", "ActivityCancelled")) == 1

    status, body = h.report("heartbeat", task)
    assert (status, body["cancel_requested"], body["reason"]) == (200, True, "run_terminated")


def test_no_activity_of_a_closed_run_is_ever_leased(h: Harness) -> None:
    h.schedule(a={}, b={})
    leased = h.lease()
    h.close_run("wf-1", "cancel")
    h.assert_empty()  # the ready one was cancelled with the run
    h.clock.advance(120)  # the leased one's lease ran out: still never redelivered (invariant 50)
    h.assert_empty()
    h.maintain()
    assert h.row("activity_tasks", "task_id", leased["task_id"])["status"] == "cancelled"
    assert len(h.events("wf-1", "ActivityCancelled")) == 1


# -- timeouts (§11.7) --------------------------------------------------------------------------------------


def test_schedule_to_start_timeout_is_terminal(h: Harness) -> None:
    h.schedule(a={"schedule_to_start_timeout": 5, "retry_policy": {"max_attempts": 3}})
    # The maintenance step reports the next deadline, so the scheduler sleeps exactly until it.
    assert h.server.run_tx(enforce_activity_timeouts) == pytest.approx(5.0)
    h.clock.advance(4)
    assert h.server.run_tx(enforce_activity_timeouts) == pytest.approx(1.0)
    h.elapse(0.999)
    assert h.events("wf-1", "ActivityTimedOut") == []
    h.elapse(0.001)
    [timed_out] = h.events("wf-1", "ActivityTimedOut")
    assert (timed_out["timeout_type"], timed_out["failure_category"]) == ("schedule_to_start", "timeout")
    assert timed_out["activity_attempt_id"] is None
    h.assert_empty()
    resumed = resumed_task(h)
    assert (resumed["workflow_event_type"], resumed["workflow_wait_kind"]) == ("ActivityTimedOut", "activity")


def test_start_to_close_timeout_retries_while_attempts_remain(h: Harness) -> None:
    h.schedule(a={"start_to_close_timeout": 10, "retry_policy": {"max_attempts": 2, "backoff_seconds": [3]}})
    first = h.lease()
    h.elapse(10)
    [retry] = h.events("wf-1", "ActivityRetryScheduled")
    assert (retry["timeout_type"], retry["retry_after_attempt"], retry["retry_backoff_seconds"]) == (
        "start_to_close",
        1,
        3,
    )
    assert h.poll_workflow() is None
    assert h.complete(first)[1]["reason"] == "stale_attempt"  # §11.7 the expired attempt's late complete
    h.clock.advance(3)
    second = h.lease()
    assert second["attempt_number"] == 2
    assert second["task_id"] != first["task_id"]
    h.elapse(10)
    [timed_out] = h.events("wf-1", "ActivityTimedOut")
    assert (timed_out["timeout_type"], timed_out["activity_attempt_id"]) == (
        "start_to_close",
        second["activity_attempt_id"],
    )
    assert resumed_task(h)["workflow_event_type"] == "ActivityTimedOut"
    assert_one_terminal_event_per_attempt(h, "wf-1")


def test_heartbeat_timeout_measures_the_gap_between_heartbeats(h: Harness) -> None:
    h.schedule(a={"heartbeat_timeout": 3, "start_to_close_timeout": 30})
    task = h.lease()
    h.clock.advance(2)
    assert h.report("heartbeat", task)[1]["can_continue"] is True
    h.elapse(2.5)  # 4.5 s after the claim, 2.5 s after the heartbeat
    assert h.events("wf-1", "ActivityTimedOut") == []
    h.elapse(0.5)
    [timed_out] = h.events("wf-1", "ActivityTimedOut")
    assert timed_out["timeout_type"] == "heartbeat"
    status, body = h.report("heartbeat", task)
    assert (status, body["can_continue"], body["heartbeat_recorded"]) == (200, False, False)


def test_schedule_to_close_is_terminal_even_with_attempts_left(h: Harness) -> None:
    h.schedule(a={"schedule_to_close_timeout": 20, "retry_policy": {"max_attempts": 5, "backoff_seconds": [1]}})
    task = h.lease()
    h.elapse(20)
    [timed_out] = h.events("wf-1", "ActivityTimedOut")
    assert timed_out["timeout_type"] == "schedule_to_close"
    assert h.events("wf-1", "ActivityRetryScheduled") == []
    assert h.complete(task)[1]["reason"] == "stale_attempt"
    h.clock.advance(5)
    h.assert_empty()


def test_a_report_after_a_deadline_is_stale_even_before_the_enforcer_runs(h: Harness) -> None:
    h.schedule(a={"start_to_close_timeout": 10})
    task = h.lease()
    h.clock.advance(10)
    before = h.snapshot()
    status, body = h.complete(task)
    assert (status, body["reason"]) == (409, "stale_attempt")
    assert h.snapshot() == before  # rejected: the enforcer records the timeout, not this call
    h.maintain()
    assert len(h.events("wf-1", "ActivityTimedOut")) == 1


# -- body validation (§11.2–§11.5: 422 before any lookup, state unchanged) ----------------------------------


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("complete", {"activity_attempt_id": None}, "activity_attempt_id"),
        ("complete", {"lease_owner": ""}, "lease_owner"),
        ("complete", {"result": {"codec": "json", "blob": "e30="}}, "result.codec"),
        ("complete", {"result": "not base64!"}, "result"),
        ("complete", {"result": {"codec": "avro", "blob": "wwE=", "extra": 1}}, "result"),
        ("complete", {"result": 42}, "result"),
        ("fail", {"failure": None}, "failure"),
        ("fail", {"failure": {"type": "X"}}, "failure.message"),
        ("fail", {"failure": {"message": "m", "kind": "oops"}}, "failure.kind"),
        ("fail", {"failure": {"message": "m", "timeout_type": "forever"}}, "failure.timeout_type"),
        ("fail", {"failure": {"message": "m", "code": "E42"}}, "failure.code"),
        ("fail", {"failure": {"message": "m", "non_retryable": "yes"}}, "failure.non_retryable"),
        ("fail", {"failure": {"message": "m", "details": {"codec": "json", "blob": "e30="}}}, "failure.details.codec"),
        ("fail", {"failure": {"message": "m", "details": "wwE="}}, "failure.details"),
        ("heartbeat", {"lease_owner": 5}, "lease_owner"),
        ("status", {"activity_attempt_id": 7}, "activity_attempt_id"),
    ],
)
def test_invalid_bodies_are_422_and_change_nothing(h: Harness, verb: str, body: dict[str, Any], field: str) -> None:
    h.schedule(a={})
    task = h.lease()
    before = h.snapshot()
    doc = {"activity_attempt_id": task["activity_attempt_id"], "lease_owner": "w1", "result": None, **body}
    status, reply = h.call("POST", f"/api/worker/activity-tasks/{task['task_id']}/{verb}", doc)
    assert (status, reply["reason"]) == (422, "validation_failed")
    assert field in reply["errors"]
    assert field in reply["validation_errors"]
    if field.endswith(".codec"):
        assert reply["errors"][field][0].startswith("unsupported_payload_codec:")
    assert reply["protocol_version"] == "1.20"
    assert h.snapshot() == before
    assert h.complete(task)[0] == 200  # the owner can still report properly


def test_validation_comes_before_the_task_lookup(h: Harness) -> None:
    status, body = h.call("POST", "/api/worker/activity-tasks/UNKNOWN/complete", {})
    assert (status, body["reason"]) == (422, "validation_failed")
    assert set(body["errors"]) == {"activity_attempt_id", "lease_owner"}


def test_empty_failure_message_is_accepted(h: Harness) -> None:
    h.schedule(a={})
    assert h.fail(h.lease(), message="")[0] == 200
