"""The one poll path of the worker plane: workflow, activity and query polls all go through here.

A poll is four steps, each in one place (docs/reference.md: Long poll):

1. **Preconditions** (§7.1, §7.5): the body's fields, the worker's registration, its queue and build id,
   the queue's matching switch and the build-id cohort's drain state; the hold is clamped into
   ``[long_poll_min_seconds, long_poll_max_seconds]`` (§7.2). Validation comes first, so a 422 changes
   nothing (the worker's liveness is recorded only once the poll is accepted).
2. **The long poll** (§7.2): the kind's claim runs in one transaction; when it finds nothing the poll waits
   for a wake-up of its queue, the next moment durable state makes a task claimable (a retry's backoff, a
   lease expiry), or the end of the hold — whichever comes first. A wake-up is a hint: the claim always
   re-reads durable state.
3. **The replay cache** (§7.3): a poll repeated with the same ``poll_request_id`` (same namespace, kind,
   queue, build id and worker) while the lease it got is live returns the same task and attempt; once that
   lease ended (completed, failed, expired, re-leased) the cached row is dropped. One table,
   ``poll_requests``, serves the three kinds; what "live" means per kind is :data:`LIVE_LEASE`.
4. **The answer** (§7.4): every poll response carries ``poll_status``, and ``task`` is non-null iff leased.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from suite.protocol.errors import Rejection

from .app import Ctx, validation_error
from .config import Settings
from .hub import Hub
from .ports import Core
from .store import Clock
from .tx import T

__all__ = [
    "KINDS",
    "LIVE_LEASE",
    "Claim",
    "DueIn",
    "Poll",
    "Poller",
    "Polls",
    "default_hold",
    "forget_polls",
    "lease_taken",
    "poll_response",
    "record_liveness",
    "replayed_task",
]

KINDS = ("workflow", "activity", "query")

# §7.3 "while the lease is live return the same task_id and the same attempt": the lease a cached poll got is
# live when its task is still leased to the same worker, before its expiry, with the attempt that poll saw (a
# redelivery to the same worker is a new attempt, and a query task past its deadline is timed out, §10.1).
LIVE_LEASE: dict[str, str] = {
    "workflow": (
        "SELECT 1 FROM workflow_tasks WHERE task_id = :task_id AND status = 'leased' AND lease_owner = :worker"
        " AND lease_expires_at > :now AND attempt = :attempt"
    ),
    "activity": (
        "SELECT 1 FROM activity_tasks k JOIN activity_attempts a ON a.attempt_id = k.current_attempt_id"
        " WHERE k.task_id = :task_id AND k.status = 'leased' AND k.lease_owner = :worker"
        " AND k.lease_expires_at > :now AND a.attempt_number = :attempt"
    ),
    "query": (
        "SELECT 1 FROM query_tasks WHERE query_task_id = :task_id AND status = 'leased' AND lease_owner = :worker"
        " AND lease_expires_at > :now AND attempt = :attempt AND deadline > :now"
    ),
}
# The field of each kind's task payload that names the task (the replay row's ``task_id``).
_TASK_ID_FIELD = {"workflow": "task_id", "activity": "task_id", "query": "query_task_id"}


@dataclass(frozen=True)
class Poll:
    """One accepted poll: who polls which queue of which kind, for how long, under which replay key."""

    kind: str
    worker: sqlite3.Row
    queue: str
    build_id: str | None
    """The poll's own ``build_id`` (part of the §7.3 replay key); the registered one is ``worker["build_id"]``."""
    hold: float
    poll_request_id: str | None

    @property
    def namespace(self) -> str:
        return str(self.worker["namespace"])

    @property
    def worker_id(self) -> str:
        return str(self.worker["worker_id"])

    def replay_key(self) -> tuple[str, str, str, str, str, str]:
        assert self.poll_request_id is not None
        return (self.namespace, self.kind, self.queue, self.build_id or "", self.worker_id, self.poll_request_id)


Claim = Callable[[T, Poll], Any]
"""A kind's claim: the leased task's payload, ``None`` when nothing matches, or ``"throttled"``."""
DueIn = Callable[[sqlite3.Connection, Poll, int], float | None]
"""Seconds until durable state alone makes a task of this poll claimable (``None``: nothing is due)."""


# -- the replay cache (§7.3) -------------------------------------------------------------------------------


def cached_poll(t: T, key: tuple[str, ...]) -> sqlite3.Row | None:
    """The replay row of the poll ``key`` (:meth:`Poll.replay_key`): the same worker's poll with that
    poll_request_id on that queue and build."""
    return t.one(
        "SELECT task_id, attempt, worker_id FROM poll_requests WHERE namespace = ? AND kind = ? AND task_queue = ?"
        " AND build_id = ? AND worker_id = ? AND poll_request_id = ?",
        *key,
    )


