"""Faults of query tasks: a report after the terminal one, a leased task failed by its run's close, a failed one
retried, and a query that writes history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from suite.protocol.lifecycles import QueryTaskStatus

from .. import closing, queries
from ..engine import append_event
from ..polling import Poll
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


@wraps("query-leased-failed-on-run-close", closing, "_close_open_work")
def _leased_failed_too(original: Callable[..., None], t: T, run_id: str, event: Any) -> None:
    """Closing a run fails its leased query tasks too, not only its pending ones: the holder's answer is refused
    and the caller is told the query was rejected."""
    original(t, run_id, event)
    for row in t.all("SELECT query_task_id, namespace FROM query_tasks WHERE run_id = ? AND status = 'leased'", run_id):
        t.db.execute(
            "UPDATE query_tasks SET status = ?, failure = ? WHERE query_task_id = ?",
            (QueryTaskStatus.FAILED.value, closing._QUERY_REJECTED, row["query_task_id"]),
        )
        t.fx.wake.add(queries.result_key(row["namespace"], row["query_task_id"]))


@wraps("query-failed-task-retried", queries, "claim_query_task")
def _failed_retried(original: Callable[..., dict[str, Any] | None], t: T, poll: Poll) -> dict[str, Any] | None:
    """A query task its worker failed goes to the next worker that polls its queue, as a retry (attempt + 1)."""
    leased = original(t, poll)
    if leased is not None:
        return leased
    row = t.one(
        "SELECT query_task_id FROM query_tasks WHERE namespace = ? AND task_queue = ? AND status = 'failed'"
        " AND deadline > ? AND lease_owner IS NOT NULL AND lease_owner != ? ORDER BY created_at LIMIT 1",
        poll.namespace,
        poll.queue,
        t.now,
        poll.worker_id,
    )
    if row is None:
        return None
    t.db.execute(
        "UPDATE query_tasks SET status = ?, attempt = attempt + 1, lease_owner = ?, lease_expires_at = ?"
        " WHERE query_task_id = ?",
        (
            QueryTaskStatus.LEASED.value,
            poll.worker_id,
            t.now + t.settings.query_lease_seconds * 1_000_000,
            row["query_task_id"],
        ),
    )
    return queries._task_payload(t, row["query_task_id"])
