"""The official SDK 2.12.0 against the capabilities the seed names beyond the basics: a child started without
a parent-close policy, activities in a worker session through the SDK's own session API, an activity's
heartbeat_timeout, and one token for both planes.

One reference server for the module, started with role tokens **and** the full-access token
(``--auth-token``); every SDK client here is configured with the single full-access token
(``Client(url, token=…)``, which the SDK sends on both planes), except the test that shows the role tokens
still work beside it. Waits poll durable state with deadlines, as in ``test_sdk_interop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

durable_workflow = pytest.importorskip("durable_workflow")

from durable_workflow import Client, WorkflowCancelled, activity, workflow  # noqa: E402
from durable_workflow.activity import ActivityLeaseAuthorityLost  # noqa: E402
from durable_workflow.cancellation import ParentClosePolicy  # noqa: E402
from durable_workflow.worker_session import WorkerSessionOptions  # noqa: E402

from tests.integration.test_sdk_interop import (  # noqa: E402
    WAIT_DEADLINE,
    CancellableWorkflow,
    active_worker_ids,
    history_events,
    no_sdk_complaints,
    poll_until,
    reference_server_process,
    run,
    running_worker,
    unique,
    wait_for_event,
)

__all__ = ["no_sdk_complaints"]  # the autouse fixture: every SDK warning fails the test

pytestmark = [pytest.mark.sdk, pytest.mark.slow]


@dataclass(frozen=True)
class AuthServer:
    url: str
    full_token: str
    worker_token: str
    operator_token: str


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    tokens = {name: secrets.token_urlsafe(18) for name in ("auth", "worker", "operator", "admin")}
    args = [f"--{name}-token={token}" for name, token in tokens.items()]
    with reference_server_process(tmp_path_factory.mktemp("sdk-capabilities"), *args) as url:
        yield AuthServer(url, tokens["auth"], tokens["worker"], tokens["operator"])


# -- activities and workflows -------------------------------------------------------------------------------

# What each in-session activity saw: (session key, the process-local state it found, its attempt number).
SESSION_CALLS: list[tuple[str, int]] = []
LOCAL_STATE: dict[str, int] = {}


@activity.defn(name="caps.warm")
def warm(key: str) -> int:
    """Process-local state that only a worker holding the session can rely on."""
    LOCAL_STATE[key] = LOCAL_STATE.get(key, 0) + 1
    SESSION_CALLS.append((key, LOCAL_STATE[key]))
    return LOCAL_STATE[key]


@activity.defn(name="caps.echo")
def echo(value: str) -> str:
    return value


@workflow.defn(name="caps.kid")
class KidWorkflow:
    def run(self, ctx: Any, name: str) -> Any:
        greeting = yield ctx.schedule_activity("caps.echo", [f"kid {name}"])
        return greeting


@workflow.defn(name="caps.parent")
class ParentWorkflow:
    """Starts a child with no parent_close_policy (the SDK assumes ``abandon``) and returns its result."""

    def run(self, ctx: Any, name: str) -> Any:
        result = yield ctx.start_child_workflow("caps.kid", [name])
        return {"child": result}


@workflow.defn(name="caps.cooperative-kid")
class CooperativeKidWorkflow(CancellableWorkflow):
    """Waits for a signal that never comes; asked to cancel, it cleans up with an activity and completes."""

    def run(self, ctx: Any) -> Any:
        try:
            yield ctx.wait_condition(lambda: self.released, key="release")
        except WorkflowCancelled:
            cleaned = yield ctx.schedule_activity("caps.echo", ["cleaned up"])
            return {"cancelled": True, "cleanup": cleaned}
        return {"cancelled": False}


@workflow.defn(name="caps.cooperative-parent")
class CooperativeParentWorkflow:
    """Starts the child under request_cancellation and waits for it (the test cancels this parent)."""

    def run(self, ctx: Any) -> Any:
        result = yield ctx.start_child_workflow(
            "caps.cooperative-kid", [], parent_close_policy=ParentClosePolicy.REQUEST_CANCELLATION
        )
        return result


# Each attempt of caps.stall: (attempt number, how it ended).
STALLS: list[tuple[int, str]] = []


@activity.defn(name="caps.stall")
async def stall() -> str:
    """Attempt 1 heartbeats once and then goes quiet for longer than its heartbeat_timeout; its next heartbeat is
    refused. Attempt 2 answers at once."""
    ctx = activity.context()
    number = ctx.info.attempt_number
    if number > 1:
        # Heartbeating, it waits for attempt 1 to hear of its timeout, so that attempt is told about itself and
        # not about a run that closed meanwhile.
        while not STALLS:
            await ctx.heartbeat()
            await asyncio.sleep(0.25)
        STALLS.append((number, "completed"))
        return f"attempt {number}"
    await ctx.heartbeat()
    await asyncio.sleep(HEARTBEAT_TIMEOUT + 2)
    try:
        await ctx.heartbeat()
    except ActivityLeaseAuthorityLost:
        STALLS.append((number, "timed out"))
        raise
    STALLS.append((number, "kept running"))
    return "attempt 1 kept running"


HEARTBEAT_TIMEOUT = 2


@workflow.defn(name="caps.heartbeat-timeout")
class HeartbeatTimeoutWorkflow:
    """One activity with heartbeat_timeout 2 s and two attempts."""

    def run(self, ctx: Any) -> Any:
        result = yield ctx.schedule_activity(
            "caps.stall",
            [],
            start_to_close_timeout=60,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy={"max_attempts": 2, "backoff_seconds": [0]},
        )
        return result


@workflow.defn(name="caps.session")
class SessionWorkflow:
    """Three activities in one worker session that requires a capability."""

    def run(self, ctx: Any, session_id: str) -> Any:
        options = WorkerSessionOptions(session_id=session_id, requirements=("gpu:test",), lease_seconds=30)
        seen = []
        for _ in range(3):
            count = yield ctx.schedule_activity("caps.warm", [session_id], worker_session=options)
            seen.append(count)
        return seen


async def registered(client: Client, worker_id: str, worker_task: asyncio.Task[None]) -> None:
    """Wait until the Worker's registration is visible (``run()`` registers before it polls)."""
    await poll_until(
        worker_task,
        lambda: active_worker_ids(client),
        lambda active: worker_id in active,
        lambda _: f"worker {worker_id} did not register",
    )


