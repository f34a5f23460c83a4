"""The official Python SDK runs real workflows against the reference server.

SDK under test: PyPI ``durable-workflow`` **2.12.0** (``durable_workflow.__version__``), used only through
its public API, the way its README shows:

* ``Client(base_url, namespace="default")`` — the bare origin; the SDK adds ``/api`` itself. No token: the
  server runs without auth. The Client does one ``GET /api/cluster/info`` before its first payload-carrying
  request (Python SDK 2.12.0, Worker handshake).
* ``Worker(client, task_queue=…, workflows=[…], activities=[…], poll_timeout=1)`` started with
  ``Worker.run()`` as an asyncio task and stopped with ``Worker.stop()``. ``run()`` first checks
  ``cluster/info`` (control-plane version 2, worker protocol 1.20, the auth composition contract), then
  keeps three long polls open (workflow, activity, and query tasks on a thread of its own) and
  deregisters on stop with ``DELETE /api/worker/registrations/{id}``. ``poll_timeout=1`` makes every poll
  ``timeout_seconds: 1``, so a stop never waits on a long poll.
* Workflows are ``@workflow.defn`` classes whose synchronous ``run(self, ctx, …)`` yields durable commands:
  ``ctx.schedule_activity(type, args, retry_policy=ActivityRetryPolicy(…))``, ``ctx.wait_condition(pred,
  key=…)`` (the ``open_condition_wait`` command), ``ctx.sleep(seconds)`` (``start_timer``);
  ``@workflow.signal`` / ``@workflow.query`` methods are replayed from history.
* Activities are ``@activity.defn`` functions; ``activity.context().info.attempt_number`` is the server's
  ``attempt_number`` of the leased attempt (retries are server-side, Python SDK 2.12.0, Replay).
* Results come from ``WorkflowHandle.result()`` (``Client.get_result``: describe until terminal, then the
  newest terminal history event); ``WorkflowHandle.query`` returns the raw response dict (``["result"]``).

What the runs show about the server (checked against the SDK's replay code): a history that opens with
``StartAccepted`` before ``WorkflowStarted`` replays fine (the SDK skips events it does not interpret);
steps carry the per-run ``sequence``; ``ActivityRetryScheduled`` between attempts is ignored by replay and only
the final attempt's ``ActivityFailed`` reaches the workflow; the SDK's ``WorkflowTaskWaitingForHistory``
task failure is a normal finish. Every SDK WARNING (other than an activity's own failure) fails the test,
because the Worker logs rather than raises most protocol trouble.

The server is a subprocess (``python -m reference_server --port 0``), shared by the module; every test uses
its own task queue and workflow id. Every wait has a deadline and polls durable state (describe or
history); no sleep stands in for a condition, and nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

durable_workflow = pytest.importorskip("durable_workflow")

from durable_workflow import (  # noqa: E402  (after the importorskip guard)
    ActivityFailed,
    Client,
    Worker,
    WorkflowCancelled,
    WorkflowHandle,
    activity,
    workflow,
)
from durable_workflow.workflow import ActivityRetryPolicy  # noqa: E402

pytestmark = [pytest.mark.sdk, pytest.mark.slow]

T = TypeVar("T")

SDK_VERSION = "2.12.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Hang guards, not performance assertions: a healthy run finishes each of these in a few seconds.
SERVER_START_DEADLINE = 20.0
SERVER_STOP_DEADLINE = 10.0
WAIT_DEADLINE = 20.0
TEST_DEADLINE = 60.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, TEST_DEADLINE))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# -- the server subprocess ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceServer:
    url: str
    # ``--event-log``: every committed lifecycle transition as one JSON line; the only place a workflow-task
    # *failure* is observable from outside (it adds no history).
    event_log: Path

    def transitions(self) -> list[dict[str, Any]]:
        text = self.event_log.read_text(encoding="utf-8") if self.event_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


@contextlib.contextmanager
def reference_server_process(tmp: Path, *extra_args: str) -> Iterator[str]:
    """``python -m reference_server`` on a free port with ``extra_args``; yields the URL (its first stdout
    line) and on exit asserts a clean SIGTERM shutdown."""
    stderr_path = tmp / "server.stderr"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "reference_server", "--port", "0", "--db", str(tmp / "db.sqlite"), *extra_args]
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(SERVER_START_DEADLINE)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            proc.kill()
            proc.wait(SERVER_STOP_DEADLINE)
            pytest.fail(
                f"the reference server did not print its URL within {SERVER_START_DEADLINE}s "
                f"(exit code {proc.returncode}); stderr:\n{stderr_path.read_text(errors='replace')}"
            )
        yield line
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(SERVER_STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(SERVER_STOP_DEADLINE)
        proc.stdout.close()
    assert proc.returncode == 0, (
        f"the reference server exited with {proc.returncode} on SIGTERM; stderr:\n"
        f"{stderr_path.read_text(errors='replace')}"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    """Start ``python -m reference_server`` on a free port; its first stdout line is the URL."""
    tmp = tmp_path_factory.mktemp("sdk-interop")
    event_log = tmp / "events.jsonl"
    with reference_server_process(tmp, "--event-log", str(event_log), "--query-timeout", "10") as url:
        yield ReferenceServer(url=url, event_log=event_log)


@pytest.fixture
def server_url(server: ReferenceServer) -> str:
    return server.url


# -- activities -----------------------------------------------------------------------------------------

# Attempt numbers each activity saw, keyed by the key the workflow passes in (sync activities run on
# worker threads; list.append is atomic).
ATTEMPTS: dict[str, list[int]] = {}


@activity.defn(name="interop.greet")
def greet(name: str) -> str:
    return f"hello, {name}"


@activity.defn(name="interop.flaky")
def flaky(key: str, failures: int) -> str:
    attempt = activity.context().info.attempt_number
    ATTEMPTS.setdefault(key, []).append(attempt)
    if attempt <= failures:
        raise RuntimeError(f"flaky failure on attempt {attempt}")
    return f"succeeded on attempt {attempt}"


# A gated activity: it reports that it started and blocks until the test opens its gate.
STARTED: dict[str, threading.Event] = {}
GATES: dict[str, threading.Event] = {}


@activity.defn(name="interop.gated")
def gated(key: str) -> str:
    STARTED[key].set()
    if not GATES[key].wait(WAIT_DEADLINE):
        raise RuntimeError("the test never opened the gate")
    return "gate opened"


# -- workflows ------------------------------------------------------------------------------------------


@workflow.defn(name="interop.approval")
class ApprovalWorkflow:
    """Activity → wait for the ``approve`` signal (answering ``stage`` queries) → 1 s timer → result."""

    def __init__(self) -> None:
        self.stage = "started"
        self.approved_by: str | None = None

    @workflow.signal("approve")
    def approve(self, by: str) -> None:
        self.approved_by = by

    @workflow.query("stage")
    def get_stage(self) -> dict[str, Any]:
        return {"stage": self.stage, "approved_by": self.approved_by}

    def run(self, ctx: Any, name: str) -> Any:
        greeting = yield ctx.schedule_activity("interop.greet", [name])
        self.stage = "awaiting-approval"
        yield ctx.wait_condition(lambda: self.approved_by is not None, key="approval")
        self.stage = "sleeping"
        yield ctx.sleep(1)
        return {"greeting": greeting, "approved_by": self.approved_by}


@workflow.defn(name="interop.retry")
class RetryWorkflow:
    """Calls ``interop.flaky`` under a 3-attempt retry policy; reports success or the ActivityFailed."""

    def run(self, ctx: Any, key: str, failures: int) -> Any:
        policy = ActivityRetryPolicy(max_attempts=3, backoff_seconds=[1, 0])
        try:
            result = yield ctx.schedule_activity("interop.flaky", [key, failures], retry_policy=policy)
        except ActivityFailed as failure:
            return {"outcome": "failed", "message": str(failure), "exception_type": failure.exception_type}
        return {"outcome": "completed", "result": result}


@workflow.defn(name="interop.counter")
class CounterWorkflow:
    """A condition satisfied by the second signal (the first one re-opens the wait), then a condition
    that times out after 1 s (``TimerFired{timer_kind: condition_timeout}`` → ``ConditionWaitTimedOut``)."""

    def __init__(self) -> None:
        self.bumps = 0

    @workflow.signal("bump")
    def bump(self) -> None:
        self.bumps += 1

    def run(self, ctx: Any) -> Any:
        reached = yield ctx.wait_condition(lambda: self.bumps >= 2, key="two-bumps")
        more = yield ctx.wait_condition(lambda: self.bumps >= 3, key="third-bump", timeout=1)
        return {"bumps": self.bumps, "reached": reached, "more": more}


@workflow.defn(name="interop.gated")
class GatedWorkflow:
    """One activity; a signal that arrives while it runs wakes the run with nothing new to do."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @workflow.signal("note")
    def note(self, text: str) -> None:
        self.notes.append(text)

    def run(self, ctx: Any, key: str) -> Any:
        result = yield ctx.schedule_activity("interop.gated", [key])
        return {"activity": result, "notes": self.notes}


