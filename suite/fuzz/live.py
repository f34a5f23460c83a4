"""The live worlds fuzz cases may target, built with the suite's own worlds (:mod:`suite.worlds`) through a
:class:`~suite.context.CheckContext` like every check's: the same client, unique names, waits and
poll-until-leased.

A world here is a run of :mod:`suite.worlds` (a leased run, a run that scheduled an activity, a run parked for a
query) that a case borrows ids and fencing values from, renewed between cases so its lease outlives the next one
and rebuilt once a case may have changed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from schemathesis.transport.requests import ManagedCookiesSession

from suite.client import direct_http
from suite.context import CheckContext, TargetInfo, target_client
from suite.outcomes import CheckFailure, HarnessError, Indeterminate
from suite.worlds import (
    activity_call,
    lease_task,
    leased_run,
    query_call,
    schedule_activities,
    waiting_run,
)

__all__ = ["CALL_TIMEOUT", "WORLDS", "Lab", "LiveWorld", "WorldUnavailable", "Worlds"]

R = TypeVar("R")

CALL_TIMEOUT: Final = 30.0


class WorldUnavailable(Exception):
    """A live world could not be built or read; the case runs without it (never the target's failure here: the
    conformance checks judge the calls a world is made of). Under ``--faults`` also a world-building call whose
    answer was lost after it may have been applied: the world cannot be trusted."""


class Lab:
    """The fuzzer's side of the target outside Schemathesis: a check context (the suite's recording client and
    its waits) on an event loop of its own, and the keep-alive session Schemathesis sends the cases on."""

    def __init__(self, target: TargetInfo, name: str) -> None:
        self.target = target
        self.loop = asyncio.new_event_loop()
        self.ctx = CheckContext(target=target, client=target_client(target, timeout=CALL_TIMEOUT), check_name=name)
        self.requests = 0  # the world's requests (building, renewing, reading): the cases' are counted apart
        # One keep-alive session for the cases, as a fresh one per case would send them: no default headers (those
        # of the session are set aside while a case is sent only when the session has none), no cookie kept from
        # one case to the next. Not under --faults: a request lost on a kept-alive connection would be sent again
        # by Schemathesis, on a fresh one, a delivery the suite neither made nor could judge.
        self.session: ManagedCookiesSession | None = None
        if target.fault_ledger is None:
            self.session = ManagedCookiesSession()
            self.session.headers.clear()
            # requests reads the environment's proxies and looks for a netrc file before every request: where
            # neither applies to the target, the same requests go out without those reads.
            self.session.trust_env = not direct_http(target.url) or _netrc_present()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.loop.run_until_complete(self.ctx.client.aclose())
        self.loop.close()

    def now(self) -> datetime:
        return self.ctx.now()

    def headers(self, plane: str) -> dict[str, str]:
        """The version, namespace and credential headers of a well-formed request of ``plane``."""
        return self.ctx.client.plane_headers(plane)

    def uid(self, prefix: str) -> str:
        return self.ctx.uid(prefix)

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Await world calls: what keeps a world from being built or read (an unexpected answer, an answer lost
        under ``--faults``) is :class:`WorldUnavailable`; a transport error stays the harness's."""
        try:
            return self.loop.run_until_complete(coro)
        except (CheckFailure, Indeterminate) as exc:
            raise WorldUnavailable(str(exc).splitlines()[0]) from exc
        finally:
            self._forget()

    def held(self, send: Callable[[], R], hold: float) -> R:
        """``send()`` (blocking) as a request the target may hold ``hold`` s. The fuzzer's waits go through the
        check context's one helper like every check's: with a test clock, the hold is ended by moving the clock
        once the request had :data:`suite.context.HELD_GRACE` to answer (``CheckContext.held``)."""
        if not self.target.clock.skips:
            return send()
        try:
            return self.loop.run_until_complete(self.ctx.held(asyncio.to_thread(send), hold))
        finally:
            self._forget()

    def _forget(self) -> None:
        # A world's exchanges are test equipment, never a case's evidence: counted, then dropped.
        self.requests += len(self.ctx.exchanges)
        self.ctx.exchanges.clear()

    def snapshot(self, world: LiveWorld) -> tuple[Any, list[Any]]:
        """Describe and the whole control-plane history of the world's run."""

        async def read() -> tuple[Any, list[Any]]:
            describe = await self.ctx.describe(world.workflow_id)
            return describe, await self.ctx.history(world.workflow_id, world.run_id)

        return self.run(read())


