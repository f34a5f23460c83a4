"""Worker plane, workflow tasks (§7, §8): poll, history, heartbeat, complete, fail."""

from __future__ import annotations

from typing import Any

from ...app import Ctx, route, validation_error
from ...polling import Poll
from ...tx import T
from ...workflow_tasks import (
    claim_workflow_task,
    complete_workflow_task,
    default_history_page_size,
    fail_workflow_task,
    heartbeat_workflow_task,
    task_history,
    workflow_due_in,
)
from .. import PollRoutes

__all__ = ["Routes"]


class Routes(PollRoutes):
    """Mounted on the worker plane."""

    @route("POST", "/api/worker/workflow-tasks/poll")
    async def wt_poll(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        page_size = body.get("history_page_size", default_history_page_size())
        # Checked before the poll's preconditions, which record the worker's liveness: a 422 changes nothing
        # (§2.3 validation before domain checks; invariant 68).
        if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= 1000:
            raise validation_error({"history_page_size": ["history_page_size must be an integer in 1..1000."]})
        accept = body.get("accept_history_encoding")

        def claim(t: T, poll: Poll) -> dict[str, Any] | str | None:
            encoding = accept if isinstance(accept, str) else None
            return claim_workflow_task(t, poll, page_size=page_size, accept_encoding=encoding)

        return await self.polls.serve(ctx, "workflow", claim, workflow_due_in)

    @route("POST", "/api/worker/workflow-tasks/{task_id}/history")
    async def wt_history(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, self.core.run_tx(lambda t: task_history(t, ctx.namespace, ctx.params["task_id"], ctx.obj()))

    @route("POST", "/api/worker/workflow-tasks/{task_id}/heartbeat")
    async def wt_heartbeat(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        task_id = ctx.params["task_id"]
        return 200, self.core.run_tx(lambda t: heartbeat_workflow_task(t, ctx.namespace, task_id, ctx.obj()))

    @route("POST", "/api/worker/workflow-tasks/{task_id}/complete")
    async def wt_complete(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        task_id = ctx.params["task_id"]
        return 200, self.core.run_tx(lambda t: complete_workflow_task(t, ctx.namespace, task_id, ctx.obj()))

    @route("POST", "/api/worker/workflow-tasks/{task_id}/fail")
    async def wt_fail(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        task_id = ctx.params["task_id"]
        return 200, self.core.run_tx(lambda t: fail_workflow_task(t, ctx.namespace, task_id, ctx.obj()))
