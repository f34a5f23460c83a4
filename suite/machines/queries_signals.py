"""The query, signal and update machine: control-plane messages against runs whose workflow tasks are leased.

Rules start runs, lease and complete workflow tasks (hour-long timers, ``complete_workflow``,
``complete_update`` / ``fail_update`` and batches that close an update twice), signal and update running and
closed runs, block on an update with ``wait_for:"completed"`` while the machine plays the worker that closes
it, query running and closed runs while the machine plays the query worker (fenced intruders, wrong attempts,
the answer, a late second report), and cancel or terminate runs.

The model keeps, per run, its status, the one workflow-task *slot* the protocol allows (none, ready,
leased, or "maybe" where the protocol allows either), the history changes that arrived while its task was
leased, its open and closed updates, and every signal and update name it sent. It says what each answer
must be before the answer is read:

- a query never changes history or describe (snapshots taken right before and right after the query, inside
  the query rule, so signals and updates elsewhere cannot blur the comparison);
- a signal or update to an open run is accepted and recorded once, to a closed run refused (409) and never
  recorded;
- at most one workflow task per run is open: a wake that arrives while a task is ready or leased is
  coalesced into it, and no poll ever leases a second task of the same run while the first is open;
- an update is closed at most once; histories are gap-free with at most one terminal event.

The judges are pure functions in :mod:`suite.machines.messages`.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, precondition, rule

from suite.client import Reply
from suite.outcomes import HarnessError, Indeterminate
from suite.protocol.coverage import Actor
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.lifecycles import RunEvent, RunStatus, TaskEvent, TaskStatus
from suite.protocol.oracle import Applied, Kind
from suite.protocol.promises import advertised
from suite.protocol.requirements import REGISTRY
from suite.text import plural

from .base import Polled, note, race
from .cells import update_state
from .messages import (
    BATCH_DRAWS,
    PROPOSED,
    SIGNAL_CLOSED,
    SIGNAL_RECORDED,
    UPDATE_CLOSED,
    UPDATE_ONCE,
    UPDATE_RECORDED,
    WF_REQUIREMENT_FOR,
    MessageRun,
    MessageTask,
    Slot,
    batch,
    judge_messages,
    judge_slot,
    judge_update_reply,
)
from .query_sweep import sweep_query_cells
from .query_worker import QueryWorker, outcome_of, settle
from .update_sweep import sweep_cold_cells
from .world import workflow_view

__all__ = ["PROPOSED", "QuerySignalMachine"]

UPDATE_VERBS = ("complete_update", "fail_update")
# The requirements the update sweep judges only where a worker that does not hold the task, or the holder of a
# closed update, acts (suite.machines.runner.judged_cells).
UPDATE_CELLS: dict[str, tuple[str, ...]] = {
    "FENCE-OWNER": ("update/*/*/other_worker",),
    "UPDATE-CLOSED-AT-MOST-ONCE": ("update/completed/*_update/holder", "update/failed/*_update/holder"),
}

WORKERS = 4
UPDATE_WAIT = 10  # wait_timeout_seconds of a blocking update
PROBES_PER_EXAMPLE = 1  # empty-queue polls (each holds the 1 s long-poll minimum)
MESSAGE_ROUNDS = 2  # messages_while_leased per example: enough for the hard history, the rest left to the others

RunM = MessageRun
TaskM = MessageTask


def sweep_messages(m: QuerySignalMachine) -> None:
    """Every update and query-task cell the examples left cold, made deterministically
    (:mod:`suite.machines.update_sweep`, :mod:`suite.machines.query_sweep`)."""
    m.setup()
    m.sweep_rounds(lambda: sweep_cold_cells(m))
    if m.target is not None and advertised(m.target.server_capabilities.get("query_tasks")):
        m.sweep_rounds(lambda: sweep_query_cells(m))


class QuerySignalMachine(QueryWorker):
    """Queries, signals and updates against running and closed runs, judged by the model."""

    name = "queries_signals"
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {
        "QUERY-TASK-CREATED": "query_leased",
        "QUERY-READ-ONLY": "query_read_only_checked",
        "QUERY-RESULT-ROUNDTRIP": "query_result_roundtrip",
        "QUERY-UNKNOWN-404": "query_unknown_404",
        "QUERY-REJECTED-409": "query_rejected_409",
        "QUERY-FENCE-OWNER": "query_fenced_owner",
        "QUERY-FENCE-ATTEMPT": "query_fenced_attempt",
        "QUERY-LATE-COMPLETE-NOT-LEASED": "query_late_report_fenced",
        "CONTROL-CANCEL-CLOSES-RUN": "closed_run_command_refused",
        # The sweep's worker that does not hold the task closing an update with it.
        "FENCE-OWNER": "non_holder_complete_fenced",
        "CANCEL-NO-NEW-LEASES": "run_closed_by_control",
        "LEASE-NOT-SHARED-WHILE-LIVE": "poll_while_wake_coalesced",
        "HISTORY-SEQUENCE-CONTIGUOUS": None,
        "HISTORY-ONE-TERMINAL-PER-RUN": None,
        # Judged on the full history of every leased task, against what its run had acknowledged (the oracle).
        "HISTORY-PAGINATION-COMPLETE": "two_updates_on_one_run_read",
        **{rid: state for rid, (_, state) in PROPOSED.items() if rid in REGISTRY},
    }

    REQUIREMENT_CELLS: ClassVar[dict[str, tuple[str, ...]]] = UPDATE_CELLS

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.all_runs: list[RunM] = []
        self.run_by_id: dict[str, RunM] = {}
        self.task_by_id: dict[str, TaskM] = {}
        self.turn = itertools.count()
        self.probes_left = PROBES_PER_EXAMPLE
        self.message_rounds = 0

    # -- model helpers -------------------------------------------------------------------------------

    def next_worker(self) -> str:
        return self.workers[next(self.turn) % len(self.workers)]

    def ready_runs(self) -> list[RunM]:
        """Runs the model knows have a claimable task: ready, or leased with a lease long expired."""
        before = self.now() - timedelta(seconds=self.MARGIN)
        return [
            r
            for r in self.all_runs
            if r.open
            and not r.uncertain
            and (r.slot is Slot.READY or (r.slot is Slot.LEASED and r.task is not None and r.task.expires < before))
        ]

    def unsure(self) -> bool:
        """Whether some open run may hold a task the model cannot count."""
        return any(r.open and (r.uncertain or r.slot is Slot.MAYBE) for r in self.all_runs)

    def leased_tasks(self) -> list[TaskM]:
        """Tasks the model holds a lease on (live, expired, or of a run closed since), newest first."""
        return [t for t in reversed(self.task_by_id.values()) if t.status is TaskStatus.LEASED and not t.uncertain]

    def update_candidates(self) -> list[RunM]:
        """Open runs the worker can serve an update on: no lease, or a lease with time to spare."""
        soon = self.now() + timedelta(seconds=self.MARGIN + 1.5)
        return [
            r
            for r in self.all_runs
            if r.open
            and not r.uncertain
            and (
                r.slot in (Slot.NONE, Slot.READY)
                or (r.slot is Slot.LEASED and r.task is not None and r.task.expires > soon)
            )
        ]

    def wake(self, run: RunM, cause: str) -> None:
        """A signal or update reached an open run: it gets a task, or the news joins its open one."""
        if run.slot is Slot.NONE:
            run.slot = Slot.READY
            run.step(RunEvent.WAKE)
            return
        run.coalesced += 1
        self.unprobed = True
        if run.slot is Slot.LEASED:
            run.pending.add(cause)
            if run.task is not None and run.task.expires > self.now():
                self.reached("wake_coalesced_while_leased")
                run.news_while_leased.add(cause.split(":", 1)[0])
        else:
            run.slot = Slot.READY  # READY stays READY; MAYBE becomes certain: one task either way
            self.reached("wake_coalesced_while_ready")

    def close(self, run: RunM, event: RunEvent) -> None:
        run.step(event)
        run.slot, run.pending = Slot.NONE, set()

    def wf_outcomes(self, task: TaskM, at: datetime) -> set[str]:
        """The outcomes §8.9 allows for the holder's call at ``at`` ± MARGIN ('ok' or a reason)."""
        return self.workflow_outcomes(workflow_view(task, task.run), task.owner, task.attempt, at)

    # -- requests ------------------------------------------------------------------------------------

    def note_coalesced_poll(self) -> None:
        live = self.now()
        if any(
            r.open and r.slot is Slot.LEASED and r.pending and r.task is not None and r.task.expires > live
            for r in self.all_runs
        ):
            self.reached("poll_while_wake_coalesced")

    # -- leases --------------------------------------------------------------------------------------

    def adopt(self, polled: Polled, worker: str) -> TaskM:
        """Judge a granted workflow-task lease against the run's slot, record it, then read its history back
        in full and judge it by what the run had acknowledged before the poll left."""
        task_obj, reply = polled.task, polled.reply
        assert task_obj is not None
        assert reply is not None
        run = self.leased_run(task_obj, worker, self.run_by_id, reply)
        task_id = str(task_obj.get("task_id"))
        attempt = task_obj.get("workflow_task_attempt")
        expires = parse_rfc3339(task_obj.get("lease_expires_at"))
        if not isinstance(attempt, int):
            raise self.violation(
                "LEASE-FIRST-ATTEMPT", "workflow_task_attempt is an integer", received=attempt, replies=[reply]
            )
        if not run.uncertain:
            with self.judged(reply):
                judge_slot(run, task_id, attempt, polled.received, self.MARGIN)
        task = self.task_by_id.get(task_id)
        if task is None:
            task = TaskM(task_id=task_id, run=run, attempt=attempt, owner=worker, expires=expires)
            self.task_by_id[task_id] = task
        else:  # a redelivery of the same task after its lease expired
            task.claim(worker, attempt, expires)
            task.uncertain = False
        run.task, run.slot, run.pending, run.queried = task, Slot.LEASED, set(), False
        news, run.news_while_leased = run.news_while_leased, set()
        if run.status is RunStatus.WAITING:
            run.step(RunEvent.WAKE)
        self.reached("lease_granted")
        if self.read_back(task_obj, polled, worker, attempt) is not None:
            self.reached_by_history(run, news, polled.acked.get(run.run_id, 0))
        return task

    def reached_by_history(self, run: RunM, news: set[str], acked: int) -> None:
        """The hard histories a judged read showed: a signal and an update accepted while the run's previous
        task was leased, and two or more updates on one run."""
        if {"signal", "update"} <= news:
            self.reached("signal_and_update_while_leased_read")
        updates = [a for a in self.acks.get(run.run_id, [])[:acked] if a.kind is Kind.UPDATE]
        if len(updates) >= 2:
            self.reached("two_updates_on_one_run_read")

    def poll_wf(self, worker: str) -> Polled:
        self.note_coalesced_poll()
        style = self.next_read()
        return self.poll_once(self.ctx.poll_wf(worker, self.queue, 1, **style.poll_fields()), style=style)

    def lost_poll(self) -> None:
        """A poll without an answer (or resent after one was lost) may have leased any ready run's task."""
        for r in self.all_runs:
            if r.slot is Slot.READY:
                r.uncertain = True

    def lease_run_task(self, run: RunM, why: str) -> TaskM | None:
        """Poll until the run's ready task is leased (adopting any other run's ready task on the way)."""
        for _ in range(len(self.all_runs) + 2):
            worker = self.next_worker()
            polled = self.poll_wf(worker)
            if polled.reply is None:
                run.uncertain = True
                return None
            if polled.task is None:
                if polled.body.get("poll_status") == "throttled" or run.uncertain:
                    return None
                raise self.violation(
                    SIGNAL_RECORDED if why == "signal" else UPDATE_RECORDED,
                    f"run {run.run_id} was woken by an accepted {why} but no workflow task could be leased",
                    expected="a leased workflow task of the run",
                    received=polled.body.get("poll_status"),
                    replies=[polled.reply],
                )
            task = self.adopt(polled, worker)
            if task.run is run:
                return task
        return None

    # -- the complete path ---------------------------------------------------------------------------

    def complete(
        self,
        task: TaskM,
        commands: list[dict[str, Any]],
        closes: set[str],
        invalid: bool,
        label: str,
        owner: str | None = None,
    ) -> str | None:
        """The holder (or ``owner``, a worker that does not hold it) completes ``task`` with ``commands``; judged,
        then applied to the model."""
        run = task.run
        owner = task.owner if owner is None else owner
        at = self.now()
        allowed = self.workflow_outcomes(workflow_view(task, run), owner, task.attempt, at)
        if invalid and "ok" in allowed:
            allowed = (allowed - {"ok"}) | {"invalid_commands", "validation_failed"}
        # The update cells of the commands that name an update, as the model holds them before the call.
        named = [(c, update_state(run, str(c.get("update_id")))) for c in commands if c.get("type") in UPDATE_VERBS]
        reply = self.call(self.ctx.complete({"task_id": task.task_id}, commands, owner=owner, attempt=task.attempt))
        if reply is None:
            task.uncertain = run.uncertain = True
            if not invalid:
                self.ack_batch(run, commands, Applied.MAYBE)
            return None
        self.touched.add(run.run_id)
        got = self.outcome(reply)
        if not (task.uncertain or run.uncertain) and got not in allowed:
            rejections = sorted(allowed - {"ok"})
            if invalid and got == "ok":
                req = UPDATE_ONCE
            elif got != "ok" and "ok" in allowed:
                req = UPDATE_RECORDED if closes and got == "invalid_commands" else "FENCE-NO-STATE-CHANGE"
            else:
                req = next((WF_REQUIREMENT_FOR[r] for r in rejections if r in WF_REQUIREMENT_FOR), "FENCE-ORDER")
            raise self.disallowed(req, f"workflow-task complete ({label})", allowed, reply)
        unsure = task.uncertain or run.uncertain
        if not unsure:
            actor = Actor.HOLDER if owner == task.owner else Actor.OTHER_WORKER
            for command, state in named:
                if state is not None:
                    self.hit("update", state, str(command["type"]), actor)
        if owner != task.owner:
            if got == "lease_owner_mismatch":
                self.reached("non_holder_complete_fenced")
            return got  # refused (the model allows nothing else): the task stays as it was
        if got == "run_closed" and task.status is not TaskStatus.CANCELLED:
            task.step(TaskEvent.CANCEL, unsure=unsure)  # §9.1: the run's close cancelled it; stop offering it
            self.reached("complete_on_closed_run")
        if invalid and got in ("invalid_commands", "validation_failed"):
            self.reached("update_double_close_rejected")
        if got != "ok":
            return got
        task.step(TaskEvent.COMPLETE, unsure=unsure)
        self.applied(task, commands, closes)
        return got

    def ack_batch(self, run: RunM, commands: list[dict[str, Any]], applied: Applied = Applied.YES) -> None:
        """What an accepted (or maybe applied) batch leaves in the run's history (§8.7.1)."""
        for c in commands:
            kind = {"start_timer": Kind.TIMER, "complete_workflow": Kind.COMPLETE}.get(str(c.get("type")))
            if c.get("type") in ("complete_update", "fail_update"):
                self.ack(run.run_id, Kind.UPDATE_CLOSED, str(c.get("update_id")), applied=applied)
            elif kind is not None:
                self.ack(run.run_id, kind, applied=applied)

    def applied(self, task: TaskM, commands: list[dict[str, Any]], closes: set[str]) -> None:
        """An accepted batch moves the run: closed, waiting, or due a follow-up task for the news its lease saw."""
        run = task.run
        self.ack_batch(run, commands)
        verbs = {str(c.get("update_id")): c.get("type") for c in commands if c.get("type") in UPDATE_VERBS}
        for uid in closes:
            run.open_updates.pop(uid, None)
            run.closed_updates.add(uid)
            run.update_outcomes[uid] = "completed" if verbs.get(uid) == "complete_update" else "failed"
            self.reached("update_closed_by_task")
        if any(c.get("type") == "complete_workflow" for c in commands):
            self.close(run, RunEvent.BATCH_COMPLETE)
            return
        news = run.pending - {f"update:{uid}" for uid in closes}
        if news:
            run.slot = Slot.READY  # coalesced news needs a follow-up task
            self.reached("follow_up_task_expected")
        elif run.pending:
            run.slot = Slot.MAYBE  # the only news was the update this batch just closed
        else:
            run.slot = Slot.NONE
            run.step(RunEvent.BATCH_OPEN_WAITS, unsure=task.uncertain)
        run.pending, run.task, run.queried = set(), None, False

    # -- rules: runs and workflow tasks ----------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        self.register_workers(WORKERS)

    @rule(target=runs)
    def start(self) -> RunM:
        return self.new_run()

    def new_run(self) -> RunM:
        wid, run_id = self.run(self.ctx.start(self.queue, input=["queries-signals"]))
        run = RunM(workflow_id=wid, run_id=run_id)
        self.all_runs.append(run)
        self.run_by_id[run_id] = run
        self.touched.add(run_id)
        self.ack(run_id, Kind.START)
        return run

    @precondition(lambda self: bool(self.ready_runs()))
    @rule(worker=st.integers(0, WORKERS - 1))
    def poll(self, worker: int) -> None:
        """One poll while the model knows of ready work: it must lease something."""
        wid = self.workers[worker]
        polled = self.poll_wf(wid)
        if polled.reply is None:
            return
        if polled.task is not None:
            self.adopt(polled, wid)
            return
        if polled.body.get("poll_status") == "throttled" or self.unsure():
            return
        ready = self.ready_runs()
        if ready:
            raise self.violation(
                SIGNAL_RECORDED,
                f"{plural(len(ready), 'run has', 'runs have')} a ready workflow task (started, or woken by a "
                "signal or update), yet the poll leased nothing",
                expected="a leased task",
                received=polled.body.get("poll_status"),
                replies=[polled.reply],
            )

    def poll_together(self, n: int) -> int:
        """``n`` workers poll at once; every lease is adopted (a (task, attempt) granted twice is
        LEASE-EXCLUSIVE broken). Returns how many were granted."""
        self.note_coalesced_poll()
        style = self.next_read()
        send = style.poll_fields()
        polls = self.poll_race(n, lambda i: self.ctx.poll_wf(self.workers[i], self.queue, 1, **send), style=style)
        self.granted_once(polls, lambda t: (str(t.get("task_id")), t.get("workflow_task_attempt")), "LEASE-EXCLUSIVE")
        granted = 0
        for i, p in polls:
            if p.task is not None and p.reply is not None:
                self.adopt(p, self.workers[i])
                granted += 1
        return granted

    @precondition(lambda self: len(self.ready_runs()) >= 2)
    @rule()
    def race_polls(self) -> None:
        """As many workers as there are ready runs poll at once: no run's task is leased twice."""
        if self.poll_together(min(WORKERS, len(self.ready_runs()))) >= 2:
            self.reached("race_leased_several")

    @precondition(lambda self: self.probes_left > 0 and self.unprobed and not self.ready_runs() and not self.unsure())
    @rule()
    def probe_quiet_queue(self) -> None:
        """Every known task is leased or none is due, after coalesced wakes or queries: two racing polls
        must lease nothing new (a second task of a run, or a task made by a query, would show here)."""
        self.probes_left -= 1
        self.unprobed = False
        self.poll_together(2)
        self.reached("quiet_queue_probed")

    @precondition(lambda self: bool(self.leased_tasks()))
    @rule(pick=st.integers(0, 7), kind=st.sampled_from(BATCH_DRAWS))
    def complete_task(self, pick: int, kind: str) -> None:
        tasks = self.leased_tasks()
        task = tasks[pick % len(tasks)]
        commands, closes, invalid = batch(task.run, kind, self.unique("no-such-update"))
        self.complete(task, commands, closes, invalid, kind)

    @rule(run=runs, kind=st.sampled_from(["cancel", "terminate"]))
    def close_run(self, run: RunM, kind: str) -> None:
        was_open = run.open
        updates = [(uid, update_state(run, uid)) for uid in run.accepted_updates]
        if self.close_by_control(run, kind, "x") is None:
            return
        for _, state in updates:
            if state is not None:
                self.hit("update", state, "close_run", Actor.OPERATOR)
        if was_open:
            run.slot, run.pending = Slot.NONE, set()  # §9.1: the close cancelled its open task
            self.reached("run_closed_by_control")
        else:
            self.reached("closed_run_command_refused")

    # -- rules: signals and updates ------------------------------------------------------------------

    def live_lease(self) -> TaskM | None:
        """A leased task of an open run with time to spare on its lease, or None."""
        soon = self.now() + timedelta(seconds=self.MARGIN + 1.5)
        return next((t for t in self.leased_tasks() if t.run.open and not t.run.uncertain and t.expires > soon), None)

    @precondition(lambda self: self.message_rounds < MESSAGE_ROUNDS)
    @rule()
    def messages_while_leased(self) -> None:
        """A signal and two updates accepted while a run's task is leased; the holder completes the task with
        a timer, and the follow-up task is leased and read in full: every message is there exactly once — the
        first task that follows its acceptance shows it — and nothing is repeated (§8.4, §12.2)."""
        self.message_rounds += 1
        task = self.live_lease()
        if task is None:
            run = self.new_run()
            task = self.lease_run_task(run, "start")
            if task is None or task.run is not run:
                return
        run = task.run
        self.signal(run, 1)
        self.update_accepted(run)
        self.update_accepted(run)
        if run.uncertain or task.status is not TaskStatus.LEASED:
            return
        if self.complete(task, [{"type": "start_timer", "delay_seconds": 3600}], set(), False, "timer") == "ok":
            self.lease_run_task(run, "signal")

    @rule(run=runs, n=st.integers(1, 3))
    def signal(self, run: RunM, n: int) -> None:
        """n signals released together: an open run accepts and records each, a closed one refuses all."""
        names = [self.unique("sig") for _ in range(n)]
        results = self.run(
            race(
                n,
                lambda i: self.ctx.client.control(
                    "POST", f"/workflows/{run.workflow_id}/signal/{names[i]}", {"input": [names[i]]}
                ),
            )
        )
        self.touched.add(run.run_id)
        for name, res in zip(names, results, strict=True):
            if isinstance(res, HarnessError):
                self.reached("response_lost")
                run.uncertain = True
                run.signals[name] = None
                run.signal_copies[name] = res.copies if isinstance(res, Indeterminate) else 1
                self.ack(run.run_id, Kind.SIGNAL, name, applied=Applied.MAYBE, copies=run.signal_copies[name])
                continue
            if isinstance(res, BaseException):
                raise res
            note(res.exchange.summary())
            self.judge_signal(run, name, res)

    def judge_signal(self, run: RunM, name: str, res: Reply) -> None:
        """§12.2: 202 signal_received on an open run (then it wakes the run), 409 on a closed one."""
        if res.status == 202:
            self.ack(run.run_id, Kind.SIGNAL, name)
        if run.uncertain:
            run.signals[name] = None
            return
        if run.open:
            self.expect_signal_received(res, run)
            run.signals[name] = True
            self.wake(run, f"signal:{name}")
            self.reached("signal_recorded")
            return
        message = f"a signal to {run.status.value} run {run.run_id} is refused"
        self.expect_status(res, 409, SIGNAL_CLOSED, message, "409 rejected_not_active")
        run.signals[name] = False
        self.reached("signal_closed_run_refused")
        self.reached("closed_run_command_refused")

    @rule(run=runs)
    def update_accepted(self, run: RunM) -> None:
        """An update returning at acceptance: 202 and an UpdateAccepted on an open run, 409 on a closed one."""
        name = self.unique("upd")
        reply = self.call(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/update/{name}", {"input": [name], "wait_for": "accepted"}
            )
        )
        if reply is None:
            run.uncertain = True
            return
        self.touched.add(run.run_id)
        body = reply.json()
        uid = body.get("update_id")
        if reply.status == 202 and isinstance(uid, str) and uid:
            self.ack(run.run_id, Kind.UPDATE, uid)
        if run.uncertain:
            return
        if not run.open:
            message = f"an update to {run.status.value} run {run.run_id} is refused"
            self.expect_status(reply, 409, UPDATE_CLOSED, message, "409 rejected_not_active")
            run.refused_updates.add(name)
            self.reached("update_closed_run_refused")
            self.reached("closed_run_command_refused")
            return
        if reply.status != 202 or body.get("update_status") != "accepted" or not isinstance(uid, str) or not uid:
            raise self.unexpected(
                reply,
                UPDATE_RECORDED,
                f"an update with wait_for accepted on open run {run.run_id}",
                '202 update_status "accepted" with an update_id',
                f"{body.get('update_status')!r} {uid!r}",
            )
        self.accepted_update(run, uid, name)
        self.reached("update_accepted")

    def accepted_update(self, run: RunM, uid: str, name: str) -> None:
        run.open_updates[uid] = name
        run.accepted_updates[uid] = name
        self.wake(run, f"update:{uid}")

    def await_accepted(self, run: RunM, name: str, call: asyncio.Task[Reply]) -> str | None:
        """The update_id of a blocking update, read from the run's history once UpdateAccepted is there."""

        async def find() -> str | None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while loop.time() < deadline and not call.done():
                for e in await self.ctx.history(run.workflow_id, run.run_id):
                    payload = e.get("payload")
                    if (
                        e.get("event_type") == "UpdateAccepted"
                        and isinstance(payload, dict)
                        and payload.get("update_name") == name
                        and isinstance(payload.get("update_id"), str)
                    ):
                        return str(payload["update_id"])
                await self.ctx.wait(0.05, real=True)  # the server's own latency, not protocol time
            return None

        found = self.run(find())
        if found is not None:
            return found
        if call.done() and isinstance(call.exception(), HarnessError):
            run.uncertain = True
            return None
        reply = call.result() if call.done() and call.exception() is None else None
        raise self.violation(
            UPDATE_RECORDED,
            f"a blocking update {name!r} on open run {run.run_id} records UpdateAccepted and waits",
            expected="UpdateAccepted in history while the call waits",
            received=f"{reply.status} {reply.reason}" if reply is not None else "no UpdateAccepted within 5 s",
            replies=[reply] if reply is not None else None,
        )

    @precondition(lambda self: bool(self.update_candidates()))
    @rule(pick=st.integers(0, 7), verdict=st.sampled_from(["complete_update", "fail_update"]))
    def update_completed(self, pick: int, verdict: str) -> None:
        """An update with wait_for completed blocks while the machine, as the worker, leases the run's task
        and closes the update; the waiting call then returns the result (200) or the failure (422)."""
        runs = self.update_candidates()
        run = runs[pick % len(runs)]
        name = self.unique("upd")
        body = {"input": [name], "wait_for": "completed", "wait_timeout_seconds": UPDATE_WAIT}
        call = self.loop.create_task(
            self.ctx.client.control(
                "POST", f"/workflows/{run.workflow_id}/update/{name}", body, timeout=UPDATE_WAIT + 15
            )
        )
        try:
            self.touched.add(run.run_id)
            uid = self.await_accepted(run, name, call)
            if uid is None:
                return
            self.ack(run.run_id, Kind.UPDATE, uid)  # its UpdateAccepted is in history: recorded
            self.accepted_update(run, uid, name)
            task = run.task if run.slot is Slot.LEASED else self.lease_run_task(run, "update")
            if task is None:
                return
            result = self.ctx.envelope({"update": name})
            if verdict == "complete_update":
                commands = [{"type": "complete_update", "update_id": uid, "result": result}]
            else:
                commands = [{"type": "fail_update", "update_id": uid, "message": f"conformance {name}"}]
            if self.complete(task, commands, {uid}, False, verdict) != "ok":
                return  # a rejection the model allowed: nobody closes the update, the call keeps waiting
            try:
                reply = self.run(outcome_of(call))
            except HarnessError:
                # The answer was lost, or the network delivered the call twice: a copy sent after the first
                # answer is a second update, accepted on the run after this one was closed (it wakes the run).
                self.reached("response_lost")
                run.uncertain = True
                return
            note(reply.exchange.summary())
            with self.judged(reply):
                judge_update_reply(reply.status, reply.reason, reply.json(), verdict, result)
            self.reached("update_wait_completed")
        finally:
            self.run(settle(call))

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def histories_are_sound(self) -> None:
        """Touched runs: gap-free, one terminal event at most (exactly one once closed), nothing recorded
        after it, every accepted signal and update recorded once, every refused one never, every update
        closed at most once."""
        self.check_touched_histories(self.run_by_id, self.judge_history)

    def judge_history(self, run: RunM, events: list[dict[str, Any]]) -> None:
        with self.judged():
            judge_messages(run, events)
        for uid in run.accepted_updates:  # the operator's read of each update, judged with the run's messages
            state = update_state(run, uid)
            if state is not None:
                self.hit("update", state, "describe", Actor.OPERATOR)

    # -- the sweep over cold cells -------------------------------------------------------------------

    def sweep(self) -> None:
        """After the examples: every update and query-task cell they left cold (:func:`sweep_messages`)."""
        sweep_messages(self)
