"""History: sequences, poll-inline paging, the history route's cursors, compression, and one terminal event
per run and per activity attempt (§8.2, §8.4, §8.5; invariants 29, 41, 45-48, 69).

Multi-step histories are read back in full too. A bug that shows only after a particular sequence of steps — a
signal accepted while the run's task was leased, a second update, a redelivery after expiry — passes every check
that builds a one-step history. The read-back checks make one such history on purpose, read it back in full
(every page, following the cursor) and hand it to the history oracle (:mod:`suite.protocol.oracle`) with what
the target acknowledged, in order (``suite.worlds.judge_task_history``). The state machines make the same
histories at random and judge them the same way; these checks make them in every run, in a few requests, so a
server broken in one of them fails in seconds. The same is done for a chain of continuations
(``commands.py``) and a retry after a heartbeating attempt (``activities.py``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.outcomes import Unimplemented
from suite.protocol.history import ACTIVITY_OUTCOME_EVENTS, RUN_TERMINAL_EVENTS, check_sequences, decompress_events
from suite.protocol.oracle import Accepted, Kind
from suite.protocol.requirements import Area
from suite.registry import check
from suite.text import plural
from suite.worlds import (
    PAGINATION,
    READY_WITHIN,
    WF_LEASE,
    LeasedRun,
    judge_task_history,
    lease_wf,
    leased_run,
    next_activity,
    wait_out_lease,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.HISTORY, Area.COMPRESSION)

_STATUS_OF = {
    "WorkflowCompleted": "completed",
    "WorkflowFailed": "failed",
    "WorkflowCancelled": "cancelled",
    "WorkflowTerminated": "terminated",
}

# §8.5: "< 50 events MUST NOT be compressed, and > 50 with opt-in MAY be compressed."
THRESHOLD = 50
# Commands per filler batch; halved when the target answers 422 structural_limit_exceeded.
BATCH = 250


def _size(run: LeasedRun) -> int:
    """The run's history length as the leased task states it."""
    value = run.task.get("last_history_sequence", run.task.get("total_history_events"))
    return value if isinstance(value, int) else 0


