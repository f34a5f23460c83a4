"""Faults of the history a workflow task shows: its pages, their cursor and cap, compression, and the events a
page leaves out, repeats or misnames."""

from __future__ import annotations

import contextvars
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from suite.protocol import history as hist
from suite.protocol.errors import Rejection

from .. import runs
from .. import workflow_tasks as wt
from ..engine import open_workflow_task
from ..tx import T
from .patching import wraps

_PAGE_SIZE_FIELDS = ("page_size", "history_page_size")


@wraps("compress-below-threshold", wt, "compression_threshold")
def _compress_always(original: Callable[[T], int], t: T) -> int:
    return 1  # an opted-in page is compressed whatever its size


@wraps("accept-invalid-page-token", wt, "task_history")
def _bad_token_from_start(
    original: Callable[..., dict[str, Any]], t: T, namespace: str, task_id: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    if body.get("next_history_page_token") is not None:
        try:
            hist.decode_page_token(body["next_history_page_token"])
        except Rejection:  # a token that does not decode is read as "from the start"
            body = {k: v for k, v in body.items() if k != "next_history_page_token"}
    return original(t, namespace, task_id, body)


# The page size over the cap that the history route is serving whole (history-page-uncapped), for the page below.
_uncapped: contextvars.ContextVar[int | None] = contextvars.ContextVar("uncapped", default=None)


@wraps("history-page-uncapped", wt, "task_history")
def _size_over_cap_allowed(
    original: Callable[..., dict[str, Any]], t: T, namespace: str, task_id: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    requested = body.get("page_size", body.get("history_page_size"))
    if not isinstance(requested, int) or requested <= hist.MAX_PAGE_SIZE:
        return original(t, namespace, task_id, body)
    token = _uncapped.set(requested)  # neither refused nor capped: the size is taken off, the page made whole
    try:
        return original(t, namespace, task_id, {k: v for k, v in body.items() if k not in _PAGE_SIZE_FIELDS})
    finally:
        _uncapped.reset(token)


@wraps("history-page-uncapped", wt, "history_route_page")
def _whole_page(
    original: Callable[..., hist.Page[dict[str, Any]]], t: T, task: sqlite3.Row, cursor: hist.Cursor
) -> hist.Page[dict[str, Any]]:
    requested = _uncapped.get()
    if requested is None:
        return original(t, task, cursor)
    whole = wt.worker_page(t, task, cursor.after_sequence, requested)
    return hist.Page(events=whole, has_more=False, next_after_sequence=None, next_history_page_token=None)


@wraps("history-page-gap", wt, "history_route_page")
def _skip_one(
    original: Callable[..., hist.Page[dict[str, Any]]], t: T, task: sqlite3.Row, cursor: hist.Cursor
) -> hist.Page[dict[str, Any]]:
    if cursor.after_sequence > 0:  # every page after the first starts one event late
        cursor = hist.Cursor(cursor.after_sequence + 1, cursor.page_size)
    return original(t, task, cursor)


@wraps("continue-as-new-chain-old-run", wt, "task_payload")
def _old_run_id(original: Callable[..., dict[str, Any]], t: T, task: sqlite3.Row, *args: Any) -> dict[str, Any]:
    """The task of a run that continued a continued run names the run it continued."""
    body = original(t, task, *args)
    if int(task["run_number"]) >= 3:
        prior = t.one(
            "SELECT run_id FROM runs WHERE namespace = ? AND workflow_id = ? AND run_number = ?",
            task["namespace"],
            task["workflow_id"],
            int(task["run_number"]) - 1,
        )
        if prior is not None:
            body["run_id"] = str(prior["run_id"])
    return body


# -- events left out or repeated ------------------------------------------------------------------------------


@wraps("signal-left-out-after-lease", runs, "receive_signal")
def _mark_signal_during_lease(original: Callable[..., dict[str, Any]], t: T, *args: Any) -> dict[str, Any]:
    """A signal that arrives while the run's workflow task is leased names that task (the pages below then
    leave it out)."""
    answer = original(t, *args)
    if answer.get("deduplicated"):
        return answer
    signal = t.one("SELECT run_id FROM signals WHERE signal_id = ?", answer["signal_id"])
    assert signal is not None
    run_id = signal["run_id"]
    task = open_workflow_task(t, run_id)
    if task is not None and task["status"] == "leased":
        t.db.execute(
            "UPDATE history SET workflow_task_id = ? WHERE run_id = ? AND sequence ="
            " (SELECT MAX(sequence) FROM history WHERE run_id = ? AND event_type = 'SignalReceived')",
            (task["task_id"], run_id, run_id),
        )
    return answer


@wraps("signal-left-out-after-lease", wt, "worker_rows")
def _skip_marked_signals(original: Callable[..., list[sqlite3.Row]], t: T, *args: Any) -> list[sqlite3.Row]:
    rows = original(t, *args)
    return [r for r in rows if not (r["event_type"] == "SignalReceived" and r["workflow_task_id"])]


@wraps("redelivery-history-stale", wt, "worker_rows")
def _snapshot_at_creation(
    original: Callable[..., list[sqlite3.Row]], t: T, task: sqlite3.Row, *args: Any
) -> list[sqlite3.Row]:
    rows = original(t, task, *args)
    if int(task["attempt"]) > 1:  # a redelivered task shows the history as it was when the task was created
        rows = [r for r in rows if r["recorded_at"] <= task["created_at"]]
    return rows


@wraps("update-accepted-repeated", wt, "worker_rows")
def _second_update_twice(
    original: Callable[..., list[sqlite3.Row]], t: T, task: sqlite3.Row, *args: Any
) -> list[sqlite3.Row]:
    rows = original(t, task, *args)
    second = t.one(
        "SELECT sequence FROM history WHERE run_id = ? AND event_type = 'UpdateAccepted' ORDER BY sequence"
        " LIMIT 1 OFFSET 1",
        task["run_id"],
    )
    return [copy for r in rows for copy in ([r, r] if second and r["sequence"] == second["sequence"] else [r])]


@wraps("inline-page-default-unadvertised", wt, "default_history_page_size")
def _unadvertised_default(original: Callable[[], int]) -> int:
    return 100  # a page asked for without a size holds 100 events, not the default this server advertises
