"""Poll and complete cost must not grow with the number of finished runs.

A server lives for years and keeps every finished run, task and history event, so the hot path — claiming a
task, reporting its outcome, renewing its lease — must find its rows through an index, never by reading every
row of a table that only grows. Two deterministic measures, no timers:

* **Query plans.** One full cycle (workflow poll → complete scheduling an activity → activity poll → heartbeat →
  complete → workflow poll → heartbeat → complete_workflow, then one scheduler pass) runs in process with every
  statement captured as the server binds it (SQL text and parameters; ``set_trace_callback`` confirms none was
  missed). ``EXPLAIN QUERY PLAN`` of each must not ``SCAN`` a table that grows with finished work: only
  ``SEARCH … USING INDEX`` or the primary key.
* **VM steps.** The same cycle is counted in SQLite virtual-machine steps (a ``set_progress_handler`` callback
  with N = 1) on a database with no finished runs and on one with 2,000 finished runs cloned from a real one.
  Each request must stay within a small constant factor: the scan this test found (every activity heartbeat and
  complete read all finished runs) added 20,000 steps to a 750-step request.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_server.config import Settings
from reference_server.http import Request
from reference_server.server import Server
from suite.protocol.codec import encode_blob
from tests.server.harness import CONTROL_HEADERS, WORKER_HEADERS, FakeClock, TracedConnection

# Tables whose size grows with every run ever finished (the first six are cloned by the seeding).
GROWING_TABLES = frozenset(
    {"workflow_tasks", "activity_tasks", "history", "runs", "activity_executions", "activity_attempts"}
)
ALSO_GROWING = frozenset(
    {"timers", "children", "signals", "updates", "condition_waits", "query_tasks", "poll_requests"}
)
FINISHED_RUNS = 2_000
MAX_GROWTH = 1.25  # steps with 2,000 finished runs / steps with none, per request


# -- capturing what the server asks SQLite -------------------------------------------------------------------


@dataclass
class Recording:
    statements: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    traced: list[str] = field(default_factory=list)
    steps: int = 0
    on: bool = False


class RecordingConnection(TracedConnection):
    """Stands in for the server's ``sqlite3.Connection``: records each statement with its parameters, and each
    statement SQLite traces."""

    def __init__(self, db: sqlite3.Connection, recording: Recording) -> None:
        super().__init__(db, self._traced)
        self._recording = recording

    def _traced(self, sql: str) -> None:
        if self._recording.on:
            self._recording.traced.append(sql)

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> sqlite3.Cursor:
        if self._recording.on:
            self._recording.statements.append((sql, tuple(parameters)))
        return super().execute(sql, parameters)


def instrument(server: Server) -> Recording:
    recording = Recording()
    db = server.store.db

    def step() -> int:
        if recording.on:
            recording.steps += 1
        return 0  # 0 = go on

    db.set_progress_handler(step, 1)  # called for every virtual-machine instruction
    server.store.db = RecordingConnection(db, recording)  # type: ignore[assignment]
    return recording


@contextmanager
def recording(rec: Recording) -> Iterator[None]:
    rec.on = True
    try:
        yield
    finally:
        rec.on = False


# -- the cycle ------------------------------------------------------------------------------------------------


def new_server(path: Path) -> Server:
    return Server(Settings(db_path=str(path), long_poll_min_seconds=0), clock=FakeClock())


async def call(server: Server, method: str, path: str, body: Any = None, *, control: bool = False) -> Any:
    request = Request.from_target(
        method, path, headers=CONTROL_HEADERS if control else WORKER_HEADERS, body=json.dumps(body).encode()
    )
    response = await server.handle(request)
    assert response.status < 300, response.body
    return response.json()


async def start(server: Server, workflow_id: str) -> None:
    body = {"workflow_type": "orders", "workflow_id": workflow_id, "task_queue": "q", "input": ["x"]}
    await call(server, "POST", "/api/workflows", body, control=True)


async def cycle(server: Server, around: Callable[[str], Any]) -> None:
    """Drive one started run to completion; ``around(name)`` wraps each request (a context manager)."""
    poll = {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 0}
    with around("workflow poll"):
        task = (await call(server, "POST", "/api/worker/workflow-tasks/poll", poll))["task"]
    fence = {"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"]}
    schedule = {"type": "schedule_activity", "activity_type": "charge", "arguments": encode_blob(["x"])}
    with around("workflow complete (schedule_activity)"):
        await call(
            server, "POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", {**fence, "commands": [schedule]}
        )
    with around("activity poll"):
        activity = (await call(server, "POST", "/api/worker/activity-tasks/poll", poll))["task"]
    act_fence = {"lease_owner": "w1", "activity_attempt_id": activity["activity_attempt_id"]}
    with around("activity heartbeat"):
        await call(server, "POST", f"/api/worker/activity-tasks/{activity['task_id']}/heartbeat", act_fence)
    with around("activity complete"):
        body = {**act_fence, "result": encode_blob("ok")}
        await call(server, "POST", f"/api/worker/activity-tasks/{activity['task_id']}/complete", body)
    with around("workflow poll (resume)"):
        task = (await call(server, "POST", "/api/worker/workflow-tasks/poll", poll))["task"]
    fence = {"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"]}
    with around("workflow heartbeat"):
        await call(server, "POST", f"/api/worker/workflow-tasks/{task['task_id']}/heartbeat", fence)
    done = {"type": "complete_workflow", "result": encode_blob({"done": True})}
    with around("workflow complete (complete_workflow)"):
        await call(
            server, "POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", {**fence, "commands": [done]}
        )
    # The background scheduler's pass (timers, child retries, run and activity timeouts) runs at least once a
    # second whatever the load, so it is held to the same rule.
    with around("scheduler pass"):
        server.run_tx(server.scheduler.maintenance_pass)


async def prepare(server: Server) -> None:
    await call(server, "POST", "/api/worker/register", {"worker_id": "w1", "task_queue": "q", "runtime": "python"})


# -- seeding finished runs --------------------------------------------------------------------------------------

# Columns that hold an id of a run, workflow, task, execution, attempt or event: a clone gets its own.
_ID_COLUMNS = frozenset(
    {
        "run_id",
        "workflow_id",
        "first_run_id",
        "event_id",
        "task_id",
        "execution_id",
        "current_task_id",
        "current_attempt_id",
        "attempt_id",
    }
)


def clone_finished_runs(db: sqlite3.Connection, copies: int) -> None:
    """Copy every row of the (finished) runs already in the database ``copies`` times, with fresh ids."""
    db.execute("BEGIN IMMEDIATE")
    for table in sorted(GROWING_TABLES):
        columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        select = ", ".join(f"{c} || '~' || n.i" if c in _ID_COLUMNS else c for c in columns)
        db.execute(
            f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {copies})"
            f" INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table}, n"
        )
    db.execute("UPDATE runs SET is_current = 1")
    db.execute("COMMIT")


async def world(path: Path, finished: int) -> Server:
    """A server whose database holds ``finished`` completed runs (each a full cycle) and one fresh run."""
    server = new_server(path)
    await prepare(server)
    if finished:
        await start(server, "seed")
        await cycle(server, lambda name: _nothing())
        clone_finished_runs(server.store.db, finished - 1)
        count = server.store.db.execute("SELECT COUNT(*) FROM runs WHERE status = 'completed'").fetchone()[0]
        assert count == finished
    await start(server, "measured")
    return server


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# -- plans ------------------------------------------------------------------------------------------------------

_ALIAS = re.compile(
    r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?:AS\s+)?(?!WHERE\b|ON\b|JOIN\b|LEFT\b|ORDER\b|LIMIT\b)(\w+))?", re.I
)
_SKIP = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|PRAGMA|SAVEPOINT|RELEASE)\b", re.I)


def full_scans(db: sqlite3.Connection, sql: str, parameters: tuple[Any, ...]) -> list[str]:
    """The plan lines of ``sql`` that read a growing table from end to end."""
    aliases = {m.group(2) or m.group(1): m.group(1) for m in _ALIAS.finditer(sql)}
    bad = []
    for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", parameters):
        detail = row[3]
        m = re.match(r"SCAN (\w+)", detail)
        if m and aliases.get(m.group(1), m.group(1)) in GROWING_TABLES | ALSO_GROWING:
            bad.append(detail)
    return bad


def test_claim_complete_and_heartbeat_statements_use_indexes(tmp_path: Path) -> None:
    async def scenario() -> Recording:
        server = await world(tmp_path / "plans.sqlite", finished=0)
        rec = instrument(server)
        await cycle(server, lambda name: recording(rec))
        await server.close()
        return rec

    rec = asyncio.run(scenario())
    statements = [(sql, params) for sql, params in rec.statements if not _SKIP.match(sql)]
    traced = [sql for sql in rec.traced if not _SKIP.match(sql)]
    assert len(statements) == len(traced) > 0, "a statement bypassed the recording connection"

    db = sqlite3.connect(tmp_path / "plans.sqlite")
    try:
        scans = {sql: found for sql, params in statements if (found := full_scans(db, sql, params))}
    finally:
        db.close()
    assert not scans, "statements that scan a growing table:\n" + "\n".join(
        f"{found}: {' '.join(sql.split())}" for sql, found in scans.items()
    )


def test_explain_finds_a_scan_when_there_is_one() -> None:
    """The plan check itself can fail: an unindexed filter on a growing table is reported."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, status TEXT)")
    assert full_scans(db, "SELECT * FROM runs r WHERE r.status = ?", ("completed",)) == ["SCAN r"]
    assert full_scans(db, "SELECT * FROM runs WHERE run_id = ?", ("x",)) == []
    db.close()


def test_cycle_cost_does_not_grow_with_finished_runs(tmp_path: Path) -> None:
    async def measure(finished: int) -> dict[str, int]:
        server = await world(tmp_path / f"steps-{finished}.sqlite", finished)
        rec = instrument(server)
        counts: dict[str, int] = {}

        @contextmanager
        def counted(name: str) -> Iterator[None]:
            before = rec.steps
            with recording(rec):
                yield
            counts[name] = rec.steps - before

        await cycle(server, counted)
        await server.close()
        return counts

    empty = asyncio.run(measure(0))
    full = asyncio.run(measure(FINISHED_RUNS))
    report = "\n".join(f"{name}: {empty[name]} -> {full[name]} steps" for name in empty)
    assert all(full[name] <= MAX_GROWTH * empty[name] for name in empty), report
