"""Lifecycle observers (Dispatch, Lease and Hooks: hooks observe and never own transitions).

Every committed state transition is offered to each registered observer *after* the transaction
commits, so an observer cannot change or veto it. Observers are fail-open with a bounded time: one
that raises is logged and skipped; one that hangs is abandoned after ``timeout`` seconds. The request
that caused the transition never waits for an observer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["JsonLinesEventLog", "Observer", "ObserverSet"]

log = logging.getLogger(__name__)

Observer = Callable[[Mapping[str, Any]], Awaitable[None] | None]


class ObserverSet:
    def __init__(self, timeout: float = 1.0) -> None:
        self.timeout = timeout
        self._observers: list[Observer] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.failures = 0

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def offer(self, transitions: list[dict[str, Any]]) -> None:
        """Hand committed transitions to every observer without waiting for any of them."""
        if not self._observers or not transitions:
            return
        for transition in transitions:
            frozen = dict(transition)  # each observer sees its own copy: it cannot alter what others see
            for observer in self._observers:
                task = asyncio.get_running_loop().create_task(self._deliver(observer, dict(frozen)))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)

    async def _deliver(self, observer: Observer, transition: dict[str, Any]) -> None:
        try:
            result = observer(transition)
            if result is not None:
                await asyncio.wait_for(result, self.timeout)
        except Exception:  # fail-open: an observer's failure is logged, never propagated
            self.failures += 1
            log.warning("lifecycle observer %r failed on %s", observer, transition, exc_info=True)

    async def drain(self) -> None:
        """Wait for in-flight deliveries (bounded by the per-observer timeout)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)


class JsonLinesEventLog:
    """Appends each transition as one JSON line (``--event-log PATH``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the server

    def __call__(self, transition: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(dict(transition), separators=(",", ":"), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