def one_token_client(server: AuthServer) -> Client:
    return Client(server.url, token=server.full_token, namespace="default")


@contextlib.asynccontextmanager
async def cooperative_worker(
    server: AuthServer, queue: str, workflows: list[type]
) -> AsyncIterator[tuple[Client, asyncio.Task[None]]]:
    """A full-access client and a running worker on ``queue`` that negotiated cooperative cancellation."""
    async with (
        one_token_client(server) as client,
        running_worker(
            client, queue, workflows=workflows, activities=[echo], capabilities=("cooperative_cancellation",)
        ) as (_, worker_task),
    ):
        yield client, worker_task


# -- tests ----------------------------------------------------------------------------------------------


def test_child_without_a_parent_close_policy(auth_server: AuthServer) -> None:
    """The SDK replays the parent after the child completes: the recorded policy must be the one it assumes."""

    async def scenario() -> None:
        queue = unique("caps-child-q")
        async with (
            one_token_client(auth_server) as client,
            running_worker(client, queue, workflows=[ParentWorkflow, KidWorkflow], activities=[echo]),
        ):
            handle = await client.start_workflow(
                workflow_type="caps.parent", task_queue=queue, workflow_id=unique("caps-parent"), input=["ada"]
            )
            assert await handle.result(timeout=WAIT_DEADLINE) == {"child": "kid ada"}
            [scheduled] = [e for e in await history_events(handle) if e["event_type"] == "ChildWorkflowScheduled"]
            assert scheduled["payload"]["parent_close_policy"] == "abandon"

    run(scenario())