def _netrc_present() -> bool:
    """Whether requests would find a netrc file (credentials it adds to a request that has none)."""
    if os.environ.get("NETRC") is not None:
        return True
    return any(Path(f"~/{name}").expanduser().exists() for name in (".netrc", "_netrc"))


# Which world an operation's cases may target. "workflow": a run whose workflow task is leased; "activity":
# an activity task leased by the run's worker; "query": a query task leased while a control-plane query
# waits; "parked": a run whose queue has no worker, so a query is refused at once (409
# query_worker_unavailable) instead of holding the caller for the target's query timeout. The "-ready"
# worlds of the polls hold the same task ready but not yet leased, so a valid poll returns at once.
WORLDS: Final[dict[str, str]] = {
    "register_worker": "workflow",
    "heartbeat_worker": "workflow",
    "deregister_worker": "workflow",
    "poll_workflow_task": "workflow-ready",
    "fetch_workflow_task_history": "workflow",
    "heartbeat_workflow_task": "workflow",
    "complete_workflow_task": "workflow",
    "fail_workflow_task": "workflow",
    "poll_query_task": "query-ready",
    "complete_query_task": "query",
    "fail_query_task": "query",
    "poll_activity_task": "activity-ready",
    "complete_activity_task": "activity",
    "fail_activity_task": "activity",
    "heartbeat_activity_task": "activity",
    "get_activity_task_status": "activity",
    "start_workflow": "workflow",
    "describe_workflow": "workflow",
    "list_workflow_runs": "workflow",
    "describe_workflow_run": "workflow",
    "get_workflow_run_history": "workflow",
    "signal_workflow": "workflow",
    "signal_workflow_run": "workflow",
    "query_workflow": "parked",
    "query_workflow_run": "parked",
    "update_workflow": "workflow",
    "update_workflow_run": "workflow",
    "cancel_workflow": "workflow",
    "cancel_workflow_run": "workflow",
    "request_workflow_cancellation": "workflow",
    "request_workflow_run_cancellation": "workflow",
    "terminate_workflow": "workflow",
    "terminate_workflow_run": "workflow",
    "drain_build_id": "workflow",
    "resume_build_id": "workflow",
    "deliver_workflow_task_cancellation": "workflow",
    "create_worker_session": "workflow",
    "heartbeat_worker_session": "workflow",
    "close_worker_session": "workflow",
    "list_worker_sessions": "workflow",
    "describe_worker_session": "workflow",
}
WORKFLOW_TYPE: Final = "conformance.Fuzz"


@dataclass
class LiveWorld:
    """A run of :mod:`suite.worlds` that one operation's cases target, and the ids and fencing values a case
    may borrow from it."""

    kind: str
    queue: str
    worker: str
    workflow_id: str
    run_id: str
    task: dict[str, Any] | None = None  # the leased workflow, activity or query task
    renewed_at: float = 0.0
    built_at: float = 0.0
    dirty: bool = False
    query_call: threading.Thread | None = None

    def path_values(self) -> dict[str, str]:
        values = {"workflow_id": self.workflow_id, "run_id": self.run_id, "queue": self.queue}
        values["worker_id"] = self.worker
        # A session id of this world's worker: a session route's cases name a session that may exist.
        values["session_id"] = f"{self.worker}-session"
        if self.task is not None:
            values["task_id"] = str(self.task.get("task_id", ""))
            values["query_task_id"] = str(self.task.get("query_task_id", ""))
        return {k: v for k, v in values.items() if v}

    def body_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {"worker_id": self.worker, "task_queue": self.queue, "workflow_id": self.workflow_id}
        values["session_id"] = f"{self.worker}-session"
        if self.task is not None:
            for key in ("lease_owner", "workflow_task_attempt", "activity_attempt_id", "query_task_attempt"):
                if key in self.task:
                    values[key] = self.task[key]
            values.setdefault("lease_owner", self.worker)
        return values


