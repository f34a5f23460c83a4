"""The server's one clock, and the test clock that a test build may move forward.

Everything time-driven in the server — lease expiry and redelivery, timers, retry backoff, activity and query
timeouts, long-poll holds and clamps, update and history waits, worker liveness, the ``Date`` header — reads
:meth:`ServerClock.now_us`. It is the system clock plus an **offset** that only grows: ``--test-clock`` lets a
conformance run add to it through ``POST /api/test/clock/advance`` instead of waiting, so a 3 s lease expires
at once and a 60 s long-poll clamp is reached in milliseconds.

The offset is durable: it is stored in the ``meta`` table in the same fsynced transaction that moves it, and
read back at start (with or without ``--test-clock``), so a server restarted after ``kill -9`` never goes back
in time — a lease granted under the moved clock does not live longer than it was granted for.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Protocol

__all__ = ["MAX_ADVANCE_SECONDS", "OFFSET_KEY", "Clock", "ServerClock", "SystemClock"]

# The ``meta`` row that holds the offset, in integer microseconds.
OFFSET_KEY = "clock_offset_us"
# One advance may move the clock at most a year: enough for any timer a test schedules, small enough that an
# instant stays far inside the range of 64-bit microseconds.
MAX_ADVANCE_SECONDS = 366 * 86_400


class Clock(Protocol):
    def now_us(self) -> int: ...


class SystemClock:
    """Wall-clock time in microseconds since the epoch (UTC)."""

    def now_us(self) -> int:
        return time.time_ns() // 1000


class ServerClock:
    """``base`` plus the durable offset. The only clock the server's parts read."""

    def __init__(self, base: Clock, offset_us: int = 0) -> None:
        self.base = base
        self.offset_us = offset_us

    def now_us(self) -> int:
        return self.base.now_us() + self.offset_us

    def now_seconds(self) -> float:
        """The same instant in seconds since the epoch (the ``Date`` header's clock)."""
        return self.now_us() / 1e6

    @staticmethod
    def load(db: sqlite3.Connection) -> int:
        """The offset stored in ``db`` (0 on a database that was never advanced)."""
        row = db.execute("SELECT value FROM meta WHERE key = ?", (OFFSET_KEY,)).fetchone()
        return int(row[0]) if row is not None else 0

    def store(self, db: sqlite3.Connection, offset_us: int) -> None:
        """Write ``offset_us`` in the caller's open transaction; :meth:`apply` it only after the commit."""
        db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (OFFSET_KEY, str(offset_us)),
        )

    def apply(self, offset_us: int) -> None:
        # The offset never shrinks: time on this server only moves forward.
        self.offset_us = max(self.offset_us, offset_us)
