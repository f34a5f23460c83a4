"""The suite client's HTTP/1.1 transport (:class:`suite.client.Http11Transport`) against scripted peers.

Each peer is a loopback socket server that answers exactly as scripted — keep-alive, a close after the answer,
a body cut short, a reset, silence — so each test names the wire event and the httpx error the suite's fault
handling relies on (``suite.client.LOST_ANSWER``: the answer was lost; anything else is the harness's).
"""

from __future__ import annotations

import asyncio
import importlib.abc
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

import httpx
import pytest

from suite.client import LOST_ANSWER, Http11Transport, ProtocolClient, direct_http

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    return head + (await reader.readexactly(length) if length else b"")


@asynccontextmanager
async def peer(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script`` on each connection; yields its URL and its connections so far (each one's
    number, negated once the server closed it)."""
    connections: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections) + 1)
        n = len(connections)
        try:
            await script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            connections[n - 1] = -n

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()
        await server.wait_closed()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await _read_request(reader)
        writer.write(OK)
        await writer.drain()


async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(OK)  # no Connection: close, yet the connection ends
    await writer.drain()


async def _get(client: Any, url: str, **kw: Any) -> httpx.Response:
    return await client.get(url + "/api/health", **kw)


def clients() -> list[Any]:
    return [
        pytest.param(lambda: httpx.AsyncClient(transport=Http11Transport()), id="asyncio"),
    ]


def run(coro: Awaitable[None]) -> None:
    async def main() -> None:
        await coro

    asyncio.run(main())


@pytest.mark.parametrize("make", clients())
def test_requests_share_one_keep_alive_connection(make: Callable[[], Any]) -> None:
    async def go() -> None:
        async with peer(keep_alive) as (url, connections):
            async with make() as client:
                for _ in range(5):
                    response = await _get(client, url)
                    assert response.status_code == 200
                    assert response.json() == {"ok": True}
            assert len(connections) == 1

    run(go())


@pytest.mark.parametrize("make", clients())
def test_a_connection_the_server_closed_while_idle_is_not_reused(make: Callable[[], Any]) -> None:
    async def go() -> None:
        async with peer(one_answer_then_close) as (url, connections):
            async with make() as client:
                for n in range(1, 4):
                    assert (await _get(client, url)).status_code == 200
                    async with asyncio.timeout(10):
                        while len(connections) < n or connections[-1] > 0:  # until the server closed it
                            await asyncio.sleep(0.001)
                    for _ in range(2):  # and the client's event loop (if any) took the end of stream in
                        await asyncio.sleep(0)
            assert len(connections) == 3

    run(go())


def test_concurrent_requests_open_their_own_connections_and_all_are_answered() -> None:
    async def go() -> None:
        async with peer(keep_alive) as (url, connections):
            async with httpx.AsyncClient(transport=Http11Transport()) as client:
                answers = await asyncio.gather(*(_get(client, url) for _ in range(8)))
            assert [a.status_code for a in answers] == [200] * 8
            assert 1 <= len(connections) <= 8

    run(go())


@pytest.mark.parametrize(
    ("script", "error"),
    [
        pytest.param(lambda r, w: _read_request(r), httpx.RemoteProtocolError, id="closed-before-answering"),
        pytest.param(lambda r, w: _answer(r, w, OK[:-4]), httpx.RemoteProtocolError, id="body-cut-short"),
        pytest.param(lambda r, w: _reset(r, w), (httpx.ReadError, httpx.RemoteProtocolError), id="reset"),
    ],
)
@pytest.mark.parametrize("make", clients())
def test_an_answer_lost_on_the_wire_is_an_error_the_fault_handling_knows(
    script: Script, error: Any, make: Callable[[], Any]
) -> None:
    async def go() -> None:
        async with peer(script) as (url, _):
            async with make() as client:
                with pytest.raises(error) as raised:
                    await _get(client, url)
            assert isinstance(raised.value, LOST_ANSWER)

    run(go())


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
    await _read_request(reader)
    writer.write(data)
    await writer.drain()


async def _reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
    writer.transport.abort()


@pytest.mark.parametrize("make", clients())
def test_silence_is_a_read_timeout_not_a_lost_answer(make: Callable[[], Any]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # until the client gives up

    async def go() -> None:
        async with peer(silent) as (url, _):
            async with make() as client:
                with pytest.raises(httpx.ReadTimeout) as raised:
                    await _get(client, url, timeout=0.2)
            assert not isinstance(raised.value, LOST_ANSWER)

    run(go())


@pytest.mark.parametrize("make", clients())
def test_a_refused_connection_is_a_connect_error(make: Callable[[], Any]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused

        async def go() -> None:
            async with make() as client:
                with pytest.raises(httpx.ConnectError):
                    await _get(client, f"http://127.0.0.1:{port}")

        run(go())


def _on_the_wire(ours: bool) -> Any:
    """What the suite's client (or, ``ours=False``, httpx's own) puts on the wire for two requests: the request
    lines, the header lines (names lower-cased, sorted) and the bodies."""
    seen: list[bytes] = []
    cookie = b'HTTP/1.1 200 OK\r\nSet-Cookie: lb=node-2; Path=/\r\nContent-Length: 11\r\n\r\n{"ok":true}'

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await _read_request(reader))
            writer.write(cookie)
            await writer.drain()

    async def go() -> None:
        headers = {"X-Namespace": "default", "Accept": "application/json", "Authorization": "Bearer t"}
        async with peer(record) as (url, _):
            if not ours:
                async with httpx.AsyncClient() as plain:
                    for _ in range(2):
                        await plain.post(url + "/api/worker/register", headers=headers, content=b'{"a":1}')
            else:
                async with ProtocolClient(url) as client:
                    for _ in range(2):
                        await client.request("POST", "/api/worker/register", headers=headers, content=b'{"a":1}')

    run(go())
    out = []
    for raw in seen:
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        fields = sorted((n.lower(), v.strip()) for n, _, v in (line.partition(":") for line in lines[1:]))
        out.append((lines[0], [f for f in fields if f[0] != "host"], body))
    return out


def test_a_request_goes_out_exactly_as_httpx_own_client_sends_it() -> None:
    """The same request line, headers (httpx's defaults under the caller's, the cookie the answer set) and body."""
    ours, theirs = _on_the_wire(True), _on_the_wire(False)
    assert ours == theirs
    assert ("cookie", "lb=node-2") in ours[1][1]
    assert ("accept", "application/json") in ours[0][1]


def test_a_proxy_of_the_environment_keeps_httpx_own_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    assert direct_http("http://127.0.0.1:8080")
    assert not direct_http("https://example.test")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert not direct_http("http://127.0.0.1:8080")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert direct_http("http://127.0.0.1:8080")


class _Lookups(importlib.abc.MetaPathFinder):
    """A finder that finds nothing and records what was looked for: an import of a module not yet loaded."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        self.names.append(fullname)


@pytest.mark.parametrize(
    "make",
    [
        *clients(),
        # httpx's own transport: an https target's, a proxied target's (above), the benchmark's client.
        pytest.param(httpx.AsyncClient, id="httpx-own-transport"),
    ],
)
def test_a_request_imports_nothing(make: Callable[[], Any]) -> None:
    """httpcore imports ``sniffio`` in every request to tell asyncio from trio; anyio no longer brings it in,
    and an import that fails is looked for along the whole of ``sys.path`` again each time (four times a
    request; what that cost is in bench/RESULTS.md). The suite depends on ``sniffio`` so that the import is
    found once."""
    lookups = _Lookups()

    async def go() -> None:
        async with peer(keep_alive) as (url, _), make() as client:
            await _get(client, url)  # the first request may import what it needs, once
            sys.meta_path.insert(0, lookups)
            try:
                for _ in range(5):
                    assert (await _get(client, url)).status_code == 200
            finally:
                sys.meta_path.remove(lookups)

    run(go())
    assert lookups.names == []
