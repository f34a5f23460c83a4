"""The HTTP/1.1 shell over real sockets: framing, limits, errors, cancellation and shutdown.

Raw ``asyncio`` streams drive the framing cases (the test parses responses itself rather than trusting
h11 on both sides); httpx drives the ordinary ones. Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx
import pytest

from reference_server.http import (
    Handler,
    HttpServer,
    Request,
    Response,
    ShellError,
    default_error_responder,
    json_response,
)
from tests.server.harness import run_async, scenario, until, within


@dataclass
class App:
    """A small handler with hooks the tests observe."""

    calls: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    slow_cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, request: Request) -> Response:
        self.calls.append(request.path)
        self.queries.append(request.raw_query)
        if request.path == "/boom":
            raise RuntimeError("boom")
        if request.path in ("/later", "/boom-later"):
            # Not answered in the handler's first step: it goes on in a task of its own, which lets the loop run
            # once (a bare yield) and then waits on a future the loop resolves.
            await asyncio.sleep(0)
            resolved = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(resolved.set_result, None)
            await resolved
            if request.path == "/boom-later":
                raise RuntimeError("boom later")
        if request.path == "/not-a-response":
            return "surprise"  # type: ignore[return-value]
        if request.path == "/bad-header-value":
            return Response(200, b"{}", [("X-Split", "one\r\nX-Injected: two")])
        if request.path == "/bad-header-name":
            return Response(200, b"{}", [("Bad Name", "value")])
        if request.path == "/slow":
            self.slow_started.set()
            try:
                await asyncio.Event().wait()  # a long poll that never gets an answer
            except asyncio.CancelledError:
                self.slow_cancelled.set()
                raise
        if request.path == "/empty":
            return Response(204, b"ignored", [("X-Kind", "empty")])
        return json_response(
            200,
            {
                "method": request.method,
                "path": request.path,
                "raw_path": request.raw_path,
                "query": dict(request.query),
                "query_multi": {name: list(values) for name, values in request.query_multi.items()},
                "headers": dict(request.headers),
                "body": request.body.decode("utf-8"),
                "client": request.client,
                "connection_id": request.connection_id,
            },
        )


@contextlib.asynccontextmanager
async def serving(app: Handler, **options: Any) -> AsyncIterator[HttpServer]:
    async with HttpServer(app, **options) as server:
        await server.start("127.0.0.1", 0)
        yield server


@contextlib.asynccontextmanager
async def connect(server: HttpServer) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await within(asyncio.open_connection(server.host, server.port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await within(writer.wait_closed())


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, *, head_request: bool = False) -> RawResponse:
    head = await within(reader.readuntil(b"\r\n\r\n"))
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    code = int(status)
    has_body = code >= 200 and code not in (204, 304) and not head_request
    length = int(headers["content-length"]) if has_body else 0
    return RawResponse(code, headers, await within(reader.readexactly(length)))


async def read_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything left until the server closes."""
    return await within(reader.read())


async def answer_then_close(request: bytes, app: Handler | None = None, **options: Any) -> RawResponse:
    """The answer to ``request`` sent on a fresh connection to a fresh server, which must then close the
    connection without another byte."""
    async with serving(app or App(), **options) as server, connect(server) as (reader, writer):
        writer.write(request)
        response = await read_response(reader)
        assert await read_eof(reader) == b""
    return response


def get(path: str, *extra: str, version: str = "HTTP/1.1") -> bytes:
    return "\r\n".join([f"GET {path} {version}", "Host: test", *extra, "", ""]).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = "\r\n".join([f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *extra, "", ""])
    return head.encode() + body


# ------------------------------------------------------------------------------------------ in process


def test_request_from_target_parses_like_the_shell() -> None:
    request = Request.from_target(
        "get",
        "/a%20b/%E2%9C%93%2Fx?k=1&k=2&s=x%20y+z&e=&u=%C3%A9",
        headers=[("X-Tag", "a"), ("x-tag", "b"), ("Content-Type", "text/plain")],
        body=b"hi",
    )
    assert request.method == "GET"
    assert request.path == "/a b/✓/x"
    assert request.raw_path == "/a%20b/%E2%9C%93%2Fx"
    assert request.query == {"k": "1", "s": "x y z", "e": "", "u": "é"}
    assert request.query_multi["k"] == ("1", "2")
    assert request.headers == {"x-tag": "a, b", "content-type": "text/plain"}
    assert request.header("X-TAG") == "a, b"
    assert request.header("missing") is None
    assert request.body == b"hi"