class Worlds:
    """Builds, renews and rebuilds the live world of one operation."""

    def __init__(self, lab: Lab, kind: str) -> None:
        self.lab = lab
        self.kind = kind
        self.world: LiveWorld | None = None
        self.failed: str | None = None
        self.builds = 0
        profile = lab.target.test_profile
        lease = profile.get("activity_task_lease_seconds" if kind == "activity" else "workflow_task_lease_seconds", 3)
        self.renew_every = max(0.25, min(float(lease) / 4, 30.0)) if isinstance(lease, int | float) else 0.75
        q_timeout = profile.get("query_task_timeout_seconds", 3)
        q_lease = profile.get("query_task_lease_seconds", 3)
        q_life = min(float(q_timeout), float(q_lease)) if isinstance(q_timeout, int | float) else 3.0
        self.query_life = max(0.5, q_life * 0.4)

    def get(self) -> LiveWorld | None:
        """A usable world, renewed so its lease outlives the next call; None when none can be built."""
        if self.failed is not None:
            return None
        world = self.world
        try:
            if world is None or world.dirty or not self._fresh(world):
                self.close()
                world = self.world = self.lab.run(self._build())
                self.builds += 1
            return world
        except WorldUnavailable as exc:
            self.failed = str(exc)
            self.world = None
            return None

    def _fresh(self, world: LiveWorld) -> bool:
        # On the target's clock: a test clock moved by a held case ages the world's lease and query too.
        now = self.lab.now().timestamp()
        if world.kind in ("query", "query-ready"):
            return now - world.built_at < self.query_life
        if world.kind not in ("workflow", "activity") or now - world.renewed_at < self.renew_every:
            return True
        ctx, task = self.lab.ctx, world.task or {}
        beat = ctx.wf_call(task, "heartbeat") if world.kind == "workflow" else activity_call(ctx, task, "heartbeat")
        reply = self.lab.run(beat)
        alive = (
            isinstance(reply.body, dict) and reply.status == 200 and reply.body.get("can_continue", True) is not False
        )
        world.renewed_at = self.lab.now().timestamp()
        return alive

    async def _build(self) -> LiveWorld:
        ctx, kind = self.lab.ctx, self.kind
        base = kind.removesuffix("-ready")
        if kind == "workflow":
            run = await leased_run(ctx, workflow_type=WORKFLOW_TYPE)
            world = self._world(run.queue, run.worker, run.workflow_id, run.run_id, task=run.task)
        elif base == "activity":
            act = await schedule_activities(ctx)
            world = self._world(act.queue, act.worker, act.workflow_id, act.run_id)
            if kind == "activity":
                world.task, _ = await lease_task(ctx, "activity", act.worker, act.queue)
        elif base == "query":
            parked = await waiting_run(ctx)
            world = self._world(parked.queue, parked.worker, parked.workflow_id, parked.run_id)
            world.query_call = self._start_query(world)
            if kind == "query":
                world.task, _ = await lease_task(ctx, "query", parked.worker, parked.queue, within=5.0)
        elif kind == "workflow-ready":  # the run's first task waits for the case's poll
            queue = ctx.uid("q")
            worker = await ctx.register(queue)
            workflow_id, run_id = await ctx.start(queue, workflow_type=WORKFLOW_TYPE)
            world = self._world(queue, worker, workflow_id, run_id)
        else:  # "parked": no worker at all, so a query is refused at once (no query target)
            parked = await waiting_run(ctx, register=False)
            world = self._world(parked.queue, parked.worker, parked.workflow_id, parked.run_id)
        world.renewed_at = self.lab.now().timestamp()
        return world

    def _world(self, queue: str, worker: str, workflow_id: str, run_id: str, **kw: Any) -> LiveWorld:
        return LiveWorld(self.kind, queue, worker, workflow_id, run_id, built_at=self.lab.now().timestamp(), **kw)

    def _start_query(self, world: LiveWorld) -> threading.Thread:
        """The control-plane query that waits for the worker's answer, on its own thread, loop and client (the
        cases go out while the lab's loop is idle)."""
        target = self.lab.target

        async def ask() -> None:
            async with target_client(target, timeout=CALL_TIMEOUT + 60) as client:
                # The world is rebuilt if its query task goes away.
                with contextlib.suppress(HarnessError, CheckFailure):
                    await client.control("POST", f"/workflows/{world.workflow_id}/query/fuzz", {})

        thread = threading.Thread(target=asyncio.run, args=(ask(),), name=f"fuzz-query-{world.workflow_id}")
        thread.daemon = True
        thread.start()
        return thread

    def close(self) -> None:
        """Release what the current world holds (a pending query call is answered so its thread ends)."""
        world, self.world = self.world, None
        if world is None or world.kind != "query" or world.task is None:
            return
        body = {"result_envelope": self.lab.ctx.envelope("fuzz")}
        with contextlib.suppress(HarnessError, WorldUnavailable):
            self.lab.run(query_call(self.lab.ctx, world.task, "complete", body))
        if world.query_call is not None:
            world.query_call.join(timeout=2.0)
