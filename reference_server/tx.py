"""One transaction of the reference server: the connection, the instant, the settings and the effects.

Every state change takes a :class:`T` — one open SQLite transaction, the current time and an effects
collector — so a route composes several steps into one atomic change. Effects (queue wake-ups, lifecycle
events for observers) are published only after the transaction commits: a notification is a hint that
follows durable state, never the other way round (seed 003: "the queue is a notification, the lease is
ownership").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .config import Settings
from .store import Clock, Store

__all__ = ["Effects", "Engine", "T"]


@dataclass
class Effects:
    """What to publish after commit."""

    wake: set[tuple[str, str, str]] = field(default_factory=set)  # (kind, namespace, task_queue)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    run_changed: set[str] = field(default_factory=set)  # run ids whose waiters (updates, queries) re-check

    def transition(self, entity: str, entity_id: str, from_state: str | None, to_state: str, **extra: Any) -> None:
        self.transitions.append({"entity": entity, "id": entity_id, "from": from_state, "to": to_state, **extra})


@dataclass
class T:
    """One open transaction."""

    db: sqlite3.Connection
    now: int
    settings: Settings
    fx: Effects

    def one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute(sql, args).fetchone()
        return row

    def all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return list(self.db.execute(sql, args).fetchall())

    def row(self, table: str, key: str, value: Any) -> sqlite3.Row:
        """The row of ``table`` whose ``key`` column is ``value``; it must exist."""
        row = self.one(f"SELECT * FROM {table} WHERE {key} = ?", value)
        assert row is not None, (table, value)
        return row

    def run(self, run_id: str) -> sqlite3.Row:
        row = self.one("SELECT * FROM runs WHERE run_id = ?", run_id)
        assert row is not None, run_id
        return row


class Engine:
    """Owns the store and the clock; hands out transactions."""

    def __init__(self, store: Store, clock: Clock, settings: Settings) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings

    @contextmanager
    def tx(self) -> Iterator[T]:
        fx = Effects()
        with self.store.tx() as db:
            yield T(db=db, now=self.clock.now_us(), settings=self.settings, fx=fx)

    def now(self) -> int:
        return self.clock.now_us()
