"""Worker plane, worker sessions (docs/reference.md: Worker sessions): create, heartbeat, close."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from suite.protocol import sessions as model

from ...app import Ctx, route, validation_error
from ...sessions import close_session, create_session, heartbeat_session
from .. import CoreRoutes

__all__ = ["Routes"]


def _worker_id(body: Mapping[str, Any]) -> str:
    worker_id = body.get("worker_id")
    if not isinstance(worker_id, str) or not worker_id.strip() or len(worker_id) > 255:
        raise validation_error({"worker_id": ["worker_id is required: a non-empty string of at most 255 characters."]})
    return worker_id


class Routes(CoreRoutes):
    """The three worker-session verbs."""

    @route("POST", "/api/worker/sessions")
    async def create(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        worker_id = _worker_id(body)
        options, errors = model.parse_options(body, "worker_session")
        if options is None:
            raise validation_error({k.removeprefix("worker_session."): v for k, v in errors.items()})
        return self.core.run_tx(lambda t: create_session(t, ctx.namespace, worker_id, options))

    @route("POST", "/api/worker/sessions/{session_id}/heartbeat")
    async def heartbeat(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        worker_id = _worker_id(body)
        seconds = body.get("lease_seconds")
        if seconds is not None and (
            not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= 2**31
        ):
            raise validation_error({"lease_seconds": ["lease_seconds must be a positive integer."]})
        sid = ctx.params["session_id"]
        return self.core.run_tx(lambda t: heartbeat_session(t, ctx.namespace, sid, worker_id, seconds))

    # The SDK sends its close body on DELETE ({worker_id, reason}).
    @route("DELETE", "/api/worker/sessions/{session_id}", body=True)
    async def close(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        body = ctx.obj()
        worker_id = _worker_id(body)
        reason = body.get("reason")
        why = reason if isinstance(reason, str) and reason and len(reason) <= 255 else "explicit_close"
        sid = ctx.params["session_id"]
        return self.core.run_tx(lambda t: close_session(t, ctx.namespace, sid, worker_id, why))
