"""Multi-step histories read back in full (PROTOCOL.md §8.2, §8.4, §9, §11.6; invariants 41, 45, 55).

A bug that shows only after a particular sequence of steps — a signal accepted while the run's task was
leased, a second update, a redelivery after expiry, a retry after a heartbeating attempt, a chain of
continuations — passes every check that builds a one-step history. Each check here makes one such history on
purpose, reads it back in full (every page, following the cursor) and hands it to the history oracle
(:mod:`suite.protocol.oracle`) with what the target acknowledged, in order. The state machines make the same
histories at random and judge them the same way; these checks make them in every run, in a few requests, so
a server broken in one of them fails in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.protocol.errors import Violation
from suite.protocol.oracle import Accepted, Kind, Page, join_pages, judge_history, page_of
from suite.registry import check
from suite.worlds import (
    READY_WITHIN,
    WF_LEASE,
    activity_call,
    lease_activity,
    lease_wf,
    leased_run,
    schedule_activities,
    wait_out_lease,
)

PAGINATION = "HISTORY-PAGINATION-COMPLETE"
SIGNALS = "SIGNAL-RECORDED-AND-WAKES"
UPDATES = "UPDATE-ACCEPTED-RECORDED"
ATTEMPTS = "RETRY-ATTEMPTS-CONTIGUOUS"
# A long timer: the batch is non-terminal and nothing wakes the run while the check runs.
PARK = {"type": "start_timer", "delay_seconds": 3600}


@contextmanager
def oracle(ctx: CheckContext, replies: Iterable[Reply] = ()) -> Iterator[None]:
    """The oracle's :class:`Violation` as this check's failure, with the requirement the oracle names."""
    try:
        yield
    except Violation as v:
        raise ctx.fail(
            v.message, expected=v.expected, received=v.received, replies=list(replies), requirement=v.requirement
        ) from None


async def read_in_full(
    ctx: CheckContext, task: Mapping[str, Any], *, inline: int | None, page_size: int, token: bool = False
) -> tuple[list[dict[str, Any]], list[Reply]]:
    """Every event of a leased task's worker-plane history: its inline page (asked with ``history_page_size``
    ``inline``), then each page its cursor names, ``page_size`` at a time, by ``after_sequence`` or, with
    ``token``, by ``next_history_page_token``. Returns the events and the history replies."""
    replies: list[Reply] = []
    with oracle(ctx, replies):
        pages: list[Page] = [page_of(task, after=0, page_size=inline)]
        limit = int(task.get("last_history_sequence") or 0) + 2
        while pages[-1].has_more:
            if len(pages) > limit:
                raise ctx.fail(
                    f"the history cursor did not end after {limit} pages",
                    expected=f"at most {limit} pages",
                    replies=replies[-2:],
                    requirement=PAGINATION,
                )
            last = pages[-1]
            cursor: dict[str, Any] = {"after_sequence": last.next_after}
            if token and last.token:
                cursor = {"next_history_page_token": last.token}
            reply = await ctx.wf_call(dict(task), "history", {**cursor, "page_size": page_size})
            replies.append(reply)
            body = ctx.expect(reply, 200, what=f"history page after sequence {last.next_after}", requirement=PAGINATION)
            pages.append(page_of(body, after=int(last.next_after or 0), page_size=page_size))
        return join_pages(pages), replies


async def judge_task_history(
    ctx: CheckContext, task: Mapping[str, Any], accepted: list[Accepted], *, inline: int | None, page_size: int
) -> None:
    """Read ``task``'s history in full both ways — by ``after_sequence`` and by the token — and judge each
    against what the run acknowledged before the task's poll left."""
    for token in (False, True):
        events, replies = await read_in_full(ctx, task, inline=inline, page_size=page_size, token=token)
        with oracle(ctx, replies):
            judge_history(events, accepted, last_sequence=_int(task.get("last_history_sequence")))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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


@check(ATTEMPTS)
async def retry_after_heartbeat_numbers_run_on(ctx: CheckContext) -> None:
    """An attempt that heartbeated and then failed is retried as attempt 2, and the retry's heartbeat is
    recorded as attempt 2: every event of an attempt carries its lease's number."""
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 3, "backoff_seconds": [0]}, requirement=ATTEMPTS)
    accepted: list[Accepted] = []
    replies: list[Reply] = []
    for number in (1, 2):
        task = await lease_activity(ctx, run, requirement=ATTEMPTS)
        accepted.append(
            Accepted(
                Kind.ATTEMPT,
                str(task.get("activity_attempt_id")),
                scope=str(task.get("activity_execution_id")),
                number=_int(task.get("attempt_number")),
            )
        )
        reply = await activity_call(ctx, task, "heartbeat", {"message": f"attempt {number} at work"})
        ctx.expect(reply, 200, what=f"the heartbeat of lease {number}")
        verb, body = (
            ("fail", {"failure": {"message": "retry me"}})
            if number == 1
            else ("complete", {"result": ctx.envelope("done")})
        )
        reply = await activity_call(ctx, task, verb, body)
        ctx.expect(reply, 200, what=f"the {verb} of lease {number}")
        replies.append(reply)
    events = await ctx.history(run.workflow_id, run.run_id)
    with oracle(ctx, replies):
        judge_history(events, accepted)


@check("COMMANDS-CONTINUE-AS-NEW")
async def continue_as_new_chain_names_each_run(ctx: CheckContext) -> None:
    """Down a chain of two continuations, the first task of each new run names that run (the one describe
    shows, run_number 2 then 3), and its history is read in full."""
    run = await leased_run(ctx, input=["run 1"])
    task = run.task
    for number in (2, 3):
        command = {"type": "continue_as_new", "arguments": ctx.envelope([f"run {number}"])}
        ctx.expect(await ctx.complete(task, [command]), 200, what=f"continue_as_new into run {number}")
        desc = await ctx.describe(run.workflow_id)
        ctx.require_equal(desc.get("run_number"), number, f"describe shows run {number} of the chain")
        task = await lease_wf(ctx, run.worker, run.queue, within=READY_WITHIN)
        ctx.require_equal(
            (task.get("workflow_id"), task.get("run_id")),
            (run.workflow_id, desc.get("run_id")),
            f"the first task after continuation {number - 1} names the new run {number}",
        )
        await judge_task_history(ctx, task, [Accepted(Kind.START)], inline=None, page_size=1000)