def _filler(count: int, tag: str) -> list[dict[str, Any]]:
    """``count`` commands that each add one event: side effects and version markers, interleaved."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 2:
            out.append(
                {
                    "type": "record_version_marker",
                    "change_id": f"{tag}-{i}",
                    "version": 1,
                    "min_supported": 1,
                    "max_supported": 1,
                }
            )
        else:
            out.append({"type": "record_side_effect", "result": CheckContext.envelope(i)})
    return out


async def _long_run(ctx: CheckContext, min_events: int, **poll: Any) -> LeasedRun:
    """A run with at least ``min_events`` history events and a workflow task leased on it.

    Each round completes the leased task with filler commands and a zero-delay timer, then leases the task
    the timer wakes (with the ``poll`` extras, e.g. ``history_page_size``).
    """
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, rid = await ctx.start(queue)
    run = LeasedRun(queue, worker, wid, rid, await lease_wf(ctx, worker, queue, **poll))
    batch = BATCH
    rounds = 0
    while _size(run) < min_events:
        rounds += 1
        if rounds > 64:
            raise ctx.fail(
                f"could not grow the run to {plural(min_events, 'event')}",
                expected=f">= {min_events}",
                received=_size(run),
            )
        # Each round also adds TimerScheduled and TimerFired.
        count = max(1, min(batch, min_events - _size(run) - 2))
        commands = [*_filler(count, f"r{rounds}"), {"type": "start_timer", "delay_seconds": 0}]
        reply = await ctx.complete(run.task, commands)
        if reply.status == 422 and reply.reason == "structural_limit_exceeded" and batch > 8:
            batch //= 2
            continue
        ctx.expect(
            reply,
            200,
            what=f"a batch of {count} record_side_effect/record_version_marker commands and a "
            "zero-delay timer (to build a long history)",
        )
        run.task = await lease_wf(ctx, worker, queue, within=15, **poll)
    return run


async def _page(ctx: CheckContext, run: LeasedRun, **fields: Any) -> Reply:
    return await ctx.wf_call(run.task, "history", fields)


def _seqs(events: Any) -> list[Any]:
    return [e.get("sequence") if isinstance(e, dict) else e for e in (events if isinstance(events, list) else [])]


def _plain_events(ctx: CheckContext, reply: Reply, what: str, requirement: str) -> list[dict[str, Any]]:
    """The events of a history page requested without opt-in: the plain array, never compressed."""
    body = ctx.expect(reply, 200, what=what, requirement=requirement)
    ctx.require(
        "history_events_compressed" not in body,
        f"{what}: without accept_history_encoding the page is the plain array",
        expected="no history_events_compressed",
        received=body.get("history_events_encoding"),
        replies=[reply],
        requirement="COMPRESSION-OPT-IN-ONLY",
    )
    events = body.get("history_events")
    ctx.require(
        isinstance(events, list),
        f"{what}: history_events is an array",
        expected="an array",
        received=type(events).__name__,
        replies=[reply],
        requirement=requirement,
    )
    assert isinstance(events, list)
    return events


def _cursor(body: dict[str, Any]) -> bool:
    """Whether a page carries a non-null cursor in either style (§8.2, §8.4)."""
    return body.get("next_history_page_token") is not None or (
        body.get("has_more") is True and body.get("next_after_sequence") is not None
    )


# -- Sequences (invariant 41) -----------------------------------------------------------------------------


@check("HISTORY-SEQUENCE-CONTIGUOUS", "HISTORY-FIRST-TASK-STARTED")
async def history_sequences_contiguous(ctx: CheckContext) -> None:
    """history_events run 1, 2, 3, … with no gap on the first task and on a resumed task; the first task's
    history holds WorkflowStarted."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    await ctx.start(queue)
    first = await lease_wf(ctx, worker, queue)
    events = first.get("history_events")
    problem = check_sequences(_seqs(events))
    ctx.require(
        isinstance(events, list) and bool(events) and problem is None,
        "the first task's history_events start at 1 and increase by exactly 1",
        expected="1, 2, …",
        received=problem or _seqs(events),
        requirement="HISTORY-SEQUENCE-CONTIGUOUS",
    )
    types = [e.get("event_type") for e in events if isinstance(e, dict)] if isinstance(events, list) else []
    ctx.require(
        "WorkflowStarted" in types,
        "the first workflow task's history contains WorkflowStarted",
        expected="WorkflowStarted among the events",
        received=types,
        requirement="HISTORY-FIRST-TASK-STARTED",
    )
    reply = await ctx.complete(first, [*_filler(9, "seq"), {"type": "start_timer", "delay_seconds": 0}])
    ctx.expect(reply, 200, what="a batch of 9 side effects and markers and a zero-delay timer")
    resumed = await lease_wf(ctx, worker, queue, within=15)
    events = resumed.get("history_events")
    problem = check_sequences(_seqs(events))
    # The first page of at least 13 events, or of the default page size the target advertises if smaller.
    least = min(13, ctx.default_history_page_size)
    ctx.require(
        isinstance(events, list) and len(events) >= least and problem is None,
        "a resumed task's history_events start at 1 and increase by exactly 1",
        expected=f"1, 2, … (at least {least} events)",
        received=problem or _seqs(events),
        requirement="HISTORY-SEQUENCE-CONTIGUOUS",
    )


# -- Pagination (invariants 45-47) ------------------------------------------------------------------------


@check("HISTORY-INLINE-PAGE")
async def history_inline_page(ctx: CheckContext) -> None:
    """With N events and history_page_size p < N (p = 1 and p = 5) the poll returns exactly p events
    (sequences 1..p) and a non-null cursor."""
    for p in (1, 5):
        run = await _long_run(ctx, 12, history_page_size=p)
        events = run.task.get("history_events")
        ctx.require_equal(
            _seqs(events),
            list(range(1, p + 1)),
            f"history_page_size {p} of {plural(_size(run), 'event')} gives exactly the first {plural(p, 'event')}",
            requirement="HISTORY-INLINE-PAGE",
        )
        cursor = {k: run.task.get(k) for k in ("next_history_page_token", "has_more", "next_after_sequence")}
        ctx.require(
            _cursor(run.task),
            "a partial inline page carries a non-null cursor",
            expected="next_history_page_token, or has_more true with next_after_sequence",
            received=cursor,
            requirement="HISTORY-INLINE-PAGE",
        )


@check("HISTORY-INLINE-DEFAULT-PAGE")
async def history_inline_default_page(ctx: CheckContext) -> None:
    """A poll without history_page_size on a run longer than the advertised default page d returns exactly d
    events (sequences 1..d) and a non-null cursor."""
    d = ctx.default_history_page_size
    run = await _long_run(ctx, d + 5)
    events = run.task.get("history_events")
    ctx.require_equal(
        _seqs(events),
        list(range(1, d + 1)),
        f"a poll without history_page_size on {plural(_size(run), 'event')} gives the first {plural(d, 'event')}, "
        "the advertised default page",
    )
    ctx.require(
        _cursor(run.task),
        "a partial inline page of the default size carries a non-null cursor",
        expected="next_history_page_token, or has_more true with next_after_sequence",
        received={k: run.task.get(k) for k in ("next_history_page_token", "has_more", "next_after_sequence")},
    )


