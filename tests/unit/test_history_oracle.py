"""The history oracle (suite.protocol.oracle): hand-written histories, each broken rule shown failing with its
requirement, and a Hypothesis test that generates acceptance sequences, builds the history a correct server
could write for them (in any order the spec allows) and checks the oracle accepts it and refuses it once
broken."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suite.protocol.errors import Violation
from suite.protocol.history import compress_page, encode_page_token
from suite.protocol.oracle import Accepted, Applied, Kind, Page, expected_history, join_pages, judge_history, page_of

START = Accepted(Kind.START)


def history(*kinds: tuple[str, dict[str, Any]] | str) -> list[dict[str, Any]]:
    events = []
    for seq, k in enumerate(kinds, 1):
        kind, payload = (k, {}) if isinstance(k, str) else k
        events.append({"id": f"e{seq}", "sequence": seq, "event_type": kind, "payload": payload})
    return events


def sig(name: str) -> tuple[str, dict[str, Any]]:
    return ("SignalReceived", {"signal_name": name})


def upd(uid: str, kind: str = "UpdateAccepted") -> tuple[str, dict[str, Any]]:
    return (kind, {"update_id": uid})


def broken(events: list[dict[str, Any]], accepted: list[Accepted], **kw: Any) -> str:
    with pytest.raises(Violation) as v:
        judge_history(events, accepted, **kw)
    return v.value.requirement


# -- hand-written histories ------------------------------------------------------------------------------


def test_a_fresh_start() -> None:
    judge_history(history("StartAccepted", "WorkflowStarted"), [START], last_sequence=2)
    assert broken(history("StartAccepted"), [START]) == "HISTORY-FIRST-TASK-STARTED"
    assert broken(history("WorkflowStarted", "StartAccepted"), [START]) == "HISTORY-FIRST-TASK-STARTED"


def test_a_signal_accepted_before_the_poll_is_in_the_task_exactly_once() -> None:
    accepted = [START, Accepted(Kind.SIGNAL, "s1")]
    judge_history(history("StartAccepted", "WorkflowStarted", sig("s1")), accepted)
    # The bug of a server that leaves a signal accepted while the previous task was leased out of the next task.
    assert broken(history("StartAccepted", "WorkflowStarted"), accepted) == "SIGNAL-RECORDED-AND-WAKES"
    twice = history("StartAccepted", "WorkflowStarted", sig("s1"), sig("s1"))
    assert broken(twice, accepted) == "SIGNAL-RECORDED-AND-WAKES"
    # Acknowledged after the task's poll left: it may be there (pages are read later) or not, never twice.
    judge_history(history("StartAccepted", "WorkflowStarted"), accepted, seen_before=1)
    judge_history(history("StartAccepted", "WorkflowStarted", sig("s1")), accepted, seen_before=1)
    assert broken(twice, accepted, seen_before=1) == "SIGNAL-RECORDED-AND-WAKES"


def test_a_maybe_applied_signal_may_be_there_up_to_its_deliveries() -> None:
    accepted = [START, Accepted(Kind.SIGNAL, "s1", applied=Applied.MAYBE, copies=2)]
    for n in (0, 1, 2):
        judge_history(history("StartAccepted", "WorkflowStarted", *[sig("s1")] * n), accepted)
    assert (
        broken(history("StartAccepted", "WorkflowStarted", *[sig("s1")] * 3), accepted) == "SIGNAL-RECORDED-AND-WAKES"
    )


def test_signals_may_come_in_either_order() -> None:
    accepted = [START, Accepted(Kind.SIGNAL, "a"), Accepted(Kind.SIGNAL, "b")]
    judge_history(history("StartAccepted", "WorkflowStarted", sig("b"), sig("a")), accepted)
    judge_history(history("StartAccepted", "WorkflowStarted", sig("a"), sig("b")), accepted)


def test_a_repeated_update_in_the_pages_of_a_run_with_two_updates() -> None:
    accepted = [START, Accepted(Kind.UPDATE, "u1"), Accepted(Kind.UPDATE, "u2")]
    good = history("StartAccepted", "WorkflowStarted", upd("u1"), upd("u2"))
    judge_history(good, accepted, last_sequence=4)
    # The page repeats the event (same sequence) ...
    assert broken([*good, good[3]], accepted) == "HISTORY-PAGINATION-COMPLETE"
    # ... or the server recorded it twice (a sequence of its own).
    assert broken(history("StartAccepted", "WorkflowStarted", upd("u1"), upd("u2"), upd("u2")), accepted) == (
        "UPDATE-ACCEPTED-RECORDED"
    )


def test_sequences_read_in_full_are_one_to_n() -> None:
    good = history("StartAccepted", "WorkflowStarted", "TimerScheduled")
    assert broken([good[0], good[2]], [START]) == "HISTORY-PAGINATION-COMPLETE"  # a gap
    assert broken(good[:2], [START], last_sequence=3) == "HISTORY-PAGINATION-COMPLETE"  # stops short
    assert broken([good[1], good[0]], [START]) == "HISTORY-PAGINATION-COMPLETE"  # out of order
    same_id = [good[0], {**good[1], "id": "e1"}]
    assert broken(same_id, [START]) == "HISTORY-PAGINATION-COMPLETE"


def test_update_closing_comes_after_its_acceptance() -> None:
    accepted = [START, Accepted(Kind.UPDATE, "u1"), Accepted(Kind.UPDATE_CLOSED, "u1")]
    judge_history(
        history(
            "StartAccepted", "WorkflowStarted", upd("u1"), upd("u1", "UpdateApplied"), upd("u1", "UpdateCompleted")
        ),
        accepted,
    )
    early = history("StartAccepted", "WorkflowStarted", upd("u1", "UpdateCompleted"), upd("u1"))
    assert broken(early, accepted) == "UPDATE-CLOSED-AT-MOST-ONCE"
    twice = history(
        "StartAccepted", "WorkflowStarted", upd("u1"), upd("u1", "UpdateCompleted"), upd("u1", "UpdateCompleted")
    )
    assert broken(twice, accepted) == "UPDATE-CLOSED-AT-MOST-ONCE"


def test_nothing_accepted_after_the_terminal_event() -> None:
    accepted = [START, Accepted(Kind.CANCEL)]
    judge_history(history("StartAccepted", "WorkflowStarted", "CancelRequested", "WorkflowCancelled"), accepted)
    late = history("StartAccepted", "WorkflowStarted", "WorkflowCancelled", sig("late"))
    assert broken(late, accepted) == "SIGNAL-CLOSED-RUN-REJECTED"
    assert broken(history("StartAccepted", "WorkflowStarted"), accepted) == "CONTROL-CANCEL-CLOSES-RUN"
    can = [START, Accepted(Kind.CONTINUE_AS_NEW)]
    assert broken(history("StartAccepted", "WorkflowStarted"), can) == "COMMANDS-CONTINUE-AS-NEW"


def test_timers_of_accepted_batches_are_recorded() -> None:
    accepted = [START, Accepted(Kind.TIMER), Accepted(Kind.TIMER, applied=Applied.MAYBE)]
    judge_history(history("StartAccepted", "WorkflowStarted", "TimerScheduled"), accepted)
    judge_history(history("StartAccepted", "WorkflowStarted", "TimerScheduled", "TimerScheduled"), accepted)
    assert broken(history("StartAccepted", "WorkflowStarted"), accepted) == "COMMANDS-ATOMIC"


def attempt_event(kind: str, attempt_id: str, number: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    return (kind, {"activity_execution_id": "x1", "activity_attempt_id": attempt_id, "attempt_number": number, **extra})


def test_attempt_numbers_run_on_across_retries_redeliveries_and_heartbeats() -> None:
    accepted = [
        START,
        Accepted(Kind.ATTEMPT, "a1", scope="x1", number=1),
        Accepted(Kind.ATTEMPT, "a2", scope="x1", number=2),  # redelivered after a1's lease expired
        Accepted(Kind.ATTEMPT, "a3", scope="x1", number=3),  # the retry after a2 failed
    ]
    good = history(
        "StartAccepted",
        "WorkflowStarted",
        attempt_event("ActivityHeartbeatRecorded", "a1", 1),
        attempt_event("ActivityHeartbeatRecorded", "a2", 2),
        attempt_event("ActivityRetryScheduled", "a2", 2, retry_after_attempt=2),
        attempt_event("ActivityCompleted", "a3", 3),
    )
    judge_history(good, accepted)
    restarted = [*accepted[:3], Accepted(Kind.ATTEMPT, "a3", scope="x1", number=1)]
    assert broken(good[:5], restarted) == "RETRY-ATTEMPTS-CONTIGUOUS"  # the retry after a heartbeat restarts at 1
    wrong = history("StartAccepted", "WorkflowStarted", attempt_event("ActivityHeartbeatRecorded", "a2", 1))
    assert broken(wrong, accepted) == "RETRY-ATTEMPTS-CONTIGUOUS"  # the heartbeat names another attempt's number
    back = history(
        "StartAccepted",
        "WorkflowStarted",
        attempt_event("ActivityHeartbeatRecorded", "b2", 2),
        attempt_event("ActivityHeartbeatRecorded", "b1", 1),
    )
    assert broken(back, [START]) == "RETRY-ATTEMPTS-CONTIGUOUS"


def test_pages_join_into_the_history() -> None:
    events = history("StartAccepted", "WorkflowStarted", "TimerScheduled")
    pages = [
        Page(events[:2], after=0, page_size=2, has_more=True, next_after=2),
        Page(events[2:], after=2, page_size=2),
    ]
    assert join_pages(pages) == events
    with pytest.raises(Violation) as v:
        join_pages([Page(events, after=0, page_size=2)])
    assert v.value.requirement == "HISTORY-PAGINATION-COMPLETE"
    with pytest.raises(Violation) as v:
        join_pages([pages[0], Page(events[1:], after=2, page_size=2)])
    assert v.value.requirement == "HISTORY-PAGINATION-COMPLETE"
    with pytest.raises(Violation) as v:
        join_pages([Page(events, after=0, page_size=500, compressed=True)])
    assert v.value.requirement == "COMPRESSION-BELOW-THRESHOLD"


# -- generated acceptance sequences ----------------------------------------------------------------------

STEPS = st.lists(st.sampled_from(["signal", "update", "close", "timer", "attempt", "maybe_signal", "end"]), max_size=12)


def plan(steps: list[str]) -> list[Accepted]:
    """An acceptance sequence a machine could see, keys unique, nothing after the run's end."""
    accepted = [START]
    updates: list[str] = []
    attempts = 0
    for i, step in enumerate(steps):
        if step == "signal":
            accepted.append(Accepted(Kind.SIGNAL, f"s{i}"))
        elif step == "maybe_signal":
            accepted.append(Accepted(Kind.SIGNAL, f"s{i}", applied=Applied.MAYBE, copies=2))
        elif step == "update":
            updates.append(f"u{i}")
            accepted.append(Accepted(Kind.UPDATE, f"u{i}"))
        elif step == "close" and updates:
            accepted.append(Accepted(Kind.UPDATE_CLOSED, updates.pop(0)))
        elif step == "timer":
            accepted.append(Accepted(Kind.TIMER))
        elif step == "attempt":
            attempts += 1
            accepted.append(Accepted(Kind.ATTEMPT, f"a{attempts}", scope="x1", number=attempts))
        elif step == "end":
            accepted.append(Accepted(Kind.CANCEL))
            break
    return accepted


