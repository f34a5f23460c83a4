"""Eight rules decided where the protocol is open, each fixed here and pinned by a test (docs/reference-server.md,
"Decided rules"): next_task_id during a lease, can_query on closed runs, the update input array, accepted
updates of a closing run, follow-up replays only for events that wake the run, a closed attempt's lease, what
created_task_ids names for a run a batch starts, and a child's execution timeout across its retries."""

from __future__ import annotations

from typing import Any

from suite.protocol.codec import encode_blob
from tests.server.harness import Harness, h, make

__all__ = ["h", "make"]  # the fixtures

ARGS = {"codec": "avro", "blob": encode_blob(["x"])}


def schedule(h: Harness, **options: Any) -> str:
    """wf-1's first task schedules one activity on queue q (worker w1 serves both)."""
    run_id = h.start("wf-1")
    command = {"type": "schedule_activity", "activity_type": "act", "queue": "q", "arguments": ARGS, **options}
    h.completed(h.lease(), command)
    return run_id


def test_next_task_id_is_null_while_the_runs_task_is_leased(h: Harness) -> None:
    """The leased task was shown a history without the result; the follow-up does not exist yet."""
    run_id = schedule(h)
    activity = h.activity_lease()
    h.signal("wf-1")
    leased = h.lease()  # the run's task is out with a worker
    out = h.activity_report("complete", activity, result=ARGS)
    assert out["next_task_id"] is None
    done = h.completed(leased, {"type": "start_timer", "delay_seconds": 600})
    [follow_up] = h.open_tasks(run_id)
    # The result woke the run during the lease: the completion created the follow-up replay that sees it.
    assert follow_up["status"] == "ready"
    assert follow_up["task_id"] in done["created_task_ids"]


def test_next_task_id_names_a_ready_task(h: Harness) -> None:
    run_id = schedule(h)
    out = h.activity_report("complete", h.activity_lease(), result=ARGS)
    [ready] = h.open_tasks(run_id)
    assert out["next_task_id"] == ready["task_id"]


def test_closed_runs_can_be_queried(h: Harness) -> None:
    h.start("wf-1")
    h.close("wf-1", "terminate")
    assert h.describe("wf-1")["actions"]["can_query"] is True


def test_update_input_must_decode_to_an_argument_array(h: Harness) -> None:
    h.start("wf-1")
    before = h.snapshot()
    status, doc = h.control(
        "POST", "/workflows/wf-1/update/u", {"wait_for": "accepted", "input": {"codec": "avro", "blob": encode_blob(7)}}
    )
    assert (status, doc["reason"]) == (422, "validation_failed"), doc
    assert "input.blob" in doc["errors"]
    assert h.snapshot() == before
    assert h.update_accepted("wf-1", input={"codec": "avro", "blob": encode_blob([7])})


def test_accepted_updates_are_rejected_when_their_run_closes(h: Harness) -> None:
    h.start("wf-1")
    update_id = h.update_accepted("wf-1")
    h.close("wf-1", "cancel")
    [row] = h.rows("SELECT status, closed_at FROM updates WHERE update_id = ?", update_id)
    assert row["status"] == "rejected"
    assert row["closed_at"] is not None


def test_events_that_wake_nothing_cause_no_follow_up_replay(h: Harness) -> None:
    run_id = schedule(h)
    activity = h.activity_lease()
    h.signal("wf-1")
    leased = h.lease()
    h.activity_report("heartbeat", activity)  # ActivityHeartbeatRecorded during the lease: wakes nothing
    h.completed(leased, {"type": "record_side_effect", "result": encode_blob("s")})
    assert h.open_tasks(run_id) == []
    assert h.describe("wf-1")["status"] == "waiting"


def test_a_timed_out_attempt_reports_no_lease(h: Harness) -> None:
    schedule(h, start_to_close_timeout=5)
    activity = h.activity_lease()
    h.elapse(6)
    out = h.activity_report("heartbeat", activity)
    assert (out["can_continue"], out["lease_expires_at"]) == (False, None)


def test_created_task_ids_name_the_first_task_of_each_run_a_batch_starts(h: Harness) -> None:
    """A child run and the next run of a continue_as_new are listed by their first workflow task, never by run id."""
    h.register("cw", queue="cq")
    h.start("wf-1")
    kid = {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq"}
    out = h.completed(h.lease(), kid, {"type": "continue_as_new"})
    child, following = h.lease("cw"), h.lease()
    assert out["created_task_ids"] == [child["task_id"], following["task_id"]]
    assert following["run_id"] == h.describe("wf-1")["run_id"]


def test_a_childs_execution_timeout_spans_its_retries_and_ends_them(h: Harness) -> None:
    """A retry keeps the deadline the child's first run started; past it the child is closed and not retried."""
    h.register("cw", queue="cq")
    h.start("parent")
    policy = {"max_attempts": 5, "backoff_seconds": [3]}
    kid = {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", "retry_policy": policy}
    h.completed(h.lease(), {**kid, "execution_timeout_seconds": 5})
    h.completed(h.lease("cw"), {"type": "fail_workflow", "message": "first run"})
    h.elapse(3)
    h.completed(h.lease("cw"), {"type": "start_timer", "delay_seconds": 600})
    h.elapse(2)
    [scheduled] = h.events("parent", "ChildWorkflowScheduled")
    child = h.describe(scheduled["payload"]["child_workflow_id"])
    assert (child["run_number"], child["status"], child["closed_reason"]) == (2, "failed", "timed_out")
    [timed_out] = h.events(child["workflow_id"], "WorkflowTimedOut", child["run_id"])
    assert timed_out["payload"]["timeout_type"] == "execution"
    h.elapse(10)
    assert [e for e in h.event_types("parent") if e.startswith("ChildRun")] == [
        "ChildRunStarted",
        "ChildRunStarted",
        "ChildRunFailed",
    ]
