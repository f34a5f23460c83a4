"""Faults of durability: a workflow-task completion acknowledged before, or without, being kept."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import workflow_tasks as wt
from ..store import Store
from ..tx import T
from .patching import wraps


@wraps("complete-not-persisted", wt, "complete_workflow_task")
def _rolled_back(original: Callable[..., dict[str, Any]], t: T, *args: Any) -> dict[str, Any]:
    answer = original(t, *args)
    t.db.execute("ROLLBACK")  # the answer says completed, but nothing was kept
    t.db.execute("BEGIN IMMEDIATE")
    return answer


# -- completion-commit-deferred: the completion's transaction is left open after it was acknowledged; the ones
# after it nest in it as savepoints, and only a clean close commits them (a hard restart loses them all).


@dataclass
class _Hold:
    held: bool = False  # a transaction is open and everything since nests in it
    hold_next: bool = False  # the transaction running now stays open when it ends


_holds: dict[int, _Hold] = {}  # by id() of the store's connection (a connection takes no weak reference)


def _hold(db: sqlite3.Connection) -> _Hold:
    return _holds.setdefault(id(db), _Hold())


@wraps("completion-commit-deferred", wt, "complete_workflow_task")
def _acknowledged_uncommitted(original: Callable[..., dict[str, Any]], t: T, *args: Any) -> dict[str, Any]:
    answer = original(t, *args)
    _hold(t.db).hold_next = True
    return answer


@wraps("completion-commit-deferred", Store, "tx")
def _held_tx(original: Callable[..., Any], store: Store) -> Any:
    return _tx(store)


@contextmanager
def _tx(store: Store) -> Iterator[sqlite3.Connection]:
    hold, db = _hold(store.db), store.db
    if hold.held:
        db.execute("SAVEPOINT held")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK TO held")
            db.execute("RELEASE held")
            raise
        hold.hold_next = False
        db.execute("RELEASE held")
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        hold.hold_next = False
        db.execute("ROLLBACK")
        raise
    if hold.hold_next:
        hold.held, hold.hold_next = True, False
        return
    db.execute("COMMIT")


@wraps("completion-commit-deferred", Store, "close")
def _commit_at_clean_close(original: Callable[[Store], None], store: Store) -> None:
    hold = _holds.pop(id(store.db), None)
    if hold is not None and hold.held:  # the held transaction reaches the disk only now
        store.db.execute("COMMIT")
    original(store)
