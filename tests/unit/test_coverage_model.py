"""The coverage model: its cells come from the lifecycle tables, and the ruled-out ones say why."""

from __future__ import annotations

import dataclasses

import pytest

from suite.protocol import coverage
from suite.protocol.commands import PARENT_CLOSE_POLICIES
from suite.protocol.coverage import ENTITIES, Actor, Channel, cell_key, cells, matrix, not_reached
from suite.protocol.lifecycles import PARENT_CLOSE_EFFECTS, LeaseState, RunEvent, TaskStatus
from suite.protocol.sessions import SessionStatus


def _cell(entity: str, state: str, op: str, actor: Actor) -> coverage.Cell:
    e = next(x for x in ENTITIES if x.name == entity)
    return next(c for c in cells(e) if (c.state, c.operation, c.actor) == (state, op, actor))


def test_model_is_sound() -> None:
    coverage.validate()


def test_every_entity_named_by_the_protocol_is_modelled() -> None:
    assert {e.name for e in ENTITIES} == {
        "workflow_task",
        "run",
        "activity_attempt",
        "query_task",
        "worker_session",
        "child",
        "cancellation_request",
        "update",
    }


def test_cells_are_the_product_of_states_operations_and_their_actors() -> None:
    for entity in ENTITIES:
        got = cells(entity)
        assert len(got) == len(entity.states) * sum(len(op.by) for op in entity.operations)
        assert len({c.key for c in got}) == len(got)


def test_transient_states_are_told_apart() -> None:
    wt = next(e for e in ENTITIES if e.name == "workflow_task")
    assert wt.state("lease_expired").facets == {
        "workflow_task": TaskStatus.LEASED,
        "workflow_task_lease": LeaseState.EXPIRED,
    }
    assert Actor.FORMER_HOLDER in wt.state("redelivered").present
    assert Actor.FORMER_HOLDER not in wt.state("leased").present
    ws = next(e for e in ENTITIES if e.name == "worker_session")
    assert ws.state("reacquired").facets["worker_session"] is SessionStatus.ACTIVE
    child = next(e for e in ENTITIES if e.name == "child")
    policies = {s.name for s in child.states if s.name.startswith("parent_closing_")}
    assert policies == {
        "parent_closing_abandon",
        "parent_closing_request_cancel",
        "parent_closing_request_cancellation",
        "parent_closing_terminate",
    }


# (entity, state, operation, actor) -> None where the cell is reachable, else a phrase its ruled_out reason holds
# ("" where any reason will do).
RULED_OUT: list[tuple[tuple[str, str, str, Actor], str | None]] = [
    # A clock event the table has no row for is ruled out, with its reason.
    (("workflow_task", "lease_expired", "lapse", Actor.CLOCK), "no row for lapse in expired"),
    (("workflow_task", "leased", "lapse", Actor.CLOCK), None),
    (("workflow_task", "lease_expired", "recover", Actor.CLOCK), None),
    (("workflow_task", "leased", "recover", Actor.CLOCK), ""),
    (("worker_session", "closed", "lease_expire", Actor.CLOCK), ""),
    # An actor that cannot exist is ruled out.
    (("workflow_task", "leased", "complete", Actor.FORMER_HOLDER), "no former holder"),
    # A call in a closed state is answered (fenced), and that answer is judged: a reachable cell.
    (("workflow_task", "run_closed", "complete", Actor.HOLDER), None),
    (("worker_session", "reacquired", "heartbeat", Actor.FORMER_HOLDER), None),
    # Past its cleanup deadline a request is resolved by the deadline itself: the deadline cannot fire again there,
    # and it fires in the state the request was in when it passed.
    (("cancellation_request", "past_deadline", "deadline", Actor.CLOCK), "no row for resolve in resolved"),
    (("cancellation_request", "delivered_again", "deadline", Actor.CLOCK), None),
    (("cancellation_request", "past_deadline", "child_task", Actor.HOLDER), None),
    # Only a child waiting out its backoff restarts; every child state is reachable by the parent's worker.
    (("child", "backoff", "restart", Actor.CLOCK), None),
    (("child", "parent_closing_abandon", "restart", Actor.CLOCK), "no row for restart in running"),
    (("child", "second_result", "parent_reads_result", Actor.HOLDER), None),
]


@pytest.mark.parametrize(
    ("cell", "reason"), RULED_OUT, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else None
)
def test_a_cell_is_ruled_out_only_with_its_reason(cell: tuple[str, str, str, Actor], reason: str | None) -> None:
    ruled_out = _cell(*cell).ruled_out
    if reason is None:
        assert ruled_out is None
    else:
        assert ruled_out is not None
        assert reason in ruled_out