def write(accepted: list[Accepted], seen_before: int, rng: random.Random) -> list[dict[str, Any]]:
    """The history a correct server could show a task whose poll left after ``seen_before`` acknowledgements:
    every one of those once, each later one or not, maybe-applied ones 0-2 times, in an order the spec
    allows (independent messages shuffled among themselves)."""
    kinds: list[tuple[str, dict[str, Any]] | str] = ["StartAccepted", "WorkflowStarted"]
    body: list[list[tuple[str, dict[str, Any]] | str]] = []
    for i, a in enumerate(accepted[1:], 1):
        if i >= seen_before and rng.random() < 0.5:
            continue
        if a.kind is Kind.SIGNAL:
            n = rng.randint(0, 2) if a.applied is Applied.MAYBE else 1
            body.extend([[sig(a.key)]] * n)
        elif a.kind is Kind.UPDATE:
            body.append([upd(a.key)])
        elif a.kind is Kind.UPDATE_CLOSED:
            # After its acceptance (a close of an update this history does not show is not shown either).
            group = next((g for g in body if upd(a.key) in g), None)
            if group is not None:
                group.extend([upd(a.key, "UpdateApplied"), upd(a.key, "UpdateCompleted")])
        elif a.kind is Kind.TIMER:
            body.append(["TimerScheduled"])
        elif a.kind is Kind.ATTEMPT:
            body.append([attempt_event("ActivityHeartbeatRecorded", a.key, a.number or 0)])
        elif a.kind is Kind.CANCEL:
            body.append(["__end__"])
    end = [g for g in body if g == ["__end__"]]
    groups = [g for g in body if g != ["__end__"]]
    # Attempts keep their order (numbers never go back); everything else may interleave freely.
    attempt_groups = [
        g
        for g in groups
        if g[0] != "TimerScheduled" and isinstance(g[0], tuple) and g[0][0] == "ActivityHeartbeatRecorded"
    ]
    others = [g for g in groups if g not in attempt_groups]
    rng.shuffle(others)
    merged: list[list[tuple[str, dict[str, Any]] | str]] = []
    queue = list(attempt_groups)
    for g in others:
        if queue and rng.random() < 0.5:
            merged.append(queue.pop(0))
        merged.append(g)
    merged.extend(queue)
    for g in merged:
        kinds.extend(g)
    if end:
        kinds.append("WorkflowCancelled")
    return history(*kinds)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, cut=st.integers(0, 20), seed=st.integers(0, 2**32))
