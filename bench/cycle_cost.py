"""What one poll → complete cycle costs each server in process: SQL statements, WAL pages and CPU time.

The same workload as ``poll_complete.py`` (one worker, ``poll → complete_workflow`` on runs started before),
driven through each server's handler without sockets, so what is counted is the server's own work:

* **statements** — every statement the server hands SQLite, counted by its first word
  (``set_trace_callback``), per cycle;
* **WAL pages** — pages appended to the write-ahead log per cycle (the WAL file's growth, with automatic
  checkpoints off for the measurement only), i.e. what the two fsyncs of a cycle write;
* **CPU** — ``time.process_time`` per cycle, the handler path only (no HTTP framing, no scheduler loop).
  ``--pause-ms`` sleeps that long before each timed cycle, as a server with one worker idles between its
  requests: the same work then shows what it costs when it starts cold;
* **handler time** — the wall time inside the server's handler per cycle, without the driver's own work
  (building each request, decoding each answer); with ``--split``, divided into the time inside SQL statements
  (each ``execute`` timed through a ``sqlite3.Connection`` subclass) and the rest, the server's Python.

::

    python bench/cycle_cost.py                      # both servers, 1000 cycles each, on /dev/shm when present
    python bench/cycle_cost.py --server reference --cycles 3000 --profile   # + the top of a cProfile
    python bench/cycle_cost.py --pause-ms 1                                  # each timed cycle after 1 ms idle
    python bench/cycle_cost.py --split                                       # handler time: SQL and the rest

Counts are exact; the CPU figure is a measurement (load-dependent). Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib.util
import json
import os
import pstats
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from reference_server.config import Settings
from reference_server.http import Request
from reference_server.server import Server

ROOT = Path(__file__).resolve().parent.parent

WORKER = {"X-Durable-Workflow-Protocol-Version": "1.20", "Content-Type": "application/json"}
CONTROL = {"X-Durable-Workflow-Control-Plane-Version": "2", "Content-Type": "application/json"}
RESULT_BLOB = "wwHioz3/VYAiNwoIZG9uZQ=="  # as poll_complete.py: an Avro Value frame of "done"
WARM_UP = 50  # cycles run before counting: statement caches filled, first-time paths taken

Call = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


class Timing:
    """Wall time inside the handler, and (``--split``) inside SQL statements, while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.handler_ns = 0
        self.sql_ns = 0


TIMING = Timing()


class TimedConnection(sqlite3.Connection):
    """``--split``: a connection that adds the wall time of each statement it runs to :data:`TIMING`. Both servers
    run every statement through ``execute`` (``executemany`` only in faults this workload does not take); the
    timing's own cost, a Python call per statement, falls inside the SQL figure."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if not TIMING.on:
            return super().execute(sql, parameters)
        began = time.perf_counter_ns()
        try:
            return super().execute(sql, parameters)
        finally:
            TIMING.sql_ns += time.perf_counter_ns() - began


@contextmanager
def timed_connections() -> Iterator[None]:
    """Every ``sqlite3.connect`` meanwhile (a server opening its database) returns a :class:`TimedConnection`."""
    plain = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return plain(*args, factory=TimedConnection, **kwargs)

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = plain


def load_minimal() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_server", ROOT / "bench" / "minimal_server.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(path: Path) -> tuple[Call, sqlite3.Connection]:
    server = Server(Settings(db_path=str(path), lease_seconds=30))

    async def call(method: str, target: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = WORKER if target.startswith("/api/worker/") else CONTROL
        request = Request.from_target(method, target, headers=headers, body=json.dumps(body).encode())
        began = time.perf_counter_ns()
        response = await server.handle(request)
        TIMING.handler_ns += time.perf_counter_ns() - began
        return response.status, response.json()

    return call, server.store.db


def minimal(path: Path) -> tuple[Call, sqlite3.Connection]:
    app = load_minimal().Minimal(str(path))

    async def call(method: str, target: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        began = time.perf_counter_ns()
        status, doc = await app.handle(method, target, body)
        TIMING.handler_ns += time.perf_counter_ns() - began
        return int(status), dict(doc)

    return call, app.db


async def cycle(call: Call) -> None:
    status, doc = await call("POST", "/api/worker/workflow-tasks/poll", {"worker_id": "w", "task_queue": "bench"})
    task = doc.get("task")
    if status != 200 or task is None:
        raise RuntimeError(f"the poll leased nothing: {status} {doc}")
    body = {
        "lease_owner": "w",
        "workflow_task_attempt": task["workflow_task_attempt"],
        "commands": [{"type": "complete_workflow", "result": RESULT_BLOB}],
    }
    status, doc = await call("POST", f"/api/worker/workflow-tasks/{task['task_id']}/complete", body)
    if status != 200:
        raise RuntimeError(f"the completion was refused: {status} {doc}")


class Counted:
    """What :func:`counting` saw: statements by their first word, and WAL frames appended."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.wal_frames = 0.0


