"""Control plane, workflows and runs (§12.1–§12.3): start, describe, runs, history, cancel, terminate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from suite.protocol import history as hist
from suite.protocol.commands import validate_start_request
from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import RunEvent

from ... import engine as E
from ...app import Ctx, route, validation_error
from ...commands import MAX_DURATION_SECONDS
from ...engine import ts
from ...runs import close_by_request, command_target, resolve_run, start_workflow
from ...store import loads, new_id
from .. import WaitRoutes
from .payloads import payload_blob

__all__ = ["Routes"]

HISTORY_WAIT_SECONDS = 20

RUN_PATHS = ("/api/workflows/{workflow_id}", "/api/workflows/{workflow_id}/runs/{run_id}")
"""A run-targeted call names the workflow's current run, or one run of it (§1.2)."""


class Routes(WaitRoutes):
    """Runs: start, read, close."""

    @route("POST", "/api/workflows")
    async def start_workflow(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        req = validate_start_request(ctx.obj(), max_duration_seconds=MAX_DURATION_SECONDS)
        input_blob = payload_blob(req.input, "input")
        wid = req.workflow_id if isinstance(req.workflow_id, str) else new_id()
        status, out = self.core.run_tx(
            lambda t: start_workflow(
                t,
                ctx.namespace,
                wid,
                req.duplicate_policy,
                workflow_type=req.workflow_type,
                task_queue=req.task_queue,
                input_blob=input_blob,
                memo=req.memo,
                search_attributes=req.search_attributes,
                business_key=req.business_key,
                execution_timeout_seconds=req.execution_timeout_seconds,
                run_timeout_seconds=req.run_timeout_seconds,
            )
        )
        return int(status), out

    @route("GET", "/api/workflows/{workflow_id}", "/api/workflows/{workflow_id}/runs/{run_id}")
    async def describe(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        db = self.core.read()
        return 200, E.describe_run(db, resolve_run(db, ctx.namespace, ctx.params))

    @route("GET", "/api/workflows/{workflow_id}/runs")
    async def list_runs(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        wid = ctx.params["workflow_id"]
        rows = (
            self.core.read()
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

    async def _await_event(self, run_id: str, after: int) -> None:
        """§12.3 ``wait_new_event``: hold until the run has an event past ``after``, at most 20 s of the server's
        clock (a test-clock advance shortens the hold like any other)."""
        clock = self.core.clock
        deadline = clock.now_us() + HISTORY_WAIT_SECONDS * 1_000_000
        while True:
            ev = self.core.hub.event(("run", run_id))
            last = self.core.read().execute("SELECT last_sequence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            remaining = (deadline - clock.now_us()) / 1e6
            if int(last[0]) > after or remaining <= 0:
                return
            await self.core.hub.wait(ev, remaining)

    @route("GET", "/api/workflows/{workflow_id}/runs/{run_id}/history")
    async def run_history(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        db = self.core.read()
        run = resolve_run(db, ctx.namespace, ctx.params)
        page_size, after = _history_cursor(ctx.request.query)
        wait = ctx.request.query.get("wait_new_event", "").lower() in ("1", "true", "yes")
        if wait and int(run["last_sequence"]) <= after:
            await self._await_event(run["run_id"], after)
        rows = E.history_page(db, run["run_id"], after, page_size + 1)
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

    @route("POST", *(prefix + "/cancel" for prefix in RUN_PATHS))
    async def cancel(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._close(ctx, RunEvent.CANCEL)

    @route("POST", *(prefix + "/terminate" for prefix in RUN_PATHS))
    async def terminate(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._close(ctx, RunEvent.TERMINATE)

    def _close(self, ctx: Ctx, event: RunEvent) -> tuple[int, dict[str, Any]]:
        reason = ctx.obj().get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
            raise validation_error({"reason": ["reason must be a string of at most 1000 characters."]})
        run = command_target(self.core.read(), ctx.namespace, ctx.params)
        self.core.run_tx(lambda t: close_by_request(t, run["run_id"], event, reason))
        return 200, {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "outcome": "cancelled" if event is RunEvent.CANCEL else "terminated",
            "reason": reason,
        }


def _history_cursor(query: Mapping[str, str]) -> tuple[int, int]:
    """``page_size`` (1..1000, default 100) and the sequence after ``next_page_token`` (§12.3)."""
    errors: dict[str, list[str]] = {}
    page_size = 100
    if "page_size" in query:
        try:
            page_size = int(query["page_size"])
        except ValueError:
            page_size = 0
        if not 1 <= page_size <= 1000:
            errors["page_size"] = ["page_size must be an integer in 1..1000."]
    after = 0
    token = query.get("next_page_token")
    if token:
        after = hist.decode_page_token(token)
    if errors:
        raise validation_error(errors)
    return page_size, after
