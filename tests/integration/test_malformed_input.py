"""Malformed input over real sockets: the reference server answers a typed 4xx and changes nothing.

Invariant 67 (docs/reference.md: Robustness): "For any worker route, arbitrary JSON (wrong types, nulls, huge strings,
deep nesting, non-object bodies, invalid UTF-8 or non-JSON bodies) never yields 5xx. The status is in {400, 404, 409,
412, 415, 422}, and the worker envelope (with `reason`) is present." Invariant 68: "A fenced, rejected or invalid
request never changes observable state." §2.1: the worker envelope is on "every `/api/worker/*` response including
errors" — so also on the errors the HTTP shell answers itself (413, 431, 400 framing).

Each test starts ``python -m reference_server`` on its own database and builds one *world*: a worker ``w1``, a
run with a leased workflow task, a run with a leased activity task, and a leased query task (its control-plane
query waits in a background thread). Every malformed request targets those live objects — the real task ids
and, where a case changes only one field, the owner's real fencing fields — so a server that let the bad field
through would commit a real change. After every request the test compares the state with the state before:
describe and control-plane history of both runs, and every row of the database file (read-only), which
includes the leases. Failures are collected and reported together, one line per case.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from suite.protocol.codec import encode_blob
from tests.conftest import ServerProcess

WORKER = "w1"
QUEUE = "mq"
WORKER_VERSION_HEADER = "x-durable-workflow-protocol-version"
CONTROL_VERSION_HEADER = "x-durable-workflow-control-plane-version"
WORKER_HEADERS = {"X-Durable-Workflow-Protocol-Version": "1.20"}
CONTROL_HEADERS = {"X-Durable-Workflow-Control-Plane-Version": "2"}
CONTROL_HEADERS_LINE = "X-Durable-Workflow-Control-Plane-Version: 2"
# Invariant 67's set, plus the shell's own answers (413, 431) and 405/404 for paths that name no route.
TYPED_4XX = frozenset({400, 404, 405, 409, 412, 413, 415, 422, 431})
MAX_BODY_BYTES = 4 * 1024 * 1024  # Settings.max_body_bytes
BLOB = encode_blob(["ok"])
LONG = "x" * 1_000_000
SERVER_ARGS = ("--long-poll-default", "1", "--query-timeout", "600", "--query-lease-seconds", "600")


# -- the world: live runs, live leases ----------------------------------------------------------------------


@dataclass
class World:
    server: ServerProcess
    http: httpx.Client
    capabilities: dict[str, Any]
    wf_task: str = ""
    wf_attempt: int = 0
    act_task: str = ""
    act_attempt: str = ""
    query_task: str = ""
    query_attempt: int = 0
    query_thread: threading.Thread | None = None
    query_answer: list[int] = field(default_factory=list)

    def worker(self, path: str, body: Any) -> dict[str, Any]:
        response = self.http.post(path, json=body, headers=WORKER_HEADERS)
        assert response.status_code in (200, 201), response.text
        doc: dict[str, Any] = response.json()
        return doc

    def control(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        response = self.http.request(method, path, json=body, headers=CONTROL_HEADERS)
        assert response.status_code in (200, 201), response.text
        doc: dict[str, Any] = response.json()
        return doc


def build_world(server: ServerProcess, *, with_query: bool = True) -> World:
    http = httpx.Client(base_url=server.url, timeout=30.0)
    info = http.get("/api/cluster/info").json()
    world = World(server, http, info["worker_protocol"]["server_capabilities"])
    world.worker("/api/worker/register", {"worker_id": WORKER, "task_queue": QUEUE, "runtime": "python"})
    poll = {"worker_id": WORKER, "task_queue": QUEUE, "timeout_seconds": 5}

    # A run whose activity task is leased.
    world.control("POST", "/api/workflows", {"workflow_type": "orders", "workflow_id": "mal-act", "task_queue": QUEUE})
    task = world.worker("/api/worker/workflow-tasks/poll", poll)["task"]
    world.worker(
        f"/api/worker/workflow-tasks/{task['task_id']}/complete",
        {
            "lease_owner": WORKER,
            "workflow_task_attempt": task["workflow_task_attempt"],
            "commands": [{"type": "schedule_activity", "activity_type": "charge", "arguments": BLOB}],
        },
    )
    activity = world.worker("/api/worker/activity-tasks/poll", poll)["task"]
    world.act_task, world.act_attempt = activity["task_id"], activity["activity_attempt_id"]

    # A run whose workflow task is leased.
    world.control("POST", "/api/workflows", {"workflow_type": "orders", "workflow_id": "mal-wf", "task_queue": QUEUE})
    task = world.worker("/api/worker/workflow-tasks/poll", poll)["task"]
    world.wf_task, world.wf_attempt = task["task_id"], task["workflow_task_attempt"]

    if with_query:
        # A leased query task: its control-plane query waits (in a thread) until the teardown answers it.
        def ask() -> None:
            with httpx.Client(base_url=server.url, timeout=600.0) as client:
                answer = client.post("/api/workflows/mal-wf/query/status", json={}, headers=CONTROL_HEADERS)
                world.query_answer.append(answer.status_code)

        world.query_thread = threading.Thread(target=ask, daemon=True)
        world.query_thread.start()
        query = world.worker("/api/worker/query-tasks/poll", {**poll, "timeout_seconds": 30})["task"]
        assert query is not None, "the query task was never offered"
        world.query_task, world.query_attempt = query["query_task_id"], query["query_task_attempt"]
    return world


def close_world(world: World) -> None:
    if world.query_thread is not None:
        world.worker(
            f"/api/worker/query-tasks/{world.query_task}/complete",
            {"lease_owner": WORKER, "query_task_attempt": world.query_attempt, "result": "done"},
        )
        world.query_thread.join(timeout=30)
        assert world.query_answer == [200]
    world.http.close()


@pytest.fixture
def world(server_factory: Callable[..., ServerProcess]) -> Iterator[World]:
    built = build_world(server_factory(*SERVER_ARGS))
    yield built
    close_world(built)


def snapshot(world: World) -> dict[str, Any]:
    """Everything observable: describe and history of the live runs, and every row of every table."""
    state: dict[str, Any] = {}
    for workflow_id in ("mal-wf", "mal-act"):
        described = world.control("GET", f"/api/workflows/{workflow_id}")
        state[f"describe {workflow_id}"] = described
        history = world.control(
            "GET", f"/api/workflows/{workflow_id}/runs/{described['run_id']}/history?page_size=1000"
        )
        state[f"history {workflow_id}"] = history["events"]
    conn = sqlite3.connect(f"file:{world.server.db}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for table in tables:
            state[f"table {table}"] = sorted(map(repr, conn.execute(f"SELECT * FROM {table}")))
    finally:
        conn.close()
    return state


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


# -- the routes and their bodies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One route with a body that would be accepted (``valid``, never sent as it is), a well-formed body that a
    domain rule refuses (``refused``), and per field the values that make ``valid`` invalid."""

    name: str
    method: str
    path: str
    valid: dict[str, Any]
    refused: dict[str, Any]
    bad: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def worker(self) -> bool:
        return self.path.startswith("/api/worker/")


