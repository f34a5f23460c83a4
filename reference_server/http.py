"""The thin HTTP/1.1 shell around the reference server's pure handler.

Design (STYLE.md item 9): the application is one coroutine, ``handle(request) -> response``, built on the
protocol model and storage. It never sees a socket. This module is the only place that does, and all it
does is frame HTTP/1.1:

* ``Request`` / ``Response`` are plain data. ``Request.from_target`` builds a request exactly the way the
  shell does, so fast tests call the handler in process without a socket.
* ``HttpServer`` runs the handler behind asyncio streams, with ``h11`` reading requests: keep-alive,
  pipelining (answered in order, one at a time), ``Content-Length`` and chunked request bodies, HTTP/1.0
  clients, ``Expect: 100-continue``, and ``h11`` writing responses: a ``Response`` is validated first
  (:func:`_frame`), then sent as h11's own events on the connection's state machine, which starts its next
  cycle for the next request (a framer of this module's own was no faster over a whole conformance run:
  ARCHITECTURE.md).
* The request body is read completely before the handler runs; limits are enforced here, before the
  application spends anything on a request.
* Errors the shell detects itself (malformed HTTP, limits, timeouts, a crashing handler) are described by
  a ``ShellError`` and rendered by an ``ErrorResponder`` that the application supplies, so every response
  can carry the application's envelope. ``default_error_responder`` is used when none is given.

Error handling, as a tree of what the shell answers::

    h11.RemoteProtocolError       400 bad_request / 431 headers_too_large / h11's hint; then close
    Content-Length > limit        413 payload_too_large before any body byte is read; then close
    chunked body > limit          413 payload_too_large, the rest is not buffered; then close
    request incomplete in time    408 request_timeout (nothing of a response was sent yet); then close
    idle keep-alive times out     close, nothing sent
    CONNECT                       501 not_implemented; then close
    handler raises / bad result   500 internal_error, traceback logged; the connection stays usable
    client disconnects mid-call   the handler task is cancelled, nothing sent

Cancellation: when the peer closes the connection while the handler runs (for example during a long
poll), or when ``HttpServer.close()`` runs out of grace, the handler's task is cancelled, i.e. the handler
sees ``asyncio.CancelledError`` at its current ``await``. It must clean up and re-raise; whatever it returns
after that is discarded.

Caveats:

* Disconnects are detected by end-of-stream on the socket, so a client that half-closes its sending side
  (``shutdown(SHUT_WR)``) and still waits for the answer is treated as gone. HTTP clients do not do that.
  While a handler runs, at most ``max_header_bytes`` of pipelined input is read ahead; past that,
  disconnects of that connection go unnoticed until the handler returns.
* Every connection that ends after an error (or ``Connection: close``) is half-closed and drained for
  up to two seconds before the socket closes, so the client can read the error (RFC 9112 §9.6).
* Over ``max_concurrent_connections`` a new connection is accepted but not read until a slot frees.

Connections: each accepted connection gets an id (1, 2, ... per ``HttpServer``), which every request read
from it carries as ``Request.connection_id`` (0 for a request built in process). ``on_connection_closed``,
when given, is called once with that id when the connection ends, however it ends (the peer closed, an
error, a timeout, server shutdown), after its last request was answered or cancelled and before its socket
is closed. It runs in the event loop and must not block; an exception it raises is logged and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import http
import itertools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType, TracebackType
from typing import Any, Final, Self
from urllib.parse import parse_qsl, unquote, urlsplit

import h11

__all__ = [
    "SERVER_NAME",
    "ConnectionClosedCallback",
    "ErrorResponder",
    "Handler",
    "HttpServer",
    "Request",
    "Response",
    "ShellError",
    "default_error_responder",
    "encoded_json_response",
    "json_bytes",
    "json_response",
]

logger = logging.getLogger(__name__)

SERVER_NAME: Final = "dw-reference-server"

_READ_CHUNK: Final = 64 * 1024
# How long a closing connection keeps draining what the peer still sends (see ``_linger``).
_LINGER_SECONDS: Final = 2.0
# How long closing a transport may wait for its write buffer to flush before the socket is aborted.
_CLOSE_FLUSH_SECONDS: Final = 1.0

_STATUS_REASONS: Final[Mapping[int, str]] = MappingProxyType(
    {
        400: "bad_request",
        408: "request_timeout",
        413: "payload_too_large",
        431: "headers_too_large",
        500: "internal_error",
        501: "not_implemented",
        505: "http_version_not_supported",
    }
)


def _empty_str_mapping() -> Mapping[str, str]:
    return MappingProxyType({})


def _empty_multi_mapping() -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({})


# --------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """One HTTP request, fully read.

    ``path`` is percent-decoded as UTF-8 (so ``%2F`` becomes ``/``; use ``raw_path`` when that matters);
    neither includes the query string. ``query`` holds the first value of each parameter and
    ``query_multi`` all of them, in order; query strings are decoded like HTML forms (``+`` is a space).
    Header names are lower-cased; a repeated header's values are joined with ``", "``; values are
    decoded as ISO-8859-1 so no byte is lost. ``client`` is ``"host:port"`` of the peer when known.
    ``connection_id`` names the connection the request arrived on (see ``HttpServer``); 0 for a request
    built in process, which arrived on no connection.
    """

    method: str
    path: str
    raw_path: str
    query: Mapping[str, str] = field(default_factory=_empty_str_mapping)
    query_multi: Mapping[str, tuple[str, ...]] = field(default_factory=_empty_multi_mapping)
    headers: Mapping[str, str] = field(default_factory=_empty_str_mapping)
    body: bytes = b""
    client: str | None = None
    raw_query: str = ""
    connection_id: int = 0

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or ``None`` when the request has none."""
        return self.headers.get(name.lower())

    @classmethod
    def from_target(
        cls,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        client: str | None = None,
        connection_id: int = 0,
    ) -> Request:
        """Build a request from a request target (``/path?query``) the way the shell does.

        Raises ``ValueError`` when the target is not origin-form or absolute-form, or when its
        percent-encoding does not decode as UTF-8.
        """
        raw_path, raw_query = _split_target(target)
        query_multi = _parse_query(raw_query)
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        return cls(
            method=method.upper(),
            path=_decode_path(raw_path),
            raw_path=raw_path,
            query=MappingProxyType({name: values[0] for name, values in query_multi.items()}),
            query_multi=MappingProxyType(query_multi),
            headers=MappingProxyType(_combine_headers(pairs)),
            body=bytes(body),
            client=client,
            raw_query=raw_query,
            connection_id=connection_id,
        )