async def _follow(ctx: CheckContext, run: LeasedRun, p: int, style: str) -> list[Any]:
    """Follow one cursor style from the inline page to the end; returns every sequence seen, in order."""
    seen = _seqs(run.task.get("history_events"))
    body = run.task
    cap = min(p, 1000)
    req = "HISTORY-PAGINATION-COMPLETE"
    for _ in range(_size(run) + 2):
        if style == "after_sequence":
            if body.get("has_more") is not True:
                return seen
            fields: dict[str, Any] = {"after_sequence": body.get("next_after_sequence"), "page_size": p}
        else:
            if body.get("next_history_page_token") is None:
                return seen
            fields = {"next_history_page_token": body.get("next_history_page_token"), "page_size": p}
        reply = await _page(ctx, run, **fields)
        events = _plain_events(ctx, reply, f"history page by {style}", req)
        ctx.require(
            len(events) <= cap,
            f"no history page is larger than min(p, 1000) = {cap}",
            expected=f"<= {plural(cap, 'event')}",
            received=len(events),
            replies=[reply],
            requirement=req,
        )
        ctx.require(
            bool(events),
            "a page requested through a cursor that promised more is not empty",
            expected="at least one event",
            received=reply.json(),
            replies=[reply],
            requirement=req,
        )
        seen += _seqs(events)
        body = reply.json()
    raise ctx.fail(f"the {style} cursor did not end after {_size(run) + 2} pages", requirement=req)


@check("HISTORY-PAGINATION-COMPLETE")
async def history_pagination_complete(ctx: CheckContext) -> None:
    """Following each cursor style the target emits (after_sequence/has_more and next_history_page_token)
    yields every sequence 1..N exactly once, in order, in pages of at most min(p, 1000)."""
    p = 7
    run = await _long_run(ctx, 60, history_page_size=p)
    n = _size(run)
    styles = [
        s
        for s, present in (
            ("after_sequence", run.task.get("has_more") is True),
            ("next_history_page_token", run.task.get("next_history_page_token") is not None),
        )
        if present
    ]
    ctx.require(
        bool(styles),
        f"a {n}-event history polled with history_page_size {p} carries a cursor",
        expected="has_more/next_after_sequence or next_history_page_token",
        received={k: run.task.get(k) for k in ("has_more", "next_after_sequence", "next_history_page_token")},
    )
    for style in styles:
        ctx.expect(await ctx.wf_call(run.task, "heartbeat"), 200, what="workflow-task heartbeat between walks")
        seen = await _follow(ctx, run, p, style)
        ctx.require(
            seen == list(range(1, n + 1)),
            f"following {style} yields every sequence 1..{n} exactly once, in order",
            expected=f"1..{n}",
            received=check_sequences(seen) or f"{plural(len(seen), 'sequence')} ending {seen[-3:]}",
        )


@check("HISTORY-PAGE-SIZE-CAP")
async def history_page_size_capped(ctx: CheckContext) -> None:
    """On a run of more than 1000 events, page_size 5000 gives at most 1000 events or a 422, on the history
    route (page_size and history_page_size) and inline on the poll."""
    run = await _long_run(ctx, 1005)
    req = "HISTORY-PAGE-SIZE-CAP"

    def check_page(reply: Reply, events: Any, what: str) -> None:
        count = len(events) if isinstance(events, list) else 0
        if reply.json().get("history_events_compressed"):
            count = len(
                decompress_events(
                    str(reply.json().get("history_events_encoding")),
                    str(reply.json().get("history_events_compressed")),
                )
            )
        ctx.require(
            count <= 1000,
            f"{what}: a page never holds more than 1000 events",
            expected="<= 1000 events, or 422",
            received=plural(count, "event"),
            replies=[reply],
            requirement=req,
        )

    for key in ("page_size", "history_page_size"):
        reply = await _page(ctx, run, after_sequence=0, **{key: 5000})
        if reply.status != 422:
            body = ctx.expect(reply, 200, what=f"history with {key} 5000")
            check_page(reply, body.get("history_events"), f"history with {key} 5000")
        # Reading 1005 events may take longer than the lease on a slow machine: renew it between the reads, so
        # the complete below is judged on the page cap alone, not on the suite's own speed.
        ctx.expect(await ctx.wf_call(run.task, "heartbeat"), 200, what="workflow-task heartbeat between reads")
    reply = await ctx.complete(run.task, [{"type": "start_timer", "delay_seconds": 0}])
    ctx.expect(reply, 200, what="a zero-delay timer")

    async def probe() -> Reply | None:
        poll = await ctx.poll_wf(run.worker, run.queue, 1, history_page_size=5000)
        return poll if poll.status == 422 or poll.json().get("task") else None

    poll = await ctx.wait_until(probe, timeout=15, what="a poll with history_page_size 5000 (422 or a lease)")
    if poll.status != 422:
        body = ctx.expect(poll, 200, what="poll with history_page_size 5000")
        check_page(poll, body["task"].get("history_events"), "poll with history_page_size 5000")