@workflow.defn(name="interop.cancellable")
class CancellableWorkflow:
    """Waits for a signal that never comes."""

    def __init__(self) -> None:
        self.released = False

    @workflow.signal("release")
    def release(self) -> None:
        self.released = True

    def run(self, ctx: Any) -> Any:
        yield ctx.wait_condition(lambda: self.released, key="release")
        return "released"


# -- SDK log guard --------------------------------------------------------------------------------------

# The Worker swallows and logs most protocol trouble (a rejected completion, a poll error it backs off from,
# a dropped query task) instead of raising it, so a scenario could pass by luck while the SDK complains.
# Every WARNING or worse from the SDK fails the test, except the one an activity that raises must log.
EXPECTED_SDK_LOGS = frozenset({"activity failed"})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def no_sdk_complaints() -> Iterator[None]:
    handler = _Records()
    logger = logging.getLogger("durable_workflow")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    unexpected = [
        f"{r.levelname} {r.name}: {r.getMessage()}" for r in handler.records if r.msg not in EXPECTED_SDK_LOGS
    ]
    assert not unexpected, "the SDK logged trouble with the server:\n" + "\n".join(unexpected)


# -- helpers --------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_worker(
    client: Client,
    task_queue: str,
    *,
    workflows: list[type],
    activities: list[Callable[..., Any]],
    capabilities: tuple[str, ...] = (),
) -> AsyncIterator[tuple[Worker, asyncio.Task[None]]]:
    """``Worker.run()`` as a task; on exit ``stop()`` (which deregisters) and the task's own outcome."""
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=workflows,
        activities=activities,
        poll_timeout=1,
        shutdown_timeout=15,
        capabilities=capabilities,
    )
    task = asyncio.create_task(worker.run())
    try:
        yield worker, task
    finally:
        await worker.stop()
        await asyncio.wait_for(task, WAIT_DEADLINE)


