"""The smallest server the poll → complete benchmark can drive: the yardstick for the reference server.

Same stack as ``reference_server`` — asyncio streams, ``h11`` framing, one SQLite file in WAL mode with
``synchronous=FULL``, one ``BEGIN IMMEDIATE`` transaction per state-changing request — and nothing else: no
protocol version negotiation, no validation, no auth, no history (but with ``--protocol-answers``, below), no
fencing beyond the conditional update, no observers, no scheduler. It answers the four calls
``bench/poll_complete.py`` makes (register, start, poll, complete) and 404 to anything else. What the reference
server spends on top of this is the price of the protocol's rules; ``poll_complete.py --server both`` prints the
two side by side.

    python bench/minimal_server.py --port 0 --db /tmp/minimal.sqlite     # prints its URL on the first line

Not a protocol implementation: it exists only to be measured against.

``--burn-ms`` is for calibrating the measurement, never for a figure: each poll that leases a task and each
completion first spends that much CPU (process time, busy), so the benchmark shows how its ratio answers to a
handler that costs more (``poll_complete.py --minimal-burn-ms``; bench/RESULTS.md, *What the ratio answers to*).

``--protocol-answers FILE`` answers as the protocol says a server answers, still with no validation, fencing
beyond the conditional update, lifecycle tables, observers or scheduler: every worker-plane answer carries the
envelope of §2.1 (``protocol_version`` and the ``server_capabilities`` object read from FILE, encoded once) and
the version header, every answer a ``Date`` (RFC 9110 §6.6.1); the runs keep their history (§8.2: a start
appends ``StartAccepted`` and ``WorkflowStarted``, a completion ``WorkflowCompleted``, each event's worker-plane
JSON written once); a poll answers the whole task object of §8.2 with the run's history inline and the 20
resume-context keys, a completion the fields of §8.7. It shows what of the reference server's cost is the size
of the answers the protocol asks for (``poll_complete.py --minimal-answers protocol``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sqlite3
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any

import h11

from suite.protocol.codec import encode_blob
from suite.protocol.fencing import rfc3339
from suite.protocol.payloads import RESUME_CONTEXT_KEYS

DDL = """
CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, task_queue TEXT, last_seen INTEGER);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, workflow_id TEXT UNIQUE, status TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, run_id TEXT, task_queue TEXT, status TEXT,
    lease_owner TEXT, attempt INTEGER, lease_expires_at INTEGER, created_at INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_ready ON tasks (task_queue, status, created_at);