@check("HISTORY-INVALID-TOKEN")
async def history_invalid_page_token(ctx: CheckContext) -> None:
    """A next_history_page_token that is not base64 of a decimal sequence is 400 invalid_page_token."""
    run = await _long_run(ctx, 3)
    for token in ("!!not-base64!!", "LTE=", "YWJj", "MS41"):  # not base64, then base64 of -1, abc and 1.5
        reply = await _page(ctx, run, next_history_page_token=token)
        ctx.expect(reply, 400, "invalid_page_token", what=f"history with next_history_page_token {token!r}")
    reply = await _page(ctx, run, next_history_page_token="MQ==")
    ctx.expect(reply, 200, what="history with the valid token 'MQ==' (after sequence 1)")


@check("HISTORY-BOTH-CURSORS")
async def history_both_cursor_styles(ctx: CheckContext) -> None:
    """The poll and the history route emit both cursor styles, and accept both: after_sequence and the token
    lead to the same next page."""
    p = 5
    run = await _long_run(ctx, 20, history_page_size=p)
    req = "HISTORY-BOTH-CURSORS"
    emitted = {k: run.task.get(k) for k in ("has_more", "next_after_sequence", "next_history_page_token")}
    ctx.require(
        run.task.get("has_more") is True
        and run.task.get("next_after_sequence") == p
        and isinstance(run.task.get("next_history_page_token"), str),
        "a partial inline page carries both has_more/next_after_sequence and next_history_page_token",
        expected={"has_more": True, "next_after_sequence": p, "next_history_page_token": "<token>"},
        received=emitted,
    )
    by_seq = await _page(ctx, run, after_sequence=p, page_size=p)
    by_token = await _page(ctx, run, next_history_page_token=run.task["next_history_page_token"], page_size=p)
    a = _plain_events(ctx, by_seq, "history by after_sequence", req)
    b = _plain_events(ctx, by_token, "history by next_history_page_token", req)
    wanted = list(range(p + 1, 2 * p + 1))
    ctx.require(
        _seqs(a) == wanted and _seqs(b) == wanted,
        "both cursor styles lead to the same next page",
        expected=wanted,
        received={"after_sequence": _seqs(a), "next_history_page_token": _seqs(b)},
        replies=[by_seq, by_token],
    )
    for reply in (by_seq, by_token):
        body = reply.json()
        ctx.require(
            body.get("has_more") is True
            and body.get("next_after_sequence") == 2 * p
            and isinstance(body.get("next_history_page_token"), str),
            "a history page emits both cursor styles",
            expected={"has_more": True, "next_after_sequence": 2 * p, "next_history_page_token": "<token>"},
            received={k: body.get(k) for k in emitted},
            replies=[reply],
        )
    last = await _page(ctx, run, after_sequence=_size(run) - 1, page_size=p)
    body = ctx.expect(last, 200, what="the last history page")
    ctx.require(
        body.get("has_more") is False
        and body.get("next_after_sequence") is None
        and body.get("next_history_page_token") is None,
        "the last page ends both cursors: has_more false, next_after_sequence and the token null",
        expected={"has_more": False, "next_after_sequence": None, "next_history_page_token": None},
        received={k: body.get(k) for k in emitted},
        replies=[last],
    )


# -- One terminal event (invariants 29, 69) ---------------------------------------------------------------


