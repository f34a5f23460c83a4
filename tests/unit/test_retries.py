"""The "maybe applied" rules of suite.protocol.retries: what a second delivery of a request may answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from suite.protocol.fencing import parse_rfc3339, rfc3339
from suite.protocol.retries import Repeat, changes_state, classify, judge_poll_retry, judge_repeat, leased

W = "/api/worker"


@pytest.mark.parametrize(
    ("method", "path", "name", "repeat"),
    [
        ("POST", f"{W}/register", "register_worker", Repeat.IDEMPOTENT),
        ("POST", f"{W}/workflow-tasks/poll", "poll", Repeat.POLL),
        ("POST", f"{W}/activity-tasks/poll", "poll", Repeat.POLL),
        ("POST", f"{W}/query-tasks/poll/", "poll", Repeat.POLL),
        ("POST", f"{W}/workflow-tasks/T1/heartbeat", "workflow_task_read", Repeat.IDEMPOTENT),
        ("POST", f"{W}/workflow-tasks/T1/history", "workflow_task_read", Repeat.IDEMPOTENT),
        ("POST", f"{W}/workflow-tasks/T1/complete", "complete_workflow_task", Repeat.FENCED),
        ("POST", f"{W}/workflow-tasks/T1/fail", "fail_workflow_task", Repeat.FENCED),
        ("POST", f"{W}/activity-tasks/A1/complete", "report_activity", Repeat.FENCED),
        ("POST", f"{W}/activity-tasks/A1/heartbeat", "activity_heartbeat", Repeat.IDEMPOTENT),
        ("POST", f"{W}/query-tasks/Q1/fail", "report_query", Repeat.FENCED),
        ("GET", "/api/workflows/wf-1/runs/r1/history?page_size=5", "read", Repeat.IDEMPOTENT),
        ("POST", "/api/workflows", "start_workflow", Repeat.DEDUPED),
        ("POST", "/api/workflows/wf-1/cancel", "close_run", Repeat.DEDUPED),
        ("POST", "/api/workflows/wf-1/runs/r1/terminate", "close_run", Repeat.DEDUPED),
        ("POST", "/api/workflows/wf-1/signal/go", "other", Repeat.UNSAFE),
        ("POST", "/api/workflows/wf-1/query/status", "query_or_update", Repeat.UNSAFE),
        ("POST", "/api/workflows/wf-1/runs/r1/update/set", "query_or_update", Repeat.UNSAFE),
        ("POST", "/api/task-queues/q/build-ids/drain", "drain", Repeat.IDEMPOTENT),
        ("PUT", "/api/anything", "other", Repeat.UNSAFE),
    ],
)
def test_classify(method: str, path: str, name: str, repeat: Repeat) -> None:
    op = classify(method, path)
    assert (op.name, op.repeat) == (name, repeat)


def test_a_poll_is_resendable_only_with_a_poll_request_id() -> None:
    poll = classify("POST", f"{W}/workflow-tasks/poll")
    assert poll.resendable({"worker_id": "w", "task_queue": "q", "poll_request_id": "p1"})
    assert not poll.resendable({"worker_id": "w", "task_queue": "q"})
    assert not poll.resendable(None)
    assert classify("GET", "/api/cluster/info").resendable(None)
    assert not classify("POST", f"{W}/workflow-tasks/T1/complete").resendable({"commands": []})


def test_a_refusal_changed_nothing_unless_the_4xx_reports_an_outcome() -> None:
    complete = classify("POST", f"{W}/workflow-tasks/T1/complete")
    assert complete.refused(409)
    assert complete.refused(422)
    assert not complete.refused(200)
    assert not complete.refused(503)
    assert not complete.refused(None)
    # 409 query_rejected is the worker's answer; 422 update_failed an update that ran and failed.
    assert not classify("POST", "/api/workflows/wf/query/q").refused(409)
    assert not classify("POST", "/api/workflows/wf/update/u").refused(422)


def _judge(method: str, path: str, first: tuple[int, Any], second: tuple[int, Any]) -> str | None:
    violation = judge_repeat(classify(method, path), first[0], first[1], second[0], second[1])
    return None if violation is None else violation.requirement


def test_judge_repeat_follows_each_operation_rule() -> None:
    complete = ("POST", f"{W}/workflow-tasks/T1/complete")
    assert _judge(*complete, (200, {}), (409, {"reason": "task_not_leased"})) is None
    assert _judge(*complete, (200, {}), (200, {})) == "FENCE-AFTER-COMPLETE"
    assert _judge(*complete, (409, {}), (200, {})) is None  # the first changed nothing: no rule to apply
    fail = ("POST", f"{W}/workflow-tasks/T1/fail")
    assert _judge(*fail, (200, {}), (200, {})) == "FENCE-TASK-FAILED-NOT-LEASED"
    activity = ("POST", f"{W}/activity-tasks/A1/complete")
    stale = {"reason": "stale_attempt", "recorded": False, "outcome": "completed"}
    assert _judge(*activity, (200, {"recorded": True}), (409, stale)) is None
    assert _judge(*activity, (200, {"recorded": True}), (409, {**stale, "recorded": True})) == (
        "ACTIVITY-DUPLICATE-COMPLETE-STALE"
    )
    assert _judge(*activity, (200, {"recorded": True}), (200, {"recorded": False})) == (
        "ACTIVITY-DUPLICATE-COMPLETE-STALE"
    )
    register = ("POST", f"{W}/register")
    assert _judge(*register, (201, {}), (201, {})) is None
    assert _judge(*register, (201, {}), (409, {})) == "REGISTER-IDEMPOTENT"
    start = ("POST", "/api/workflows")
    assert _judge(*start, (201, {"run_id": "r1"}), (409, {"reason": "rejected_duplicate"})) is None
    assert _judge(*start, (201, {"run_id": "r1"}), (200, {"run_id": "r1"})) is None
    assert _judge(*start, (201, {"run_id": "r1"}), (201, {"run_id": "r2"})) == "CONTROL-START"
    query = ("POST", f"{W}/query-tasks/Q1/complete")
    assert _judge(*query, (200, {}), (200, {})) == "QUERY-LATE-COMPLETE-NOT-LEASED"
    assert _judge("POST", "/api/workflows/wf/signal/s", (202, {}), (202, {})) is None  # no rule: a second signal
    assert _judge(*complete, (200, {}), (None, None)) is None  # type: ignore[arg-type]


def test_changes_state_when_a_second_delivery_succeeded_where_the_rule_does_not_make_it_harmless() -> None:
    signal = classify("POST", "/api/workflows/wf/signal/s")
    complete = classify("POST", f"{W}/workflow-tasks/T1/complete")
    assert changes_state(signal, 202, 202)
    assert not changes_state(signal, 202, 409)
    assert not changes_state(complete, 200, 409)
    assert changes_state(complete, 409, 200)
    assert not changes_state(classify("POST", f"{W}/register"), 201, 201)
    assert not changes_state(classify("GET", "/api/workflows/wf"), 200, 200)


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _poll(task_id: str | None, attempt: int = 1, expires: datetime | None = None) -> dict[str, Any]:
    if task_id is None:
        return {"task": None, "poll_status": "empty"}
    return {
        "task": {
            "task_id": task_id,
            "workflow_task_attempt": attempt,
            "lease_expires_at": rfc3339(expires or NOW + timedelta(seconds=3)),
        },
        "poll_status": "leased",
    }


def test_leased_names_task_and_attempt_of_each_poll_kind() -> None:
    assert leased(_poll("T1", 2)) == ("T1", "2")
    assert leased(_poll(None)) is None
    assert leased({"task": {"task_id": "A1", "activity_attempt_id": "att-9"}}) == ("A1", "att-9")
    assert leased({"task": {"query_task_id": "Q1", "query_task_attempt": 1}}) == ("Q1", "1")
    assert leased("not json") is None


def test_a_retried_poll_must_get_the_live_lease_back() -> None:
    def judge(first: dict[str, Any], retry: dict[str, Any], at: datetime, status: int = 200) -> str | None:
        violation = judge_poll_retry(200, first, status, retry, at, parse_rfc3339)
        return None if violation is None else violation.received

    assert judge(_poll("T1"), _poll("T1"), NOW) is None
    assert judge(_poll("T1"), _poll(None), NOW) == "200 with no task"
    assert judge(_poll("T1"), _poll("T2"), NOW) == "200 with task T2 attempt 1"
    assert judge(_poll("T1"), _poll("T1", attempt=2), NOW) == "200 with task T1 attempt 2"
    assert judge(_poll("T1"), {"reason": "worker_draining"}, NOW, status=409) == "409 with no task"
    # Within a second of the expiry (the Date header has one-second resolution) the lease may be gone.
    assert judge(_poll("T1"), _poll(None), NOW + timedelta(seconds=2)) is None
    assert judge(_poll(None), _poll("T2"), NOW) is None  # the first leased nothing: the retry is a new poll
    assert judge_poll_retry(503, _poll("T1"), 200, _poll(None), NOW, parse_rfc3339) is None
    assert judge_poll_retry(200, _poll("T1"), 200, _poll(None), None, parse_rfc3339) is None
