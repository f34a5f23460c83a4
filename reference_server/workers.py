"""Workers (§6): registration, re-registration and deregistration, as state changes of the ``workers`` table.

A deregistered worker will never report, so its workflow-task leases go back to ready at once (Python SDK 2.12.0:
``recovered_workflow_task_count``); its activity leases expire as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import WORKER, TaskEvent, WorkerEvent, WorkerStatus

from . import sessions
from .app import validation_error
from .engine import release_leases
from .store import dumps, loads
from .transitions import WORKERS, WORKFLOW_TASKS, initial, move, move_all, step
from .tx import T

__all__ = ["RUNTIMES", "Registration", "deregister_worker", "parse_registration", "register_worker"]

RUNTIMES = frozenset({"php", "python", "typescript", "go", "java", "rust", "dotnet"})


@dataclass(frozen=True)
class Registration:
    """A validated registration body (§6.1)."""

    worker_id: str | None
    task_queue: str
    runtime: str
    sdk_version: str | None
    build_id: str | None
    workflow_types: list[str]
    activity_types: list[str]
    fingerprints: dict[str, str]
    capabilities: list[Any]
    max_workflow_tasks: int
    max_activity_tasks: int
    max_worker_sessions: int | None = None


def known_runtime(runtime: object) -> bool:
    """Whether ``runtime`` names one of the known runtimes (§6.1)."""
    return isinstance(runtime, str) and runtime in RUNTIMES


def parse_registration(body: dict[str, Any]) -> Registration:
    """§6.1's fields, or one 422 naming every bad one."""
    errors: dict[str, list[str]] = {}

    def opt_str(name: str, limit: int) -> str | None:
        value = body.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > limit:
            errors[name] = [f"{name} must be a string of at most {limit} characters."]
            return None
        return value

    def str_list(name: str) -> list[str]:
        value = body.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            errors[name] = [f"{name} must be a list of strings."]
            return []
        return list(value)

    def pos_int(name: str, default: int) -> int:
        value = body.get(name, default)
        if value is None:
            return default
        # The upper bound keeps a huge JSON integer out of SQLite (an OverflowError there was a 500).
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2**63 - 1:
            errors[name] = [f"{name} must be an integer from 1 to 2**63-1."]
            return default
        return value

    worker_id = opt_str("worker_id", 255)
    queue = body.get("task_queue")
    if not isinstance(queue, str) or not queue or len(queue) > 255:
        errors["task_queue"] = ["task_queue is required: a non-empty string of at most 255 characters."]
    runtime = body.get("runtime")
    if not known_runtime(runtime):
        errors["runtime"] = [f"runtime is required and must be one of {sorted(RUNTIMES)}."]
    sdk_version = opt_str("sdk_version", 64)
    build_id = opt_str("build_id", 255)
    wf_types = str_list("supported_workflow_types")
    act_types = str_list("supported_activity_types")
    fingerprints = body.get("workflow_definition_fingerprints") or {}
    if not isinstance(fingerprints, dict) or not all(isinstance(v, str) for v in fingerprints.values()):
        errors["workflow_definition_fingerprints"] = ["must be an object of workflow type to fingerprint string."]
        fingerprints = {}
    capabilities = body.get("capabilities") or []
    if not isinstance(capabilities, list):
        errors["capabilities"] = ["capabilities must be a list."]
        capabilities = []
    max_wf = pos_int("max_concurrent_workflow_tasks", 100)
    max_act = pos_int("max_concurrent_activity_tasks", 100)
    # A.2 limits.max_concurrent_worker_sessions: "worker_registration" (absent: no limit).
    max_sessions = (
        None if body.get("max_concurrent_worker_sessions") is None else pos_int("max_concurrent_worker_sessions", 1)
    )
    if errors:
        raise validation_error(errors)
    assert isinstance(queue, str)
    assert isinstance(runtime, str)
    return Registration(
        worker_id,
        queue,
        runtime,
        sdk_version,
        build_id,
        wf_types,
        act_types,
        fingerprints,
        capabilities,
        max_wf,
        max_act,
        max_sessions,
    )


def register_worker(t: T, namespace: str, wid: str, reg: Registration) -> None:
    """Register (or re-register) ``wid``; a changed definition fingerprint of a live registration is a 409."""
    existing = t.one("SELECT * FROM workers WHERE namespace = ? AND worker_id = ?", namespace, wid)
    if existing is not None and existing["status"] == "active":
        old = loads(existing["fingerprints"]) or {}
        for wf_type, fp in reg.fingerprints.items():
            if wf_type in old and old[wf_type] != fp:
                raise Rejection(
                    409,
                    "workflow_definition_changed",
                    f"Workflow type '{wf_type}' was registered with a different definition.",
                    {"workflow_type": wf_type, "worker_id": wid},
                )
    status = initial(WORKERS) if existing is None else step(WORKER, existing["status"], WorkerEvent.REGISTER).value
    t.db.execute(
        "INSERT OR REPLACE INTO workers (namespace, worker_id, task_queue, runtime, sdk_version, build_id,"
        " workflow_types, activity_types, fingerprints, capabilities, max_workflow_tasks, max_activity_tasks,"
        " status, registered_at, last_heartbeat_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            namespace,
            wid,
            reg.task_queue,
            reg.runtime,
            reg.sdk_version,
            reg.build_id,
            dumps(reg.workflow_types),
            dumps(reg.activity_types),
            dumps(reg.fingerprints),
            dumps(reg.capabilities),
            reg.max_workflow_tasks,
            reg.max_activity_tasks,
            status,
            t.now,
            t.now,
        ),
    )
    t.fx.transition("worker", wid, existing["status"] if existing else None, status, task_queue=reg.task_queue)
    sessions.note_registration(t, namespace, wid, reg.max_worker_sessions)


def deregister_worker(t: T, namespace: str, worker_id: str) -> int:
    """Deregister ``worker_id``; its workflow-task leases go back to ready now. Returns how many."""
    if (
        move(
            t,
            WORKERS,
            worker_id,
            WorkerStatus.ACTIVE,
            WorkerEvent.DEREGISTER,
            where="namespace = ?",
            where_args=(namespace,),
        )
        is None
    ):
        raise Rejection(404, "worker_not_found", f"Worker '{worker_id}' is not registered.", {"worker_id": worker_id})
    # A deregistered worker will never report: its workflow-task leases end now and the tasks are ready again
    # (the next claim bumps the attempt).
    where, args = "namespace = ? AND lease_owner = ?", (namespace, worker_id)
    release_leases(t, where, args)
    recovered = move_all(
        t, WORKFLOW_TASKS, TaskEvent.ABANDON, where, args, also="lease_owner = NULL, lease_expires_at = NULL"
    )
    if recovered:
        t.fx.wake.add(("workflow", namespace, "*"))
    return recovered
