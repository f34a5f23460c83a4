"""The suite's HTTP client: every request is recorded as an :class:`Exchange`.

Checks talk to the target only through :class:`ProtocolClient`. It adds the right headers per plane,
records every exchange (with tokens redacted), validates every response against ``schemas/`` through a
pluggable validator, and turns transport problems into :class:`~suite.outcomes.HarnessError` — a
network timeout is the harness's error verdict, never the target's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import secrets
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import h11
import httpx

from suite.protocol.fencing import parse_rfc3339
from suite.protocol.retries import Operation, Repeat, changes_state, classify, judge_poll_retry, judge_repeat, leased
from suite.protocol.versions import ADVERTISED_VERSION, CONTROL_PLANE_VERSION

from .exchange import Exchange
from .outcomes import CheckFailure, HarnessError, Indeterminate

__all__ = [
    "CONTROL_HEADER",
    "LOST_ANSWER",
    "TRACE_HEADER",
    "WORKER_HEADER",
    "Exchange",
    "FaultLedger",
    "Http11Transport",
    "ProtocolClient",
    "Reply",
    "direct_http",
    "resendable_poll",
    "tls",
]

TRACE_HEADER = "X-Conformance-Trace"
# How many times one request is delivered at most when its answers keep getting lost.
MAX_DELIVERIES = 6
# What a lost answer looks like on the wire: the connection closed or reset after the request went out, or a
# body cut short. A refused connection (the request never left) and a timeout are the harness's errors.
LOST_ANSWER = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)


@functools.cache
def tls() -> ssl.SSLContext:
    """The one TLS context of the process, for every HTTP client the suite makes: building one loads the CA
    bundle (tens of milliseconds), which a run making hundreds of clients would otherwise pay each time."""
    return ssl.create_default_context()


WORKER_HEADER = "X-Durable-Workflow-Protocol-Version"
CONTROL_HEADER = "X-Durable-Workflow-Control-Plane-Version"
REDACTED = "<redacted>"


@dataclass
class Reply:
    """A response as a check sees it."""

    status: int
    headers: httpx.Headers
    body: Any  # parsed JSON, or None when the body is not JSON
    text: str
    exchange: Exchange
    # Under --faults: how many earlier deliveries of this request lost their answers. Each may have been
    # applied (a poll resent with its poll_request_id after its lease expired may have leased behind it).
    resent: int = 0

    @property
    def server_date(self) -> datetime | None:
        """The target's clock when it answered: its ``Date`` header (floored to the second), or ``None``."""
        value = self.headers.get("date")
        if not value:
            return None
        try:
            dt = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)

    def json(self) -> dict[str, Any]:
        """The body as an object; a non-object body is an empty dict (the check then fails on content)."""
        return self.body if isinstance(self.body, dict) else {}

    @property
    def reason(self) -> str | None:
        value = self.json().get("reason")
        return value if isinstance(value, str) else None


Validator = Callable[[str, str, int, Any], list[str]]


class Withheld(Protocol):
    """An answer of the target the client never received (see :class:`suite.proxy.WithheldResponse`)."""

    fault: str
    status: int | None
    body: bytes
    headers: tuple[tuple[str, str], ...]


class FaultLedger(Protocol):
    """What a fault proxy in this process knows of one request, by its ``X-Conformance-Trace``."""

    def events_for(self, trace: str) -> list[Any]: ...

    def wait_withheld(self, trace: str, fault: str, timeout: float) -> Withheld | None: ...


class _AnswerLost(Exception):
    def __init__(self, exchange: Exchange, error: str) -> None:
        super().__init__(error)
        self.exchange = exchange


# -- the wire ---------------------------------------------------------------------------------------------

# The largest response head accepted, as httpx's own transport has it (h11's default is 16 KiB).
MAX_HEAD_BYTES = 100 * 1024


