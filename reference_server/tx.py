"""One transaction of the reference server: the connection, the instant, the settings and the effects.

Every state change takes a :class:`T` — one open SQLite transaction, the current time and an effects
collector — so a route composes several steps into one atomic change. Effects (queue wake-ups, lifecycle
events for observers, the earliest deadline written for the scheduler) are published only after the transaction
commits: a notification is a hint that follows durable state, never the other way round (Dispatch, Lease and Hooks:
"the queue is a notification, the lease is ownership").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .config import Settings
from .store import Clock, Store

__all__ = ["DUE_FUNCTION", "Effects", "Engine", "T", "Watch"]

DUE_FUNCTION = "scheduler_due"
"""The SQL function the scheduler's watches (:class:`Watch`, TEMP triggers) call with each deadline a write puts on
the table they watch; the open transaction's effects keep the earliest (:attr:`Effects.due`)."""


@dataclass
class Effects:
    """What to publish after commit."""

    wake: set[tuple[str, str, str]] = field(default_factory=set)  # (kind, namespace, task_queue)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    run_changed: set[str] = field(default_factory=set)  # run ids whose waiters (updates, queries) re-check
    due: int | None = None  # the earliest deadline the transaction wrote for the scheduler (µs; 0 = at once)

    def note_due(self, *instants: int | None) -> None:
        """A watched write put scheduler work at ``instants`` (``None``: this one puts none)."""
        for at in instants:
            if at is not None and (self.due is None or at < self.due):
                self.due = int(at)

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
        self._open: T | None = None
        store.db.create_function(DUE_FUNCTION, -1, self._due_written)

    @contextmanager
    def tx(self) -> Iterator[T]:
        fx = Effects()
        with self.store.tx() as db:
            self._open = T(db=db, now=self.clock.now_us(), settings=self.settings, fx=fx)
            try:
                yield self._open
            finally:
                self._open = None

    def _due_written(self, *instants: int | None) -> None:
        # Looked up at each call: a scheduler step that fails gets its effects replaced (scheduler._pass).
        if self._open is not None:
            self._open.fx.note_due(*instants)

    def now(self) -> int:
        return self.clock.now_us()


@dataclass(frozen=True)
class Watch:
    """A write that can put a scheduler step's work (:mod:`reference_server.scheduler`) earlier than planned: a
    row of ``table`` inserted, or updated in one of ``columns``, for which ``when`` holds puts work at the
    earliest of ``due`` that is not NULL. ``when`` and each of ``due`` are SQL on the row as written (``NEW``)."""

    table: str
    columns: tuple[str, ...]
    when: str
    due: tuple[str, ...]

    def triggers(self, name: str) -> list[str]:
        """The TEMP triggers of this watch, named from ``name``: one after an insert, one after an update. A write
        with no deadline (most: a run started without timeouts) calls nothing back."""
        some = " OR ".join(f"({d}) IS NOT NULL" for d in self.due)
        body = f"WHEN ({self.when}) AND ({some}) BEGIN SELECT {DUE_FUNCTION}({', '.join(self.due)}); END"
        return [
            f"CREATE TEMP TRIGGER IF NOT EXISTS {name}_insert AFTER INSERT ON main.{self.table} {body}",
            f"CREATE TEMP TRIGGER IF NOT EXISTS {name}_update AFTER UPDATE OF {', '.join(self.columns)}"
            f" ON main.{self.table} {body}",
        ]
