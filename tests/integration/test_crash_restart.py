"""Crash and restart: ``kill -9`` the reference server mid-workload, restart it on the same database file.

The workload is real HTTP traffic against ``python -m reference_server`` (a subprocess): several workflows,
each ``start → workflow task (schedule_activity) → activity task → workflow task (complete_workflow)``, driven by
concurrent workers while a starter keeps adding runs. A few leases are taken by a "holder" worker on a queue
nobody else polls and are left live. Then the server gets ``SIGKILL`` while long polls, starts and completes
are in flight.

Every request's outcome goes into a :class:`Ledger`: a 2xx answer is an *acknowledged* state change; a request
that got no answer is "maybe applied" (STYLE.md item 8), so the checks hold for either outcome. After the
kill, and again after a restart on the same file (and a fresh port), the test asserts:

* ``PRAGMA integrity_check`` is ``ok``;
* every acknowledged start still exists with the same run id; every acknowledged ``complete_workflow`` left its
  run completed with exactly the acknowledged output blob; every acknowledged activity completion is in the
  run's history exactly once (invariant 69: one terminal event per attempt and per run);
* an acknowledged lease is still on disk exactly as acknowledged (owner, attempt, expiry) and still belongs to
  its owner until it expires: the owner's heartbeat after the restart either renews it (same attempt) or is
  told it expired at exactly the acknowledged instant;
* nothing is leased twice: no two acknowledged polls ever got the same task attempt, and a task handed out
  after the restart was claimed no earlier than every acknowledged lease on it expired (both instants are the
  server's own timestamps: claim = ``lease_expires_at − lease length``), with an attempt number above every
  acknowledged one — attempt numbers continue, they never reset;
* the workload then finishes: with 2-second leases, leases lost in the crash expire and are redelivered, and
  every run that exists reaches ``completed``.

Nothing sleeps in place of a condition: waits poll durable state (describe) under a deadline, and nothing
asserts on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_server.engine import ts
from suite.protocol.codec import encode_blob
from suite.protocol.fencing import parse_rfc3339
from tests.conftest import ServerProcess

pytestmark = pytest.mark.slow

LEASE_SECONDS = 2
SERVER_ARGS = (
    "--lease-seconds",
    str(LEASE_SECONDS),
    "--activity-lease-seconds",
    str(LEASE_SECONDS),
    "--long-poll-default",
    "1",
)
WORKER_HEADERS = {"X-Durable-Workflow-Protocol-Version": "1.20"}
CONTROL_HEADERS = {"X-Durable-Workflow-Control-Plane-Version": "2"}
QUEUE = "crash-q"
HELD_QUEUE = "held-q"  # only the holder polls it before the crash, so its leases stay exactly as acknowledged
ACTIVITY_TYPE = "charge"
DONE_BEFORE_LOAD = 4  # runs driven to completion before the concurrent load starts
MAX_LOAD_STARTS = 40  # bounds the work the restart must finish
LOAD_COMPLETIONS_BEFORE_KILL = 5
HELD_WORKFLOW_TASKS = 2
HELD_ACTIVITY_TASKS = 2
DEADLINE_SECONDS = 90.0
TERMINAL_ACTIVITY_EVENTS = {"ActivityCompleted", "ActivityFailed", "ActivityTimedOut", "ActivityCancelled"}
TERMINAL_RUN_EVENTS = {"WorkflowCompleted", "WorkflowFailed", "WorkflowCancelled", "WorkflowTerminated"}


def output_blob(workflow_id: str) -> str:
    return encode_blob({"workflow_id": workflow_id, "done": True})


def activity_result(workflow_id: str) -> str:
    return encode_blob(f"charged:{workflow_id}")


class NoAnswer(Exception):
    """The request got no HTTP answer (the server died): it may or may not have been applied."""


# -- the ledger of what the server acknowledged -----------------------------------------------------------


@dataclass(frozen=True)
class WorkflowLease:
    task_id: str
    workflow_id: str
    attempt: int
    owner: str
    expires_at: str


@dataclass(frozen=True)
class ActivityLease:
    task_id: str
    workflow_id: str
    execution_id: str
    attempt_id: str
    attempt_number: int
    owner: str
    expires_at: str


@dataclass
class Ledger:
    started: dict[str, str] = field(default_factory=dict)  # workflow id -> run id (201)
    start_unknown: set[str] = field(default_factory=set)  # start sent, no answer
    workflow_leases: list[WorkflowLease] = field(default_factory=list)
    activity_leases: list[ActivityLease] = field(default_factory=list)
    completed: dict[str, str] = field(default_factory=dict)  # workflow id -> acknowledged output blob
    activity_completed: dict[str, ActivityLease] = field(default_factory=dict)  # attempt id -> lease
    renewed_until: dict[str, list[str]] = field(default_factory=dict)  # task id -> acknowledged renewed expiries
    unanswered: Counter[str] = field(default_factory=Counter)  # route kind -> requests with no answer
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def acked(self) -> None:
        self.progress.set()

    def max_workflow_attempt(self, task_id: str) -> int:
        return max((lease.attempt for lease in self.workflow_leases if lease.task_id == task_id), default=0)

    def max_activity_attempt(self, execution_id: str) -> int:
        return max(
            (lease.attempt_number for lease in self.activity_leases if lease.execution_id == execution_id),
            default=0,
        )


# -- a worker's and an operator's calls ---------------------------------------------------------------------


class Api:
    """One HTTP client; every call returns ``(status, body)`` or raises :class:`NoAnswer`."""

    def __init__(self, url: str, ledger: Ledger) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(20.0))
        self.ledger = ledger

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, kind: str, method: str, path: str, body: Any = None, *, control: bool = False) -> Any:
        headers = CONTROL_HEADERS if control else WORKER_HEADERS
        try:
            response = await self.http.request(method, path, json=body, headers=headers)
        except httpx.TransportError as exc:
            self.ledger.unanswered[kind] += 1
            raise NoAnswer(f"{method} {path}: {exc!r}") from exc
        return response.status_code, response.json()

    async def register(self, worker_id: str, queue: str) -> None:
        status, body = await self.call(
            "register",
            "POST",
            "/api/worker/register",
            {"worker_id": worker_id, "task_queue": queue, "runtime": "python"},
        )
        assert status == 201, body

    async def start(self, workflow_id: str, queue: str) -> str | None:
        try:
            status, body = await self.call(
                "start",
                "POST",
                "/api/workflows",
                {"workflow_type": "orders", "workflow_id": workflow_id, "task_queue": queue, "input": [workflow_id]},
                control=True,
            )
        except NoAnswer:
            self.ledger.start_unknown.add(workflow_id)
            raise
        assert status == 201, body
        self.ledger.started[workflow_id] = body["run_id"]
        self.ledger.acked()
        return str(body["run_id"])

    async def describe(self, workflow_id: str) -> tuple[int, dict[str, Any]]:
        status, body = await self.call("describe", "GET", f"/api/workflows/{workflow_id}", control=True)
        return int(status), body

    async def history(self, workflow_id: str) -> list[dict[str, Any]]:
        status, run = await self.describe(workflow_id)
        assert status == 200, run
        events: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            path = f"/api/workflows/{workflow_id}/runs/{run['run_id']}/history?page_size=1000"
            if token:
                path += f"&next_page_token={token}"
            status, body = await self.call("history", "GET", path, control=True)
            assert status == 200, body
            events.extend(body["events"])
            token = body["next_page_token"]
            if not token:
                return events

    # -- tasks

    async def poll(self, kind: str, worker_id: str, queue: str) -> Any:
        """A one-second poll for a ``kind`` ("workflow" or "activity") task: the task leased, or None."""
        body = {"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 1}
        status, answer = await self.call(f"{kind}-poll", "POST", f"/api/worker/{kind}-tasks/poll", body)
        assert status == 200, answer
        return answer["task"]

    async def report(
        self, verb: str, lease: WorkflowLease | ActivityLease, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """A ``verb`` (complete or heartbeat) of ``lease``'s task, with the fields that prove the lease (§8.9)."""
        if isinstance(lease, WorkflowLease):
            kind, fence = "workflow", {"lease_owner": lease.owner, "workflow_task_attempt": lease.attempt}
        else:
            kind, fence = "activity", {"lease_owner": lease.owner, "activity_attempt_id": lease.attempt_id}
        path = f"/api/worker/{kind}-tasks/{lease.task_id}/{verb}"
        status, answer = await self.call(f"{kind}-{verb}", "POST", path, {**fence, **(body or {})})
        return int(status), answer

    # -- workflow tasks

    async def poll_workflow(self, worker_id: str, queue: str) -> tuple[WorkflowLease, dict[str, Any]] | None:
        task = await self.poll("workflow", worker_id, queue)
        if task is None:
            return None
        assert not task["has_more"], "the test's histories fit in the first page"
        lease = WorkflowLease(
            task["task_id"],
            task["workflow_id"],
            task["workflow_task_attempt"],
            task["lease_owner"],
            task["lease_expires_at"],
        )
        self.ledger.workflow_leases.append(lease)
        self.ledger.acked()
        return lease, task

    async def complete_workflow_task(self, lease: WorkflowLease, commands: list[dict[str, Any]]) -> int:
        status, body = await self.report("complete", lease, {"commands": commands})
        assert status in (200, 409), body  # 409: the lease ran out under a slow machine; it will be redelivered
        if status == 200:
            for command in commands:
                if command["type"] == "complete_workflow":
                    self.ledger.completed[lease.workflow_id] = command["result"]["blob"]
            self.ledger.acked()
        return status

    # -- activity tasks

    async def poll_activity(self, worker_id: str, queue: str) -> ActivityLease | None:
        task = await self.poll("activity", worker_id, queue)
        if task is None:
            return None
        lease = ActivityLease(
            task["task_id"],
            task["workflow_id"],
            task["activity_execution_id"],
            task["activity_attempt_id"],
            task["attempt_number"],
            task["lease_owner"],
            task["lease_expires_at"],
        )
        self.ledger.activity_leases.append(lease)
        self.ledger.acked()
        return lease

    async def complete_activity(self, lease: ActivityLease) -> int:
        result = {"codec": "avro", "blob": activity_result(lease.workflow_id)}
        status, body = await self.report("complete", lease, {"result": result})
        assert status in (200, 409), body
        if status == 200:
            self.ledger.activity_completed[lease.attempt_id] = lease
            self.ledger.acked()
        return status


