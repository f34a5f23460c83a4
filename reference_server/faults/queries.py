"""Faults of query tasks: a report after the terminal one, and a query that writes history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import queries
from ..engine import append_event
from ..tx import T
from .patching import wraps


@wraps("query-reported-twice", queries, "report_query_task")
def _acknowledged_again(original: Callable[..., str], t: T, namespace: str, query_task_id: str, *args: Any) -> str:
    row = t.one("SELECT status FROM query_tasks WHERE query_task_id = ? AND namespace = ?", query_task_id, namespace)
    if row is not None and row["status"] in ("completed", "failed"):
        return str(row["status"])  # acknowledged instead of 409 query_task_not_leased
    return original(t, namespace, query_task_id, *args)


@wraps("query-writes-history", queries, "report_query_task")
def _recorded(original: Callable[..., str], t: T, namespace: str, query_task_id: str, *args: Any) -> str:
    status = original(t, namespace, query_task_id, *args)
    row = t.one("SELECT run_id FROM query_tasks WHERE query_task_id = ?", query_task_id)
    assert row is not None
    append_event(t, row["run_id"], "QueryCompleted", {"query_task_id": query_task_id})  # not read-only
    return status