def test_a_correct_history_of_any_acceptance_sequence_is_accepted(steps: list[str], cut: int, seed: int) -> None:
    accepted = plan(steps)
    seen_before = min(cut, len(accepted))
    events = write(accepted, seen_before, random.Random(seed))
    judge_history(events, accepted, seen_before=max(seen_before, 1), last_sequence=len(events))


@settings(max_examples=300, deadline=None)
@given(
    steps=STEPS, seed=st.integers(0, 2**32), how=st.sampled_from(["drop", "repeat_page", "repeat_event", "stop_short"])
)
def test_a_broken_history_is_refused_with_the_rule_it_breaks(steps: list[str], seed: int, how: str) -> None:
    accepted = plan(steps)
    rng = random.Random(seed)
    events = write(accepted, len(accepted), rng)
    required = [e for e in expected_history(accepted) if e.counts == frozenset({1})]
    if how == "drop":
        target = rng.choice(required)
        victim = next(i for i, ev in enumerate(events) if target.matches(ev))
        kept = events[:victim] + events[victim + 1 :]
        # Renumbered so only the missing event, not a gap, shows.
        bad = [{**ev, "sequence": n, "id": f"r{n}"} for n, ev in enumerate(kept, 1)]
        assert broken(bad, accepted) == target.requirement
    elif how == "repeat_page":
        i = rng.randrange(len(events))
        assert broken([*events[: i + 1], events[i], *events[i + 1 :]], accepted) == "HISTORY-PAGINATION-COMPLETE"
    elif how == "repeat_event":
        target = rng.choice(required)
        twin = next(ev for ev in events if target.matches(ev))
        bad = [*events, {**twin, "sequence": len(events) + 1, "id": "twin"}]
        with pytest.raises(Violation) as v:
            judge_history(bad, accepted)
        # A repeat is refused by its count, or (a start, a terminal event repeated) by the order it breaks.
        assert v.value.requirement in {target.requirement, "SIGNAL-CLOSED-RUN-REJECTED", "UPDATE-CLOSED-RUN-REJECTED"}
    else:
        assert broken(events[:-1], accepted, last_sequence=len(events)) == "HISTORY-PAGINATION-COMPLETE"


