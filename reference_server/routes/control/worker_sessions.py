"""Control plane, worker-session visibility (A.2 visibility; workerSessionVisibility / workerSessionDetail)."""

from __future__ import annotations

from typing import Any

from ...app import Ctx, route
from ...sessions import describe_session, list_sessions
from .. import CoreRoutes

__all__ = ["Routes"]


class Routes(CoreRoutes):
    """Operator visibility of worker sessions (A.2 ``workerSessionVisibility``)."""

    @route("GET", "/api/worker-sessions")
    async def list_sessions(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        status = ctx.request.query.get("status")
        return 200, self.core.run_tx(lambda t: list_sessions(t, ctx.namespace, status))

    @route("GET", "/api/worker-sessions/{session_id}")
    async def describe_session(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        sid = ctx.params["session_id"]
        return 200, self.core.run_tx(lambda t: describe_session(t, ctx.namespace, sid))