"""

# --protocol-answers: what a run must keep for the answers (its type, queue and input; its history, each event as
# the worker-plane JSON object it is answered as).
PROTOCOL_DDL = """
ALTER TABLE runs ADD COLUMN workflow_type TEXT;
ALTER TABLE runs ADD COLUMN task_queue TEXT;
ALTER TABLE runs ADD COLUMN input_blob TEXT;
ALTER TABLE runs ADD COLUMN last_sequence INTEGER NOT NULL DEFAULT 0;
CREATE TABLE history (run_id TEXT, sequence INTEGER, event TEXT, PRIMARY KEY (run_id, sequence)) WITHOUT ROWID;
"""


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this process's CPU (``--burn-ms``)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


Answer = dict[str, Any] | bytes  # a JSON object, or one already encoded (--protocol-answers)


class Minimal:
    def __init__(self, path: str, burn_ms: float = 0.0) -> None:
        self.burn = burn_ms / 1000
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(DDL)
        self.ready = asyncio.Event()

    def tx(self, fn: Any, *args: Any) -> Any:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(*args)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return out

    async def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Answer]:
        now = time.time_ns() // 1000
        if method == "POST" and path == "/api/worker/register":
            self.tx(self._register, body, now)
            return 201, self._registered(body)
        if method == "POST" and path == "/api/workflows":
            run_id = uuid.uuid4().hex
            self.tx(self._start, run_id, body, now)
            self.ready.set()
            return 201, {"workflow_id": body["workflow_id"], "run_id": run_id}
        if method == "POST" and path == "/api/worker/workflow-tasks/poll":
            deadline = time.monotonic() + float(body.get("timeout_seconds", 1))
            while True:
                task = self.tx(self._claim, body["worker_id"], body["task_queue"], now)
                if task is not None and self.burn:
                    burn(self.burn)
                if task is not None or time.monotonic() >= deadline:
                    return 200, self._polled(task)
                self.ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ready.wait(), deadline - time.monotonic())
                now = time.time_ns() // 1000
        parts = path.split("/")
        if method == "POST" and len(parts) == 6 and parts[5] == "complete":
            if self.burn:
                burn(self.burn)
            attempt = int(body["workflow_task_attempt"])
            done = self.tx(self._complete, parts[4], body["lease_owner"], attempt, body, now)
            if not done:
                return 409, {"reason": "lease_owner_mismatch"}
            return 200, self._completed(parts[4], attempt, done)
        return 404, {"reason": "route_not_found"}

    def headers(self, path: str) -> list[tuple[str, str]]:
        """Headers of an answer besides ``content-type`` and ``content-length``: none."""
        return []

    def _register(self, body: dict[str, Any], now: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO workers VALUES (?, ?, ?)", (body["worker_id"], body["task_queue"], now))

    def _registered(self, body: dict[str, Any]) -> Answer:
        return {"registered": True}

    def _start(self, run_id: str, body: dict[str, Any], now: int) -> None:
        self.db.execute("INSERT INTO runs VALUES (?, ?, 'running', NULL)", (run_id, body["workflow_id"]))
        self._task(run_id, body["task_queue"], now)

    def _task(self, run_id: str, queue: str, now: int) -> None:
        self.db.execute(
            "INSERT INTO tasks VALUES (?, ?, ?, 'ready', NULL, 0, NULL, ?)", (uuid.uuid4().hex, run_id, queue, now)
        )

    def _claim(self, worker_id: str, queue: str, now: int) -> Any:
        row = self.db.execute(
            "SELECT task_id, run_id, attempt FROM tasks WHERE task_queue=? AND status='ready' "
            "ORDER BY created_at LIMIT 1",
            (queue,),
        ).fetchone()
        if row is None:
            return None
        task_id, run_id, attempt = row
        self._lease(task_id, worker_id, attempt + 1, now)
        return {"task_id": task_id, "run_id": run_id, "lease_owner": worker_id, "workflow_task_attempt": attempt + 1}

    def _lease(self, task_id: str, worker_id: str, attempt: int, now: int) -> None:
        self.db.execute(
            "UPDATE tasks SET status='leased', lease_owner=?, attempt=?, lease_expires_at=? WHERE task_id=?",
            (worker_id, attempt, now + LEASE_US, task_id),
        )
        self.db.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))

    def _polled(self, task: Any) -> Answer:
        return {"task": task}

    def _complete(self, task_id: str, owner: str, attempt: int, body: dict[str, Any], now: int) -> Any:
        """The completion's writes; something true when it was accepted."""
        if not self._release(task_id, owner, attempt):
            return False
        self.db.execute(
            "UPDATE runs SET status='completed', result=? WHERE run_id=(SELECT run_id FROM tasks WHERE task_id=?)",
            (json.dumps(body.get("commands")), task_id),
        )
        return True

    def _release(self, task_id: str, owner: str, attempt: int) -> bool:
        cur = self.db.execute(
            "UPDATE tasks SET status='completed' WHERE task_id=? AND status='leased' AND lease_owner=? AND attempt=?",
            (task_id, owner, attempt),
        )
        return cur.rowcount == 1

    def _completed(self, task_id: str, attempt: int, done: Any) -> Answer:
        return {"outcome": "completed"}