def test_a_page_is_read_by_either_cursor_style_plain_or_compressed() -> None:
    events = history(*["TimerScheduled"] * 60)
    plain = page_of({"history_events": events[:2], "has_more": True, "next_after_sequence": 2}, after=0, page_size=2)
    assert (plain.next_after, plain.has_more, plain.compressed) == (2, True, False)
    # UPS strips the S0 fields: the token alone names the next page.
    token = page_of(
        {"history_events": events[:2], "next_history_page_token": encode_page_token(2)}, after=0, page_size=2
    )
    assert (token.next_after, token.has_more) == (2, True)
    packed = page_of({**compress_page(events, "gzip"), "has_more": False}, after=0, page_size=1000)
    assert packed.compressed
    assert packed.events == events
    for body, requirement in (
        ({"history_events": [], "has_more": True}, "HISTORY-PAGINATION-COMPLETE"),  # more, but no cursor
        ({"history_events": [], "next_history_page_token": "!!"}, "HISTORY-PAGINATION-COMPLETE"),
        ({"history_events_compressed": "not base64", "history_events_encoding": "gzip"}, "COMPRESSION-ROUNDTRIP"),
    ):
        with pytest.raises(Violation) as v:
            page_of(body, after=0, page_size=10)
        assert v.value.requirement == requirement