@check("HISTORY-ONE-TERMINAL-PER-RUN")
async def history_one_terminal_event_per_run(ctx: CheckContext) -> None:
    """Racing a closing complete against cancel and terminate, then retrying them on the closed run, leaves
    exactly one terminal run event, matching the run's status."""

    def close(run: LeasedRun, verb: str) -> Awaitable[Reply]:
        return ctx.client.control("POST", f"/workflows/{run.workflow_id}/{verb}", {"reason": "conformance race"})

    def race(run: LeasedRun, n: int) -> list[Awaitable[Reply]]:
        if n == 0:
            return [ctx.complete(run.task, [{"type": "complete_workflow"}]), close(run, "terminate")]
        if n == 1:
            return [
                ctx.complete(run.task, [{"type": "fail_workflow", "message": "race"}]),
                close(run, "cancel"),
            ]
        return [
            close(run, "cancel"),
            close(run, "terminate"),
            ctx.complete(run.task, [{"type": "complete_workflow"}]),
        ]

    for n in range(3):
        run = await leased_run(ctx)
        replies = list(await asyncio.gather(*race(run, n)))
        # Everything again, now that the run is closed: each must be refused without a second terminal event.
        replies += list(await asyncio.gather(*race(run, n)))
        events = await ctx.history(run.workflow_id, run.run_id)
        terminal = [e.get("event_type") for e in events if e.get("event_type") in RUN_TERMINAL_EVENTS]
        ctx.require(
            len(terminal) == 1,
            "a run's history holds exactly one terminal run event",
            expected="one of " + ", ".join(sorted(RUN_TERMINAL_EVENTS)),
            received=terminal,
            replies=replies,
            requirement="HISTORY-ONE-TERMINAL-PER-RUN",
        )
        desc = await ctx.describe(run.workflow_id)
        ctx.require_equal(
            desc.get("status"),
            _STATUS_OF.get(str(terminal[0])),
            "the run's status is the one its terminal event records",
            replies=replies,
            requirement="HISTORY-ONE-TERMINAL-PER-RUN",
        )


@check("HISTORY-ONE-WORKFLOW-COMPLETED")
async def history_one_workflow_completed(ctx: CheckContext) -> None:
    """After a second complete or a fail of an already completed task (also sent concurrently), history
    shows exactly one WorkflowCompleted."""
    run = await leased_run(ctx)
    ctx.expect(await ctx.complete(run.task, [{"type": "complete_workflow"}]), 200, what="complete_workflow")
    again = await ctx.complete(run.task, [{"type": "complete_workflow"}])
    ctx.expect(again, 409, what="a second complete of the completed task")
    fail = await ctx.wf_call(run.task, "fail", {"failure": {"message": "late"}})
    ctx.expect(fail, 409, what="a fail of the completed task")
    # The same, raced: two completes of one lease at once.
    raced = await leased_run(ctx)
    both = await asyncio.gather(
        ctx.complete(raced.task, [{"type": "complete_workflow"}]),
        ctx.complete(raced.task, [{"type": "complete_workflow"}]),
    )
    ctx.require(
        sorted(r.status for r in both) == [200, 409],
        "of two concurrent completes exactly one succeeds",
        expected="[200, 409]",
        received=sorted(r.status for r in both),
        replies=list(both),
    )
    for r, replies in ((run, [again, fail]), (raced, list(both))):
        events = await ctx.history(r.workflow_id, r.run_id)
        count = sum(1 for e in events if e.get("event_type") == "WorkflowCompleted")
        ctx.require(
            count == 1,
            "history shows exactly one WorkflowCompleted",
            expected=1,
            received=[e.get("event_type") for e in events],
            replies=replies,
        )


@check("HISTORY-ONE-TERMINAL-PER-ATTEMPT")
async def history_one_terminal_event_per_attempt(ctx: CheckContext) -> None:
    """Duplicate, late and concurrent completes and fails of activity attempts leave at most one terminal
    event per activity_attempt_id in control-plane history."""
    run = await leased_run(ctx)
    activity = {
        "type": "schedule_activity",
        "activity_type": "conformance.Once",
        "arguments": ctx.envelope([]),
    }
    ctx.expect(await ctx.complete(run.task, [activity, activity, activity]), 200, what="three schedule_activity")
    tasks = [(await next_activity(ctx, run.worker, run.queue))[0] for _ in range(3)]

    def call(task: dict[str, Any], verb: str) -> Awaitable[Reply]:
        body: dict[str, Any] = {
            "activity_attempt_id": task.get("activity_attempt_id"),
            "lease_owner": run.worker,
        }
        body.update({"result": ctx.envelope(verb)} if verb == "complete" else {"failure": {"message": verb}})
        return ctx.client.worker(f"/activity-tasks/{task['task_id']}/{verb}", body)

    # 1: complete, a duplicate complete, a late fail. 2: complete and fail at once. 3: two fails at once.
    replies = [
        await call(tasks[0], "complete"),
        await call(tasks[0], "complete"),
        await call(tasks[0], "fail"),
    ]
    replies += await asyncio.gather(call(tasks[1], "complete"), call(tasks[1], "fail"))
    replies += await asyncio.gather(call(tasks[2], "fail"), call(tasks[2], "fail"))
    events = await ctx.history(run.workflow_id, run.run_id)
    terminal = [e for e in events if e.get("event_type") in ACTIVITY_OUTCOME_EVENTS]
    summary = [(e.get("event_type"), (e.get("payload") or {}).get("activity_attempt_id")) for e in terminal]
    ctx.require(
        len(terminal) == 3,
        "three activities with one attempt each close with three terminal events",
        expected="3 terminal activity events",
        received=summary,
        replies=replies,
    )
    keys = Counter(
        (e.get("payload") or {}).get("activity_attempt_id") for e in terminal if isinstance(e.get("payload"), dict)
    )
    repeated = {k: n for k, n in keys.items() if k is not None and n > 1}
    ctx.require(
        not repeated,
        "no activity_attempt_id has two terminal events",
        expected="at most one per attempt",
        received=repeated,
        replies=replies,
    )
    attempts = {t.get("activity_attempt_id") for t in tasks}
    named = {k for k in keys if k is not None}
    ctx.require(
        not named or named == attempts,
        "the terminal events name the three leased attempts",
        expected=sorted(str(a) for a in attempts),
        received=sorted(str(k) for k in named),
        replies=replies,
    )