def test_operations_only_their_actors_make() -> None:
    run = next(e for e in ENTITIES if e.name == "run")
    assert run.operation("complete_workflow").by == (Actor.HOLDER,)
    assert run.operation("cancel").by == (Actor.OPERATOR,)
    assert all(op.by == (Actor.CLOCK,) for e in ENTITIES for op in e.operations if op.channel is Channel.CLOCK)


def test_validate_names_a_lifecycle_event_no_operation_fires() -> None:
    run = next(e for e in ENTITIES if e.name == "run")
    crippled = dataclasses.replace(run, operations=tuple(o for o in run.operations if o.name != "time_out"))
    saved = coverage.ENTITIES
    coverage.ENTITIES = (crippled,)
    try:
        with pytest.raises(ValueError, match="run event time_out fired by no operation"):
            coverage.validate()
    finally:
        coverage.ENTITIES = saved


def test_matrix_counts_reached_and_lists_the_rest() -> None:
    key = cell_key("workflow_task", "redelivered", "complete", Actor.FORMER_HOLDER)
    rows = matrix({key: 3}, {"query_tasks": True})
    wt = next(r for r in rows if r.entity == "workflow_task")
    assert wt.reached == {key: 3}
    assert key not in wt.not_reached
    assert cell_key("workflow_task", "leased", "lapse", Actor.CLOCK) in wt.not_reached
    assert cell_key("workflow_task", "lease_expired", "lapse", Actor.CLOCK) in wt.ruled_out
    every = cells(next(e for e in ENTITIES if e.name == "workflow_task"))
    ruled = sum(1 for c in every if c.ruled_out)
    reachable = len(every) - ruled
    assert (
        wt.line()
        == f"workflow_task: 1/{reachable} cells reached (3 hits), {ruled} ruled out, {reachable - 1} not reached"
    )
    by_name = {r.entity: r for r in rows}
    assert by_name["query_task"].applicable
    assert not by_name["worker_session"].applicable
    left = not_reached(rows)
    assert all(not k.startswith("worker_session/") for k in left)
    assert any(k.startswith("query_task/") for k in left)
    assert wt.to_json()["reached"] == {key: 3}


def test_a_state_rules_out_an_operation_its_own_rules_make_impossible_with_the_sentence() -> None:
    by_key = {c.key: c for e in ENTITIES for c in cells(e)}
    lost = by_key[cell_key("worker_session", "reacquired", "lost", Actor.CLOCK)]
    assert lost.ruled_out is not None
    assert "never failed" in lost.ruled_out
    assert by_key[cell_key("worker_session", "active", "lost", Actor.CLOCK)].ruled_out is None


def test_every_parent_close_policy_says_what_it_does_to_an_open_child() -> None:
    assert set(PARENT_CLOSE_EFFECTS) == set(PARENT_CLOSE_POLICIES)
    assert PARENT_CLOSE_EFFECTS["terminate"] is RunEvent.TERMINATE
    assert PARENT_CLOSE_EFFECTS["request_cancel"] is RunEvent.CANCEL  # "closes the child at once"
    assert PARENT_CLOSE_EFFECTS["abandon"] is None
    assert PARENT_CLOSE_EFFECTS["request_cancellation"] is None  # asked to clean up: it stays open


def test_a_target_whose_query_lease_outlasts_its_timeout_rules_out_the_lapsed_query_lease_cells() -> None:
    from suite.protocol.coverage import cell_key, matrix, not_reached, target_ruled_out

    lapse = cell_key("query_task", "leased", "expire", "clock")
    named = cell_key("query_task", "pending", "complete", "other_worker")
    equal = {"query_task_lease_seconds": 3, "query_task_timeout_seconds": 3}
    shorter = {"query_task_lease_seconds": 3, "query_task_timeout_seconds": 4}
    assert target_ruled_out(lapse, equal) is not None
    assert target_ruled_out(lapse, {**equal, "query_task_lease_seconds": 60}) is not None
    assert target_ruled_out(lapse, shorter) is None  # its lease can lapse before the deadline: reachable
    assert target_ruled_out(lapse, {}) is None  # a target that does not say is held to every reachable cell
    assert target_ruled_out(lapse, {"query_task_lease_seconds": True, "query_task_timeout_seconds": 1}) is None
    assert target_ruled_out(cell_key("query_task", "leased", "poll", "holder"), equal) is None
    caps = {"query_tasks": True}
    rows = {r.entity: r for r in matrix({}, caps, equal)}
    assert {lapse, named} <= set(rows["query_task"].not_applicable)
    assert lapse not in not_reached(rows.values())
    assert "3 not applicable to this target" in rows["query_task"].line()
    rows = {r.entity: r for r in matrix({}, caps, shorter)}
    assert lapse in not_reached(rows.values())
    rows = {r.entity: r for r in matrix({lapse: 1}, caps, equal)}
    assert lapse in rows["query_task"].impossible_hits  # the target did what its own values rule out
