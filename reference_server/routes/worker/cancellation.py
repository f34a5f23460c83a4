"""Worker plane, cooperative cancellation: commit a delivery at one call (SDK 2.12.0 deliver_workflow_cancellation)."""

from __future__ import annotations

from typing import Any

from ...app import Ctx, route
from ...cancellation import deliver, delivery_fields
from ...workflow_tasks import guarded_task
from .. import CoreRoutes

__all__ = ["Routes"]


class Routes(CoreRoutes):
    """Mounted on the worker plane, beside the workflow-task verbs."""

    @route("POST", "/api/worker/workflow-tasks/{task_id}/deliver-cancellation")
    async def deliver(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body, task_id = ctx.obj(), ctx.params["task_id"]
        fields = delivery_fields(body)
        return 200, self.core.run_tx(lambda t: deliver(t, guarded_task(t, ctx.namespace, task_id, body)[0], fields))
