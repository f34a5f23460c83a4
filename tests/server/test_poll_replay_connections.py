"""§7.3 poll replay across HTTP connections, over real loopback sockets, and the fault that ties it to one.

A repeated poll (same namespace, task queue, build id, worker and ``poll_request_id``) while the lease it got
is live returns the same task and attempt, whichever connection carries it: the retry of a poll whose answer
was lost comes on a new connection, because the old one died with the answer. The fault
``poll-replay-forgotten-on-disconnect`` forgets the replay record when the connection that carried the poll
closes; a repeat on the still-open connection is replayed, so only a retry after a disconnect shows the bug.

Each scenario runs the server in process (``Server.start`` on port 0) and speaks HTTP/1.1 over raw asyncio
streams, so which connection carries which request is certain. Setup calls go through the in-process handler.
Closing a connection is processed by the server asynchronously; the tests wait for it (the shell's
``open_connections`` drops once its close callback has run) with a deadline, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reference_server.config import Settings
from reference_server.faults import installed
from reference_server.http import Request
from reference_server.server import Server
from suite.protocol.codec import encode_blob
from tests.server.harness import CONTROL_HEADERS, DEADLINE, WORKER_HEADERS, run_async, until

T = TypeVar("T")

FAULT = "poll-replay-forgotten-on-disconnect"
QUEUE = "replay-q"
WORKER = "w-replay"
POLL_ROUTES = {
    "workflow": "/api/worker/workflow-tasks/poll",
    "activity": "/api/worker/activity-tasks/poll",
    "query": "/api/worker/query-tasks/poll",
}
# The fields that name a leased task and its attempt, per kind (§8.2, §11.1, §10.2).
IDENTITY = {
    "workflow": ("task_id", "workflow_task_attempt"),
    "activity": ("task_id", "activity_attempt_id"),
    "query": ("query_task_id", "query_task_attempt"),
}


async def within(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, DEADLINE)


# -- transport -----------------------------------------------------------------------------------------------


class Connection:
    """One HTTP/1.1 keep-alive connection; requests on it are sent one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(data)}"]
        head += [f"{name}: {value}" for name, value in WORKER_HEADERS.items()]
        self.writer.write("\r\n".join([*head, "", ""]).encode() + data)
        raw_head = await within(self.reader.readuntil(b"\r\n\r\n"))
        status_line, *lines = raw_head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (ln.partition(":") for ln in lines if ln)}
        assert headers.get("connection") != "close", raw_head  # the connection must stay open
        payload = await within(self.reader.readexactly(int(headers["content-length"])))
        doc = json.loads(payload)
        assert isinstance(doc, dict), doc
        return int(status_line.split(" ", 2)[1]), doc

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await within(self.writer.wait_closed())


async def connect(server: Server) -> Connection:
    assert server.http is not None
    reader, writer = await within(asyncio.open_connection(server.http.host, server.http.port))
    return Connection(reader, writer)


async def in_process(server: Server, method: str, path: str, body: Any, *, control: bool = False) -> dict[str, Any]:
    request = Request.from_target(
        method, path, headers=CONTROL_HEADERS if control else WORKER_HEADERS, body=json.dumps(body).encode()
    )
    response = await within(server.handle(request))
    doc = response.json()
    assert response.status in (200, 201, 202), (path, response.status, doc)
    assert isinstance(doc, dict)
    return doc


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, faults: frozenset[str]) -> AsyncIterator[Server]:
    with installed(faults):
        server = Server(Settings(db_path=str(tmp_path / "db.sqlite")))
        await server.start("127.0.0.1", 0)
        try:
            yield server
        finally:
            await server.close()


# -- setup: one task of the kind, ready for WORKER ------------------------------------------------------------


async def prepare(server: Server, kind: str) -> asyncio.Task[dict[str, Any]] | None:
    """Start a run and make one task of ``kind`` claimable; returns the blocked control-plane query, if any."""
    await in_process(
        server,
        "POST",
        "/api/worker/register",
        {
            "worker_id": WORKER,
            "task_queue": QUEUE,
            "runtime": "python",
            "supported_activity_types": ["charge"],
            "capabilities": ["query_tasks"],
        },
    )
    await in_process(
        server,
        "POST",
        "/api/workflows",
        {"workflow_type": "orders", "workflow_id": f"wf-{kind}", "task_queue": QUEUE, "input": ["x"]},
        control=True,
    )
    if kind == "activity":
        # The run's first workflow task schedules the activity (claimed without a poll_request_id).
        polled = await in_process(server, "POST", POLL_ROUTES["workflow"], {"worker_id": WORKER, "task_queue": QUEUE})
        task = polled["task"]
        command = {
            "type": "schedule_activity",
            "activity_type": "charge",
            "arguments": {"codec": "avro", "blob": encode_blob(["order-17"])},
        }
        fence = {"lease_owner": WORKER, "workflow_task_attempt": task["workflow_task_attempt"], "commands": [command]}
        await in_process(server, "POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", fence)
    if kind != "query":
        return None
    # The control-plane query blocks until it is answered; it runs beside the worker calls.
    query = asyncio.get_running_loop().create_task(
        in_process(server, "POST", f"/api/workflows/wf-{kind}/query/status", {}, control=True)
    )
    store = server.store
    await until(lambda: store.read().execute("SELECT COUNT(*) FROM query_tasks").fetchone()[0] == 1)
    return query


