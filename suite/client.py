"""The suite's HTTP client: every request is recorded as an :class:`Exchange`.

Checks talk to the target only through :class:`ProtocolClient`. It adds the right headers per plane,
records every exchange (with tokens redacted), validates every response against ``schemas/`` through a
pluggable validator, and turns transport problems into :class:`~suite.outcomes.HarnessError` — a
network timeout is the harness's error verdict, never the target's failure.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from suite.protocol.versions import ADVERTISED_VERSION, CONTROL_PLANE_VERSION

from .outcomes import HarnessError

__all__ = ["CONTROL_HEADER", "WORKER_HEADER", "Exchange", "ProtocolClient", "Reply"]

WORKER_HEADER = "X-Durable-Workflow-Protocol-Version"
CONTROL_HEADER = "X-Durable-Workflow-Control-Plane-Version"
REDACTED = "<redacted>"


@dataclass
class Exchange:
    """One request and what came back (or why nothing did)."""

    method: str
    url: str
    request_headers: dict[str, str]
    request_body: str | None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: Any = None
    started_at: float = 0.0
    elapsed: float = 0.0
    error: str | None = None
    schema_errors: list[str] = field(default_factory=list)

    def curl(self) -> str:
        """A ``curl`` line that repeats the request; tokens appear as shell variables, never in clear."""
        parts = ["curl", "-sS", "-X", self.method]
        for name, value in self.request_headers.items():
            if name.lower() in (
                "content-length",
                "host",
                "accept-encoding",
                "connection",
                "user-agent",
                "accept",
            ):
                continue
            if name.lower() == "authorization":
                parts += ["-H", "Authorization: Bearer $DW_TOKEN"]
                continue
            parts += ["-H", f"{name}: {value}"]
        if self.request_body is not None:
            parts += ["--data-binary", self.request_body]
        parts.append(self.url)
        return " ".join(shlex.quote(p) if not p.startswith("Authorization: Bearer $") else f'"{p}"' for p in parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "url": self.url,
            "request_headers": self.request_headers,
            "request_body": self.request_body,
            "status": self.status,
            "response_headers": self.response_headers,
            "response_body": self.response_body,
            "elapsed_seconds": round(self.elapsed, 4),
            "error": self.error,
            "schema_errors": self.schema_errors,
            "curl": self.curl(),
        }

    def summary(self) -> str:
        reason = self.response_body.get("reason") if isinstance(self.response_body, dict) else None
        got = self.error or f"{self.status}" + (f" {reason}" if reason else "")
        return f"{self.method} {self.url} -> {got}"


@dataclass
class Reply:
    """A response as a check sees it."""

    status: int
    headers: httpx.Headers
    body: Any  # parsed JSON, or None when the body is not JSON
    text: str
    exchange: Exchange

    def json(self) -> dict[str, Any]:
        """The body as an object; a non-object body is an empty dict (the check then fails on content)."""
        return self.body if isinstance(self.body, dict) else {}

    @property
    def reason(self) -> str | None:
        value = self.json().get("reason")
        return value if isinstance(value, str) else None


Validator = Callable[[str, str, int, Any], list[str]]


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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.worker_token = worker_token
        self.operator_token = operator_token
        self.namespace = namespace
        self.worker_version = worker_version
        self.timeout = timeout
        self.validator = validator
        self.exchanges: list[Exchange] = exchanges if exchanges is not None else []
        self._http = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64))
        self._secrets = {t for t in (worker_token, operator_token) if t}

    async def aclose(self) -> None:
        await self._http.aclose()

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
        if json_body is not None and content is None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            hdrs.setdefault("Content-Type", "application/json")
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
            resp = await self._http.request(
                method,
                url,
                headers=hdrs,
                content=content,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except httpx.TimeoutException as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"timeout after {exchange.elapsed:.1f}s ({type(exc).__name__})"
            raise HarnessError(f"{method} {url}: no response within {exchange.elapsed:.1f}s") from exc
        except httpx.HTTPError as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise HarnessError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        exchange.elapsed = time.monotonic() - t0
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
        import asyncio

        import h11

        url = self.base_url + path
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
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))  # move h11 to SEND_BODY state
        conn.send(h11.EndOfMessage())
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout or self.timeout)
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            status, resp_headers, chunks = 0, httpx.Headers(), []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), timeout or self.timeout)
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    resp_headers = httpx.Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers])
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            writer.close()
        except (OSError, TimeoutError, h11.ProtocolError) as exc:
            exchange.elapsed = time.monotonic() - t0
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise HarnessError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        exchange.elapsed = time.monotonic() - t0
        text = b"".join(chunks).decode("utf-8", "replace")
        try:
            parsed_body: Any = json.loads(text)
        except ValueError:
            parsed_body = None
        exchange.status = status
        exchange.response_headers = dict(resp_headers)
        exchange.response_body = parsed_body if parsed_body is not None else text[:4000]
        if self.validator is not None:
            exchange.schema_errors = self.validator(method, path, status, parsed_body)
        return Reply(status=status, headers=resp_headers, body=parsed_body, text=text, exchange=exchange)

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text
