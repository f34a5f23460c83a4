"""The background scheduler: time-driven work that no request triggers.

The scheduler runs a list of **steps**, each ``step(t) -> seconds until its next due work`` (``None`` when
nothing is pending), all in one transaction (each behind its own savepoint), and then sleeps until the earliest
due moment, at most ``scheduler_max_sleep_seconds``. Its own steps fire due timers, start child retries whose
backoff passed and time out runs past their deadline; the activity, query, session and cancellation modules
register theirs (§11.7 timeouts, §10.5 query deadlines, session expiry, cleanup deadlines).

A step names with :class:`Watch` the writes that can make it due sooner than the scheduler planned (a timer
inserted, a lease renewed, a run closed with an activity lease out). Each watch is a TEMP trigger on this
server's connection, so every writer of a watched table is seen, whatever module it is in: it reports the
deadline written, and a commit that wrote one earlier than the next pass wakes the scheduler (the commits of a
burst settle for :data:`WAKE_SETTLE_SECONDS` into one pass). Commits that write no deadline — a poll, a
completion, a start without timeouts — run no pass. Expired leases and delayed tasks need no step: pollers
compute their own due time from durable state (:mod:`reference_server.polling`).

Steps are independent on purpose: one that fails is rolled back to its savepoint (its writes and the effects it
would have published forgotten) and logged, and the others still run and commit, so one bad row cannot stop
timers, retries and timeouts for the whole server.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from suite.protocol.lifecycles import ChildEvent, ConditionWaitEvent, RunEvent, TimerEvent, TimerStatus

from . import engine as E
from .closing import close_run
from .config import Settings
from .engine import TERMINAL_RUN_STATUSES
from .transitions import CHILDREN, CONDITION_WAITS, TIMERS, move, move_all
from .tx import Effects, T, Watch

__all__ = [
    "NEVER",
    "OWN_WATCHES",
    "WAKE_SETTLE_SECONDS",
    "Scheduler",
    "Step",
    "fire_timers",
    "retry_children",
    "time_out_runs",
]

log = logging.getLogger(__name__)

# After a wake-up, how long the commits that come with it may gather before the pass that reads them. Due work a
# request creates (a timer of 0 s, an immediate retry) is found this much later at most; a poll never waits on
# the scheduler (pollers compute their own due time).
WAKE_SETTLE_SECONDS = 0.02
# A pass that failed as a whole (not one step: the transaction itself, e.g. the disk) is retried this much later.
FAILED_PASS_RETRY_SECONDS = 1.0

Step = Callable[[T], float | None]
US = 1_000_000
NEVER = 2**62  # an instant no deadline reaches (µs)


class Scheduler:
    """Runs the steps in the background; :meth:`maintenance_pass` runs them all once in one transaction."""

    def __init__(self, settings: Settings, run_tx: Callable[[Step], float | None], now_us: Callable[[], int]) -> None:
        self.settings = settings
        self._run_tx = run_tx
        self._now_us = now_us
        self.steps: list[Step] = [fire_timers, retry_children, time_out_runs]
        self.watches: list[Watch] = list(OWN_WATCHES)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_pass_us = 0  # when the loop will pass next, on the server's clock (0: not running)

    def add(self, step: Step, *watches: Watch) -> None:
        """Run ``step`` in every pass; ``watches`` are the writes that can make it due sooner."""
        self.steps.append(step)
        self.watches.extend(watches)

    def install(self, db: sqlite3.Connection) -> None:
        """Create the watches' TEMP triggers on ``db`` (the connection every transaction of the server uses)."""
        for i, watch in enumerate(self.watches):
            for sql in watch.triggers(f"scheduler_watch_{i}"):
                db.execute(sql)

    @property
    def next_pass_us(self) -> int:
        """When the running loop passes next, on the server's clock (0 when it is not running)."""
        return self._next_pass_us

    def note_due(self, at_us: int) -> None:
        """A commit wrote work due at ``at_us``: pass then if that is before the planned pass (after the settle)."""
        if at_us < self._next_pass_us:
            self._next_pass_us = at_us
            self._wake.set()

    def wake(self) -> None:
        """Durable state changed in a way no watch sees (a test-clock advance): recompute what is due now."""
        self._wake.set()

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._next_pass_us = 0

    def run_steps(self) -> float:
        """Every step once, in one transaction; the seconds until the earliest due work (at most
        ``scheduler_max_sleep_seconds``). The loop runs this; so does a test-clock advance, at once."""
        try:
            return self._run_tx(self._pass) or 0.0
        except Exception:
            log.exception("scheduler pass failed")
            return FAILED_PASS_RETRY_SECONDS

    def _pass(self, t: T) -> float:
        delay = self.settings.scheduler_max_sleep_seconds
        for step in self.steps:
            before = _copy_effects(t.fx)
            t.db.execute("SAVEPOINT step")
            try:
                due = step(t)
            except Exception:
                t.db.execute("ROLLBACK TO step")
                t.db.execute("RELEASE step")
                t.fx = before  # what the failed step would have published is forgotten with its writes
                log.exception("scheduler step %s failed", getattr(step, "__name__", step))
                continue
            t.db.execute("RELEASE step")
            if due is not None:
                delay = min(delay, max(0.0, due))
        return delay

    async def _loop(self) -> None:
        while True:
            self._next_pass_us = NEVER  # a deadline the pass itself writes is noted (note_due) and kept below
            delay = self.run_steps()
            self._wake.clear()
            now = self._now_us()
            planned = now + round(delay * US) if delay < (NEVER - now) / US else NEVER  # an endless sleep too
            self._next_pass_us = min(self._next_pass_us, planned)
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, (self._next_pass_us - now) / US))
            except TimeoutError:
                continue
            await asyncio.sleep(WAKE_SETTLE_SECONDS)

    def maintenance_pass(self, t: T) -> float:
        """Every step in one transaction (what in-process tests drive with a fake clock); the seconds until
        the earliest due work, at most ``scheduler_max_sleep_seconds``."""
        delays: list[float] = [self.settings.scheduler_max_sleep_seconds]
        for step in self.steps:
            d = step(t)
            if d is not None:
                delays.append(d)
        return max(0.0, min(delays))