def test_a_parents_history_records_each_child_once_and_a_retried_run_never_as_failed() -> None:
    scheduled = Accepted(Kind.CHILD_SCHEDULED, "c1", fields=(("parent_close_policy", "abandon"),))
    retried = Accepted(Kind.CHILD_RETRY, "cr1")
    completed = Accepted(Kind.CHILD_COMPLETED, "cr2")
    good = history(
        "StartAccepted",
        "WorkflowStarted",
        ("ChildWorkflowScheduled", {"child_workflow_id": "c1", "parent_close_policy": "abandon"}),
        ("ChildWorkflowRetryScheduled", {"failed_child_run_id": "cr1"}),
        ("ChildRunCompleted", {"child_workflow_run_id": "cr2"}),
    )
    judge_history(good, [START, scheduled, retried, completed])
    terminate = history(
        "StartAccepted",
        "WorkflowStarted",
        ("ChildWorkflowScheduled", {"child_workflow_id": "c1", "parent_close_policy": "terminate"}),
    )
    assert broken(terminate, [START, scheduled]) == "CHILD-POLICY-RECORDED"
    failed_too = [*good, *history(("ChildRunFailed", {"child_workflow_run_id": "cr1"}))]
    failed_too[-1].update(id="e6", sequence=6)
    assert broken(failed_too, [START, scheduled, retried, completed]) == "CHILD-RETRY-BACKOFF"
    assert broken(good[:4], [START, scheduled, retried, completed]) == "CHILD-RESULT-WAKES-PARENT"


def test_a_child_closed_by_its_parents_policy_or_its_deadline_names_why() -> None:
    by_parent = history("StartAccepted", "WorkflowStarted", ("WorkflowTerminated", {"reason": "parent_closed"}))
    judge_history(by_parent, [START, Accepted(Kind.PARENT_TERMINATED)])
    by_operator = history("StartAccepted", "WorkflowStarted", ("WorkflowTerminated", {"reason": "conformance"}))
    assert broken(by_operator, [START, Accepted(Kind.PARENT_TERMINATED)]) == "CHILD-PARENT-CLOSE-POLICIES"
    at_deadline = history(
        "StartAccepted",
        "WorkflowStarted",
        ("CooperativeCancellationRequested", {"workflow_command_id": "q1"}),
        ("CooperativeCancellationDelivered", {"workflow_command_id": "q1"}),
        ("WorkflowCancelled", {"reason": "cleanup_deadline_exceeded"}),
    )
    acks = [
        START,
        Accepted(Kind.COOPERATIVE_REQUESTED, "q1"),
        Accepted(Kind.COOPERATIVE_DELIVERED, "q1"),
        Accepted(Kind.DEADLINE_CANCEL),
    ]
    judge_history(at_deadline, acks)
    twice = [*at_deadline, *history(("CooperativeCancellationDelivered", {"workflow_command_id": "q1"}))]
    twice[-1].update(id="e6", sequence=6)
    assert broken(twice, acks) == "CANCEL-COOPERATIVE-DELIVERY"
    terminated = [*at_deadline[:4], *history(("WorkflowTerminated", {"reason": "cleanup_deadline_exceeded"}))]
    terminated[-1].update(id="e5", sequence=5)
    assert broken(terminated, acks) == "CANCEL-COOPERATIVE-DEADLINE"


def test_a_cooperative_requests_outcome_names_how_the_child_closed_and_may_follow_the_parents_end() -> None:
    resolved = Accepted(
        Kind.CANCELLATION_RESOLVED, "q1", fields=(("outcome", "cancelled"), ("closed_by", "cleanup_deadline"))
    )
    payload = {"request_id": "q1", "outcome": "cancelled", "closed_by": "cleanup_deadline"}
    events = history("StartAccepted", "WorkflowStarted", "WorkflowCancelled", ("ChildCancellationResolved", payload))
    judge_history(events, [START, Accepted(Kind.CANCEL), resolved])
    events[-1]["payload"] = {**payload, "closed_by": "child"}
    assert broken(events, [START, Accepted(Kind.CANCEL), resolved]) == "CANCEL-COOPERATIVE-OUTCOME"
