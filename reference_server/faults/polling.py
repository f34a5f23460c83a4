"""Faults of the long poll and its replay cache: wake-ups, the hold's clamp, and which poll is answered again."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from .. import activities, polling, workflow_tasks
from ..http import HttpServer
from ..polling import Poller
from ..tx import T
from .patching import wraps


@wraps("poll-ignores-wakeups", Poller, "wait_for_work")
async def _deaf(original: Callable[..., Any], poller: Poller, ev: asyncio.Event, seconds: float) -> None:
    await asyncio.sleep(seconds)  # new work waits for the end of the hold


@wraps("long-poll-clamp-unadvertised", Poller, "longest_hold")
def _spec_clamp(original: Callable[[Poller], float], poller: Poller) -> float:
    return 60.0  # the spec's ceiling, not the shorter one this server advertises


@wraps("replay-for-any-worker", polling, "cached_poll")
def _any_worker(original: Callable[..., sqlite3.Row | None], t: T, key: tuple[str, ...]) -> sqlite3.Row | None:
    """The cache is also looked up without the worker, so another worker's poll reusing the poll_request_id is
    answered with the owner's lease."""
    row = original(t, key)
    if row is None:
        row = t.one(
            "SELECT task_id, attempt, worker_id FROM poll_requests WHERE namespace = ? AND kind = ?"
            " AND task_queue = ? AND build_id = ? AND poll_request_id = ?",
            *key[:4],
            key[5],
        )
    return row


# -- poll-replay-forgotten-on-disconnect: idempotency state tied to the connection. When a connection ends, the
# replay rows of the polls answered with a task on it are deleted, so a poll retried on a new connection after its
# answer was lost gets no replay; duplicates on an open connection, and concurrent ones, still replay.

# connection id → the poller that answered and the poll_requests rows (namespace, kind, worker_id,
# poll_request_id, task_id) of the polls it answered with a task on that connection
_by_connection: dict[int, tuple[Poller, set[tuple[str, str, str, str, str]]]] = {}
_TASK_ID = {"workflow": "task_id", "activity": "task_id", "query": "query_task_id"}


@wraps("poll-replay-forgotten-on-disconnect", Poller, "serve")
async def _tie_to_connection(
    original: Callable[..., Any], poller: Poller, ctx: Any, kind: str, *args: Any
) -> tuple[int, dict[str, Any]]:
    status, out = await original(poller, ctx, kind, *args)
    body, task, connection_id = ctx.obj(), out.get("task"), ctx.request.connection_id
    if isinstance(task, dict) and body.get("poll_request_id") and connection_id:  # in process: no connection
        row = (ctx.namespace, kind, str(body["worker_id"]), str(body["poll_request_id"]), str(task[_TASK_ID[kind]]))
        _by_connection.setdefault(connection_id, (poller, set()))[1].add(row)
    return status, out


@wraps("poll-replay-forgotten-on-disconnect", HttpServer, "__init__")
def _forget_on_close(original: Callable[..., None], server: HttpServer, *args: Any, **kwargs: Any) -> None:
    original(server, *args, **{**kwargs, "on_connection_closed": _forget})


def _forget(connection_id: int) -> None:
    entry = _by_connection.pop(connection_id, None)
    if entry is None:
        return
    poller, rows = entry
    poller.core.run_tx(
        lambda t: t.db.executemany(
            "DELETE FROM poll_requests WHERE namespace = ? AND kind = ? AND worker_id = ?"
            " AND poll_request_id = ? AND task_id = ?",
            sorted(rows),
        )
    )


@wraps("match-any-workflow-type", workflow_tasks, "registered_workflow_types")
def _any_workflow_type(original: Callable[[sqlite3.Row], str], worker: sqlite3.Row) -> str:
    return "[]"  # every worker on the queue is offered every workflow task, whatever types it registered


@wraps("match-any-activity-type", activities, "registered_activity_types")
def _any_activity_type(original: Callable[[sqlite3.Row], list[str]], worker: sqlite3.Row) -> list[str]:
    return []  # every worker on the queue is offered every activity task, whatever types it registered


@wraps("poll-default-hold-one-second", polling, "default_hold")
def _short_default(original: Callable[..., int], settings: Any) -> int:
    return 1  # a poll without timeout_seconds answers empty after 1 s, not the default 30 s
