"""In-process wake-ups for long polls and blocked control-plane calls.

A notification is only a hint (Dispatch, Lease and Hooks): a woken waiter re-reads durable state, and a waiter that
was never notified still wakes at its own deadline or at the next moment durable state says work
becomes due. Losing a notification can delay a poll, never lose work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

__all__ = ["Hub"]


class Hub:
    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}

    def event(self, key: Hashable) -> asyncio.Event:
        """The event the next :meth:`notify` of ``key`` sets. Take it *before* reading state, so a
        notification between the read and the wait is not missed."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def notify(self, key: Hashable) -> None:
        ev = self._events.pop(key, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    async def wait(self, ev: asyncio.Event, timeout: float) -> bool:
        """Wait for ``ev`` at most ``timeout`` seconds; True when it was set."""
        if timeout <= 0:
            return ev.is_set()
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_any(self, events: list[asyncio.Event], timeout: float) -> None:
        """Wait until any of ``events`` is set, at most ``timeout`` seconds."""
        waiters = [asyncio.ensure_future(ev.wait()) for ev in events]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