# -- Compression (invariant 48, §8.5) ---------------------------------------------------------------------


def _compressed(reply: Reply) -> tuple[str, str] | None:
    body = reply.json()
    blob = body.get("history_events_compressed")
    return (str(body.get("history_events_encoding")), str(blob)) if blob is not None else None


@check("COMPRESSION-BELOW-THRESHOLD")
async def compression_below_threshold(ctx: CheckContext) -> None:
    """With gzip opted in, pages of fewer than 50 events (of a 60+ event run) come back uncompressed, inline
    on the poll and from the history route."""
    run = await _long_run(ctx, 60, history_page_size=THRESHOLD - 1, accept_history_encoding="gzip")
    ctx.require(
        "history_events_compressed" not in run.task and len(run.task.get("history_events") or []) == 49,
        "a 49-event inline page is not compressed, even with gzip opted in",
        expected="49 plain history_events",
        received={
            "history_events": len(run.task.get("history_events") or []),
            "history_events_encoding": run.task.get("history_events_encoding"),
        },
    )
    for what, fields in (
        ("a 49-event page", {"after_sequence": 0, "page_size": THRESHOLD - 1}),
        ("the last 10 events", {"after_sequence": _size(run) - 10, "page_size": 1000}),
        ("one event", {"after_sequence": 0, "page_size": 1}),
    ):
        for accept in ("gzip", "deflate", "gzip, deflate"):
            reply = await _page(ctx, run, accept_history_encoding=accept, **fields)
            body = ctx.expect(reply, 200, what=f"history of {what} with {accept!r}")
            ctx.require(
                _compressed(reply) is None and bool(body.get("history_events")),
                f"{what} (fewer than 50 events) is never compressed, even with {accept!r} opted in",
                expected="plain history_events, no history_events_compressed",
                received={
                    "history_events": len(body.get("history_events") or []),
                    "history_events_encoding": body.get("history_events_encoding"),
                },
                replies=[reply],
            )


def _judge_page(
    ctx: CheckContext, accept: str, what: str, body: dict[str, Any], replies: list[Reply], plain: list[Any]
) -> bool:
    """Judge one page offered ``accept``: compressed as offered and equal to ``plain`` once decoded, or left
    uncompressed and then plain. True when it was compressed (the round trip was observed)."""
    blob = body.get("history_events_compressed")
    if blob is None:
        # Not compressing is allowed (MAY); an uncompressed answer must then be the whole plain page.
        ctx.require(
            body.get("history_events") == plain,
            f"{what}, left uncompressed, holds the plain events",
            expected=plural(len(plain), "event"),
            received=len(body.get("history_events") or []),
            replies=replies,
            requirement="COMPRESSION-ROUNDTRIP",
        )
        return False
    encoding = body.get("history_events_encoding")
    ctx.require_equal(
        encoding,
        accept,
        f"{what} is compressed with the encoding the client offered",
        replies=replies,
        requirement="COMPRESSION-ABOVE-THRESHOLD",
    )
    ctx.require(
        body.get("history_events") == [],
        f"{what}: a compressed page has history_events []",
        expected="[]",
        received=plural(len(body.get("history_events") or []), "event"),
        replies=replies,
        requirement="COMPRESSION-ROUNDTRIP",
    )
    try:
        decoded = decompress_events(accept, str(blob))
    except ValueError as exc:
        raise ctx.fail(
            f"{what}: history_events_compressed does not decode",
            expected=f"base64 of {accept} JSON",
            received=str(exc),
            replies=replies,
            requirement="COMPRESSION-ROUNDTRIP",
        ) from None
    differ = [i for i, (x, y) in enumerate(zip(decoded, plain, strict=False)) if x != y][:3]
    ctx.require(
        decoded == plain,
        f"{what}: base64 → {accept} → JSON equals the uncompressed page",
        expected=f"the {plural(len(plain), 'plain event')}",
        received=f"{plural(len(decoded), 'event')}, differing at indexes {differ}",
        replies=replies,
        requirement="COMPRESSION-ROUNDTRIP",
    )
    return True