LEASE_US = 30_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ProtocolAnswers(Minimal):
    """``--protocol-answers``: the same cycle, answered with what the protocol puts in each answer (module docstring).
    Still no validation, fencing beyond the conditional update, lifecycle tables, observers or scheduler; each
    answer is built the cheapest way (the capabilities and each history event encoded once, spliced in)."""

    def __init__(self, path: str, capabilities: dict[str, Any], burn_ms: float = 0.0) -> None:
        super().__init__(path, burn_ms)
        if "history" not in {row[0] for row in self.db.execute("SELECT name FROM sqlite_master")}:
            self.db.executescript(PROTOCOL_DDL)
        caps = json.dumps(capabilities, separators=(",", ":"), ensure_ascii=False).encode()
        self.envelope = b',"protocol_version":"1.20","server_capabilities":' + caps + b"}"
        self._date = (0, "")

    def headers(self, path: str) -> list[tuple[str, str]]:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True))
        extra = [("date", self._date[1])]
        if path.startswith("/api/worker/"):
            extra.append(("x-durable-workflow-protocol-version", "1.20"))
        return extra

    def _worker(self, members: dict[str, Any]) -> bytes:
        """``members`` then the envelope, as one JSON object."""
        return b"{" + _compact(members)[1:-1] + self.envelope

    def _registered(self, body: dict[str, Any]) -> Answer:
        return self._worker({"worker_id": body["worker_id"], "registered": True, "heartbeat_interval_seconds": 30})

    def _start(self, run_id: str, body: dict[str, Any], now: int) -> None:
        input_blob = encode_blob(body.get("input", []))
        self.db.execute(
            "INSERT INTO runs (run_id, workflow_id, status, workflow_type, task_queue, input_blob, last_sequence)"
            " VALUES (?, ?, 'pending', ?, ?, ?, 2)",
            (run_id, body["workflow_id"], body["workflow_type"], body["task_queue"], input_blob),
        )
        at = _ts(now)
        common = {"workflow_id": body["workflow_id"], "workflow_type": body["workflow_type"]}
        common |= {"task_queue": body["task_queue"], "run_id": run_id}
        started = {**common, "run_number": 1, "arguments": input_blob, "payload_codec": "avro", "timestamp": at}
        self._append(run_id, 1, "StartAccepted", common, None, at)
        self._append(run_id, 2, "WorkflowStarted", started, None, at)
        self._task(run_id, body["task_queue"], now)

    def _append(
        self, run_id: str, sequence: int, event_type: str, payload: dict[str, Any], task_id: str | None, at: str
    ) -> None:
        event = {"id": uuid.uuid4().hex, "sequence": sequence, "event_type": event_type, "namespace": "default"}
        event |= {"payload": payload, "workflow_task_id": task_id, "workflow_command_id": None}
        event |= {"recorded_at": at, "timestamp": at}
        self.db.execute("INSERT INTO history VALUES (?, ?, ?)", (run_id, sequence, _compact(event).decode()))

    def _claim(self, worker_id: str, queue: str, now: int) -> Any:
        """The leased task's object (§8.2) without its history, and the history's events as stored (JSON text)."""
        row = self.db.execute(
            "SELECT t.task_id, t.run_id, t.attempt, r.workflow_id, r.workflow_type, r.input_blob, r.last_sequence"
            " FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_queue=? AND t.status='ready'"
            " ORDER BY t.created_at LIMIT 1",
            (queue,),
        ).fetchone()
        if row is None:
            return None
        task_id, run_id, attempt, workflow_id, workflow_type, input_blob, last = row
        self._lease(task_id, worker_id, attempt + 1, now)
        events = self.db.execute(
            "SELECT event FROM history WHERE run_id=? ORDER BY sequence LIMIT 501", (run_id,)
        ).fetchall()
        task = {
            "task_id": task_id,
            "namespace": "default",
            "workflow_id": workflow_id,
            "run_id": run_id,
            "workflow_task_attempt": attempt + 1,
            "workflow_type": workflow_type,
            "payload_codec": "avro",
            "arguments": {"codec": "avro", "blob": input_blob},
            "run_status": "pending",
            "last_history_sequence": last,
            "total_history_events": last,
            "next_history_page_token": None,
            "has_more": False,
            "next_after_sequence": None,
            "task_queue": queue,
            "connection": None,
            "compatibility": None,
            "lease_owner": worker_id,
            "lease_expires_at": _ts(now + LEASE_US),
            **dict.fromkeys(RESUME_CONTEXT_KEYS),
        }
        return task, [event for (event,) in events]

    def _polled(self, task: Any) -> Answer:
        """Encoded after the claim's transaction: the history's events spliced in as stored."""
        if task is None:
            return self._worker({"task": None, "poll_status": "empty"})
        members, events = task
        history = b'"history_events":[' + ",".join(events).encode() + b"],"
        return b'{"task":{' + history + _compact(members)[1:] + b',"poll_status":"leased"' + self.envelope

    def _complete(self, task_id: str, owner: str, attempt: int, body: dict[str, Any], now: int) -> Any:
        if not self._release(task_id, owner, attempt):
            return None
        commands = body.get("commands") or [{}]
        result = commands[0].get("result")
        run_id, sequence = self.db.execute(
            "UPDATE runs SET status='completed', result=?, last_sequence=last_sequence+1"
            " WHERE run_id=(SELECT run_id FROM tasks WHERE task_id=?) RETURNING run_id, last_sequence",
            (json.dumps(commands), task_id),
        ).fetchone()
        payload = {"output": result, "result": {"codec": "avro", "blob": result}, "payload_codec": "avro"}
        self._append(run_id, sequence, "WorkflowCompleted", payload, task_id, _ts(now))
        return run_id

    def _completed(self, task_id: str, attempt: int, done: Any) -> Answer:
        return self._worker(
            {
                "task_id": task_id,
                "workflow_task_attempt": attempt,
                "outcome": "completed",
                "recorded": True,
                "run_id": done,
                "run_status": "completed",
                "created_task_ids": [],
                "reason": None,
            }
        )


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _ts(us: int) -> str:
    return rfc3339(_EPOCH + timedelta(microseconds=us))