def test_activities_in_a_worker_session_through_the_sdk_session_api(auth_server: AuthServer) -> None:
    """An explicit create through ``Worker.worker_session(...).create()``, three in-session activities on the
    holder (its process-local state carries over), and the close the Worker sends on stop."""

    async def scenario() -> None:
        queue, session_id = unique("caps-session-q"), unique("gpu-session")
        async with one_token_client(auth_server) as client:
            async with running_worker(
                client, queue, workflows=[SessionWorkflow], activities=[warm], capabilities=("gpu:test",)
            ) as (worker, worker_task):
                await registered(client, worker.worker_id, worker_task)
                handle_session = worker.worker_session(
                    WorkerSessionOptions(session_id=session_id, requirements=("gpu:test",), lease_seconds=30)
                )
                created = await handle_session.create()
                assert created["outcome"] == "created"
                assert created["session"]["lease_owner"] == worker.worker_id
                handle = await client.start_workflow(
                    workflow_type="caps.session",
                    task_queue=queue,
                    workflow_id=unique("caps-session"),
                    input=[session_id],
                )
                assert await handle.result(timeout=WAIT_DEADLINE) == [1, 2, 3]
                renewed = await handle_session.renew()
                assert renewed["outcome"] == "heartbeat_recorded"
                events = await history_events(handle)
                scheduled = [e for e in events if e["event_type"] == "ActivityScheduled"]
                assert {e["payload"]["worker_session"]["session_id"] for e in scheduled} == {session_id}
            # Worker.stop() closed the session it held (planned shutdown closes sessions).
            info = await client._request("GET", f"/worker-sessions/{session_id}")
            assert info["session"]["status"] == "closed"

    run(scenario())


def test_a_child_cancelled_cooperatively(auth_server: AuthServer) -> None:
    """The parent is cancelled; its request_cancellation child, on a worker that negotiated the SDK's
    cooperative cancellation, receives the request, commits its delivery at the wait, cleans up with an
    activity and completes; the parent's history records that outcome."""

    async def scenario() -> None:
        queue = unique("caps-coop-q")
        workflows = [CooperativeParentWorkflow, CooperativeKidWorkflow]
        async with cooperative_worker(auth_server, queue, workflows) as (client, worker_task):
            parent = await client.start_workflow(
                workflow_type="caps.cooperative-parent", task_queue=queue, workflow_id=unique("caps-coop")
            )
            events = await wait_for_event(parent, worker_task, "ChildRunStarted")
            [scheduled] = [e for e in events if e["event_type"] == "ChildWorkflowScheduled"]
            [started] = [e for e in events if e["event_type"] == "ChildRunStarted"]
            child = client.get_workflow_handle(
                scheduled["payload"]["child_workflow_id"], run_id=started["payload"]["child_workflow_run_id"]
            )
            await wait_for_event(child, worker_task, "ConditionWaitOpened")
            await parent.cancel()
            assert await child.result(timeout=WAIT_DEADLINE) == {"cancelled": True, "cleanup": "cleaned up"}
            child_types = [e["event_type"] for e in await history_events(child)]
            assert "CooperativeCancellationRequested" in child_types
            assert "CooperativeCancellationDelivered" in child_types
            resolved = await wait_for_event(parent, worker_task, "ChildCancellationResolved")
            [outcome] = [e["payload"] for e in resolved if e["event_type"] == "ChildCancellationResolved"]
            assert (outcome["outcome"], outcome["closed_by"]) == ("completed", "child")

    run(scenario())


def test_role_tokens_still_work_beside_the_full_access_token(auth_server: AuthServer) -> None:
    async def scenario() -> None:
        queue = unique("caps-roles-q")
        client = Client(
            auth_server.url,
            worker_token=auth_server.worker_token,
            control_token=auth_server.operator_token,
            namespace="default",
        )
        async with client, running_worker(client, queue, workflows=[KidWorkflow], activities=[echo]):
            handle = await client.start_workflow(
                workflow_type="caps.kid", task_queue=queue, workflow_id=unique("caps-roles"), input=["bo"]
            )
            assert await handle.result(timeout=WAIT_DEADLINE) == "kid bo"

    run(scenario())