@contextlib.asynccontextmanager
async def started(
    url: str,
    workflow: type,
    workflow_type: str,
    input: list[Any],
    *,
    workflow_id: str,
    activities: tuple[Callable[..., Any], ...] = (),
) -> AsyncIterator[tuple[WorkflowHandle, asyncio.Task[None]]]:
    """A run of ``workflow`` (registered as ``workflow_type``) started with ``input``, served by a worker of its
    own on a fresh task queue; yields the run's handle and the worker's task."""
    queue = unique(f"{workflow_id}-q")
    async with (
        Client(url, namespace="default") as client,
        running_worker(client, queue, workflows=[workflow], activities=list(activities)) as (_, task),
    ):
        handle = await client.start_workflow(
            workflow_type=workflow_type, task_queue=queue, workflow_id=workflow_id, input=input
        )
        yield handle, task


async def history_events(handle: WorkflowHandle) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = await handle.get_history(page_size=1000, next_page_token=token)
        events.extend(page["events"])
        token = page.get("next_page_token")
        if not token:
            return events


async def poll_until(
    worker_task: asyncio.Task[None],
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    missing: Callable[[T], str],
) -> T:
    """``probe()`` again until ``done`` holds of its answer, which is returned; fails when the worker stops on
    its own, or after :data:`WAIT_DEADLINE` (``missing(answer)`` says what never came)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_DEADLINE
    while True:
        if worker_task.done():
            worker_task.result()  # surface the worker's error
            pytest.fail("the worker stopped on its own")
        answer = await probe()
        if done(answer):
            return answer
        if loop.time() > deadline:
            pytest.fail(f"after {WAIT_DEADLINE}s: {missing(answer)}")
        await asyncio.sleep(0.05)


async def wait_for_event(
    handle: WorkflowHandle, worker_task: asyncio.Task[None], event_type: str
) -> list[dict[str, Any]]:
    """Poll the run's history until ``event_type`` appears (or the worker dies, or the deadline passes)."""
    return await poll_until(
        worker_task,
        lambda: history_events(handle),
        lambda events: event_type in event_types(events),
        lambda events: f"no {event_type}; history: {event_types(events)}",
    )