class _Framing:
    """One keep-alive HTTP/1.1 connection as h11 sees it, without I/O: the bytes of a request, and the answer
    once the bytes received complete it. :class:`Http11Transport` drives it on asyncio streams; httpx's
    exceptions say what went wrong, as httpx's own transports raise them."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._response: h11.Response | None = None
        self._chunks: list[bytes] = []

    def request(self, request: httpx.Request, body: bytes) -> bytes:
        head = h11.Request(method=request.method, target=request.url.raw_path, headers=request.headers.raw)
        try:
            data = self.h11.send(head) + (self.h11.send(h11.Data(data=body)) if body else b"")
            return data + self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc

    def received(self, data: bytes) -> httpx.Response | None:
        """``data`` read from the connection (``b""``: its end); the whole answer once it is complete."""
        if not data and self.h11.their_state is h11.SEND_RESPONSE:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        self.h11.receive_data(data)
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                return None
            if isinstance(event, h11.Response):
                self._response = event
            elif isinstance(event, h11.Data):
                self._chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage) and self._response is not None:
                response, body = self._response, b"".join(self._chunks)
                self._response, self._chunks = None, []
                extensions = {"http_version": b"HTTP/1.1", "reason_phrase": bytes(response.reason)}
                return httpx.Response(
                    response.status_code, headers=response.headers, stream=httpx.ByteStream(body), extensions=extensions
                )
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError("Server disconnected without sending a complete response.")
            # An informational answer (100 Continue) precedes the real one.

    def next_cycle(self) -> bool:
        """After an answer: ready for the next request on this connection (else it must be closed)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


@contextlib.contextmanager
def _socket_errors(timeout: type[httpx.TimeoutException], error: type[httpx.NetworkError], what: str) -> Iterator[None]:
    """A socket's timeout or error while ``what``, as the httpx exception the rest of the client knows."""
    try:
        yield
    except TimeoutError as exc:
        raise timeout(f"timed out {what}") from exc
    except OSError as exc:
        raise error(str(exc) or type(exc).__name__) from exc


