"""Items that wait in real time, overlapped: run ahead of their turn, at most ``limit`` of a kind at once.

Against a target without a test clock (or with ``--real-time``) an item's time is mostly waiting: a lease
running out, a timer, a long poll's hold, a round trip to a distant server. Each check, each example of a state
machine and each fuzz case builds its own world (its own queues, workflow ids and client), so the waits of
independent items can overlap. When an item of the run is taken, :meth:`Overlap.take` starts it and the items
that follow it in the run's order, up to the next item that must run alone (a restart): the checks on one
background event loop, at most ``limit`` at a time, the earliest first; the state machines and fuzz groups,
which are synchronous (Hypothesis drives them), each in a thread of its own, at most ``limit`` at a time. The
machines are the longest items of a run, so they start as soon as the run does rather than after the last check.
Each item then waits only for its own result. Items still report one by one in the run's order, so ``-x`` stops
at the same first failure and the records are the ones a serial run would write; the checks started ahead of an
item that stopped the run are cancelled, and the machines started ahead are told to stop at their next request.
Under ``-x`` (or ``--maxfail``) the run wants its first failure soon, not in order: :meth:`Overlap.next_item`
lets an item started ahead that has already failed report before the item whose turn it is.

With the target's test clock nothing is overlapped: an item that moves the clock would expire the leases of
the others (see :mod:`suite.timing`), and there the waits take no time anyway.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .outcomes import Kind, Record
from .registry import Check

__all__ = ["DEFAULT_LIMIT", "Overlap", "one_parse_at_a_time"]

# Checks in flight at once by default: enough to overlap the waits of the time-driven checks (each holds at
# most a few requests open), few enough that a small server is not flooded. The protocol advertises no
# server-wide admission limit: its limits are per worker registration, per session and per queue, and every
# check registers its own workers on its own queues, so none of them binds across checks; --concurrency does.
DEFAULT_LIMIT = 8

# Reentrant: a parse may run a finalizer (garbage collected mid-parse) that formats a traceback, which parses too.
_PARSING = threading.RLock()


def one_parse_at_a_time() -> None:
    """Make ``ast.parse`` take a lock, once per process. CPython keeps the depth counter of the AST objects it
    builds in the interpreter, not in the thread; two threads parsing at once (each importing a module that
    pytest's assertion rewriting parses, as the machines and fuzz groups do the first time they run) may leave
    it off, and the parse then raises ``SystemError: AST constructor recursion depth mismatch``."""
    if getattr(ast.parse, "dw_locked", False):
        return
    parse = ast.parse

    @functools.wraps(parse)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _PARSING:
            return parse(*args, **kwargs)

    locked.dw_locked = True  # type: ignore[attr-defined]
    ast.parse = locked


Start = Callable[[Check], Awaitable[list[Record]]]
Block = Callable[[Check], list[Record]]


class Overlap:
    """A background event loop running checks ahead of their turn, and threads running state machines and fuzz
    groups ahead of theirs (see the module's docstring). ``block`` runs a machine or fuzz group (None: they run in
    their turn, not ahead); ``stop`` tells the ones still running that the run has stopped."""

    def __init__(
        self, start: Start, limit: int, block: Block | None = None, stop: Callable[[], None] | None = None
    ) -> None:
        self._start = start
        self._block = block
        self._stop = stop
        self._slots = threading.Semaphore(limit)
        if block is not None:
            one_parse_at_a_time()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
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
        with self._lock:  # close() may run on another thread (an interrupt) while items are being started
            if not self._closing.is_set():
                for other_id, entry in ahead:
                    if other_id in self._futures:
                        continue
                    if entry.kind is Kind.CHECK:
                        self._futures[other_id] = asyncio.run_coroutine_threadsafe(self._gated(entry), self._loop)
                    elif self._block is not None:
                        self._futures[other_id] = self._in_thread(entry, self._block)
            future = self._futures.pop(test_id, None)
        if future is None and self._closing.is_set():  # the run stopped while this item was being started
            raise concurrent.futures.CancelledError
        if future is None:
            raise KeyError(test_id)
        return future.result()

    def next_item(self, ids: Sequence[str], fails: Callable[[list[Record]], bool]) -> str:
        """Which of ``ids`` (the items not yet reported, in the run's order) reports next: the first one started
        ahead that has already finished and ``fails``, as soon as there is one, else ``ids[0]`` once it has
        finished (or at once when it has not been started: taking it starts it)."""
        while True:
            with self._lock:
                head = self._futures.get(ids[0])
                rest = [(i, self._futures[i]) for i in ids[1:] if i in self._futures]
            for other_id, future in rest:
                if future.done() and not future.cancelled() and future.exception() is None and fails(future.result()):
                    return other_id
            if head is None or head.done() or self._closing.is_set():
                return ids[0]
            pending = [head, *(f for _, f in rest if not f.done())]
            concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)

    def blocks(self) -> bool:
        """Whether machines and fuzz groups run ahead of their turn too."""
        return self._block is not None

    def drain(self) -> None:
        """Wait until no check started ahead is still running (before an item that must run alone)."""
        with self._lock:
            started = list(self._futures.values())
        concurrent.futures.wait(started)

    def close(self) -> None:
        """Cancel the checks started ahead that nobody will take (the run stopped), then stop the loop."""
        with self._lock:
            self._closing.set()  # an item that gets a slot while the others are being cancelled does not start
            for future in self._futures.values():
                future.cancel()
            self._futures.clear()
            threads = list(self._threads)
        if self._stop is not None:
            self._stop()
        deadline = time.monotonic() + 30
        for thread in threads:  # each ends at its next request (a long poll's hold at most): 30 s for them all
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
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

    def _in_thread(self, entry: Check, block: Block) -> concurrent.futures.Future[list[Record]]:
        """``block(entry)`` in a thread of its own once a slot is free; its records, or what it raised, in the
        future. A daemon thread: a run that stops does not wait for a machine nobody will take."""
        future: concurrent.futures.Future[list[Record]] = concurrent.futures.Future()

        def run() -> None:
            with self._slots:
                if self._closing.is_set() or not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(block(entry))
                except BaseException as exc:  # pytest's skip and exit are BaseExceptions: the item re-raises them
                    future.set_exception(exc)

        thread = threading.Thread(target=run, name=f"dw-overlap-{entry.name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return future