def replayed_task(t: T, poll: Poll) -> str | None:
    """The task a repeated poll is answered with again, or ``None``; a cached row whose lease is no longer
    live is dropped (§7.3: "Once the task is completed, failed or expired, the cached result is dropped")."""
    if not poll.poll_request_id:
        return None
    key = poll.replay_key()
    row = cached_poll(t, key)
    if row is None:
        return None
    live = t.db.execute(
        LIVE_LEASE[poll.kind],
        {"task_id": row["task_id"], "worker": row["worker_id"], "now": t.now, "attempt": row["attempt"]},
    ).fetchone()
    if live is None:
        t.db.execute(
            "DELETE FROM poll_requests WHERE namespace = ? AND kind = ? AND task_queue = ? AND build_id = ?"
            " AND worker_id = ? AND poll_request_id = ?",
            key,
        )
        return None
    return str(row["task_id"])


def lease_taken(t: T, poll: Poll, task_id: str, attempt: int, *, leased_before: bool = True) -> None:
    """A claim leased ``task_id``: replays of its earlier leases are over, and this poll's is remembered. A task
    never leased before (``leased_before`` false) has no earlier lease a poll could have been answered with."""
    if leased_before:
        forget_polls(t, poll.kind, task_id)
    if poll.poll_request_id:
        t.db.execute(
            "INSERT OR REPLACE INTO poll_requests (namespace, kind, task_queue, build_id, worker_id,"
            " poll_request_id, task_id, attempt, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*poll.replay_key(), task_id, attempt, t.now),
        )


def record_liveness(t: T, poll: Poll) -> None:
    """An accepted poll is the worker's heartbeat (§6.2): its ``last_heartbeat_at`` is now."""
    t.db.execute(
        "UPDATE workers SET last_heartbeat_at = ? WHERE namespace = ? AND worker_id = ?",
        (t.now, poll.namespace, poll.worker_id),
    )


def forget_polls(t: T, kind: str, task_id: str) -> None:
    """The lease of ``task_id`` ended: no poll may be answered with it again."""
    t.db.execute("DELETE FROM poll_requests WHERE kind = ? AND task_id = ?", (kind, task_id))


# -- the answer (§7.4) -------------------------------------------------------------------------------------


def poll_response(result: Any) -> tuple[int, dict[str, Any]]:
    """§7.4: every poll response has ``poll_status``; ``task`` is non-null iff leased."""
    if result is None:
        return 200, {"task": None, "poll_status": "empty"}
    if result == "throttled":
        return 200, {"task": None, "poll_status": "throttled", "retry_after_seconds": 1}
    return 200, {"task": result, "poll_status": "leased"}


# -- the poller ---------------------------------------------------------------------------------------------


def default_hold(settings: Settings) -> int:
    """How long a poll sent without timeout_seconds holds (the long-poll table's default, 30 s, clamped at start-up
    to the server's maximum)."""
    return settings.long_poll_default_seconds


class Polls(Protocol):
    """The poll path as the poll routes see it (:class:`Poller`)."""

    async def serve(self, ctx: Ctx, kind: str, claim: Claim, due_in: DueIn) -> tuple[int, dict[str, Any]]: ...


