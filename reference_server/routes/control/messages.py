"""Control plane, messages to a run (§12.2, §10.1): signal, update and query.

An update may hold its caller until the workflow completed it (``wait_for: "completed"``), a query until a
worker answered it; both wait on the hub and always re-read durable state (a wake-up is only a hint).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import Any

from ... import queries
from ...app import Ctx, route, validation_error
from ...runs import accept_update, command_target, receive_signal, update_outcome
from .. import WaitRoutes
from .payloads import payload_blob
from .workflows import RUN_PATHS

__all__ = ["Routes"]


def _request_id(body: dict[str, Any]) -> str | None:
    request_id = body.get("request_id")
    return request_id if isinstance(request_id, str) else None


class Routes(WaitRoutes):
    """What a client sends a run."""

    @route("POST", *(prefix + "/signal/{name}" for prefix in RUN_PATHS))
    async def signal(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        name = ctx.params["name"]
        run = command_target(self.core.read(), ctx.namespace, ctx.params)
        input_blob = payload_blob(body.get("input"), "input", require_array=True)
        request_id = _request_id(body)
        extra = self.core.run_tx(lambda t: receive_signal(t, run["run_id"], name, input_blob, request_id))
        return 202, {
            "workflow_id": run["workflow_id"],
            "run_id": run["run_id"],
            "signal_name": name,
            "outcome": "signal_received",
            "command_status": "accepted",
            "request_id": request_id,
            **extra,
        }

    @route("POST", *(prefix + "/update/{name}" for prefix in RUN_PATHS))
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
        run = command_target(self.core.read(), ctx.namespace, ctx.params)
        # Decided rule (README): like signal and query arguments, an update's input is the argument array.
        input_blob = payload_blob(body.get("input"), "input", require_array=True)
        request_id = _request_id(body)
        update_id = self.core.run_tx(lambda t: accept_update(t, run["run_id"], name, input_blob, request_id))
        base = {"workflow_id": run["workflow_id"], "run_id": run["run_id"], "update_name": name, "update_id": update_id}
        if wait_for == "accepted":
            return 202, {**base, "outcome": "update_accepted", "update_status": "accepted"}
        return await self._await_update(base, float(wait_timeout))

    async def _await_update(self, base: dict[str, Any], wait_timeout: float) -> tuple[int, dict[str, Any]]:
        """Hold until the update completed or failed, the run closed, or ``wait_timeout`` passed (202)."""
        clock = self.core.clock
        deadline = clock.now_us() + round(wait_timeout * 1_000_000)
        while True:
            ev = self.core.hub.event(("run", base["run_id"]))
            answer = update_outcome(self.core.read(), base["update_id"], base)
            if answer is not None:
                return answer
            remaining = (deadline - clock.now_us()) / 1e6
            if remaining <= 0:
                return 202, {**base, "outcome": "update_accepted", "update_status": "accepted", "wait_timed_out": True}
            await self.core.hub.wait(ev, remaining)

    @route("POST", *(prefix + "/query/{name}" for prefix in RUN_PATHS))
    async def query(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        core = self.core
        name = ctx.params["name"]
        if len(name) > queries.MAX_QUERY_NAME_LENGTH:
            limit = queries.MAX_QUERY_NAME_LENGTH
            raise validation_error({"name": [f"the query name must be at most {limit} characters."]})
        # §12.2 body {"input"?: array | envelope}; arguments are positional: an envelope must hold an array.
        args_blob = payload_blob(ctx.obj().get("input"), "input", require_array=True)
        # 404 instance_not_found / run_not_found; 409 for a historical run.
        run = command_target(core.read(), ctx.namespace, ctx.params)
        base = {"workflow_id": run["workflow_id"], "run_id": run["run_id"], "query_name": name}
        timeout = float(core.settings.query_timeout_seconds)
        qid: str = core.run_tx(lambda t: queries.create_query_task(t, run, name, args_blob, timeout))
        try:
            row = await self._await_query(ctx.namespace, qid, run["run_id"], timeout)
        except asyncio.CancelledError:
            # The caller is gone: nobody can receive an answer any more, so stop offering the task.
            with contextlib.suppress(Exception):
                core.run_tx(lambda t: queries.give_up(t, qid))
            raise
        finally:
            # Drop this task's hub entry even when no report ever notified it (e.g. engine.close_run).
            core.hub.notify(queries.result_key(ctx.namespace, qid))
        return queries.query_answer(row, {**base, "query_task_id": qid}, timeout)

    async def _await_query(self, namespace: str, qid: str, run_id: str, timeout: float) -> sqlite3.Row:
        """Hold until the task is terminal or the timeout passes (then it becomes ``timed_out``). A wake-up
        is only a hint: the row is re-read every time. The run key is watched too, because closing a run
        fails its pending query tasks (``engine.close_run``)."""
        core = self.core
        give_up_at = core.clock.now_us() + round(timeout * 1_000_000)
        while True:
            events = [core.hub.event(queries.result_key(namespace, qid)), core.hub.event(("run", run_id))]
            row = queries.query_task_row(core.read(), qid)
            if queries.is_terminal(row):
                return row
            remaining = (min(give_up_at, int(row["deadline"])) - core.clock.now_us()) / 1e6
            if remaining <= 0:
                final: sqlite3.Row = core.run_tx(lambda t: queries.give_up(t, qid))
                return final
            await core.hub.wait_any(events, remaining)