def _split_target(target: str) -> tuple[str, str]:
    """Split a request target into (raw path, raw query), RFC 9112 §3.2."""
    # A fragment is never sent on the wire (RFC 9110 §4.2.4); drop one if a client sends it anyway.
    target = target.partition("#")[0]
    if target.startswith("/"):
        path, _, query = target.partition("?")
        return path, query
    if target == "*":
        return "*", ""
    if "://" in target:
        # absolute-form: "a server MUST accept the absolute-form in requests" (RFC 9112 §3.2.2).
        parts = urlsplit(target)
        return parts.path or "/", parts.query
    raise ValueError(
        f"request target {target!r} is neither origin-form (/path?query) nor absolute-form; "
        "send a path starting with '/'"
    )


def _decode_path(raw_path: str) -> str:
    try:
        return unquote(raw_path, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ValueError(
            f"request path {raw_path!r} does not percent-decode to UTF-8; percent-encode UTF-8 bytes"
        ) from None


def _parse_query(raw_query: str) -> dict[str, tuple[str, ...]]:
    if not raw_query:
        return {}
    try:
        pairs = parse_qsl(raw_query, keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ValueError(
            f"query string {raw_query!r} does not percent-decode to UTF-8; percent-encode UTF-8 bytes"
        ) from None
    multi: dict[str, list[str]] = {}
    for name, value in pairs:
        multi.setdefault(name, []).append(value)
    return {name: tuple(values) for name, values in multi.items()}


def _combine_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    # "A recipient MAY combine multiple field lines within a field section that have the same field
    # name into one field line ... by appending each subsequent field line value ... separated by a
    # comma" (RFC 9110 §5.3).
    combined: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        combined[key] = f"{combined[key]}, {value}" if key in combined else value
    return combined


# -------------------------------------------------------------------------------------------- responses


@dataclass
class Response:
    """What a handler returns. The shell owns framing: it sets ``Content-Length`` itself and drops any
    ``Content-Length`` or ``Transfer-Encoding`` given here. ``Connection: close`` is honoured."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or ``None``."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def json(self) -> Any:
        """The body decoded as JSON (for in-process tests)."""
        return json.loads(self.body)


def json_bytes(obj: object) -> bytes:
    """``obj`` as compact UTF-8 JSON, the encoding of every JSON body the server sends."""
    return _JSON_ENCODER.encode(obj).encode("utf-8")


# One encoder for every body (json.dumps builds a new one per call when given options).
_JSON_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def json_response(status: int, obj: object, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """A compact UTF-8 JSON response; ``headers`` are added after ``Content-Type: application/json``
    (a ``Content-Type`` among them replaces the default)."""
    return encoded_json_response(status, json_bytes(obj), headers)


def encoded_json_response(status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """:func:`json_response` for a body already encoded by :func:`json_bytes`."""
    extra = list(headers)
    if any(name.lower() == "content-type" for name, _ in extra):
        return Response(status, body, extra)
    return Response(status, body, [("Content-Type", "application/json"), *extra])


# The application. It may be cancelled (asyncio.CancelledError at an await) when the client disconnects
# or the server shuts down; it should clean up and re-raise.
Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class ShellError:
    """An error the shell detected itself, before or around the handler.

    ``method`` and ``path`` are ``None`` when the request head could not be parsed; ``headers`` is then
    empty. ``path`` is percent-decoded when possible, else raw.
    """

    status: int
    reason: str
    message: str
    method: str | None = None
    path: str | None = None
    headers: Mapping[str, str] = field(default_factory=_empty_str_mapping)


ErrorResponder = Callable[[ShellError], Response]

# Told the id of a connection that ended (``Request.connection_id`` of the requests it carried).
ConnectionClosedCallback = Callable[[int], None]


def default_error_responder(error: ShellError) -> Response:
    """``{"reason": ..., "message": ..., "error": ...}`` as JSON with the error's status."""
    return json_response(error.status, {"reason": error.reason, "message": error.message, "error": error.message})


# ------------------------------------------------------------------------------------------- the server


class _Outcome(Enum):
    KEEP_ALIVE = "keep-alive"  # the cycle finished cleanly; serve the next request
    CLOSE = "close"  # we are done: half-close politely, drain, then close
    ABORT = "abort"  # the peer is gone or the socket broke: just close


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection
    client: str | None
    connection_id: int
    task: asyncio.Task[Any] | None = None
    # True while blocked on the peer with no request in flight (waiting for a request, a connection
    # slot, or lingering). close() cancels such connections at once instead of granting them grace.
    idle: bool = False
    # The bytes of the request head being read, as h11 last saw them: when h11 refuses the head (a bad
    # header, a head over the limit) its request line may still name the route (see ``_head_of``).
    unparsed: bytes = b""


@dataclass(frozen=True)
class _Head:
    """What is known about the request whose answer is being prepared, for ``ShellError``."""

    method: str
    path: str
    headers: Mapping[str, str]


class _IdleTimeout(Exception):
    """No byte of a next request arrived within the keep-alive idle timeout."""


class _BodyTooLarge(Exception):
    """A chunked body grew past the limit."""


class _HeadTooLarge(Exception):
    """A complete request head arrived that is larger than the limit."""


class HttpServer:
    """Serve ``handler`` over HTTP/1.1.

    ``async with HttpServer(handler) as server: await server.start("127.0.0.1", 0)`` — leaving the block
    closes the server. ``read_timeout`` bounds receiving one request (head and body) once its first byte
    arrived, and each wait for the peer to accept response bytes. ``idle_timeout`` bounds the wait for
    the first byte of a request on an open connection. Over ``max_concurrent_connections``, new
    connections wait (unread) for a slot. ``close()`` gives in-flight requests ``shutdown_grace`` seconds
    to finish, then cancels them. ``on_connection_closed`` is called with a connection's id once it ended
    (see the module docstring).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        error_responder: ErrorResponder = default_error_responder,
        max_header_bytes: int = 16 * 1024,
        max_body_bytes: int = 4 * 1024 * 1024,
        idle_timeout: float = 75.0,
        read_timeout: float = 30.0,
        max_concurrent_connections: int | None = None,
        shutdown_grace: float = 5.0,
        on_connection_closed: ConnectionClosedCallback | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_concurrent_connections is not None and max_concurrent_connections < 1:
            raise ValueError(f"max_concurrent_connections must be at least 1, got {max_concurrent_connections}")
        self._handler = handler
        self._error_responder = error_responder
        self._max_header_bytes = max_header_bytes
        self._max_body_bytes = max_body_bytes
        self._idle_timeout = idle_timeout
        self._read_timeout = read_timeout
        self._max_connections = max_concurrent_connections
        self._shutdown_grace = shutdown_grace
        self._on_connection_closed = on_connection_closed
        # The Date header's clock (seconds since the epoch): the server's own, so a test clock moves it too.
        self._clock = clock
        self._connection_ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._sockname: tuple[str, int] | None = None
        self._slots: asyncio.Semaphore | None = None
        self._connections: set[_Connection] = set()
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host``:``port``; port 0 picks a free port (read it from ``.port``)."""
        if self._server is not None or self._closing:
            raise RuntimeError("this HttpServer was already started or closed; create a new one to serve again")
        if self._max_connections is not None:
            self._slots = asyncio.Semaphore(self._max_connections)
        self._server = await asyncio.start_server(self._on_connection, host, port)
        # With port 0 and a host that resolves to several addresses each socket gets its own port;
        # the first socket is the one reported.
        sockname = self._server.sockets[0].getsockname()
        self._sockname = (str(sockname[0]), int(sockname[1]))

    @property
    def host(self) -> str:
        """The address the server is bound to."""
        return self._bound()[0]

    @property
    def port(self) -> int:
        """The port the server is bound to (the real one when started with port 0)."""
        return self._bound()[1]

    @property
    def url(self) -> str:
        """``http://host:port`` of the server, without a trailing slash."""
        host, port = self._bound()
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        """How many accepted connections have not ended yet (``on_connection_closed`` has run for the rest)."""
        return len(self._connections)

    def _bound(self) -> tuple[str, int]:
        if self._sockname is None:
            raise RuntimeError("the HttpServer is not started; call `await server.start(host, port)` first")
        return self._sockname

    async def close(self) -> None:
        """Stop accepting, close idle connections now, let in-flight requests finish within
        ``shutdown_grace`` seconds, then cancel what is left.

        Safe to call more than once; every call returns when the shutdown is complete. Cancelling a
        caller does not interrupt the shutdown.
        """
        self._closing = True
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._shut_down(), name="HttpServer.close")
        await asyncio.shield(self._close_task)

    async def _shut_down(self) -> None:
        server = self._server
        if server is None:
            return
        server.close()
        for connection in list(self._connections):
            if connection.idle and connection.task is not None:
                connection.task.cancel()
        tasks = {c.task for c in self._connections if c.task is not None}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._shutdown_grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- one connection

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelling a connection's task means "drop this connection", which is done by the time the
        # cancellation reaches here. The task's only observer is asyncio's streams callback, which (3.11)
        # reports a task that ends cancelled as an unhandled error, so the cancellation stops here.
        with contextlib.suppress(asyncio.CancelledError):
            await self._connection_lifetime(reader, writer)

    async def _connection_lifetime(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(
            reader=reader,
            writer=writer,
            protocol=h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_header_bytes),
            client=_format_peer(writer.get_extra_info("peername")),
            connection_id=next(self._connection_ids),
            task=asyncio.current_task(),
        )
        self._connections.add(connection)
        try:
            if self._closing:
                return
            if self._slots is None:
                await self._serve(connection)
                return
            connection.idle = True
            async with self._slots:
                connection.idle = False
                if not self._closing:
                    await self._serve(connection)
        except Exception:
            # The shell's own bug: log it, drop this connection, keep serving the others.
            logger.exception("unexpected error serving the connection from %s", connection.client)
        finally:
            self._connections.discard(connection)
            self._connection_ended(connection)
            await _close_stream(writer)

    def _connection_ended(self, connection: _Connection) -> None:
        if self._on_connection_closed is None:
            return
        try:
            self._on_connection_closed(connection.connection_id)
        except Exception:
            logger.exception(
                "the connection-closed callback failed for connection %d from %s",
                connection.connection_id,
                connection.client,
            )

    async def _serve(self, connection: _Connection) -> None:
        while True:
            try:
                outcome = await self._serve_one(connection)
            except (ConnectionError, TimeoutError):
                # The socket broke, or the peer stopped reading our response: nobody to answer.
                return
            if outcome is _Outcome.KEEP_ALIVE:
                continue
            if outcome is _Outcome.CLOSE:
                await self._linger(connection)
            return

    async def _serve_one(self, connection: _Connection) -> _Outcome:
        """Read one request, answer it, and say what to do with the connection."""
        event = await self._receive_head(connection)
        if isinstance(event, _Outcome):
            return event
        method = event.method.decode("ascii").upper()
        target = event.target.decode("ascii")  # h11 only accepts visible ASCII in the target
        headers = MappingProxyType(
            _combine_headers((name.decode("ascii"), value.decode("latin-1")) for name, value in event.headers)
        )
        if method == "CONNECT":
            return await self._fail(
                connection,
                501,
                "CONNECT is not supported; this server only serves origin requests.",
                _Head(method=method, path=_best_effort_path(target), headers=headers),
            )
        try:
            raw_path, raw_query = _split_target(target)
            path = _decode_path(raw_path)
            query_multi = _parse_query(raw_query)
        except ValueError as exc:
            head = _Head(method=method, path=_best_effort_path(target), headers=headers)
            return await self._fail(connection, 400, f"{exc}.", head)
        head = _Head(method=method, path=path, headers=headers)
        body = await self._receive_body(connection, head)
        if isinstance(body, _Outcome):
            return body
        request = Request(
            method=method,
            path=path,
            raw_path=raw_path,
            query=MappingProxyType({name: values[0] for name, values in query_multi.items()}),
            query_multi=MappingProxyType(query_multi),
            headers=headers,
            body=body,
            client=connection.client,
            raw_query=raw_query,
            connection_id=connection.connection_id,
        )
        return await self._answer(connection, request, head, target)

    async def _receive_head(self, connection: _Connection) -> h11.Request | _Outcome:
        """The next request head, or what to do with the connection when none came (answered if need be)."""
        try:
            event = await self._read_head(connection)
        except _IdleTimeout:
            return _Outcome.ABORT
        except TimeoutError:
            return await self._fail(
                connection,
                408,
                f"The request head was not received completely within {self._read_timeout:g} seconds; "
                "send the whole request promptly.",
                _head_of(connection.unparsed),
            )
        except _HeadTooLarge:
            return await self._fail(connection, 431, self._head_too_large_message(), _head_of(connection.unparsed))
        except h11.RemoteProtocolError as exc:
            return await self._protocol_error(connection, exc, _head_of(connection.unparsed))
        if isinstance(event, h11.ConnectionClosed) or event is None:
            return _Outcome.ABORT
        if not isinstance(event, h11.Request):
            raise RuntimeError(f"h11 produced {event!r} while a request head was expected")
        return event

    async def _receive_body(self, connection: _Connection, head: _Head) -> bytes | _Outcome:
        """The whole body, or what to do with the connection when it is refused (answered already)."""
        # Reject a declared oversize body before reading any of it (and before 100 Continue, so a
        # waiting client never sends it at all). h11 has already checked that the value is valid.
        declared = head.headers.get("content-length")
        if declared is not None and int(declared) > self._max_body_bytes:
            return await self._fail(
                connection,
                413,
                f"The request body is {int(declared)} bytes, more than the {self._max_body_bytes}-byte "
                "limit; send a smaller body.",
                head,
            )
        if connection.protocol.they_are_waiting_for_100_continue:
            # The body is always read before the handler runs, so there is no reason to make the
            # client wait for its expectation timeout (RFC 9110 §10.1.1).
            interim = connection.protocol.send(h11.InformationalResponse(status_code=100, headers=[]))
            await self._write(connection, interim or b"")
        try:
            return await self._read_body(connection)
        except TimeoutError:
            return await self._fail(
                connection,
                408,
                f"The request body was not received within {self._read_timeout:g} seconds; "
                "send the whole request promptly.",
                head,
            )
        except _BodyTooLarge:
            return await self._fail(
                connection,
                413,
                f"The request body exceeds the {self._max_body_bytes}-byte limit; send a smaller body.",
                head,
            )
        except h11.RemoteProtocolError as exc:
            return await self._protocol_error(connection, exc, head)

    async def _answer(self, connection: _Connection, request: Request, head: _Head, target: str) -> _Outcome:
        """Run the handler on ``request``, write its answer, and say what to do with the connection."""
        peer_gone = False
        close = self._closing or not _keep_alive(connection.protocol, head)
        try:
            result, peer_gone = await self._run_handler(connection, request)
        except Exception:
            logger.exception("the handler failed on %s %s from %s", request.method, target, connection.client)
            close = close or self._closing
            data = self._render_error(
                connection, _internal_error(head), close=close, head_only=request.method == "HEAD"
            )
        else:
            if result is _PEER_GONE:
                return _Outcome.ABORT
            close = close or self._closing or peer_gone
            data = self._render_result(connection, result, head, close=close)
        await self._write(connection, data)
        if peer_gone:
            return _Outcome.ABORT
        if close:
            return _Outcome.CLOSE
        protocol = connection.protocol
        if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
            return _Outcome.CLOSE  # not a whole exchange on both sides: nothing more may follow on it
        protocol.start_next_cycle()
        return _Outcome.KEEP_ALIVE

    # -- reading

    async def _read_head(self, connection: _Connection) -> h11.Event | None:
        """The next request head, ``ConnectionClosed``, or ``None`` when the server is closing."""
        protocol = connection.protocol
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            connection.unparsed = protocol.trailing_data[0]
            buffered = len(connection.unparsed)
            event = protocol.next_event()
            if isinstance(event, h11.Request):
                # h11's max_incomplete_event_size only bounds a head that is still incomplete; a whole
                # oversize head that arrives in one read is caught here, by what h11 consumed.
                if buffered - len(protocol.trailing_data[0]) > self._max_header_bytes:
                    raise _HeadTooLarge
                return event
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:
                raise RuntimeError("h11 paused while a request head was expected")
            if not protocol.trailing_data[0]:
                # Between requests: nothing is owed to anyone, so a closing server just hangs up.
                if self._closing:
                    return None
                try:
                    await self._receive(connection, self._idle_timeout, idle=True)
                except TimeoutError:
                    raise _IdleTimeout from None
            else:
                # One deadline for the whole head: a byte-at-a-time sender cannot keep a slot forever.
                if deadline is None:
                    deadline = loop.time() + self._read_timeout
                await self._receive(connection, max(0.0, deadline - loop.time()))

    async def _read_body(self, connection: _Connection) -> bytes:
        protocol = connection.protocol
        chunks: list[bytes] = []
        size = 0
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                await self._receive(connection, self._read_timeout)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self._max_body_bytes:
                    raise _BodyTooLarge
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise RuntimeError(f"h11 produced {event!r} while a request body was expected")

    async def _receive(self, connection: _Connection, timeout: float, *, idle: bool = False) -> None:
        connection.idle = idle
        try:
            async with asyncio.timeout(timeout):
                data = await connection.reader.read(_READ_CHUNK)
        finally:
            connection.idle = False
        connection.protocol.receive_data(data)  # b"" tells h11 the peer closed

    # -- running the handler

    async def _run_handler(self, connection: _Connection, request: Request) -> tuple[object, bool]:
        """Run the handler while watching the socket; returns (result or ``_PEER_GONE``, peer closed).

        Most handlers answer in their first step (a transaction runs without an ``await``), so that step runs
        here, at once: the common request costs no task of its own, no turn of the event loop and no watcher.
        Only a handler still running after it, such as a long poll, goes on in a task of its own while the
        socket is watched. An exception of the first step propagates from here, as the task's would."""
        coro = _call(self._handler, request)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value, False
        handler_task: asyncio.Task[object] = asyncio.create_task(
            _resume(coro, yielded), name=f"handler {request.method} {request.raw_path}"
        )
        watcher = asyncio.create_task(self._watch_for_disconnect(connection), name="disconnect watcher")
        try:
            waiting: set[asyncio.Task[Any]] = {handler_task, watcher}
            while True:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if handler_task in done:
                    break
                if watcher.exception() is None and watcher.result():
                    # The peer closed: nobody will read the answer, so stop the (long-poll) handler now.
                    await _cancel_and_wait(handler_task)
                    return _PEER_GONE, True
                waiting = {handler_task}  # the watcher stopped buffering; just wait for the handler
        finally:
            if not handler_task.done():  # we are being cancelled ourselves (server close)
                await _cancel_and_wait(handler_task)
            peer_closed = await _stop_watcher(watcher)
        if handler_task.cancelled():
            raise RuntimeError("the handler's task was cancelled although the client is still connected")
        return handler_task.result(), peer_closed

    async def _watch_for_disconnect(self, connection: _Connection) -> bool:
        """Read while the handler runs: ``True`` at end of stream, ``False`` after buffering enough.

        Bytes that arrive are the next pipelined request(s), not a disconnect: hand them to h11, which
        keeps them for the next cycle.
        """
        buffered = 0
        while buffered <= self._max_header_bytes:
            try:
                data = await connection.reader.read(_READ_CHUNK)
            except ConnectionError:
                return True
            if not data:
                return True
            connection.protocol.receive_data(data)
            buffered += len(data)
        return False

    # -- writing

    def _render_result(self, connection: _Connection, result: object, head: _Head, *, close: bool) -> bytes:
        head_only = head.method == "HEAD"
        try:
            return _frame(connection.protocol, result, close=close, head_only=head_only, now=self._clock())
        except Exception:
            logger.exception("the handler for %s %s returned an unusable response", head.method, head.path)
            return self._render_error(connection, _internal_error(head), close=close, head_only=head_only)

    def _render_error(
        self, connection: _Connection, error: ShellError, *, close: bool, head_only: bool = False
    ) -> bytes:
        protocol, now = connection.protocol, self._clock()
        try:
            return _frame(protocol, self._error_responder(error), close=close, head_only=head_only, now=now)
        except Exception:
            logger.exception("the error responder failed on %s; using the default", error)
            return _frame(protocol, default_error_responder(error), close=close, head_only=head_only, now=now)

    async def _write(self, connection: _Connection, data: bytes) -> None:
        connection.writer.write(data)
        if connection.writer.transport.get_write_buffer_size() == 0:
            return  # the socket took every byte (the usual case): there is nothing to wait for
        # A peer that never reads must not pin the connection forever.
        async with asyncio.timeout(self._read_timeout):
            await connection.writer.drain()

    async def _fail(self, connection: _Connection, status: int, message: str, head: _Head | None) -> _Outcome:
        """Answer an error the shell detected and close the connection."""
        error = ShellError(
            status=status,
            reason=_STATUS_REASONS.get(status, "bad_request"),
            message=message,
            method=head.method if head else None,
            path=head.path if head else None,
            headers=head.headers if head else _empty_str_mapping(),
        )
        data = self._render_error(connection, error, close=True, head_only=head is not None and head.method == "HEAD")
        await self._write(connection, data)
        return _Outcome.CLOSE

    async def _protocol_error(
        self, connection: _Connection, exc: h11.RemoteProtocolError, head: _Head | None
    ) -> _Outcome:
        status = exc.error_status_hint
        if status == 431:
            message = self._head_too_large_message()
        else:
            message = f"The request is not valid HTTP/1.1 ({exc}); fix the request framing."
        return await self._fail(connection, status, message, head)

    def _head_too_large_message(self) -> str:
        return (
            f"The request line and headers exceed the {self._max_header_bytes}-byte limit; "
            "send fewer or smaller headers."
        )

    async def _linger(self, connection: _Connection) -> None:
        """Half-close, then discard what the peer still sends until it closes or a short deadline.

        "If a server performs an immediate close of a TCP connection, there is a significant risk that
        the client will not be able to read the last HTTP response" (RFC 9112 §9.6): closing a socket
        with unread input makes the kernel send RST, which can destroy our error response in the
        client's receive buffer. Typical case: a 413 answered before the body was read.
        """
        writer = connection.writer
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        connection.idle = True
        try:
            async with asyncio.timeout(min(self._read_timeout, _LINGER_SECONDS)):
                while await connection.reader.read(_READ_CHUNK):
                    pass
        except (TimeoutError, ConnectionError):
            pass
        finally:
            connection.idle = False


class _PeerGone:
    """Marker result: the client disconnected while the handler ran."""


_PEER_GONE: Final = _PeerGone()


async def _call(handler: Handler, request: Request) -> object:
    # Typed as ``object`` on purpose: the result is validated, not trusted.
    result: object = await handler(request)
    return result


class _Resumed:
    """Awaitable that goes on with a coroutine whose first step already ran and yielded ``yielded`` (what a
    coroutine yields to its task: a future it waits on, or ``None`` to let the loop run once). The task that
    awaits this sees the same yields, sends and throws the coroutine would have seen as the task's own
    coroutine, so waiting, cancellation and exceptions behave as if it had been a task from the start."""

    def __init__(self, coro: Coroutine[Any, Any, object], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, object]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # thrown in by the task (a cancellation): the coroutine gets it
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _resume(coro: Coroutine[Any, Any, object], yielded: Any) -> object:
    return await _Resumed(coro, yielded)


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    task.cancel()
    # asyncio.wait never raises the task's exception, but does propagate our own cancellation.
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a cancelled handler raised instead", exc_info=task.exception())


async def _stop_watcher(watcher: asyncio.Task[bool]) -> bool:
    """Stop the disconnect watcher; ``True`` if it had already seen the peer close."""
    if not watcher.done():
        watcher.cancel()
        # Cancelling a pending StreamReader.read loses no data: bytes stay in the reader's buffer.
        await asyncio.wait({watcher})
    return not watcher.cancelled() and watcher.exception() is None and watcher.result()


def _internal_error(head: _Head) -> ShellError:
    return ShellError(
        status=500,
        reason="internal_error",
        message="The server failed while handling this request; this is a bug in the reference server, see its log.",
        method=head.method,
        path=head.path,
        headers=head.headers,
    )


_SERVER_NAME_BYTES: Final = SERVER_NAME.encode("ascii")
_REASON_PHRASES: Final[Mapping[int, bytes]] = MappingProxyType(
    {status.value: status.phrase.encode("ascii") for status in http.HTTPStatus}
)


@functools.lru_cache(maxsize=4)
def _http_date(second: int) -> bytes:
    """The ``Date`` value of ``second`` (RFC 9110 §5.6.7: whole seconds), formatted once for all the responses
    of that second."""
    return email.utils.formatdate(second, usegmt=True).encode("ascii")


def _frame(protocol: h11.Connection, response: object, *, close: bool, head_only: bool, now: float) -> bytes:
    """A handler's response as the bytes h11 sends for it on ``protocol``: validated before anything is sent (a
    status of 200–599, a bytes body, header names and values as RFC 9110 §5 allows them; a bad one raises and
    the caller answers 500 instead), then ``Response``, ``Data`` and ``EndOfMessage``. The shell adds
    ``Server``, ``Date``, the length and ``Connection: close``; h11 owns the framing."""
    if not isinstance(response, Response):
        raise TypeError(f"expected a Response, got {type(response).__name__}")
    status: object = response.status
    if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
        raise ValueError(f"response status must be an int from 200 to 599, got {status!r}")
    body: object = response.body
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"response body must be bytes, got {type(body).__name__}")
    # RFC 9110 §15.3.5 / §15.4.5: 204 and 304 never have content (and 204 never Content-Length).
    no_content = status in (204, 304)
    payload = b"" if no_content else bytes(body)

    headers: list[tuple[bytes, bytes]] = []
    seen: set[str] = set()
    for name, value in response.headers:
        key = name.lower()
        if key in ("content-length", "transfer-encoding"):
            continue  # the shell owns message framing
        raw_name, raw_value = name.encode("ascii"), value.encode("latin-1")
        if _FIELD_NAME.fullmatch(raw_name) is None:
            raise ValueError(f"illegal response header name {name!r}")
        if _FIELD_VALUE.fullmatch(raw_value) is None:
            raise ValueError(f"illegal value of response header {name!r}: {value!r}")
        seen.add(key)
        headers.append((raw_name, raw_value))
    if "server" not in seen:
        headers.append((b"Server", _SERVER_NAME_BYTES))
    if "date" not in seen:
        headers.append((b"Date", _http_date(int(now))))
    if not no_content:
        # For HEAD, Content-Length states the size a GET would have had (RFC 9110 §8.6).
        headers.append((b"Content-Length", b"%d" % len(payload)))
    if close:
        headers.append((b"Connection", b"close"))
    if protocol.our_state is h11.ERROR:
        protocol = h11.Connection(h11.SERVER)  # a send h11 refused earlier: the 500 is framed afresh, then closed
    reason = _REASON_PHRASES.get(status, b"")
    data = protocol.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""
    if head_only and close:
        # The connection ends here: the head is all a HEAD request gets, whether or not h11 read the request
        # (an error answered from a head h11 refused has no request for h11 to know the method of).
        return data
    if payload and not head_only:
        data += protocol.send(h11.Data(data=payload)) or b""
    return data + (protocol.send(h11.EndOfMessage()) or b"")


