"""Worker plane, registrations (§6): register, heartbeat, deregister."""

from __future__ import annotations

from typing import Any

from suite.protocol.errors import Rejection

from ...app import Ctx, route, validation_error
from ...store import new_id
from ...tx import T
from ...workers import deregister_worker, parse_registration, register_worker
from .. import WaitRoutes

__all__ = ["Routes"]


class Routes(WaitRoutes):
    """Deregistration wakes every poll (its tasks are ready again)."""

    @route("POST", "/api/worker/register")
    async def register(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        reg = parse_registration(ctx.obj())
        wid = reg.worker_id or new_id()
        self.core.run_tx(lambda t: register_worker(t, ctx.namespace, wid, reg))
        return 201, {
            "worker_id": wid,
            "registered": True,
            "heartbeat_interval_seconds": self.core.settings.heartbeat_interval_seconds,
        }

    @route("POST", "/api/worker/heartbeat")
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

        self.core.run_tx(tx)
        return 200, {
            "worker_id": worker_id,
            "acknowledged": True,
            "heartbeat_interval_seconds": self.core.settings.heartbeat_interval_seconds,
        }

    @route("DELETE", "/api/worker/registrations/{worker_id}")
    @route("POST", "/api/worker/registrations/{worker_id}/deregister")
    async def deregister(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        worker_id = ctx.params["worker_id"]
        recovered = self.core.run_tx(lambda t: deregister_worker(t, ctx.namespace, worker_id))
        self.core.hub.notify_all()
        return 200, {
            "worker_id": worker_id,
            "outcome": "deregistered",
            "recovered_workflow_task_count": recovered,
        }