def _copy_effects(fx: Effects) -> Effects:
    """A copy of a transaction's effects so far (each collection copied), to restore after a failed step."""
    return dataclasses.replace(fx, **{f.name: copy.copy(getattr(fx, f.name)) for f in dataclasses.fields(fx)})


def _seconds_until(t: T, sql: str) -> float | None:
    """Seconds from now until the instant ``sql`` selects as ``at`` (``None`` when it selects none)."""
    row = t.one(sql)
    return None if row is None or row["at"] is None else (row["at"] - t.now) / 1e6


# -- the scheduler's own steps -----------------------------------------------------------------------------


def fire_timers(t: T) -> float | None:
    """Fire every due timer: ``TimerFired`` (and ``ConditionWaitTimedOut`` for a condition timeout), then
    wake the run with the timer's resume context (§8.3)."""
    for timer in t.all("SELECT * FROM timers WHERE status = 'pending' AND fire_at <= ? LIMIT 100", t.now):
        move(t, TIMERS, timer["timer_id"], timer["status"], TimerEvent.FIRE, quiet=True)
        run = t.run(timer["run_id"])
        if run["status"] in TERMINAL_RUN_STATUSES:
            continue
        payload: dict[str, Any] = {
            "sequence": timer["step_sequence"],
            "timer_id": timer["timer_id"],
            "delay_seconds": timer["delay_seconds"],
            "timer_kind": timer["timer_kind"],
        }
        t.fx.transition("timer", timer["timer_id"], timer["status"], TimerStatus.FIRED.value, run_id=run["run_id"])
        if timer["timer_kind"] == "condition_timeout":
            E.wake_run(t, run["run_id"], _condition_timed_out(t, timer, payload))
            continue
        E.record_wake(
            t,
            run["run_id"],
            "TimerFired",
            payload,
            workflow_wait_kind="timer",
            open_wait_id=f"timer:{timer['timer_id']}",
            resume_source_kind="timer",
            resume_source_id=timer["timer_id"],
            timer_id=timer["timer_id"],
        )
    return _seconds_until(t, "SELECT MIN(fire_at) AS at FROM timers WHERE status = 'pending'")


