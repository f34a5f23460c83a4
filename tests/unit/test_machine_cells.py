"""The machines' cell classifiers: a shadow and, near an expiry, the answer decide the cell."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from suite.machines.cells import run_state, task_actor, task_state
from suite.machines.world import RunShadow, TaskShadow
from suite.protocol.coverage import ENTITIES, Actor
from suite.protocol.lifecycles import RunEvent, TaskEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _task() -> tuple[TaskShadow, RunShadow]:
    return TaskShadow(task_id="t", owner="w1", attempt=1, expires=T0 + timedelta(seconds=10)), RunShadow(
        workflow_id="wf", run_id="r"
    )


def test_a_live_lease_then_its_expiry_then_a_redelivery() -> None:
    task, run = _task()
    assert task_state(task, run, T0, 1.0) == "leased"
    assert task_state(task, run, T0 + timedelta(seconds=20), 1.0) == "lease_expired"
    task.claim("w2", 2, T0 + timedelta(seconds=40))
    assert task.holders == ["w1", "w2"]
    assert task_state(task, run, T0 + timedelta(seconds=30), 1.0) == "redelivered"
    assert task_actor(task, "w1") is Actor.FORMER_HOLDER
    assert task_actor(task, "w2") is Actor.HOLDER
    assert task_actor(task, "w3") is Actor.OTHER_WORKER


def test_near_the_expiry_only_the_answer_decides() -> None:
    task, run = _task()
    at = task.expires - timedelta(milliseconds=200)
    assert task_state(task, run, at, 1.0) is None
    assert task_state(task, run, at, 1.0, "lease_expired") == "lease_expired"
    assert task_state(task, run, at, 1.0, "ok") == "leased"


def test_closed_tasks_and_runs_and_guesses() -> None:
    task, run = _task()
    run.step(RunEvent.CANCEL)
    assert task_state(task, run, T0, 1.0) == "run_closed"
    task, run = _task()
    task.step(TaskEvent.COMPLETE)
    assert task_state(task, run, T0, 1.0) == "completed"
    task.uncertain = True
    assert task_state(task, run, T0, 1.0) is None


def test_run_states_name_cover_states() -> None:
    run = RunShadow(workflow_id="wf", run_id="r")
    assert run_state(run, 2) == "continued"
    assert run_state(run) == "pending"
    names = {s.name for s in next(e for e in ENTITIES if e.name == "run").states}
    for event in (RunEvent.BATCH_OPEN_WAITS, RunEvent.WAKE, RunEvent.TERMINATE):
        run.step(event)
        assert run_state(run) in names


def test_the_sweep_plans_only_cold_reachable_cells_and_ends_each_instance_with_its_one_change() -> None:
    from suite.machines.workflow_sweep import cold_plan
    from suite.protocol.coverage import cell_key

    warm = cell_key("workflow_task", "leased", "history", Actor.HOLDER)
    plan = cold_plan({warm: 1})
    assert ("history", Actor.HOLDER) not in [c for inst in plan["leased"] for c in inst]
    for instances in plan.values():
        for calls in instances[1:]:
            assert len(calls) == 1  # every further change gets an instance of its own
    # Nobody can name a task never leased: only a poll, a signal and a close reach it.
    assert {op for inst in plan["ready"] for op, _ in inst} == {"poll", "signal", "close_run"}
    assert "requeued" not in plan  # needs a deregistration, which the sweep does not make