def test_request_from_target_rejects_invalid_utf8() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        Request.from_target("GET", "/%FF")
    with pytest.raises(ValueError, match="UTF-8"):
        Request.from_target("GET", "/ok?q=%FF")


def test_json_response_is_compact_utf8() -> None:
    response = json_response(201, {"a": [1, 2], "s": "✓"}, headers=[("X-Extra", "1")])
    assert response.status == 201
    assert response.body == '{"a":[1,2],"s":"✓"}'.encode()
    assert response.header("content-type") == "application/json"
    assert response.header("x-extra") == "1"
    assert response.json() == {"a": [1, 2], "s": "✓"}


def test_default_error_responder_shape() -> None:
    response = default_error_responder(ShellError(status=413, reason="payload_too_large", message="too big"))
    assert response.status == 413
    assert response.json() == {"reason": "payload_too_large", "message": "too big", "error": "too big"}


# ------------------------------------------------------------------------------------ ordinary requests


@scenario
async def test_get_and_post_json_echo_with_httpx() -> None:
    async with serving(App()) as server, httpx.AsyncClient(base_url=server.url) as client:
        got = await within(client.get("/echo", headers={"X-Tag": "t"}))
        assert got.status_code == 200
        assert got.headers["content-type"] == "application/json"
        assert got.headers["server"] == "dw-reference-server"
        assert int(got.headers["content-length"]) == len(got.content)
        assert got.json()["method"] == "GET"
        assert got.json()["headers"]["x-tag"] == "t"

        posted = await within(client.post("/echo", json={"hello": "wörld"}))
        assert posted.status_code == 200
        assert json.loads(posted.json()["body"]) == {"hello": "wörld"}
        assert posted.json()["method"] == "POST"


@scenario
async def test_port_zero_gives_a_real_port() -> None:
    async with serving(App()) as server:
        assert server.port > 0
        assert server.host == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient() as client:
            assert (await within(client.get(f"{server.url}/echo"))).status_code == 200


def test_not_started_server_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="start"):
        _ = HttpServer(App()).port


@scenario
async def test_query_string_percent_encoding_and_repeated_keys() -> None:
    async with serving(App()) as server, httpx.AsyncClient(base_url=server.url) as client:
        got = await within(client.get("/echo/%E2%9C%93%2Fx?a=1&a=2&b=%E2%9C%93&c=x%20y+z&empty="))
        body = got.json()
        assert body["path"] == "/echo/✓/x"
        assert body["raw_path"] == "/echo/%E2%9C%93%2Fx"
        assert body["query"] == {"a": "1", "b": "✓", "c": "x y z", "empty": ""}
        assert body["query_multi"] == {"a": ["1", "2"], "b": ["✓"], "c": ["x y z"], "empty": [""]}


@scenario
async def test_invalid_percent_encoding_is_400() -> None:
    response = await answer_then_close(get("/%FF"))
    assert (response.status, response.json()["reason"]) == (400, "bad_request")


# --------------------------------------------------------------------------------------------- framing


@scenario
async def test_keep_alive_serves_three_requests_on_one_connection() -> None:
    app = App()
    async with serving(app) as server, connect(server) as (reader, writer):
        clients = set()
        for index in range(3):
            writer.write(get(f"/echo?n={index}"))
            response = await read_response(reader)
            assert response.status == 200
            assert response.json()["query"] == {"n": str(index)}
            assert "connection" not in response.headers
            clients.add(response.json()["client"])
        assert len(clients) == 1
        assert app.calls == ["/echo"] * 3


@scenario
async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(get("/echo?n=1") + post("/echo?n=2", b"second") + get("/echo?n=3"))
        first, second, third = [await read_response(reader) for _ in range(3)]
        assert [r.json()["query"]["n"] for r in (first, second, third)] == ["1", "2", "3"]
        assert second.json()["body"] == "second"


