"""Control plane, task queues: build-id drain and resume (§7.5), and the matching switch (Appendix C)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...app import Ctx, route, validation_error
from ...engine import ts
from ...ports import Core, MatchingSwitch
from ...tx import T

__all__ = ["Routes"]


@dataclass(frozen=True)
class Routes:
    core: Core
    switch: MatchingSwitch

    @route("POST", "/api/task-queues/{queue}/matching")
    async def matching_switch(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        """Test knob (the test profile): ``{"available": false}`` makes every poll of this queue answer
        ``poll_status: "unavailable"`` (503) until ``{"available": true}``. Advertised in the test profile."""
        available = ctx.obj().get("available")
        if not isinstance(available, bool):
            raise validation_error({"available": ["available is required and must be a boolean."]})
        key = (ctx.namespace, ctx.params["queue"])
        if available:
            self.switch.unavailable_queues.discard(key)
        else:
            self.switch.unavailable_queues.add(key)
        return 200, {"namespace": ctx.namespace, "task_queue": ctx.params["queue"], "matching_available": available}

    @route("POST", "/api/task-queues/{queue}/build-ids/drain")
    async def drain(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._drain(ctx, "draining")

    @route("POST", "/api/task-queues/{queue}/build-ids/resume")
    async def resume(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return self._drain(ctx, "active")

    def _drain(self, ctx: Ctx, intent: str) -> tuple[int, dict[str, Any]]:
        build_id = ctx.obj().get("build_id")
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

        drained_at = self.core.run_tx(tx)
        return 200, {
            "namespace": ctx.namespace,
            "task_queue": queue,
            "build_id": build_id,
            "drain_intent": intent,
            "drained_at": ts(drained_at),
        }
