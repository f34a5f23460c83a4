"""A shared in-process harness for the workflow-task, control-plane and semantics tests of the reference server.

One :class:`Harness` is one server on its own SQLite file, driven through ``Server.handle`` (no sockets) with a
:class:`FakeClock` the test moves by hand: leases, timers, backoffs and deadlines are reached by advancing the
clock, never by sleeping. The background scheduler is not running; :meth:`Harness.maintain` runs one scheduler
pass (due timers, child retries, run timeouts) when a test wants time-driven work to happen.

Polls hold 0 s (``long_poll_min_seconds=0`` and ``timeout_seconds: 0``), so an empty queue answers at once and
a synchronous call never waits on the hub. Calls that must block (an update waiting for completion) use the
``a*`` coroutine variants inside one event loop, with :func:`until` and :data:`DEADLINE` as hang guards only.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import pytest

from reference_server.config import Settings
from reference_server.engine import RESUME_KEYS
from reference_server.http import Request, Response
from reference_server.server import Server
from reference_server.store import from_us
from reference_server.tx import Effects, T

__all__ = [
    "CONTROL_HEADERS",
    "DEADLINE",
    "RESUME_KEYS",
    "WORKER_HEADERS",
    "Clocked",
    "FakeClock",
    "Harness",
    "HarnessFactory",
    "SchedulerDues",
    "TracedConnection",
    "harnesses",
    "run_async",
    "scenario",
    "until",
    "within",
]

R = TypeVar("R")
P = ParamSpec("P")

START_US = 1_800_000_000_000_000
# Hang guards for the few scenarios that block on the hub; never a performance assertion.
DEADLINE = 10.0
WORKER_HEADERS = {"X-Durable-Workflow-Protocol-Version": "1.20", "Content-Type": "application/json"}
CONTROL_HEADERS = {"X-Durable-Workflow-Control-Plane-Version": "2", "Content-Type": "application/json"}
ENVELOPE_KEYS = ("protocol_version", "server_capabilities")
# Every table a workflow-task, control-plane or activity call can write: the "a rejection changes nothing" probe.
STATE_TABLES = (
    "runs",
    "history",
    "workflow_tasks",
    "activity_executions",
    "activity_tasks",
    "activity_attempts",
    "timers",
    "children",
    "signals",
    "updates",
    "condition_waits",
    "poll_requests",
    "drains",
    "worker_sessions",
    "activity_sessions",
)


def run_async(coro: Coroutine[Any, Any, R]) -> R:
    return asyncio.run(asyncio.wait_for(coro, 3 * DEADLINE))


def scenario(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """A test written as a coroutine, run to its end on a fresh event loop by :func:`run_async`."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_async(test(*args, **kwargs))

    return run


async def within(awaitable: Awaitable[R]) -> R:
    """``awaitable``'s result; fails after :data:`DEADLINE`."""
    return await asyncio.wait_for(awaitable, DEADLINE)


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the other tasks until ``condition`` holds; fails after :data:`DEADLINE`."""

    async def spin() -> None:
        while not condition():
            await asyncio.sleep(0)

    await within(spin())


class FakeClock:
    """The server's only clock; tests move it forward explicitly."""

    def __init__(self) -> None:
        self.us = START_US

    def now_us(self) -> int:
        return self.us

    def advance(self, seconds: float) -> None:
        self.us += round(seconds * 1_000_000)


class Clocked:
    """What a harness with a :class:`FakeClock` can do with time."""

    clock: FakeClock
    server: Server

    def now(self) -> datetime:
        return from_us(self.clock.us)

    def maintain(self) -> float:
        """One scheduler pass; returns the seconds until the scheduler's next due work."""
        delay = self.server.run_tx(self.server.scheduler.maintenance_pass)
        assert isinstance(delay, float)
        return delay

    def elapse(self, seconds: float) -> float:
        """``seconds`` pass on the server's clock, then one scheduler pass (:meth:`maintain`) does what became
        due; returns the seconds until the scheduler's next due work."""
        self.clock.advance(seconds)
        return self.maintain()