class Poller:
    """Serves every poll of one server; owns the matching switch (Appendix C) of its queues."""

    def __init__(self, settings: Settings, core: Core, hub: Hub, clock: Clock) -> None:
        self.settings = settings
        self.core = core
        self.hub = hub
        self.clock = clock
        # Appendix C test knob: queues whose matching layer is switched off (poll_status "unavailable").
        # In memory on purpose: it simulates an infrastructure outage, which does not survive a restart.
        self.unavailable_queues: set[tuple[str, str]] = set()

    async def serve(self, ctx: Ctx, kind: str, claim: Claim, due_in: DueIn) -> tuple[int, dict[str, Any]]:
        """One poll of ``kind``, from its preconditions to its answer.

        The accepted poll records the worker's liveness in the transaction of its first claim, so a poll that
        leases at once costs one fsynced transaction, not two; when that first claim raises (its transaction
        rolled back), the liveness is recorded alone before the error is answered."""
        poll = self.accept(ctx, kind)
        recorded = False

        def attempt(t: T) -> Any:
            nonlocal recorded
            if not recorded:
                record_liveness(t, poll)
            out = claim(t, poll)
            recorded = True  # the transaction commits once ``attempt`` returns
            return out

        try:
            result = await self.long_poll(
                (kind, ctx.namespace, poll.queue),
                poll.hold,
                attempt,
                lambda db, now: due_in(db, poll, now),
            )
        except Exception:
            if not recorded:
                self.core.run_tx(lambda t: record_liveness(t, poll))
            raise
        return poll_response(result)

    # -- preconditions (§7.1, §7.5) ------------------------------------------------------------------------

    def accept(self, ctx: Ctx, kind: str) -> Poll:
        """§7.1/§7.5: validate, look up the registration, check queue/build id/drain; clamp the hold."""
        body = ctx.obj()
        worker_id, queue, build_id, prid, timeout = self._fields(body)
        # The registration with its build-id cohort's drain intent on its queue (checked last, below), in one read.
        worker = (
            self.core.read()
            .execute(
                "SELECT w.*, d.drain_intent FROM workers w LEFT JOIN drains d ON d.namespace = w.namespace"
                " AND d.task_queue = w.task_queue AND d.build_id = COALESCE(w.build_id, '')"
                " WHERE w.namespace = ? AND w.worker_id = ? AND w.status = 'active'",
                (ctx.namespace, worker_id),
            )
            .fetchone()
        )
        if worker is None:
            raise Rejection(
                412,
                "worker_not_registered",
                f"Worker '{worker_id}' is not registered in this namespace.",
                {"worker_id": worker_id},
            )
        if worker["task_queue"] != queue:
            raise Rejection(
                409,
                "task_queue_mismatch",
                "The poll's task_queue differs from the registered one.",
                {"registered_task_queue": worker["task_queue"], "requested_task_queue": queue},
            )
        if build_id and worker["build_id"] and build_id != worker["build_id"]:
            raise Rejection(
                409,
                "build_id_mismatch",
                "The poll's build_id differs from the registered one.",
                {"registered_build_id": worker["build_id"], "requested_build_id": build_id},
            )
        if (ctx.namespace, queue) in self.unavailable_queues:
            # §7.4: "The queue or matching layer could not coordinate safely" → 503, task null.
            raise Rejection(
                503,
                "matching_unavailable",
                "The matching layer of this task queue is unavailable; retry the poll.",
                {"poll_status": "unavailable", "task": None, "retry_after_seconds": 1},
            )
        if worker["drain_intent"] == "draining":  # the registered queue is the polled one (checked above)
            raise Rejection(
                409,
                "worker_draining",
                "This worker's build-id cohort is draining on this queue.",
                {
                    "poll_status": "draining",
                    "task": None,
                    "build_id": worker["build_id"],
                    "drain_reason": "build_id_draining",
                },
            )
        # §7.2: clamp into [min, max]; 0 and negatives hold about the minimum.
        hold = max(self.settings.long_poll_min_seconds, min(self.longest_hold(), timeout))
        return Poll(kind, worker, queue, build_id, float(hold), prid)

    def longest_hold(self) -> float:
        """The longest hold of a long poll: the ``long_poll_max_seconds`` this server advertises."""
        return self.settings.long_poll_max_seconds

    def _fields(self, body: dict[str, Any]) -> tuple[str, str, str | None, str | None, int]:
        """The poll body's fields (§7.1), or one 422 naming every bad one."""
        errors: dict[str, list[str]] = {}
        worker_id = body.get("worker_id")
        queue = body.get("task_queue")
        if not isinstance(worker_id, str) or not worker_id:
            errors["worker_id"] = ["worker_id is required and must be a non-empty string."]
        if not isinstance(queue, str) or not queue:
            errors["task_queue"] = ["task_queue is required and must be a non-empty string."]
        build_id = body.get("build_id")
        if build_id is not None and not isinstance(build_id, str):
            errors["build_id"] = ["build_id must be a string or null."]
        prid = body.get("poll_request_id")
        if prid is not None and (not isinstance(prid, str) or len(prid) > 255):
            errors["poll_request_id"] = ["poll_request_id must be a string of at most 255 characters."]
        timeout = body.get("timeout_seconds", default_hold(self.settings))
        if isinstance(timeout, str) and timeout.strip().lstrip("-").isdigit():
            timeout = int(timeout.strip())  # §7.2: integral strings are coerced
        if timeout is None:
            timeout = default_hold(self.settings)
        elif not isinstance(timeout, int) or isinstance(timeout, bool):
            errors["timeout_seconds"] = ["timeout_seconds must be an integer."]
        if errors:
            raise validation_error(errors)
        assert isinstance(worker_id, str)
        assert isinstance(queue, str)
        assert isinstance(timeout, int)
        return worker_id, queue, build_id, prid, timeout

    # -- the long poll (§7.2) ------------------------------------------------------------------------------

    async def long_poll(
        self,
        key: tuple[str, str, str],
        hold: float,
        attempt: Callable[[T], Any],
        due_in: Callable[[sqlite3.Connection, int], float | None],
    ) -> Any:
        """Try ``attempt`` now; if it finds nothing, wait for a wake-up, the next due moment of durable
        state, or the end of the hold (§7.2: a task that becomes ready is returned immediately)."""
        # The hold is measured on the server's clock, so a test-clock advance ends it too (it wakes every hold).
        deadline = self.clock.now_us() + round(hold * 1_000_000)
        while True:
            ev = self.hub.event(key)
            result = self.core.run_tx(attempt)
            if result is not None:
                return result
            now = self.clock.now_us()
            remaining = (deadline - now) / 1e6
            if remaining <= 0:
                return None
            due = due_in(self.core.read(), now)
            wait = remaining if due is None else min(remaining, max(0.001, due))
            await self.wait_for_work(ev, wait)

    async def wait_for_work(self, ev: asyncio.Event, seconds: float) -> None:
        """Wait up to ``seconds`` for ``ev``, the wake-up of new work on the polled queue."""
        await self.hub.wait(ev, seconds)