def test_a_client_requests_cooperative_cancellation_through_the_sdk(auth_server: AuthServer) -> None:
    """``Client.request_workflow_cancellation`` (and ``WorkflowHandle.request_cancellation``) against the
    reference server: accepted with the server's identity and deadline, repeated as a duplicate with the same
    ones; the run, on a worker that negotiated cooperative cancellation, receives it at its wait, cleans up and
    completes."""

    async def scenario() -> None:
        queue = unique("caps-client-coop-q")
        async with cooperative_worker(auth_server, queue, [CooperativeKidWorkflow]) as (client, worker_task):
            handle = await client.start_workflow(
                workflow_type="caps.cooperative-kid", task_queue=queue, workflow_id=unique("caps-client-coop")
            )
            await wait_for_event(handle, worker_task, "ConditionWaitOpened")
            first = await client.request_workflow_cancellation(
                handle.workflow_id, run_id=handle.run_id, reason="operator asked", cleanup_timeout_seconds=600
            )
            assert (first["accepted"], first["duplicate"], first["workflow_id"]) == (True, False, handle.workflow_id)
            request = first["cancellation_request"]
            again = await handle.request_cancellation(cleanup_timeout_seconds=30)
            assert again["duplicate"] is True
            for key in ("request_id", "requested_at", "cleanup_deadline_at"):
                assert again["cancellation_request"][key] == request[key], key
            assert await handle.result(timeout=WAIT_DEADLINE) == {"cancelled": True, "cleanup": "cleaned up"}
            events = await history_events(handle)
            [asked] = [e["payload"] for e in events if e["event_type"] == "CooperativeCancellationRequested"]
            assert (asked["workflow_command_id"], asked["reason"]) == (request["request_id"], "operator asked")
            assert "CooperativeCancellationDelivered" in [e["event_type"] for e in events]

    run(scenario())


def test_an_activity_whose_heartbeats_stop_is_timed_out_and_retried(auth_server: AuthServer) -> None:
    """An SDK activity scheduled with heartbeat_timeout 2 s that stops heartbeating: the server times the attempt
    out (the SDK's next heartbeat is refused) and retries it; the workflow gets attempt 2's result."""

    refused = _Refusals()
    logging.getLogger("durable_workflow.worker").addFilter(refused)

    async def scenario() -> None:
        queue = unique("caps-heartbeat-q")
        async with (
            one_token_client(auth_server) as client,
            running_worker(client, queue, workflows=[HeartbeatTimeoutWorkflow], activities=[stall]) as (_, worker_task),
        ):
            handle = await client.start_workflow(
                workflow_type="caps.heartbeat-timeout", task_queue=queue, workflow_id=unique("caps-heartbeat")
            )
            assert await handle.result(timeout=WAIT_DEADLINE) == "attempt 2"
            events = await history_events(handle)
            [retry] = [e["payload"] for e in events if e["event_type"] == "ActivityRetryScheduled"]
            assert retry["timeout_type"] == "heartbeat"

            async def seen() -> list[tuple[int, str]]:
                return sorted(STALLS)

            # Attempt 1 learns of its timeout at its next heartbeat, which may come after attempt 2 completed.
            ended = await poll_until(worker_task, seen, lambda got: len(got) == 2, lambda got: f"attempts: {got}")
            assert ended == [(1, "timed out"), (2, "completed")]

    try:
        run(scenario())
    finally:
        logging.getLogger("durable_workflow.worker").removeFilter(refused)
    # The SDK's one warning is the timed-out attempt being told it cannot continue, for a reason of its own.
    assert len(refused.reasons) == 1, refused.reasons
    assert not refused.reasons[0].startswith("run_"), refused.reasons


class _Refusals(logging.Filter):
    """Takes the SDK's "cannot continue after heartbeat" warnings out of the log, keeping their reasons."""

    MESSAGE = "activity %s cannot continue after heartbeat: %s"

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.MESSAGE and isinstance(record.args, tuple):
            self.reasons.append(str(record.args[1]))
            return False
        return True
