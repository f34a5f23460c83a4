"""Control plane, the test clock (``--test-clock`` only): ``POST /api/test/clock/advance``.

A conformance run moves the server's clock forward instead of waiting for leases, timers, backoffs, timeouts
and long-poll holds to pass in real time. The route is mounted only on a server started with ``--test-clock``
(without it the path is ``404 route_not_found``) and advertised as ``worker_protocol.test_profile.clock_advance``.

Body ``{"seconds": s}`` with ``0 <= s <= 366 days`` (``0`` reads the clock). The answer comes after the new
offset is durable and every time-driven step due at the new instant has run (timers fired, timeouts enforced),
and after every held request (long polls, update and query waits) was woken to re-read the clock — so the
caller's next request sees the world as it is at the new instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...app import Ctx, route, validation_error
from ...clock import MAX_ADVANCE_SECONDS
from ...config import CLOCK_ADVANCE_PATH
from ...engine import ts
from ...ports import ClockControl

__all__ = ["Routes"]


@dataclass(frozen=True)
class Routes:
    control: ClockControl

    @route("POST", CLOCK_ADVANCE_PATH)
    async def advance(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        seconds = ctx.obj().get("seconds")
        # (NaN and infinities never get here: the body parser refuses them as malformed JSON.)
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= MAX_ADVANCE_SECONDS:
            raise validation_error(
                {"seconds": [f"seconds is required: a number from 0 to {MAX_ADVANCE_SECONDS} (366 days)."]}
            )
        now_us = await self.control.advance_clock(float(seconds))
        return 200, {
            "now": ts(now_us),
            "advanced_seconds": seconds,
            "offset_seconds": self.control.clock.offset_us / 1e6,
        }
