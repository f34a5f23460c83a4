"""Faults of updates: who may close one, and how often."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from suite.protocol import commands as cmdmodel

from .. import workflow_tasks as wt
from ..tx import T
from .patching import wraps

_CLOSING = ("complete_update", "fail_update")


def _commands(body: Mapping[str, Any]) -> list[Any]:
    commands = body.get("commands")
    return commands if isinstance(commands, list) else []


@wraps("update-close-from-any-worker", wt, "complete_workflow_task")
def _any_worker_closes(
    original: Callable[..., dict[str, Any]], t: T, namespace: str, task_id: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """A workflow-task complete that only closes updates is taken from any worker, as if the holder sent it."""
    commands = _commands(body)
    only_updates = bool(commands) and all(isinstance(c, dict) and c.get("type") in _CLOSING for c in commands)
    task = t.one("SELECT lease_owner FROM workflow_tasks WHERE task_id = ? AND status = 'leased'", task_id)
    if only_updates and task is not None and task["lease_owner"] and body.get("lease_owner") != task["lease_owner"]:
        body = {**body, "lease_owner": task["lease_owner"]}
    return original(t, namespace, task_id, body)


@wraps("fail-update-closes-again", wt, "validated_batch")
def _closed_update_failed_again(
    original: Callable[..., list[cmdmodel.Command]], t: T, task: sqlite3.Row, commands: Any, open_updates: list[str]
) -> list[cmdmodel.Command]:
    """A fail_update of an update a workflow task already closed passes validation and is recorded again."""
    closed = {
        row["update_id"]
        for row in t.all("SELECT update_id FROM updates WHERE run_id = ? AND status != 'accepted'", task["run_id"])
    }
    again = [
        c["update_id"]
        for c in commands
        if isinstance(commands, list)
        if isinstance(c, dict) and c.get("type") == "fail_update" and c.get("update_id") in closed
    ]
    return original(t, task, commands, [*open_updates, *again])