def next_commands(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The workflow's code: schedule one activity, then finish with a result derived from the workflow id."""
    types = [event["event_type"] for event in task["history_events"]]
    if "ActivityCompleted" in types:
        return [{"type": "complete_workflow", "result": {"codec": "avro", "blob": output_blob(task["workflow_id"])}}]
    if "ActivityScheduled" not in types:
        arguments = {"codec": "avro", "blob": encode_blob([task["workflow_id"]])}
        return [{"type": "schedule_activity", "activity_type": ACTIVITY_TYPE, "arguments": arguments}]
    return []  # the activity is still running: nothing to do (the run waits)


async def workflow_step(api: Api, worker_id: str, queue: str) -> bool:
    leased = await api.poll_workflow(worker_id, queue)
    if leased is None:
        return False
    lease, task = leased
    await api.complete_workflow_task(lease, next_commands(task))
    return True


async def activity_step(api: Api, worker_id: str, queue: str) -> bool:
    lease = await api.poll_activity(worker_id, queue)
    if lease is None:
        return False
    await api.complete_activity(lease)
    return True


async def work_until(stop: Callable[[], bool], step: Callable[[], Any]) -> None:
    """Run one worker's poll/complete loop until ``stop()`` or until a request goes unanswered."""
    try:
        while not stop():
            await step()
    except NoAnswer:
        return


async def wait_for(condition: Callable[[], bool], ledger: Ledger, what: str, seconds: float = DEADLINE_SECONDS) -> None:
    """Wait until ``condition()`` holds, re-checking whenever a request is acknowledged; fail at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        remaining = deadline - loop.time()
        assert remaining > 0, f"timed out waiting for {what}"
        ledger.progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ledger.progress.wait(), remaining)


# -- checks on the database file ------------------------------------------------------------------------------


def rfc3339_us(value: int) -> str:
    out = ts(value)
    assert out is not None
    return out


def check_database_file(db: Path, ledger: Ledger, held_wf: list[WorkflowLease], held_act: list[ActivityLease]) -> None:
    """Straight after the kill, before anything reopened the file through the server."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        for lease in held_wf:
            row = conn.execute(
                "SELECT status, lease_owner, attempt, lease_expires_at FROM workflow_tasks WHERE task_id = ?",
                (lease.task_id,),
            ).fetchone()
            assert row is not None, lease
            assert (row[0], row[1], row[2], rfc3339_us(row[3])) == (
                "leased",
                lease.owner,
                lease.attempt,
                lease.expires_at,
            )
        for act in held_act:
            row = conn.execute(
                "SELECT t.status, t.current_attempt_id, a.lease_owner, a.attempt_number, a.lease_expires_at, a.status"
                " FROM activity_tasks t JOIN activity_attempts a ON a.attempt_id = t.current_attempt_id"
                " WHERE t.task_id = ?",
                (act.task_id,),
            ).fetchone()
            assert row is not None, act
            assert (row[0], row[1], row[2], row[3], rfc3339_us(row[4]), row[5]) == (
                "leased",
                act.attempt_id,
                act.owner,
                act.attempt_number,
                act.expires_at,
                "running",
            )
        # Attempt numbers on disk never fall behind what was acknowledged.
        for task_id, attempt in conn.execute("SELECT task_id, attempt FROM workflow_tasks"):
            assert attempt >= ledger.max_workflow_attempt(task_id), task_id
        for execution_id, count in conn.execute("SELECT execution_id, attempt_count FROM activity_executions"):
            assert count >= ledger.max_activity_attempt(execution_id), execution_id
    conn.close()


def check_no_double_lease(ledger: Ledger) -> None:
    """No two acknowledged polls ever got the same workflow-task attempt or activity attempt."""
    wf = Counter((lease.task_id, lease.attempt) for lease in ledger.workflow_leases)
    assert [key for key, n in wf.items() if n > 1] == []
    act = Counter(lease.attempt_id for lease in ledger.activity_leases)
    assert [key for key, n in act.items() if n > 1] == []
    numbers = Counter((lease.execution_id, lease.attempt_number) for lease in ledger.activity_leases)
    assert [key for key, n in numbers.items() if n > 1] == []


def claimed_at(lease_expires_at: str) -> Any:
    """The server's own claim instant: it sets ``lease_expires_at = now + lease length`` (§9)."""
    return parse_rfc3339(lease_expires_at) - timedelta(seconds=LEASE_SECONDS)


# -- the test ---------------------------------------------------------------------------------------------------


def test_kill_9_mid_workload_loses_nothing_acknowledged_and_the_workload_finishes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    db = tmp_path / "crash.sqlite"
    first = server_factory(*SERVER_ARGS, db=db)
    ledger = Ledger()

    async def scenario() -> None:
        held_wf, held_act = await before_the_crash(first, ledger, db)
        second = server_factory(*SERVER_ARGS, db=db)  # the same file, a fresh port
        await after_the_restart(second, ledger, db, held_wf, held_act)

    asyncio.run(scenario())


async def before_the_crash(
    server: ServerProcess, ledger: Ledger, db: Path
) -> tuple[list[WorkflowLease], list[ActivityLease]]:
    api = Api(server.url, ledger)
    await api.register("wf-a", QUEUE)
    await api.register("act-a", QUEUE)
    await api.register("holder", HELD_QUEUE)

    # 1. A few runs driven all the way to completion, one at a time.
    for i in range(DONE_BEFORE_LOAD):
        await api.start(f"done-{i}", QUEUE)
        assert await workflow_step(api, "wf-a", QUEUE)
        assert await activity_step(api, "act-a", QUEUE)
        assert await workflow_step(api, "wf-a", QUEUE)
    assert len(ledger.completed) == DONE_BEFORE_LOAD

    # 2. Runs on the held queue, brought to the point where the holder will lease their tasks.
    for i in range(HELD_ACTIVITY_TASKS):
        await api.start(f"held-act-{i}", HELD_QUEUE)
        assert await workflow_step(api, "holder", HELD_QUEUE)  # schedules the activity
    for i in range(HELD_WORKFLOW_TASKS):
        await api.start(f"held-wf-{i}", HELD_QUEUE)

    # 3. Concurrent load: a starter and four workers, each with its own connection.
    stop = False
    clients = [Api(server.url, ledger) for _ in range(5)]
    await clients[1].register("wf-b", QUEUE)
    await clients[3].register("act-b", QUEUE)

    async def starter(client: Api) -> None:
        try:
            for i in range(MAX_LOAD_STARTS):
                await client.start(f"load-{i}", QUEUE)
        except NoAnswer:
            return

    load_completions = len(ledger.completed)
    tasks = [
        asyncio.create_task(starter(clients[0])),
        asyncio.create_task(work_until(lambda: stop, lambda: workflow_step(clients[1], "wf-b", QUEUE))),
        asyncio.create_task(work_until(lambda: stop, lambda: workflow_step(clients[2], "wf-a", QUEUE))),
        asyncio.create_task(work_until(lambda: stop, lambda: activity_step(clients[3], "act-b", QUEUE))),
        asyncio.create_task(work_until(lambda: stop, lambda: activity_step(clients[4], "act-a", QUEUE))),
    ]
    await wait_for(
        lambda: len(ledger.completed) >= load_completions + LOAD_COMPLETIONS_BEFORE_KILL, ledger, "load completions"
    )

    # 4. The holder leases tasks and keeps them: these acknowledged leases must survive the crash as they are.
    held_act = [lease for _ in range(HELD_ACTIVITY_TASKS) if (lease := await api.poll_activity("holder", HELD_QUEUE))]
    held_wf = [
        leased[0] for _ in range(HELD_WORKFLOW_TASKS) if (leased := await api.poll_workflow("holder", HELD_QUEUE))
    ]
    assert len(held_act) == HELD_ACTIVITY_TASKS
    assert len(held_wf) == HELD_WORKFLOW_TASKS

    # 5. kill -9 while the workers' long polls, completes and the starter's requests are in flight.
    server.proc.kill()
    server.proc.wait(timeout=10)
    stop = True
    await asyncio.gather(*tasks)
    for client in [api, *clients]:
        await client.close()
    assert sum(ledger.unanswered.values()) > 0, "the kill must interrupt requests in flight"

    check_no_double_lease(ledger)
    check_database_file(db, ledger, held_wf, held_act)
    return held_wf, held_act


async def after_the_restart(
    server: ServerProcess, ledger: Ledger, db: Path, held_wf: list[WorkflowLease], held_act: list[ActivityLease]
) -> None:
    api = Api(server.url, ledger)
    try:
        # An acknowledged lease still belongs to its owner until it expires: the owner's heartbeat renews it,
        # or — when the restart took longer than the lease — is refused for expiry at exactly that instant.
        for lease in held_wf:
            status, body = await api.report("heartbeat", lease)
            if status == 200:
                assert (body["workflow_task_attempt"], body["lease_owner"]) == (lease.attempt, lease.owner), body
                ledger.renewed_until.setdefault(lease.task_id, []).append(body["lease_expires_at"])
            else:
                assert (status, body["reason"]) == (409, "lease_expired"), body
                assert (body["lease_owner"], body["lease_expires_at"]) == (lease.owner, lease.expires_at), body
        for act in held_act:
            status, body = await api.report("heartbeat", act)
            assert status == 200, body
            assert body["activity_attempt_id"] == act.attempt_id, body
            if body["heartbeat_recorded"]:
                ledger.renewed_until.setdefault(act.task_id, []).append(body["lease_expires_at"])
            elif body["lease_expires_at"] is None:
                # The restart took longer than the lease: the heartbeat closed the attempt as expired (a closed
                # attempt holds no lease) — only once the acknowledged lease had run out (one host, one clock).
                assert body["can_continue"] is False, body
                assert datetime.now(UTC) >= parse_rfc3339(act.expires_at), (act, body)
            else:
                assert body["lease_expires_at"] == act.expires_at, body

        # Everything acknowledged before the crash is still there.
        for workflow_id, run_id in ledger.started.items():
            status, body = await api.describe(workflow_id)
            assert status == 200, (workflow_id, body)
            assert body["run_id"] == run_id
        for workflow_id, blob in ledger.completed.items():
            status, body = await api.describe(workflow_id)
            assert (body["status"], body["output_envelope"]) == ("completed", {"codec": "avro", "blob": blob})

        # Drive every run that exists to completion, checking each lease handed out against the ledger.
        pending = set(ledger.started)
        for workflow_id in sorted(ledger.start_unknown):
            status, _ = await api.describe(workflow_id)
            assert status in (200, 404)
            if status == 200:
                pending.add(workflow_id)
        await drive_to_completion(server, ledger, pending)

        check_no_double_lease(ledger)
        for workflow_id in sorted(set(ledger.started) | pending):
            await check_final_history(api, ledger, workflow_id)
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()
    finally:
        await api.close()


async def drive_to_completion(server: ServerProcess, ledger: Ledger, pending: set[str]) -> None:
    known_wf = {lease.task_id: ledger.max_workflow_attempt(lease.task_id) for lease in ledger.workflow_leases}
    known_act = {
        lease.execution_id: ledger.max_activity_attempt(lease.execution_id) for lease in ledger.activity_leases
    }
    # Every acknowledged lease expiry per task: from polls, and from the holder's renewals after the restart.
    expiries: dict[str, list[str]] = {task_id: list(until) for task_id, until in ledger.renewed_until.items()}
    for lease in ledger.workflow_leases:
        expiries.setdefault(lease.task_id, []).append(lease.expires_at)
    for act in ledger.activity_leases:
        expiries.setdefault(act.task_id, []).append(act.expires_at)
    fresh = len(ledger.workflow_leases), len(ledger.activity_leases)

    def check_new_leases() -> None:
        # A task leased before the crash is handed out again only after every acknowledged lease on it expired,
        # with the next attempt number.
        for lease in ledger.workflow_leases[fresh[0] :]:
            if lease.task_id in known_wf:
                assert lease.attempt > known_wf[lease.task_id], lease
                for expiry in expiries[lease.task_id]:
                    assert claimed_at(lease.expires_at) >= parse_rfc3339(expiry), (lease, expiry)
        for act in ledger.activity_leases[fresh[1] :]:
            if act.execution_id in known_act:
                assert act.attempt_number > known_act[act.execution_id], act
            for expiry in expiries.get(act.task_id, []):
                assert claimed_at(act.expires_at) >= parse_rfc3339(expiry), (act, expiry)

    monitor = Api(server.url, ledger)
    clients = [Api(server.url, ledger) for _ in range(4)]
    await clients[0].register("rescue-wf", QUEUE)
    await clients[1].register("rescue-act", QUEUE)
    await clients[2].register("rescue-held-wf", HELD_QUEUE)
    await clients[3].register("rescue-held-act", HELD_QUEUE)
    done = False
    workers = [
        asyncio.create_task(work_until(lambda: done, lambda: workflow_step(clients[0], "rescue-wf", QUEUE))),
        asyncio.create_task(work_until(lambda: done, lambda: activity_step(clients[1], "rescue-act", QUEUE))),
        asyncio.create_task(work_until(lambda: done, lambda: workflow_step(clients[2], "rescue-held-wf", HELD_QUEUE))),
        asyncio.create_task(work_until(lambda: done, lambda: activity_step(clients[3], "rescue-held-act", HELD_QUEUE))),
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_SECONDS
    try:
        while pending:
            for workflow_id in sorted(pending):
                status, body = await monitor.describe(workflow_id)
                assert status == 200, body
                if body["status"] == "completed":
                    pending.discard(workflow_id)
            check_new_leases()
            for worker in workers:
                if worker.done():
                    worker.result()  # a failed assertion inside a worker fails the test here
                    raise AssertionError("a worker stopped before the workload finished")
            remaining = deadline - loop.time()
            assert remaining > 0, f"runs never completed after the restart: {sorted(pending)}"
            ledger.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ledger.progress.wait(), min(remaining, 1.0))
    finally:
        done = True
        await asyncio.gather(*workers, return_exceptions=True)
        for client in [monitor, *clients]:
            await client.close()
    for worker in workers:
        worker.result()
    check_new_leases()


async def check_final_history(api: Api, ledger: Ledger, workflow_id: str) -> None:
    status, run = await api.describe(workflow_id)
    assert (status, run["status"]) == (200, "completed"), run
    expected = ledger.completed.get(workflow_id, output_blob(workflow_id))
    assert run["output_envelope"] == {"codec": "avro", "blob": expected}, run
    events = await api.history(workflow_id)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    types = Counter(e["event_type"] for e in events)
    assert sum(types[t] for t in TERMINAL_RUN_EVENTS) == 1, types
    assert types["WorkflowCompleted"] == 1, types
    assert types["ActivityScheduled"] == 1, types
    terminal_per_attempt = Counter(
        e["payload"]["activity_attempt_id"] for e in events if e["event_type"] in TERMINAL_ACTIVITY_EVENTS
    )
    assert all(n == 1 for n in terminal_per_attempt.values()), terminal_per_attempt
    completed = [e["payload"] for e in events if e["event_type"] == "ActivityCompleted"]
    assert len(completed) == 1, types
    for attempt_id, lease in ledger.activity_completed.items():
        if lease.workflow_id == workflow_id:
            assert completed[0]["activity_attempt_id"] == attempt_id
            assert completed[0]["result"] == activity_result(workflow_id)


def test_kill_9_keeps_worker_sessions_and_cooperative_requests(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A session acknowledged before ``kill -9`` is there after the restart, with its owner, and still fences
    another worker; a cooperative cancellation request acknowledged before it still reaches the child."""
    db = tmp_path / "sessions.sqlite"
    headers = {"X-Durable-Workflow-Protocol-Version": "1.20"}
    control = {"X-Durable-Workflow-Control-Plane-Version": "2"}

    def post(url: str, path: str, body: dict[str, Any], *, worker: bool = True) -> httpx.Response:
        return httpx.post(url + path, json=body, headers=headers if worker else control, timeout=10)

    first = server_factory(db=db)
    for wid, queue in (("holder", "sq"), ("other", "sq"), ("wf-worker", "q"), ("kid-worker", "cq")):
        reply = post(first.url, "/api/worker/register", {"worker_id": wid, "task_queue": queue, "runtime": "python"})
        assert reply.status_code == 201, reply.text
    created = post(first.url, "/api/worker/sessions", {"worker_id": "holder", "session_id": "s1", "lease_seconds": 600})
    assert created.status_code == 201, created.text
    started = post(
        first.url, "/api/workflows", {"workflow_type": "p", "workflow_id": "parent", "task_queue": "q"}, worker=False
    )
    assert started.status_code == 201, started.text
    task = post(first.url, "/api/worker/workflow-tasks/poll", {"worker_id": "wf-worker", "task_queue": "q"}).json()
    kid = {
        "type": "start_child_workflow",
        "workflow_type": "k",
        "queue": "cq",
        "parent_close_policy": "request_cancellation",
    }
    done = post(
        first.url,
        f"/api/worker/workflow-tasks/{task['task']['task_id']}/complete",
        {
            "lease_owner": "wf-worker",
            "workflow_task_attempt": task["task"]["workflow_task_attempt"],
            "commands": [kid, {"type": "complete_workflow"}],
        },
    )
    assert done.status_code == 200, done.text
    first.proc.kill()  # kill -9, straight after the acknowledgements
    first.proc.wait(10)

    second = server_factory(db=db)
    again = post(second.url, "/api/worker/sessions/s1/heartbeat", {"worker_id": "holder"})
    assert (again.status_code, again.json()["session"]["lease_owner"]) == (200, "holder"), again.text
    stolen = post(second.url, "/api/worker/sessions", {"worker_id": "other", "session_id": "s1"})
    assert (stolen.status_code, stolen.json()["reason"]) == (409, "session_owned_by_another_worker")
    child = post(second.url, "/api/worker/workflow-tasks/poll", {"worker_id": "kid-worker", "task_queue": "cq"}).json()
    assert child["task"]["cancel_requested"] is True
    assert child["task"]["cancellation_request"]["request_id"]
