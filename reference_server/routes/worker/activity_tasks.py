"""Worker plane, activity tasks (§11): poll, complete, fail, heartbeat and the read-only status verb."""

from __future__ import annotations

import sqlite3
from typing import Any

from suite.protocol.commands import validate_activity_complete, validate_activity_fail, validate_activity_heartbeat
from suite.protocol.errors import Rejection

from ...activities import (
    activity_due_in,
    claim_activity_task,
    complete_activity_task,
    fail_activity_task,
    heartbeat_activity_task,
)
from ...app import Ctx, route
from ...polling import Poll
from .. import PollRoutes

__all__ = ["Routes"]


def _answer(out: dict[str, Any] | Rejection) -> tuple[int, dict[str, Any]]:
    if isinstance(out, Rejection):
        raise out  # after the commit: the closing writes of a run-closed rejection are kept
    return 200, out


def _due_in(db: sqlite3.Connection, poll: Poll, now: int) -> float | None:
    return activity_due_in(db, poll.worker, poll.queue, now)


class Routes(PollRoutes):
    """Mounted on the worker plane."""

    @route("POST", "/api/worker/activity-tasks/poll")
    async def activity_poll(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return await self.polls.serve(ctx, "activity", claim_activity_task, _due_in)

    @route("POST", "/api/worker/activity-tasks/{task_id}/complete")
    async def activity_complete(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        fence, result = validate_activity_complete(ctx.obj())
        task_id = ctx.params["task_id"]
        return _answer(self.core.run_tx(lambda t: complete_activity_task(t, ctx.namespace, task_id, fence, result)))

    @route("POST", "/api/worker/activity-tasks/{task_id}/fail")
    async def activity_fail(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        fence, failure = validate_activity_fail(ctx.obj())
        task_id = ctx.params["task_id"]
        return _answer(self.core.run_tx(lambda t: fail_activity_task(t, ctx.namespace, task_id, fence, failure)))

    @route("POST", "/api/worker/activity-tasks/{task_id}/heartbeat")
    async def activity_heartbeat(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        fence, progress = validate_activity_heartbeat(ctx.obj())
        task_id = ctx.params["task_id"]
        return 200, self.core.run_tx(lambda t: heartbeat_activity_task(t, ctx.namespace, task_id, fence, progress))

    @route("POST", "/api/worker/activity-tasks/{task_id}/status")
    async def activity_status(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        fence, progress = validate_activity_heartbeat(ctx.obj())
        task_id = ctx.params["task_id"]
        return 200, self.core.run_tx(
            lambda t: heartbeat_activity_task(t, ctx.namespace, task_id, fence, progress, renew=False)
        )