def _condition_timed_out(t: T, timer: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A condition wait's timeout fired (Python SDK 2.12.0, Replay): the wait is timed out; the resume context."""
    wait_id = timer["condition_wait_id"]
    payload["condition_wait_id"] = wait_id
    seq = E.append_event(t, timer["run_id"], "TimerFired", payload)
    move_all(t, CONDITION_WAITS, ConditionWaitEvent.TIME_OUT, "condition_wait_id = ?", (wait_id,))
    wait = t.one("SELECT * FROM condition_waits WHERE condition_wait_id = ?", wait_id)
    E.append_event(
        t,
        timer["run_id"],
        "ConditionWaitTimedOut",
        {"condition_wait_id": wait_id, "sequence": timer["step_sequence"]},
    )
    return E.empty_resume(
        workflow_wait_kind="condition",
        open_wait_id=f"condition:{wait_id}",
        resume_source_kind="timer",
        resume_source_id=timer["timer_id"],
        timer_id=timer["timer_id"],
        condition_wait_id=wait_id,
        condition_key=wait["condition_key"] if wait else None,
        condition_definition_fingerprint=wait["fingerprint"] if wait else None,
        workflow_sequence=seq,
        workflow_event_type="TimerFired",
    )


def retry_children(t: T) -> float | None:
    """Start the next run of every child whose retry backoff passed; a closed parent's retries are cancelled."""
    for call in t.all("SELECT * FROM children WHERE status = 'backoff' AND retry_at <= ? LIMIT 100", t.now):
        parent = t.run(call["parent_run_id"])
        if parent["status"] in TERMINAL_RUN_STATUSES:
            move(t, CHILDREN, call["child_call_id"], call["status"], ChildEvent.PARENT_CLOSED, quiet=True)
            continue
        E.start_child_run(t, call, parent)
    return _seconds_until(t, "SELECT MIN(retry_at) AS at FROM children WHERE status = 'backoff'")


def time_out_runs(t: T) -> float | None:
    """Close every run past its run timeout or its execution's as failed, closed_reason ``timed_out``
    (``WorkflowTimedOut``). A run's deadline is the earlier of the two (:func:`engine.run_deadline`); a run past
    its execution's deadline is not retried (its failure is non-retryable): the execution is over."""
    for run in t.all(
        "SELECT * FROM runs WHERE closed_at IS NULL AND run_deadline IS NOT NULL AND run_deadline <= ? LIMIT 100",
        t.now,
    ):
        execution = run["execution_deadline"] is not None and run["execution_deadline"] <= t.now
        kind, seconds = ("execution", "execution_timeout_seconds") if execution else ("run", "run_timeout_seconds")
        close_run(
            t,
            run["run_id"],
            RunEvent.TIME_OUT,
            event_type="WorkflowTimedOut",
            payload={"timeout_type": kind, seconds: run[seconds]},
            failure={
                "message": f"Workflow {kind} timed out.",
                "failure_category": "timeout",
                "timeout_type": kind,
                **({"non_retryable": True} if execution else {}),
            },
        )
    return _seconds_until(
        t, "SELECT MIN(run_deadline) AS at FROM runs WHERE closed_at IS NULL AND run_deadline IS NOT NULL"
    )


# What can make the scheduler's own steps due sooner: a pending timer's fire time, a child's retry time as it
# goes into backoff, an open run's deadline (set when the run is created).
OWN_WATCHES = (
    Watch("timers", ("status", "fire_at"), "NEW.status = 'pending'", ("NEW.fire_at",)),
    Watch("children", ("status", "retry_at"), "NEW.status = 'backoff'", ("NEW.retry_at",)),
    Watch("runs", ("run_deadline",), "NEW.closed_at IS NULL", ("NEW.run_deadline",)),
)