@check("COMPRESSION-ROUNDTRIP", "COMPRESSION-ABOVE-THRESHOLD")
async def compression_roundtrip(ctx: CheckContext) -> None:
    """A compressed page (gzip and deflate, on the history route and inline) has history_events [] and the
    offered encoding, and base64 → decompress → JSON equals the uncompressed page."""
    # The whole history inline, whatever default page size the target advertises.
    run = await _long_run(ctx, 64, accept_history_encoding="gzip", history_page_size=1000)
    plain = _plain_events(
        ctx,
        await _page(ctx, run, after_sequence=0, page_size=1000),
        "history without opt-in",
        "COMPRESSION-ROUNDTRIP",
    )
    ctx.require(
        len(plain) == _size(run) and len(plain) > THRESHOLD,
        "the uncompressed page holds the whole history",
        expected=plural(_size(run), "event"),
        received=len(plain),
        requirement="COMPRESSION-ROUNDTRIP",
    )
    inline = {
        "history_events": run.task.get("history_events"),
        "history_events_compressed": run.task.get("history_events_compressed"),
        "history_events_encoding": run.task.get("history_events_encoding"),
    }
    pages: list[tuple[str, str, dict[str, Any], list[Reply]]] = [("gzip", "the inline poll page", inline, [])]
    for accept in ("gzip", "deflate"):
        reply = await _page(ctx, run, after_sequence=0, page_size=1000, accept_history_encoding=accept)
        pages.append(
            (
                accept,
                f"a history page with {accept!r}",
                ctx.expect(reply, 200, what=f"history, {accept}", requirement="COMPRESSION-ROUNDTRIP"),
                [reply],
            )
        )
    observed = [accept for accept, what, body, replies in pages if _judge_page(ctx, accept, what, body, replies, plain)]
    if not observed:
        raise Unimplemented(
            "history compression",
            "the target compressed none of the 64-event pages offered gzip or deflate: compressing is the "
            "server's option, so the round trip does not apply",
        )


@check("COMPRESSION-OPT-IN-ONLY")
async def compression_opt_in_only(ctx: CheckContext) -> None:
    """Without accept_history_encoding, or with only unsupported encodings, a 60+ event page is plain."""
    req = "COMPRESSION-OPT-IN-ONLY"
    run = await _long_run(ctx, 64, history_page_size=1000)  # the whole history inline, whatever the default
    ctx.require(
        "history_events_compressed" not in run.task and len(run.task.get("history_events") or []) == _size(run),
        "a poll without opt-in carries the plain history_events",
        expected=f"{_size(run)} plain events",
        received={
            "history_events": len(run.task.get("history_events") or []),
            "history_events_encoding": run.task.get("history_events_encoding"),
        },
        requirement=req,
    )
    plain = _plain_events(ctx, await _page(ctx, run, after_sequence=0, page_size=1000), "history without opt-in", req)
    ctx.require_equal(len(plain), _size(run), "the plain page holds every event", requirement=req)
    for accept in ("br", "identity", "compress", "zstd, br", "x-gzip-not", ""):
        reply = await _page(ctx, run, after_sequence=0, page_size=1000, accept_history_encoding=accept)
        body = ctx.expect(reply, 200, what=f"history with accept_history_encoding {accept!r}", requirement=req)
        ctx.require(
            _compressed(reply) is None and body.get("history_events") == plain,
            f"an unsupported encoding ({accept!r}) is ignored: the page is the plain array",
            expected=plural(len(plain), "plain event"),
            received={
                "history_events": len(body.get("history_events") or []),
                "history_events_encoding": body.get("history_events_encoding"),
            },
            replies=[reply],
            requirement=req,
        )


@check("COMPRESSION-GZIP-PREFERRED")
async def compression_prefers_gzip(ctx: CheckContext) -> None:
    """With both gzip and deflate listed the server picks gzip; encoding names match case-insensitively."""
    run = await _long_run(ctx, 64)
    probe = await _page(ctx, run, after_sequence=0, page_size=1000, accept_history_encoding="gzip")
    ctx.expect(probe, 200, what="history with 'gzip'")
    if _compressed(probe) is None:
        raise Unimplemented(
            "history compression",
            "the target did not compress a 64-event page offered gzip: compressing is the server's option, so "
            "which encoding it prefers does not apply",
        )
    for accept in ("deflate, gzip", "deflate,gzip", "GZIP", "Deflate, GZip"):
        reply = await _page(ctx, run, after_sequence=0, page_size=1000, accept_history_encoding=accept)
        ctx.expect(reply, 200, what=f"history with {accept!r}")
        got = _compressed(reply)
        ctx.require(
            got is not None and got[0] == "gzip",
            f"accept_history_encoding {accept!r} gets gzip, as 'gzip' alone did",
            expected="history_events_encoding gzip",
            received=got[0] if got else "not compressed",
            replies=[probe, reply],
        )


