"""Lifecycle observers observe and never own transitions (docs/reference.md: Dispatch), in process.

"Hooks observe and never own transitions. Telemetry fails open": an observer that raises, one that hangs and
one that scribbles on what it is given change nothing a client can see. The workload — register, start, the
first workflow task scheduling an activity, the activity completing, the second workflow task completing the
run — runs twice on a fake clock, once on a server without observers and once with all of them, and the two
transcripts (status, headers, body of every response) and the two databases (every row of every table) must be
identical once the random part of each id is replaced by its order of appearance.

The hanging observer's deliveries are still pending when the whole workload has been answered, so no request
waited for one. Abandonment is shown by ``ObserverSet.drain()`` returning while an observer still hangs, each of
its deliveries cancelled — no duration is asserted. ``--event-log`` writes exactly the transitions the observers
were offered, one JSON line each, in commit order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reference_server.__main__ import build_parser, settings_from_args
from reference_server.config import Settings
from reference_server.http import Request
from reference_server.server import Server
from suite.protocol.codec import encode_blob
from tests.server.harness import CONTROL_HEADERS, WORKER_HEADERS, FakeClock

ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
SAFETY_SECONDS = 30.0  # only a guard against a hung test; nothing asserts on how long anything took


# -- observers -------------------------------------------------------------------------------------------------


@dataclass
class Recorder:
    seen: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, transition: Mapping[str, Any]) -> None:
        self.seen.append(dict(transition))


def raising(transition: Mapping[str, Any]) -> None:
    raise RuntimeError(f"observer bug on {transition['entity']}")


def tampering(transition: Mapping[str, Any]) -> None:
    """Scribbles on its copy: nobody else may see it."""
    assert isinstance(transition, dict)
    transition["to"] = "tampered"
    transition.clear()


@dataclass
class Hanging:
    """An ``async`` observer that waits for ``gate``; counts deliveries started, finished and cancelled."""

    gate: asyncio.Event
    started: int = 0
    finished: int = 0
    cancelled: int = 0

    async def __call__(self, transition: Mapping[str, Any]) -> None:
        self.started += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1


# -- the workload ------------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    status: int
    headers: list[tuple[str, str]]
    body: Any


async def call(server: Server, method: str, path: str, body: Any = None, *, control: bool = False) -> Exchange:
    request = Request.from_target(
        method,
        path,
        headers=CONTROL_HEADERS if control else WORKER_HEADERS,
        body=b"" if body is None else json.dumps(body).encode(),
    )
    response = await server.handle(request)
    return Exchange(response.status, list(response.headers), response.json())


async def workload(server: Server) -> list[Exchange]:
    """start → poll → complete (schedule_activity) → activity poll → complete → poll → complete_workflow."""
    out: list[Exchange] = []

    async def step(method: str, path: str, body: Any = None, *, control: bool = False) -> Any:
        exchange = await call(server, method, path, body, control=control)
        assert exchange.status < 300, exchange.body
        out.append(exchange)
        return exchange.body

    poll = {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 0}
    await step("POST", "/api/worker/register", {"worker_id": "w1", "task_queue": "q", "runtime": "python"})
    start = {"workflow_type": "orders", "workflow_id": "wf-1", "task_queue": "q", "input": ["x"]}
    await step("POST", "/api/workflows", start, control=True)
    task = (await step("POST", "/api/worker/workflow-tasks/poll", poll))["task"]
    schedule = {"type": "schedule_activity", "activity_type": "charge", "arguments": encode_blob(["x"])}
    fence = {"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"]}
    await step("POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", {**fence, "commands": [schedule]})
    activity = (await step("POST", "/api/worker/activity-tasks/poll", poll))["task"]
    await step(
        "POST",
        f"/api/worker/activity-tasks/{activity['task_id']}/complete",
        {"lease_owner": "w1", "activity_attempt_id": activity["activity_attempt_id"], "result": encode_blob("ok")},
    )
    task = (await step("POST", "/api/worker/workflow-tasks/poll", poll))["task"]
    done = {"type": "complete_workflow", "result": encode_blob({"done": True})}
    fence = {"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"]}
    await step("POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", {**fence, "commands": [done]})
    await step("GET", "/api/workflows/wf-1", control=True)
    return out


def new_server(tmp_path: Path, name: str) -> Server:
    settings = Settings(db_path=str(tmp_path / f"{name}.sqlite"), long_poll_min_seconds=0)
    return Server(settings, clock=FakeClock())


def offered_batches(server: Server) -> list[dict[str, Any]]:
    """Wrap ``ObserverSet.offer`` to keep a copy of every committed transition, in the order offered."""
    offered: list[dict[str, Any]] = []
    offer = server.observers.offer

    def spy(transitions: list[dict[str, Any]]) -> None:
        offered.extend(dict(t) for t in transitions)
        offer(transitions)

    server.observers.offer = spy  # type: ignore[method-assign]
    return offered


def dump(server: Server) -> dict[str, list[tuple[Any, ...]]]:
    db = server.store.read()
    out: dict[str, list[tuple[Any, ...]]] = {}
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall():
        try:
            rows = db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        except sqlite3.OperationalError:  # WITHOUT ROWID (history): the primary key orders it
            rows = db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        out[table] = [tuple(row) for row in rows]
    return out


def canonical(value: Any) -> Any:
    """Replace each distinct id by its order of first appearance, so two runs compare equal."""
    names: dict[str, str] = {}
    text = json.dumps(value, default=repr)
    return json.loads(ULID.sub(lambda m: names.setdefault(m.group(0), f"<id{len(names)}>"), text))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, SAFETY_SECONDS))


# -- tests -------------------------------------------------------------------------------------------------------


def test_observers_change_no_response_and_no_committed_state(tmp_path: Path) -> None:
    async def plain() -> tuple[list[Exchange], dict[str, Any]]:
        server = new_server(tmp_path, "plain")
        transcript = await workload(server)
        state = dump(server)
        await server.close()
        return transcript, state

    recorder, after = Recorder(), Recorder()
    hanging = Hanging(asyncio.Event())

    async def observed() -> tuple[list[Exchange], dict[str, Any], list[dict[str, Any]]]:
        server = new_server(tmp_path, "observed")
        hanging.gate = asyncio.Event()  # bound to this loop
        server.observers.timeout = 3600.0  # the hanging deliveries outlive the workload
        offered = offered_batches(server)
        for observer in (raising, hanging, tampering, recorder, after):
            server.observers.add(observer)
        transcript = await workload(server)
        # Every request has been answered; let the offered deliveries start. None of them has finished hanging,
        # so no response waited for an observer.
        for _ in range(3):
            await asyncio.sleep(0)
        assert hanging.started == len(offered) > 0
        assert (hanging.finished, hanging.cancelled) == (0, 0)
        state = dump(server)
        hanging.gate.set()
        await server.observers.drain()
        assert hanging.finished == len(offered)
        await server.close()
        return transcript, state, offered

    base_transcript, base_state = run(plain())
    transcript, state, offered = run(observed())

    assert canonical([vars(e) for e in transcript]) == canonical([vars(e) for e in base_transcript])
    assert canonical(state) == canonical(base_state)
    # The recorder saw every committed transition once, in commit order, untouched by the tampering observer.
    assert recorder.seen == offered
    assert after.seen == offered
    run_moves = [(t["from"], t["to"]) for t in offered if t["entity"] == "run"]
    assert run_moves == [(None, "pending"), ("pending", "waiting"), ("waiting", "running"), ("running", "completed")]
    task_moves = [(t["from"], t["to"]) for t in offered if t["entity"] == "workflow_task"]
    assert task_moves == [(None, "ready"), ("ready", "leased"), ("leased", "completed")] * 2
    activity_moves = [(t["from"], t["to"]) for t in offered if t["entity"] == "activity_task"]
    assert activity_moves == [(None, "ready"), ("ready", "leased"), ("leased", "completed")]


def test_a_raising_observer_is_logged_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        server = new_server(tmp_path, "raising")
        offered = offered_batches(server)
        server.observers.add(raising)
        server.observers.add(recorder)
        await workload(server)
        await server.observers.drain()
        failures = server.observers.failures
        await server.close()
        return failures, offered

    with caplog.at_level(logging.WARNING, logger="reference_server.observers"):
        failures, offered = run(scenario())
    assert failures == len(offered) > 0
    assert recorder.seen == offered
    logged = [r for r in caplog.records if r.name == "reference_server.observers"]
    assert len(logged) == failures
    assert all(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in logged)


def test_a_hanging_observer_is_abandoned_at_the_observer_timeout(tmp_path: Path) -> None:
    recorder = Recorder()

    async def scenario() -> None:
        server = new_server(tmp_path, "hanging")
        server.observers.timeout = 0.01
        hanging = Hanging(asyncio.Event())  # never set: only the timeout ends a delivery
        offered = offered_batches(server)
        server.observers.add(hanging)
        server.observers.add(recorder)
        await workload(server)
        # drain() waits for every delivery; it can only return because each hanging one was abandoned.
        await server.observers.drain()
        assert hanging.started == hanging.cancelled == len(offered) > 0
        assert hanging.finished == 0
        assert server.observers.failures == len(offered)
        assert recorder.seen == offered
        await server.close()

    run(scenario())


def test_event_log_writes_one_json_line_per_transition(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    args = build_parser().parse_args(["--db", str(tmp_path / "log.sqlite"), "--event-log", str(log)])
    settings = settings_from_args(args)
    assert settings.event_log == str(log)
    recorder = Recorder()

    async def scenario() -> list[dict[str, Any]]:
        server = Server(settings, clock=FakeClock())
        offered = offered_batches(server)
        server.observers.add(raising)  # a failing neighbour does not cost the log a line
        server.observers.add(recorder)
        await workload(server)
        await server.close()  # drains the deliveries and closes the log file
        return offered

    offered = run(scenario())
    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(offered) > 0
    assert [json.loads(line) for line in lines] == offered == recorder.seen
