"""The query rules of the query, signal and update machine: it queries runs and plays the query worker itself.

A query (§10.1) is sent from the control plane in the background; the machine, as the worker, polls the query
task, lets intruders report first (a wrong ``lease_owner``, a wrong ``query_task_attempt``: §10.6 fencing), gives
its answer (a result, or a failure whose reason decides the caller's status, §10.4), reports once more late, and
judges what the caller got. Around it, history and describe are read right before and right after the query:
a query never changes either (§16.60). :class:`QueryWorker` is the base the machine builds on; what it needs of
the machine is ``workers`` registered on its ``queue`` and its ``runs`` bundle of
:class:`~suite.machines.messages.MessageRun`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, rule

from suite.client import Reply
from suite.outcomes import HarnessError
from suite.protocol.fencing import QueryTaskView, parse_rfc3339
from suite.protocol.lifecycles import QueryTaskStatus

from .base import MachineBase, note
from .messages import (
    QUERY_ANSWERS,
    QUERY_REQUIREMENT_FOR,
    MessageRun,
    Slot,
    judge_query_reply,
    judge_read_only,
    query_outcomes,
)

__all__ = ["QueryWorker", "outcome_of", "settle"]

DEFAULT_QUERY_TIMEOUT = 30.0


class QueryWorker(MachineBase):
    """A machine that queries its runs and serves the queries as their worker, judged by the model."""

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.serial = itertools.count(1)
        profile = self.target.test_profile if self.target else {}
        timeout = profile.get("query_task_timeout_seconds")
        self.query_timeout = DEFAULT_QUERY_TIMEOUT
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
            self.query_timeout = float(timeout)
        self.unprobed = False  # a wake was coalesced or a query ran since the last empty-queue probe

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.serial)}"

    def history(self, run: MessageRun) -> list[dict[str, Any]]:
        return self.run(self.ctx.history(run.workflow_id, run.run_id))

    def snapshot(self, run: MessageRun) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
        describe = self.run(self.ctx.describe(run.workflow_id))
        events = [(e.get("sequence"), e.get("event_type")) for e in self.history(run)]
        return describe, events

    def lease_query(self, run: MessageRun, name: str, call: asyncio.Task[Reply], worker: str) -> dict[str, Any] | None:
        """Poll query tasks until this query's task is leased to ``worker``."""
        loop_deadline = self.now() + timedelta(seconds=self.query_timeout + 2)
        while self.now() < loop_deadline:
            if call.done():
                if isinstance(call.exception(), HarnessError):
                    return None
                early = call.result()
                raise self.violation(
                    "QUERY-TASK-CREATED",
                    "the query ended before any worker leased its query task",
                    expected="a query task for a registered, polling worker",
                    received=f"{early.status} {early.reason}",
                    replies=[early],
                )
            reply = self.call(self.ctx.poll("query", worker, self.queue))
            if reply is None:
                return None
            task = self.check_poll_shape(reply, "query-task").get("task")
            if not isinstance(task, dict):
                continue
            if task.get("query_name") != name:
                note(f"leased a leftover query task {task.get('query_task_id')} ({task.get('query_name')})")
                continue
            self.judge_query_task(task, run, worker, reply)
            self.reached("query_leased")
            return task
        return None

    def judge_query_task(self, task: dict[str, Any], run: MessageRun, worker: str, reply: Reply) -> None:
        """§10.2: the leased query task describes the query that was sent, as attempt 1 of the poller."""
        problems = [
            f"{key}={task.get(key)!r}, expected {want!r}"
            for key, want in (
                ("query_task_attempt", 1),
                ("lease_owner", worker),
                ("run_id", run.run_id),
                ("workflow_id", run.workflow_id),
            )
            if task.get(key) != want
        ]
        if problems:
            raise self.violation(
                "QUERY-TASK-CREATED",
                "the leased query task describes the query that was sent",
                expected="attempt 1, the poller as lease_owner, the queried run",
                received=problems,
                replies=[reply],
            )

    def query_report(
        self,
        view: QueryTaskView,
        verb: str,
        body: dict[str, Any],
        owner: str,
        attempt: int,
        deadline: tuple[datetime, datetime],
    ) -> str | None:
        allowed = query_outcomes(view, owner, attempt, deadline, self.now(), self.MARGIN)
        reply = self.call(
            self.ctx.client.worker(
                f"/query-tasks/{view.query_task_id}/{verb}",
                {"lease_owner": owner, "query_task_attempt": attempt, **body},
            )
        )
        if reply is None:
            return None
        got = self.outcome(reply)
        if got not in allowed:
            rejections = sorted(allowed - {"ok"})
            if "ok" in allowed and got != "ok":
                req = "QUERY-RESULT-ROUNDTRIP"
            else:
                req = next(
                    (QUERY_REQUIREMENT_FOR[r] for r in rejections if r in QUERY_REQUIREMENT_FOR), "QUERY-FENCE-OWNER"
                )
            raise self.disallowed(req, f"query-task {verb} by {owner} attempt {attempt}", allowed, reply)
        if got != "ok" and reply.json().get("outcome") != "rejected":
            raise self.violation(
                QUERY_REQUIREMENT_FOR.get(got, "QUERY-FENCE-OWNER"),
                f'a fenced query-task {verb} carries outcome "rejected" (docs/reference.md: Queries)',
                expected="rejected",
                received=reply.json().get("outcome"),
                replies=[reply],
            )
        return got

    @rule(
        run=runs,
        fence=st.sampled_from(["none", "owner", "attempt", "both"]),
        late=st.sampled_from(["none", "complete", "fail"]),
    )
    def query_answered(self, run: MessageRun, fence: str, late: str) -> None:
        """A query the worker answers with a result envelope: the caller gets it back unchanged (200)."""
        self.query(run, "complete", fence, late)

    @rule(
        run=runs,
        answer=st.sampled_from(["unknown", "rejected", "custom"]),
        fence=st.sampled_from(["none", "owner", "attempt", "both"]),
        late=st.sampled_from(["none", "complete", "fail"]),
    )
    def query_refused(self, run: MessageRun, answer: str, fence: str, late: str) -> None:
        """A query the worker fails: rejected_unknown_query is 404 to the caller, any other reason 409."""
        self.query(run, answer, fence, late)

    def query(self, run: MessageRun, answer: str, fence: str, late: str) -> None:
        """Query a running or closed run: the machine is the query worker (with intruders before and a late
        second report after); the caller gets the answer's status, and neither history nor describe change."""
        name = self.unique("qry")
        if not run.open:
            self.reached("query_on_closed_run")
        elif run.slot is Slot.LEASED and run.task is not None and run.task.expires > self.now():
            self.reached("query_while_leased")
        before = self.snapshot(run)
        sent = self.now()
        call = self.loop.create_task(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/query/{name}", {"input": [name]}, timeout=self.query_timeout + 15
            )
        )
        try:
            served = self.serve_query(run, name, answer, fence, late, sent, call)
        finally:
            self.run(settle(call))
            self.unprobed = self.unprobed or run.slot is Slot.NONE
            run.queried = True
        if served and not run.uncertain:
            with self.judged():
                judge_read_only(run.run_id, before, self.snapshot(run))
            self.reached("query_read_only_checked")

    def serve_query(
        self, run: MessageRun, name: str, answer: str, fence: str, late: str, sent: datetime, call: asyncio.Task[Reply]
    ) -> bool:
        """The machine as the query worker: lease the query task, let intruders report first (``fence``), give
        ``answer``, report once more (``late``), then judge what the caller got. False when it could not go
        on (no query task leased, or the caller's answer was lost)."""
        worker, intruder = self.workers[0], self.workers[1]
        task = self.lease_query(run, name, call, worker)
        if task is None:
            return False
        timeout = timedelta(seconds=self.query_timeout)
        deadline = (sent + timeout, self.now() + timeout)
        attempt = int(task["query_task_attempt"])
        view = QueryTaskView(
            str(task["query_task_id"]),
            QueryTaskStatus.LEASED,
            attempt,
            worker,
            parse_rfc3339(task.get("lease_expires_at")),
        )
        stolen = {"result_envelope": self.ctx.envelope("stolen")}
        for kind, owner, number, state in (
            ("owner", intruder, attempt, "query_fenced_owner"),
            ("attempt", worker, attempt + 1, "query_fenced_attempt"),
        ):
            if fence in (kind, "both"):
                got = self.query_report(view, "complete", stolen, owner, number, deadline)
                if got == ("lease_owner_mismatch" if kind == "owner" else "query_task_attempt_mismatch"):
                    self.reached(state)
        reason, _, _ = QUERY_ANSWERS[answer]
        result = self.ctx.envelope({"query": name})
        if reason is None:
            verb, body = "complete", {"result_envelope": result}
        else:
            verb, body = "fail", {"failure": {"message": f"conformance {answer}", "reason": reason}}
        got = self.query_report(view, verb, body, worker, attempt, deadline)
        landed = None if got is None else got == "ok"  # did the worker's answer land (None: unknown)
        if landed:
            status = QueryTaskStatus.COMPLETED if verb == "complete" else QueryTaskStatus.FAILED
            view = QueryTaskView(view.query_task_id, status, attempt, worker, view.lease_expires_at)
        if late != "none" and landed:
            late_body = (
                {"result_envelope": self.ctx.envelope("late")}
                if late == "complete"
                else {"failure": {"message": "late"}}
            )
            if self.query_report(view, late, late_body, worker, attempt, deadline) == "query_task_not_leased":
                self.reached("query_late_report_fenced")
        try:
            reply = self.run(outcome_of(call))
        except HarnessError:
            self.reached("response_lost")
            return False
        note(reply.exchange.summary())
        self.judge_query_answer(reply, landed, answer, result)
        return True

    def judge_query_answer(self, reply: Reply, landed: bool | None, answer: str, result: dict[str, str]) -> None:
        """What the caller got: the worker's answer once it landed (§10.4), else a timeout (504, §10.5)."""
        if landed is None:
            return
        if not landed:
            message = "a query whose answer came too late times out"
            self.expect_status(reply, 504, "QUERY-TIMEOUT-504", message, "504 query_worker_timeout")
            return
        with self.judged(reply):
            state = judge_query_reply(reply.status, reply.reason, reply.json(), answer, result)
        if state is not None:
            self.reached(state)


async def outcome_of(call: asyncio.Task[Reply]) -> Reply:
    """Await a background control-plane call (its HarnessError, if any, propagates)."""
    return await call


async def settle(call: asyncio.Task[Reply]) -> None:
    """Cancel a background control-plane call the rule no longer waits for."""
    if not call.done():
        call.cancel()
    with contextlib.suppress(BaseException):
        await call
