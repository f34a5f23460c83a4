"""The machines' shadows (suite.machines.world) and the query, signal and update machine's pure judges
(suite.machines.messages): each judgement shown failing on what a server that breaks its rule would answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from suite.machines.messages import MessageRun, MessageTask, Slot, batch, judge_messages, judge_read_only, judge_slot
from suite.machines.world import RunShadow, TaskShadow, advance
from suite.protocol.errors import IllegalTransition, Violation
from suite.protocol.lifecycles import RUN, RunEvent, RunStatus, TaskEvent, TaskStatus

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_run_shadow_steps_through_the_run_table() -> None:
    run = RunShadow(workflow_id="wf", run_id="r")
    run.step(RunEvent.BATCH_OPEN_WAITS)
    assert (run.status, run.open) == (RunStatus.WAITING, True)
    run.step(RunEvent.WAKE)
    run.step(RunEvent.CANCEL)
    assert (run.status, run.closed_reason, run.open) == (RunStatus.CANCELLED, "cancelled", False)
    with pytest.raises(IllegalTransition):
        run.step(RunEvent.TERMINATE)  # a closed run closes once
    run.uncertain = True  # … unless a lost answer left the shadow guessing: the target's word wins
    run.step(RunEvent.TERMINATE)
    assert run.status is RunStatus.TERMINATED


def test_advance_takes_the_one_target_only_when_unsure_and_unambiguous() -> None:
    assert advance(RUN, RunStatus.COMPLETED, RunEvent.CANCEL, True) is RunStatus.CANCELLED
    with pytest.raises(IllegalTransition):
        advance(RUN, RunStatus.COMPLETED, RunEvent.CANCEL)
    with pytest.raises(IllegalTransition):  # WAKE leads to pending or running: no single target to take
        advance(RUN, RunStatus.COMPLETED, RunEvent.WAKE, True)


def test_task_shadow_redelivery_is_expiry_then_claim() -> None:
    task = TaskShadow(task_id="t", owner="w1", attempt=1, expires=T0)
    assert task.status is TaskStatus.LEASED
    task.claim("w2", 2, T0 + timedelta(seconds=3))
    assert (task.status, task.owner, task.attempt) == (TaskStatus.LEASED, "w2", 2)
    task.step(TaskEvent.COMPLETE)
    with pytest.raises(IllegalTransition):
        task.step(TaskEvent.FAIL)


def run_with_task(expires: datetime) -> tuple[MessageRun, MessageTask]:
    run = MessageRun(workflow_id="wf", run_id="r")
    task = MessageTask(task_id="t1", run=run, owner="w1", attempt=1, expires=expires)
    run.task, run.slot = task, Slot.LEASED
    return run, task


def test_judge_slot_one_open_task_per_run() -> None:
    run, _ = run_with_task(T0 + timedelta(seconds=3))
    judge_slot(run, "t1", 2, T0 + timedelta(seconds=5), 1.0)  # a redelivery after expiry
    # A long poll that left while the lease was live and was answered once it expired: a redelivery too (when the
    # poll left does not matter, only that the answer came no earlier than the expiry, within the margin).
    judge_slot(run, "t1", 2, T0 + timedelta(seconds=3.01), 1.0)
    for task_id, attempt, at, req in (
        ("t2", 1, T0, "LEASE-NOT-SHARED-WHILE-LIVE"),  # a second task while one is open
        ("t1", 2, T0, "LEASE-NOT-SHARED-WHILE-LIVE"),  # the live lease handed out again
        ("t1", 3, T0 + timedelta(seconds=5), "EXPIRY-REDELIVER-SAME-TASK"),  # attempt + 2
    ):
        with pytest.raises(Violation) as bad:
            judge_slot(run, task_id, attempt, at, 1.0)
        assert bad.value.requirement == req
    waiting = MessageRun(workflow_id="wf", run_id="r2", slot=Slot.NONE, queried=True)
    with pytest.raises(Violation) as bad:
        judge_slot(waiting, "t9", 1, T0, 1.0)
    assert bad.value.requirement == "QUERY-READ-ONLY"


def ev(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {"sequence": seq, "event_type": kind, "payload": payload}


def test_judge_messages_every_accepted_message_once() -> None:
    run = MessageRun(
        workflow_id="wf", run_id="r", signals={"sig-1": True, "sig-2": None}, accepted_updates={"u1": "upd"}
    )
    good = [
        ev(1, "StartAccepted"),
        ev(2, "SignalReceived", signal_name="sig-1"),
        ev(3, "UpdateAccepted", update_id="u1"),
    ]
    judge_messages(run, good)
    cases = {
        "SIGNAL-RECORDED-AND-WAKES": [good[0], good[2]],
        "UPDATE-ACCEPTED-RECORDED": [*good, ev(4, "UpdateAccepted", update_id="u1")],
        "UPDATE-CLOSED-AT-MOST-ONCE": [
            *good,
            ev(4, "UpdateCompleted", update_id="u1"),
            ev(5, "UpdateCompleted", update_id="u1"),
        ],
        "SIGNAL-CLOSED-RUN-REJECTED": [*good, ev(4, "WorkflowCompleted"), ev(5, "SignalReceived", signal_name="x")],
    }
    for requirement, events in cases.items():
        with pytest.raises(Violation) as bad:
            judge_messages(run, events)
        assert bad.value.requirement == requirement


def test_judge_read_only_and_batches() -> None:
    before = ({"status": "running"}, [(1, "StartAccepted")])
    judge_read_only("r", before, ({"status": "running"}, [(1, "StartAccepted"), (2, "RepairRequested")]))
    with pytest.raises(Violation) as bad:
        judge_read_only("r", before, ({"status": "running"}, [(1, "StartAccepted"), (2, "QueryCompleted")]))
    assert bad.value.requirement == "QUERY-READ-ONLY"
    run = MessageRun(workflow_id="wf", run_id="r", open_updates={"u1": "upd"}, closed_updates={"u0"})
    commands, closes, invalid = batch(run, "timer_and_update", "unknown")
    assert [c["type"] for c in commands] == ["start_timer", "complete_update"]
    assert closes == {"u1"}
    assert not invalid
    assert batch(run, "close_update_again", "unknown")[2] is True