class _Wire:
    """One keep-alive HTTP/1.1 connection on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.framing = _Framing()

    @property
    def reusable(self) -> bool:
        """Idle, and not closed by the peer meanwhile (an idle keep-alive connection the server closed has
        seen its end of stream by the time the event loop runs again)."""
        return not (self.reader.at_eof() or self.writer.transport.is_closing())

    async def exchange(self, request: httpx.Request, timeouts: Mapping[str, float | None]) -> httpx.Response:
        data = self.framing.request(request, await request.aread())
        with _socket_errors(httpx.WriteTimeout, httpx.WriteError, "writing the request"):
            async with asyncio.timeout(timeouts.get("write")):
                self.writer.write(data)
                await self.writer.drain()
        while True:
            with _socket_errors(httpx.ReadTimeout, httpx.ReadError, "reading the response"):
                async with asyncio.timeout(timeouts.get("read")):
                    data = await self.reader.read(65536)
            response = self.framing.received(data)
            if response is not None:
                return response

    def done(self) -> bool:
        return self.framing.next_cycle()

    def close(self) -> None:
        self.writer.close()


class Http11Transport(httpx.AsyncBaseTransport):
    """httpx's transport for ``http://`` URLs, written on asyncio streams and h11 alone.

    The suite makes tens of thousands of requests per run, one at a time, on loopback: httpx's own transport
    (httpcore over anyio) costs several times the CPU of the request itself, which the target then waits on.
    This one keeps what the suite relies on — keep-alive connections (at most ``max_connections``), the
    connect, read, write and pool timeouts, and httpx's exceptions for what goes wrong on the wire (a refused
    connection, one reset or closed before the whole answer came) — and hands every other scheme (``https``)
    to httpx's transport, as do the proxies httpx takes from the environment.
    """

    def __init__(self, *, max_connections: int = 64) -> None:
        self._idle: dict[tuple[str, int], list[_Wire]] = {}
        self._open: set[_Wire] = set()
        self._max_connections = max_connections
        self._slots: asyncio.Semaphore | None = None
        self._other = httpx.AsyncHTTPTransport(verify=tls(), limits=httpx.Limits(max_connections=max_connections))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            return await self._other.handle_async_request(request)
        timeouts: Mapping[str, float | None] = request.extensions.get("timeout", {})
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_connections)
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no connection became free in time") from exc
        try:
            key = (request.url.host, request.url.port or 80)
            wire = await self._checkout(key, timeouts.get("connect"))
            try:
                response = await wire.exchange(request, timeouts)
            except BaseException:
                self._discard(wire)
                raise
            if wire.done():
                self._idle.setdefault(key, []).append(wire)
            else:
                self._discard(wire)
            return response
        finally:
            self._slots.release()

    async def _checkout(self, key: tuple[str, int], timeout: float | None) -> _Wire:
        idle = self._idle.get(key)
        while idle:
            wire = idle.pop()
            if wire.reusable:
                return wire
            self._discard(wire)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(*key)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {key[0]}:{key[1]} in time") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        wire = _Wire(reader, writer)
        self._open.add(wire)
        return wire

    def _discard(self, wire: _Wire) -> None:
        wire.close()
        self._open.discard(wire)

    async def aclose(self) -> None:
        wires, self._open, self._idle = self._open, set(), {}
        for wire in wires:
            wire.close()
        for wire in wires:
            with contextlib.suppress(OSError):
                await wire.writer.wait_closed()
        await self._other.aclose()


class ProtocolClient:
    """Worker-plane and control-plane calls against one target, recorded.

    ``exchanges`` is shared with the caller so a failing check can attach the evidence.
    """

    def __init__(
        self,
        base_url: str,
        *,
        worker_token: str | None = None,
        operator_token: str | None = None,
        namespace: str = "default",
        worker_version: str = ADVERTISED_VERSION,
        timeout: float = 10.0,
        validator: Validator | None = None,
        exchanges: list[Exchange] | None = None,
        faults: FaultLedger | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.worker_token = worker_token
        self.operator_token = operator_token
        self.namespace = namespace
        self.worker_version = worker_version
        self.timeout = timeout
        self.validator = validator
        self.exchanges: list[Exchange] = exchanges if exchanges is not None else []
        # A plain http target is reached through Http11Transport directly (httpx's client adds a request's
        # default headers and cookies here instead); any other through httpx's client and transport.
        self._wire = Http11Transport(max_connections=64) if direct_http(self.base_url) else None
        limits = httpx.Limits(max_connections=64)
        self._http = httpx.AsyncClient(timeout=timeout, verify=tls(), limits=limits, transport=self._wire)
        self._secrets = {t for t in (worker_token, operator_token) if t}
        # When the target last answered a request of this client (time.monotonic()): a request it may hold is
        # given its grace from then on (CheckContext.held), as racing requests are served one after another.
        self.last_answer = 0.0
        # With a fault proxy in front of the target (--faults), every request carries a trace id, a lost
        # answer is resolved by the rules of suite.protocol.retries, and repeated deliveries are judged.
        self.faults = faults

    async def aclose(self) -> None:
        await self._http.aclose()

    async def reconnect(self) -> None:
        """Drop every connection (the target restarted: each one it had is gone) and open new ones from now on."""
        await self._http.aclose()
        self._wire = Http11Transport(max_connections=64) if direct_http(self.base_url) else None
        limits = httpx.Limits(max_connections=64)
        self._http = httpx.AsyncClient(timeout=self.timeout, verify=tls(), limits=limits, transport=self._wire)

    async def direct(self, url: str, body: Any, headers: Mapping[str, str], timeout: float) -> httpx.Response:
        """A POST outside the protocol (test equipment such as the target's test clock), on this client's
        connections: neither recorded, validated nor sent through the fault proxy."""
        return await self._http.post(url, json=body, headers=dict(headers), timeout=timeout)

    async def __aenter__(self) -> ProtocolClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- planes ----------------------------------------------------------------------------------------

    def worker_headers(
        self,
        *,
        version: str | None = ADVERTISED_VERSION,
        namespace: str | None = None,
        token: str | bool | None = True,
    ) -> dict[str, str]:
        headers = {"X-Namespace": namespace or self.namespace}
        if version is not None:
            headers[WORKER_HEADER] = version
        tok = self.worker_token if token is True else (token or None)
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        return headers

    def control_headers(self, *, namespace: str | None = None, token: str | bool | None = True) -> dict[str, str]:
        headers = {"X-Namespace": namespace or self.namespace, CONTROL_HEADER: CONTROL_PLANE_VERSION}
        tok = self.operator_token if token is True else (token or None)
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        return headers

    def plane_headers(self, plane: str) -> dict[str, str]:
        """The headers a well-formed request of ``plane`` carries: the worker or control plane's version, namespace
        and token; any other plane (discovery) only a token."""
        if plane == "worker":
            return self.worker_headers(version=self.worker_version)
        if plane == "control":
            return self.control_headers()
        token = self.operator_token or self.worker_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def worker(
        self,
        path: str,
        body: Any = None,
        *,
        method: str = "POST",
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **header_opts: Any,
    ) -> Reply:
        """A worker-plane call (``path`` below ``/api/worker``). ``header_opts`` go to :meth:`worker_headers`."""
        if "version" not in header_opts:
            header_opts["version"] = self.worker_version
        h = self.worker_headers(**header_opts)
        h.update(headers or {})
        return await self.request(method, "/api/worker" + path, headers=h, json_body=body, timeout=timeout)

    async def control(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **header_opts: Any,
    ) -> Reply:
        """A control-plane call (``path`` below ``/api``)."""
        h = self.control_headers(**header_opts)
        h.update(headers or {})
        return await self.request(method, "/api" + path, headers=h, json_body=body, params=params, timeout=timeout)

    # -- the one way out -------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Reply:
        url = self.base_url + path
        if params:
            url += "?" + httpx.QueryParams(dict(params)).__str__()
        hdrs = dict(headers or {})
        if self.faults is not None:
            return await self._deliver(method, url, path, hdrs, json_body, content, timeout)
        if json_body is not None and content is None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            hdrs.setdefault("Content-Type", "application/json")
        try:
            return await self._send(method, url, path, hdrs, content, timeout)
        except _AnswerLost as lost:
            raise HarnessError(f"{method} {url}: {lost}") from lost.__cause__

    async def _send(
        self,
        method: str,
        url: str,
        path: str,
        hdrs: dict[str, str],
        content: bytes | None,
        timeout: float | None,
    ) -> Reply:
        exchange = Exchange(
            method=method,
            url=url,
            request_headers={k: (REDACTED if k.lower() == "authorization" else v) for k, v in hdrs.items()},
            request_body=self._redact(content.decode("utf-8", "replace")) if content is not None else None,
            started_at=time.time(),
        )
        self.exchanges.append(exchange)
        t0 = time.monotonic()
        try:
            resp = await self._roundtrip(method, url, hdrs, content, timeout if timeout is not None else self.timeout)
        except httpx.TimeoutException as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"timeout after {exchange.elapsed:.1f}s ({type(exc).__name__})"
            raise HarnessError(f"{method} {url}: no response within {exchange.elapsed:.1f}s") from exc
        except LOST_ANSWER as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise _AnswerLost(exchange, exchange.error) from exc
        except httpx.HTTPError as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise HarnessError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        self.last_answer = time.monotonic()
        exchange.elapsed = self.last_answer - t0
        exchange.status = resp.status_code
        exchange.response_headers = dict(resp.headers)
        text = resp.text
        try:
            body: Any = resp.json()
        except ValueError:
            body = None
        exchange.response_body = body if body is not None else text[:4000]
        if self.validator is not None:
            exchange.schema_errors = self.validator(method, path, resp.status_code, body)
        return Reply(status=resp.status_code, headers=resp.headers, body=body, text=text, exchange=exchange)

    async def _roundtrip(
        self, method: str, url: str, headers: Mapping[str, str], content: bytes | None, timeout: float
    ) -> httpx.Response:
        """One request and its whole answer. On :class:`Http11Transport` the request is built as httpx's client
        builds it — its default headers under the caller's, its cookie jar — without the rest of its machinery
        (authentication and redirect flows the suite never uses), which costs more CPU than the request."""
        if self._wire is None:
            return await self._http.request(method, url, headers=headers, content=content, timeout=timeout)
        merged = httpx.Headers(self._http.headers)
        merged.update(headers)
        request = httpx.Request(
            method, url, headers=merged, content=content, extensions={"timeout": httpx.Timeout(timeout).as_dict()}
        )
        cookies = self._http.cookies
        if cookies:
            cookies.set_cookie_header(request)
        response = await self._wire.handle_async_request(request)
        response.request = request
        await response.aread()
        if "set-cookie" in response.headers:
            cookies.extract_cookies(response)
        return response

    # -- under a fault proxy ---------------------------------------------------------------------------

    async def _deliver(
        self,
        method: str,
        url: str,
        path: str,
        hdrs: dict[str, str],
        json_body: Any,
        content: bytes | None,
        timeout: float | None,
    ) -> Reply:
        """Send a request through the fault proxy the way a careful worker would, and judge what the faults
        reveal. A lost answer is resent when the protocol makes that safe (reads, registration, heartbeats, a
        poll with a ``poll_request_id``; a poll the check sent without one gets one, as the official SDK
        always sends one); the resent answer is judged against the lost one (§7.3 replay). A lost answer of
        any other request is resent once more when the protocol says what the repeat must answer (complete,
        fail, start), the repeat is judged, and the check cannot go on: :class:`Indeterminate` — unless the
        proxy saw the target refuse the lost delivery (a refused request changed nothing, so it is resent).
        A request the proxy delivered twice is judged by the same rules."""
        op = classify(method, path)
        # Bytes exactly as the check wrote them are sent as they are and judged as JSON.
        json_body = _parse(content) if content is not None else resendable_poll(op, json_body)
        if content is None and json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            hdrs.setdefault("Content-Type", "application/json")
        lost: list[tuple[str, Exchange]] = []  # deliveries whose answer was lost and may have been applied
        for _ in range(MAX_DELIVERIES):
            trace = secrets.token_hex(8)
            try:
                reply = await self._send(method, url, path, {**hdrs, TRACE_HEADER: trace}, content, timeout)
            except _AnswerLost as exc:
                first = await self._lost_answer(trace, self._wait_budget(json_body, timeout))
                if first is not None and op.refused(first.status):
                    # The proxy saw the target refuse it, and a refused request changes nothing (§3): sending
                    # it again is as safe as sending it the first time.
                    continue
                lost.append((trace, exc.exchange))
                if op.repeat is Repeat.UNSAFE or (op.repeat is Repeat.POLL and not op.resendable(json_body)):
                    copies = 2 if self._duplicated(trace) else 1
                    msg = f"{method} {url}: {exc} (the answer was lost; maybe applied)"
                    raise Indeterminate(msg, copies=copies) from None
                continue
            if lost:
                await self._judge_after_loss(op, json_body, lost, reply, timeout)
                reply.resent = len(lost)
            await self._judge_duplicate(op, trace, reply, timeout)
            return reply
        raise Indeterminate(f"{method} {url}: the answers of {MAX_DELIVERIES} deliveries in a row were lost")

    def _duplicated(self, trace: str) -> bool:
        assert self.faults is not None
        return any(e.fault == "duplicate_request" for e in self.faults.events_for(trace))

    def _wait_budget(self, json_body: Any, timeout: float | None) -> float:
        """How long an answer the proxy withheld may still take (a long poll's own timeout, and then some)."""
        poll = json_body.get("timeout_seconds") if isinstance(json_body, dict) else None
        extra = float(poll) if isinstance(poll, int | float) and not isinstance(poll, bool) else 0.0
        return min(extra, 120.0) + (timeout if timeout is not None else self.timeout)

    async def _withheld(self, trace: str, fault: str, wait: float) -> Withheld | None:
        assert self.faults is not None
        return await asyncio.to_thread(self.faults.wait_withheld, trace, fault, wait)

    async def _lost_answer(self, trace: str, wait: float) -> Withheld | None:
        assert self.faults is not None
        for event in self.faults.events_for(trace):
            if event.fault in ("drop_response", "reset_long_poll", "truncate_body"):
                return await self._withheld(trace, event.fault, wait)
        return None

    async def _judge_after_loss(
        self, op: Operation, json_body: Any, lost: list[tuple[str, Exchange]], reply: Reply, timeout: float | None
    ) -> None:
        wait = self._wait_budget(json_body, timeout)
        first: tuple[Withheld, Exchange] | None = None
        for trace, exchange in lost:
            answer = await self._lost_answer(trace, wait)
            if answer is None or answer.status is None:
                continue
            if op.repeat is not Repeat.POLL or leased(_parse(answer.body)) is not None:
                first = (answer, exchange)
                break
            first = first or (answer, exchange)
        if first is not None:
            answer, exchange = first
            body = _parse(answer.body)
            if op.repeat is Repeat.POLL:
                violation = judge_poll_retry(
                    answer.status, body, reply.status, reply.body, reply.server_date, parse_rfc3339
                )
            else:
                violation = judge_repeat(op, answer.status, body, reply.status, reply.body)
            if violation is not None:
                evidence = self._withheld_exchange(exchange, answer)
                raise CheckFailure(
                    violation.message,
                    expected=violation.expected,
                    received=violation.received or reply.exchange.summary(),
                    exchanges=[evidence, reply.exchange],
                    requirement=violation.requirement,
                )
        if not op.resendable(json_body):
            what = f"{lost[0][1].summary()}; the repeat answered {reply.status}"
            raise Indeterminate(f"{what} (the first delivery may have been applied; the check cannot go on)")

    async def _judge_duplicate(self, op: Operation, trace: str, reply: Reply, timeout: float | None) -> None:
        if not self._duplicated(trace):
            return
        body = _parse((reply.exchange.request_body or "").encode())
        dup = await self._withheld(trace, "duplicate_request", self._wait_budget(body, timeout))
        if dup is None or dup.status is None:
            if op.repeat is Repeat.IDEMPOTENT:
                return
            raise Indeterminate(f"{reply.exchange.summary()}: delivered twice, the second answer is unknown")
        dup_body = _parse(dup.body)
        if op.repeat is Repeat.POLL:
            got = leased(dup_body) if dup.status == 200 else None
            if got is not None and got != leased(reply.body):
                raise Indeterminate(
                    f"{reply.exchange.summary()}: delivered twice, and the second delivery leased {got}"
                )
            return
        violation = judge_repeat(op, reply.status, reply.body, dup.status, dup_body)
        if violation is not None:
            raise CheckFailure(
                violation.message,
                expected=violation.expected,
                received=f"{dup.status} {dup_body.get('reason', '') if isinstance(dup_body, dict) else ''}".strip(),
                exchanges=[reply.exchange, self._withheld_exchange(reply.exchange, dup)],
                requirement=violation.requirement,
            )
        if changes_state(op, reply.status, dup.status):
            raise Indeterminate(
                f"{reply.exchange.summary()}: delivered twice, and the second delivery was accepted", copies=2
            )

    def _withheld_exchange(self, sent: Exchange, answer: Withheld) -> Exchange:
        """The answer the proxy kept from the client, as an exchange a report can show."""
        return Exchange(
            method=sent.method,
            url=sent.url,
            request_headers=sent.request_headers,
            request_body=sent.request_body,
            status=answer.status,
            response_headers=dict(answer.headers),
            response_body=_parse(answer.body)
            if _parse(answer.body) is not None
            else answer.body[:4000].decode("utf-8", "replace"),
            started_at=sent.started_at,
            error=f"answer withheld from the client by the fault proxy ({answer.fault})",
        )

    async def raw(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes = b"",
        *,
        timeout: float | None = None,
    ) -> Reply:
        """Send bytes exactly as given (header values with surrounding whitespace, odd framing), which
        httpx refuses to produce; the answer is parsed with h11 and recorded like any other exchange."""

        url = self.base_url + path
        trace = secrets.token_hex(8)
        if self.faults is not None:
            headers = [*headers, (TRACE_HEADER, trace)]
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)
        lines = [
            f"{method} {parsed.raw_path.decode()} HTTP/1.1",
            f"Host: {host}:{port}",
            "Connection: close",
            f"Content-Length: {len(body)}",
        ]
        lines += [f"{k}:{v}" if v[:1] in (" ", "\t") else f"{k}: {v}" for k, v in headers]
        exchange = Exchange(
            method=method,
            url=url,
            request_headers={k: (REDACTED if k.lower() == "authorization" else v) for k, v in headers},
            request_body=self._redact(body.decode("utf-8", "replace")) if body else None,
            started_at=time.time(),
        )
        self.exchanges.append(exchange)
        t0 = time.monotonic()
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        try:
            status, resp_headers, data = await _send_raw(host, port, payload, timeout or self.timeout)
        except (OSError, TimeoutError, h11.ProtocolError) as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"{type(exc).__name__}: {exc}"
            if self.faults is not None and not isinstance(exc, TimeoutError | ConnectionRefusedError):
                raise Indeterminate(f"{method} {url}: {exchange.error} (the answer was lost; maybe applied)") from exc
            raise HarnessError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        self.last_answer = time.monotonic()
        exchange.elapsed = self.last_answer - t0
        text = data.decode("utf-8", "replace")
        try:
            parsed_body: Any = json.loads(text)
        except ValueError:
            parsed_body = None
        exchange.status = status
        exchange.response_headers = dict(resp_headers)
        exchange.response_body = parsed_body if parsed_body is not None else text[:4000]
        if self.validator is not None:
            exchange.schema_errors = self.validator(method, path, status, parsed_body)
        reply = Reply(status=status, headers=resp_headers, body=parsed_body, text=text, exchange=exchange)
        if self.faults is not None:
            await self._judge_duplicate(classify(method, path), trace, reply, timeout)
        return reply

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


def direct_http(url: str) -> bool:
    """Whether ``url`` is a plain ``http://`` target that no proxy of the environment (``HTTP_PROXY``,
    ``ALL_PROXY``; ``NO_PROXY`` honoured) stands in front of: one :class:`Http11Transport` reaches; elsewhere
    httpx's own transports, with the environment's proxies and TLS settings, must."""
    parsed = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxied = bool(proxies.get("http") or proxies.get("all")) and not urllib.request.proxy_bypass(parsed.hostname or "")
    return parsed.scheme == "http" and not proxied


def resendable_poll(op: Operation, body: Any) -> Any:
    """A poll body with a ``poll_request_id`` (a fresh one when it has none, as the official SDK always sends
    one), so that a poll whose answer was lost can be sent again (§7.3); any other body unchanged."""
    if (
        op.repeat is Repeat.POLL
        and isinstance(body, dict)
        and "poll_request_id" not in body
        and isinstance(body.get("worker_id"), str)
        and isinstance(body.get("task_queue"), str)
    ):
        return {**body, "poll_request_id": "dw-retry-" + secrets.token_hex(8)}
    return body


def _parse(data: bytes) -> Any:
    """The JSON a body holds, or ``None`` (robustness checks send bodies nested thousands deep, or not JSON)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


async def _send_raw(host: str, port: int, payload: bytes, timeout: float) -> tuple[int, httpx.Headers, bytes]:
    """Write ``payload`` on a fresh connection and read one HTTP/1.1 response with h11: status, headers, body.
    The connection is closed on every path, including one the answer never came on."""

    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))  # move h11 to SEND_BODY state
    conn.send(h11.EndOfMessage())
    writer: asyncio.StreamWriter | None = None
    try:
        reader, opened = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer = opened
        opened.write(payload)
        await opened.drain()
        status, headers, chunks = 0, httpx.Headers(), []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), timeout))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = httpx.Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers])
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if status == 0:
            raise ConnectionResetError("the connection closed without a response")
        return status, headers, b"".join(chunks)
    finally:
        if writer is not None:
            writer.close()
