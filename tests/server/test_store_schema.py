"""The schema is applied at every start as whole transactions: never one commit (and one fsync) per statement,
and never half a script."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from reference_server import cancellation, sessions, store
from reference_server.config import Settings
from reference_server.server import Server
from reference_server.store import apply_schema

# Every CREATE of the server's three schema scripts: its own, the sessions' and cooperative cancellation's.
SCHEMA_CREATES = sum(len(re.findall(r"^CREATE ", ddl, re.M)) for ddl in (store.DDL, sessions.DDL, cancellation.DDL))


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_server_start_creates_its_schema_only_inside_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", traced)
    server = Server(Settings(db_path=str(tmp_path / "s.sqlite")))
    try:
        open_tx = False
        bare: list[str] = []
        creates = 0
        # A script's statement is traced with the comment lines before it.
        for text in (re.sub(r"^(\s*--[^\n]*\n)+", "", s).strip() for s in statements):
            head = text.split(None, 2)[:2]
            if head and head[0] == "BEGIN":
                open_tx = True
            elif head and head[0] in ("COMMIT", "ROLLBACK"):
                open_tx = False
            elif head and head[0] == "CREATE" and head[1] != "TEMP":  # the scheduler's watches are TEMP triggers
                creates += 1
                if not open_tx:
                    bare.append(text[:80])
        assert creates == SCHEMA_CREATES  # the whole schema went through this trace
        assert bare == []
        assert {"runs", "worker_sessions", "cancellation_requests"} <= _tables(server.store.db)
    finally:
        server.store.close()


def test_a_schema_that_fails_part_way_leaves_nothing_behind(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    with pytest.raises(sqlite3.OperationalError):
        apply_schema(db, "CREATE TABLE IF NOT EXISTS first (x);\nCREATE TABLE IF NOT EXISTS second (;")
    assert not db.in_transaction  # the connection is usable, not left inside the failed script's transaction
    assert _tables(db) == set()
    apply_schema(db, "CREATE TABLE IF NOT EXISTS first (x);\nCREATE TABLE IF NOT EXISTS second (y);")
    apply_schema(db, "CREATE TABLE IF NOT EXISTS first (x);\nCREATE TABLE IF NOT EXISTS second (y);")  # idempotent
    assert _tables(db) == {"first", "second"}
    db.close()
