"""Query tasks through the reference server's handler, in process (docs/reference.md: Queries, Control plane, invariants
60-64).

The control-plane query blocks until a worker answers, so each scenario runs it as a task next to the
worker's poll and report. Time is a :class:`ManualClock` wherever leases or deadlines matter; the only
real wait is the one test that proves the caller's own timeout (1 s). Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from reference_server import queries
from reference_server.config import Settings
from reference_server.http import Request
from reference_server.polling import Poll
from reference_server.server import Server
from suite.protocol.codec import decode_blob, make_envelope
from suite.protocol.fencing import parse_rfc3339
from tests.server.harness import CONTROL_HEADERS, WORKER_HEADERS, FakeClock, run_async, scenario, until, within

POLL_HOLD = 8  # the poll returns as soon as a task is there; this only bounds a broken server
START_US = 1_776_513_600_000_000  # 2026-04-18T12:00:00Z
CANONICAL_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


class ManualClock(FakeClock):
    """The server's only clock, moved by the test (``now`` is the instant in microseconds)."""

    def __init__(self, now_us: int = START_US) -> None:
        self.us = now_us

    @property
    def now(self) -> int:
        return self.us


class World:
    """One server plus the calls a scenario makes."""

    def __init__(self, server: Server, clock: ManualClock | None) -> None:
        self.server = server
        self.clock = clock

    async def call(
        self, method: str, path: str, body: Any = None, *, worker: bool, namespace: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        headers = dict(WORKER_HEADERS if worker else CONTROL_HEADERS)
        if namespace is not None:
            headers["X-Namespace"] = namespace
        raw = b"" if body is None else json.dumps(body).encode()
        response = await self.server.handle(Request.from_target(method, path, headers=headers, body=raw))
        doc = response.json()
        assert isinstance(doc, dict)
        return response.status, doc

    async def worker(self, path: str, body: Any, namespace: str | None = None) -> tuple[int, dict[str, Any]]:
        return await self.call("POST", "/api/worker" + path, body, worker=True, namespace=namespace)

    async def control(
        self, method: str, path: str, body: Any = None, namespace: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        return await self.call(method, "/api" + path, body, worker=False, namespace=namespace)

    async def start(self, workflow_id: str = "order-1", *, queue: str = "orders", wf_type: str = "order") -> str:
        status, doc = await self.control(
            "POST",
            "/workflows",
            {
                "workflow_id": workflow_id,
                "workflow_type": wf_type,
                "task_queue": queue,
                "input": ["hello", 42],
            },
        )
        assert status == 201, doc
        return str(doc["run_id"])

    async def register(
        self,
        worker_id: str,
        *,
        queue: str = "orders",
        types: list[str] | None = None,
        namespace: str | None = None,
    ) -> None:
        body = {
            "worker_id": worker_id,
            "task_queue": queue,
            "runtime": "python",
            "capabilities": ["query_tasks"],
        }
        if types is not None:
            body["supported_workflow_types"] = types
        status, doc = await self.worker("/register", body, namespace)
        assert status == 201, doc

    async def poll(
        self, worker_id: str, *, queue: str = "orders", namespace: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        status, doc = await within(
            self.worker(
                "/query-tasks/poll",
                {"worker_id": worker_id, "task_queue": queue, "timeout_seconds": POLL_HOLD, **extra},
                namespace,
            )
        )
        assert status == 200, doc
        assert doc["poll_status"] == "leased", doc
        task = doc["task"]
        assert isinstance(task, dict)
        return task

    async def report(
        self, verb: str, task_id: str, body: dict[str, Any], namespace: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        return await self.worker(f"/query-tasks/{task_id}/{verb}", body, namespace)

    def query(
        self,
        name: str = "status",
        body: Any = None,
        *,
        workflow_id: str = "order-1",
        run_id: str | None = None,
    ) -> asyncio.Task[tuple[int, dict[str, Any]]]:
        """The blocking control-plane query, running next to the test's worker calls."""
        path = f"/workflows/{workflow_id}" + (f"/runs/{run_id}" if run_id else "") + f"/query/{name}"
        return asyncio.get_running_loop().create_task(self.control("POST", path, {} if body is None else body))

    async def leased_query(
        self, name: str = "status", worker: str = "w1"
    ) -> tuple[asyncio.Task[tuple[int, dict[str, Any]]], dict[str, Any]]:
        """A blocking query and its task, leased by ``worker``."""
        pending = self.query(name)
        return pending, await self.poll(worker)

    def rows(self, sql: str, *args: Any) -> list[Any]:
        return list(self.server.store.read().execute(sql, args).fetchall())

    def count_query_tasks(self) -> int:
        return int(self.rows("SELECT COUNT(*) FROM query_tasks")[0][0])

    def query_task(self, task_id: str) -> Any:
        return self.rows("SELECT * FROM query_tasks WHERE query_task_id = ?", task_id)[0]

    async def history(self, run_id: str, workflow_id: str = "order-1") -> list[dict[str, Any]]:
        status, doc = await self.control("GET", f"/workflows/{workflow_id}/runs/{run_id}/history?page_size=1000")
        assert status == 200, doc
        return list(doc["events"])

    def sweep(self) -> float | None:
        result: float | None = self.server.run_tx(queries.sweep_query_tasks)
        return result


@asynccontextmanager
async def world(tmp_path: Path, *, manual_clock: bool = True, **settings: Any) -> AsyncIterator[World]:
    clock = ManualClock() if manual_clock else None
    server = Server(Settings(db_path=str(tmp_path / "db.sqlite"), **settings), clock=clock)
    try:
        yield World(server, clock)
    finally:
        await server.close()


@asynccontextmanager
async def started(tmp_path: Path, *workers: str, **settings: Any) -> AsyncIterator[World]:
    """A world with run order-1 started and ``workers`` (w1 when none is named) registered for queries."""
    async with world(tmp_path, **settings) as w:
        await w.start()
        for worker in workers or ("w1",):
            await w.register(worker)
        yield w


def complete_body(task: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"lease_owner": task["lease_owner"], "query_task_attempt": task["query_task_attempt"], **extra}


# -- invariant 60: task fields, result round trip, read-only ---------------------------------------------


@scenario
async def test_query_task_carries_the_section_10_2_fields_and_the_result_envelope_round_trips(
    tmp_path: Path,
) -> None:
    async with world(tmp_path, query_lease_seconds=60) as w:
        run_id = await w.start()
        await w.register("py-worker-1")
        before = await w.history(run_id)
        workflow_tasks_before = w.rows("SELECT COUNT(*) FROM workflow_tasks")[0][0]
        _, describe_before = await w.control("GET", "/workflows/order-1")

        pending = w.query("status", {"input": ["detail", 7]})
        task = await w.poll("py-worker-1")

        assert task["query_task_attempt"] == 1
        assert task["query_name"] == "status"
        assert task["lease_owner"] == "py-worker-1"
        assert task["task_queue"] == "orders"
        assert task["namespace"] == "default"
        assert (task["workflow_id"], task["run_id"], task["workflow_type"]) == (
            "order-1",
            run_id,
            "order",
        )
        assert task["payload_codec"] == "avro"
        assert task["run_status"] == "pending"
        assert task["workflow_arguments"]["codec"] == "avro"
        assert decode_blob(task["workflow_arguments"]["blob"]) == ["hello", 42]
        assert task["query_arguments"]["codec"] == "avro"
        assert decode_blob(task["query_arguments"]["blob"]) == ["detail", 7]
        events = task["history_events"]
        assert [e["sequence"] for e in events] == list(range(1, len(before) + 1))
        assert task["last_history_sequence"] == len(before)
        assert "WorkflowStarted" in [e["event_type"] for e in events]
        assert CANONICAL_TS.match(task["lease_expires_at"]), task["lease_expires_at"]
        assert w.clock is not None
        lease_us = int(parse_rfc3339(task["lease_expires_at"]).timestamp() * 1_000_000)
        assert lease_us == w.clock.now + 60 * 1_000_000

        envelope = make_envelope({"state": "shipped", "items": [1, 2]})
        status, receipt = await w.report(
            "complete",
            task["query_task_id"],
            complete_body(task, result="ignored", result_envelope=envelope),
        )
        assert status == 200, receipt
        assert receipt["outcome"] == "completed"
        assert receipt["query_task_id"] == task["query_task_id"]
        assert receipt["query_task_attempt"] == 1
        assert receipt["protocol_version"] == "1.20"

        status, answer = await within(pending)
        assert status == 200, answer
        assert answer["result_envelope"] == envelope
        assert answer["result"] == {
            "state": "shipped",
            "items": [1, 2],
        }  # the decoded view of the envelope
        assert (answer["workflow_id"], answer["run_id"], answer["query_name"]) == (
            "order-1",
            run_id,
            "status",
        )

        # QUERY-READ-ONLY: no history, no workflow task, no run change.
        assert await w.history(run_id) == before
        assert w.rows("SELECT COUNT(*) FROM workflow_tasks")[0][0] == workflow_tasks_before
        _, describe_after = await w.control("GET", "/workflows/order-1")
        assert describe_after == describe_before


@scenario
async def test_query_without_input_or_envelope_gets_null_arguments_and_a_server_built_envelope(
    tmp_path: Path,
) -> None:
    async with started(tmp_path) as w:
        pending = w.query("count")
        task = await w.poll("w1")
        assert task["query_arguments"] is None
        status, _ = await w.report("complete", task["query_task_id"], complete_body(task, result={"n": 3}))
        assert status == 200
        status, answer = await within(pending)
        assert status == 200, answer
        assert answer["result"] == {"n": 3}
        assert decode_blob(answer["result_envelope"]["blob"]) == {"n": 3}


@scenario
async def test_run_targeted_query_and_unknown_targets(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        run_id = await w.start()
        await w.register("w1")
        pending = w.query("status", run_id=run_id)
        task = await w.poll("w1")
        assert task["run_id"] == run_id
        await w.report("complete", task["query_task_id"], complete_body(task, result=1))
        status, answer = await within(pending)
        assert (status, answer["run_id"], answer["result"]) == (200, run_id, 1)

        status, doc = await within(w.query("status", workflow_id="nope"))
        assert (status, doc["reason"]) == (404, "instance_not_found")
        status, doc = await within(w.query("status", run_id="01NOTARUN"))
        assert (status, doc["reason"]) == (404, "run_not_found")
        assert w.count_query_tasks() == 1


@scenario
async def test_a_closed_run_can_still_be_queried(tmp_path: Path) -> None:
    async with started(tmp_path) as w:
        status, _ = await w.control("POST", "/workflows/order-1/cancel", {"reason": "done"})
        assert status == 200
        pending, task = await w.leased_query()
        assert task["run_status"] == "cancelled"
        assert task["history_events"][-1]["event_type"] == "WorkflowCancelled"
        await w.report("complete", task["query_task_id"], complete_body(task, result="closed"))
        status, answer = await within(pending)
        assert (status, answer["result"]) == (200, "closed")


# -- invariant 61: worker failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "http_status", "reason"),
    [
        (
            {"message": "no handler 'status'", "reason": "rejected_unknown_query"},
            404,
            "rejected_unknown_query",
        ),
        ({"message": "handler raised", "reason": "query_rejected"}, 409, "query_rejected"),
        ({"message": "bad args", "reason": "invalid_query_arguments"}, 409, "invalid_query_arguments"),
        (
            {"message": "state gone", "reason": "query_workflow_state_unavailable"},
            409,
            "query_workflow_state_unavailable",
        ),
        ({"message": "no reason given"}, 409, "query_rejected"),
    ],
)
@scenario
async def test_worker_failure_maps_onto_the_control_plane_status(
    tmp_path: Path, failure: dict[str, Any], http_status: int, reason: str
) -> None:
    async with started(tmp_path) as w:
        pending, task = await w.leased_query()
        status, receipt = await w.report("fail", task["query_task_id"], complete_body(task, failure=failure))
        assert status == 200, receipt
        assert (receipt["outcome"], receipt["reason"]) == ("failed", reason)
        status, answer = await within(pending)
        assert status == http_status, answer
        assert answer["reason"] == reason
        assert answer["message"] == failure["message"]
        assert answer["error"] == failure["message"]
        assert answer["query_task_id"] == task["query_task_id"]


@scenario
async def test_closing_the_run_fails_a_pending_query_without_waiting_for_the_timeout(tmp_path: Path) -> None:
    async with started(tmp_path, query_timeout_seconds=60) as w:
        pending = w.query("status")
        await until(lambda: w.count_query_tasks() == 1)
        status, _ = await w.control("POST", "/workflows/order-1/terminate", {"reason": "stop"})
        assert status == 200
        status, answer = await within(pending)
        assert (status, answer["reason"]) == (409, "query_rejected")


# -- invariant 62: no worker ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setup",
    ["nobody", "other_queue", "other_type", "stale", "deregistered", "draining"],
)
@scenario
async def test_no_capable_worker_answers_409_at_once_and_creates_no_task(tmp_path: Path, setup: str) -> None:
    # A long query timeout: within() (10 s) would fail if the call waited for it.
    async with world(tmp_path, query_timeout_seconds=60, stale_worker_seconds=60) as w:
        await w.start()
        if setup == "other_queue":
            await w.register("w1", queue="billing")
        elif setup == "other_type":
            await w.register("w1", types=["invoice"])
        elif setup == "stale":
            await w.register("w1")
            assert w.clock is not None
            w.clock.advance(61)
        elif setup == "deregistered":
            await w.register("w1")
            status, _ = await w.worker("/registrations/w1/deregister", {})
            assert status == 200
        elif setup == "draining":
            await w.register("w1")
            status, _ = await w.control("POST", "/task-queues/orders/build-ids/drain", {"build_id": None})
            assert status == 200
        status, doc = await within(w.query("status"))
        assert (status, doc["reason"]) == (409, "query_worker_unavailable"), doc
        assert w.count_query_tasks() == 0


@scenario
async def test_a_worker_for_the_type_or_for_all_types_is_enough(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.start()
        await w.register("w1", types=["order"])
        pending, task = await w.leased_query()
        await w.report("complete", task["query_task_id"], complete_body(task, result=None))
        status, answer = await within(pending)
        assert (status, answer["result"]) == (200, None)


# -- invariant 63: timeout ------------------------------------------------------------------------------


@scenario
async def test_registered_worker_that_never_polls_gives_504_then_a_late_complete_is_not_leased(
    tmp_path: Path,
) -> None:
    # The real clock: this is the caller's own deadline (query_timeout_seconds) expiring.
    async with started(tmp_path, manual_clock=False, query_timeout_seconds=1) as w:
        status, doc = await within(w.query("status"))
        assert (status, doc["reason"]) == (504, "query_worker_timeout"), doc
        row = w.rows("SELECT * FROM query_tasks")[0]
        assert row["status"] == "timed_out"
        late = {"lease_owner": "w1", "query_task_attempt": 1, "result": 1}
        status, doc = await w.report("complete", row["query_task_id"], late)
        assert (status, doc["reason"]) == (409, "query_task_not_leased")
        assert doc["outcome"] == "rejected"


@scenario
async def test_a_leased_query_past_its_deadline_times_out_and_its_holder_is_fenced(tmp_path: Path) -> None:
    async with started(tmp_path, "w1", "w2", query_timeout_seconds=30, query_lease_seconds=20) as w:
        pending, task = await w.leased_query()
        assert w.clock is not None
        assert w.sweep() == pytest.approx(30.0)  # seconds until the deadline
        w.clock.advance(31)  # past both the lease and the deadline; the sweep has not run yet

        def claim_by_w2(t: Any) -> Any:
            return queries.claim_query_task(t, Poll("query", _worker_row(w, "w2"), "orders", None, 0.0, None))

        # Not redelivered, although its lease expired: the deadline passed (never retried after it).
        assert w.server.run_tx(claim_by_w2) is None
        # And its holder is told the task is over, not merely that its lease expired.
        status, doc = await w.report("complete", task["query_task_id"], complete_body(task, result=1))
        assert (status, doc["reason"]) == (409, "query_task_not_leased")
        assert w.sweep() is None  # nothing live is left
        status, doc = await within(pending)  # the sweep woke the caller
        assert (status, doc["reason"]) == (504, "query_worker_timeout")
        assert w.query_task(task["query_task_id"])["status"] == "timed_out"
        status, doc = await w.report("fail", task["query_task_id"], complete_body(task, failure={"message": "x"}))
        assert (status, doc["reason"]) == (409, "query_task_not_leased")
        assert w.server.run_tx(claim_by_w2) is None


@scenario
async def test_a_caller_that_goes_away_stops_its_query(tmp_path: Path) -> None:
    async with started(tmp_path, query_timeout_seconds=60) as w:
        pending = w.query("status")
        await until(lambda: w.count_query_tasks() == 1)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(pending)
        assert w.rows("SELECT status FROM query_tasks")[0][0] == "timed_out"


# -- invariant 64 and §10.6: fencing --------------------------------------------------------------------


@scenario
async def test_query_task_fencing_in_section_10_6_order(tmp_path: Path) -> None:
    async with started(tmp_path) as w:
        pending, task = await w.leased_query()
        qid = task["query_task_id"]

        status, doc = await w.report("complete", qid, {"lease_owner": "intruder", "query_task_attempt": 1})
        assert (status, doc["reason"], doc["lease_owner"]) == (409, "lease_owner_mismatch", "w1")
        assert doc["outcome"] == "rejected"
        status, doc = await w.report("complete", qid, {"lease_owner": "w1", "query_task_attempt": 2})
        assert (status, doc["reason"], doc["current_attempt"]) == (409, "query_task_attempt_mismatch", 1)
        status, doc = await w.report(
            "fail", qid, {"lease_owner": "w1", "query_task_attempt": 2, "failure": {"message": "x"}}
        )
        assert (status, doc["reason"]) == (409, "query_task_attempt_mismatch")
        status, doc = await w.report("complete", "01UNKNOWNQUERYTASK", complete_body(task, result=1))
        assert (status, doc["reason"]) == (404, "query_task_not_found")
        assert doc["protocol_version"] == "1.20"
        assert not pending.done()

        # The rejections changed nothing: the owner's complete is accepted, once.
        status, doc = await w.report("complete", qid, complete_body(task, result="first"))
        assert (status, doc["outcome"]) == (200, "completed")
        status, doc = await w.report("complete", qid, complete_body(task, result="second"))
        assert (status, doc["reason"]) == (409, "query_task_not_leased")
        status, doc = await w.report("fail", qid, complete_body(task, failure={"message": "late"}))
        assert (status, doc["reason"]) == (409, "query_task_not_leased")
        status, answer = await within(pending)
        assert (status, answer["result"]) == (200, "first")


@scenario
async def test_concurrent_completes_never_both_land(tmp_path: Path) -> None:
    async with started(tmp_path) as w:
        pending, task = await w.leased_query()
        barrier = asyncio.Barrier(8)

        async def report(i: int) -> tuple[int, dict[str, Any]]:
            await barrier.wait()
            verb = "complete" if i % 2 else "fail"
            extra = {"result": i} if verb == "complete" else {"failure": {"message": str(i)}}
            return await w.report(verb, task["query_task_id"], complete_body(task, **extra))

        results = await within(asyncio.gather(*(report(i) for i in range(8))))
        assert sorted(status for status, _ in results) == [200] + [409] * 7
        assert all(doc["reason"] == "query_task_not_leased" for status, doc in results if status == 409)
        await within(pending)


@scenario
async def test_a_task_id_from_another_namespace_is_not_found(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        w.server.run_tx(lambda t: t.db.execute("INSERT INTO namespaces (name, created_at) VALUES ('other', 0)"))
        await w.start()
        await w.register("w1")
        await w.register("w1", namespace="other")
        pending, task = await w.leased_query()
        status, doc = await w.report("complete", task["query_task_id"], complete_body(task, result=1), "other")
        assert (status, doc["reason"]) == (404, "query_task_not_found")
        # A poller in the other namespace never sees the default namespace's task.
        assert (
            w.server.run_tx(
                lambda t: queries.claim_query_task(
                    t, Poll("query", _worker_row(w, "w1", "other"), "orders", None, 0.0, None)
                )
            )
            is None
        )
        status, _ = await w.report("complete", task["query_task_id"], complete_body(task, result=1))
        assert status == 200
        assert (await within(pending))[0] == 200


# -- leases: expiry and redelivery, poll_request_id replay ----------------------------------------------


@scenario
async def test_an_expired_query_lease_is_redelivered_with_the_next_attempt(tmp_path: Path) -> None:
    async with started(tmp_path, "w1", "w2", query_timeout_seconds=30, query_lease_seconds=5) as w:
        pending = w.query("status")
        first = await w.poll("w1")
        assert w.clock is not None
        w.clock.advance(6)
        status, doc = await w.report("complete", first["query_task_id"], complete_body(first, result=1))
        assert (status, doc["reason"]) == (409, "lease_expired")
        second = await w.poll("w2")
        assert second["query_task_id"] == first["query_task_id"]
        assert (second["query_task_attempt"], second["lease_owner"]) == (2, "w2")
        status, doc = await w.report("complete", first["query_task_id"], complete_body(first, result=1))
        assert (status, doc["reason"]) == (409, "lease_owner_mismatch")
        status, _ = await w.report("complete", second["query_task_id"], complete_body(second, result=2))
        assert status == 200
        status, answer = await within(pending)
        assert (status, answer["result"]) == (200, 2)


@scenario
async def test_a_repeated_poll_request_id_replays_the_same_lease(tmp_path: Path) -> None:
    async with started(tmp_path, "w1", "w2", query_lease_seconds=60) as w:
        pending = w.query("status")
        first = await w.poll("w1", poll_request_id="query-poll-1")
        assert w.clock is not None
        w.clock.advance(10)
        again = await w.poll("w1", poll_request_id="query-poll-1")
        assert (again["query_task_id"], again["query_task_attempt"]) == (first["query_task_id"], 1)
        assert parse_rfc3339(again["lease_expires_at"]) > parse_rfc3339(first["lease_expires_at"])
        other = w.server.run_tx(
            lambda t: queries.claim_query_task(
                t, Poll("query", _worker_row(w, "w2"), "orders", None, 0.0, "query-poll-1")
            )
        )
        assert other is None  # a different worker gets no replay, and the task is leased
        await w.report("complete", first["query_task_id"], complete_body(first, result=1))
        await within(pending)


# -- admission and validation ---------------------------------------------------------------------------


def test_a_full_query_queue_answers_429(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "MAX_PENDING_PER_QUEUE", 1)

    async def scenario() -> None:
        async with started(tmp_path) as w:
            pending = w.query("status")
            await until(lambda: w.count_query_tasks() == 1)
            status, doc = await within(w.query("status"))
            assert (status, doc["reason"]) == (429, "query_task_queue_full")
            assert w.count_query_tasks() == 1
            task = await w.poll("w1")
            await w.report("complete", task["query_task_id"], complete_body(task, result=1))
            assert (await within(pending))[0] == 200

    run_async(scenario())


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("complete", {"query_task_attempt": 1, "result": 1}, "lease_owner"),
        ("complete", {"lease_owner": "w1", "result": 1}, "query_task_attempt"),
        ("complete", {"lease_owner": "w1", "query_task_attempt": 0}, "query_task_attempt"),
        ("complete", {"lease_owner": "w1", "query_task_attempt": "1"}, "query_task_attempt"),
        ("complete", {"lease_owner": "w1", "query_task_attempt": True}, "query_task_attempt"),
        (
            "complete",
            {"lease_owner": "w1", "query_task_attempt": 1, "result_envelope": "x"},
            "result_envelope",
        ),
        (
            "complete",
            {"lease_owner": "w1", "query_task_attempt": 1, "result_envelope": {"codec": "avro"}},
            "result_envelope.blob",
        ),
        (
            "complete",
            {"lease_owner": "w1", "query_task_attempt": 1, "result_envelope": {"blob": "AAAA"}},
            "result_envelope.codec",
        ),
        (
            "complete",
            {
                "lease_owner": "w1",
                "query_task_attempt": 1,
                "result_envelope": {"codec": "avro", "blob": "not base64!"},
            },
            "result_envelope.blob",
        ),
        ("fail", {"lease_owner": "w1", "query_task_attempt": 1}, "failure"),
        (
            "fail",
            {"lease_owner": "w1", "query_task_attempt": 1, "failure": {"reason": "x"}},
            "failure.message",
        ),
        (
            "fail",
            {"lease_owner": "w1", "query_task_attempt": 1, "failure": {"message": "m", "reason": 5}},
            "failure.reason",
        ),
    ],
)
@scenario
async def test_invalid_report_bodies_are_422_before_any_lookup(
    tmp_path: Path, verb: str, body: dict[str, Any], field: str
) -> None:
    async with world(tmp_path) as w:
        status, doc = await w.report(verb, "01UNKNOWNQUERYTASK", body)
        assert (status, doc["reason"]) == (422, "validation_failed"), doc
        assert field in doc["errors"], doc


@scenario
async def test_a_result_envelope_with_another_codec_is_unsupported(tmp_path: Path) -> None:
    async with started(tmp_path) as w:
        pending, task = await w.leased_query()
        bad = complete_body(task, result=1, result_envelope={"codec": "json", "blob": "MQ=="})
        status, doc = await w.report("complete", task["query_task_id"], bad)
        assert status == 422
        assert doc["errors"]["result_envelope.codec"][0].startswith("unsupported_payload_codec:")
        status, _ = await w.report("complete", task["query_task_id"], complete_body(task, result=1))
        assert status == 200  # the 422 changed nothing
        await within(pending)


@pytest.mark.parametrize(
    "body",
    [{"input": "x"}, {"input": {"codec": "json", "blob": "MQ=="}}, {"input": make_envelope("not-an-array")}],
)
@scenario
async def test_invalid_query_input_is_422_and_creates_no_task(tmp_path: Path, body: dict[str, Any]) -> None:
    async with started(tmp_path) as w:
        status, doc = await within(w.query("status", body))
        assert (status, doc["reason"]) == (422, "validation_failed"), doc
        assert w.count_query_tasks() == 0


@scenario
async def test_query_poll_preconditions(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.register("w1")
        status, doc = await w.worker("/query-tasks/poll", {"task_queue": "orders"})
        assert (status, doc["reason"]) == (422, "validation_failed")
        status, doc = await w.worker("/query-tasks/poll", {"worker_id": "ghost", "task_queue": "orders"})
        assert (status, doc["reason"]) == (412, "worker_not_registered")
        status, doc = await w.worker("/query-tasks/poll", {"worker_id": "w1", "task_queue": "billing"})
        assert (status, doc["reason"]) == (409, "task_queue_mismatch")


def _worker_row(w: World, worker_id: str, namespace: str = "default") -> Any:
    return w.rows("SELECT * FROM workers WHERE namespace = ? AND worker_id = ?", namespace, worker_id)[0]
