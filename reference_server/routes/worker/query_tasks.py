"""Worker plane, query tasks (§10.2–§10.4, §10.6): poll, complete, fail."""

from __future__ import annotations

from typing import Any

from suite.protocol.commands import validate_query_complete, validate_query_fail
from suite.protocol.lifecycles import QueryTaskEvent

from ...app import Ctx, route
from ...queries import claim_query_task, query_due_in, report_query_task
from .. import PollRoutes

__all__ = ["Routes"]


class Routes(PollRoutes):
    """Mounted on the worker plane."""

    @route("POST", "/api/worker/query-tasks/{query_task_id}/complete")
    async def qt_complete(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        owner, attempt, doc = validate_query_complete(ctx.obj())
        return self._reported(ctx, owner, attempt, QueryTaskEvent.COMPLETE, doc)

    @route("POST", "/api/worker/query-tasks/{query_task_id}/fail")
    async def qt_fail(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        owner, attempt, doc = validate_query_fail(ctx.obj())
        return self._reported(ctx, owner, attempt, QueryTaskEvent.FAIL, doc)

    def _reported(
        self, ctx: Ctx, owner: str, attempt: int, event: QueryTaskEvent, doc: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        qid = ctx.params["query_task_id"]
        status = self.core.run_tx(lambda t: report_query_task(t, ctx.namespace, qid, owner, attempt, event, doc))
        return 200, {
            "query_task_id": qid,
            "query_task_attempt": attempt,
            "outcome": status,
            "reason": doc.get("reason") if event is QueryTaskEvent.FAIL else None,
        }

    @route("POST", "/api/worker/query-tasks/poll")
    async def qt_poll(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return await self.polls.serve(ctx, "query", claim_query_task, query_due_in)