async def wait_for_workflow_task_failure(server: ReferenceServer, run_id: str, worker_task: asyncio.Task[None]) -> None:
    """Poll the server's event log until a workflow task of ``run_id`` moved to ``failed``."""

    async def transitions() -> list[dict[str, Any]]:
        return server.transitions()

    def failed(transitions: list[dict[str, Any]]) -> bool:
        tasks = {t["id"] for t in transitions if t["entity"] == "workflow_task" and t.get("run_id") == run_id}
        return any(t["entity"] == "workflow_task" and t["id"] in tasks and t["to"] == "failed" for t in transitions)

    await poll_until(worker_task, transitions, failed, lambda _: f"no workflow task of run {run_id} failed")


async def active_worker_ids(client: Client) -> set[str]:
    info = await client.get_cluster_info()
    return {w["worker_id"] for w in info["worker_fleet"]["workers"]}


def event_types(events: list[dict[str, Any]]) -> list[str]:
    return [e["event_type"] for e in events]


# -- tests ----------------------------------------------------------------------------------------------


def test_sdk_version_is_the_one_the_interop_spec_describes() -> None:
    assert durable_workflow.__version__ == SDK_VERSION


def test_activity_signal_query_and_timer_workflow(server_url: str) -> None:
    async def scenario() -> None:
        wid = unique("interop-approval")
        async with started(
            server_url, ApprovalWorkflow, "interop.approval", ["world"], workflow_id=wid, activities=(greet,)
        ) as (handle, task):
            await wait_for_event(handle, task, "ConditionWaitOpened")

            answer = await handle.query("stage")
            assert answer["result"] == {"stage": "awaiting-approval", "approved_by": None}

            await handle.signal("approve", ["alice"])
            result = await handle.result(timeout=WAIT_DEADLINE)
            assert result == {"greeting": "hello, world", "approved_by": "alice"}

            described = await handle.describe()
            assert described.status == "completed"
            types = event_types(await history_events(handle))
            for expected in (
                "ActivityCompleted",
                "SignalReceived",
                "ConditionWaitSatisfied",
                "TimerScheduled",
                "TimerFired",
                "WorkflowCompleted",
            ):
                assert expected in types, f"{expected} missing from {types}"
            assert types.index("ConditionWaitSatisfied") < types.index("TimerScheduled")

    run(scenario())


@pytest.mark.parametrize(
    ("failures", "outcome", "final"),
    [
        pytest.param(
            2, {"outcome": "completed", "result": "succeeded on attempt 3"}, "ActivityCompleted", id="until-it-succeeds"
        ),
        pytest.param(
            99,
            {"outcome": "failed", "message": "flaky failure on attempt 3", "exception_type": "RuntimeError"},
            "ActivityFailed",
            id="exhausted-surface-as-activity-failed",
        ),
    ],
)
def test_activity_retried_by_the_server(server_url: str, failures: int, outcome: dict[str, Any], final: str) -> None:
    async def scenario() -> None:
        wid = unique("interop-retry")
        async with started(
            server_url, RetryWorkflow, "interop.retry", [wid, failures], workflow_id=wid, activities=(flaky,)
        ) as (handle, _):
            assert await handle.result(timeout=WAIT_DEADLINE) == outcome
            assert ATTEMPTS[wid] == [1, 2, 3]
            types = event_types(await history_events(handle))
            # Only the final attempt's outcome is in the history: an intermediate attempt leaves no
            # ActivityFailed (Python SDK 2.12.0, Replay), replay would throw it.
            assert [t for t in types if t in ("ActivityCompleted", "ActivityFailed")] == [final], types

    run(scenario())