@scenario
async def test_chunked_request_body() -> None:
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n7\r\n, wor\xc3\xb6\r\n2\r\nld\r\n0\r\n\r\n"
        )
        response = await read_response(reader)
        assert response.status == 200
        assert response.json()["body"] == "hello, woröld"
        writer.write(get("/echo"))  # the connection is still usable
        assert (await read_response(reader)).status == 200


@scenario
async def test_http_10_client_gets_content_length_and_close() -> None:
    response = await answer_then_close(b"GET /echo HTTP/1.0\r\n\r\n")
    assert response.status == 200
    assert int(response.headers["content-length"]) == len(response.body)
    assert response.headers["connection"] == "close"


@scenario
async def test_connection_close_is_honoured() -> None:
    response = await answer_then_close(get("/echo", "Connection: close"))
    assert response.status == 200
    assert response.headers["connection"] == "close"


@scenario
async def test_head_has_content_length_but_no_body() -> None:
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(get("/echo").replace(b"GET", b"HEAD", 1))
        response = await read_response(reader, head_request=True)
        assert response.status == 200
        assert int(response.headers["content-length"]) > 0
        writer.write(get("/echo?after=head"))  # a stray body would corrupt this response
        assert (await read_response(reader)).json()["query"] == {"after": "head"}


@scenario
async def test_204_has_no_body_and_no_content_length() -> None:
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(get("/empty") + get("/echo?after=204"))
        empty = await read_response(reader)
        assert empty.status == 204
        assert "content-length" not in empty.headers
        assert empty.headers["x-kind"] == "empty"
        assert (await read_response(reader)).json()["query"] == {"after": "204"}


@scenario
async def test_expect_100_continue() -> None:
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = await read_response(reader)
        assert interim.status == 100
        writer.write(b"hello")
        response = await read_response(reader)
        assert response.status == 200
        assert response.json()["body"] == "hello"


# ------------------------------------------------------------------------------------- limits and errors


@scenario
async def test_413_on_big_content_length_without_reading_the_body() -> None:
    app = App()
    # No body is ever sent: the answer must come from the head alone, before 100 Continue.
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
    response = await answer_then_close(head, app, max_body_bytes=1024)
    assert (response.status, response.json()["reason"]) == (413, "payload_too_large")
    assert response.headers["connection"] == "close"
    assert app.calls == []


@scenario
async def test_413_on_too_long_chunked_body() -> None:
    app = App()
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"".join(b"200\r\n" + b"x" * 512 + b"\r\n" for _ in range(8)) + b"0\r\n\r\n"
    response = await answer_then_close(head + chunks, app, max_body_bytes=1024)
    assert (response.status, response.json()["reason"]) == (413, "payload_too_large")
    assert app.calls == []


@scenario
async def test_431_on_huge_header() -> None:
    response = await answer_then_close(get("/echo", "X-Huge: " + "a" * (32 * 1024)))
    assert (response.status, response.json()["reason"]) == (431, "headers_too_large")


@scenario
async def test_400_on_garbage_request_line() -> None:
    response = await answer_then_close(b"THIS IS NOT HTTP\r\n\r\n")
    body = response.json()
    assert (response.status, body["reason"]) == (400, "bad_request")
    assert body["error"] == body["message"]


def _handler_errors_logged(caplog: pytest.LogCaptureFixture, scenario: Coroutine[Any, Any, None]) -> list[str]:
    """Run ``scenario``; the messages of the handler exceptions the shell logged meanwhile."""
    with caplog.at_level(logging.ERROR, logger="reference_server.http"):
        run_async(scenario)
    failures = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    return [str(r.exc_info[1]) for r in failures if r.exc_info]