NOT_STRING: list[Any] = [5, 1.5, True, [], {}, ["x"], {"x": 1}]
REQUIRED_STRING: list[Any] = [None, "", *NOT_STRING]
OPTIONAL_STRING: list[Any] = [5, True, [], {"x": 1}]
POSITIVE_INT: list[Any] = [None, 0, -1, 1.5, "1", True, [], {}, 2**64]
BAD_PAYLOADS: list[Any] = [  # not an envelope {codec: "avro", blob} nor (where allowed) a bare base64 blob
    5,
    True,
    {"codec": "avro"},
    {"codec": "json", "blob": BLOB},
    {"codec": "avro", "blob": "!!not base64!!"},
    {"codec": "avro", "blob": 5},
    {"codec": "avro", "blob": BLOB, "extra": 1},
    "!!not base64!!",
]
BAD_INPUTS: list[Any] = [b for b in BAD_PAYLOADS if isinstance(b, dict) or b in (5, True)] + ["x"]  # [] is valid input


def routes(world: World) -> list[Route]:
    wf_fence = {"lease_owner": WORKER, "workflow_task_attempt": world.wf_attempt}
    wf_fence_bad = {"lease_owner": REQUIRED_STRING, "workflow_task_attempt": POSITIVE_INT}
    wf_refused = {"lease_owner": "intruder", "workflow_task_attempt": world.wf_attempt}
    act_fence = {"lease_owner": WORKER, "activity_attempt_id": world.act_attempt}
    act_fence_bad = {"lease_owner": REQUIRED_STRING, "activity_attempt_id": REQUIRED_STRING}
    act_refused = {"lease_owner": "intruder", "activity_attempt_id": world.act_attempt}
    q_fence = {"lease_owner": WORKER, "query_task_attempt": world.query_attempt}
    q_fence_bad = {"lease_owner": REQUIRED_STRING, "query_task_attempt": POSITIVE_INT}
    q_refused = {"lease_owner": "intruder", "query_task_attempt": world.query_attempt}
    poll = {"worker_id": WORKER, "task_queue": QUEUE, "timeout_seconds": 1}
    poll_refused = {**poll, "worker_id": "ghost"}
    poll_bad: dict[str, list[Any]] = {
        "worker_id": REQUIRED_STRING,
        "task_queue": REQUIRED_STRING,
        "build_id": OPTIONAL_STRING,
        "poll_request_id": [*OPTIONAL_STRING, "p" * 256],
        "timeout_seconds": ["abc", "1.5", 1.5, True, [], {}],
    }
    heartbeat_bad: dict[str, list[Any]] = {
        **act_fence_bad,
        "message": OPTIONAL_STRING,
        "unit": OPTIONAL_STRING,
        "current": ["5", True, [], {}],
        "total": ["5", False, [1]],
        "details": ["x", 5, [1], True],
    }
    wt = f"/api/worker/workflow-tasks/{world.wf_task}"
    at = f"/api/worker/activity-tasks/{world.act_task}"
    qt = f"/api/worker/query-tasks/{world.query_task}"
    complete_workflow = [{"type": "complete_workflow", "result": BLOB}]
    return [
        Route(
            "register",
            "POST",
            "/api/worker/register",
            {"worker_id": "w-new", "task_queue": QUEUE, "runtime": "python"},
            {"worker_id": "w-new", "task_queue": QUEUE, "runtime": "cobol"},
            {
                "worker_id": [*OPTIONAL_STRING, "w" * 256],
                "task_queue": [*REQUIRED_STRING, "q" * 256],
                "runtime": [*REQUIRED_STRING, "cobol"],
                "sdk_version": [*OPTIONAL_STRING, "v" * 65],
                "build_id": [*OPTIONAL_STRING, "b" * 256],
                "supported_workflow_types": ["orders", 5, [1], {"a": 1}],
                "supported_activity_types": ["charge", 5, [None], {"a": 1}],
                "workflow_definition_fingerprints": ["x", 5, [1], {"orders": 1}],
                "capabilities": ["x", 5, {"a": 1}],
                "max_concurrent_workflow_tasks": POSITIVE_INT[1:],
                "max_concurrent_activity_tasks": POSITIVE_INT[1:],
            },
        ),
        Route(
            "worker-heartbeat",
            "POST",
            "/api/worker/heartbeat",
            {"worker_id": WORKER},
            {"worker_id": "ghost"},
            {"worker_id": REQUIRED_STRING},
        ),
        Route("deregister", "POST", "/api/worker/registrations/ghost/deregister", {}, {}),
        Route("deregister-delete", "DELETE", "/api/worker/registrations/ghost", {}, {}),
        Route(
            "workflow-poll",
            "POST",
            "/api/worker/workflow-tasks/poll",
            poll,
            poll_refused,
            {**poll_bad, "history_page_size": [0, 1001, "10", 1.5, True, [], 2**64]},
        ),
        Route(
            "workflow-history",
            "POST",
            f"{wt}/history",
            wf_fence,
            wf_refused,
            {
                **wf_fence_bad,
                "after_sequence": [-1, 1.5, "1", True, []],
                "page_size": [0, -1, 1.5, "5", True, []],
                "next_history_page_token": [5, "!!", "bm90LWEtbnVtYmVy", [], {}],
            },
        ),
        Route("workflow-heartbeat", "POST", f"{wt}/heartbeat", wf_fence, wf_refused, wf_fence_bad),
        Route(
            "workflow-complete",
            "POST",
            f"{wt}/complete",
            {**wf_fence, "commands": complete_workflow},
            {**wf_refused, "commands": complete_workflow},
            {
                **wf_fence_bad,
                "commands": [
                    None,
                    "x",
                    5,
                    {},
                    [],
                    [5],
                    [None],
                    [{}],
                    [{"type": 5}],
                    [{"type": "no_such_command"}],
                    [{"type": "schedule_activity"}],
                    [{"type": "schedule_activity", "activity_type": "a", "start_to_close_timeout": 2**64}],
                    [{"type": "complete_workflow", "result": 5}],
                    [{"type": "complete_workflow", "result": {"codec": "json", "blob": BLOB}}],
                    [{"type": "complete_workflow", "result": "!!not base64!!"}],
                    [{"type": "start_timer", "delay_seconds": -1}],
                    [{"type": "start_timer", "delay_seconds": "5"}],
                    [{"type": "start_timer", "delay_seconds": 2**64}],
                    [{"type": "complete_workflow"}, {"type": "fail_workflow", "message": "m"}],
                    [{"type": "complete_update", "update_id": "no-such-update"}],
                ],
            },
        ),
        Route(
            "workflow-fail",
            "POST",
            f"{wt}/fail",
            {**wf_fence, "failure": {"message": "boom"}},
            {**wf_refused, "failure": {"message": "boom"}},
            {**wf_fence_bad, "failure": [None, "x", 5, [], {}, {"message": 5}, {"message": ""}, {"message": None}]},
        ),
        Route("activity-poll", "POST", "/api/worker/activity-tasks/poll", poll, poll_refused, poll_bad),
        Route(
            "activity-complete",
            "POST",
            f"{at}/complete",
            {**act_fence, "result": BLOB},
            {**act_refused, "result": BLOB},
            {**act_fence_bad, "result": [*BAD_PAYLOADS, []]},
        ),
        Route(
            "activity-fail",
            "POST",
            f"{at}/fail",
            {**act_fence, "failure": {"message": "boom"}},
            {**act_refused, "failure": {"message": "boom"}},
            {
                **act_fence_bad,
                "failure": [
                    None,
                    "x",
                    5,
                    [],
                    {},
                    {"message": 5},
                    {"message": "m", "type": 5},
                    {"message": "m", "class": []},
                    {"message": "m", "kind": "weird"},
                    {"message": "m", "timeout_type": "x"},
                    {"message": "m", "non_retryable": "yes"},
                    {"message": "m", "code": "5"},
                    {"message": "m", "code": 1.5},
                    {"message": "m", "stack_trace": 5},
                    {"message": "m", "details": 5},
                    {"message": "m", "details": {"codec": "json", "blob": BLOB}},
                ],
            },
        ),
        Route("activity-heartbeat", "POST", f"{at}/heartbeat", act_fence, act_refused, heartbeat_bad),
        Route("activity-status", "POST", f"{at}/status", act_fence, act_refused, heartbeat_bad),
        Route("query-poll", "POST", "/api/worker/query-tasks/poll", poll, poll_refused, poll_bad),
        Route(
            "query-complete",
            "POST",
            f"{qt}/complete",
            {**q_fence, "result": "ok"},
            {**q_refused, "result": "ok"},
            {
                **q_fence_bad,
                "result_envelope": [
                    "x",
                    5,
                    [],
                    {"codec": "json", "blob": BLOB},
                    {"codec": "avro"},
                    {"blob": BLOB},
                    {"codec": "avro", "blob": 5},
                    {"codec": "avro", "blob": "!!not base64!!"},
                ],
            },
        ),
        Route(
            "query-fail",
            "POST",
            f"{qt}/fail",
            {**q_fence, "failure": {"message": "no"}},
            {**q_refused, "failure": {"message": "no"}},
            {
                **q_fence_bad,
                "failure": [
                    None,
                    "x",
                    5,
                    {},
                    {"message": 5},
                    {"message": "m", "reason": 5},
                    {"message": "m", "reason": ""},
                    {"message": "m", "reason": "r" * 256},
                    {"message": "m", "type": 5},
                    {"message": "m", "stack_trace": []},
                ],
            },
        ),
        Route(
            "start",
            "POST",
            "/api/workflows",
            {"workflow_type": "orders", "workflow_id": "mal-new", "task_queue": QUEUE, "input": ["x"]},
            {"workflow_type": "orders", "workflow_id": "mal-wf", "task_queue": QUEUE},  # 409: mal-wf is running
            {
                "workflow_type": [*REQUIRED_STRING, "t" * 256],
                "workflow_id": [*OPTIONAL_STRING, "", "has space", "w" * 129],
                "task_queue": [*OPTIONAL_STRING, "", "q" * 256],
                "execution_timeout_seconds": POSITIVE_INT[1:],
                "run_timeout_seconds": POSITIVE_INT[1:],
                "duplicate_policy": [None, "nope", 5],
                "memo": ["x", 5, [1], True],
                "search_attributes": ["x", 5, [1], True],
                "business_key": [5, [], {}],
                "input": BAD_INPUTS,
                "retry_policy": [{}],
                "request_id": ["r-1"],
            },
        ),
        Route(
            "signal",
            "POST",
            "/api/workflows/mal-wf/signal/go",
            {"input": ["x"]},
            {"input": "x"},
            {"input": [*BAD_INPUTS, {"codec": "avro", "blob": encode_blob("not an array")}]},
        ),
        Route(
            "update",
            "POST",
            "/api/workflows/mal-wf/update/bump",
            {"input": ["x"], "wait_for": "accepted"},
            {"input": ["x"], "wait_for": "never"},
            {
                "wait_for": [None, "never", 5],
                "wait_timeout_seconds": [None, 0, "5", 1.5, True],
                "input": BAD_INPUTS,
            },
        ),
        Route(
            "cancel",
            "POST",
            "/api/workflows/mal-wf/cancel",
            {"reason": "r"},
            {"reason": 5},
            {"reason": [*OPTIONAL_STRING, "r" * 1001]},
        ),
        Route(
            "terminate",
            "POST",
            "/api/workflows/mal-wf/terminate",
            {"reason": "r"},
            {"reason": 5},
            {"reason": [*OPTIONAL_STRING, "r" * 1001]},
        ),
        Route(
            "query",
            "POST",
            "/api/workflows/mal-wf/query/status",
            {"input": []},
            {"input": "x"},
            {"input": [*BAD_INPUTS, {"codec": "avro", "blob": encode_blob("not an array")}]},
        ),
        Route(
            "drain",
            "POST",
            f"/api/task-queues/{QUEUE}/build-ids/drain",
            {"build_id": None},
            {"build_id": 5},
            {"build_id": OPTIONAL_STRING},
        ),
        Route(
            "resume",
            "POST",
            f"/api/task-queues/{QUEUE}/build-ids/resume",
            {"build_id": None},
            {"build_id": 5},
            {"build_id": OPTIONAL_STRING},
        ),
    ]


