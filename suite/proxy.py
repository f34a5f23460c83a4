"""A seeded, fault-injecting HTTP/1.1 proxy between the suite and a target.

``python -m suite.proxy --listen PORT --upstream URL --faults SPEC [--seed N]`` prints the URL it serves on
the first line of standard output and one line per injected fault on standard error. In process,
:class:`FaultProxy` does the same on the running event loop and :class:`ProxyThread` runs one on its own
loop for synchronous callers (the pytest plugin's ``--faults``).

Faults (``SPEC`` is ``name=probability`` items joined by commas, ``none`` for a transparent proxy, or
``standard`` for every fault at once at the rates of :data:`STANDARD_FAULTS`)::

    drop_response      forward, let the target apply the request, close the client without an answer
    duplicate_request  deliver the request a second time after the first answer; the client gets the first
    delay              hold the request or the response 0-N ms      (delay=P:N sets N, default 300)
    reorder            hold a request until the next one to arrive has gone first  (reorder=P:W, window W
                       ms, default 100: how long to wait for a second request, and then for its answer)
    reset_long_poll    on a .../poll route: reset (RST) the client while the target's long poll is pending,
                       and keep that upstream request open so the target may still grant a lease
    truncate_body      answer with Content-Length larger than the bytes sent, then close
    latency            not a fault: hold every answer exactly N ms (latency=N), as a distant target's round
                       trip would; it draws nothing, so the faults' sequence for a seed is the same with it

The client-visible outcome of drop_response and reset_long_poll is a connection error after the target
may have committed: "a response that never arrived is maybe applied". The answers the client never saw are
kept in :attr:`FaultProxy.withheld` as evidence. A request carrying an ``X-Conformance-Trace`` header (the
suite's client sends one under ``--faults``) can be looked up in process: :meth:`FaultProxy.events_for`
lists the faults it met and :meth:`FaultProxy.wait_withheld` returns the answer it never received, which
the client compares with what a resend or a duplicate got (suite.protocol.retries).

Reproducibility: a ``random.Random(seed)`` draws the same number of values for every request, in the
order requests arrive, whatever the spec; so a sequential client sees the same fault sequence for the
same seed, and a fault at probability 0 never fires and never shifts the others' draws.

Transparency: h11 frames both sides, but bytes are forwarded as received: the request exactly as the
client wrote it (headers with odd whitespace, chunked framing and all) and the response exactly as the
target wrote it. A connection whose bytes h11 refuses (malformed HTTP, a body over 64 MiB, a malformed
response) becomes a plain byte tunnel to the target, so robustness checks still judge the target, not
the proxy. Each client connection has its own upstream connection; when the client disconnects, so does
the proxy, and when the target closes, so does the proxy. The proxy never connects anywhere but the
upstream it was given, and never retries on its own except as the ``duplicate_request`` fault.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import random
import secrets
import signal
import socket
import struct
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, TypedDict, TypeVar, Unpack
from urllib.parse import urlsplit

import h11

__all__ = [
    "FAULTS",
    "STANDARD_FAULTS",
    "TRACE_HEADER",
    "FaultEvent",
    "FaultPlanner",
    "FaultProxy",
    "FaultSpec",
    "Plan",
    "ProxyOptions",
    "ProxyThread",
    "WithheldResponse",
    "is_poll_route",
    "main",
    "parse_faults",
]

logger = logging.getLogger(__name__)

# The canonical order: the planner draws one value per fault in this order for every request.
FAULTS: Final = (
    "drop_response",
    "duplicate_request",
    "delay",
    "reorder",
    "reset_long_poll",
    "truncate_body",
)
# A client that sends this header (any value unique per request) can ask the proxy, in process, which faults
# its request met and what answers it never saw (FaultProxy.events_for / wait_withheld). h11 lower-cases names.
TRACE_HEADER: Final = b"x-conformance-trace"
# ``--faults standard``: every fault at once, at rates a whole suite run survives through the client's retry
# rules and re-runs (the mix CI runs the suite under).
STANDARD_FAULTS: Final = (
    "drop_response=0.03,duplicate_request=0.03,delay=0.05:300,reorder=0.03:100,reset_long_poll=0.1,truncate_body=0.02"
)
DEFAULT_MAX_DELAY_MS: Final = 300.0
DEFAULT_REORDER_WINDOW_MS: Final = 100.0

_READ_CHUNK: Final = 64 * 1024
_MAX_HEAD_BYTES: Final = 1024 * 1024
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
_CLOSE_FLUSH_SECONDS: Final = 2.0
_FRAMING_HEADERS: Final = (b"content-length", b"transfer-encoding")

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------ the spec


@dataclass(frozen=True)
class FaultSpec:
    """Which faults fire with which probability; ``FaultSpec()`` is a transparent proxy."""

    probabilities: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    max_delay_ms: float = DEFAULT_MAX_DELAY_MS
    reorder_window_ms: float = DEFAULT_REORDER_WINDOW_MS
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        for name, p in self.probabilities.items():
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; use one of {', '.join(FAULTS)}, or latency=MS")
            if not (isinstance(p, int | float) and math.isfinite(p) and 0.0 <= p <= 1.0):
                raise ValueError(f"fault {name}: probability {p!r} is not a number from 0 to 1")
        for label, value in (
            ("delay", self.max_delay_ms),
            ("reorder", self.reorder_window_ms),
            ("latency", self.latency_ms),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"fault {label}: {value!r} ms is not a non-negative number of milliseconds")
        object.__setattr__(self, "probabilities", MappingProxyType(dict(self.probabilities)))

    def probability(self, name: str) -> float:
        return float(self.probabilities.get(name, 0.0))

    def longest_hold(self) -> float:
        """Seconds the proxy may hold a request back before the target sees it: its delay and reorder window."""
        delay = self.max_delay_ms if self.probability("delay") else 0.0
        return (delay + (self.reorder_window_ms if self.probability("reorder") else 0.0)) / 1000

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``drop_response=0.05,delay=0.1:500,reorder=0.05:50`` (``:N`` only on delay and reorder), ``none``, or
        ``standard`` (:data:`STANDARD_FAULTS`); ``latency=N`` among them holds every answer N ms."""
        text = text.strip()
        if text.lower() in ("", "none"):
            return cls()
        if text.lower() == "standard":
            text = STANDARD_FAULTS
        probabilities: dict[str, float] = {}
        max_delay, window, latency = DEFAULT_MAX_DELAY_MS, DEFAULT_REORDER_WINDOW_MS, 0.0
        for item in text.split(","):
            name, eq, value = (part.strip() for part in item.partition("="))
            if not eq or not name or not value:
                raise ValueError(f"fault item {item.strip()!r}: write name=probability, e.g. drop_response=0.05")
            if name == "latency":
                try:
                    latency = float(value)
                except ValueError:
                    raise ValueError(f"latency={value}: write latency=MS, e.g. latency=150") from None
                continue
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r} in {text!r}; use one of {', '.join(FAULTS)}, or latency=MS")
            if name in probabilities:
                raise ValueError(f"fault {name} is given twice in {text!r}; give each fault once")
            prob, colon, param = value.partition(":")
            if colon and name not in ("delay", "reorder"):
                raise ValueError(f"fault {name} takes no ':N' parameter; only delay=P:MAX_MS and reorder=P:WINDOW_MS")
            try:
                probabilities[name] = float(prob)
                ms = float(param) if colon else None
            except ValueError:
                raise ValueError(f"fault item {item.strip()!r}: probability and ':N' must be numbers") from None
            if ms is not None and name == "delay":
                max_delay = ms
            elif ms is not None:
                window = ms
        return cls(probabilities, max_delay_ms=max_delay, reorder_window_ms=window, latency_ms=latency)

    def __str__(self) -> str:
        items = []
        for name in FAULTS:
            if name not in self.probabilities:
                continue
            item = f"{name}={self.probability(name):g}"
            if name == "delay":
                item += f":{self.max_delay_ms:g}"
            elif name == "reorder":
                item += f":{self.reorder_window_ms:g}"
            items.append(item)
        if self.latency_ms:
            items.append(f"latency={self.latency_ms:g}")
        return ",".join(items) or "none"