# RFC 9110 §5.1 (a token) and §5.5 (field-content: visible characters and obs-text, spaces and tabs only
# between them): what h11 accepts, checked before the first event so that a refused header leaves nothing sent.
_FIELD_NAME: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE: Final = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")


def _keep_alive(protocol: h11.Connection, head: _Head) -> bool:
    """Whether the connection may carry another request after this one's answer, by h11's rule: an HTTP/1.1
    request without a ``close`` token in its ``Connection`` header (RFC 9112 §9.3)."""
    if protocol.their_http_version != b"1.1":
        return False
    tokens = head.headers.get("connection", "")
    return "close" not in (token.strip().lower() for token in tokens.split(","))


# RFC 9112 §3: request-line = method SP request-target SP HTTP-version CRLF (origin-form targets only).
_REQUEST_LINE: Final = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/[!-~]*) HTTP/[0-9]\.[0-9]\r?\n")


def _head_of(unparsed: bytes) -> _Head | None:
    """Method and path from the request line of a head that h11 refused, or ``None`` without one.

    A malformed header or an oversize head still comes after a well-formed request line, and the route it
    names decides the error's envelope: the worker envelope is on "every `/api/worker/*` response including
    errors" (docs/reference.md: Envelope). Headers are not trusted here, so none are passed on.
    """
    match = _REQUEST_LINE.match(unparsed)
    if match is None:
        return None
    method, target = match.group(1).decode("ascii").upper(), match.group(2).decode("ascii")
    return _Head(method=method, path=_best_effort_path(target), headers=_empty_str_mapping())


def _best_effort_path(target: str) -> str:
    try:
        return _decode_path(_split_target(target)[0])
    except ValueError:
        return target.partition("?")[0]


def _format_peer(peer: object) -> str | None:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(peer) if peer else None


async def _close_stream(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_FLUSH_SECONDS):
            await writer.wait_closed()
    except (TimeoutError, OSError):
        writer.transport.abort()
    except asyncio.CancelledError:
        writer.transport.abort()
        raise
