"""The activity machine's pure model and judges (suite.machines.activity_oracle): leases, reports and histories
judged without a server, each judgement shown failing on the answer of a server that breaks its rule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from suite.machines import activity_oracle as oracle
from suite.machines.activity_oracle import ActivityRun, ActivityWorld, Attempt, Execution
from suite.protocol.commands import RetryPolicy
from suite.protocol.errors import IllegalTransition, Violation
from suite.protocol.lifecycles import AttemptStatus, ExecutionEvent, ExecutionStatus, RunEvent, TaskStatus

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MARGIN = 1.0


def rfc(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def world_of(max_attempts: int = 3, backoff: int = 0) -> tuple[ActivityWorld, Execution]:
    world = ActivityWorld()
    run = ActivityRun(workflow_id="wf", run_id="run-1", queue="q", worker="ww")
    policy = {"max_attempts": max_attempts, "backoff_seconds": [backoff]}
    run.execs.append(
        Execution(
            activity_type="act.1",
            run=run,
            policy_json=policy,
            policy=RetryPolicy(max_attempts=max_attempts, backoff_seconds=(backoff,)),
            start_to_close=None,
        )
    )
    world.add(run)
    return world, run.execs[0]


def lease(task_id: str, attempt_id: str, number: int, *, owner: str = "w1", at: datetime = T0) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "activity_attempt_id": attempt_id,
        "activity_execution_id": "exec-1",
        "activity_type": "act.1",
        "attempt_number": number,
        "lease_owner": owner,
        "lease_expires_at": rfc(at + timedelta(seconds=3)),
    }


def judged(
    world: ActivityWorld, task: dict[str, Any], worker: str = "w1", at: datetime = T0
) -> tuple[Attempt, list[str]]:
    return oracle.judge_lease(world, task, worker, at, MARGIN)


def violated(call: Callable[..., object], *args: Any, **kwargs: Any) -> str:
    """The requirement of the :class:`Violation` that ``call(*args, **kwargs)`` raises."""
    with pytest.raises(Violation) as bad:
        call(*args, **kwargs)
    return bad.value.requirement


def report(a: Attempt, verb: str, at: datetime, *, owner: str | None = None) -> list[oracle.Branch]:
    return oracle.branches(
        a, verb, task_id=a.task_id, attempt_id=a.attempt_id, owner=owner or a.owner, at=at, margin=MARGIN
    )


def fail_retryably(a: Attempt, at: datetime) -> None:
    matched = [b for b in report(a, "fail", at) if b.out == "ok"]
    oracle.follow(matched, "fail", "ok", {}, a, label="retry", sent=at, details={"message": "x"})


# -- leases ----------------------------------------------------------------------------------------------


def test_first_lease_is_attempt_one_and_runs_the_execution() -> None:
    world, e = world_of()
    a, states = judged(world, lease("t1", "a1", 1))
    assert states == ["activity_leased"]
    assert (a.number, a.status, e.status, e.task_status["t1"]) == (
        1,
        AttemptStatus.RUNNING,
        ExecutionStatus.RUNNING,
        TaskStatus.LEASED,
    )
    world2, _ = world_of()
    assert violated(judged, world2, lease("t1", "a1", 2)) == "RETRY-ATTEMPTS-CONTIGUOUS"


def test_a_retry_continues_the_numbering_on_a_new_task() -> None:
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    fail_retryably(a, T0 + timedelta(seconds=1))
    assert (a.status, a.end, e.status) == (AttemptStatus.FAILED, "retry", ExecutionStatus.PENDING)
    assert e.task_status["t1"] is TaskStatus.COMPLETED  # §9.1: a retry completes the old task
    retry, states = judged(world, lease("t2", "a2", 2, owner="w2"), "w2", T0 + timedelta(seconds=2))
    assert "retry_leased" in states
    assert retry.number == 2
    # A server that restarts the numbering on the retry breaks RETRY-ATTEMPTS-CONTIGUOUS.
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    fail_retryably(a, T0 + timedelta(seconds=1))
    assert (
        violated(judged, world, lease("t2", "a2", 1, owner="w2"), "w2", T0 + timedelta(seconds=2))
        == "RETRY-ATTEMPTS-CONTIGUOUS"
    )


def test_a_retry_before_its_backoff_breaks_the_backoff_rule() -> None:
    world, _ = world_of(backoff=2)
    a, _ = judged(world, lease("t1", "a1", 1))
    fail_retryably(a, T0)
    _, states = judged(world, lease("t2", "a2", 2), at=T0 + timedelta(seconds=3))
    assert "retry_leased_after_backoff" in states
    world, _ = world_of(backoff=2)
    a, _ = judged(world, lease("t1", "a1", 1))
    fail_retryably(a, T0)
    assert violated(judged, world, lease("t2", "a2", 2), at=T0 + timedelta(seconds=1)) == "ACTIVITY-RETRY-BACKOFF"


def test_redelivery_after_expiry_is_a_new_attempt_of_the_same_task() -> None:
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    later = T0 + timedelta(seconds=5)  # past the 3 s lease
    b, states = judged(world, lease("t1", "a2", 2, owner="w2", at=later), "w2", later)
    assert "lease_expired_redelivered" in states
    assert (a.status, a.redelivered, b.number, e.task_status["t1"]) == (
        AttemptStatus.EXPIRED,
        True,
        2,
        TaskStatus.LEASED,
    )
    # The same attempt id again, or a redelivery while the lease is live, is refused.
    for task, at, req in (
        (lease("t1", "a1", 2, owner="w2", at=later), later, "ACTIVITY-REDELIVERY-NEW-ATTEMPT"),
        (lease("t1", "a2", 2, owner="w2"), T0 + timedelta(seconds=1), "DISPATCH-ONE-LEASE-PER-DELIVERY"),
    ):
        world, _ = world_of()
        judged(world, lease("t1", "a1", 1))
        assert violated(judged, world, task, "w2", at) == req


def test_a_lease_of_a_finished_execution_names_why_it_finished() -> None:
    world, e = world_of(max_attempts=1)
    a, _ = judged(world, lease("t1", "a1", 1))
    matched = [b for b in report(a, "fail", T0) if b.out == "ok"]
    oracle.follow(matched, "fail", "ok", {}, a, label="exhausted", sent=T0, details=None)
    assert (e.final, e.status, e.run.resumed) == ("exhausted", ExecutionStatus.FAILED, True)
    assert (
        violated(judged, world, lease("t2", "a2", 2), at=T0 + timedelta(seconds=1)) == "RETRY-FAILED-ATTEMPTS-BOUNDED"
    )


# -- reports ---------------------------------------------------------------------------------------------


def test_heartbeat_branches_follow_the_guards() -> None:
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    assert {b.out for b in report(a, "heartbeat", T0 + timedelta(seconds=1))} == {"ok"}
    assert {b.out for b in report(a, "heartbeat", T0, owner="intruder")} == {"lease_owner_mismatch"}
    # Near the lease expiry both sides of the margin are allowed.
    assert {b.out for b in report(a, "complete", T0 + timedelta(seconds=3))} == {"ok", "stale_attempt"}
    e.run.step(RunEvent.CANCEL)
    assert {b.out for b in report(a, "heartbeat", T0 + timedelta(seconds=1))} == {"stop:run_cancelled"}
    assert oracle.requirement_for({"stop:run_cancelled"}, "ok", "heartbeat", a, T0) == "CANCEL-ACTIVITY-HEARTBEAT"


def test_the_body_of_an_allowed_answer_is_judged() -> None:
    world, _ = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    matched = report(a, "complete", T0)
    oracle.check_body(200, {"recorded": True, "outcome": "completed"}, "complete", "ok", matched, a, T0)
    assert (
        violated(oracle.check_body, 200, {"recorded": False, "outcome": "completed"}, "complete", "ok", matched, a, T0)
        == "ACTIVITY-COMPLETE-RECORDED"
    )
    beat = report(a, "heartbeat", T0)
    with pytest.raises(Violation) as bad:
        oracle.check_body(
            200,
            {"can_continue": True, "cancel_requested": False, "lease_expires_at": rfc(T0)},
            "heartbeat",
            "ok",
            beat,
            a,
            T0,
        )
    assert bad.value.requirement == "ACTIVITY-HEARTBEAT-RENEWS"


def test_a_start_to_close_timeout_retries_or_ends_the_execution() -> None:
    world, e = world_of(max_attempts=2)
    a, _ = judged(world, {**lease("t1", "a1", 1), "deadlines": {"start_to_close": rfc(T0 + timedelta(seconds=2))}})
    oracle.apply_timeout(a)
    assert (a.status, a.end, e.status, e.task_status["t1"]) == (
        AttemptStatus.EXPIRED,
        "timeout_retry",
        ExecutionStatus.PENDING,
        TaskStatus.FAILED,
    )
    second, _ = judged(world, {**lease("t2", "a2", 2), "deadlines": {"start_to_close": rfc(T0 + timedelta(seconds=9))}})
    oracle.apply_timeout(second)
    assert (second.end, e.status, e.final) == ("timeout_final", ExecutionStatus.TIMED_OUT, "timeout")


def test_shadows_step_through_the_tables() -> None:
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    matched = [b for b in report(a, "complete", T0) if b.out == "ok"]
    oracle.follow(matched, "complete", "ok", {}, a, label="", sent=T0, details=None)
    assert (a.status, e.status) == (AttemptStatus.COMPLETED, ExecutionStatus.COMPLETED)
    # A certain shadow never takes a step its table lacks: completing twice is the model's own bug.
    with pytest.raises(IllegalTransition):
        oracle.follow(matched, "complete", "ok", {}, a, label="", sent=T0, details=None)
    # An uncertain one (an answer was lost) takes the target's word: the one state that event leads to.
    e.uncertain = True
    e.step(ExecutionEvent.CLAIM)
    assert e.status is ExecutionStatus.RUNNING


# -- history ---------------------------------------------------------------------------------------------


def event(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {"sequence": seq, "event_type": kind, "payload": {"activity_execution_id": "exec-1", **payload}}


def test_history_holds_exactly_what_the_recorded_reports_left() -> None:
    world, e = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    matched = [b for b in report(a, "complete", T0) if b.out == "ok"]
    oracle.follow(matched, "complete", "ok", {}, a, label="", sent=T0, details=None)
    good = [event(1, "ActivityScheduled"), event(2, "ActivityCompleted", activity_attempt_id="a1")]
    states = oracle.check_run_history(e.run, good, T0, MARGIN)
    assert "final_outcome_in_history" in states
    assert "attempt_history_checked" in states
    cases = {
        "ACTIVITY-COMPLETE-RECORDED": good[:1],
        "HISTORY-ONE-TERMINAL-PER-ATTEMPT": [*good, event(3, "ActivityCompleted", activity_attempt_id="a1")],
        "RETRY-ONE-OUTCOME-PER-EXECUTION": [*good, event(3, "ActivityFailed", activity_attempt_id="a9")],
    }
    for requirement, events in cases.items():
        assert violated(oracle.check_run_history, e.run, events, T0, MARGIN) == requirement, events


def test_history_retries_are_bounded_by_max_attempts() -> None:
    world, e = world_of(max_attempts=2)
    judged(world, lease("t1", "a1", 1))
    retries = [event(i, "ActivityRetryScheduled", retry_after_attempt=i) for i in (1, 2)]
    assert violated(oracle.check_run_history, e.run, retries, T0, MARGIN) == "RETRY-FAILED-ATTEMPTS-BOUNDED"


def test_marks_name_the_states_reached() -> None:
    world, _ = world_of()
    a, _ = judged(world, lease("t1", "a1", 1))
    assert oracle.mark("heartbeat", "stop:run_cancelled", a, AttemptStatus.RUNNING, T0) == [
        "heartbeat_stopped",
        "cancel_heartbeat",
    ]
    assert oracle.mark("complete", "lease_owner_mismatch", a, AttemptStatus.RUNNING, T0) == ["fenced_owner"]
    assert a.fenced == ["ACTIVITY-FENCE-OWNER"]