def parse_faults(text: str) -> FaultSpec:
    """Parse a ``--faults`` SPEC; raises ``ValueError`` with a message that says how to fix it."""
    return FaultSpec.parse(text)


def is_poll_route(path: str) -> bool:
    """Whether a request target is a long-poll route (its last path segment is ``poll``)."""
    return path.partition("?")[0].rstrip("/").endswith("/poll")


# --------------------------------------------------------------------------------------------- the planner


@dataclass(frozen=True)
class Plan:
    """The faults drawn for one request (``seq`` counts requests from 1, in arrival order).

    At most one of ``reset_long_poll``, ``drop_response`` and ``truncate_at`` is set, in that precedence;
    ``truncate_at`` is the fraction of the body to send and applies only to a response with a body.
    """

    seq: int
    drop_response: bool = False
    duplicate_request: bool = False
    delay_ms: float | None = None
    delay_response: bool = False
    reorder: bool = False
    reset_long_poll: bool = False
    truncate_at: float | None = None

    @property
    def any(self) -> bool:
        return (
            self.drop_response
            or self.duplicate_request
            or self.delay_ms is not None
            or self.reorder
            or self.reset_long_poll
            or self.truncate_at is not None
        )


class FaultPlanner:
    """Pure and seeded: ``plan(path)`` draws the same nine values per request whatever the spec."""

    def __init__(self, spec: FaultSpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self._rng = random.Random(seed)
        self._seq = 0

    def plan(self, path: str) -> Plan:
        self._seq += 1
        fired = {name: self._rng.random() < self.spec.probability(name) for name in FAULTS}
        delay_fraction, side, cut = self._rng.random(), self._rng.random(), self._rng.random()
        reset = fired["reset_long_poll"] and is_poll_route(path)
        drop = fired["drop_response"] and not reset
        truncate = fired["truncate_body"] and not reset and not drop
        return Plan(
            seq=self._seq,
            drop_response=drop,
            duplicate_request=fired["duplicate_request"],
            delay_ms=delay_fraction * self.spec.max_delay_ms if fired["delay"] else None,
            delay_response=side < 0.5,
            reorder=fired["reorder"],
            reset_long_poll=reset,
            truncate_at=cut if truncate else None,
        )


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault (``trace``: the request's ``X-Conformance-Trace`` header, when it had one)."""

    seq: int
    fault: str
    method: str
    target: str
    detail: str
    trace: str | None = None

    @property
    def line(self) -> str:
        return f"dw-proxy: seq={self.seq} {self.fault} {self.method} {self.target}: {self.detail}"


@dataclass(frozen=True)
class WithheldResponse:
    """An answer of the target that the client never received (``status`` is ``None`` when none came)."""

    seq: int
    fault: str
    method: str
    target: str
    status: int | None
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    trace: str | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


# ------------------------------------------------------------------------------------------ h11 plumbing


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    close: bool  # the client asked to close after this exchange
    raw: bytes  # the request exactly as the client sent it
    trace: str | None = None  # its X-Conformance-Trace header: how a client finds the faults its request met


@dataclass(frozen=True)
class _Reply:
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]  # raw names and values, as the target sent them
    body: bytes  # decoded from its framing
    raw: bytes  # the final response exactly as the target sent it (1xx responses excluded)


class _UpstreamClosed(Exception):
    """The target closed the connection before a complete response."""


class _UpstreamGarbled(Exception):
    """The target's response is not HTTP/1.1 that h11 accepts; ``raw`` is what came so far."""

    def __init__(self, raw: bytes) -> None:
        super().__init__("malformed response from the upstream")
        self.raw = raw


class _Gone:
    """Marker: the client disconnected while the proxy waited for the target."""


class _Tunnel:
    """Marker: h11 refused the client's bytes; relay them to the target as they are."""


_GONE: Final = _Gone()
_TUNNEL: Final = _Tunnel()


def _asks_close(request: h11.Request) -> bool:
    tokens = {
        token.strip().lower() for name, value in request.headers if name == b"connection" for token in value.split(b",")
    }
    if request.http_version == b"1.0":
        return b"keep-alive" not in tokens
    return b"close" in tokens


class _Upstream:
    """One connection to the target: raw bytes out, h11 to find where each response ends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD_BYTES)
        self.buf = bytearray()  # bytes fed to h11 since the current response began

    @classmethod
    async def open(cls, host: str, port: int) -> _Upstream:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def reusable(self) -> bool:
        return (
            self.conn.our_state is h11.IDLE
            and self.conn.their_state is h11.IDLE
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    async def send(self, request: _Request) -> None:
        # h11 must know the method (a HEAD answer has no body) and whether we asked to close; the bytes it
        # would write are discarded, the client's own bytes go out instead.
        headers = [("Host", "upstream"), ("Content-Length", "0")]
        if request.close:
            headers.append(("Connection", "close"))
        self.conn.send(h11.Request(method=request.method, target="/", headers=headers))
        self.conn.send(h11.EndOfMessage())
        self.writer.write(request.raw)
        await self.writer.drain()

    async def receive(self) -> _Reply:
        head: h11.Response | None = None
        body = bytearray()
        start = 0
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                raise _UpstreamGarbled(bytes(self.buf[start:])) from None
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(_READ_CHUNK)
                except ConnectionError:
                    data = b""
                self.buf += data
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                start = self._consumed()  # a 1xx is the proxy's business, not the client's
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                end = self._consumed()
                raw = bytes(self.buf[start:end])
                del self.buf[:end]
                return _Reply(head.status_code, bytes(head.reason), list(head.headers.raw_items()), bytes(body), raw)
            elif isinstance(event, h11.ConnectionClosed):
                raise _UpstreamClosed
            else:  # PAUSED or an unexpected event: the connection is in a state we do not follow
                raise _UpstreamGarbled(bytes(self.buf[start:]))

    def _consumed(self) -> int:
        return len(self.buf) - len(self.conn.trailing_data[0])

    def finish(self) -> bool:
        """After a response: ready the connection for the next request; ``False`` if it cannot be reused."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE and not self.reader.at_eof():
            self.conn.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.transport.abort()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: what a crashed middlebox or a killed process looks like."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _truncated(reply: _Reply, fraction: float) -> bytes:
    """The response head with ``Content-Length`` of the whole body, and only part of the body."""
    lines = [b"HTTP/1.1 %d %s" % (reply.status, reply.reason)]
    lines += [name + b": " + value for name, value in reply.headers if name.lower() not in _FRAMING_HEADERS]
    lines.append(b"Content-Length: %d" % len(reply.body))
    cut = min(int(fraction * len(reply.body)), len(reply.body) - 1)
    return b"\r\n".join(lines) + b"\r\n\r\n" + reply.body[:cut]


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close after flushing what is buffered (a response, or the cut-short part of one); abort if stuck."""
    if writer.transport.is_closing():
        writer.transport.abort()
        return
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_FLUSH_SECONDS):
            await writer.wait_closed()
    except (TimeoutError, OSError):
        writer.transport.abort()
    except asyncio.CancelledError:
        writer.transport.abort()
        raise


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_READ_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


# ------------------------------------------------------------------------------------------- the proxy


@dataclass(eq=False)
class _Held:
    """A request held by ``reorder`` until the next request has gone first."""

    seq: int
    partner: asyncio.Future[str]
    forwarded: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)


class FaultProxy:
    """A seeded fault-injecting HTTP/1.1 proxy in front of ``upstream`` (an ``http://host:port`` URL).

    ``await proxy.start()`` listens (port 0 picks a free one; read ``proxy.url``); ``await proxy.close()``
    stops it. ``counts`` says how often each fault fired, ``events`` lists them in order (``log``, when
    given, also receives each event's one-line description), ``withheld`` keeps the answers the client
    never saw, and ``await proxy.wait_idle()`` returns once no request is in flight, including the
    requests the proxy completes on its own (an abandoned long poll, a duplicate delivery).
    """

    def __init__(
        self,
        upstream: str,
        faults: FaultSpec | str = "none",
        *,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r}: give an http://host:port URL (https is not proxied)")
        if parts.path.strip("/") or parts.query:
            raise ValueError(f"upstream {upstream!r}: give the server's root URL, without a path or query")
        self.upstream = f"http://{parts.netloc}"
        self._upstream_addr = (parts.hostname, parts.port or 80)
        self.spec = faults if isinstance(faults, FaultSpec) else FaultSpec.parse(faults)
        self.seed = seed
        self.planner = FaultPlanner(self.spec, seed)
        self.counts: Counter[str] = Counter(dict.fromkeys(FAULTS, 0))
        self.events: list[FaultEvent] = []
        self.withheld: list[WithheldResponse] = []
        # The records are written on the proxy's loop and read by clients on other threads.
        self._records = threading.Condition()
        self._log = log
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy = 0
        self._idle: asyncio.Event | None = None
        self._held: _Held | None = None
        self.url = ""

    # -- lifecycle

    async def start(self) -> str:
        if self._server is not None:
            raise RuntimeError("this FaultProxy is already started; make a new one")
        self._idle = asyncio.Event()
        self._idle.set()
        self._server = await asyncio.start_server(self._on_client, self._host, self._port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_idle(self) -> None:
        """Return once no request is in flight through the proxy (or sent by it on its own)."""
        if self._idle is None:
            return
        while self._busy:
            await self._idle.wait()

    # -- bookkeeping

    def _fire(self, plan: Plan, fault: str, request: _Request, detail: str) -> None:
        event = FaultEvent(plan.seq, fault, request.method, request.target, detail, request.trace)
        with self._records:
            self.counts[fault] += 1
            self.events.append(event)
            self._records.notify_all()
        if self._log is not None:
            self._log(event.line)

    def _withhold(self, plan: Plan, fault: str, request: _Request, reply: _Reply | None) -> None:
        record = WithheldResponse(
            plan.seq,
            fault,
            request.method,
            request.target,
            reply.status if reply else None,
            reply.body if reply else b"",
            tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in reply.headers) if reply else (),
            request.trace,
        )
        with self._records:
            self.withheld.append(record)
            self._records.notify_all()

    # -- what a client may ask about its own request (thread-safe)

    def events_for(self, trace: str) -> list[FaultEvent]:
        """The faults the request with this ``X-Conformance-Trace`` met so far."""
        with self._records:
            return [e for e in self.events if e.trace == trace]

    def wait_withheld(self, trace: str, fault: str, timeout: float) -> WithheldResponse | None:
        """The answer the client never saw of the request with this trace, under ``fault``: it may still be on
        its way (a reset long poll waits for the target); ``None`` if none is recorded within ``timeout``."""

        def found() -> WithheldResponse | None:
            return next((w for w in self.withheld if w.trace == trace and w.fault == fault), None)

        with self._records:
            self._records.wait_for(lambda: found() is not None, timeout)
            return found()

    def _enter(self) -> None:
        self._busy += 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0 and self._idle is not None:
            self._idle.set()

    def _spawn(self, coro: Awaitable[None]) -> None:
        self._enter()

        async def run() -> None:
            try:
                await coro
            finally:
                self._leave()

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_upstream(self) -> _Upstream:
        return await _Upstream.open(*self._upstream_addr)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await _Session(self, reader, writer).run()
        except asyncio.CancelledError:
            # Only close() cancels a connection task; asyncio.streams would log the cancellation as an error.
            pass
        finally:
            self._tasks.discard(task)


class _Session:
    """One client connection and its own upstream connection."""

    def __init__(self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        self.inbuf = bytearray()  # client bytes since the current request began
        self.upstream: _Upstream | None = None

    async def run(self) -> None:
        try:
            while True:
                request = await self._read_request()
                if request is None:
                    return
                if isinstance(request, _Tunnel):
                    await self._tunnel(bytes(self.inbuf), b"")
                    return
                self.proxy._enter()
                try:
                    keep = await self._exchange(request)
                finally:
                    self.proxy._leave()
                if not keep:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            if self.upstream is not None:
                self.upstream.close()
            await _close(self.writer)

    async def _read_request(self) -> _Request | _Tunnel | None:
        head: h11.Request | None = None
        size = 0
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                return _TUNNEL
            if event is h11.NEED_DATA:
                if self.conn.they_are_waiting_for_100_continue:
                    self.writer.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
                data = await self.reader.read(_READ_CHUNK)
                self.inbuf += data
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > _MAX_BODY_BYTES:
                    return _TUNNEL
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                end = len(self.inbuf) - len(self.conn.trailing_data[0])
                raw = bytes(self.inbuf[:end])
                del self.inbuf[:end]
                trace = next((v.decode("latin-1") for k, v in head.headers if k == TRACE_HEADER), None)
                return _Request(
                    head.method.decode("ascii"), head.target.decode("latin-1"), _asks_close(head), raw, trace
                )
            elif isinstance(event, h11.ConnectionClosed):
                return None
            else:
                return _TUNNEL

    async def _ensure_upstream(self) -> _Upstream:
        if self.upstream is not None and self.upstream.reusable():
            return self.upstream
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        self.upstream = await self.proxy._open_upstream()
        return self.upstream

    async def _watch_client(self) -> None:
        """Return when the client closes; bytes it sends meanwhile wait for the next request."""
        while True:
            try:
                data = await self.reader.read(_READ_CHUNK)
            except ConnectionError:
                return
            if not data:
                return
            self.inbuf += data
            self.conn.receive_data(data)

    async def _unless_client_leaves(self, aw: Awaitable[T]) -> T | _Gone:
        task = asyncio.ensure_future(aw)
        watcher = asyncio.ensure_future(self._watch_client())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
            await asyncio.wait({task, watcher})
        if task.cancelled():
            return _GONE
        return task.result()

    async def _exchange(self, request: _Request) -> bool:
        """Forward one request with its planned faults; ``True`` when the client connection stays open."""
        proxy = self.proxy
        plan = proxy.planner.plan(request.target)
        held = proxy._held
        partner_of: _Held | None = None
        if held is not None and not held.partner.done():
            partner_of, proxy._held = held, None
            held.partner.set_result(f"seq={plan.seq} {request.method} {request.target}")
        elif plan.reorder and held is None:
            await self._hold(plan, request)
        try:
            return await self._forward(plan, request, partner_of)
        finally:
            if partner_of is not None:
                partner_of.forwarded.set()
                partner_of.answered.set()

    async def _hold(self, plan: Plan, request: _Request) -> None:
        proxy = self.proxy
        loop = asyncio.get_running_loop()
        me = _Held(plan.seq, loop.create_future())
        proxy._held = me
        window = proxy.spec.reorder_window_ms / 1000
        try:
            async with asyncio.timeout(window):
                await asyncio.shield(me.partner)
        except TimeoutError:
            pass
        finally:
            if proxy._held is me:
                proxy._held = None
        if not me.partner.done():
            me.partner.cancel()
            return  # nothing arrived in the window: forwarded in order, no fault
        proxy._fire(plan, "reorder", request, f"held until {me.partner.result()} was forwarded first")
        await me.forwarded.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window):
                await me.answered.wait()

    async def _forward(self, plan: Plan, request: _Request, partner_of: _Held | None) -> bool:
        proxy = self.proxy
        if plan.delay_ms is not None and not plan.delay_response:
            proxy._fire(plan, "delay", request, f"held the request {plan.delay_ms:.0f} ms")
            await asyncio.sleep(plan.delay_ms / 1000)
        try:
            upstream = await self._ensure_upstream()
            await upstream.send(request)
        except (ConnectionError, OSError) as exc:
            logger.warning("dw-proxy: upstream %s unreachable (%s); closing the client", proxy.upstream, exc)
            return False
        finally:
            if partner_of is not None:
                partner_of.forwarded.set()

        if plan.reset_long_poll:
            proxy._fire(plan, "reset_long_poll", request, "client reset while the upstream poll is pending")
            _reset(self.writer)
            try:
                reply: _Reply | None = await upstream.receive()
            except (_UpstreamClosed, _UpstreamGarbled, ConnectionError, OSError):
                reply = None
            proxy._withhold(plan, "reset_long_poll", request, reply)
            return False

        try:
            got = await self._unless_client_leaves(upstream.receive())
        except _UpstreamClosed:
            return False  # the target hung up without an answer: so does the proxy
        except _UpstreamGarbled as exc:
            await self._tunnel(b"", exc.raw)
            return False
        if isinstance(got, _Gone):
            return False  # the client left: the upstream connection closes with it, as if direct
        reply = got
        if partner_of is not None:
            partner_of.answered.set()
        if not upstream.finish():
            upstream.close()
            self.upstream = None

        if plan.duplicate_request:
            proxy._fire(plan, "duplicate_request", request, f"delivered again after the first answer ({reply.status})")
            if is_poll_route(request.target):
                proxy._spawn(self._duplicate(plan, request))  # a second long poll may hold for its full timeout
            else:
                await self._duplicate(plan, request)
        if plan.drop_response:
            proxy._fire(plan, "drop_response", request, f"upstream answered {reply.status}; client closed unanswered")
            proxy._withhold(plan, "drop_response", request, reply)
            return False
        if plan.delay_ms is not None and plan.delay_response:
            proxy._fire(plan, "delay", request, f"held the response {plan.delay_ms:.0f} ms")
            await asyncio.sleep(plan.delay_ms / 1000)
        if proxy.spec.latency_ms:
            await asyncio.sleep(proxy.spec.latency_ms / 1000)  # every answer, after any fault's own hold
        if plan.truncate_at is not None and reply.body and request.method != "HEAD":
            data = _truncated(reply, plan.truncate_at)
            proxy._fire(plan, "truncate_body", request, f"{reply.status} with {len(reply.body)}-byte body cut short")
            proxy._withhold(plan, "truncate_body", request, reply)
            self.writer.write(data)
            await self.writer.drain()
            return False

        self.writer.write(reply.raw)
        await self.writer.drain()
        if self.upstream is None:
            return False  # the target closed (or will): the client's framing may depend on that close
        headers = [("Content-Length", "0")] if reply.status not in (204, 304) else []
        self.conn.send(h11.Response(status_code=reply.status, headers=headers))
        self.conn.send(h11.EndOfMessage())
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return True
        return False

    async def _duplicate(self, plan: Plan, request: _Request) -> None:
        upstream: _Upstream | None = None
        reply: _Reply | None = None
        try:
            upstream = await self.proxy._open_upstream()
            await upstream.send(request)
            reply = await upstream.receive()
        except (_UpstreamClosed, _UpstreamGarbled, ConnectionError, OSError):
            reply = None
        finally:
            if upstream is not None:
                upstream.close()
        self.proxy._withhold(plan, "duplicate_request", request, reply)

    async def _tunnel(self, to_upstream: bytes, to_client: bytes) -> None:
        """Give up on framing: relay bytes both ways until both sides have finished."""
        try:
            upstream = self.upstream if self.upstream is not None else await self.proxy._open_upstream()
        except (ConnectionError, OSError):
            return
        self.upstream = upstream
        if to_upstream:
            upstream.writer.write(to_upstream)
        if to_client:
            self.writer.write(to_client)
        to_target = asyncio.ensure_future(_pipe(self.reader, upstream.writer))
        try:
            # The exchange is over when the target has said all it will say, whatever the client still sends.
            await _pipe(upstream.reader, self.writer)
        finally:
            to_target.cancel()
            await asyncio.wait({to_target})


# -------------------------------------------------------------------------------- a proxy on its own thread


class ProxyOptions(TypedDict, total=False):
    """:class:`FaultProxy`'s keyword options, which :class:`ProxyThread` passes on."""

    seed: int
    host: str
    port: int
    log: Callable[[str], None] | None


class ProxyThread:
    """A :class:`FaultProxy` on its own event loop in a daemon thread, for synchronous callers.

    ``url = ProxyThread(upstream, spec, seed=1).start()`` … ``stop()``; ``proxy`` is the running proxy
    (read its ``counts`` and ``events`` after ``stop()``).
    """

    def __init__(self, upstream: str, faults: FaultSpec | str = "none", **options: Unpack[ProxyOptions]) -> None:
        self.proxy = FaultProxy(upstream, faults, **options)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self.proxy.url

    def start(self, timeout: float = 10.0) -> str:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="dw-fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the fault proxy did not start within {timeout:g}s")
        if self._error is not None:
            raise self._error
        return self.proxy.url

    def stop(self, timeout: float = 10.0) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
            thread.join(timeout)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self.proxy.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.proxy.close()


# ------------------------------------------------------------------------------------------------ the CLI


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m suite.proxy",
        description="A seeded fault-injecting HTTP/1.1 proxy between a client and one upstream server. "
        "Prints its URL on stdout, then one line per injected fault on stderr.",
    )
    p.add_argument("--listen", type=int, required=True, metavar="PORT", help="Port to listen on; 0 picks a free one.")
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    p.add_argument("--upstream", required=True, metavar="URL", help="The server to forward to, http://host:port.")
    p.add_argument(
        "--faults",
        default="none",
        metavar="SPEC",
        help="Comma list of name=probability, 'none' (a transparent proxy) or 'standard' (every fault, "
        f"{STANDARD_FAULTS}); delay=P:MAX_MS and "
        f"reorder=P:WINDOW_MS take a parameter. Faults: {', '.join(FAULTS)}.",
    )
    p.add_argument("--seed", type=int, default=None, help="Seed of the fault choices (default: random, printed).")
    return p


async def _serve(proxy: FaultProxy) -> None:
    await proxy.start()
    print(proxy.url, flush=True)
    print(
        f"dw-proxy: {proxy.url} -> {proxy.upstream}, faults {proxy.spec}, seed {proxy.seed}",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await proxy.close()
        counts = ", ".join(f"{name}={proxy.counts[name]}" for name in FAULTS)
        print(f"dw-proxy: stopped; faults fired: {counts}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    try:
        proxy = FaultProxy(
            args.upstream,
            args.faults,
            seed=seed,
            host=args.host,
            port=args.listen,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ValueError as exc:
        print(f"python -m suite.proxy: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(proxy))
    except OSError as exc:
        print(f"python -m suite.proxy: cannot listen on {args.host}:{args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
