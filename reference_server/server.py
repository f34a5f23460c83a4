"""Assembly: store + engine + handler + HTTP shell + background scheduler.

``Server`` is what ``python -m reference_server`` runs and what in-process tests build. Route
functions live here for the worker registration, workflow-task and control-plane surfaces; the
activity and query surfaces register theirs from :mod:`reference_server.activities` and
:mod:`reference_server.queries`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from suite.protocol import capabilities as caps
from suite.protocol import commands as cmdmodel
from suite.protocol.codec import decode_blob, encode_blob, json_to_value
from suite.protocol.errors import CodecError, Rejection
from suite.protocol.versions import ADVERTISED_VERSION

from . import engine as E
from .app import CONTROL, DISCOVERY, OPEN, WORKER, App, Ctx, validation_error
from .config import Settings
from .engine import TERMINAL_RUN_STATUSES, Engine, T, ts
from .faults import fault
from .http import HttpServer, Request, Response
from .hub import Hub
from .observers import JsonLinesEventLog, ObserverSet
from .store import Clock, Store, SystemClock, dumps, loads, new_id
from .workflow_tasks import (
    IMPLEMENTED_OPTIONAL_COMMANDS,
    MAX_DURATION_SECONDS,
    claim_workflow_task,
    complete_workflow_task,
    fail_workflow_task,
    heartbeat_workflow_task,
    task_history,
)

__all__ = ["Server"]

log = logging.getLogger(__name__)

RUNTIMES = frozenset({"php", "python", "typescript", "go", "java", "rust", "dotnet"})
SUPPORTED_COMMANDS_EXTRA = IMPLEMENTED_OPTIONAL_COMMANDS  # §5.2: advertised only because implemented


class Server:
    """One reference-server instance."""

    def __init__(self, settings: Settings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.store = Store(settings.db_path)
        self.engine = Engine(self.store, self.clock, settings)
        self.hub = Hub()
        self.observers = ObserverSet()
        self._event_log: JsonLinesEventLog | None = None
        if settings.event_log:
            self._event_log = JsonLinesEventLog(settings.event_log)
            self.observers.add(self._event_log)
        self.app = App(
            worker_token=settings.worker_token,
            operator_token=settings.operator_token,
            admin_token=settings.admin_token,
            namespace_exists=self.namespace_exists,
            ignore_version_header=fault(settings, "ignore-version-header"),
            faults=settings.faults,
        )
        capabilities = caps.server_capabilities()
        capabilities["supported_workflow_task_commands"] = [
            *capabilities["supported_workflow_task_commands"],
            *SUPPORTED_COMMANDS_EXTRA,
        ]
        self.app.capabilities = capabilities
        self.server_id = new_id()
        # Appendix C test knob: queues whose matching layer is switched off (poll_status "unavailable").
        # In memory on purpose: it simulates an infrastructure outage, which does not survive a restart.
        self.unavailable_queues: set[tuple[str, str]] = set()
        self._scheduler: asyncio.Task[None] | None = None
        self._scheduler_wake = asyncio.Event()
        self.http: HttpServer | None = None
        # Fault "poll-replay-forgotten-on-disconnect" only: connection id → the poll_requests rows (namespace,
        # kind, worker_id, poll_request_id, task_id) of the polls answered with a task on that connection.
        self._replays_by_connection: dict[int, set[tuple[str, str, str, str, str]]] = {}
        self.maintenance: list[Callable[[T], float | None]] = []  # each returns seconds until next due work
        with self.engine.tx() as t:
            t.db.execute("INSERT OR IGNORE INTO namespaces (name, created_at) VALUES ('default', ?)", (t.now,))
        self._register_routes()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._scheduler_wake = asyncio.Event()
        self._scheduler = asyncio.get_running_loop().create_task(self._scheduler_loop())
        forget_on_close = fault(self.settings, "poll-replay-forgotten-on-disconnect")
        self.http = HttpServer(
            self.handle,
            error_responder=self.app.shell_error,
            max_body_bytes=self.settings.max_body_bytes,
            max_header_bytes=self.settings.max_header_bytes,
            on_connection_closed=self._forget_connection_replays if forget_on_close else None,
        )
        await self.http.start(host, port)
        return self.http.url

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
        await self.observers.drain()
        if self._event_log is not None:
            self._event_log.close()
        self.store.close()

    async def handle(self, request: Request) -> Response:
        return await self.app.handle(request)

    # -- transactions with effects ---------------------------------------------------------------------

    def run_tx(self, fn: Callable[[T], Any]) -> Any:
        """Run ``fn`` in one transaction, then publish its effects (wake-ups, observer events)."""
        with self.engine.tx() as t:
            result = fn(t)
        self.publish(t)
        return result

    def publish(self, t: T) -> None:
        for key in t.fx.wake:
            self.hub.notify(key)
        for run_id in t.fx.run_changed:
            self.hub.notify(("run", run_id))
        if t.fx.wake or t.fx.run_changed:
            self._scheduler_wake.set()
        self.observers.offer(t.fx.transitions)

    def namespace_exists(self, namespace: str) -> bool:
        row = self.store.read().execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        return row is not None

    # -- background scheduler --------------------------------------------------------------------------

    async def _scheduler_loop(self) -> None:
        """Fires due timers, child retries and run timeouts, and runs every registered maintenance step;
        sleeps until the earliest due moment (or a wake-up). Expired leases and delayed tasks need no
        step here: pollers compute their own due time from durable state."""
        while True:
            delay = self.settings.scheduler_max_sleep_seconds
            # One transaction per step: a step that fails (logged) neither rolls back nor stalls the others,
            # so one bad row cannot stop timers, retries and timeouts for the whole server.
            for step in self._maintenance_steps():
                try:
                    due = self.run_tx(step)
                except Exception:
                    log.exception("scheduler step %s failed", getattr(step, "__name__", step))
                    continue
                if due is not None:
                    delay = min(delay, max(0.0, due))
            self._scheduler_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scheduler_wake.wait(), max(0.0, delay))

    def _maintenance_steps(self) -> list[Callable[[T], float | None]]:
        return [self._fire_timers, self._retry_children, self._run_timeouts, *self.maintenance]

    def _maintenance_pass(self, t: T) -> float:
        """Every step in one transaction (what in-process tests drive with a fake clock)."""
        delays: list[float] = [self.settings.scheduler_max_sleep_seconds]
        for step in self._maintenance_steps():
            d = step(t)
            if d is not None:
                delays.append(d)
        return max(0.0, min(delays))

    def _fire_timers(self, t: T) -> float | None:
        for timer in t.all("SELECT * FROM timers WHERE status = 'pending' AND fire_at <= ? LIMIT 100", t.now):
            t.db.execute(
                "UPDATE timers SET status = 'fired' WHERE timer_id = ? AND status = 'pending'",
                (timer["timer_id"],),
            )
            run = t.run(timer["run_id"])
            if run["status"] in TERMINAL_RUN_STATUSES:
                continue
            payload: dict[str, Any] = {
                "sequence": timer["step_sequence"],
                "timer_id": timer["timer_id"],
                "delay_seconds": timer["delay_seconds"],
                "timer_kind": timer["timer_kind"],
            }
            if timer["timer_kind"] == "condition_timeout":
                payload["condition_wait_id"] = timer["condition_wait_id"]
                seq = E.append_event(t, run["run_id"], "TimerFired", payload)
                t.db.execute(
                    "UPDATE condition_waits SET status = 'timed_out' WHERE condition_wait_id = ? AND status = 'open'",
                    (timer["condition_wait_id"],),
                )
                wait = t.one("SELECT * FROM condition_waits WHERE condition_wait_id = ?", timer["condition_wait_id"])
                E.append_event(
                    t,
                    run["run_id"],
                    "ConditionWaitTimedOut",
                    {"condition_wait_id": timer["condition_wait_id"], "sequence": timer["step_sequence"]},
                )
                resume = E.empty_resume(
                    workflow_wait_kind="condition",
                    open_wait_id=f"condition:{timer['condition_wait_id']}",
                    resume_source_kind="timer",
                    resume_source_id=timer["timer_id"],
                    timer_id=timer["timer_id"],
                    condition_wait_id=timer["condition_wait_id"],
                    condition_key=wait["condition_key"] if wait else None,
                    condition_definition_fingerprint=wait["fingerprint"] if wait else None,
                    workflow_sequence=seq,
                    workflow_event_type="TimerFired",
                )
            else:
                seq = E.append_event(t, run["run_id"], "TimerFired", payload)
                resume = E.empty_resume(
                    workflow_wait_kind="timer",
                    open_wait_id=f"timer:{timer['timer_id']}",
                    resume_source_kind="timer",
                    resume_source_id=timer["timer_id"],
                    timer_id=timer["timer_id"],
                    workflow_sequence=seq,
                    workflow_event_type="TimerFired",
                )
            t.fx.transition("timer", timer["timer_id"], "pending", "fired", run_id=run["run_id"])
            E.wake_run(t, run["run_id"], resume)
        nxt = t.one("SELECT MIN(fire_at) AS at FROM timers WHERE status = 'pending'")
        return None if nxt is None or nxt["at"] is None else (nxt["at"] - t.now) / 1e6

    def _retry_children(self, t: T) -> float | None:
        for call in t.all("SELECT * FROM children WHERE status = 'backoff' AND retry_at <= ? LIMIT 100", t.now):
            parent = t.run(call["parent_run_id"])
            if parent["status"] in TERMINAL_RUN_STATUSES:
                t.db.execute(
                    "UPDATE children SET status = 'cancelled' WHERE child_call_id = ?",
                    (call["child_call_id"],),
                )
                continue
            E.start_child_run(t, call, parent)
        nxt = t.one("SELECT MIN(retry_at) AS at FROM children WHERE status = 'backoff'")
        return None if nxt is None or nxt["at"] is None else (nxt["at"] - t.now) / 1e6

    def _run_timeouts(self, t: T) -> float | None:
        for run in t.all(
            "SELECT * FROM runs WHERE closed_at IS NULL AND run_deadline IS NOT NULL AND run_deadline <= ? LIMIT 100",
            t.now,
        ):
            E.close_run(
                t,
                run["run_id"],
                "failed",
                closed_reason="timed_out",
                event_type="WorkflowTimedOut",
                payload={"timeout_type": "run", "run_timeout_seconds": run["run_timeout_seconds"]},
                failure={"message": "Workflow run timed out.", "failure_category": "timeout"},
            )
        nxt = t.one("SELECT MIN(run_deadline) AS at FROM runs WHERE closed_at IS NULL AND run_deadline IS NOT NULL")
        return None if nxt is None or nxt["at"] is None else (nxt["at"] - t.now) / 1e6

    # -- shared poll machinery -------------------------------------------------------------------------

    def poll_preconditions(self, ctx: Ctx) -> tuple[sqlite3.Row, str, str | None, float, str | None]:
        """§7.1/§7.5: validate, look up the registration, check queue/build id/drain; clamp the hold."""
        body = ctx.obj()
        errors: dict[str, list[str]] = {}
        worker_id = body.get("worker_id")
        queue = body.get("task_queue")
        if not isinstance(worker_id, str) or not worker_id:
            errors["worker_id"] = ["worker_id is required and must be a non-empty string."]
        if not isinstance(queue, str) or not queue:
            errors["task_queue"] = ["task_queue is required and must be a non-empty string."]
        build_id = body.get("build_id")
        if build_id is not None and not isinstance(build_id, str):
            errors["build_id"] = ["build_id must be a string or null."]
        prid = body.get("poll_request_id")
        if prid is not None and (not isinstance(prid, str) or len(prid) > 255):
            errors["poll_request_id"] = ["poll_request_id must be a string of at most 255 characters."]
        timeout = body.get("timeout_seconds", self.settings.long_poll_default_seconds)
        if isinstance(timeout, str) and timeout.strip().lstrip("-").isdigit():
            timeout = int(timeout.strip())  # §7.2: integral strings are coerced
        if not isinstance(timeout, int) or isinstance(timeout, bool):
            if timeout is None:
                timeout = self.settings.long_poll_default_seconds
            else:
                errors["timeout_seconds"] = ["timeout_seconds must be an integer."]
        if errors:
            raise validation_error(errors)
        assert isinstance(worker_id, str)
        assert isinstance(queue, str)
        assert isinstance(timeout, int)
        worker = (
            self.store.read()
            .execute(
                "SELECT * FROM workers WHERE namespace = ? AND worker_id = ? AND status = 'active'",
                (ctx.namespace, worker_id),
            )
            .fetchone()
        )
        if worker is None:
            raise Rejection(
                412,
                "worker_not_registered",
                f"Worker '{worker_id}' is not registered in this namespace.",
                {"worker_id": worker_id},
            )
        if worker["task_queue"] != queue:
            raise Rejection(
                409,
                "task_queue_mismatch",
                "The poll's task_queue differs from the registered one.",
                {"registered_task_queue": worker["task_queue"], "requested_task_queue": queue},
            )
        if build_id and worker["build_id"] and build_id != worker["build_id"]:
            raise Rejection(
                409,
                "build_id_mismatch",
                "The poll's build_id differs from the registered one.",
                {"registered_build_id": worker["build_id"], "requested_build_id": build_id},
            )
        if (ctx.namespace, queue) in self.unavailable_queues:
            # §7.4: "The queue or matching layer could not coordinate safely" → 503, task null.
            raise Rejection(
                503,
                "matching_unavailable",
                "The matching layer of this task queue is unavailable; retry the poll.",
                {"poll_status": "unavailable", "task": None, "retry_after_seconds": 1},
            )
        drained = (
            self.store.read()
            .execute(
                "SELECT drain_intent FROM drains WHERE namespace = ? AND task_queue = ? AND build_id = ?",
                (ctx.namespace, queue, worker["build_id"] or ""),
            )
            .fetchone()
        )
        if drained is not None and drained["drain_intent"] == "draining":
            raise Rejection(
                409,
                "worker_draining",
                "This worker's build-id cohort is draining on this queue.",
                {
                    "poll_status": "draining",
                    "task": None,
                    "build_id": worker["build_id"],
                    "drain_reason": "build_id_draining",
                },
            )
        # §7.2: clamp into [min, max]; 0 and negatives hold about the minimum.
        hold = max(self.settings.long_poll_min_seconds, min(self.settings.long_poll_max_seconds, timeout))
        self.touch_worker(ctx.namespace, worker_id)
        return worker, queue, worker["build_id"], float(hold), prid

    def touch_worker(self, namespace: str, worker_id: str) -> None:
        with self.engine.tx() as t:
            t.db.execute(
                "UPDATE workers SET last_heartbeat_at = ? WHERE namespace = ? AND worker_id = ?",
                (t.now, namespace, worker_id),
            )

    async def long_poll(
        self,
        key: tuple[str, str, str],
        hold: float,
        attempt: Callable[[T], Any],
        due_in: Callable[[sqlite3.Connection, int], float | None],
    ) -> Any:
        """Try ``attempt`` now; if it finds nothing, wait for a wake-up, the next due moment of durable
        state, or the end of the hold (§7.2: a task that becomes ready is returned immediately)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold
        while True:
            ev = self.hub.event(key)
            result = self.run_tx(attempt)
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            due = due_in(self.store.read(), self.clock.now_us())
            wait = remaining if due is None else min(remaining, max(0.001, due))
            if fault(self.settings, "poll-ignores-wakeups"):
                await asyncio.sleep(wait)  # the bug: deaf to wake-ups, new work waits for the end of the hold
                continue
            await self.hub.wait(ev, wait)

    def note_poll_answer(self, ctx: Ctx, kind: str, worker_id: str, poll_request_id: str | None, result: Any) -> None:
        """Fault "poll-replay-forgotten-on-disconnect": tie the §7.3 replay row of a poll answered with a task
        to the HTTP connection that carried the poll (see ``_forget_connection_replays``). Without the fault
        this does nothing. ``kind`` is workflow, activity or query; ``result`` what the claim returned."""
        if not fault(self.settings, "poll-replay-forgotten-on-disconnect"):
            return
        connection_id = ctx.request.connection_id
        if not poll_request_id or not connection_id or not isinstance(result, dict):
            return  # no replay row, or a request that came on no connection (in process)
        task_id = str(result["query_task_id" if kind == "query" else "task_id"])
        rows = self._replays_by_connection.setdefault(connection_id, set())
        rows.add((ctx.namespace, kind, worker_id, poll_request_id, task_id))

    def _forget_connection_replays(self, connection_id: int) -> None:
        """The bug of fault "poll-replay-forgotten-on-disconnect" (idempotency state tied to the connection):
        when a connection ends, the replay rows of the polls answered on it are deleted, so a poll retried on
        a new connection after its answer was lost gets no replay. Duplicates on an open connection, and
        concurrent ones, still replay."""
        rows = self._replays_by_connection.pop(connection_id, None)
        if not rows:
            return

        def tx(t: T) -> None:
            t.db.executemany(
                "DELETE FROM poll_requests WHERE namespace = ? AND kind = ? AND worker_id = ?"
                " AND poll_request_id = ? AND task_id = ?",
                sorted(rows),
            )

        self.run_tx(tx)

    # -- routes ----------------------------------------------------------------------------------------

    def _register_routes(self) -> None:
        a = self.app
        a.add("GET", "/api/health", OPEN, self.health)
        a.add("GET", "/api/ready", OPEN, self.ready)
        a.add("GET", "/api/cluster/info", DISCOVERY, self.cluster_info)
        a.add("POST", "/api/worker/register", WORKER, self.register)
        a.add("POST", "/api/worker/heartbeat", WORKER, self.worker_heartbeat)
        a.add("DELETE", "/api/worker/registrations/{worker_id}", WORKER, self.deregister)
        a.add("POST", "/api/worker/registrations/{worker_id}/deregister", WORKER, self.deregister)
        a.add("POST", "/api/worker/workflow-tasks/poll", WORKER, self.wt_poll)
        a.add("POST", "/api/worker/workflow-tasks/{task_id}/history", WORKER, self.wt_history)
        a.add("POST", "/api/worker/workflow-tasks/{task_id}/heartbeat", WORKER, self.wt_heartbeat)
        a.add("POST", "/api/worker/workflow-tasks/{task_id}/complete", WORKER, self.wt_complete)
        a.add("POST", "/api/worker/workflow-tasks/{task_id}/fail", WORKER, self.wt_fail)
        a.add("POST", "/api/workflows", CONTROL, self.start_workflow)
        a.add("GET", "/api/workflows/{workflow_id}", CONTROL, self.describe)
        a.add("GET", "/api/workflows/{workflow_id}/runs", CONTROL, self.list_runs)
        a.add("GET", "/api/workflows/{workflow_id}/runs/{run_id}", CONTROL, self.describe)
        a.add("GET", "/api/workflows/{workflow_id}/runs/{run_id}/history", CONTROL, self.run_history)
        for prefix in ("/api/workflows/{workflow_id}", "/api/workflows/{workflow_id}/runs/{run_id}"):
            a.add("POST", prefix + "/signal/{name}", CONTROL, self.signal)
            a.add("POST", prefix + "/update/{name}", CONTROL, self.update)
            a.add("POST", prefix + "/cancel", CONTROL, self.cancel)
            a.add("POST", prefix + "/terminate", CONTROL, self.terminate)
        a.add("POST", "/api/task-queues/{queue}/build-ids/drain", CONTROL, self.drain)
        a.add("POST", "/api/task-queues/{queue}/build-ids/resume", CONTROL, self.resume)
        a.add("POST", "/api/task-queues/{queue}/matching", CONTROL, self.matching_switch)
        from . import activities, queries

        activities.register(self)
        queries.register(self)

    # -- open and discovery ----------------------------------------------------------------------------

    async def health(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "serving", "protocol_version": ADVERTISED_VERSION}

    async def ready(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        self.store.read().execute("SELECT 1").fetchone()
        return 200, {"status": "ready"}

    async def cluster_info(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        workers = (
            self.store.read()
            .execute(
                "SELECT worker_id, task_queue, build_id FROM workers WHERE namespace = ? AND status = 'active'",
                (ctx.namespace,),
            )
            .fetchall()
        )
        return 200, {
            "server_id": self.server_id,
            "version": "0.1.0",
            "default_namespace": "default",
            "supported_sdk_versions": {"python": ">=2.12.0"},
            "capabilities": caps.platform_capabilities(),
            "worker_fleet": {
                "namespace": ctx.namespace,
                "active_workers": len(workers),
                "queues": sorted({w["task_queue"] for w in workers}),
                "build_ids": sorted({w["build_id"] for w in workers if w["build_id"]}),
                "workers": [dict(w) for w in workers][:100],
            },
            "task_repair": {"policy": {}, "candidates": 0},
            "limits": {
                "max_payload_bytes": 2 * 1024 * 1024,
                "max_memo_bytes": 256 * 1024,
                "max_search_attributes": 100,
                "max_search_attribute_key_length": 128,
                "max_search_attribute_value_bytes": 2048,
                "max_operation_name_length": 256,
                "max_pending_activities": 2000,
                "max_pending_children": 2000,
            },
            "structural_limits": {},
            "client_compatibility": {"authority": "protocol_manifests"},
            "auth_composition_contract": caps.auth_composition_contract(),
            "control_plane": caps.control_plane_contract(),
            "worker_protocol": {
                "version": ADVERTISED_VERSION,
                "server_capabilities": self.app.capabilities,
                "test_profile": self.settings.test_profile(),
            },
        }

    # -- registration ----------------------------------------------------------------------------------

    async def register(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
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
        if not isinstance(runtime, str) or runtime not in RUNTIMES:
            errors["runtime"] = [f"runtime is required and must be one of {sorted(RUNTIMES)}."]
        if fault(self.settings, "accept-unknown-runtime") and isinstance(runtime, str) and runtime:
            errors.pop("runtime", None)  # the bug: any runtime string is registered
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
        if errors:
            raise validation_error(errors)
        wid = worker_id or new_id()

        def tx(t: T) -> None:
            existing = t.one("SELECT * FROM workers WHERE namespace = ? AND worker_id = ?", ctx.namespace, wid)
            if existing is not None and existing["status"] == "active":
                old = loads(existing["fingerprints"]) or {}
                for wf_type, fp in fingerprints.items():
                    if wf_type in old and old[wf_type] != fp:
                        raise Rejection(
                            409,
                            "workflow_definition_changed",
                            f"Workflow type '{wf_type}' was registered with a different definition.",
                            {"workflow_type": wf_type, "worker_id": wid},
                        )
            t.db.execute(
                "INSERT OR REPLACE INTO workers (namespace, worker_id, task_queue, runtime, sdk_version, build_id,"
                " workflow_types, activity_types, fingerprints, capabilities, max_workflow_tasks, max_activity_tasks,"
                " status, registered_at, last_heartbeat_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)",
                (
                    ctx.namespace,
                    wid,
                    queue,
                    runtime,
                    sdk_version,
                    build_id,
                    dumps(wf_types),
                    dumps(act_types),
                    dumps(fingerprints),
                    dumps(capabilities),
                    max_wf,
                    max_act,
                    t.now,
                    t.now,
                ),
            )
            t.fx.transition("worker", wid, existing["status"] if existing else None, "active", task_queue=queue)

        self.run_tx(tx)
        return 201, {"worker_id": wid, "registered": True, "heartbeat_interval_seconds": 30}

    async def worker_heartbeat(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        worker_id = ctx.obj().get("worker_id")
        if not isinstance(worker_id, str) or not worker_id:
            raise validation_error({"worker_id": ["worker_id is required and must be a non-empty string."]})

        def tx(t: T) -> None:
            cur = t.db.execute(
                "UPDATE workers SET last_heartbeat_at = ? WHERE namespace = ? AND worker_id = ? AND status = 'active'",
                (t.now, ctx.namespace, worker_id),
            )
            if cur.rowcount != 1:
                raise Rejection(
                    404,
                    "worker_not_registered",
                    f"Worker '{worker_id}' is not registered.",
                    {"worker_id": worker_id},
                )

        self.run_tx(tx)
        return 200, {"worker_id": worker_id, "acknowledged": True, "heartbeat_interval_seconds": 30}

    async def deregister(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        worker_id = ctx.params["worker_id"]

        def tx(t: T) -> int:
            cur = t.db.execute(
                "UPDATE workers SET status = 'deregistered'"
                " WHERE namespace = ? AND worker_id = ? AND status = 'active'",
                (ctx.namespace, worker_id),
            )
            if cur.rowcount != 1:
                raise Rejection(
                    404,
                    "worker_not_found",
                    f"Worker '{worker_id}' is not registered.",
                    {"worker_id": worker_id},
                )
            t.fx.transition("worker", worker_id, "active", "deregistered")
            # A deregistered worker will never report: its workflow-task leases go back to ready now.
            cur = t.db.execute(
                "UPDATE workflow_tasks SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL"
                " WHERE namespace = ? AND status = 'leased' AND lease_owner = ?",
                (ctx.namespace, worker_id),
            )
            if cur.rowcount:
                t.fx.wake.add(("workflow", ctx.namespace, "*"))
            return int(cur.rowcount)

        recovered = self.run_tx(tx)
        self.hub.notify_all()
        return 200, {
            "worker_id": worker_id,
            "outcome": "deregistered",
            "recovered_workflow_task_count": recovered,
        }

    # -- workflow tasks --------------------------------------------------------------------------------

    async def wt_poll(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        page_size = body.get("history_page_size", 500)
        # Checked before poll_preconditions, which records the worker's liveness: a 422 changes nothing
        # (§2.3 validation before domain checks; invariant 68).
        if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= 1000:
            raise validation_error({"history_page_size": ["history_page_size must be an integer in 1..1000."]})
        worker, queue, _build, hold, prid = self.poll_preconditions(ctx)
        accept = body.get("accept_history_encoding")
        accept = accept if isinstance(accept, str) else None
        build = body.get("build_id")

        def attempt(t: T) -> Any:
            return claim_workflow_task(
                t,
                worker=worker,
                task_queue=queue,
                poll_build_id=build if isinstance(build, str) else None,
                poll_request_id=prid,
                page_size=page_size,
                accept_encoding=accept,
            )

        result = await self.long_poll(
            ("workflow", ctx.namespace, queue),
            hold,
            attempt,
            lambda db, now: _due_in(db, "workflow_tasks", ctx.namespace, queue, now),
        )
        self.note_poll_answer(ctx, "workflow", worker["worker_id"], prid, result)
        status, out = poll_response(result)
        if fault(self.settings, "drop-poll-status"):
            out.pop("poll_status", None)
        return status, out

    async def wt_history(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, self.run_tx(lambda t: task_history(t, ctx.namespace, ctx.params["task_id"], ctx.obj()))

    async def wt_heartbeat(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, self.run_tx(lambda t: heartbeat_workflow_task(t, ctx.namespace, ctx.params["task_id"], ctx.obj()))

    async def wt_complete(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, self.run_tx(lambda t: complete_workflow_task(t, ctx.namespace, ctx.params["task_id"], ctx.obj()))

    async def wt_fail(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, self.run_tx(lambda t: fail_workflow_task(t, ctx.namespace, ctx.params["task_id"], ctx.obj()))

    # -- control plane ---------------------------------------------------------------------------------

    def payload_blob(self, value: Any, field: str, *, require_array: bool = False) -> str | None:
        """Control-plane input: a JSON array (converted to one Avro array blob) or an explicit
        ``{codec, blob}`` envelope stored unchanged (§12.1). Decoding checks the blob is well formed."""
        if value is None:
            return None
        if isinstance(value, list):
            try:
                return encode_blob(json_to_value(value))
            except CodecError as exc:
                raise validation_error({field: [str(exc)]}) from None
        if isinstance(value, dict):
            codec = value.get("codec")
            if set(value) != {"codec", "blob"} or not isinstance(value.get("blob"), str):
                raise validation_error({field: ["must be a JSON array or an envelope {codec, blob}."]})
            if fault(self.settings, "accept-non-avro-input") and codec != "avro":
                return str(value["blob"])  # the bug: the codec is never checked, the blob stored as sent
            if codec != "avro":
                raise validation_error({f"{field}.codec": [f"unsupported_payload_codec: {codec!r} is not 'avro'."]})
            blob: str = value["blob"]
            try:
                decoded = decode_blob(blob)
            except CodecError as exc:
                raise validation_error({f"{field}.blob": [str(exc)]}) from None
            if require_array and not isinstance(decoded, list):
                raise validation_error({f"{field}.blob": ["the payload must decode to an Avro array of arguments."]})
            if fault(self.settings, "reencode-start-input"):
                return encode_blob(decoded)  # the bug: re-encoded, so a non-canonical blob comes back changed
            return blob
        raise validation_error({field: ["must be a JSON array or an envelope {codec, blob}."]})

    async def start_workflow(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        errors: dict[str, list[str]] = {}
        for legacy in (
            "workflow_execution_timeout",
            "workflow_run_timeout",
            "workflow_task_timeout",
            "retry_policy",
            "idempotency_key",
            "request_id",
        ):
            if legacy in body:
                errors[legacy] = [f"{legacy} is not accepted by this API."]
        wf_type = body.get("workflow_type")
        if not isinstance(wf_type, str) or not wf_type or len(wf_type) > 255:
            errors["workflow_type"] = ["workflow_type is required: a non-empty string of at most 255 characters."]
        workflow_id = body.get("workflow_id")
        if workflow_id is not None:
            try:
                cmdmodel.validate_workflow_id(workflow_id)
            except Rejection as rej:
                errors.update(rej.fields.get("errors", {"workflow_id": [rej.message]}))
        queue = body.get("task_queue", "default")
        if not isinstance(queue, str) or not queue or len(queue) > 255:
            errors["task_queue"] = ["task_queue must be a non-empty string."]
        timeouts: dict[str, int | None] = {}
        for name in ("execution_timeout_seconds", "run_timeout_seconds"):
            v = body.get(name)
            # The upper bound is the longest duration this server can store (see MAX_DURATION_SECONDS).
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_DURATION_SECONDS):
                errors[name] = [f"{name} must be an integer from 1 to {MAX_DURATION_SECONDS}."]
            timeouts[name] = v if isinstance(v, int) and not isinstance(v, bool) else None
        policy = body.get("duplicate_policy", "fail")
        if policy not in ("fail", "use-existing"):
            errors["duplicate_policy"] = ["duplicate_policy must be 'fail' or 'use-existing'."]
        # Only an absent or null memo / search_attributes means "none": `or {}` used to turn every falsy
        # non-object ([], "", 0, false) into {} and start the run, where §12.1 types both as objects (422).
        memo = body.get("memo")
        memo = {} if memo is None else memo
        attrs = body.get("search_attributes")
        attrs = {} if attrs is None else attrs
        if not isinstance(memo, dict):
            errors["memo"] = ["memo must be an object."]
        elif len(dumps(memo).encode()) > 256 * 1024:
            errors["memo"] = ["memo exceeds 256 KiB."]
        if not isinstance(attrs, dict):
            errors["search_attributes"] = ["search_attributes must be an object."]
        business_key = body.get("business_key")
        if business_key is not None and not isinstance(business_key, str):
            errors["business_key"] = ["business_key must be a string."]
        if errors:
            raise validation_error(errors)
        input_blob = self.payload_blob(body.get("input"), "input")
        wid = workflow_id if isinstance(workflow_id, str) else new_id()
        assert isinstance(wf_type, str)
        assert isinstance(queue, str)

        def tx(t: T) -> tuple[int, dict[str, Any]]:
            current = t.one(
                "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND is_current = 1",
                ctx.namespace,
                wid,
            )
            if current is not None and current["status"] not in TERMINAL_RUN_STATUSES:
                if policy == "use-existing":
                    return 200, {**_start_body(current, ctx.namespace), "outcome": "returned_existing_active"}
                raise Rejection(
                    409,
                    "rejected_duplicate",
                    f"Workflow '{wid}' already has an active run.",
                    {"workflow_id": wid, "run_id": current["run_id"], "outcome": "rejected_duplicate"},
                )
            run_id = E.start_run(
                t,
                namespace=ctx.namespace,
                workflow_id=wid,
                workflow_type=wf_type,
                task_queue=queue,
                input_blob=input_blob,
                memo=memo,
                search_attributes=attrs,
                business_key=business_key,
                execution_timeout_seconds=timeouts["execution_timeout_seconds"],
                run_timeout_seconds=timeouts["run_timeout_seconds"],
                run_number=1 if current is None else int(current["run_number"]) + 1,
            )
            return 201, {**_start_body(t.run(run_id), ctx.namespace), "outcome": "started_new"}

        status, out = self.run_tx(tx)
        return int(status), out

    def resolve_run(self, ctx: Ctx) -> sqlite3.Row:
        """The run a control-plane call targets: the current run, or ``runs/{run_id}``."""
        db = self.store.read()
        wid = ctx.params["workflow_id"]
        run_id = ctx.params.get("run_id")
        if run_id is None:
            row: sqlite3.Row | None = db.execute(
                "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND is_current = 1",
                (ctx.namespace, wid),
            ).fetchone()
            if row is None:
                raise Rejection(404, "instance_not_found", f"Workflow '{wid}' was not found.", {"workflow_id": wid})
            return row
        row = db.execute(
            "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? AND run_id = ?",
            (ctx.namespace, wid, run_id),
        ).fetchone()
        if row is None:
            if db.execute(
                "SELECT 1 FROM runs WHERE namespace = ? AND workflow_id = ?", (ctx.namespace, wid)
            ).fetchone():
                raise Rejection(
                    404,
                    "run_not_found",
                    f"Run '{run_id}' was not found.",
                    {"workflow_id": wid, "run_id": run_id},
                )
            raise Rejection(404, "instance_not_found", f"Workflow '{wid}' was not found.", {"workflow_id": wid})
        return row

    def command_target(self, ctx: Ctx) -> sqlite3.Row:
        run = self.resolve_run(ctx)
        if "run_id" in ctx.params and not run["is_current"]:
            raise Rejection(
                409,
                "historical_run_command_rejected",
                "Commands may only target the current run.",
                {"workflow_id": run["workflow_id"], "run_id": run["run_id"]},
            )
        return run

    async def describe(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, E.describe_run(self.store.read(), self.resolve_run(ctx))

    async def list_runs(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        wid = ctx.params["workflow_id"]
        rows = (
            self.store.read()
            .execute(
                "SELECT * FROM runs WHERE namespace = ? AND workflow_id = ? ORDER BY run_number",
                (ctx.namespace, wid),
            )
            .fetchall()
        )
        if not rows:
            raise Rejection(404, "instance_not_found", f"Workflow '{wid}' was not found.", {"workflow_id": wid})
        return 200, {
            "workflow_id": wid,
            "runs": [
                {
                    "run_id": r["run_id"],
                    "run_number": r["run_number"],
                    "status": r["status"],
                    "closed_reason": r["closed_reason"],
                    "is_current_run": bool(r["is_current"]),
                    "workflow_type": r["workflow_type"],
                    "started_at": ts(r["started_at"]),
                    "closed_at": ts(r["closed_at"]),
                }
                for r in rows
            ],
        }

    async def run_history(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        from suite.protocol import history as hist

        run = self.resolve_run(ctx)
        q = ctx.request.query
        errors: dict[str, list[str]] = {}
        page_size = 100
        if "page_size" in q:
            try:
                page_size = int(q["page_size"])
            except ValueError:
                page_size = 0
            if not 1 <= page_size <= 1000:
                errors["page_size"] = ["page_size must be an integer in 1..1000."]
        after = 0
        token = q.get("next_page_token")
        if token:
            after = hist.decode_page_token(token)
        if errors:
            raise validation_error(errors)
        if q.get("wait_new_event", "").lower() in ("1", "true", "yes") and int(run["last_sequence"]) <= after:
            ev = self.hub.event(("run", run["run_id"]))
            if (
                int(
                    self.store.read()
                    .execute("SELECT last_sequence FROM runs WHERE run_id = ?", (run["run_id"],))
                    .fetchone()[0]
                )
                <= after
            ):
                await self.hub.wait(ev, 20.0)
        rows = E.history_page(self.store.read(), run["run_id"], after, page_size + 1)
        more = len(rows) > page_size
        rows = rows[:page_size]
        events = [
            {
                "sequence": r["sequence"],
                "event_type": r["event_type"],
                "timestamp": ts(r["recorded_at"]),
                "payload": loads(r["payload"]),
                "id": r["event_id"],
            }
            for r in rows
        ]
        return 200, {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "events": events,
            "next_page_token": hist.encode_page_token(rows[-1]["sequence"]) if more else None,
        }

    async def signal(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        name = ctx.params["name"]
        run = self.command_target(ctx)
        input_blob = self.payload_blob(body.get("input"), "input", require_array=True)
        request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None

        def tx(t: T) -> dict[str, Any]:
            current = t.run(run["run_id"])
            if current["status"] in TERMINAL_RUN_STATUSES:
                raise Rejection(
                    409,
                    "rejected_not_active",
                    "The workflow run is closed.",
                    {
                        "workflow_id": current["workflow_id"],
                        "run_id": current["run_id"],
                        "run_status": current["status"],
                        "outcome": "rejected_not_active",
                    },
                )
            if request_id:
                dup = t.one(
                    "SELECT signal_id FROM signals WHERE run_id = ? AND request_id = ?",
                    current["run_id"],
                    request_id,
                )
                if dup is not None:
                    return {"signal_id": dup["signal_id"], "deduplicated": True}
            signal_id = new_id(t.now)
            t.db.execute(
                "INSERT INTO signals (signal_id, run_id, signal_name, input_blob, request_id, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (signal_id, current["run_id"], name, input_blob, request_id, t.now),
            )
            seq = E.append_event(
                t,
                current["run_id"],
                "SignalReceived",
                {
                    "signal_id": signal_id,
                    "signal_name": name,
                    "input": input_blob,
                    "arguments": input_blob,
                    "value": input_blob,
                    "payload_codec": "avro",
                    "request_id": request_id,
                },
            )
            E.wake_run(
                t,
                current["run_id"],
                E.empty_resume(
                    workflow_wait_kind="signal",
                    open_wait_id=f"signal-application:{signal_id}",
                    resume_source_kind="workflow_signal",
                    resume_source_id=signal_id,
                    workflow_signal_id=signal_id,
                    signal_name=name,
                    workflow_sequence=seq,
                    workflow_event_type="SignalReceived",
                ),
            )
            return {"signal_id": signal_id}

        extra = self.run_tx(tx)
        return 202, {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "signal_name": name,
            "outcome": "signal_received",
            "command_status": "accepted",
            "request_id": request_id,
            **extra,
        }

    async def _close(self, ctx: Ctx, status: str) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
            raise validation_error({"reason": ["reason must be a string of at most 1000 characters."]})
        run = self.command_target(ctx)
        requested, event = (
            ("CancelRequested", "WorkflowCancelled")
            if status == "cancelled"
            else ("TerminateRequested", "WorkflowTerminated")
        )

        def tx(t: T) -> None:
            current = t.run(run["run_id"])
            if current["status"] in TERMINAL_RUN_STATUSES:
                raise Rejection(
                    409,
                    "rejected_not_active",
                    "The workflow run is already closed.",
                    {
                        "workflow_id": current["workflow_id"],
                        "run_id": current["run_id"],
                        "run_status": current["status"],
                        "outcome": "rejected_not_active",
                    },
                )
            E.append_event(t, current["run_id"], requested, {"reason": reason})
            E.close_run(
                t,
                current["run_id"],
                status,
                closed_reason=status,
                event_type=event,
                payload={"reason": reason},
            )

        self.run_tx(tx)
        return 200, {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "outcome": "cancelled" if status == "cancelled" else "terminated",
            "reason": reason,
        }

    async def cancel(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return await self._close(ctx, "cancelled")

    async def terminate(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return await self._close(ctx, "terminated")

    async def update(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        name = ctx.params["name"]
        wait_for = body.get("wait_for", "completed")
        errors: dict[str, list[str]] = {}
        if wait_for not in ("accepted", "completed"):
            errors["wait_for"] = ["wait_for must be 'accepted' or 'completed'."]
        wait_timeout = body.get("wait_timeout_seconds", 30)
        if not isinstance(wait_timeout, int) or isinstance(wait_timeout, bool) or wait_timeout < 1:
            errors["wait_timeout_seconds"] = ["wait_timeout_seconds must be an integer >= 1."]
        if errors:
            raise validation_error(errors)
        run = self.command_target(ctx)
        input_blob = self.payload_blob(body.get("input"), "input")
        request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None

        def tx(t: T) -> str:
            current = t.run(run["run_id"])
            if current["status"] in TERMINAL_RUN_STATUSES:
                raise Rejection(
                    409,
                    "rejected_not_active",
                    "The workflow run is closed.",
                    {
                        "workflow_id": current["workflow_id"],
                        "run_id": current["run_id"],
                        "outcome": "rejected_not_active",
                    },
                )
            if request_id:
                dup = t.one(
                    "SELECT update_id FROM updates WHERE run_id = ? AND request_id = ?",
                    current["run_id"],
                    request_id,
                )
                if dup is not None:
                    return str(dup["update_id"])
            update_id = new_id(t.now)
            t.db.execute(
                "INSERT INTO updates (update_id, run_id, update_name, input_blob, request_id, status, accepted_at)"
                " VALUES (?, ?, ?, ?, ?, 'accepted', ?)",
                (update_id, current["run_id"], name, input_blob, request_id, t.now),
            )
            seq = E.append_event(
                t,
                current["run_id"],
                "UpdateAccepted",
                {
                    "update_id": update_id,
                    "update_name": name,
                    "arguments": input_blob,
                    "payload_codec": "avro",
                    "request_id": request_id,
                },
            )
            E.wake_run(
                t,
                current["run_id"],
                E.empty_resume(
                    workflow_wait_kind="update",
                    open_wait_id=f"update:{update_id}",
                    resume_source_kind="workflow_update",
                    resume_source_id=update_id,
                    workflow_update_id=update_id,
                    workflow_sequence=seq,
                    workflow_event_type="UpdateAccepted",
                ),
            )
            return update_id

        update_id = self.run_tx(tx)
        base = {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "update_name": name,
            "update_id": update_id,
        }
        if wait_for == "accepted":
            return 202, {**base, "outcome": "update_accepted", "update_status": "accepted"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(wait_timeout)
        while True:
            ev = self.hub.event(("run", run["run_id"]))
            row = self.store.read().execute("SELECT * FROM updates WHERE update_id = ?", (update_id,)).fetchone()
            run_now = self.store.read().execute("SELECT status FROM runs WHERE run_id = ?", (run["run_id"],)).fetchone()
            if row["status"] == "completed":
                blob = row["result_blob"]
                return 200, {
                    **base,
                    "outcome": "update_completed",
                    "update_status": "completed",
                    "result": _json_view(blob),
                    "result_envelope": {"codec": "avro", "blob": blob} if blob else None,
                }
            if row["status"] == "failed":
                return 422, {
                    **base,
                    "reason": "update_failed",
                    "outcome": "update_failed",
                    "update_status": "failed",
                    "failure": loads(row["failure"]),
                    "message": (loads(row["failure"]) or {}).get("message"),
                    "error": (loads(row["failure"]) or {}).get("message"),
                }
            if run_now["status"] in TERMINAL_RUN_STATUSES:
                raise Rejection(
                    409,
                    "rejected_not_active",
                    "The workflow run closed before the update completed.",
                    {**base, "outcome": "rejected_not_active", "update_status": "accepted"},
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                return 202, {
                    **base,
                    "outcome": "update_accepted",
                    "update_status": "accepted",
                    "wait_timed_out": True,
                }
            await self.hub.wait(ev, remaining)

    async def matching_switch(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        """Test knob (PROTOCOL.md Appendix C): ``{"available": false}`` makes every poll of this queue answer
        ``poll_status: "unavailable"`` (503) until ``{"available": true}``. Advertised in the test profile."""
        available = ctx.obj().get("available")
        if not isinstance(available, bool):
            raise validation_error({"available": ["available is required and must be a boolean."]})
        key = (ctx.namespace, ctx.params["queue"])
        if available:
            self.unavailable_queues.discard(key)
        else:
            self.unavailable_queues.add(key)
        return 200, {"namespace": ctx.namespace, "task_queue": ctx.params["queue"], "matching_available": available}

    async def drain(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._drain(ctx, "draining")

    async def resume(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._drain(ctx, "active")

    def _drain(self, ctx: Ctx, intent: str) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        build_id = body.get("build_id")
        if build_id is not None and not isinstance(build_id, str):
            raise validation_error({"build_id": ["build_id must be a string or null."]})
        queue = ctx.params["queue"]

        def tx(t: T) -> int | None:
            t.db.execute(
                "INSERT INTO drains (namespace, task_queue, build_id, drain_intent, drained_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET drain_intent = excluded.drain_intent,"
                " drained_at = CASE WHEN excluded.drain_intent = 'draining' THEN COALESCE(drains.drained_at,"
                " excluded.drained_at) ELSE NULL END",
                (ctx.namespace, queue, build_id or "", intent, t.now if intent == "draining" else None),
            )
            row = t.one(
                "SELECT drained_at FROM drains WHERE namespace = ? AND task_queue = ? AND build_id = ?",
                ctx.namespace,
                queue,
                build_id or "",
            )
            for kind in ("workflow", "activity", "query"):
                t.fx.wake.add((kind, ctx.namespace, queue))
            return None if row is None else row["drained_at"]

        drained_at = self.run_tx(tx)
        return 200, {
            "namespace": ctx.namespace,
            "task_queue": queue,
            "build_id": build_id,
            "drain_intent": intent,
            "drained_at": ts(drained_at),
        }


def _json_view(blob: str | None) -> Any:
    from suite.protocol.codec import value_to_json

    if blob is None:
        return None
    try:
        return value_to_json(decode_blob(blob))
    except CodecError:
        return None


def _start_body(run: sqlite3.Row, namespace: str) -> dict[str, Any]:
    return {
        "workflow_id": run["workflow_id"],
        "run_id": run["run_id"],
        "workflow_type": run["workflow_type"],
        "namespace": namespace,
        "status": run["status"],
        "business_key": run["business_key"],
        "payload_codec": "avro",
    }


def poll_response(result: Any) -> tuple[int, dict[str, Any]]:
    """§7.4: every poll response has ``poll_status``; ``task`` is non-null iff leased."""
    if result is None:
        return 200, {"task": None, "poll_status": "empty"}
    if result == "throttled":
        return 200, {"task": None, "poll_status": "throttled", "retry_after_seconds": 1}
    return 200, {"task": result, "poll_status": "leased"}


def _due_in(db: sqlite3.Connection, table: str, namespace: str, queue: str, now: int) -> float | None:
    """Seconds until durable state makes a task on this queue claimable without any notification:
    the earliest future ``available_at`` (delayed retries) or lease expiry (redelivery)."""
    row = db.execute(
        f"SELECT MIN(at) FROM (SELECT MIN(available_at) AS at FROM {table} WHERE namespace = ? AND task_queue = ?"
        f" AND status = 'ready' AND available_at > ? UNION ALL SELECT MIN(lease_expires_at) FROM {table}"
        " WHERE namespace = ? AND task_queue = ? AND status = 'leased')",
        (namespace, queue, now, namespace, queue),
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, (int(row[0]) - now) / 1e6)
