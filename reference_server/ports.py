"""The small interfaces route groups are registered against, instead of the whole ``Server``.

A route group names what it needs — transactions and committed reads (:class:`Core`), waits on the hub
(:class:`Waits`), the matching switch (:class:`MatchingSwitch`); the poll path's is
:class:`reference_server.polling.Polls` — and :class:`reference_server.server.Server` (or a test's
stand-in) provides it. Nothing here imports a route or the server, so no module depends on the assembly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Protocol, TypeVar

from .clock import ServerClock
from .config import Settings
from .hub import Hub
from .store import Clock
from .tx import T

__all__ = ["ClockControl", "Core", "MatchingSwitch", "Waits"]

R = TypeVar("R")


class Core(Protocol):
    """One transaction with its effects published after commit, committed reads, and the settings."""

    @property
    def settings(self) -> Settings: ...

    def run_tx(self, fn: Callable[[T], R]) -> R: ...

    def read(self) -> sqlite3.Connection: ...


class Waits(Core, Protocol):
    """A :class:`Core` whose callers may hold a request until durable state changes (updates, queries)."""

    @property
    def hub(self) -> Hub: ...

    @property
    def clock(self) -> Clock: ...


class MatchingSwitch(Protocol):
    """Appendix C's matching switch: the queues whose polls answer ``poll_status: "unavailable"``."""

    @property
    def unavailable_queues(self) -> set[tuple[str, str]]: ...


class ClockControl(Protocol):
    """The test clock (``--test-clock``): move the server's clock forward, then run what became due."""

    @property
    def clock(self) -> ServerClock: ...

    async def advance_clock(self, seconds: float) -> int: ...