def test_handler_exception_is_500_and_serving_continues(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serving(App()) as server:
            async with connect(server) as (reader, writer):
                writer.write(get("/boom"))
                response = await read_response(reader)
                assert response.status == 500
                assert response.json()["reason"] == "internal_error"
                writer.write(get("/echo"))  # the request was read whole, so keep-alive survives
                assert (await read_response(reader)).status == 200
            async with connect(server) as (reader, writer):
                writer.write(get("/echo"))
                assert (await read_response(reader)).status == 200

    assert _handler_errors_logged(caplog, scenario()) == ["boom"]


def test_a_handler_that_awaits_answers_and_its_later_exception_is_500(caplog: pytest.LogCaptureFixture) -> None:
    """The shell runs a handler's first step at once and only then gives it a task: whatever follows an await
    is answered the same way — its result, or its exception as a 500 with keep-alive intact."""

    async def scenario() -> None:
        async with serving(App()) as server, connect(server) as (reader, writer):
            writer.write(get("/later?n=1"))
            response = await read_response(reader)
            assert (response.status, response.json()["query"]) == (200, {"n": "1"})
            writer.write(get("/boom-later"))
            response = await read_response(reader)
            assert (response.status, response.json()["reason"]) == (500, "internal_error")
            writer.write(get("/echo"))
            assert (await read_response(reader)).status == 200

    assert _handler_errors_logged(caplog, scenario()) == ["boom later"]


def test_handler_returning_a_non_response_is_500(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serving(App()) as server, connect(server) as (reader, writer):
            writer.write(get("/not-a-response"))
            assert (await read_response(reader)).status == 500

    with caplog.at_level(logging.ERROR, logger="reference_server.http"):
        run_async(scenario())
    assert any("unusable response" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("path", ["/bad-header-value", "/bad-header-name"])
def test_a_response_with_an_illegal_header_is_500_and_nothing_of_it_is_sent(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The shell frames responses itself: a header that would split the response (or is no token) is refused
    before any byte is written, and the connection goes on."""

    async def scenario() -> None:
        async with serving(App()) as server, connect(server) as (reader, writer):
            writer.write(get(path))
            refused = await read_response(reader)
            assert refused.status == 500
            assert "x-injected" not in refused.headers
            assert "bad name" not in refused.headers
            writer.write(get("/echo?after=refused"))
            assert (await read_response(reader)).json()["query"] == {"after": "refused"}

    with caplog.at_level(logging.ERROR, logger="reference_server.http"):
        run_async(scenario())
    assert any("unusable response" in r.getMessage() for r in caplog.records)


@scenario
async def test_pipelined_answers_parse_with_a_strict_http_client() -> None:
    """Every kind of answer, read back to back by h11 as a client: framed exactly (no stray or missing byte),
    and the last one, to ``Connection: close``, ends the connection."""
    requests = [
        get("/echo?n=1"),
        get("/echo?n=2").replace(b"GET", b"HEAD", 1),
        get("/empty"),
        post("/echo?n=4", b"four"),
        get("/not-a-response"),
        get("/echo?n=6", "Connection: close"),
    ]
    async with serving(App()) as server, connect(server) as (reader, writer):
        writer.write(b"".join(requests))
        client = h11.Connection(h11.CLIENT)
        answers: list[tuple[int, bytes]] = []
        for request in requests:
            client.send(h11.Request(method=request.split(b" ", 1)[0], target="/", headers=[("Host", "test")]))
            client.send(h11.EndOfMessage())
            status, body = 0, b""
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await within(reader.read(65536)))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            answers.append((status, body))
            if client.our_state is h11.DONE and client.their_state is h11.DONE:
                client.start_next_cycle()
        assert [status for status, _ in answers] == [200, 200, 204, 200, 500, 200]
        assert json.loads(answers[3][1])["body"] == "four"
        assert answers[1][1] == b""  # HEAD: the length of a GET's body, none of its bytes
        assert client.their_state is h11.MUST_CLOSE
        assert await read_eof(reader) == b""


def test_error_responder_renders_shell_errors() -> None:
    seen: list[ShellError] = []

    def enveloped(error: ShellError) -> Response:
        seen.append(error)
        return json_response(
            error.status,
            {"protocol_version": "1.20", "error": {"reason": error.reason}},
            headers=[("X-Envelope", "yes")],
        )

    async def scenario() -> None:
        async with serving(App(), error_responder=enveloped) as server:
            async with connect(server) as (reader, writer):
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                bad = await read_response(reader)
            async with connect(server) as (reader, writer):
                writer.write(get("/boom", "X-Trace: 7"))
                boom = await read_response(reader)
        assert bad.status == 400
        assert bad.headers["x-envelope"] == "yes"
        assert bad.json() == {"protocol_version": "1.20", "error": {"reason": "bad_request"}}
        assert boom.status == 500
        assert boom.json()["error"] == {"reason": "internal_error"}

    logging.getLogger("reference_server.http").disabled = True
    try:
        run_async(scenario())
    finally:
        logging.getLogger("reference_server.http").disabled = False
    assert [(e.reason, e.method, e.path) for e in seen] == [
        ("bad_request", None, None),
        ("internal_error", "GET", "/boom"),
    ]
    assert seen[1].headers["x-trace"] == "7"


def test_broken_error_responder_falls_back_to_default(caplog: pytest.LogCaptureFixture) -> None:
    def broken(error: ShellError) -> Response:
        raise ValueError("no envelope today")

    async def scenario() -> None:
        async with serving(App(), error_responder=broken) as server, connect(server) as (reader, writer):
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            response = await read_response(reader)
            assert response.status == 400
            assert response.json()["reason"] == "bad_request"

    with caplog.at_level(logging.ERROR, logger="reference_server.http"):
        run_async(scenario())
    assert any("error responder failed" in r.getMessage() for r in caplog.records)


@scenario
async def test_connect_is_501() -> None:
    response = await answer_then_close(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert (response.status, response.json()["reason"]) == (501, "not_implemented")


# ------------------------------------------------------------------------------------------- timeouts


@scenario
async def test_partial_head_times_out_with_408() -> None:
    response = await answer_then_close(b"GET /echo HTTP/1.1\r\nHost: test\r\n", read_timeout=0.2)  # never finished
    assert (response.status, response.json()["reason"]) == (408, "request_timeout")


@scenario
async def test_partial_body_times_out_with_408() -> None:
    response = await answer_then_close(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\nabc", read_timeout=0.2
    )
    assert response.status == 408


@scenario
async def test_idle_keep_alive_connection_is_closed_silently() -> None:
    async with serving(App(), idle_timeout=0.2) as server, connect(server) as (reader, writer):
        writer.write(get("/echo"))
        assert (await read_response(reader)).status == 200
        assert await read_eof(reader) == b""


# ----------------------------------------------------------------------------- cancellation and shutdown


@scenario
async def test_client_disconnect_cancels_slow_handler() -> None:
    app = App()
    async with serving(app) as server:
        async with connect(server) as (_reader, writer):
            writer.write(get("/slow"))
            await within(app.slow_started.wait())
        await within(app.slow_cancelled.wait())
        # The server is unharmed.
        async with connect(server) as (reader, writer):
            writer.write(get("/echo"))
            assert (await read_response(reader)).status == 200


@scenario
async def test_pipelined_bytes_during_a_handler_are_not_a_disconnect() -> None:
    app = App()
    gate = asyncio.Event()

    async def gated(request: Request) -> Response:
        if request.path == "/gated":
            app.slow_started.set()
            try:
                await gate.wait()
            except asyncio.CancelledError:
                app.slow_cancelled.set()
                raise
        return await app(request)

    async with serving(gated) as server, connect(server) as (reader, writer):
        writer.write(get("/gated"))
        await within(app.slow_started.wait())
        writer.write(get("/echo?n=next"))  # arrives while the handler is still running
        await writer.drain()
        # A full exchange on another connection: by its end the server has long read the bytes
        # above, so the watcher has seen them while the handler still runs.
        async with connect(server) as (other_reader, other_writer):
            other_writer.write(get("/echo?n=other"))
            assert (await read_response(other_reader)).status == 200
        gate.set()
        first, second = await read_response(reader), await read_response(reader)
        assert first.json()["path"] == "/gated"
        assert second.json()["query"] == {"n": "next"}
    assert not app.slow_cancelled.is_set()


@scenario
async def test_close_with_idle_keep_alive_connection_returns_promptly() -> None:
    app = App()
    server = HttpServer(app)  # default idle timeout: 75 s, far beyond the test deadline
    await server.start("127.0.0.1", 0)
    try:
        async with connect(server) as (reader, writer):
            writer.write(get("/echo"))
            assert (await read_response(reader)).status == 200
            await within(server.close())
            assert await read_eof(reader) == b""
    finally:
        await within(server.close())


@scenario
async def test_close_cancels_in_flight_handler_after_grace() -> None:
    app = App()
    server = HttpServer(app, shutdown_grace=0.1)
    await server.start("127.0.0.1", 0)
    async with connect(server) as (reader, writer):
        writer.write(get("/slow"))
        await within(app.slow_started.wait())
        await within(server.close())
        assert app.slow_cancelled.is_set()
        assert await read_eof(reader) == b""


@scenario
async def test_close_lets_a_finishing_request_answer_with_connection_close() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        await gate.wait()
        return json_response(200, {"ok": True})

    server = HttpServer(handler)
    await server.start("127.0.0.1", 0)
    async with connect(server) as (reader, writer):
        writer.write(get("/"))
        await within(started.wait())
        closing = asyncio.create_task(server.close())
        gate.set()
        response = await read_response(reader)
        assert response.status == 200
        assert response.headers["connection"] == "close"
        assert await read_eof(reader) == b""
    await within(closing)


@scenario
async def test_max_concurrent_connections_queues_new_connections() -> None:
    app = App()
    async with (
        serving(app, max_concurrent_connections=1) as server,
        connect(server) as (first_reader, first_writer),
    ):
        first_writer.write(get("/echo?c=first-1"))
        assert (await read_response(first_reader)).status == 200
        async with connect(server) as (second_reader, second_writer):
            second_writer.write(get("/echo?c=second"))
            await second_writer.drain()
            # The first connection still holds the only slot, so it is served first.
            first_writer.write(get("/echo?c=first-2"))
            assert (await read_response(first_reader)).status == 200
            first_writer.close()
            await within(first_writer.wait_closed())
            assert (await read_response(second_reader)).json()["query"] == {"c": "second"}
    assert app.queries == ["c=first-1", "c=first-2", "c=second"]


# ----------------------------------------------------------------------------------------- connection ids


@scenario
async def test_requests_carry_their_connection_id_and_the_close_callback_gets_it_once() -> None:
    closed: list[int] = []
    async with serving(App(), on_connection_closed=closed.append) as server:
        async with connect(server) as (reader, writer):
            ids = []
            for _ in range(2):
                writer.write(get("/echo"))
                ids.append((await read_response(reader)).json()["connection_id"])
            first = ids[0]
            assert ids == [first, first]  # keep-alive: one connection, one id
            assert first >= 1
            async with connect(server) as (other_reader, other_writer):
                other_writer.write(get("/echo"))
                second = (await read_response(other_reader)).json()["connection_id"]
                assert second not in (0, first)
                assert server.open_connections == 2
                assert closed == []  # nothing ended yet
            # The client closed the second connection: the server reads end-of-stream, then calls back.
            await within(until(lambda: closed == [second]))
            assert server.open_connections == 1
        await within(until(lambda: closed == [second, first]))
        assert server.open_connections == 0
        # A connection the server itself closes (Connection: close) is reported too.
        async with connect(server) as (reader, writer):
            writer.write(get("/echo", "Connection: close"))
            third = (await read_response(reader)).json()["connection_id"]
            assert await read_eof(reader) == b""
            await within(until(lambda: closed == [second, first, third]))
    assert len({first, second, third}) == 3
    assert Request.from_target("GET", "/").connection_id == 0  # built in process: no connection


def test_a_failing_close_callback_is_logged_and_serving_continues(caplog: pytest.LogCaptureFixture) -> None:
    def explode(connection_id: int) -> None:
        raise RuntimeError(f"callback for {connection_id} failed")

    async def scenario() -> None:
        async with serving(App(), on_connection_closed=explode) as server:
            for _ in range(2):
                async with connect(server) as (reader, writer):
                    writer.write(get("/echo", "Connection: close"))
                    assert (await read_response(reader)).status == 200
                    assert await read_eof(reader) == b""

    with caplog.at_level(logging.ERROR, logger="reference_server.http"):
        run_async(scenario())
    failures = [r for r in caplog.records if "connection-closed callback failed" in r.getMessage()]
    assert len(failures) == 2