class Harness(Clocked):
    """One server, a fake clock, and the calls a worker and an operator make."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.clock = FakeClock()
        self.server = Server(
            Settings(db_path=str(tmp_path / "db.sqlite"), long_poll_min_seconds=0, **settings), clock=self.clock
        )
        self.registered: dict[str, str] = {}  # worker_id → queue

    # -- transport -------------------------------------------------------------------------------------------

    @staticmethod
    def build(
        method: str,
        path: str,
        body: Any = None,
        *,
        control: bool = False,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Request:
        hdrs = dict(CONTROL_HEADERS if control else WORKER_HEADERS) if headers is None else headers
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return Request.from_target(method, path, headers=hdrs, body=data)

    async def arespond(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        return await self.server.handle(self.build(method, path, body, **kw))

    def respond(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        return asyncio.run(self.arespond(method, path, body, **kw))

    async def acall(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, Any]]:
        response = await self.arespond(method, path, body, **kw)
        doc = response.json()
        assert isinstance(doc, dict), doc
        return response.status, doc

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, Any]]:
        return asyncio.run(self.acall(method, path, body, **kw))

    def control(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, Any]]:
        return self.call(method, "/api" + path, body, control=True, **kw)

    def worker(self, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", "/api/worker" + path, body, **kw)

    # -- state -----------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row a rejected call could have touched (invariant 68)."""
        db = self.server.store.read()
        return {name: [tuple(r) for r in db.execute(f"SELECT * FROM {name} ORDER BY 1, 2")] for name in STATE_TABLES}

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in self.server.store.read().execute(sql, args).fetchall()]

    def run_of(self, task_id: str) -> str:
        """The run of a workflow task (``created_task_ids`` names a started run by its first task)."""
        [row] = self.rows("SELECT run_id FROM workflow_tasks WHERE task_id = ?", task_id)
        return str(row["run_id"])

    def open_tasks(self, run_id: str) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM workflow_tasks WHERE run_id = ? AND status IN ('ready', 'leased')", run_id)

    # -- control plane ---------------------------------------------------------------------------------------

    def start(
        self,
        workflow_id: str,
        *,
        queue: str = "q",
        workflow_type: str = "wf",
        input: Any = None,
        **extra: Any,
    ) -> str:
        body: dict[str, Any] = {"workflow_type": workflow_type, "workflow_id": workflow_id, "task_queue": queue}
        body["input"] = ["x"] if input is None else input
        status, doc = self.control("POST", "/workflows", {**body, **extra})
        assert status == 201, doc
        return str(doc["run_id"])

    def describe(self, workflow_id: str, run_id: str | None = None) -> dict[str, Any]:
        path = f"/workflows/{workflow_id}" + (f"/runs/{run_id}" if run_id else "")
        status, doc = self.control("GET", path)
        assert status == 200, doc
        return doc

    def history(self, workflow_id: str, run_id: str | None = None) -> list[dict[str, Any]]:
        run_id = run_id or str(self.describe(workflow_id)["run_id"])
        status, doc = self.control("GET", f"/workflows/{workflow_id}/runs/{run_id}/history?page_size=1000")
        assert status == 200, doc
        events: list[dict[str, Any]] = doc["events"]
        return events

    def event_types(self, workflow_id: str, run_id: str | None = None) -> list[str]:
        return [e["event_type"] for e in self.history(workflow_id, run_id)]

    def events(self, workflow_id: str, event_type: str, run_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.history(workflow_id, run_id) if e["event_type"] == event_type]

    def signal(self, workflow_id: str, name: str = "sig", **body: Any) -> dict[str, Any]:
        status, doc = self.control("POST", f"/workflows/{workflow_id}/signal/{name}", body)
        assert status == 202, doc
        return doc

    def update_accepted(self, workflow_id: str, name: str = "upd", **body: Any) -> str:
        status, doc = self.control("POST", f"/workflows/{workflow_id}/update/{name}", {"wait_for": "accepted", **body})
        assert status == 202, doc
        return str(doc["update_id"])

    def close(self, workflow_id: str, verb: str) -> None:
        status, doc = self.control("POST", f"/workflows/{workflow_id}/{verb}", {"reason": "test"})
        assert status == 200, doc

    # -- worker plane ----------------------------------------------------------------------------------------

    def register(self, worker_id: str = "w1", *, queue: str = "q", **extra: Any) -> None:
        status, doc = self.worker(
            "/register", {"worker_id": worker_id, "task_queue": queue, "runtime": "python", **extra}
        )
        assert status == 201, doc
        self.registered[worker_id] = queue

    def poll(self, worker_id: str = "w1", **extra: Any) -> tuple[int, dict[str, Any]]:
        if worker_id not in self.registered:
            self.register(worker_id)
        queue = self.registered[worker_id]
        return self.worker(
            "/workflow-tasks/poll", {"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 0, **extra}
        )

    def lease(self, worker_id: str = "w1", **extra: Any) -> dict[str, Any]:
        status, doc = self.poll(worker_id, **extra)
        assert (status, doc.get("poll_status")) == (200, "leased"), doc
        task: dict[str, Any] = doc["task"]
        return task

    def assert_empty(self, worker_id: str = "w1") -> None:
        status, doc = self.poll(worker_id)
        assert (status, doc["poll_status"], doc["task"]) == (200, "empty", None), doc

    def task_call(
        self, verb: str, task: dict[str, Any], *, owner: str | None = None, attempt: int | None = None, **body: Any
    ) -> tuple[int, dict[str, Any]]:
        doc = {
            "lease_owner": task["lease_owner"] if owner is None else owner,
            "workflow_task_attempt": task["workflow_task_attempt"] if attempt is None else attempt,
            **body,
        }
        return self.worker(f"/workflow-tasks/{task['task_id']}/{verb}", doc)

    def complete(self, task: dict[str, Any], *commands: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
        return self.task_call("complete", task, commands=list(commands), **kw)

    def completed(self, task: dict[str, Any], *commands: dict[str, Any]) -> dict[str, Any]:
        status, doc = self.complete(task, *commands)
        assert status == 200, doc
        return doc

    def fail(self, task: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
        return self.task_call("fail", task, failure={"message": "replay failed"}, **kw)

    def activity_lease(self, worker_id: str = "w1", **extra: Any) -> dict[str, Any]:
        if worker_id not in self.registered:
            self.register(worker_id)
        status, doc = self.worker(
            "/activity-tasks/poll",
            {"worker_id": worker_id, "task_queue": self.registered[worker_id], "timeout_seconds": 0, **extra},
        )
        assert (status, doc.get("poll_status")) == (200, "leased"), doc
        task: dict[str, Any] = doc["task"]
        return task

    def activity_report(self, verb: str, task: dict[str, Any], **body: Any) -> dict[str, Any]:
        doc = {"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"], **body}
        status, out = self.worker(f"/activity-tasks/{task['task_id']}/{verb}", doc)
        assert status == 200, out
        return out


HarnessFactory = Callable[..., Harness]


class TracedConnection:
    """Stands in for a server's ``sqlite3.Connection`` and hands ``on_statement`` every statement SQLite runs for it,
    once each, as SQLite traces it (``set_trace_callback``, installed here; the caller removes it). SQLite traces a
    statement once more for each trigger program it runs (the scheduler's watches, ``reference_server.tx.Watch``)
    while the statement runs: inside the same ``execute()``, after the statement's own trace. Those are left out."""

    def __init__(self, db: sqlite3.Connection, on_statement: Callable[[str], object]) -> None:
        self.db = db
        self._on_statement = on_statement
        self._executing = False  # inside execute()
        self._traced_it = False  # and the statement it runs was traced
        db.set_trace_callback(self._trace)

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> sqlite3.Cursor:
        self._executing, self._traced_it = True, False
        try:
            return self.db.execute(sql, parameters)
        finally:
            self._executing = False

    def _trace(self, sql: str) -> None:
        if self._executing and self._traced_it:
            return
        self._traced_it = self._executing
        self._on_statement(sql)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


class SchedulerDues:
    """What the scheduler's watches promise (``reference_server.tx.Watch``), checked on every transaction of one
    server: a transaction after which the scheduler's next due work is sooner than before it has noted a deadline
    at or before that instant, so a sleeping scheduler is woken in time.

    The seconds until the next due work are what a scheduler pass computes, on a second connection to the same
    file, in a transaction rolled back (the server's own connection, its trace and its counts are untouched).
    A transaction that raises changes nothing and is not judged."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._probe = sqlite3.connect(server.store.path, isolation_level=None, timeout=0)
        self._probe.row_factory = sqlite3.Row
        self._noted: list[int | None] = []
        self._run_tx, self._publish = server.run_tx, server.publish
        server.run_tx = self.run_tx  # type: ignore[method-assign]
        server.publish = self.publish  # type: ignore[method-assign]

    def due_in(self) -> float | None:
        """Seconds until the scheduler's next due work as a pass now finds it (``None``: the file is busy)."""
        engine = self.server.engine
        t = T(db=self._probe, now=engine.now(), settings=self.server.settings, fx=Effects())
        try:
            self._probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return None  # another transaction is open: nothing to compare with
        try:
            # Each step's own answer, not the pass's: that one is capped at scheduler_max_sleep_seconds.
            dues = [due for step in self.server.scheduler.steps if (due := step(t)) is not None]
        finally:
            self._probe.execute("ROLLBACK")
        return min(dues, default=math.inf)

    def publish(self, t: T) -> None:
        self._noted.append(t.fx.due)
        self._publish(t)

    def run_tx(self, fn: Callable[[T], R]) -> R:
        before = self.due_in()
        self._noted.clear()
        result = self._run_tx(fn)
        after = self.due_in()
        if before is not None and after is not None and after < before:
            due = self.server.engine.now() + round(after * 1_000_000)
            noted = [at for at in self._noted if at is not None]
            unseen = f"work came due {after:.6f} s from now (before: {before:.6f} s): no watch saw the write"
            assert noted, unseen
            assert min(noted) <= due + 1, f"{unseen} (it noted {noted})"
        return result

    def close(self) -> None:
        self._probe.close()


H = TypeVar("H", bound="_HasServer")


class _HasServer(Protocol):
    server: Server

    def __init__(self, tmp_path: Path, **settings: Any) -> None: ...


def harnesses(tmp_path: Path, cls: type[H]) -> Generator[Callable[..., H], None, None]:
    """Build harnesses of ``cls`` with extra settings, each on its own files; every one is closed after."""
    made: list[H] = []

    dues: list[SchedulerDues] = []

    def build(**settings: Any) -> H:
        harness = cls(tmp_path / f"server-{len(made)}", **settings)
        made.append(harness)
        dues.append(SchedulerDues(harness.server))
        return harness

    yield build
    for harness, checked in zip(made, dues, strict=True):
        checked.close()
        harness.server.store.close()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[HarnessFactory]:
    """Build a harness with extra settings; every one is closed after the test."""
    yield from harnesses(tmp_path, Harness)


@pytest.fixture
def h(make: HarnessFactory) -> Harness:
    return make(lease_seconds=60)
