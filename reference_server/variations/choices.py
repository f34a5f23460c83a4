"""The code of each legal variation: the one function of the server it wraps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .. import workflow_tasks as wt
from ..app import App
from ..http import HttpServer
from ..tx import T
from .catalog import EMPTY_POLL_LATENESS_SECONDS, SMALL_DEFAULT_PAGE_SIZE
from .layer import LAYER

wraps = LAYER.wraps


@wraps("small-default-page-size", wt, "default_history_page_size")
def _small_default(original: Callable[[], int]) -> int:
    return SMALL_DEFAULT_PAGE_SIZE


@wraps("small-default-page-size", App, "advertise")
def _advertise_small_default(original: Callable[..., None], app: App, capabilities: dict[str, Any]) -> None:
    sizes = {"history_page_size_default": SMALL_DEFAULT_PAGE_SIZE, "default_history_page_size": SMALL_DEFAULT_PAGE_SIZE}
    original(app, {**capabilities, **sizes})


# An empty long poll's answer as the shell frames it (the body's members in the order the poll route writes them).
_EMPTY_POLL = b'{"task":null,"poll_status":"empty"'


@wraps("late-empty-polls", HttpServer, "_write")
async def _late(original: Callable[..., Awaitable[None]], server: HttpServer, connection: Any, data: bytes) -> None:
    if _EMPTY_POLL in data:  # framed (its Date stamped) when the hold ended, delivered later
        await asyncio.sleep(EMPTY_POLL_LATENESS_SECONDS)
    await original(server, connection, data)


@wraps("never-compress", wt, "compression_threshold")
def _never(original: Callable[[T], int], t: T) -> int:
    return 1 << 62  # no page ever holds that many events