# -- sending and judging ---------------------------------------------------------------------------------------


@dataclass
class Judge:
    """Sends cases and collects every broken expectation as one line."""

    world: World
    baseline: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self.baseline = snapshot(self.world)

    def send(
        self,
        route: Route,
        case: str,
        body: bytes,
        *,
        content_type: str | None = "application/json",
        expect: set[int] | None = None,
    ) -> httpx.Response | None:
        headers = dict(WORKER_HEADERS if route.worker else CONTROL_HEADERS)
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            response = self.world.http.request(route.method, route.path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.problems.append(f"{route.name} / {case}: no answer ({exc!r})")
            return None
        self.judge(route.name, case, route.worker, response.status_code, response.headers, response.content, expect)
        return response

    def judge(
        self,
        route: str,
        case: str,
        worker: bool,
        status: int,
        headers: httpx.Headers,
        content: bytes,
        expect: set[int] | None = None,
    ) -> None:
        self.sent += 1
        where = f"{route} / {case}"
        allowed = expect or TYPED_4XX
        if status not in allowed:
            self.problems.append(f"{where}: status {status}, expected one of {sorted(allowed)}: {content[:300]!r}")
        try:
            doc = json.loads(content)
        except ValueError:
            self.problems.append(f"{where}: the body is not JSON: {content[:200]!r}")
            doc = None
        if status >= 400 and (not isinstance(doc, dict) or not isinstance(doc.get("reason"), str) or not doc["reason"]):
            self.problems.append(f"{where}: no string `reason` in {content[:200]!r}")
        if worker:
            if headers.get(WORKER_VERSION_HEADER) != "1.20":
                self.problems.append(f"{where}: no {WORKER_VERSION_HEADER}: 1.20 header ({status})")
            if CONTROL_VERSION_HEADER in headers:
                self.problems.append(f"{where}: a worker response carries {CONTROL_VERSION_HEADER}")
            if isinstance(doc, dict) and (
                doc.get("protocol_version") != "1.20" or doc.get("server_capabilities") != self.world.capabilities
            ):
                self.problems.append(f"{where}: no worker envelope in the {status} body {content[:200]!r}")
        elif headers.get(CONTROL_VERSION_HEADER) != "2":
            self.problems.append(f"{where}: no {CONTROL_VERSION_HEADER}: 2 header ({status})")
        after = snapshot(self.world)
        if after != self.baseline:
            self.problems.append(f"{where}: the request changed {changed(self.baseline, after)} ({status})")
            self.baseline = after

    def verdict(self) -> None:
        assert self.sent > 0
        assert not self.problems, f"{len(self.problems)} of {self.sent} cases broke a rule:\n" + "\n".join(
            self.problems
        )


def dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def test_non_json_and_invalid_utf8_bodies_are_400(world: World) -> None:
    judge = Judge(world)
    bodies = {
        "not JSON": b"{not json",
        "single quotes": b"{'worker_id': 'w1'}",
        "trailing comma": b'{"worker_id": "w1",}',
        "NaN": b'{"current": NaN}',
        "Infinity": b'{"timeout_seconds": Infinity}',
        "bare NaN": b"NaN",
        "trailing data": b'{"a": 1} {"b": 2}',
        "NUL byte": b"\x00",
        "UTF-8 BOM": b'\xef\xbb\xbf{"a": 1}',
        "truncated": b'{"worker_id": "w1", "task_queue": "mq"',
        "invalid UTF-8 in a string": b'{"worker_id": "\xff\xfe"}',
        "invalid UTF-8 lead": b"\xc3\x28",
        "UTF-8 encoded surrogate": b'{"lease_owner": "\xed\xa0\x80"}',
        "latin-1 text": '{"lease_owner": "caf\xe9"}'.encode("latin-1"),
    }
    for route in routes(world):
        for case, body in bodies.items():
            # DELETE carries no body: it must still be a typed 4xx (404 for the unknown worker).
            judge.send(route, case, body, expect=None if route.method == "DELETE" else {400})
    judge.verdict()


def test_unpaired_surrogate_escapes_are_a_4xx(world: World) -> None:
    """``"\\ud800"`` is valid JSON syntax but not a Unicode string; it must not reach SQLite or the encoder."""
    judge = Judge(world)
    for route in routes(world):
        for key in {*route.refused, "zz_unknown"}:
            body = json.dumps({**route.refused, key: "\ud800"}).encode()  # json.dumps escapes it as \\ud800
            judge.send(route, f"{key} = lone surrogate", body)
    judge.verdict()


def test_non_object_bodies_are_a_4xx(world: World) -> None:
    judge = Judge(world)
    bodies = {"array": b"[]", "array of object": b"[{}]", "string": b'"w1"', "empty string": b'""', "number": b"42"}
    bodies |= {"float": b"1.5", "null": b"null", "true": b"true", "false": b"false"}
    for route in routes(world):
        for case, body in bodies.items():
            judge.send(route, case, body, expect=None if route.method == "DELETE" else {400, 422})
    judge.verdict()


def test_wrong_types_and_nulls_in_each_field_are_refused(world: World) -> None:
    """One field at a time replaced in an otherwise *acceptable* body, so letting it through would commit."""
    judge = Judge(world)
    for route in routes(world):
        for name, values in route.bad.items():
            for value in values:
                judge.send(route, f"{name} = {json.dumps(value)[:40]}", dumps({**route.valid, name: value}))
    # The control-plane history route takes its paging from the query string.
    run_id = world.control("GET", "/api/workflows/mal-wf")["run_id"]
    for query in ("page_size=abc", "page_size=0", "page_size=-1", "page_size=1001", "next_page_token=!!"):
        target = Route("history", "GET", f"/api/workflows/mal-wf/runs/{run_id}/history?{query}", {}, {})
        judge.send(target, query, b"", content_type=None)
    judge.verdict()


def test_unknown_fields_are_ignored(world: World) -> None:
    """§0: "Unknown request fields MUST be ignored": a refused body stays refused for the same reason."""
    judge = Judge(world)
    extra = {"zz_unknown": 1, "": None, "nested": {"deep": [1, None, {"x": "y"}]}, "__proto__": {"polluted": True}}
    for route in routes(world):
        plain = judge.send(route, "refused body", dumps(route.refused))
        with_extra = judge.send(route, "refused body + unknown fields", dumps({**route.refused, **extra}))
        if plain is not None and with_extra is not None:
            same = (plain.status_code, plain.json()["reason"]) == (with_extra.status_code, with_extra.json()["reason"])
            if not same:
                judge.problems.append(
                    f"{route.name}: unknown fields changed the answer from {plain.status_code} "
                    f"{plain.json()['reason']} to {with_extra.status_code} {with_extra.json()['reason']}"
                )
    judge.verdict()


def test_very_long_strings_and_huge_numbers_are_a_4xx(world: World) -> None:
    judge = Judge(world)
    for route in routes(world):
        for key, value in route.valid.items():
            if isinstance(value, str) and not (route.name == "query-complete" and key == "result"):  # any JSON
                judge.send(route, f"{key} = 1 MB string", dumps({**route.valid, key: LONG}))
            # §7.2 clamps any integer timeout_seconds into the long-poll bounds, so a huge one is a valid poll.
            if isinstance(value, int) and not isinstance(value, bool) and key != "timeout_seconds":
                for huge in (2**63, -(2**63) - 1, 10**400):
                    judge.send(route, f"{key} = {str(huge)[:12]}…", dumps({**route.valid, key: huge}))
        judge.send(route, "1 MB unknown key", dumps({**route.refused, LONG: 1}))
        judge.send(route, "1 MB unknown value", dumps({**route.refused, "zz": LONG}))
    # Reads may answer a huge cursor with an empty page; they must not fail or change anything.
    history = next(route for route in routes(world) if route.name == "workflow-history")
    judge.send(history, "after_sequence = 2**64", dumps({**history.valid, "after_sequence": 2**64}), expect={200, 422})
    # An 8,000-character path segment: a task id that cannot exist.
    for path in ("/api/worker/workflow-tasks/{}/heartbeat", "/api/worker/activity-tasks/{}/complete"):
        route = Route("long task id", "POST", path.format("t" * 8000), {}, {})
        judge.send(route, "8000-character task id", dumps({"lease_owner": WORKER, "workflow_task_attempt": 1}))
    judge.verdict()


def test_deep_nesting_is_a_4xx(world: World) -> None:
    judge = Judge(world)
    for route in routes(world):
        judge.send(route, "10k nested arrays", nested(10_000).encode())
        judge.send(route, "10k nested objects", ('{"a":' * 10_000 + "1" + "}" * 10_000).encode())
        # Too deep to parse in any field: 400. Deep but parseable in an unknown field: refused as before.
        for key in [*route.refused, "zz_unknown"]:
            text = json.dumps({**route.refused, key: "@@"}).replace('"@@"', nested(10_000))
            judge.send(route, f"{key} nested 10,000 deep", text.encode())
        text = json.dumps({**route.refused, "zz_unknown": "@@"}).replace('"@@"', nested(200))
        judge.send(route, "unknown field nested 200 deep", text.encode())
    judge.verdict()


def test_bad_content_type_is_415(world: World) -> None:
    judge = Judge(world)
    for route in routes(world):
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            expect = None if route.method == "DELETE" else {415}
            judge.send(
                route, f"Content-Type {content_type}", dumps(route.valid), content_type=content_type, expect=expect
            )
    judge.verdict()


# -- what the HTTP shell answers itself ------------------------------------------------------------------------


def raw_exchange(server: ServerProcess, data: bytes) -> tuple[int, httpx.Headers, bytes]:
    """Send bytes on a fresh connection; read the one response until the server closes."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received or len(received) < _expected_length(received):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = httpx.Headers([(name, value) for name, _, value in (line.partition(": ") for line in lines[1:])])
    return status, headers, body[: int(headers.get("content-length", len(body)))]


def _expected_length(received: bytes) -> int:
    head, _, _ = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b": ")
        if name.lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(received) + 1


def test_shell_errors_keep_the_envelope_and_change_nothing(world: World) -> None:
    """413 over the body limit, 431 over the header limit, 400 for broken framing — on every route."""
    judge = Judge(world)
    framing = {
        "Content-Length: abc": "Content-Length: abc\r\n\r\n",
        "two Content-Lengths": "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "bad chunk size": "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "header without colon": "Bad Header Line\r\n\r\n",
        "space before colon": "X-A : b\r\n\r\n",
        "NUL in a header": "X-A: b\x00c\r\n\r\n",
        "413 declared": f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n",
        "431 one huge header": f"X-Big: {'a' * 20_000}\r\n\r\n",
        "431 many headers": "".join(f"X-H{i}: {'v' * 100}\r\n" for i in range(200)) + "\r\n",
    }
    for route in routes(world):
        version = "X-Durable-Workflow-Protocol-Version: 1.20" if route.worker else CONTROL_HEADERS_LINE
        for case, rest in framing.items():
            data = f"{route.method} {route.path} HTTP/1.1\r\nHost: t\r\n{version}\r\n{rest}".encode()
            status, headers, body = raw_exchange(world.server, data)
            expect = {413} if case.startswith("413") else {431} if case.startswith("431") else {400}
            judge.judge(route.name, case, route.worker, status, headers, body, expect)
    # A real client sending a real body over the limit gets the answer too.
    worker_route = next(route for route in routes(world) if route.name == "workflow-poll")
    judge.send(worker_route, "4 MiB + 1 body", b"x" * (MAX_BODY_BYTES + 1), expect={413})
    # Garbage that names no route: a JSON 400 with a reason (no envelope is owed).
    for case, data in {
        "TLS client hello": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(48)) + b"\r\n\r\n",
        "method only": b"GET\r\n\r\n",
        "space in the target": b"POST /api/worker/workflow tasks/poll HTTP/1.1\r\nHost: t\r\n\r\n",
        "binary noise": bytes(range(256)) + b"\r\n\r\n",
    }.items():
        status, headers, body = raw_exchange(world.server, data)
        judge.sent += 1
        if status != 400 or json.loads(body).get("reason") != "bad_request":
            judge.problems.append(f"garbage / {case}: {status} {body[:200]!r}")
    assert snapshot(world) == judge.baseline
    judge.verdict()


# -- Hypothesis: arbitrary JSON against the complete, heartbeat and poll routes ----------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=15,
)


def test_arbitrary_json_on_complete_heartbeat_and_poll_never_5xx_and_never_changes_state(
    server_factory: Callable[..., ServerProcess],
) -> None:
    world = build_world(server_factory(*SERVER_ARGS), with_query=False)
    try:
        judge = Judge(world)
        fuzzed = [
            route
            for route in routes(world)
            if route.name
            in {
                "workflow-poll",
                "workflow-heartbeat",
                "workflow-complete",
                "activity-poll",
                "activity-heartbeat",
                "activity-complete",
            }
        ]

        @st.composite
        def bodies(draw: st.DrawFn, route: Route) -> Any:
            known = st.sampled_from(sorted({*route.valid, *route.bad}))
            # Either anything at all, or the refused body with some of its fields replaced or added.
            if draw(st.booleans()):
                return draw(JSON)
            fields = draw(st.dictionaries(known | st.text(max_size=10), JSON, max_size=4))
            body = {**route.refused, **fields}
            # Keep it refused: a body that names the real owner or worker could be legitimately accepted.
            for owner_field in ("lease_owner", "worker_id"):
                if body.get(owner_field) == WORKER:
                    body[owner_field] = "intruder"
            return body

        @settings(
            max_examples=150,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            route = data.draw(st.sampled_from(fuzzed), label="route")
            body = data.draw(bodies(route), label="body")
            before = len(judge.problems)
            response = judge.send(route, f"fuzz {json.dumps(body)[:200]}", dumps(body))
            note(f"{route.method} {route.path} -> {response.status_code if response else None}")
            note(response.text[:500] if response is not None else "no answer")
            assert len(judge.problems) == before, judge.problems[before:]

        check()
        judge.verdict()
    finally:
        close_world(world)
