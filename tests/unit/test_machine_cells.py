"""The machines' cell classifiers: a shadow and, near an expiry, the answer decide the cell."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from suite.machines.cells import cancellation_state, child_state, run_state, task_actor, task_state
from suite.machines.child_sweep import cancellation_plan, child_plan
from suite.machines.world import ChildShadow, RequestShadow, RunShadow, TaskShadow
from suite.protocol.commands import PARENT_CLOSE_POLICIES
from suite.protocol.coverage import ENTITIES, Actor, cells
from suite.protocol.lifecycles import CancellationRequestEvent, ChildEvent, RunEvent, TaskEvent

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
    # Ready again after its holder left: the reports of the holder that left and of another worker, a poll by
    # each (each takes the task over: an instance of its own), a signal and the run's close.
    requeued = plan["requeued"]
    assert {(op, a) for inst in requeued for op, a in inst} == {
        *(
            (op, a)
            for op in ("history", "heartbeat", "complete", "fail", "poll")
            for a in (Actor.FORMER_HOLDER, Actor.OTHER_WORKER)
        ),
        ("signal", Actor.OPERATOR),
        ("close_run", Actor.OPERATOR),
    }
    assert all(len(inst) == 1 for inst in requeued[1:])
    # The holder deregisters in every state it holds or held the task in, each time last in its instance.
    for state in ("leased", "lease_expired", "redelivered", "completed", "failed", "run_closed"):
        assert any(inst[-1] == ("deregister", Actor.HOLDER) for inst in plan[state]), state


def test_a_task_its_holder_left_is_ready_again_and_its_holder_a_former_one() -> None:
    from suite.machines.workflow_sweep import recovered_counts

    task, run = _task()
    assert recovered_counts(task, run, T0, 1.0) == {1}  # a live lease: recovered
    assert recovered_counts(task, run, task.expires - timedelta(milliseconds=500), 1.0) == {0, 1}  # about to lapse
    assert recovered_counts(task, run, task.expires + timedelta(seconds=5), 1.0) == {0, 1}  # lapsed: maybe recovered
    task.step(TaskEvent.ABANDON)
    assert task_state(task, run, T0, 1.0) == "requeued"
    assert task_actor(task, "w1") is Actor.FORMER_HOLDER  # nobody holds a ready task
    assert task_actor(task, "w2") is Actor.OTHER_WORKER
    assert recovered_counts(task, run, T0, 1.0) == {0}
    done, _ = _task()
    done.step(TaskEvent.COMPLETE)
    assert recovered_counts(done, run, T0, 1.0) == {0}
    assert task_actor(done, "w1") is Actor.HOLDER  # the holder of a closed task is still its holder


def _attempt(number: int = 1, task_id: str = "at1", owner: str = "w1") -> Any:
    from suite.machines.activity_oracle import ActivityRun, Attempt, Execution
    from suite.protocol.commands import DEFAULT_RETRY_POLICY

    run = ActivityRun(workflow_id="wf", run_id="r", queue="q", worker="ww")
    e = Execution("act.1", run, None, DEFAULT_RETRY_POLICY, None)
    a = Attempt(e, f"att{number}", task_id, number, owner, T0 + timedelta(seconds=10), None)
    e.attempts.append(a)
    return a


def test_an_attempt_live_then_lapsed_then_redelivered_with_its_former_holder() -> None:
    from suite.machines.activity_oracle import Attempt
    from suite.machines.cells import attempt_actor, attempt_state

    a = _attempt()
    assert attempt_state(a, T0, 1.0) == "running"
    assert attempt_state(a, a.expires - timedelta(milliseconds=300), 1.0) is None  # either side of the expiry
    assert attempt_state(a, T0 + timedelta(seconds=20), 1.0) == "expired"
    b = Attempt(a.execution, "att2", a.task_id, 2, "w2", T0 + timedelta(seconds=40), None)
    a.execution.attempts.append(b)
    assert attempt_state(b, T0 + timedelta(seconds=20), 1.0) == "redelivered"
    assert attempt_actor(b, "w1", "redelivered") is Actor.FORMER_HOLDER
    assert attempt_actor(b, "w2", "redelivered") is Actor.HOLDER
    assert attempt_actor(b, "w3", "redelivered") is Actor.OTHER_WORKER
    assert attempt_actor(b, "w1", "completed") is Actor.OTHER_WORKER  # a former holder only while it runs
    b.execution.run.step(RunEvent.CANCEL)
    assert attempt_state(b, T0 + timedelta(seconds=20), 1.0) == "cancelled"


def test_the_activity_sweep_plans_every_cold_cell_once_and_a_former_holder_only_after_a_redelivery() -> None:
    from suite.machines.activity_sweep import cold_plan
    from suite.protocol.coverage import cell_key, cells

    plan = cold_plan({})
    planned = {(state, op, actor) for state, insts in plan.items() for calls in insts for op, actor in calls}
    entity = next(e for e in ENTITIES if e.name == "activity_attempt")
    reachable = {(c.state, c.operation, c.actor) for c in cells(entity) if c.ruled_out is None}
    clock = {k for k in reachable if k[2] is Actor.CLOCK}  # observed as the calls meet it, never made
    assert planned == reachable - clock
    assert all(actor is not Actor.FORMER_HOLDER for s, _, actor in planned if s != "redelivered")
    first, *further = plan["running"]
    assert first[-1] in (("fail", Actor.HOLDER), ("complete", Actor.HOLDER), ("close_run", Actor.OPERATOR))
    assert all(len(calls) == 1 for calls in further)  # each further change on an attempt of its own
    warm = cell_key("activity_attempt", "running", "heartbeat", Actor.HOLDER)
    assert ("heartbeat", Actor.HOLDER) not in [c for inst in cold_plan({warm: 1})["running"] for c in inst]


def test_a_session_held_then_reacquired_names_its_former_holder() -> None:
    from suite.machines.cells import session_actor, session_state
    from suite.machines.session_shadow import ShadowSession
    from suite.protocol.sessions import SessionStatus

    s = ShadowSession("s1")
    assert session_state(s) == "none"
    assert session_actor(s, "w1", "none") is Actor.OTHER_WORKER
    s.status, s.owner, s.holders = SessionStatus.ACTIVE, "w1", ["w1"]
    assert session_state(s) == "active"
    s.owner, s.holders = "w2", ["w1", "w2"]
    assert session_state(s) == "reacquired"
    assert session_actor(s, "w1", "reacquired") is Actor.FORMER_HOLDER
    assert session_actor(s, "w2", "reacquired") is Actor.HOLDER
    assert session_actor(s, "w3", "reacquired") is Actor.OTHER_WORKER
    s.status = SessionStatus.EXPIRED
    assert session_actor(s, "w1", "expired") is Actor.OTHER_WORKER  # the model tells no former holder apart there
    s.unsure = True
    assert session_state(s) is None


def test_the_session_sweep_plans_every_cold_explicit_and_clock_cell_and_no_impossible_one() -> None:
    from suite.machines.session_sweep import CLOCK_RECIPES, cold_plan
    from suite.protocol.coverage import cells

    entity = next(e for e in ENTITIES if e.name == "worker_session")
    ruled_out = {(c.state, c.operation, c.actor) for c in cells(entity) if c.ruled_out is not None}
    planned = {(state, op, actor) for _, state, calls in cold_plan({}) if state != "closed" for op, actor in calls}
    assert not planned & ruled_out
    assert ("reacquired", "close", Actor.FORMER_HOLDER) in planned
    assert ("reacquired", "lost", Actor.CLOCK) in ruled_out  # only a reacquirable session is reacquired
    # Every reachable clock cell has a recipe, its own or that of the state its event leads to.
    clock = {(c.state, c.operation) for c in cells(entity) if c.actor is Actor.CLOCK and c.ruled_out is None}
    recipes = set(CLOCK_RECIPES) | {cell for recipe, _, _ in cold_plan({}) for cell in recipe.clock}
    assert clock <= recipes


def test_the_session_sweep_plans_the_in_session_cells_and_makes_the_refused_claims_last_together() -> None:
    from suite.machines.session_activities import claim_refused
    from suite.machines.session_sweep import RECIPES, cold_plan, deferred
    from suite.protocol.coverage import cells

    entity = next(e for e in ENTITIES if e.name == "worker_session")
    in_session = {"claim_in_session", "activity_heartbeat_in_session", "close_run"}
    reachable = {
        (c.state, c.operation, c.actor)
        for c in cells(entity)
        if c.ruled_out is None
        and (c.operation in in_session or c.state == "active_cancelled_activity")
        and c.actor is not Actor.CLOCK
    }
    plan = cold_plan({})
    planned = {(state, op, actor) for _, state, calls in plan if state in RECIPES for op, actor in calls}
    assert reachable <= planned
    for _, state, calls in plan:
        refused = [(op, a) for op, a in calls if op == "claim_in_session" and claim_refused(state, a)]
        # A refused claim is an empty poll that holds the clock: only in an instance of such claims alone.
        assert not refused or deferred(state, calls), (state, calls)
        # The run's close leaves no in-session task to claim: nothing follows it.
        assert ("close_run", Actor.OPERATOR) not in calls[:-1], (state, calls)
    assert claim_refused("active", Actor.OTHER_WORKER)
    assert not claim_refused("active", Actor.HOLDER)
    assert claim_refused("reacquired", Actor.FORMER_HOLDER)
    assert claim_refused("closed", Actor.HOLDER)
    assert not claim_refused("expired", Actor.OTHER_WORKER)  # it reacquires
    assert not claim_refused("orphaned", Actor.HOLDER)  # refused at once: the holder that left is not registered


def test_a_session_whose_in_session_run_closed_and_what_a_heartbeat_may_show() -> None:
    from suite.machines.cells import session_state
    from suite.machines.session_activities import shown_requirement
    from suite.machines.session_shadow import ShadowSession
    from suite.protocol.sessions import SessionStatus

    s = ShadowSession("s", status=SessionStatus.ACTIVE, owner="w1", holders=["w1"])
    assert session_state(s) == "active"
    s.cancelled_activity = True
    assert session_state(s) == "active_cancelled_activity"
    assert shown_requirement(s, "w1") == "SESSION-ACTIVITY-HEARTBEAT-RENEWS"
    s.holders.append("w2")
    s.owner = "w2"
    assert session_state(s) == "reacquired"  # taken over: its former holder is told apart there
    assert shown_requirement(s, "w1") == "SESSION-STALE-HOLDER-FENCED"
    s.status = SessionStatus.EXPIRED
    assert session_state(s) == "expired"
    assert shown_requirement(s, "w2") == "SESSION-LEASE-EXPIRY"  # no heartbeat brings it back
    s.status = SessionStatus.CLOSED
    assert shown_requirement(s, "w2") == "SESSION-CLOSE-TERMINAL"


def test_an_update_accepted_then_closed_or_left_open_by_its_runs_close() -> None:
    from suite.machines.cells import update_state
    from suite.machines.messages import MessageRun

    run = MessageRun(workflow_id="wf", run_id="r")
    run.open_updates["u1"] = "upd-1"
    assert update_state(run, "u1") == "accepted"
    assert update_state(run, "never") is None
    run.step(RunEvent.CANCEL)
    assert update_state(run, "u1") == "rejected"
    run.open_updates.pop("u1")
    run.closed_updates.add("u1")
    run.update_outcomes["u1"] = "failed"
    assert update_state(run, "u1") == "failed"


def test_the_update_sweep_plans_every_cold_cell_and_ends_an_instance_at_its_one_change() -> None:
    from suite.machines.update_sweep import cold_plan
    from suite.protocol.coverage import cells

    entity = next(e for e in ENTITIES if e.name == "update")
    reachable = {(c.state, c.operation, c.actor) for c in cells(entity) if c.ruled_out is None}
    plan = cold_plan({})
    assert {(s, op, a) for s, insts in plan.items() for calls in insts for op, a in calls} == reachable
    first, *further = plan["accepted"]
    assert first[0] == ("describe", Actor.OPERATOR)  # a read leaves the update as it is: first
    assert all(len(calls) == 1 for calls in further)


def test_the_query_sweep_plans_the_cold_cells_a_worker_can_name_and_keeps_polls_off_the_answer() -> None:
    from suite.machines.query_sweep import cold_plan
    from suite.protocol.coverage import cells

    entity = next(e for e in ENTITIES if e.name == "query_task")
    reachable = {(c.state, c.operation, c.actor) for c in cells(entity) if c.ruled_out is None}
    plan = cold_plan({})
    planned = {(s, op, a) for s, insts in plan.items() for calls in insts for op, a in calls}
    # Not planned: what only a lease shorter than the query timeout makes (a pending task a worker can name).
    assert reachable - planned == {
        ("leased", "expire", Actor.CLOCK),
        ("pending", "complete", Actor.OTHER_WORKER),
        ("pending", "fail", Actor.OTHER_WORKER),
    }
    answered, *_, waited = plan["leased"]
    assert answered[-1] == ("fail", Actor.HOLDER)
    assert all(op != "poll" for op, _ in answered)  # a poll holds the clock: never before the holder's answer
    assert waited[-1] == ("time_out", Actor.CLOCK)


def test_a_requirement_judged_only_in_cells_not_reached_is_not_covered() -> None:
    from suite.machines.runner import judged_cells
    from suite.outcomes import Kind, Record, Verdict

    needs = {"ACTIVITY-FENCE-OWNER": ("activity_attempt/*/*/other_worker",)}
    rec = Record(Kind.MACHINE, "machine:activities", requirements=("ACTIVITY-FENCE-OWNER",), verdict=Verdict.PASSED)
    other = Record(Kind.MACHINE, "machine:activities", requirements=("RETRY-DEFAULT-NONE",), verdict=Verdict.PASSED)
    cold = judged_cells([rec, other], needs, {"activity_attempt/running/heartbeat/holder": 3})
    assert cold[0].verdict is Verdict.NOT_COVERED
    assert "did not reach" in cold[0].message
    assert cold[1].verdict is Verdict.PASSED  # a requirement with no cells of its own keeps its verdict
    warm = judged_cells([rec], needs, {"activity_attempt/redelivered/complete/other_worker": 1})
    assert warm[0].verdict is Verdict.PASSED
    failed = Record(Kind.MACHINE, "machine:activities", requirements=("ACTIVITY-FENCE-OWNER",), verdict=Verdict.FAILED)
    assert judged_cells([failed], needs, {})[0].verdict is Verdict.FAILED  # a failure stands wherever it was found


def test_the_run_sweep_plans_every_cold_call_but_the_clocks_and_one_change_per_instance() -> None:
    from suite.machines.run_sweep import cold_plan
    from suite.protocol.coverage import cells

    entity = next(e for e in ENTITIES if e.name == "run")
    reachable = {(c.state, c.operation) for c in cells(entity) if c.ruled_out is None and c.actor is not Actor.CLOCK}
    plan = cold_plan({})
    assert {(s, op) for s, insts in plan.items() for ops in insts for op in ops} == reachable
    first, *further = plan["pending"]
    assert first[0] == "read_history"  # a read leaves the run as it is: first
    assert all(len(ops) == 1 for ops in further)  # every further batch or close on a run of its own


def test_the_run_sweep_times_out_a_run_in_each_live_state_whose_timeout_cell_is_cold() -> None:
    from suite.machines.run_sweep import PAUSE, SLACK, TIMEOUT, timeout_plan
    from suite.protocol.coverage import cell_key, cells

    entity = next(e for e in ENTITIES if e.name == "run")
    reachable = {c.state for c in cells(entity) if c.ruled_out is None and c.operation == "time_out"}
    assert set(timeout_plan({})) == reachable == {"pending", "running", "waiting", "continued"}
    assert timeout_plan({cell_key("run", "waiting", "time_out", Actor.CLOCK): 1}) == ["pending", "running", "continued"]
    # A continued run counting its execution's timeout from its own start would still be open when judged.
    assert PAUSE > SLACK
    assert PAUSE < TIMEOUT


def _child(policy: str = "abandon") -> ChildShadow:
    parent = RunShadow(workflow_id="p", run_id="pr")
    return ChildShadow(
        parent=parent, policy=policy, workflow_id="c", call_id="k", run=RunShadow(workflow_id="c", run_id="cr")
    )


def test_a_child_running_then_closed_then_its_parents_second_result() -> None:
    child = _child()
    assert child_state(child) == "running"
    child.step(ChildEvent.RETRY)
    assert child_state(child) == "backoff"
    child.step(ChildEvent.RESTART)
    child.step(ChildEvent.CHILD_COMPLETED)
    assert child_state(child) == "completed"
    child.second = True
    assert child_state(child) == "second_result"
    failed = _child()
    failed.step(ChildEvent.CHILD_FAILED)
    failed.second = True  # only a completed result is the parent's second result the model tells apart
    assert child_state(failed) == "failed"


def test_a_child_whose_parent_closed_with_it_open_is_in_that_policys_closing_state_whatever_follows() -> None:
    names = {s.name for s in next(e for e in ENTITIES if e.name == "child").states}
    for policy in PARENT_CLOSE_POLICIES:
        child = _child(policy)
        child.closing = policy
        assert child_state(child) == f"parent_closing_{policy}"
        assert child_state(child) in names
        child.step(ChildEvent.CHILD_CANCELLED)
        assert child_state(child) == f"parent_closing_{policy}"
    unsure = _child()
    assert unsure.run is not None
    unsure.run.uncertain = True
    assert child_state(unsure) is None


def test_a_cancellation_request_requested_delivered_carried_again_then_resolved() -> None:
    request = RequestShadow(child=_child("request_cancellation"), request_id="r1", deadline=T0 + timedelta(seconds=10))
    assert cancellation_state(request, T0, 1.0) == "requested"
    request.step(CancellationRequestEvent.DELIVER)
    request.delivered_on = "t1"
    assert cancellation_state(request, T0, 1.0) == "delivered"
    request.later = True
    assert cancellation_state(request, T0, 1.0) == "delivered_again"
    # About the deadline the model cannot say which side of it a call landed on; past it, unresolved, neither.
    assert cancellation_state(request, T0 + timedelta(seconds=9.5), 1.0) is None
    assert cancellation_state(request, T0 + timedelta(seconds=20), 1.0) is None
    request.step(CancellationRequestEvent.RESOLVE)
    assert cancellation_state(request, T0 + timedelta(seconds=20), 1.0) == "resolved"
    request.by_deadline = True
    assert cancellation_state(request, T0 + timedelta(seconds=20), 1.0) == "past_deadline"


def test_the_child_sweep_plans_every_cold_reachable_cell_once_each_instance_ending_at_its_one_change() -> None:
    for entity, plan in (("child", child_plan({})), ("cancellation_request", cancellation_plan({}))):
        model = next(e for e in ENTITIES if e.name == entity)
        reachable = {(c.state, c.operation, c.actor) for c in cells(model) if c.ruled_out is None}
        planned = [
            (state, op, actor) for state, instances in plan.items() for calls in instances for op, actor in calls
        ]
        assert sorted(planned) == sorted(reachable), entity  # every reachable cell, once
    # A running child: the parent's read leaves it as it is; each call that closes it is an instance of its own.
    running = child_plan({})["running"]
    assert running[0][0] == ("parent_reads_result", Actor.HOLDER)
    assert all(len(calls) == 1 for calls in running[1:])
    # A closed parent's calls change nothing: one instance makes them all.
    assert len(child_plan({})["parent_closing_terminate"]) == 1
    hits = {"child/running/parent_reads_result/holder": 1}
    assert child_plan(hits)["running"][0] == [("child_completes", Actor.HOLDER)]
