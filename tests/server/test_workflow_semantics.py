"""What workflow-task commands do, through the in-process handler: docs/reference.md: Payload shape (resume contexts),
§8.7 and §8.7.1 (every command type, atomic batches, applied in order), child workflows (parent-close policies, child
retry), continue-as-new, and Python SDK 2.12.0, Replay (step sequences; at most one open workflow task per run).

Time is a fake clock and the scheduler runs only when a test calls ``maintain()``: a timer or a child retry is
due because the clock was moved to its due instant, and not one microsecond earlier.
"""

from __future__ import annotations

from typing import Any

import pytest

from suite.protocol.codec import decode_blob, encode_blob
from tests.server.harness import RESUME_KEYS, Harness, HarnessFactory, h, make

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

RESULT = {"codec": "avro", "blob": encode_blob({"ok": True})}
ARGS = {"codec": "avro", "blob": encode_blob(["order-17", 3])}
WAIT = {"type": "start_timer", "delay_seconds": 3600}  # keeps a run open and waiting
COMPLETE = {"type": "complete_workflow", "result": RESULT}


def resume(task: dict[str, Any]) -> dict[str, Any]:
    """The non-null resume-context keys of a leased task (every one of the 20 keys must be present)."""
    missing = [k for k in RESUME_KEYS if k not in task]
    assert not missing, missing
    return {k: task[k] for k in RESUME_KEYS if task[k] is not None}


def assert_no_private_keys(task: dict[str, Any]) -> None:
    assert not [k for k in task if k.startswith("_")], task


def seq_of(h: Harness, workflow_id: str, event_type: str, run_id: str | None = None) -> int:
    [event] = h.events(workflow_id, event_type, run_id)
    return int(event["sequence"])


def woken_by(
    h: Harness,
    event_type: str,
    *,
    wait: tuple[str, str],
    source: tuple[str, str],
    workflow_id: str = "wf-1",
    **ids: Any,
) -> dict[str, Any]:
    """The resume context (§8.3) of a task woken by the one ``event_type`` event of ``workflow_id``: the wait it
    ends and the source that ended it (each a kind and an id), the ``ids`` of what they name, and the event."""
    return {
        "workflow_wait_kind": wait[0],
        "open_wait_id": wait[1],
        "resume_source_kind": source[0],
        "resume_source_id": source[1],
        **ids,
        "workflow_sequence": seq_of(h, workflow_id, event_type),
        "workflow_event_type": event_type,
    }


def waiting_run(h: Harness, workflow_id: str = "wf-1", *commands: dict[str, Any]) -> dict[str, Any]:
    """Start a run and complete its first task with ``commands`` (a long timer by default)."""
    h.start(workflow_id)
    return h.completed(h.lease(), *(commands or (WAIT,)))


# -- every command type, atomically and in order (§8.7, §8.7.1) ---------------------------------------------


