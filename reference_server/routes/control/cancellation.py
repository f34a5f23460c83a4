"""Control plane, cooperative cancellation a client requests (SDK 2.12.0 ``request_workflow_cancellation``):
the run is asked to clean up and close before a deadline, not closed at once (``/cancel`` does that)."""

from __future__ import annotations

from typing import Any

from ...app import Ctx, route
from ...cancellation import client_request, client_request_fields
from ...runs import command_target, live_run
from .. import CoreRoutes
from .workflows import RUN_PATHS

__all__ = ["Routes"]


class Routes(CoreRoutes):
    """Mounted on the control plane beside cancel and terminate."""

    @route("POST", *(prefix + "/request-cancellation" for prefix in RUN_PATHS))
    async def request_cancellation(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        seconds, reason = client_request_fields(ctx.obj())
        run = command_target(self.core.read(), ctx.namespace, ctx.params)

        def tx(t: Any) -> dict[str, Any]:
            live = live_run(t, run["run_id"], "The workflow run is already closed.")
            return client_request(t, live, seconds, reason)

        return 200, self.core.run_tx(tx)
