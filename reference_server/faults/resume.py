"""Faults of the resume context: the task a signal, an update or an activity's final outcome wakes does not say
what woke it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from .. import activities, runs
from .patching import wraps


@wraps("signal-wake-without-name", runs, "signal_wake_context")
def _signal_unnamed(original: Callable[[str, str], dict[str, Any]], signal_id: str, name: str) -> dict[str, Any]:
    return {**original(signal_id, name), "signal_name": None, "workflow_signal_id": None}


@wraps("update-wake-without-id", runs, "update_wake_context")
def _update_unnamed(original: Callable[[str], dict[str, Any]], update_id: str) -> dict[str, Any]:
    return {**original(update_id), "workflow_update_id": None}


@wraps("activity-wake-without-attempt", activities, "activity_wake_context")
def _activity_unnamed(
    original: Callable[[sqlite3.Row, str | None], dict[str, Any]], execution: sqlite3.Row, attempt_id: str | None
) -> dict[str, Any]:
    return {**original(execution, attempt_id), "activity_attempt_id": None}
