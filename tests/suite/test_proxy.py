"""The fault-injecting proxy (``suite.proxy``): transparent when asked, and each fault does what it says.

Framing, seeding and reordering run against a tiny in-process echo upstream (h11 on loopback); the faults
whose point is "maybe applied" run against the reference server as a subprocess, and the proof that the
target applied a request comes through the proxy-free URL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite.client import ProtocolClient
from suite.outcomes import HarnessError
from suite.proxy import (
    FAULTS,
    STANDARD_FAULTS,
    FaultPlanner,
    FaultProxy,
    FaultSpec,
    ProxyThread,
    is_poll_route,
    parse_faults,
)
from tests.conftest import ServerProcess, run_suite

# -- a tiny upstream ---------------------------------------------------------------------------------------


@dataclass
class EchoUpstream:
    """Answers every request with its own body (``/chunked/...`` in chunked framing); records raw bytes."""

    received: bytearray = field(default_factory=bytearray)
    sent: bytearray = field(default_factory=bytearray)
    targets: list[str] = field(default_factory=list)
    connections: int = 0
    url: str = ""
    _server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        target, body = "", bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    self.received += data
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    target, body = event.target.decode(), bytearray()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self.targets.append(target)
                    self._write(writer, conn, target, bytes(body) or b'{"hello":"world"}')
                    await writer.drain()
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        break
                    conn.start_next_cycle()
                else:
                    break
        except (ConnectionError, h11.RemoteProtocolError):
            pass
        finally:
            writer.close()

    def _write(self, writer: asyncio.StreamWriter, conn: h11.Connection, target: str, body: bytes) -> None:
        chunked = target.startswith("/chunked")
        framing = ("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(len(body)))
        headers = [("Content-Type", "application/json"), ("X-Echo-Target", target), framing]
        out = conn.send(h11.Response(status_code=200, headers=headers)) or b""
        pieces = [body[i : i + 5] for i in range(0, len(body), 5)] if chunked else [body]
        for piece in pieces:
            out += conn.send(h11.Data(data=piece)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        self.sent += out
        writer.write(out)


def with_echo(
    faults: str, seed: int = 0
) -> Callable[[Callable[[EchoUpstream, FaultProxy], Awaitable[None]]], Callable[[], None]]:
    """Run the decorated coroutine with an echo upstream and a proxy in front of it."""

    def wrap(fn: Callable[[EchoUpstream, FaultProxy], Awaitable[None]]) -> Callable[[], None]:
        async def main() -> None:
            upstream = EchoUpstream()
            await upstream.start()
            try:
                async with FaultProxy(upstream.url, faults, seed=seed) as proxy:
                    await fn(upstream, proxy)
            finally:
                await upstream.close()

        return lambda: asyncio.run(main())

    return wrap


async def raw_exchange(url: str, data: bytes) -> bytes:
    """Send bytes on a fresh connection and read until the peer closes."""
    parsed = httpx.URL(url)
    assert parsed.port is not None
    reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
    writer.write(data)
    await writer.drain()
    got = await reader.read()
    writer.close()
    await writer.wait_closed()
    return got


# -- the spec and the planner (pure) ---------------------------------------------------------------------


def test_spec_parses_and_prints_back() -> None:
    spec = parse_faults("drop_response=0.05, duplicate_request=0.05,delay=0.1:500,reorder=0.2:50,truncate_body=0.02")
    assert spec.probability("drop_response") == 0.05
    assert spec.max_delay_ms == 500
    assert spec.reorder_window_ms == 50
    assert spec.probability("reset_long_poll") == 0
    assert parse_faults(str(spec)) == spec
    assert parse_faults("none") == FaultSpec()
    assert str(FaultSpec()) == "none"
    assert parse_faults("delay=0.1").max_delay_ms == 300
    standard = parse_faults("standard")
    assert standard == parse_faults(STANDARD_FAULTS)
    assert all(standard.probability(name) > 0 for name in FAULTS)  # every fault at once


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("drop=0.1", "unknown fault 'drop'"),
        ("drop_response", "write name=probability"),
        ("drop_response=1.5", "from 0 to 1"),
        ("drop_response=x", "must be numbers"),
        ("drop_response=0.1,drop_response=0.2", "given twice"),
        ("truncate_body=0.1:5", "takes no ':N' parameter"),
        ("latency=soon", "write latency=MS"),
        ("latency=-5", "not a non-negative number of milliseconds"),
    ],
)
def test_bad_spec_says_what_to_write(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_faults(spec)


probabilities = st.dictionaries(st.sampled_from(FAULTS), st.floats(0, 1))
paths = st.sampled_from(["/api/worker/workflow-tasks/poll", "/api/worker/register", "/api/health"])


@given(seed=st.integers(0, 2**32), probs=probabilities, targets=st.lists(paths, max_size=30))
def test_the_same_seed_plans_the_same_faults(seed: int, probs: dict[str, float], targets: list[str]) -> None:
    spec = FaultSpec(probs)
    first, second = FaultPlanner(spec, seed), FaultPlanner(spec, seed)
    assert [first.plan(t) for t in targets] == [second.plan(t) for t in targets]


@given(seed=st.integers(0, 2**32), targets=st.lists(paths, max_size=50))
def test_probability_zero_never_plans_a_fault(seed: int, targets: list[str]) -> None:
    planner = FaultPlanner(FaultSpec(dict.fromkeys(FAULTS, 0.0)), seed)
    assert not any(planner.plan(t).any for t in targets)


@given(seed=st.integers(0, 2**32), p=st.floats(0, 1), targets=st.lists(paths, max_size=30))
def test_a_zero_probability_fault_does_not_shift_the_others(seed: int, p: float, targets: list[str]) -> None:
    alone = FaultPlanner(FaultSpec({"drop_response": p}), seed)
    with_zero = FaultPlanner(FaultSpec({"drop_response": p, "truncate_body": 0.0, "delay": 0.0}), seed)
    assert [alone.plan(t) for t in targets] == [with_zero.plan(t) for t in targets]


def test_reset_long_poll_is_planned_only_for_poll_routes() -> None:
    planner = FaultPlanner(FaultSpec({"reset_long_poll": 1.0, "drop_response": 1.0}), 7)
    poll, other = planner.plan("/api/worker/activity-tasks/poll"), planner.plan("/api/worker/register")
    assert (poll.reset_long_poll, poll.drop_response) == (True, False)
    assert (other.reset_long_poll, other.drop_response) == (False, True)
    assert is_poll_route("/api/worker/query-tasks/poll?x=1")
    assert not is_poll_route("/api/worker/polling")


def test_upstream_must_be_a_plain_http_root_url() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        FaultProxy("https://example.test")
    with pytest.raises(ValueError, match="without a path"):
        FaultProxy("http://127.0.0.1:1/api")


# -- transparency ------------------------------------------------------------------------------------------


@with_echo("none")
async def test_transparent_mode_forwards_bytes_unchanged_both_ways(upstream: EchoUpstream, proxy: FaultProxy) -> None:
    # Odd header whitespace and a chunked body, which httpx would never send: both must reach the target as is.
    request = (
        b"POST /chunked/echo?q=1 HTTP/1.1\r\nHost: anything\r\nX-Odd:   spaced value  \r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'5\r\n{"a":\r\n7\r\n [1,2]}\r\n0\r\n\r\n'
    )
    answer = await raw_exchange(proxy.url, request)
    assert bytes(upstream.received) == request
    assert answer == bytes(upstream.sent)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"X-Echo-Target: /chunked/echo?q=1" in answer
    assert proxy.events == []


@with_echo("none")
async def test_transparent_mode_keeps_the_connection_alive(upstream: EchoUpstream, proxy: FaultProxy) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"k":'
        yield b"[1,2,3]}"

    async with httpx.AsyncClient(base_url=proxy.url) as client:
        first = await client.post("/echo", content=b'{"x":1}')
        second = await client.post("/echo", content=chunks())  # a chunked request body
        third = await client.get("/chunked/hello")  # a chunked response body
    assert first.content == b'{"x":1}'
    assert second.content == b'{"k":[1,2,3]}'
    assert third.content == b'{"hello":"world"}'
    assert upstream.targets == ["/echo", "/echo", "/chunked/hello"]
    assert upstream.connections == 1
    assert dict(proxy.counts) == dict.fromkeys(FAULTS, 0)


@with_echo("none")
async def test_malformed_requests_reach_the_target_as_they_are(upstream: EchoUpstream, proxy: FaultProxy) -> None:
    # h11 refuses this request line; the proxy relays the bytes so the target's own 400 handling is judged.
    request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"
    await raw_exchange(proxy.url, request)
    assert bytes(upstream.received) == request


def test_transparent_mode_forwards_byte_identical_json(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()

    async def main() -> None:
        async with FaultProxy(server.url, "none", seed=1) as proxy, httpx.AsyncClient() as client:
            direct = await client.get(server.url + "/api/health")
            proxied = await client.get(proxy.url + "/api/health")
            assert proxied.content == direct.content
            assert proxied.status_code == direct.status_code == 200
            assert {k for k in proxied.headers if k != "date"} == {k for k in direct.headers if k != "date"}

    asyncio.run(main())


# -- the faults against the reference server ---------------------------------------------------------------


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def proxied(
    server: ServerProcess, faults: str, body: Callable[[FaultProxy, ProtocolClient, ProtocolClient], Awaitable[None]]
) -> FaultProxy:
    async with (
        FaultProxy(server.url, faults, seed=3) as proxy,
        ProtocolClient(proxy.url) as through,
        ProtocolClient(server.url) as direct,
    ):
        await body(proxy, through, direct)
        async with asyncio.timeout(60):
            await proxy.wait_idle()
    return proxy


def test_drop_response_leaves_the_request_applied(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    worker, queue = uid("w"), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        before = await direct.worker("/heartbeat", {"worker_id": worker})
        assert before.status == 404, before.text
        with pytest.raises(HarnessError, match="RemoteProtocolError"):
            await through.worker("/register", {"worker_id": worker, "task_queue": queue, "runtime": "python"})
        after = await direct.worker("/heartbeat", {"worker_id": worker})
        assert after.status == 200, after.text  # the register the client never heard back from was applied

    proxy = asyncio.run(proxied(server, "drop_response=1", body))
    assert proxy.counts["drop_response"] == 1
    assert [(w.fault, w.status) for w in proxy.withheld] == [("drop_response", 201)]


def test_duplicate_request_delivers_twice_and_answers_once(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    workflow, queue = uid("wf"), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        started = await direct.control(
            "POST", "/workflows", {"workflow_type": "t", "workflow_id": workflow, "task_queue": queue}
        )
        assert started.status == 201, started.text
        signalled = await through.control("POST", f"/workflows/{workflow}/signal/ping", {})  # no request_id
        assert signalled.status == 202, signalled.text
        history = await direct.control("GET", f"/workflows/{workflow}/runs/{started.json()['run_id']}/history")
        kinds = [e.get("event_type") or e.get("type") for e in history.json()["events"]]
        assert kinds.count("SignalReceived") == 2, kinds

    proxy = asyncio.run(proxied(server, "duplicate_request=1", body))
    assert proxy.counts["duplicate_request"] == 1
    assert [(w.fault, w.status) for w in proxy.withheld] == [("duplicate_request", 202)]


def test_reset_long_poll_resets_the_client_while_the_poll_is_pending(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory()
    worker, queue, workflow = uid("w"), uid("q"), uid("wf")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        registered = await direct.worker("/register", {"worker_id": worker, "task_queue": queue, "runtime": "python"})
        assert registered.status in (200, 201), registered.text
        poll = {"worker_id": worker, "task_queue": queue, "timeout_seconds": 30}
        with pytest.raises(HarnessError) as caught:
            await through.worker("/workflow-tasks/poll", poll, timeout=60)
        assert isinstance(caught.value.__cause__, httpx.TransportError)
        # Only now is there work: an answer carrying it proves the poll was still pending upstream when the
        # client was reset, and that the target could still grant a lease to a client that is gone.
        started = await direct.control(
            "POST", "/workflows", {"workflow_type": "t", "workflow_id": workflow, "task_queue": queue}
        )
        assert started.status == 201, started.text

    proxy = asyncio.run(proxied(server, "reset_long_poll=1", body))
    assert proxy.counts["reset_long_poll"] == 1
    [withheld] = proxy.withheld
    assert (withheld.fault, withheld.status) == ("reset_long_poll", 200)
    task = json.loads(withheld.body)["task"]
    assert task is not None
    assert task["workflow_id"] == workflow


def test_truncate_body_gives_the_client_a_protocol_error(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        with pytest.raises(HarnessError) as caught:
            await through.request("GET", "/api/cluster/info")
        assert isinstance(caught.value.__cause__, httpx.RemoteProtocolError)
        assert (await direct.request("GET", "/api/cluster/info")).status == 200

    proxy = asyncio.run(proxied(server, "truncate_body=1", body))
    assert proxy.counts["truncate_body"] == 1
    assert proxy.events[0].fault == "truncate_body"


# -- seeding, probability zero, delay and reorder ---------------------------------------------------------

MIXED = "drop_response=0.3,duplicate_request=0.3,truncate_body=0.3,delay=0.3:1"


async def fault_sequence(seed: int) -> tuple[list[tuple[int, str]], list[str]]:
    upstream = EchoUpstream()
    await upstream.start()
    outcomes: list[str] = []
    try:
        async with FaultProxy(upstream.url, MIXED, seed=seed) as proxy, httpx.AsyncClient() as client:
            for i in range(30):
                try:
                    reply = await client.post(proxy.url + f"/echo/{i}", content=b'{"i":%d}' % i)
                    outcomes.append(f"{reply.status_code} {reply.content!r}")
                except httpx.TransportError as exc:
                    outcomes.append(type(exc).__name__)
    finally:
        await upstream.close()
    return [(e.seq, e.fault) for e in proxy.events], outcomes


def test_the_same_seed_gives_the_same_fault_sequence() -> None:
    first, second, other = (asyncio.run(fault_sequence(seed)) for seed in (11, 11, 12))
    assert first == second
    assert first[0] != other[0]
    faults = {fault for _, fault in first[0]}
    assert {"drop_response", "duplicate_request", "truncate_body", "delay"} <= faults
    errors = sum(o in ("RemoteProtocolError", "ReadError") for o in first[1])
    assert errors == sum(fault in ("drop_response", "truncate_body") for _, fault in first[0])


@with_echo(",".join(f"{name}=0" for name in FAULTS))
async def test_probability_zero_never_fires(upstream: EchoUpstream, proxy: FaultProxy) -> None:
    async with httpx.AsyncClient(base_url=proxy.url) as client:
        for i in range(40):
            reply = await client.post(f"/x/{i}/poll", content=b"[%d]" % i)
            assert reply.content == b"[%d]" % i
    assert proxy.events == []
    assert dict(proxy.counts) == dict.fromkeys(FAULTS, 0)
    assert len(upstream.targets) == 40


@with_echo("delay=1:2")
async def test_delay_holds_and_still_delivers(upstream: EchoUpstream, proxy: FaultProxy) -> None:
    async with httpx.AsyncClient(base_url=proxy.url) as client:
        for i in range(5):
            assert (await client.post("/echo", content=b"%d" % i)).content == b"%d" % i
    assert proxy.counts["delay"] == 5
    assert all(e.detail.startswith(("held the request", "held the response")) for e in proxy.events)


def test_latency_is_no_fault_and_prints_back() -> None:
    spec = parse_faults("latency=150")
    assert spec.latency_ms == 150
    assert spec.probabilities == {}
    assert str(spec) == "latency=150"
    assert parse_faults("drop_response=0.1,latency=20") == FaultSpec({"drop_response": 0.1}, latency_ms=20)
    # It draws nothing: a seed plans the same faults with it and without it.
    plain, slow = FaultPlanner(parse_faults("delay=0.5"), 7), FaultPlanner(parse_faults("delay=0.5,latency=150"), 7)
    assert [plain.plan("/a") for _ in range(20)] == [slow.plan("/a") for _ in range(20)]


def test_latency_holds_every_answer_and_fires_no_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    holds: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay: float, *args: Any) -> Any:
        holds.append(delay)
        return await sleep(delay, *args)

    monkeypatch.setattr(asyncio, "sleep", recorded)  # what the proxy asks to wait, never how long a call took

    @with_echo("latency=150")
    async def run(upstream: EchoUpstream, proxy: FaultProxy) -> None:
        async with httpx.AsyncClient(base_url=proxy.url) as client:
            for i in range(3):
                assert (await client.post("/echo", content=b"%d" % i)).content == b"%d" % i
        assert proxy.events == []

    run()
    assert holds.count(0.15) == 3  # each of the three answers held 150 ms


@with_echo("reorder=1:10000")
async def test_reorder_forwards_two_concurrent_requests_in_the_opposite_order(
    upstream: EchoUpstream, proxy: FaultProxy
) -> None:
    async with httpx.AsyncClient(base_url=proxy.url) as client:
        a, b = await asyncio.gather(client.post("/a", content=b"a"), client.post("/b", content=b"b"))
    assert (a.content, b.content) == (b"a", b"b")
    [event] = proxy.events
    assert (event.fault, event.seq) == ("reorder", 1)  # the first request to arrive was held ...
    [other] = {"/a", "/b"} - {event.target}
    assert upstream.targets == [other, event.target]  # ... and reached the target second


# -- the command line and the thread -----------------------------------------------------------------------


def test_cli_prints_its_url_and_logs_each_fault(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    cmd = [sys.executable, "-m", "suite.proxy", "--listen", "0", "--upstream", server.url]
    proc = subprocess.Popen(
        [*cmd, "--faults", "drop_response=1", "--seed", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(url + "/api/health", timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "seq=1 drop_response GET /api/health" in err
    assert "drop_response=1" in err.splitlines()[-1]


def test_cli_refuses_a_bad_spec() -> None:
    cmd = [sys.executable, "-m", "suite.proxy", "--listen", "0", "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run([*cmd, "--faults", "explode=1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown fault 'explode'" in done.stderr


def test_proxy_thread_serves_synchronous_callers(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    thread = ProxyThread(server.url, "none", seed=1)
    url = thread.start()
    try:
        assert httpx.get(url + "/api/health", timeout=30).json()["status"] == "serving"
    finally:
        thread.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/api/health", timeout=30)


@pytest.mark.slow
def test_plugin_runs_the_checks_through_the_proxy(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = server_factory()
    run = run_suite(
        server.url,
        tmp_path / "reports",
        "--faults",
        "delay=1:5",
        "--fault-seed",
        "4",
        "--requirement",
        "VERSION-MISSING",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.verdict("VERSION-MISSING") == "passed"
    assert "fault proxy" in run.stdout, run.stdout[-3000:]
    assert "delay=0" not in run.stdout, run.stdout[-3000:]  # every request was delayed: they went through it
    assert run.results is not None
    assert run.results["options"]["faults"] == "delay=1:5"


def test_plugin_refuses_a_bad_spec(tmp_path: Path) -> None:
    run = run_suite("http://127.0.0.1:9", tmp_path / "reports", "--faults", "explode=1")
    assert run.returncode == 4, run.stdout[-3000:]  # a usage error, before any connection
    assert "unknown fault 'explode'" in run.stdout


def test_the_longest_hold_is_the_delay_and_reorder_window_of_the_faults_that_fire() -> None:
    assert FaultSpec.parse("standard").longest_hold() == pytest.approx(0.4)
    assert FaultSpec.parse("delay=0.1:500").longest_hold() == pytest.approx(0.5)
    assert FaultSpec.parse("drop_response=0.5").longest_hold() == 0.0