@contextmanager
def counting(db: sqlite3.Connection, path: Path) -> Iterator[Counted]:
    """Count the statements ``db`` runs meanwhile and the pages they append to the WAL of the database at ``path``.

    The WAL is emptied first and not checkpointed meanwhile, so it only grows; afterwards the connection's own
    checkpoint threshold is restored and the WAL emptied again: a WAL left to grow makes every page read search more
    of its index, so cycles timed after it would cost more the longer the counted run was."""
    counted = Counted()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    threshold = int(db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
    db.execute("PRAGMA wal_autocheckpoint=0")
    page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    wal = Path(f"{path}-wal")
    before = wal.stat().st_size if wal.exists() else 0
    db.set_trace_callback(lambda sql: counted.statements.update([sql.split(None, 1)[0].upper()]))
    try:
        yield counted
    finally:
        db.set_trace_callback(None)
        counted.wal_frames = (wal.stat().st_size - before) / (page_size + 24)  # a frame: a 24-byte header, one page
        db.execute(f"PRAGMA wal_autocheckpoint={threshold}")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


async def measure(
    kind: str, directory: str, cycles: int, profile: bool, pause_ms: float = 0.0, split: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dw-cycle-cost-", dir=directory) as tmp:
        path = Path(tmp) / "cycle.sqlite"
        with timed_connections() if split else contextlib.nullcontext():
            call, db = reference(path) if kind == "reference" else minimal(path)
        await call("POST", "/api/worker/register", {"worker_id": "w", "task_queue": "bench", "runtime": "python"})
        for i in range(WARM_UP + 2 * cycles):
            start = {"workflow_type": "bench", "workflow_id": f"bench-{i}", "task_queue": "bench", "input": []}
            status, doc = await call("POST", "/api/workflows", start)
            if status != 201:
                raise RuntimeError(f"start failed: {status} {doc}")
        for _ in range(WARM_UP):
            await cycle(call)

        # Counted: statements and WAL growth.
        with counting(db, path) as counted:
            for _ in range(cycles):
                await cycle(call)

        # Timed: the other half of the runs, nothing traced. A pause is a blocking sleep: the process idles (as a
        # server waiting for its one worker's next request), and process_time does not count it.
        profiler = cProfile.Profile() if profile else None
        TIMING.handler_ns = TIMING.sql_ns = 0
        TIMING.on = True
        began = time.process_time()
        if profiler is not None:
            profiler.enable()
        for _ in range(cycles):
            if pause_ms:
                time.sleep(pause_ms / 1000)
            await cycle(call)
        if profiler is not None:
            profiler.disable()
        cpu = time.process_time() - began
        TIMING.on = False
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return {
        "server": kind,
        "cycles": cycles,
        "statements_per_cycle": round(sum(counted.statements.values()) / cycles, 2),
        "statements_by_kind": {k: round(v / cycles, 2) for k, v in sorted(counted.statements.items())},
        "wal_pages_per_cycle": round(counted.wal_frames / cycles, 2),
        "cpu_ms_per_cycle": round(1000 * cpu / cycles, 3),
        "handler_ms_per_cycle": round(TIMING.handler_ns / 1e6 / cycles, 3),
        "sql_ms_per_cycle": round(TIMING.sql_ns / 1e6 / cycles, 3) if split else None,
        "pause_ms": pause_ms,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Statements, WAL pages and CPU per poll→complete cycle, in process.")
    p.add_argument("--server", choices=("reference", "minimal", "both"), default="both")
    p.add_argument("--cycles", type=int, default=1000, help="Cycles counted, and as many timed (default 1000).")
    p.add_argument(
        "--dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="Where the database lives (default /dev/shm when present: fsync costs nothing there).",
    )
    p.add_argument("--profile", action="store_true", help="Print the top of a cProfile of the timed cycles.")
    p.add_argument(
        "--split",
        action="store_true",
        help="Divide the handler's time into the time inside SQL statements and the rest (each statement timed).",
    )
    p.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="Idle this many milliseconds before each timed cycle (default 0: a tight loop).",
    )
    args = p.parse_args(argv)
    if args.cycles < 1:
        p.error("--cycles must be >= 1")
    if not 0 <= args.pause_ms <= 1000:
        p.error("--pause-ms must be between 0 and 1000")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = ["reference", "minimal"] if args.server == "both" else [args.server]
    results = []
    for kind in kinds:
        result = asyncio.run(measure(kind, args.dir, args.cycles, args.profile, args.pause_ms, args.split))
        results.append(result)
        handler = f"handler {result['handler_ms_per_cycle']} ms"
        if args.split:
            sql = result["sql_ms_per_cycle"]
            rest = round(result["handler_ms_per_cycle"] - sql, 3)
            handler += f" (SQL statements {sql} ms, the rest {rest} ms; statements timed)"
        print(
            f"{kind:>9}: {result['statements_per_cycle']} statements, {result['wal_pages_per_cycle']} WAL pages, "
            f"{result['cpu_ms_per_cycle']} ms CPU per cycle, {handler} (in process, {args.cycles} cycles"
            f"{f', {args.pause_ms:g} ms idle before each' if args.pause_ms else ''})",
            flush=True,
        )
    print(json.dumps({"benchmark": "cycle_cost", "results": results}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
