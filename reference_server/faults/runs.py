"""Faults of runs: a closed run that still takes signals, the first run after a continue-as-new closing the wrong
way, and the execution timeout a continue-as-new starts again."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from typing import Any

from suite.protocol import commands as cmdmodel

from .. import commands, runs
from ..engine import append_event
from ..store import new_id
from ..tx import T
from .patching import wraps


@wraps("signal-to-failed-run-accepted", runs, "receive_signal")
def _failed_still_signalled(
    original: Callable[..., dict[str, Any]], t: T, run_id: str, name: str, input_blob: str | None, request_id: Any
) -> dict[str, Any]:
    """A failed run (a fail_workflow closed it) still records a signal: 202, SignalReceived after its end."""
    run = t.run(run_id)
    if run["status"] != "failed":
        return original(t, run_id, name, input_blob, request_id)
    signal_id = new_id(t.now)
    append_event(t, run_id, "SignalReceived", {"signal_id": signal_id, "signal_name": name, "input": input_blob})
    return {"signal_id": signal_id}


@wraps("continued-run-fail-recorded-completed", commands, "apply_command")
def _continued_fail_completes(
    original: Callable[..., None], t: T, task: sqlite3.Row, command: cmdmodel.Command, created: list[str]
) -> None:
    """In a run that began with a continue-as-new, a fail_workflow is applied as complete_workflow: the run
    completes with no failure."""
    if command.type == "fail_workflow" and int(t.run(str(task["run_id"]))["run_number"]) > 1:
        command = dataclasses.replace(command, type="complete_workflow", fields={"type": "complete_workflow"})
    original(t, task, command, created)


@wraps("continue-as-new-restarts-execution-timeout", commands, "start_run")
def _execution_restarted(original: Callable[..., str], t: T, **run: Any) -> str:
    """The run a continue-as-new starts counts its execution timeout from its own start, not the first run's: an
    execution outlives its execution_timeout_seconds by every continue-as-new."""
    if (run.get("extra_started") or {}).get("continued_from_run_id") and run.get("execution_timeout_seconds"):
        run["execution_deadline"] = None  # start_run then sets it from now
    return original(t, **run)