def replay_rows(server: Server, poll_request_id: str) -> int:
    row = (
        server.store.read()
        .execute("SELECT COUNT(*) FROM poll_requests WHERE poll_request_id = ?", (poll_request_id,))
        .fetchone()
    )
    return int(row[0])


async def retry_after_disconnect(tmp_path: Path, kind: str, faults: frozenset[str]) -> dict[str, Any]:
    """Poll with a poll_request_id on connection A, repeat it on A, close A, wait until the server processed
    the close, then repeat it on a new connection B. Returns what each step saw."""
    async with serving(tmp_path, faults) as server:
        query = await prepare(server, kind)
        prid = f"{kind}-poll-1"
        poll = {"worker_id": WORKER, "task_queue": QUEUE, "timeout_seconds": 1, "poll_request_id": prid}
        route = POLL_ROUTES[kind]
        key = IDENTITY[kind]
        try:
            a = await connect(server)
            status, first = await a.post(route, poll)
            assert (status, first["poll_status"]) == (200, "leased"), first
            status, same_connection = await a.post(route, poll)
            assert status == 200, same_connection
            await a.close()
            http = server.http
            assert http is not None
            await until(lambda: http.open_connections == 0)  # the server has processed A's close
            rows_after_close = replay_rows(server, prid)
            b = await connect(server)
            status, retried = await b.post(route, poll)
            assert status == 200, retried
            await b.close()
        finally:
            if query is not None:
                query.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await query

        def identity(doc: dict[str, Any]) -> tuple[Any, ...] | None:
            task = doc["task"]
            return None if task is None else tuple(task[k] for k in key)

        return {
            "first": identity(first),
            "same_connection": identity(same_connection),
            "rows_after_close": rows_after_close,
            "retried": identity(retried),
            "retried_status": retried["poll_status"],
        }


# -- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["workflow", "activity", "query"])
def test_a_poll_retried_on_a_new_connection_after_a_disconnect_is_replayed(tmp_path: Path, kind: str) -> None:
    seen = run_async(retry_after_disconnect(tmp_path, kind, frozenset()))
    assert seen["first"] is not None
    assert seen["same_connection"] == seen["first"]
    assert seen["rows_after_close"] == 1  # closing the connection forgets nothing
    assert seen["retried_status"] == "leased"
    assert seen["retried"] == seen["first"]  # same task, same attempt


@pytest.mark.parametrize("kind", ["workflow", "activity", "query"])
def test_fault_forgets_the_replay_when_the_connection_closes_but_replays_on_the_open_one(
    tmp_path: Path, kind: str
) -> None:
    seen = run_async(retry_after_disconnect(tmp_path, kind, frozenset({FAULT})))
    assert seen["first"] is not None
    # Invisible without a disconnect: the repeat on the open connection is replayed as §7.3 demands.
    assert seen["same_connection"] == seen["first"]
    # The bug: the close deleted the replay record, so the retry on B finds the task leased and gets nothing.
    assert seen["rows_after_close"] == 0
    assert seen["retried_status"] == "empty"
    assert seen["retried"] is None


def test_fault_keeps_replays_for_concurrent_duplicates_on_open_connections(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tmp_path, frozenset({FAULT})) as server:
            await prepare(server, "workflow")
            poll = {"worker_id": WORKER, "task_queue": QUEUE, "timeout_seconds": 1, "poll_request_id": "dup-1"}
            a, b = await connect(server), await connect(server)
            _, first = await a.post(POLL_ROUTES["workflow"], poll)
            _, duplicate = await b.post(POLL_ROUTES["workflow"], poll)
            assert first["poll_status"] == duplicate["poll_status"] == "leased", (first, duplicate)
            key = IDENTITY["workflow"]
            assert [first["task"][k] for k in key] == [duplicate["task"][k] for k in key]
            assert replay_rows(server, "dup-1") == 1
            await a.close()
            await b.close()

    run_async(scenario())