async def serve_connection(app: Minimal, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                chunks = []
                while True:
                    part = conn.next_event()
                    if part is h11.NEED_DATA:
                        conn.receive_data(await reader.read(65536))
                    elif isinstance(part, h11.Data):
                        chunks.append(part.data)
                    elif isinstance(part, h11.EndOfMessage):
                        break
                raw = b"".join(chunks)
                status, doc = await app.handle(
                    event.method.decode(), event.target.decode().split("?")[0], json.loads(raw) if raw else {}
                )
                payload = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                headers = [("content-type", "application/json"), *app.headers(event.target.decode())]
                headers.append(("content-length", str(len(payload))))
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
                writer.write(conn.send(h11.Data(data=payload)))
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return
    except (ConnectionError, h11.ProtocolError):
        return
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> None:
    if args.protocol_answers is None:
        app = Minimal(args.db, args.burn_ms)
    else:
        capabilities = json.loads(Path(args.protocol_answers).read_text(encoding="utf-8"))
        app = ProtocolAnswers(args.db, capabilities, args.burn_ms)
    server = await asyncio.start_server(lambda r, w: serve_connection(app, r, w), args.host, args.port)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The minimal poll→complete server (the benchmark's yardstick).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--db", required=True)
    p.add_argument("--burn-ms", type=float, default=0.0, help="Calibration only: CPU ms per lease and completion.")
    p.add_argument(
        "--protocol-answers",
        metavar="CAPABILITIES_JSON",
        default=None,
        help="Answer as the protocol says (envelope, history, the whole task object), with these server_capabilities.",
    )
    args = p.parse_args(argv)
    if not 0 <= args.burn_ms < math.inf:  # NaN fails this too
        p.error("--burn-ms must be a finite number >= 0")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
