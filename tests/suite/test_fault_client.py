"""The suite's client behind the fault proxy (``--faults``): "maybe applied" handled by the protocol's rules.

Each test scripts exactly which request meets which fault (a scripted planner in place of the seeded one),
against the reference server as a subprocess, and reads the server's state through a proxy-free client.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from suite.checks.dispatch import dispatch_cancel_from_other_client
from suite.client import TRACE_HEADER, ProtocolClient
from suite.context import CheckContext, TargetInfo
from suite.outcomes import CheckFailure, Indeterminate
from suite.proxy import FAULTS, FaultPlanner, FaultProxy, FaultSpec, Plan
from tests.conftest import ServerProcess, run_suite

Body = Callable[[FaultProxy, ProtocolClient, ProtocolClient], Awaitable[None]]


class ScriptedPlanner(FaultPlanner):
    """Faults for the n-th request (from 1) whose path matches a pattern; nothing for the others."""

    def __init__(self, script: dict[tuple[str, int], dict[str, Any]]) -> None:
        super().__init__(FaultSpec(), 0)
        self.script = script
        self.seen: Counter[str] = Counter()

    def plan(self, path: str) -> Plan:
        self._seq += 1
        for (pattern, nth), faults in self.script.items():
            if re.search(pattern, path.partition("?")[0]):
                self.seen[pattern] += 1
                if self.seen[pattern] == nth:
                    return Plan(seq=self._seq, **faults)
        return Plan(seq=self._seq)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def scripted(server: ServerProcess, script: dict[tuple[str, int], dict[str, Any]], body: Body) -> FaultProxy:
    async def main() -> FaultProxy:
        async with FaultProxy(server.url, "none", seed=0) as proxy:
            proxy.planner = ScriptedPlanner(script)
            async with ProtocolClient(proxy.url, faults=proxy) as through, ProtocolClient(server.url) as direct:
                await body(proxy, through, direct)
            async with asyncio.timeout(60):
                await proxy.wait_idle()
            return proxy

    return asyncio.run(main())


async def _register_and_start(direct: ProtocolClient, queue: str) -> tuple[str, str, str]:
    worker, workflow = uid("w"), uid("wf")
    reply = await direct.worker("/register", {"worker_id": worker, "task_queue": queue, "runtime": "python"})
    assert reply.status in (200, 201), reply.text
    started = await direct.control(
        "POST", "/workflows", {"workflow_type": "t", "workflow_id": workflow, "task_queue": queue}
    )
    assert started.status == 201, started.text
    return worker, workflow, str(started.json()["run_id"])


async def _lease(client: ProtocolClient, worker: str, queue: str) -> dict[str, Any]:
    reply = await client.worker(
        "/workflow-tasks/poll", {"worker_id": worker, "task_queue": queue, "timeout_seconds": 2}
    )
    assert reply.status == 200, reply.text
    task = reply.json().get("task")
    assert isinstance(task, dict), reply.text
    return task


async def _events(direct: ProtocolClient, workflow: str, run_id: str) -> list[str]:
    history = await direct.control("GET", f"/workflows/{workflow}/runs/{run_id}/history")
    return [str(e.get("event_type") or e.get("type")) for e in history.json()["events"]]


POLL = r"/workflow-tasks/poll$"
COMPLETE = r"/workflow-tasks/[^/]+/complete$"


def test_a_lost_poll_answer_is_resent_with_the_same_id_and_the_same_lease_comes_back(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server, queue = server_factory(), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, _, _ = await _register_and_start(direct, queue)
        task = await _lease(through, worker, queue)  # the check sent no poll_request_id
        sent = [e for e in through.exchanges if e.url.endswith("/poll")]
        assert len(sent) == 2
        assert sent[0].error is not None
        assert sent[1].status == 200
        ids = {str(e.request_body) for e in sent}
        assert len(ids) == 1
        assert "dw-retry-" in ids.pop()
        lost = proxy.withheld[0]
        assert lost.fault == "drop_response"
        assert lost.status == 200
        assert task["task_id"] in lost.body.decode()
        assert task["workflow_task_attempt"] == 1

    scripted(server, {(POLL, 1): {"drop_response": True}}, body)


def test_a_retried_poll_that_loses_its_replay_is_reported(server_factory: Callable[..., ServerProcess]) -> None:
    # The bug only a lost answer reveals: the replay record dies with the connection that carried the poll.
    server, queue = server_factory("--fault", "poll-replay-forgotten-on-disconnect"), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, _, _ = await _register_and_start(direct, queue)
        with pytest.raises(CheckFailure) as caught:
            await _lease(through, worker, queue)
        failure = caught.value
        assert failure.requirement == "IDEMPOTENT-POLL-REPLAY"
        assert "200 with no task" in str(failure.received)
        withheld, retry = failure.exchanges
        assert withheld.error is not None
        assert "withheld" in withheld.error
        assert withheld.status == 200
        assert retry.status == 200
        assert retry.request_body == withheld.request_body

    scripted(server, {(POLL, 1): {"drop_response": True}}, body)


def test_the_same_retry_on_the_same_connection_is_replayed_by_that_server(
    server_factory: Callable[..., ServerProcess],
) -> None:
    # Without the proxy the bug stays hidden: a repeated poll on a live connection is replayed.
    server, queue = server_factory("--fault", "poll-replay-forgotten-on-disconnect"), uid("q")

    async def main() -> None:
        async with ProtocolClient(server.url) as direct:
            worker, _, _ = await _register_and_start(direct, queue)
            body = {"worker_id": worker, "task_queue": queue, "timeout_seconds": 1, "poll_request_id": uid("p")}
            first = await direct.worker("/workflow-tasks/poll", body)
            again = await direct.worker("/workflow-tasks/poll", body)
            assert first.json()["task"]["task_id"] == again.json()["task"]["task_id"]

    asyncio.run(main())


def test_a_lost_complete_is_resent_judged_and_left_indeterminate(server_factory: Callable[..., ServerProcess]) -> None:
    server, queue = server_factory(), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, workflow, run_id = await _register_and_start(direct, queue)
        task = await _lease(direct, worker, queue)
        complete = {
            "lease_owner": task["lease_owner"],
            "workflow_task_attempt": task["workflow_task_attempt"],
            "commands": [{"type": "complete_workflow", "result": {"codec": "avro", "blob": "AA=="}}],
        }
        with pytest.raises(Indeterminate, match="the repeat answered 409"):
            await through.worker(f"/workflow-tasks/{task['task_id']}/complete", complete)
        assert (await _events(direct, workflow, run_id)).count("WorkflowCompleted") == 1

    scripted(server, {(COMPLETE, 1): {"drop_response": True}}, body)


def test_a_refused_request_whose_answer_was_lost_is_simply_resent(server_factory: Callable[..., ServerProcess]) -> None:
    server, queue = server_factory(), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, _, _ = await _register_and_start(direct, queue)
        task = await _lease(direct, worker, queue)
        wrong = {"lease_owner": "someone-else", "workflow_task_attempt": 1, "commands": []}
        reply = await through.worker(f"/workflow-tasks/{task['task_id']}/complete", wrong)
        assert reply.status == 409
        assert reply.reason == "lease_owner_mismatch"
        assert [w.status for w in proxy.withheld] == [409]  # the lost answer was a refusal: nothing applied

    scripted(server, {(COMPLETE, 1): {"drop_response": True}}, body)


def test_a_checks_second_client_meets_a_lost_answer_as_maybe_applied(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """dispatch_cancel_from_other_client sends its cancel from a second client: through the proxy that client
    handles a lost answer as the check's own does (the cancel is resent and judged, and the check cannot go on:
    it runs again), never as a broken connection, which would be a harness error of the whole run."""
    server = server_factory()

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        target = TargetInfo(proxy.url, {}, fault_ledger=proxy)
        ctx = CheckContext(target=target, client=through, check_name="dispatch_cancel_from_other_client")
        with pytest.raises(Indeterminate, match="cancel"):
            await dispatch_cancel_from_other_client(ctx)

    proxy = scripted(server, {(r"/workflows/[^/]+/cancel$", 1): {"drop_response": True}}, body)
    assert [w.fault for w in proxy.withheld] == ["drop_response"]


def test_a_duplicated_signal_is_indeterminate_and_may_count_twice(server_factory: Callable[..., ServerProcess]) -> None:
    server, queue = server_factory(), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        _, workflow, run_id = await _register_and_start(direct, queue)
        with pytest.raises(Indeterminate) as caught:
            await through.control("POST", f"/workflows/{workflow}/signal/ping", {})
        assert caught.value.copies == 2
        assert (await _events(direct, workflow, run_id)).count("SignalReceived") == 2

    scripted(server, {(r"/signal/", 1): {"duplicate_request": True}}, body)


def test_a_duplicated_complete_is_judged_and_harmless(server_factory: Callable[..., ServerProcess]) -> None:
    server, queue = server_factory(), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, _workflow, _run_id = await _register_and_start(direct, queue)
        task = await _lease(direct, worker, queue)
        timer = {"type": "start_timer", "delay_seconds": 600}
        complete = {"lease_owner": task["lease_owner"], "workflow_task_attempt": 1, "commands": [timer]}
        reply = await through.worker(f"/workflow-tasks/{task['task_id']}/complete", complete)
        assert reply.status == 200, reply.text
        assert [(w.fault, w.status) for w in proxy.withheld] == [("duplicate_request", 409)]
        assert all(TRACE_HEADER in e.request_headers for e in through.exchanges)

    scripted(server, {(COMPLETE, 1): {"duplicate_request": True}}, body)


def test_a_duplicate_recorded_twice_is_reported(server_factory: Callable[..., ServerProcess]) -> None:
    # A server that records an activity complete again: the duplicate the network made is the evidence.
    server, queue = server_factory("--fault", "record-stale-activity-complete"), uid("q")

    async def body(proxy: FaultProxy, through: ProtocolClient, direct: ProtocolClient) -> None:
        worker, _, _ = await _register_and_start(direct, queue)
        task = await _lease(direct, worker, queue)
        schedule = {
            "type": "schedule_activity",
            "activity_type": "a",
            "task_queue": queue,
            "arguments": {"codec": "avro", "blob": "AA=="},
        }
        done = await direct.worker(
            f"/workflow-tasks/{task['task_id']}/complete",
            {"lease_owner": task["lease_owner"], "workflow_task_attempt": 1, "commands": [schedule]},
        )
        assert done.status == 200, done.text
        act = await direct.worker(
            "/activity-tasks/poll", {"worker_id": worker, "task_queue": queue, "timeout_seconds": 2}
        )
        activity = act.json()["task"]
        report = {"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": activity["lease_owner"]}
        with pytest.raises(CheckFailure) as caught:
            await through.worker(f"/activity-tasks/{activity['task_id']}/complete", report)
        assert caught.value.requirement == "ACTIVITY-DUPLICATE-COMPLETE-STALE"

    scripted(server, {(r"/activity-tasks/[^/]+/complete$", 1): {"duplicate_request": True}}, body)


# -- the whole suite through the proxy ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.whole_suite
def test_the_whole_suite_through_every_fault_passes_against_the_reference_server(tmp_path: Path) -> None:
    """No false failure under `--faults standard`: every requirement passes, and the faults really fired.

    Four xdist workers: each has its own proxy (seeds 5 to 8) and its own embedded server with its test clock.
    The run spends most of its time waiting out the proxies' delays, not computing; four workers overlap those
    waits, so it takes about half as long as with two on the same CPU time."""
    run = run_suite(
        "embedded", tmp_path / "reports", "--faults", "standard", "--fault-seed", "5", "-n", "4", timeout=1500
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert run.results is not None
    summary = run.results["summary"]
    assert summary["failed"] == 0
    assert summary["harness_errors"] == 0
    assert all(r["verdict"] == "passed" for r in run.results["requirements"]), [
        (r["id"], r["verdict"]) for r in run.results["requirements"] if r["verdict"] != "passed"
    ]
    fired = dict(re.findall(r"fault proxy \(seed (\d+)\): (.*)", run.stdout))
    assert sorted(fired) == ["5", "6", "7", "8"], run.stdout[-3000:]
    counts: Counter[str] = Counter()
    for line in fired.values():
        counts.update({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)})
    assert all(counts[name] > 0 for name in FAULTS), counts  # every fault fired, and the suite held
    assert sum(int(c.get("fault_reruns") or 0) for c in run.results["checks"]) > 0


# -- a server that breaks the repeat rules: the client's judgments fail against it ----------------------------


class AcceptsEverything:
    """A broken upstream: every request is accepted with the status its route answers the first time, however
    often it comes (a complete or fail applied twice, a start that starts again); a repeated register is
    refused. Enough protocol for the client's repeat judgments, nothing more."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> AcceptsEverything:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _answer(self, path: str) -> tuple[int, bytes]:
        self.seen[path] += 1
        if path.endswith("/register"):
            return (201, b'{"registered":true}') if self.seen[path] == 1 else (409, b'{"reason":"conflict"}')
        if path == "/api/workflows":
            return 201, b'{"run_id":"r%d"}' % self.seen[path]
        return 200, b'{"outcome":"completed","recorded":true}'

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11

        conn = h11.Connection(h11.SERVER)
        path = ""
        with contextlib.suppress(ConnectionError, h11.RemoteProtocolError):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    path = event.target.decode()
                elif isinstance(event, h11.Data):
                    continue  # the body does not matter: every request is accepted
                elif isinstance(event, h11.EndOfMessage):
                    status, body = self._answer(path)
                    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
                    writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
                    writer.write((conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
                    await writer.drain()
                    conn.start_next_cycle()
                else:
                    break
        writer.close()


@pytest.mark.parametrize(
    ("method", "path", "requirement"),
    [
        ("POST", "/api/worker/register", "REGISTER-IDEMPOTENT"),
        ("POST", "/api/worker/workflow-tasks/T1/complete", "FENCE-AFTER-COMPLETE"),
        ("POST", "/api/worker/workflow-tasks/T1/fail", "FENCE-TASK-FAILED-NOT-LEASED"),
        ("POST", "/api/worker/activity-tasks/A1/fail", "ACTIVITY-DUPLICATE-COMPLETE-STALE"),
        ("POST", "/api/worker/query-tasks/Q1/complete", "QUERY-LATE-COMPLETE-NOT-LEASED"),
        ("POST", "/api/workflows", "CONTROL-START"),
    ],
)
@pytest.mark.parametrize("fault", ["duplicate_request", "drop_response"])
def test_each_repeat_rule_fails_against_a_server_that_breaks_it(
    method: str, path: str, requirement: str, fault: str
) -> None:
    async def main() -> None:
        async with (
            AcceptsEverything() as broken,
            FaultProxy(broken.url, "none", seed=0) as proxy,
            ProtocolClient(proxy.url, faults=proxy) as client,
        ):
            proxy.planner = ScriptedPlanner({(re.escape(path) + "$", 1): {fault: True}})
            with pytest.raises(CheckFailure) as caught:
                await client.request(method, path, json_body={"worker_id": "w", "task_queue": "q"})
            assert caught.value.requirement == requirement
            assert any(e.error and "withheld" in e.error for e in caught.value.exchanges)

    asyncio.run(main())