def test_condition_wait_reopened_then_timed_out(server_url: str) -> None:
    async def scenario() -> None:
        wid = unique("interop-counter")
        async with started(server_url, CounterWorkflow, "interop.counter", [], workflow_id=wid) as (handle, task):
            await wait_for_event(handle, task, "ConditionWaitOpened")
            # Either order of "first signal processed" and "second signal sent" is correct; neither is forced.
            await handle.signal("bump")
            await handle.signal("bump")
            result = await handle.result(timeout=WAIT_DEADLINE)
            assert result == {"bumps": 2, "reached": True, "more": False}

            events = await history_events(handle)
            opened = [e["payload"] for e in events if e["event_type"] == "ConditionWaitOpened"]
            assert [p["condition_key"] for p in opened] == ["two-bumps", "third-bump"]
            satisfied = [e["payload"] for e in events if e["event_type"] == "ConditionWaitSatisfied"]
            timed_out = [e["payload"] for e in events if e["event_type"] == "ConditionWaitTimedOut"]
            assert [p["condition_wait_id"] for p in satisfied] == [opened[0]["condition_wait_id"]]
            assert [p["condition_wait_id"] for p in timed_out] == [opened[1]["condition_wait_id"]]
            fired = [e["payload"] for e in events if e["event_type"] == "TimerFired"]
            assert [(p["timer_kind"], p["condition_wait_id"]) for p in fired] == [
                ("condition_timeout", opened[1]["condition_wait_id"])
            ]

    run(scenario())


def test_signal_while_activity_pending_is_a_normal_waiting_for_history_finish(server: ReferenceServer) -> None:
    async def scenario() -> None:
        wid = unique("interop-gated")
        STARTED[wid], GATES[wid] = threading.Event(), threading.Event()
        try:
            async with started(
                server.url, GatedWorkflow, "interop.gated", [wid], workflow_id=wid, activities=(gated,)
            ) as (handle, task):
                assert await asyncio.to_thread(STARTED[wid].wait, WAIT_DEADLINE), "the activity never started"
                await handle.signal("note", ["sent while the activity ran"])
                # Replay of that wake-up yields no new command, so the SDK reports the task as failed with
                # type WorkflowTaskWaitingForHistory (Python SDK 2.12.0, Worker handshake). The server must finish
                # the task and keep the run waiting for the activity — not fail the run, not lose the signal.
                # (Every other workflow-task failure path of the SDK logs a warning, which no_sdk_complaints
                # refuses.)
                run_id = handle.run_id
                assert run_id is not None
                await wait_for_workflow_task_failure(server, run_id, task)
                assert (await handle.describe()).status in ("waiting", "running")

                GATES[wid].set()
                result = await handle.result(timeout=WAIT_DEADLINE)
                assert result == {"activity": "gate opened", "notes": ["sent while the activity ran"]}
        finally:
            GATES[wid].set()

    run(scenario())


def test_cancelled_while_waiting(server_url: str) -> None:
    async def scenario() -> None:
        wid = unique("interop-cancel")
        async with started(server_url, CancellableWorkflow, "interop.cancellable", [], workflow_id=wid) as (
            handle,
            task,
        ):
            await wait_for_event(handle, task, "ConditionWaitOpened")
            await handle.cancel(reason="no longer needed")
            with pytest.raises(WorkflowCancelled, match="no longer needed"):
                await handle.result(timeout=WAIT_DEADLINE)
            described = await handle.describe()
            assert described.status == "cancelled"

    run(scenario())


def test_clean_worker_shutdown_deregisters(server_url: str) -> None:
    async def scenario() -> None:
        queue, wid = unique("interop-shutdown-q"), unique("interop-shutdown")
        async with Client(server_url, namespace="default") as client:
            worker = Worker(
                client,
                task_queue=queue,
                workflows=[ApprovalWorkflow],
                activities=[greet],
                poll_timeout=1,
                shutdown_timeout=15,
            )
            task = asyncio.create_task(worker.run())
            # Registration is observable in the fleet; the workflow proves the worker is polling.
            handle = await client.start_workflow(
                workflow_type="interop.approval", task_queue=queue, workflow_id=wid, input=["shutdown"]
            )
            await wait_for_event(handle, task, "ConditionWaitOpened")
            assert worker.worker_id in await active_worker_ids(client)

            # The deregistration receipt is accepted: stop() raises nothing, run() returns cleanly.
            await worker.stop()
            await asyncio.wait_for(task, WAIT_DEADLINE)  # run() returns: it re-raises a shutdown error
            assert worker.worker_id not in await active_worker_ids(client)
            await handle.terminate(reason="test over")

    run(scenario())
