"""Durable state: one SQLite file in WAL mode, one transaction per state change.

Why SQLite used synchronously on the event loop: every transaction runs to its end without an
``await`` inside it, so no two requests interleave inside one state change, and the conditional
``UPDATE … WHERE lease_owner = ? AND attempt = ?`` that enforces fencing is the single point where a
race is decided. ``BEGIN IMMEDIATE`` takes the write lock up front, so a second process opening the
same file (e.g. after a restart while the old one is dying) cannot interleave either.

Times are stored as integer microseconds since the epoch (UTC), so comparisons in SQL are exact; the
wire format (RFC 3339) is produced at the edge.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from .clock import Clock, SystemClock

__all__ = [
    "SCHEMA_VERSION",
    "Clock",
    "Store",
    "SystemClock",
    "apply_schema",
    "dumps",
    "from_us",
    "loads",
    "new_id",
    "to_us",
]

SCHEMA_VERSION = 1

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now_us: int | None = None) -> str:
    """A 26-character ULID: 48 bits of milliseconds, 80 random bits, Crockford base32.

    Upstream uses ULIDs for task, run, attempt and query-task ids; ids stay opaque.
    """
    ms = (now_us if now_us is not None else time.time_ns() // 1000) // 1000
    v = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    # 26 characters of 5 bits are 130 bits, the 128-bit value with two leading zero bits: 13 pairs of characters,
    # each looked up by 10 bits (base64.b32encode is a Python loop in 3.11, and pads; this is a third of its time).
    p = _PAIRS
    return (
        p[v >> 120]
        + p[(v >> 110) & 1023]
        + p[(v >> 100) & 1023]
        + p[(v >> 90) & 1023]
        + p[(v >> 80) & 1023]
        + p[(v >> 70) & 1023]
        + p[(v >> 60) & 1023]
        + p[(v >> 50) & 1023]
        + p[(v >> 40) & 1023]
        + p[(v >> 30) & 1023]
        + p[(v >> 20) & 1023]
        + p[(v >> 10) & 1023]
        + p[v & 1023]
    )


_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)  # 10 bits → two Crockford characters


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(dt: datetime) -> int:
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    # Integer arithmetic on the epoch, exact to the microsecond (and no round trip through the C library's gmtime).
    return _EPOCH + timedelta(microseconds=us)


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


# Compact, UTF-8 text as it is. One encoder for every call: json.dumps builds a new one per call when given options.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


DDL = (resources.files(__package__) / "schema.sql").read_text(encoding="utf-8")
"""The schema (``schema.sql`` beside this module), applied at every start: every statement is idempotent."""


def apply_schema(db: sqlite3.Connection, ddl: str) -> None:
    """Apply ``ddl`` (idempotent ``CREATE … IF NOT EXISTS`` statements) as one transaction.

    Run bare, each statement would commit on its own, with an fsync each (``synchronous=FULL``); as one
    transaction the whole script costs one. And a start that fails part-way leaves none of the script behind,
    where a bare script would leave the statements before the one that failed."""
    try:
        db.executescript(f"BEGIN IMMEDIATE;\n{ddl}\nCOMMIT;")
    except BaseException:
        if db.in_transaction:  # executescript stops at the failing statement, inside the transaction
            db.execute("ROLLBACK")
        raise


class Store:
    """The SQLite file and the one way to change it: :meth:`tx`."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly one `tx` block.
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a transaction acknowledged to a client is on disk before the response is written.
        self.db.execute("PRAGMA synchronous=FULL")
        # A checkpoint copies the WAL into the database file and fsyncs it, inside whichever commit crosses the
        # threshold. Every 4,000 pages (16 MiB at 4 KiB) instead of SQLite's 1,000: a quarter as many of those
        # pauses, each writing a page changed many times once. Durability is the WAL's, fsynced at every commit.
        self.db.execute("PRAGMA wal_autocheckpoint=4000")
        self.db.execute("PRAGMA foreign_keys=OFF")
        self.db.execute("PRAGMA busy_timeout=5000")
        apply_schema(self.db, DDL)
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One atomic state change. Never ``await`` inside: the block must run to its end."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def read(self) -> sqlite3.Connection:
        """The connection for reads outside a transaction (each statement sees committed state)."""
        return self.db

    def close(self) -> None:
        self.db.close()
