"""Checks that wait in real time, overlapped: run ahead of their turn, at most ``limit`` at once, in one event loop.

Against a target without a test clock (or with ``--real-time``) a check's time is mostly waiting: a lease
running out, a timer, a long poll's hold, a round trip to a distant server. Each check builds its own world
(its own queues, workflow ids and client), so the waits of independent checks can overlap. When an item of
the run is a check, :meth:`Overlap.take` starts it and the checks that follow it in the run's order — up to
the next item that is not a check (a state machine, a fuzz group) or that must run alone (a restart) — on a
background event loop, at most ``limit`` at a time, the earliest first; each item then waits only for its own
result. Items still report one by one in the run's order, so ``-x`` stops at the same first failure and the
records are the ones a serial run would write; the checks started ahead of an item that stopped the run are
cancelled.

With the target's test clock nothing is overlapped: a check that moves the clock would expire the leases of
the others (see :mod:`suite.timing`), and there the waits take no time anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Sequence

from .outcomes import Record
from .registry import Check

__all__ = ["DEFAULT_LIMIT", "Overlap"]

# Checks in flight at once by default: enough to overlap the waits of the time-driven checks (each holds at
# most a few requests open), few enough that a small server is not flooded. The protocol advertises no
# server-wide admission limit: its limits are per worker registration, per session and per queue, and every
# check registers its own workers on its own queues, so none of them binds across checks; --concurrency does.
DEFAULT_LIMIT = 8

Start = Callable[[Check], Awaitable[list[Record]]]


class Overlap:
    """A background event loop running checks ahead of their turn (see the module's docstring)."""

    def __init__(self, start: Start, limit: int) -> None:
        self._start = start
        self.limit = limit
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dw-overlap", daemon=True)
        self._thread.start()
        self._gate: asyncio.Semaphore | None = None
        self._closing = threading.Event()
        self._futures: dict[str, concurrent.futures.Future[list[Record]]] = {}
        self.started = 0  # checks started, in all

    def take(self, test_id: str, ahead: Sequence[tuple[str, Check]]) -> list[Record]:
        """The records of the check ``test_id``: started now unless it already was, with every check of
        ``ahead`` (the run's next items, in order, that may overlap it) not yet started; then awaited."""
        for other_id, check in ahead:
            if other_id not in self._futures:
                self._futures[other_id] = asyncio.run_coroutine_threadsafe(self._gated(check), self._loop)
        future = self._futures.pop(test_id)
        return future.result()

    def drain(self) -> None:
        """Wait until no check started ahead is still running (before an item that must run alone)."""
        for future in list(self._futures.values()):
            concurrent.futures.wait([future])

    def close(self) -> None:
        """Cancel the checks started ahead that nobody will take (the run stopped), then stop the loop."""
        self._closing.set()  # a check that gets a slot while the others are being cancelled does not start
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        if self._loop.is_running():

            async def cancel_rest() -> None:
                current = asyncio.current_task()
                rest = [t for t in asyncio.all_tasks() if t is not current]
                for task in rest:
                    task.cancel()
                await asyncio.gather(*rest, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(cancel_rest(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _gated(self, check: Check) -> list[Record]:
        if self._gate is None:  # created on the loop's own thread, where it is awaited
            self._gate = asyncio.Semaphore(self.limit)
        async with self._gate:
            if self._closing.is_set():
                raise asyncio.CancelledError
            self.started += 1
            return await self._start(check)
