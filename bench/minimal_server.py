"""The smallest server the poll → complete benchmark can drive: the yardstick for the reference server.

Same stack as ``reference_server`` — asyncio streams, ``h11`` framing, one SQLite file in WAL mode with
``synchronous=FULL``, one ``BEGIN IMMEDIATE`` transaction per state-changing request — and nothing else: no
protocol version negotiation, no validation, no auth, no history, no fencing beyond the conditional update,
no observers, no scheduler. It answers the four calls ``bench/poll_complete.py`` makes (register, start, poll,
complete) and 404 to anything else. What the reference server spends on top of this is the price of the
protocol's rules; ``poll_complete.py --server both`` prints the two side by side.

    python bench/minimal_server.py --port 0 --db /tmp/minimal.sqlite     # prints its URL on the first line

Not a protocol implementation: it exists only to be measured against.

``--burn-ms`` is for calibrating the measurement, never for a figure: each poll that leases a task and each
completion first spends that much CPU (process time, busy), so the benchmark shows how its ratio answers to a
handler that costs more (``poll_complete.py --minimal-burn-ms``; bench/README.md, *What the ratio answers to*).
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
from typing import Any

import h11

DDL = """
CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, task_queue TEXT, last_seen INTEGER);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, workflow_id TEXT UNIQUE, status TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, run_id TEXT, task_queue TEXT, status TEXT,
    lease_owner TEXT, attempt INTEGER, lease_expires_at INTEGER, created_at INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_ready ON tasks (task_queue, status, created_at);
"""


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this process's CPU (``--burn-ms``)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


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

    async def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        now = time.time_ns() // 1000
        if method == "POST" and path == "/api/worker/register":
            self.tx(
                lambda: self.db.execute(
                    "INSERT OR REPLACE INTO workers VALUES (?, ?, ?)", (body["worker_id"], body["task_queue"], now)
                )
            )
            return 201, {"registered": True}
        if method == "POST" and path == "/api/workflows":
            run_id = uuid.uuid4().hex

            def start() -> None:
                self.db.execute("INSERT INTO runs VALUES (?, ?, 'running', NULL)", (run_id, body["workflow_id"]))
                self.db.execute(
                    "INSERT INTO tasks VALUES (?, ?, ?, 'ready', NULL, 0, NULL, ?)",
                    (uuid.uuid4().hex, run_id, body["task_queue"], now),
                )

            self.tx(start)
            self.ready.set()
            return 201, {"workflow_id": body["workflow_id"], "run_id": run_id}
        if method == "POST" and path == "/api/worker/workflow-tasks/poll":
            deadline = time.monotonic() + float(body.get("timeout_seconds", 1))
            while True:
                task = self.tx(self._claim, body["worker_id"], body["task_queue"], now)
                if task is not None and self.burn:
                    burn(self.burn)
                if task is not None or time.monotonic() >= deadline:
                    return 200, {"task": task}
                self.ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ready.wait(), deadline - time.monotonic())
                now = time.time_ns() // 1000
        parts = path.split("/")
        if method == "POST" and len(parts) == 6 and parts[5] == "complete":
            if self.burn:
                burn(self.burn)
            ok = self.tx(self._complete, parts[4], body["lease_owner"], int(body["workflow_task_attempt"]), body)
            return (200, {"outcome": "completed"}) if ok else (409, {"reason": "lease_owner_mismatch"})
        return 404, {"reason": "route_not_found"}

    def _claim(self, worker_id: str, queue: str, now: int) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT task_id, run_id, attempt FROM tasks WHERE task_queue=? AND status='ready' "
            "ORDER BY created_at LIMIT 1",
            (queue,),
        ).fetchone()
        if row is None:
            return None
        task_id, run_id, attempt = row
        self.db.execute(
            "UPDATE tasks SET status='leased', lease_owner=?, attempt=?, lease_expires_at=? WHERE task_id=?",
            (worker_id, attempt + 1, now + 30_000_000, task_id),
        )
        self.db.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))
        return {"task_id": task_id, "run_id": run_id, "lease_owner": worker_id, "workflow_task_attempt": attempt + 1}

    def _complete(self, task_id: str, owner: str, attempt: int, body: dict[str, Any]) -> bool:
        cur = self.db.execute(
            "UPDATE tasks SET status='completed' WHERE task_id=? AND status='leased' AND lease_owner=? AND attempt=?",
            (task_id, owner, attempt),
        )
        if cur.rowcount != 1:
            return False
        self.db.execute(
            "UPDATE runs SET status='completed', result=? WHERE run_id=(SELECT run_id FROM tasks WHERE task_id=?)",
            (json.dumps(body.get("commands")), task_id),
        )
        return True


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
                payload = json.dumps(doc).encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
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
    app = Minimal(args.db, args.burn_ms)
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
    args = p.parse_args(argv)
    if not 0 <= args.burn_ms < math.inf:  # NaN fails this too
        p.error("--burn-ms must be a finite number >= 0")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