SIGNALS = "SIGNAL-RECORDED-AND-WAKES"


UPDATES = "UPDATE-ACCEPTED-RECORDED"


# A long timer: the batch is non-terminal and nothing wakes the run while the check runs.
PARK = {"type": "start_timer", "delay_seconds": 3600}


async def _signal(ctx: CheckContext, workflow_id: str, name: str, what: str) -> Accepted:
    reply = await ctx.client.control("POST", f"/workflows/{workflow_id}/signal/{name}", {"input": [name]})
    ctx.expect(reply, 202, what=what, requirement=SIGNALS)
    return Accepted(Kind.SIGNAL, name)


async def _update(ctx: CheckContext, workflow_id: str, what: str) -> Accepted:
    body = {"input": [1], "wait_for": "accepted"}
    reply = await ctx.client.control("POST", f"/workflows/{workflow_id}/update/bump", body)
    answer = ctx.expect(reply, 202, what=what, requirement=UPDATES)
    update_id = answer.get("update_id")
    ctx.require(
        isinstance(update_id, str) and bool(update_id),
        "an accepted update's answer names its update_id",
        expected="a string",
        received=update_id,
        replies=[reply],
        requirement=UPDATES,
    )
    return Accepted(Kind.UPDATE, str(update_id))


@check(PAGINATION, SIGNALS, UPDATES)
async def signal_and_update_during_lease_read_next(ctx: CheckContext) -> None:
    """A signal and an update accepted while the run's workflow task is leased are in the history of the next
    task, exactly once, read in full over pages of 2 (inline) and 3, by either cursor."""
    run = await leased_run(ctx)
    accepted = [Accepted(Kind.START)]
    accepted.append(await _signal(ctx, run.workflow_id, ctx.uid("sig"), "a signal while the task is leased"))
    accepted.append(await _update(ctx, run.workflow_id, "an update while the task is leased"))
    ctx.expect(await ctx.complete(run.task, [PARK]), 200, what="the leased task's complete (a long timer)")
    accepted.append(Accepted(Kind.TIMER))
    task = await lease_wf(ctx, run.worker, run.queue, history_page_size=2)
    ctx.require_equal(task.get("run_id"), run.run_id, "the news of the lease wakes the run with a task of its own")
    await judge_task_history(ctx, task, accepted, inline=2, page_size=3)


@check(PAGINATION, UPDATES)
async def several_updates_read_once_each(ctx: CheckContext) -> None:
    """Three updates accepted on a waiting run are each in its next task's history exactly once, with no event
    repeated, read in full as the poll's default inline page (and the pages after it, if any)."""
    run = await leased_run(ctx)
    ctx.expect(await ctx.complete(run.task, [PARK]), 200, what="the first task's complete (a long timer)")
    accepted = [Accepted(Kind.START), Accepted(Kind.TIMER)]
    for n in (1, 2, 3):
        accepted.append(await _update(ctx, run.workflow_id, f"update {n} of 3 on a waiting run"))
    task = await lease_wf(ctx, run.worker, run.queue)
    await judge_task_history(ctx, task, accepted, inline=None, page_size=100)


@check(PAGINATION, SIGNALS, "EXPIRY-REDELIVER-SAME-TASK", slow=True)
async def redelivery_reads_the_current_history(ctx: CheckContext) -> None:
    """A workflow task redelivered after its lease expired shows the history as it is now: a signal accepted
    during the expired lease is there once, and every sequence up to last_history_sequence."""
    run = await leased_run(ctx)
    accepted = [Accepted(Kind.START), await _signal(ctx, run.workflow_id, ctx.uid("sig"), "a signal while leased")]
    reply = await ctx.wf_call(run.task, "heartbeat")
    body = ctx.expect(reply, 200, what="the holder's heartbeat (its lease's end, on the target's clock)")
    lease = await wait_out_lease(ctx, body, reply, WF_LEASE, what="the holder's heartbeat answer")
    task = await lease_wf(ctx, run.worker, run.queue, within=lease + READY_WITHIN, history_page_size=2)
    ctx.require_equal(
        (task.get("task_id"), task.get("run_id")),
        (run.task.get("task_id"), run.run_id),
        "the expired task is the one redelivered",
        requirement="EXPIRY-REDELIVER-SAME-TASK",
    )
    await judge_task_history(ctx, task, accepted, inline=2, page_size=2)