def full_batch(update_ok: str, update_bad: str) -> list[dict[str, Any]]:
    return [
        {"type": "record_side_effect", "result": encode_blob(7)},
        {"type": "record_version_marker", "change_id": "c1", "version": 2, "min_supported": 1, "max_supported": 3},
        {"type": "upsert_search_attributes", "attributes": {"Region": "eu", "Tags": ["a", "b"]}},
        {"type": "schedule_activity", "activity_type": "charge", "arguments": ARGS},
        {"type": "start_timer", "delay_seconds": 30},
        {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", "parent_close_policy": "abandon"},
        {"type": "complete_update", "update_id": update_ok, "result": RESULT},
        {"type": "fail_update", "update_id": update_bad, "message": "no", "exception_type": "Denied"},
        {
            "type": "open_condition_wait",
            "condition_key": "k",
            "condition_definition_fingerprint": "sha256:f",
            "timeout_seconds": 50,
        },
    ]


def test_every_non_terminal_command_is_applied_in_batch_order(h: Harness) -> None:
    waiting_run(h)  # step 1: the first task's timer
    ok = h.update_accepted("wf-1", "approve")
    bad = h.update_accepted("wf-1", "reject")
    task = h.lease()
    start = len(h.history("wf-1"))
    out = h.completed(task, *full_batch(ok, bad))
    assert (out["outcome"], out["recorded"], out["run_status"]) == ("completed", True, "waiting")
    new = h.history("wf-1")[start:]
    assert [e["event_type"] for e in new] == [
        "SideEffectRecorded",
        "VersionMarkerRecorded",
        "SearchAttributesUpserted",
        "ActivityScheduled",
        "TimerScheduled",
        "ChildWorkflowScheduled",
        "ChildRunStarted",
        "UpdateApplied",
        "UpdateCompleted",
        "UpdateApplied",
        "UpdateCompleted",
        "ConditionWaitOpened",
        "TimerScheduled",
    ]
    assert [e["sequence"] for e in new] == list(range(start + 1, start + 1 + len(new)))
    # Python SDK 2.12.0, Replay: one step sequence per step command, in order, continuing from the first task's timer.
    steps = [(e["event_type"], e["payload"].get("sequence")) for e in new if "sequence" in e["payload"]]
    assert steps == [
        ("SideEffectRecorded", 2),
        ("VersionMarkerRecorded", 3),
        ("ActivityScheduled", 4),
        ("TimerScheduled", 5),
        ("ChildWorkflowScheduled", 6),
        ("ChildRunStarted", 6),
        ("ConditionWaitOpened", 7),
        ("TimerScheduled", 7),
    ]
    by_type = {e["event_type"]: e["payload"] for e in new}
    assert decode_blob(by_type["SideEffectRecorded"]["result"]) == 7
    assert {
        k: by_type["VersionMarkerRecorded"][k] for k in ("change_id", "version", "min_supported", "max_supported")
    } == {
        "change_id": "c1",
        "version": 2,
        "min_supported": 1,
        "max_supported": 3,
    }
    completions = [e["payload"] for e in new if e["event_type"] == "UpdateCompleted"]
    assert [(c["update_id"], c["outcome"]) for c in completions] == [(ok, "completed"), (bad, "failed")]
    # created_task_ids: the activity task, the timer, the child's first workflow task and the condition's timeout
    # timer, in order.
    activity = h.activity_lease("w1")
    [timer] = h.rows("SELECT timer_id FROM timers WHERE timer_kind = 'sleep' AND delay_seconds = 30")
    child_run = h.describe(by_type["ChildWorkflowScheduled"]["child_workflow_id"])["run_id"]
    [child_task] = h.rows("SELECT task_id FROM workflow_tasks WHERE run_id = ?", child_run)
    [cond_timer] = h.rows("SELECT timer_id FROM timers WHERE timer_kind = 'condition_timeout'")
    created = [activity["task_id"], timer["timer_id"], child_task["task_id"], cond_timer["timer_id"]]
    assert out["created_task_ids"] == created
    assert activity["arguments"] == ARGS
    assert h.describe("wf-1")["search_attributes"] == {"Region": "eu", "Tags": ["a", "b"]}
    statuses = {u["update_id"]: u["status"] for u in h.rows("SELECT update_id, status FROM updates")}
    assert statuses == {ok: "completed", bad: "failed"}


INVALID_LAST: list[tuple[str, list[dict[str, Any]], int, str]] = [
    ("unknown-type", [{"type": "teleport"}], 409, "invalid_commands"),
    ("negative-timer", [{"type": "start_timer", "delay_seconds": -1}], 422, "validation_failed"),
    ("huge-timer", [{"type": "start_timer", "delay_seconds": 10**13}], 422, "validation_failed"),
    ("unknown-update", [{"type": "complete_update", "update_id": "nope"}], 409, "invalid_commands"),
    (
        "version-outside-range",
        [{"type": "record_version_marker", "change_id": "c", "version": 5, "min_supported": 1, "max_supported": 3}],
        422,
        "validation_failed",
    ),
    (
        "timeout-order",
        [{"type": "schedule_activity", "activity_type": "a", "heartbeat_timeout": 10, "start_to_close_timeout": 5}],
        422,
        "validation_failed",
    ),
    (
        "scope",
        [{"type": "start_timer", "delay_seconds": 1, "retry_policy": {"max_attempts": 2}}],
        422,
        "validation_failed",
    ),
    (
        "close-policy",
        [{"type": "start_child_workflow", "workflow_type": "kid", "parent_close_policy": "orphan"}],
        422,
        "validation_failed",
    ),
    (
        "codec",
        [{"type": "schedule_activity", "activity_type": "a", "arguments": {"codec": "json", "blob": encode_blob([1])}}],
        422,
        "validation_failed",
    ),
    ("empty-side-effect", [{"type": "record_side_effect", "result": ""}], 422, "validation_failed"),
    ("fail-without-message", [{"type": "fail_workflow"}], 422, "validation_failed"),
    ("two-terminals", [COMPLETE, {"type": "fail_workflow", "message": "x"}], 409, "invalid_commands"),
    (
        "update-closed-twice",
        [{"type": "complete_update", "update_id": "OK"}],  # the prefix already completes update OK
        409,
        "invalid_commands",
    ),
]


@pytest.mark.parametrize(("name", "tail", "status", "reason"), INVALID_LAST, ids=[c[0] for c in INVALID_LAST])
def test_a_batch_whose_last_command_is_invalid_applies_nothing(
    h: Harness, name: str, tail: list[dict[str, Any]], status: int, reason: str
) -> None:
    """§8.7: "The batch commits atomically: either everything is applied or nothing is." The task stays leased,
    so the same owner then completes with a valid batch."""
    waiting_run(h)
    ok = h.update_accepted("wf-1", "approve")
    bad = h.update_accepted("wf-1", "reject")
    task = h.lease()
    tail = [{**c, "update_id": ok} if c.get("update_id") == "OK" else c for c in tail]
    before = h.snapshot()
    got, doc = h.complete(task, *full_batch(ok, bad), *tail)
    assert (got, doc["reason"]) == (status, reason), doc
    if status == 409:
        assert doc["recorded"] is False
    assert h.snapshot() == before, f"{name}: a rejected batch changed state"
    out = h.completed(task, *full_batch(ok, bad), COMPLETE)
    assert out["run_status"] == "completed"


def test_the_terminal_command_is_applied_after_the_others_wherever_it_sits(h: Harness) -> None:
    h.start("wf-1")
    h.completed(h.lease(), COMPLETE, {"type": "record_side_effect", "result": RESULT})
    types = h.event_types("wf-1")
    assert types[-2:] == ["SideEffectRecorded", "WorkflowCompleted"]


def test_complete_workflow_stores_the_result_unchanged(h: Harness) -> None:
    h.start("wf-1")
    out = h.completed(h.lease(), COMPLETE)
    assert (out["run_status"], out["created_task_ids"]) == ("completed", [])
    described = h.describe("wf-1")
    assert (described["status"], described["closed_reason"]) == ("completed", "completed")
    assert described["output_envelope"] == RESULT
    assert described["output"] == {"ok": True}
    [event] = h.events("wf-1", "WorkflowCompleted")
    assert event["payload"]["result"] == RESULT
    h.assert_empty()


def test_fail_workflow_fails_the_run(h: Harness) -> None:
    h.start("wf-1")
    out = h.completed(
        h.lease(),
        {"type": "fail_workflow", "message": "boom", "exception_type": "ValueError", "non_retryable": True},
    )
    assert out["run_status"] == "failed"
    described = h.describe("wf-1")
    assert (described["status"], described["closed_reason"]) == ("failed", "failed")
    assert (described["failure"]["message"], described["failure"]["exception_type"]) == ("boom", "ValueError")
    [event] = h.events("wf-1", "WorkflowFailed")
    assert (event["payload"]["message"], event["payload"]["non_retryable"]) == ("boom", True)


def test_non_terminal_only_completes_leave_the_run_waiting(h: Harness) -> None:
    out = waiting_run(h)
    assert out["run_status"] == "waiting"
    assert h.describe("wf-1")["status"] == "waiting"
    h.assert_empty()


# -- timers (§8.3 pure timer; invariant 39) -----------------------------------------------------------------


def test_a_timer_fires_only_after_its_delay_with_the_timer_resume_context(make: HarnessFactory) -> None:
    h = make(scheduler_max_sleep_seconds=1e6)
    h.start("wf-1")
    out = h.completed(h.lease(), {"type": "start_timer", "delay_seconds": 10})
    [timer_id] = out["created_task_ids"]
    [scheduled] = h.events("wf-1", "TimerScheduled")
    assert (scheduled["payload"]["timer_id"], scheduled["payload"]["delay_seconds"]) == (timer_id, 10)
    assert h.maintain() == pytest.approx(10.0)  # the scheduler sleeps exactly until the timer is due
    h.elapse(10 - 0.000001)
    assert h.events("wf-1", "TimerFired") == []
    h.assert_empty()
    h.elapse(0.000001)
    task = h.lease()
    assert resume(task) == woken_by(
        h, "TimerFired", wait=("timer", f"timer:{timer_id}"), source=("timer", timer_id), timer_id=timer_id
    )
    assert_no_private_keys(task)
    h.maintain()
    assert len(h.events("wf-1", "TimerFired")) == 1  # a fired timer never fires again


def test_a_zero_delay_timer_fires_on_the_next_pass(h: Harness) -> None:
    h.start("wf-1")
    h.completed(h.lease(), {"type": "start_timer", "delay_seconds": 0})
    h.maintain()
    assert h.lease()["workflow_event_type"] == "TimerFired"


def test_a_timer_of_a_closed_run_never_fires(h: Harness) -> None:
    h.start("wf-1")
    h.completed(h.lease(), {"type": "start_timer", "delay_seconds": 5})
    h.close("wf-1", "cancel")
    h.elapse(5)
    assert h.events("wf-1", "TimerFired") == []
    h.assert_empty()


def test_a_condition_wait_timeout_wakes_the_run_with_the_condition_context(h: Harness) -> None:
    h.start("wf-1")
    wait = {
        "type": "open_condition_wait",
        "condition_key": "ready",
        "condition_definition_fingerprint": "sha256:abc",
        "timeout_seconds": 5,
    }
    [timer_id] = h.completed(h.lease(), wait)["created_task_ids"]
    [opened] = h.events("wf-1", "ConditionWaitOpened")
    wait_id = opened["payload"]["condition_wait_id"]
    h.signal("wf-1")
    task = h.lease()
    h.completed(task, wait)  # re-emitted with the same key and fingerprint: the same wait stays open
    assert len(h.events("wf-1", "ConditionWaitOpened")) == 1
    h.elapse(5)
    assert [e["payload"]["condition_wait_id"] for e in h.events("wf-1", "ConditionWaitTimedOut")] == [wait_id]
    assert resume(h.lease()) == woken_by(
        h,
        "TimerFired",
        wait=("condition", f"condition:{wait_id}"),
        source=("timer", timer_id),
        timer_id=timer_id,
        condition_wait_id=wait_id,
        condition_key="ready",
        condition_definition_fingerprint="sha256:abc",
    )


def test_a_condition_wait_the_worker_moves_past_is_satisfied_and_its_timer_cancelled(h: Harness) -> None:
    h.start("wf-1")
    wait = {"type": "open_condition_wait", "condition_key": "k", "timeout_seconds": 5}
    h.completed(h.lease(), wait)
    h.signal("wf-1")
    h.completed(h.lease(), WAIT)  # not re-emitted: the replay got past it
    # Satisfied first, then the batch's own commands (Python SDK 2.12.0, Replay).
    assert h.event_types("wf-1")[-3:] == ["SignalReceived", "ConditionWaitSatisfied", "TimerScheduled"]
    h.elapse(5)
    assert h.events("wf-1", "ConditionWaitTimedOut") == []
    h.assert_empty()


def test_an_update_of_another_run_cannot_be_completed(h: Harness) -> None:
    waiting_run(h, "wf-a")
    other = h.update_accepted("wf-a")
    h.start("wf-b")
    [task] = [t for t in (h.lease(), h.lease()) if t["workflow_id"] == "wf-b"]
    before = h.snapshot()
    status, doc = h.complete(task, {"type": "complete_update", "update_id": other})
    assert (status, doc["reason"]) == (409, "invalid_commands"), doc
    assert h.snapshot() == before


# -- signals, updates and activities wake the run with their resume context ---------------------------------


def test_a_signal_wakes_a_waiting_run_with_the_signal_context(h: Harness) -> None:
    waiting_run(h)
    sent = h.signal("wf-1", "approve", input=["yes"])
    task = h.lease()
    signal_id = sent["signal_id"]
    assert resume(task) == woken_by(
        h,
        "SignalReceived",
        wait=("signal", f"signal-application:{signal_id}"),
        source=("workflow_signal", signal_id),
        workflow_signal_id=signal_id,
        signal_name="approve",
    )
    assert task["run_status"] == "running"


def test_an_update_wakes_a_waiting_run_with_the_update_context(h: Harness) -> None:
    waiting_run(h)
    update_id = h.update_accepted("wf-1", "approve")
    task = h.lease()
    assert resume(task) == woken_by(
        h,
        "UpdateAccepted",
        wait=("update", f"update:{update_id}"),
        source=("workflow_update", update_id),
        workflow_update_id=update_id,
    )


def activity_context(h: Harness, activity: dict[str, Any], event_type: str) -> dict[str, Any]:
    execution = activity["activity_execution_id"]
    return woken_by(
        h,
        event_type,
        wait=("activity", f"activity:{execution}"),
        source=("activity_execution", execution),
        activity_execution_id=execution,
        activity_attempt_id=activity["activity_attempt_id"],
        activity_type="charge",
    )


@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_an_activity_outcome_wakes_the_run_with_the_activity_context(h: Harness, verb: str) -> None:
    waiting_run(h, "wf-1", {"type": "schedule_activity", "activity_type": "charge", "arguments": ARGS})
    activity = h.activity_lease()
    body = {"result": RESULT} if verb == "complete" else {"failure": {"message": "declined", "type": "CardError"}}
    report = h.activity_report(verb, activity, **body)
    event_type = "ActivityCompleted" if verb == "complete" else "ActivityFailed"
    task = h.lease()
    assert report["next_task_id"] == task["task_id"]
    assert resume(task) == activity_context(h, activity, event_type)


# -- child workflows ----------------------------------------------------------------------------------------


def start_child(h: Harness, *extra: dict[str, Any], **fields: Any) -> tuple[str, str, str]:
    """Parent ``parent`` starts one child on queue ``cq``; returns (child workflow id, child run id, call id)."""
    h.register("cw", queue="cq")
    h.start("parent")
    out = h.completed(
        h.lease(), {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", **fields}, *extra
    )
    child_run = h.run_of(out["created_task_ids"][0])
    [scheduled] = h.events("parent", "ChildWorkflowScheduled")
    return scheduled["payload"]["child_workflow_id"], child_run, scheduled["payload"]["child_call_id"]


def child_context(h: Harness, call_id: str, child_run: str, event_type: str) -> dict[str, Any]:
    return woken_by(
        h,
        event_type,
        wait=("child", f"child:{call_id}"),
        source=("child_workflow_run", child_run),
        workflow_id="parent",
        child_call_id=call_id,
        child_workflow_run_id=child_run,
    )


def test_start_child_workflow_creates_the_child_run(h: Harness) -> None:
    child_wid, child_run, call_id = start_child(h, arguments=ARGS)
    described = h.describe(child_wid)
    assert (described["run_id"], described["workflow_type"], described["task_queue"]) == (child_run, "kid", "cq")
    [started] = h.events(child_wid, "WorkflowStarted")
    assert started["payload"]["parent_workflow_id"] == "parent"
    [run_started] = h.events("parent", "ChildRunStarted")
    assert (run_started["payload"]["child_workflow_run_id"], run_started["payload"]["child_call_id"]) == (
        child_run,
        call_id,
    )
    child_task = h.lease("cw")
    assert (child_task["run_id"], child_task["arguments"]) == (child_run, ARGS)
    assert resume(child_task) == {}  # the child's first task: every resume key null
    h.assert_empty("w1")  # the parent waits for the child


def test_a_child_completion_wakes_the_parent(h: Harness) -> None:
    _child_wid, child_run, call_id = start_child(h)
    h.completed(h.lease("cw"), COMPLETE)
    [done] = h.events("parent", "ChildRunCompleted")
    assert (done["payload"]["child_workflow_run_id"], done["payload"]["result"]) == (child_run, RESULT)
    task = h.lease("w1")
    assert task["run_id"] != child_run
    assert resume(task) == child_context(h, call_id, child_run, "ChildRunCompleted")


def test_a_child_failure_wakes_the_parent(h: Harness) -> None:
    _child_wid, child_run, call_id = start_child(h)
    h.completed(h.lease("cw"), {"type": "fail_workflow", "message": "kid broke", "exception_type": "KidError"})
    [failed] = h.events("parent", "ChildRunFailed")
    assert (failed["payload"]["message"], failed["payload"]["exception_type"]) == ("kid broke", "KidError")
    assert resume(h.lease("w1")) == child_context(h, call_id, child_run, "ChildRunFailed")


PARENT_CLOSES: dict[str, list[dict[str, Any]]] = {
    "complete": [COMPLETE],
    "fail": [{"type": "fail_workflow", "message": "parent broke"}],
    "cancel": [],  # closed afterwards through the control plane
}
POLICIES = {
    "abandon": ("pending", None),
    "request_cancel": ("cancelled", "WorkflowCancelled"),
    # request_cancellation is cooperative (tests/server/test_cooperative_cancellation.py)
    "terminate": ("terminated", "WorkflowTerminated"),
}


@pytest.mark.parametrize("close", list(PARENT_CLOSES))
@pytest.mark.parametrize("policy", list(POLICIES))
def test_parent_close_policies(h: Harness, close: str, policy: str) -> None:
    child_wid, child_run, _ = start_child(h, *PARENT_CLOSES[close], parent_close_policy=policy)
    if close == "cancel":
        h.close("parent", "cancel")
    parent = h.describe("parent")
    assert parent["status"] == {"complete": "completed", "fail": "failed", "cancel": "cancelled"}[close]
    status, event_type = POLICIES[policy]
    child = h.describe(child_wid)
    assert (child["run_id"], child["status"]) == (child_run, status)
    if event_type is None:
        # Abandoned: the child lives on and completes on its own; the closed parent is not woken.
        h.completed(h.lease("cw"), COMPLETE)
        assert h.describe(child_wid)["status"] == "completed"
        assert h.open_tasks(parent["run_id"]) == []
    else:
        [event] = h.events(child_wid, event_type)
        assert event["payload"]["reason"] == "parent_closed"
        h.assert_empty("cw")


def test_the_default_parent_close_policy_abandons_the_child(h: Harness) -> None:
    """An omitted policy is recorded as ``abandon`` (what the SDK's replay assumes) and the child outlives the
    parent; an omitted child ``cancellation_policy`` is recorded as ``abandon`` too, a given one verbatim."""
    child_wid, _, _ = start_child(h, COMPLETE)
    [scheduled] = h.events("parent", "ChildWorkflowScheduled")
    assert (scheduled["payload"]["parent_close_policy"], scheduled["payload"]["cancellation_policy"]) == (
        "abandon",
        "abandon",
    )
    assert h.describe(child_wid)["status"] == "pending"


def test_a_given_child_cancellation_policy_is_recorded(h: Harness) -> None:
    start_child(h, cancellation_policy="try_cancel")
    [scheduled] = h.events("parent", "ChildWorkflowScheduled")
    assert scheduled["payload"]["cancellation_policy"] == "try_cancel"


def test_a_child_that_continues_as_new_reports_once_from_its_last_run(h: Harness) -> None:
    """The parent hears from the last run of a continue-as-new chain only, with that run's result."""
    _child_wid, first_run, call_id = start_child(h)
    out = h.completed(h.lease("cw"), {"type": "continue_as_new"})
    second_run = h.run_of(*out["created_task_ids"])
    assert [e for e in h.event_types("parent") if e.startswith("ChildRun")] == ["ChildRunStarted"]
    h.assert_empty("w1")
    h.completed(h.lease("cw"), COMPLETE)
    [done] = h.events("parent", "ChildRunCompleted")
    assert (done["payload"]["child_workflow_run_id"], done["payload"]["result"]) == (second_run, RESULT)
    assert resume(h.lease("w1")) == child_context(h, call_id, second_run, "ChildRunCompleted")
    assert first_run != second_run


def test_the_parent_close_policy_follows_a_continued_child(h: Harness) -> None:
    child_wid, _, _ = start_child(h, parent_close_policy="terminate")
    h.completed(h.lease("cw"), {"type": "continue_as_new"})
    h.close("parent", "cancel")
    assert h.describe(child_wid)["status"] == "terminated"


def test_children_of_successive_parent_runs_do_not_share_a_workflow_id(h: Harness) -> None:
    """An abandoned child outlives its parent run; the parent's next run (after continue-as-new, whose step
    sequence starts again at 1) starts another child, which must not take over the first child's id."""
    h.register("cw", queue="cq")
    h.start("parent")
    kid = {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", "parent_close_policy": "abandon"}
    first_parent_run = h.describe("parent")["run_id"]
    first = h.run_of(h.completed(h.lease(), kid, {"type": "continue_as_new"})["created_task_ids"][0])
    status, doc = h.complete(h.lease(), kid)
    assert status == 200, doc
    second = h.run_of(doc["created_task_ids"][0])
    [first_id] = [
        e["payload"]["child_workflow_id"] for e in h.events("parent", "ChildWorkflowScheduled", first_parent_run)
    ]
    [second_id] = [e["payload"]["child_workflow_id"] for e in h.events("parent", "ChildWorkflowScheduled")]
    assert first_id != second_id
    described = h.describe(first_id)
    assert (described["run_id"], described["is_current_run"], described["status"]) == (first, True, "pending")
    assert h.describe(second_id)["run_id"] == second


def test_a_child_never_takes_over_its_parents_workflow_id(h: Harness) -> None:
    """§0: unknown request fields are ignored; a ``workflow_id`` on start_child_workflow (not a field of the
    command, §8.7.1) must not make the child a run of another workflow — here, of the parent itself."""
    h.register("cw", queue="cq")
    parent_run = h.start("parent")
    h.completed(
        h.lease(), {"type": "start_child_workflow", "workflow_type": "kid", "queue": "cq", "workflow_id": "parent"}
    )
    parent = h.describe("parent")
    assert (parent["run_id"], parent["workflow_type"], parent["is_current_run"]) == (parent_run, "wf", True)
    assert h.control("GET", "/workflows/parent/runs")[1]["runs"][0]["run_id"] == parent_run


def fail_child_run(h: Harness, **failure: Any) -> None:
    task = h.lease("cw")
    h.completed(task, {"type": "fail_workflow", "message": "flaky", **failure})


def test_a_failed_child_is_retried_after_its_backoff_up_to_max_attempts(make: HarnessFactory) -> None:
    h = make(scheduler_max_sleep_seconds=1e6)
    child_wid, first_run, call_id = start_child(h, retry_policy={"max_attempts": 3, "backoff_seconds": [5, 9]})
    runs = [first_run]
    for backoff in (5, 9):
        fail_child_run(h)
        assert h.events("parent", "ChildRunFailed") == []  # §14.2: no resume for an intermediate failure
        assert h.open_tasks(h.describe("parent")["run_id"]) == []
        assert h.maintain() == pytest.approx(backoff)
        h.elapse(backoff - 0.000001)
        assert len(h.control("GET", f"/workflows/{child_wid}/runs")[1]["runs"]) == len(runs)
        h.elapse(0.000001)
        current = h.describe(child_wid)
        assert current["run_id"] not in runs
        runs.append(current["run_id"])
    retries = h.events("parent", "ChildWorkflowRetryScheduled")
    assert [(r["payload"]["retry_after_attempt"], r["payload"]["retry_backoff_seconds"]) for r in retries] == [
        (1, 5),
        (2, 9),
    ]
    assert len(h.events("parent", "ChildRunStarted")) == 3
    fail_child_run(h)  # the third failure is final: max_attempts 3
    h.maintain()
    [final] = h.events("parent", "ChildRunFailed")
    assert final["payload"]["child_workflow_run_id"] == runs[-1]
    _status, listing = h.control("GET", f"/workflows/{child_wid}/runs")
    assert [(r["run_id"], r["is_current_run"]) for r in listing["runs"]] == [
        (runs[0], False),
        (runs[1], False),
        (runs[2], True),
    ]
    assert resume(h.lease("w1")) == child_context(h, call_id, runs[-1], "ChildRunFailed")


def test_a_retried_child_that_succeeds_completes_the_call(h: Harness) -> None:
    child_wid, _, _ = start_child(h, retry_policy={"max_attempts": 2})
    fail_child_run(h)
    h.maintain()  # no backoff: due at once
    second = h.describe(child_wid)["run_id"]
    h.completed(h.lease("cw"), COMPLETE)
    [done] = h.events("parent", "ChildRunCompleted")
    assert done["payload"]["child_workflow_run_id"] == second


@pytest.mark.parametrize(
    ("policy", "failure"),
    [
        ({"max_attempts": 5}, {"non_retryable": True}),
        ({"max_attempts": 5, "non_retryable_error_types": ["Fatal"]}, {"exception_type": "Fatal"}),
        ({"max_attempts": 5, "non_retryable_error_types": ["FatalClass"]}, {"exception_class": "FatalClass"}),
    ],
    ids=["flag", "type", "class"],
)
def test_a_non_retryable_child_failure_is_final(h: Harness, policy: dict[str, Any], failure: dict[str, Any]) -> None:
    child_wid, first_run, _ = start_child(h, retry_policy=policy)
    fail_child_run(h, **failure)
    h.maintain()
    assert h.events("parent", "ChildWorkflowRetryScheduled") == []
    [final] = h.events("parent", "ChildRunFailed")
    assert final["payload"]["child_workflow_run_id"] == first_run
    assert len(h.control("GET", f"/workflows/{child_wid}/runs")[1]["runs"]) == 1


def test_no_child_retry_policy_means_one_attempt(h: Harness) -> None:
    start_child(h)
    fail_child_run(h)
    h.maintain()
    assert len(h.events("parent", "ChildRunFailed")) == 1


# -- continue-as-new ----------------------------------------------------------------------------------------


def test_continue_as_new_starts_the_next_run(h: Harness) -> None:
    old = h.start("wf-1", input=["a"])
    out = h.completed(h.lease(), {"type": "continue_as_new", "arguments": ARGS})
    new = h.run_of(*out["created_task_ids"])
    assert new != old
    [continued] = h.events("wf-1", "WorkflowContinuedAsNew", old)
    assert continued["payload"]["arguments"] == ARGS["blob"]
    old_run = h.describe("wf-1", old)
    assert (old_run["status"], old_run["closed_reason"], old_run["is_current_run"]) == ("completed", "continued", False)
    current = h.describe("wf-1")
    assert (current["run_id"], current["run_number"], current["workflow_id"], current["is_current_run"]) == (
        new,
        2,
        "wf-1",
        True,
    )
    assert (current["status"], current["workflow_type"], current["run_count"]) == ("pending", "wf", 2)
    task = h.lease()
    assert (task["run_id"], task["workflow_id"], task["arguments"]) == (new, "wf-1", ARGS)
    assert resume(task) == {}
    assert [e["event_type"] for e in task["history_events"]] == ["StartAccepted", "WorkflowStarted"]
    assert task["history_events"][1]["payload"]["continued_from_run_id"] == old


def test_continue_as_new_may_change_type_and_queue(h: Harness) -> None:
    h.start("wf-1")
    h.completed(h.lease(), {"type": "continue_as_new", "workflow_type": "wf2", "queue": "q2"})
    current = h.describe("wf-1")
    assert (current["workflow_type"], current["task_queue"], current["run_number"]) == ("wf2", "q2", 2)
    h.assert_empty()
    h.register("w2", queue="q2")
    assert h.lease("w2")["workflow_type"] == "wf2"


# -- side effects, version markers and search attributes ----------------------------------------------------


def test_step_sequences_continue_across_tasks(h: Harness) -> None:
    h.start("wf-1")
    h.completed(
        h.lease(),
        {"type": "record_side_effect", "result": encode_blob("r1")},
        {"type": "record_version_marker", "change_id": "v", "version": 1, "min_supported": 1, "max_supported": 1},
    )
    h.signal("wf-1")
    h.completed(
        h.lease(),
        {"type": "record_version_marker", "change_id": "w", "version": -1, "min_supported": -1, "max_supported": 4},
        {"type": "record_side_effect", "result": {"codec": "avro", "blob": encode_blob("r2")}},
    )
    stamped = [
        (e["event_type"], e["payload"]["sequence"])
        for e in h.history("wf-1")
        if e["event_type"] in ("SideEffectRecorded", "VersionMarkerRecorded")
    ]
    assert stamped == [
        ("SideEffectRecorded", 1),
        ("VersionMarkerRecorded", 2),
        ("VersionMarkerRecorded", 3),
        ("SideEffectRecorded", 4),
    ]
    results = [decode_blob(e["payload"]["result"]) for e in h.events("wf-1", "SideEffectRecorded")]
    assert results == ["r1", "r2"]


def test_upsert_search_attributes_merges_and_null_deletes(h: Harness) -> None:
    h.start("wf-1", search_attributes={"Seed": 1})
    h.completed(
        h.lease(), {"type": "upsert_search_attributes", "attributes": {"Region": "eu", "Tier": 2, "Tags": ["x"]}}
    )
    assert h.describe("wf-1")["search_attributes"] == {"Seed": 1, "Region": "eu", "Tier": 2, "Tags": ["x"]}
    h.signal("wf-1")
    h.completed(
        h.lease(), {"type": "upsert_search_attributes", "attributes": {"Region": None, "Tier": 3, "Gone": None}}
    )
    assert h.describe("wf-1")["search_attributes"] == {"Seed": 1, "Tier": 3, "Tags": ["x"]}
    upserts = [e["payload"]["attributes"] for e in h.events("wf-1", "SearchAttributesUpserted")]
    assert upserts[-1] == {"Region": None, "Tier": 3, "Gone": None}


# -- at most one open workflow task per run (Python SDK 2.12.0, Replay) ----------------------------------------------


def test_a_ready_task_absorbs_new_events(h: Harness) -> None:
    run_id = h.start("wf-1")
    h.signal("wf-1", "a")
    h.signal("wf-1", "b")
    assert len(h.open_tasks(run_id)) == 1
    task = h.lease()
    assert resume(task) == {}  # still the first task after start
    assert [e["event_type"] for e in task["history_events"]][-2:] == ["SignalReceived", "SignalReceived"]
    h.completed(task, WAIT)
    assert h.open_tasks(run_id) == []


def test_events_during_a_lease_make_exactly_one_follow_up_task(h: Harness) -> None:
    run_id = h.start("wf-1")
    task = h.lease()
    first = h.signal("wf-1", "a")
    h.signal("wf-1", "b")
    assert [t["task_id"] for t in h.open_tasks(run_id)] == [task["task_id"]]
    h.assert_empty("w2")  # nothing else to lease while the task is out
    out = h.completed(task, WAIT)
    [follow_up] = list(h.open_tasks(run_id))
    assert out["created_task_ids"][-1] == follow_up["task_id"]
    assert out["run_status"] == "running"
    nxt = h.lease()
    assert nxt["task_id"] == follow_up["task_id"]
    assert_no_private_keys(nxt)
    assert (nxt["workflow_signal_id"], nxt["signal_name"]) == (first["signal_id"], "a")
    h.completed(nxt, WAIT)
    assert h.open_tasks(run_id) == []  # the follow-up saw everything: no third task
    assert h.describe("wf-1")["status"] == "waiting"


def test_a_redelivery_forgets_the_wake_its_history_shows(h: Harness) -> None:
    """§8.3: a signal during a lease is kept for the follow-up task; when that lease expires instead, the
    redelivery's history shows the signal, so the next follow-up names what arrived after it, not the signal."""
    run_id = h.start("wf-1")
    task = h.lease()
    h.signal("wf-1", "a")
    h.clock.advance(61)  # the 60 s lease expired
    again = h.lease()
    assert (again["task_id"], again["workflow_task_attempt"]) == (task["task_id"], 2)
    assert [e["event_type"] for e in again["history_events"]][-1] == "SignalReceived"
    second = h.signal("wf-1", "b")  # during the redelivery's lease
    h.completed(again, WAIT)
    [follow_up] = h.open_tasks(run_id)
    nxt = h.lease()
    assert nxt["task_id"] == follow_up["task_id"]
    assert (nxt["workflow_signal_id"], nxt["signal_name"]) == (second["signal_id"], "b")


@pytest.mark.parametrize("first", ["activity", "signal"])
def test_the_follow_up_task_names_the_first_event_of_the_lease(h: Harness, first: str) -> None:
    """§8.3: the resume context names what woke the task. A task leased for signal ``s0`` that sees an activity
    result and then a signal ``s2`` arrive (or the other way round) is followed by one task whose context names
    the first of them — never ``s0`` again, which the completed task already handled."""
    waiting_run(h, "wf-1", {"type": "schedule_activity", "activity_type": "charge", "arguments": ARGS})
    activity = h.activity_lease()
    h.signal("wf-1", "s0")
    task = h.lease()
    assert task["signal_name"] == "s0"

    def land_activity() -> None:
        h.activity_report("complete", activity, result=RESULT)

    def land_signal() -> dict[str, Any]:
        return h.signal("wf-1", "s2")

    if first == "activity":
        land_activity()
        land_signal()
    else:
        sent = land_signal()
        land_activity()
    h.completed(task, WAIT)
    nxt = h.lease()
    assert_no_private_keys(nxt)
    if first == "activity":
        assert resume(nxt) == activity_context(h, activity, "ActivityCompleted")
    else:
        [s2] = [e for e in h.events("wf-1", "SignalReceived") if e["payload"]["signal_name"] == "s2"]
        assert resume(nxt) == {
            "workflow_wait_kind": "signal",
            "open_wait_id": f"signal-application:{sent['signal_id']}",
            "resume_source_kind": "workflow_signal",
            "resume_source_id": sent["signal_id"],
            "workflow_signal_id": sent["signal_id"],
            "signal_name": "s2",
            "workflow_sequence": s2["sequence"],
            "workflow_event_type": "SignalReceived",
        }


def test_a_redelivered_task_forgets_what_arrived_during_the_expired_lease(h: Harness) -> None:
    """Events seen by the redelivery are in its history; only what arrives after it names the follow-up."""
    waiting_run(h)
    h.signal("wf-1", "s0")
    stale = h.lease()
    h.signal("wf-1", "during-first-lease")
    h.clock.advance(60)
    task = h.lease("w2")
    assert (task["task_id"], task["workflow_task_attempt"]) == (stale["task_id"], 2)
    assert "during-first-lease" in [e["payload"].get("signal_name") for e in task["history_events"]]
    late = h.signal("wf-1", "during-second-lease")
    h.completed(task, WAIT)
    nxt = h.lease("w2")
    assert (nxt["signal_name"], nxt["workflow_signal_id"]) == ("during-second-lease", late["signal_id"])


def test_no_follow_up_without_new_events(h: Harness) -> None:
    waiting_run(h)
    h.signal("wf-1", "s0")
    task = h.lease()
    h.clock.advance(59)
    h.completed(task, WAIT)
    h.assert_empty()


def test_a_failed_task_with_new_events_is_followed_by_a_task_for_its_own_wake(h: Harness) -> None:
    """§8.8: the run stays open; a task failure handled nothing, so the follow-up still names the signal that
    woke the failed task (the first event it did not process)."""
    waiting_run(h)
    woke = h.signal("wf-1", "s0")
    task = h.lease()
    h.signal("wf-1", "s1")
    status, doc = h.fail(task)
    assert status == 200, doc
    assert doc["next_task_id"] is not None
    nxt = h.lease()
    assert nxt["task_id"] == doc["next_task_id"]
    assert_no_private_keys(nxt)
    assert (nxt["signal_name"], nxt["workflow_signal_id"]) == ("s0", woke["signal_id"])
    assert set(RESUME_KEYS) <= set(nxt)


def test_the_at_most_one_rule_holds_across_many_wakes(make: HarnessFactory) -> None:
    h = make(lease_seconds=60)
    run_id = h.start("wf-1")
    task = h.lease()
    h.completed(
        task, {"type": "start_timer", "delay_seconds": 1}, {"type": "schedule_activity", "activity_type": "charge"}
    )
    activity = h.activity_lease()
    h.signal("wf-1", "a")
    task = h.lease()
    h.clock.advance(1)
    h.maintain()  # the timer fires during the lease
    h.activity_report("complete", activity, result=RESULT)
    h.update_accepted("wf-1")
    assert len(h.open_tasks(run_id)) == 1
    h.completed(task, WAIT)
    assert len(h.open_tasks(run_id)) == 1
    nxt = h.lease()
    assert nxt["workflow_event_type"] == "TimerFired"  # the first of the three wakes
