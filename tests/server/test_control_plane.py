"""The control plane through the in-process handler: docs/reference.md: Versioning (version header), §4 (auth, roles,
namespaces and the §2.3 check order), §5 (cluster info) and §12 (start, describe, runs, history, signal,
update, cancel, terminate and their run-targeted variants).

Every rejected start, signal or command is also checked to leave the database unchanged (invariant 68). The
update scenarios that block until a workflow task answers run in one event loop (``harness.run_async``).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from suite.protocol.codec import decode_blob, encode_blob
from suite.protocol.commands import ALL_TYPES
from suite.protocol.fencing import parse_rfc3339
from tests.server.harness import CONTROL_HEADERS, Harness, HarnessFactory, h, make, run_async, until

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

GOLDEN = json.loads((Path(__file__).parents[2] / "schemas/avro/avro-value-v1-golden.json").read_text("utf-8"))
# A valid Avro Value frame for ["x"] written with a negative block count and a byte size (§13.2: decoders MUST
# accept it). This server's encoder writes a single positive block, so a server that decodes and re-encodes an
# explicit envelope instead of storing it unchanged returns different bytes.
MULTI_BLOCK_BLOB = base64.b64encode(
    bytes.fromhex("c301e2a33dff55802237") + bytes([0x0C, 0x01, 0x06, 0x0A, 0x02, 0x78, 0x00])
).decode()
CONTROL = "X-Durable-Workflow-Control-Plane-Version"
WORKER = "X-Durable-Workflow-Protocol-Version"


def assert_control_rejection(result: tuple[int, dict[str, Any]], status: int, reason: str) -> dict[str, Any]:
    got, doc = result
    assert (got, doc.get("reason")) == (status, reason), doc
    assert "protocol_version" not in doc
    assert "server_capabilities" not in doc
    return doc


def not_started(h: Harness, workflow_id: str) -> None:
    assert_control_rejection(h.control("GET", f"/workflows/{workflow_id}"), 404, "instance_not_found")


def first_task_done(h: Harness, workflow_id: str, *commands: dict[str, Any]) -> dict[str, Any]:
    """Start ``workflow_id`` and complete its first task with ``commands`` (a timer by default)."""
    h.start(workflow_id)
    task = h.lease()
    return h.completed(task, *(commands or ({"type": "start_timer", "delay_seconds": 600},)))


def continued(h: Harness, workflow_id: str = "wf-1") -> tuple[str, str]:
    """A workflow whose first run continued as new: (old run id, new run id)."""
    old = h.start(workflow_id)
    out = h.completed(h.lease(), {"type": "continue_as_new"})
    new = h.run_of(*out["created_task_ids"])
    assert new != old
    return old, new


# -- start (§12.1) ------------------------------------------------------------------------------------------


def test_start_201_then_duplicate_409_then_use_existing_200(h: Harness) -> None:
    status, doc = h.control(
        "POST",
        "/workflows",
        {"workflow_type": "orders", "workflow_id": "wf-1", "task_queue": "q", "business_key": "bk-1"},
    )
    assert status == 201, doc
    assert {k: doc[k] for k in ("workflow_id", "workflow_type", "namespace", "status", "business_key")} == {
        "workflow_id": "wf-1",
        "workflow_type": "orders",
        "namespace": "default",
        "status": "pending",
        "business_key": "bk-1",
    }
    assert (doc["payload_codec"], doc["outcome"]) == ("avro", "started_new")
    assert doc["run_id"]
    run_id = doc["run_id"]

    before = h.snapshot()
    dup = assert_control_rejection(
        h.control("POST", "/workflows", {"workflow_type": "orders", "workflow_id": "wf-1"}), 409, "rejected_duplicate"
    )
    assert (dup["outcome"], dup["run_id"]) == ("rejected_duplicate", run_id)
    assert h.snapshot() == before

    status, doc = h.control(
        "POST", "/workflows", {"workflow_type": "orders", "workflow_id": "wf-1", "duplicate_policy": "use-existing"}
    )
    assert (status, doc["outcome"], doc["run_id"]) == (200, "returned_existing_active", run_id), doc
    assert h.snapshot() == before


def test_a_closed_workflow_id_starts_a_new_run(h: Harness) -> None:
    first = h.start("wf-1")
    h.close("wf-1", "terminate")
    second = h.start("wf-1")
    assert second != first
    described = h.describe("wf-1")
    assert (described["run_id"], described["run_number"], described["run_count"]) == (second, 2, 2)


def test_a_generated_workflow_id_is_valid(h: Harness) -> None:
    status, doc = h.control("POST", "/workflows", {"workflow_type": "orders"})
    assert status == 201, doc
    assert h.describe(doc["workflow_id"])["task_queue"] == "default"


INVALID_STARTS: list[tuple[str, dict[str, Any]]] = [
    ("workflow_type", {"workflow_type": None}),
    ("workflow_type", {"workflow_type": ""}),
    ("workflow_type", {"workflow_type": 5}),
    ("workflow_type", {"workflow_type": "t" * 256}),
    ("workflow_id", {"workflow_id": "has space"}),
    ("workflow_id", {"workflow_id": "a/b"}),
    ("workflow_id", {"workflow_id": ""}),
    ("workflow_id", {"workflow_id": "x" * 129}),
    ("workflow_id", {"workflow_id": 17}),
    ("task_queue", {"task_queue": ""}),
    ("task_queue", {"task_queue": ["q"]}),
    ("execution_timeout_seconds", {"execution_timeout_seconds": 0}),
    ("execution_timeout_seconds", {"execution_timeout_seconds": -5}),
    ("execution_timeout_seconds", {"execution_timeout_seconds": "60"}),
    ("execution_timeout_seconds", {"execution_timeout_seconds": True}),
    ("run_timeout_seconds", {"run_timeout_seconds": 0}),
    ("run_timeout_seconds", {"run_timeout_seconds": 1.5}),
    ("duplicate_policy", {"duplicate_policy": "use_existing"}),
    ("duplicate_policy", {"duplicate_policy": "reject"}),
    ("duplicate_policy", {"duplicate_policy": 1}),
    ("memo", {"memo": "notes"}),
    ("memo", {"memo": [1]}),
    ("memo", {"memo": []}),
    ("memo", {"memo": {"big": "m" * (256 * 1024)}}),
    ("search_attributes", {"search_attributes": ["a"]}),
    ("search_attributes", {"search_attributes": ""}),
    ("business_key", {"business_key": 7}),
    ("workflow_execution_timeout", {"workflow_execution_timeout": 60}),
    ("workflow_run_timeout", {"workflow_run_timeout": 60}),
    ("workflow_task_timeout", {"workflow_task_timeout": 10}),
    ("retry_policy", {"retry_policy": {"max_attempts": 2}}),
    ("idempotency_key", {"idempotency_key": "k"}),
    ("request_id", {"request_id": "r"}),
    ("input", {"input": "hello"}),
    ("input", {"input": 42}),
    ("input", {"input": {"codec": "avro"}}),
    ("input", {"input": {"codec": "avro", "blob": "wwHi", "extra": 1}}),
    ("input", {"input": [2**63]}),
    ("input.blob", {"input": {"codec": "avro", "blob": "bm90IGF2cm8="}}),
]


@pytest.mark.parametrize(("field", "body"), INVALID_STARTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID_STARTS)])
def test_an_invalid_start_is_422_and_creates_no_run(h: Harness, field: str, body: dict[str, Any]) -> None:
    doc = {"workflow_type": "orders", "workflow_id": "wf-1", **body}
    doc = {k: v for k, v in doc.items() if v is not None}
    before = h.snapshot()
    out = assert_control_rejection(h.control("POST", "/workflows", doc), 422, "validation_failed")
    assert field in out["errors"], out["errors"]
    assert out["errors"] == out["validation_errors"]
    assert h.snapshot() == before
    if doc.get("workflow_id") == "wf-1":
        not_started(h, "wf-1")


@pytest.mark.parametrize("codec", ["json", "php", "base64", "", None, "AVRO"])
def test_a_non_avro_codec_is_422_and_creates_no_run(h: Harness, codec: Any) -> None:
    """§12.1 / invariant 44: "An unknown or empty codec gives 422 (`unsupported_payload_codec: …` in
    `errors["input.codec"]`)", and no run is created."""
    before = h.snapshot()
    out = assert_control_rejection(
        h.control(
            "POST",
            "/workflows",
            {"workflow_type": "orders", "workflow_id": "wf-1", "input": {"codec": codec, "blob": encode_blob(["x"])}},
        ),
        422,
        "validation_failed",
    )
    assert out["errors"]["input.codec"][0].startswith("unsupported_payload_codec")
    assert h.snapshot() == before
    not_started(h, "wf-1")


def test_a_json_array_input_becomes_one_avro_array_blob(h: Harness) -> None:
    value = ["hello", 42, None, True, 1.5, {"k": [1, "x"]}, [], -(2**63)]
    h.start("wf-1", input=value)
    task = h.lease()
    assert task["arguments"]["codec"] == "avro"
    assert decode_blob(task["arguments"]["blob"]) == value
    described = h.describe("wf-1")
    assert described["input"] == value
    assert described["input_envelope"] == task["arguments"]


def test_an_explicit_envelope_is_stored_unchanged(h: Harness) -> None:
    assert decode_blob(MULTI_BLOCK_BLOB) == ["x"]
    assert encode_blob(["x"]) != MULTI_BLOCK_BLOB
    h.start("wf-1", input={"codec": "avro", "blob": MULTI_BLOCK_BLOB})
    assert h.lease()["arguments"] == {"codec": "avro", "blob": MULTI_BLOCK_BLOB}
    assert h.describe("wf-1")["input_envelope"] == {"codec": "avro", "blob": MULTI_BLOCK_BLOB}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_golden_blobs_come_back_byte_identical(h: Harness, case: dict[str, Any]) -> None:
    """§13.4 suite use 3: every golden blob sent as the start input is returned unchanged."""
    h.start("wf-1", input={"codec": "avro", "blob": case["wire_base64"]})
    assert h.lease()["arguments"]["blob"] == case["wire_base64"]


@pytest.mark.parametrize("frame", GOLDEN["malformed_frames"], ids=lambda c: c["name"])
def test_a_malformed_start_envelope_is_422(h: Harness, frame: dict[str, Any]) -> None:
    before = h.snapshot()
    status, doc = h.control(
        "POST",
        "/workflows",
        {"workflow_type": "t", "workflow_id": "wf-1", "input": {"codec": "avro", "blob": frame["wire_base64"]}},
    )
    assert (status, doc["reason"]) == (422, "validation_failed"), doc
    assert h.snapshot() == before


# -- describe, runs and history (§12.3) ---------------------------------------------------------------------


DESCRIBE_KEYS = {
    "workflow_id",
    "run_id",
    "namespace",
    "workflow_type",
    "status",
    "status_bucket",
    "is_terminal",
    "closed_reason",
    "task_queue",
    "run_number",
    "run_count",
    "is_current_run",
    "payload_codec",
    "execution_timeout_seconds",
    "run_timeout_seconds",
    "input",
    "output",
    "input_envelope",
    "output_envelope",
    "started_at",
    "closed_at",
    "memo",
    "search_attributes",
    "actions",
}


def test_describe_has_every_section_12_3_field(h: Harness) -> None:
    run_id = h.start("wf-1", memo={"owner": "ops"}, search_attributes={"Region": "eu"}, execution_timeout_seconds=600)
    doc = h.describe("wf-1")
    assert set(doc) >= DESCRIBE_KEYS, DESCRIBE_KEYS - set(doc)
    assert (doc["run_id"], doc["status"], doc["is_terminal"], doc["is_current_run"]) == (run_id, "pending", False, True)
    assert (doc["memo"], doc["search_attributes"]) == ({"owner": "ops"}, {"Region": "eu"})
    assert (doc["execution_timeout_seconds"], doc["run_timeout_seconds"]) == (600, None)
    assert parse_rfc3339(doc["started_at"]) == h.now()
    assert doc["closed_at"] is None
    assert all(doc["actions"][k] for k in ("can_signal", "can_update", "can_cancel", "can_terminate"))
    assert h.describe("wf-1", run_id) == doc
    h.close("wf-1", "cancel")
    closed = h.describe("wf-1")
    assert (closed["status"], closed["status_bucket"], closed["is_terminal"], closed["closed_reason"]) == (
        "cancelled",
        "closed",
        True,
        "cancelled",
    )
    # Queries of closed runs are answered from their history, so only can_query stays true.
    assert closed["actions"] == {**dict.fromkeys(closed["actions"], False), "can_query": True}


def test_runs_and_run_targeted_describe_after_continue_as_new(h: Harness) -> None:
    old, new = continued(h)
    status, doc = h.control("GET", "/workflows/wf-1/runs")
    assert status == 200, doc
    assert [(r["run_id"], r["run_number"], r["is_current_run"]) for r in doc["runs"]] == [
        (old, 1, False),
        (new, 2, True),
    ]
    assert (doc["runs"][0]["status"], doc["runs"][0]["closed_reason"]) == ("completed", "continued")
    assert h.describe("wf-1")["run_id"] == new
    assert h.describe("wf-1", old)["is_current_run"] is False


def test_unknown_workflow_and_unknown_run_are_404(h: Harness) -> None:
    h.start("wf-1")
    for method, path in [
        ("GET", "/workflows/nope"),
        ("GET", "/workflows/nope/runs"),
        ("GET", "/workflows/nope/runs/R1"),
        ("GET", "/workflows/nope/runs/R1/history"),
        ("POST", "/workflows/nope/signal/s"),
        ("POST", "/workflows/nope/update/u"),
        ("POST", "/workflows/nope/cancel"),
        ("POST", "/workflows/nope/terminate"),
    ]:
        doc = assert_control_rejection(
            h.control(method, path, {} if method == "POST" else None), 404, "instance_not_found"
        )
        assert doc["workflow_id"] == "nope"
    for method, path in [
        ("GET", "/workflows/wf-1/runs/R1"),
        ("GET", "/workflows/wf-1/runs/R1/history"),
        ("POST", "/workflows/wf-1/runs/R1/signal/s"),
        ("POST", "/workflows/wf-1/runs/R1/update/u"),
        ("POST", "/workflows/wf-1/runs/R1/cancel"),
        ("POST", "/workflows/wf-1/runs/R1/terminate"),
    ]:
        doc = assert_control_rejection(h.control(method, path, {} if method == "POST" else None), 404, "run_not_found")
        assert doc["run_id"] == "R1"


def test_run_history_pages_with_next_page_token(h: Harness) -> None:
    run_id = h.start("wf-1")
    for i in range(5):
        h.signal("wf-1", f"s{i}")
    seen: list[int] = []
    path = f"/workflows/wf-1/runs/{run_id}/history?page_size=3"
    token: str | None = None
    pages = 0
    while True:
        status, doc = h.control("GET", path + (f"&next_page_token={token}" if token else ""))
        assert status == 200, doc
        assert (doc["workflow_id"], doc["run_id"]) == ("wf-1", run_id)
        assert len(doc["events"]) <= 3
        for event in doc["events"]:
            assert {"sequence", "event_type", "timestamp", "payload"} <= set(event)
        seen += [e["sequence"] for e in doc["events"]]
        pages += 1
        token = doc["next_page_token"]
        if token is None:
            break
        assert base64.b64decode(token) == str(seen[-1]).encode()  # "base64 of the last sequence"
    assert seen == list(range(1, 8))
    assert pages == 3
    # The default page size is 100.
    for i in range(100):
        h.signal("wf-1", f"more{i}")
    status, doc = h.control("GET", f"/workflows/wf-1/runs/{run_id}/history")
    assert (status, len(doc["events"])) == (200, 100)
    assert doc["next_page_token"] is not None


@pytest.mark.parametrize(
    ("query", "status", "reason"),
    [
        ("page_size=0", 422, "validation_failed"),
        ("page_size=1001", 422, "validation_failed"),
        ("page_size=ten", 422, "validation_failed"),
        ("next_page_token=!!!", 400, "invalid_page_token"),
        ("next_page_token=" + base64.b64encode(b"x1").decode(), 400, "invalid_page_token"),
    ],
)
def test_invalid_run_history_queries(h: Harness, query: str, status: int, reason: str) -> None:
    run_id = h.start("wf-1")
    assert_control_rejection(h.control("GET", f"/workflows/wf-1/runs/{run_id}/history?{query}"), status, reason)


def test_run_history_wait_new_event_returns_the_next_event(h: Harness) -> None:
    """§12.3 ``wait_new_event``: a history call past the last event waits for the next one."""
    run_id = h.start("wf-1")
    token = base64.b64encode(b"2").decode()

    async def scenario() -> tuple[int, dict[str, Any]]:
        path = f"/api/workflows/wf-1/runs/{run_id}/history?wait_new_event=true&next_page_token={token}"
        waiting = asyncio.ensure_future(h.acall("GET", path, control=True))
        await until(lambda: bool(h.server.hub._events))  # the call is parked on its hub event
        assert not waiting.done()
        status, doc = await h.acall("POST", "/api/workflows/wf-1/signal/go", {}, control=True)
        assert status == 202, doc
        return await waiting

    status, doc = run_async(scenario())
    assert status == 200, doc
    assert [e["event_type"] for e in doc["events"]] == ["SignalReceived"]


# -- signal (§12.2) -----------------------------------------------------------------------------------------


def test_signal_is_202_and_recorded(h: Harness) -> None:
    run_id = h.start("wf-1")
    status, doc = h.control("POST", "/workflows/wf-1/signal/approve", {"input": ["yes", 2]})
    assert status == 202, doc
    assert (doc["workflow_id"], doc["run_id"], doc["signal_name"]) == ("wf-1", run_id, "approve")
    assert (doc["outcome"], doc["command_status"]) == ("signal_received", "accepted")
    [event] = h.events("wf-1", "SignalReceived")
    payload = event["payload"]
    assert (payload["signal_name"], payload["signal_id"]) == ("approve", doc["signal_id"])
    assert decode_blob(payload["input"]) == ["yes", 2]


def test_signal_request_id_deduplicates(h: Harness) -> None:
    h.start("wf-1")
    first = h.signal("wf-1", "s", request_id="r-1", input=[1])
    again = h.signal("wf-1", "s", request_id="r-1", input=[1])
    assert again["signal_id"] == first["signal_id"]
    assert len(h.events("wf-1", "SignalReceived")) == 1
    h.signal("wf-1", "s", request_id="r-2")
    assert len(h.events("wf-1", "SignalReceived")) == 2


def test_a_signal_to_a_closed_run_is_409_and_recorded_nowhere(h: Harness) -> None:
    h.start("wf-1")
    h.close("wf-1", "cancel")
    before = h.snapshot()
    doc = assert_control_rejection(h.control("POST", "/workflows/wf-1/signal/s", {}), 409, "rejected_not_active")
    assert doc["outcome"] == "rejected_not_active"
    assert h.snapshot() == before


@pytest.mark.parametrize(
    "frame",
    [*GOLDEN["malformed_frames"], {"name": "map_not_array", "wire_base64": encode_blob({"a": 1})}],
    ids=lambda c: c["name"],
)
def test_a_malformed_signal_envelope_is_422_with_no_signal_received(h: Harness, frame: dict[str, Any]) -> None:
    """Invariant 66: a signal whose input is a malformed frame (or a valid non-array one) is 422, never 5xx."""
    h.start("wf-1")
    before = h.snapshot()
    status, doc = h.control(
        "POST", "/workflows/wf-1/signal/s", {"input": {"codec": "avro", "blob": frame["wire_base64"]}}
    )
    assert (status, doc["reason"]) == (422, "validation_failed"), doc
    assert h.snapshot() == before
    assert h.events("wf-1", "SignalReceived") == []


# -- update (§12.2) -----------------------------------------------------------------------------------------


def test_update_wait_for_accepted_is_202(h: Harness) -> None:
    run_id = h.start("wf-1")
    status, doc = h.control("POST", "/workflows/wf-1/update/approve", {"input": ["a"], "wait_for": "accepted"})
    assert status == 202, doc
    assert (doc["outcome"], doc["update_status"], doc["update_name"], doc["run_id"]) == (
        "update_accepted",
        "accepted",
        "approve",
        run_id,
    )
    [event] = h.events("wf-1", "UpdateAccepted")
    assert (event["payload"]["update_id"], event["payload"]["update_name"]) == (doc["update_id"], "approve")


def test_update_request_id_deduplicates(h: Harness) -> None:
    h.start("wf-1")
    first = h.update_accepted("wf-1", request_id="r-1")
    assert h.update_accepted("wf-1", request_id="r-1") == first
    assert len(h.events("wf-1", "UpdateAccepted")) == 1


async def update_answered_by_worker(h: Harness, command: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Start an update that waits for completion, then answer it from a workflow task with ``command``."""
    waiting = asyncio.ensure_future(
        h.acall(
            "POST",
            "/api/workflows/wf-1/update/approve",
            {"input": ["a"], "wait_for": "completed", "wait_timeout_seconds": 10},
            control=True,
        )
    )
    await until(lambda: bool(h.rows("SELECT 1 FROM updates")))
    assert not waiting.done()
    status, doc = await h.acall(
        "POST", "/api/worker/workflow-tasks/poll", {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 0}
    )
    assert doc["poll_status"] == "leased", doc
    task = doc["task"]
    assert (task["workflow_wait_kind"], task["resume_source_kind"]) == ("update", "workflow_update")
    update_id = task["workflow_update_id"]
    assert task["open_wait_id"] == f"update:{update_id}"
    status, done = await h.acall(
        "POST",
        f"/api/worker/workflow-tasks/{task['task_id']}/complete",
        {"lease_owner": "w1", "workflow_task_attempt": 1, "commands": [{**command, "update_id": update_id}]},
    )
    assert status == 200, done
    return await waiting


def test_update_wait_for_completed_returns_the_result(h: Harness) -> None:
    first_task_done(h, "wf-1")
    result = {"codec": "avro", "blob": encode_blob({"approved": True})}
    status, doc = run_async(update_answered_by_worker(h, {"type": "complete_update", "result": result}))
    assert status == 200, doc
    assert (doc["outcome"], doc["update_status"]) == ("update_completed", "completed")
    assert doc["result"] == {"approved": True}
    assert doc["result_envelope"] == result
    assert [e for e in h.event_types("wf-1") if e.startswith("Update")] == [
        "UpdateAccepted",
        "UpdateApplied",
        "UpdateCompleted",
    ]


def test_fail_update_is_422_update_failed(h: Harness) -> None:
    first_task_done(h, "wf-1")
    status, doc = run_async(update_answered_by_worker(h, {"type": "fail_update", "message": "not allowed"}))
    assert (status, doc["reason"], doc["outcome"], doc["update_status"]) == (
        422,
        "update_failed",
        "update_failed",
        "failed",
    ), doc
    assert doc["failure"]["message"] == "not allowed"


def test_an_update_waiting_for_completion_gets_409_when_the_run_closes(h: Harness) -> None:
    first_task_done(h, "wf-1")

    async def scenario() -> tuple[int, dict[str, Any]]:
        waiting = asyncio.ensure_future(
            h.acall("POST", "/api/workflows/wf-1/update/u", {"wait_timeout_seconds": 10}, control=True)
        )
        await until(lambda: bool(h.rows("SELECT 1 FROM updates")))
        status, doc = await h.acall("POST", "/api/workflows/wf-1/terminate", {}, control=True)
        assert status == 200, doc
        return await waiting

    status, doc = run_async(scenario())
    assert (status, doc["reason"]) == (409, "rejected_not_active"), doc


def test_an_update_to_a_closed_run_is_409(h: Harness) -> None:
    h.start("wf-1")
    h.close("wf-1", "terminate")
    before = h.snapshot()
    assert_control_rejection(
        h.control("POST", "/workflows/wf-1/update/u", {"wait_for": "accepted"}), 409, "rejected_not_active"
    )
    assert h.snapshot() == before


@pytest.mark.parametrize(
    "body",
    [
        {"wait_for": "done"},
        {"wait_for": "Accepted"},
        {"wait_for": None},
        {"wait_timeout_seconds": 0},
        {"wait_timeout_seconds": "5"},
        {"input": "x"},
        {"input": {"codec": "json", "blob": encode_blob([1])}},
    ],
    ids=str,
)
def test_an_invalid_update_is_422(h: Harness, body: dict[str, Any]) -> None:
    h.start("wf-1")
    before = h.snapshot()
    assert_control_rejection(h.control("POST", "/workflows/wf-1/update/u", body), 422, "validation_failed")
    assert h.snapshot() == before


# -- cancel and terminate (§12.2) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "status_name", "events"),
    [
        ("cancel", "cancelled", ["CancelRequested", "WorkflowCancelled"]),
        ("terminate", "terminated", ["TerminateRequested", "WorkflowTerminated"]),
    ],
)
@pytest.mark.parametrize("targeted", [False, True])
def test_cancel_and_terminate_close_the_run(
    h: Harness, verb: str, status_name: str, events: list[str], targeted: bool
) -> None:
    run_id = h.start("wf-1")
    path = f"/workflows/wf-1/runs/{run_id}/{verb}" if targeted else f"/workflows/wf-1/{verb}"
    status, doc = h.control("POST", path, {"reason": "ops said so"})
    assert status == 200, doc
    assert (doc["workflow_id"], doc["outcome"], doc["reason"]) == ("wf-1", status_name, "ops said so")
    described = h.describe("wf-1")
    assert (described["status"], described["closed_reason"]) == (status_name, status_name)
    assert parse_rfc3339(described["closed_at"]) == h.now()
    assert h.event_types("wf-1")[-2:] == events
    before = h.snapshot()
    for again in ("cancel", "terminate"):
        doc = assert_control_rejection(h.control("POST", f"/workflows/wf-1/{again}", {}), 409, "rejected_not_active")
        assert doc["run_status"] == status_name
    assert h.snapshot() == before


@pytest.mark.parametrize("reason", ["r" * 1001, 5, ["x"]], ids=["long", "int", "list"])
def test_an_invalid_cancel_reason_is_422(h: Harness, reason: Any) -> None:
    h.start("wf-1")
    before = h.snapshot()
    for verb in ("cancel", "terminate"):
        assert_control_rejection(
            h.control("POST", f"/workflows/wf-1/{verb}", {"reason": reason}), 422, "validation_failed"
        )
    assert h.snapshot() == before


@pytest.mark.parametrize(
    ("suffix", "body"),
    [("signal/s", {}), ("update/u", {"wait_for": "accepted"}), ("cancel", {}), ("terminate", {})],
)
def test_commands_to_a_historical_run_are_rejected(h: Harness, suffix: str, body: dict[str, Any]) -> None:
    old, new = continued(h)
    before = h.snapshot()
    doc = assert_control_rejection(
        h.control("POST", f"/workflows/wf-1/runs/{old}/{suffix}", body), 409, "historical_run_command_rejected"
    )
    assert (doc["workflow_id"], doc["run_id"]) == ("wf-1", old)
    assert h.snapshot() == before
    # The same command to the current run, by run id, is accepted.
    status, doc = h.control("POST", f"/workflows/wf-1/runs/{new}/{suffix}", body)
    assert status in (200, 202), doc
    assert doc["run_id"] == new


# -- the control-plane version header (§3.2) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason", "requested"),
    [
        (None, "missing_control_plane_version", None),
        ("", "missing_control_plane_version", None),
        ("   ", "missing_control_plane_version", None),
        ("1", "unsupported_control_plane_version", "1"),
        ("3", "unsupported_control_plane_version", "3"),
        ("2.0", "unsupported_control_plane_version", "2.0"),
        ("v2", "unsupported_control_plane_version", "v2"),
    ],
)
def test_the_control_plane_version_header(h: Harness, value: str | None, reason: str, requested: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if value is not None:
        headers[CONTROL] = value
    before = h.snapshot()
    response = h.respond("POST", "/api/workflows", {"workflow_type": "t", "workflow_id": "wf-1"}, headers=headers)
    doc = response.json()
    assert (response.status, doc["reason"]) == (400, reason), doc
    assert (doc["supported_version"], doc["requested_version"]) == ("2", requested)
    assert doc["message"]
    assert doc["remediation"]
    assert response.header(CONTROL) == "2"
    assert response.header(WORKER) is None
    assert "protocol_version" not in doc
    assert "server_capabilities" not in doc
    assert h.snapshot() == before


def test_a_padded_control_plane_version_is_accepted(h: Harness) -> None:
    response = h.respond(
        "POST", "/api/workflows", {"workflow_type": "t", "workflow_id": "wf-1"}, headers={CONTROL: " 2 "}
    )
    assert response.status == 201, response.json()
    assert response.header(CONTROL) == "2"


# -- auth, roles and the check order (§2.3, §4) -------------------------------------------------------------


@pytest.fixture
def secured(make: HarnessFactory) -> Harness:
    return make(worker_token="wt", operator_token="ot", admin_token="at")


def auth(
    token: str | None, *, control: bool = True, version: bool = True, namespace: str | None = None
) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if version:
        headers[CONTROL if control else WORKER] = "2" if control else "1.20"
    if namespace is not None:
        headers["X-Namespace"] = namespace
    return headers


START = {"workflow_type": "t", "workflow_id": "wf-1"}


@pytest.mark.parametrize("token", [None, "nope", "OT"], ids=["none", "bad", "wrong-case"])
def test_401_without_a_valid_token(secured: Harness, token: str | None) -> None:
    before = secured.snapshot()
    status, doc = secured.call("POST", "/api/workflows", START, headers=auth(token))
    assert (status, doc["reason"], doc["message"]) == (401, "unauthorized", "Invalid or missing authentication token.")
    status, doc = secured.call(
        "POST",
        "/api/worker/workflow-tasks/poll",
        {"worker_id": "w", "task_queue": "q"},
        headers=auth(None, control=False),
    )
    assert (status, doc["reason"], doc["protocol_version"]) == (401, "unauthorized", "1.20")
    assert secured.snapshot() == before


def test_403_names_the_role_and_the_allowed_roles(secured: Harness) -> None:
    status, doc = secured.call("POST", "/api/workflows", START, headers=auth("wt"))
    assert (status, doc["reason"], doc["role"], doc["allowed_roles"]) == (
        403,
        "forbidden",
        "worker",
        ["admin", "operator"],
    )
    assert "protocol_version" not in doc
    for token, role in (("ot", "operator"), ("at", "admin")):
        status, doc = secured.call(
            "POST", "/api/worker/register", {"task_queue": "q", "runtime": "python"}, headers=auth(token, control=False)
        )
        assert (status, doc["reason"], doc["role"], doc["allowed_roles"]) == (403, "forbidden", role, ["worker"])
        assert doc["protocol_version"] == "1.20"  # worker routes answer in the worker envelope


def test_operator_and_admin_may_drive_the_control_plane(secured: Harness) -> None:
    assert secured.call("POST", "/api/workflows", START, headers=auth("ot"))[0] == 201
    assert secured.call("GET", "/api/workflows/wf-1", headers=auth("at"))[0] == 200
    assert (
        secured.call(
            "POST", "/api/worker/register", {"task_queue": "q", "runtime": "python"}, headers=auth("wt", control=False)
        )[0]
        == 201
    )


def test_the_check_order_is_401_403_400_404_422(secured: Harness) -> None:
    """§2.3: a caller cannot learn whether a namespace exists from the status code."""
    bad_body = {"workflow_type": ""}
    cases = [
        # bad token, no version header, unknown namespace, bad body → 401
        (auth("nope", version=False, namespace="ghost"), 401, "unauthorized"),
        # wrong role, no version header, unknown namespace, bad body → 403
        (auth("wt", version=False, namespace="ghost"), 403, "forbidden"),
        # good token, no version header, unknown namespace → 400, not 404
        (auth("ot", version=False, namespace="ghost"), 400, "missing_control_plane_version"),
        # good token and version, unknown namespace, bad body → 404 before 422
        (auth("ot", namespace="ghost"), 404, "namespace_not_found"),
        # all good but the body → 422
        (auth("ot"), 422, "validation_failed"),
    ]
    for headers, status, reason in cases:
        got, doc = secured.call("POST", "/api/workflows", bad_body, headers=headers)
        assert (got, doc["reason"]) == (status, reason), (headers, doc)
    got, doc = secured.call("POST", "/api/workflows", bad_body, headers=auth("ot", namespace="ghost"))
    assert (doc["namespace"], bool(doc["remediation"])) == ("ghost", True)
    # The worker plane keeps the same order (§4.3 ordering cases), in the worker envelope.
    poll = "/api/worker/workflow-tasks/poll"
    for headers, status, reason in [
        (auth("nope", control=False, version=False, namespace="ghost"), 401, "unauthorized"),
        (auth("ot", control=False, version=False, namespace="ghost"), 403, "forbidden"),
        (auth("wt", control=False, version=False, namespace="ghost"), 400, "missing_protocol_version"),
        (auth("wt", control=False, namespace="ghost"), 404, "namespace_not_found"),
        (auth("wt", control=False), 422, "validation_failed"),
    ]:
        got, doc = secured.call("POST", poll, {"task_queue": 5}, headers=headers)
        assert (got, doc["reason"], doc["protocol_version"]) == (status, reason, "1.20"), (headers, doc)


def test_the_namespace_comes_from_the_header_then_the_query_and_is_lowercased(h: Harness) -> None:
    h.server.run_tx(lambda t: t.db.execute("INSERT INTO namespaces (name, created_at) VALUES ('blue', 0)"))
    status, doc = h.call(
        "POST", "/api/workflows", START, control=True, headers={**CONTROL_HEADERS, "X-Namespace": "BLUE"}
    )
    assert (status, doc["namespace"]) == (201, "blue"), doc
    assert h.call("GET", "/api/workflows/wf-1?namespace=blue", control=True)[0] == 200
    assert_control_rejection(h.control("GET", "/workflows/wf-1"), 404, "instance_not_found")  # not in default
    assert_control_rejection(h.control("GET", "/workflows/wf-1?namespace=green"), 404, "namespace_not_found")


# -- health, ready and cluster info (§5, Appendix B, Appendix C) --------------------------------------------


def test_health_and_ready_need_no_credentials(secured: Harness) -> None:
    for path, body in (("/api/health", {"status": "serving"}), ("/api/ready", {"status": "ready"})):
        response = secured.respond("GET", path, headers={})
        doc = response.json()
        assert response.status == 200, doc
        assert {k: doc[k] for k in body} == body
        assert response.header(CONTROL) is None


def test_cluster_info_needs_a_credential_of_any_role_and_no_version_header(secured: Harness) -> None:
    assert secured.call("GET", "/api/cluster/info", headers={})[0] == 401
    for token in ("wt", "ot", "at"):
        status, doc = secured.call(
            "GET", "/api/cluster/info", headers={"Authorization": f"Bearer {token}", "X-Namespace": "ghost"}
        )
        assert status == 200, doc
        assert doc["worker_protocol"]["test_profile"]["auth_enabled"] is True


def test_cluster_info_fields(make: HarnessFactory) -> None:
    h = make(lease_seconds=7, max_active_leases_per_queue=3, activity_lease_seconds=11, query_timeout_seconds=4)
    h.register("w1", build_id="b1")
    response = h.respond("GET", "/api/cluster/info", headers={})
    info = response.json()
    assert response.status == 200, info
    for key in (
        "server_id",
        "version",
        "default_namespace",
        "supported_sdk_versions",
        "capabilities",
        "worker_fleet",
        "task_repair",
        "limits",
        "structural_limits",
        "client_compatibility",
        "auth_composition_contract",
        "control_plane",
        "worker_protocol",
    ):
        assert key in info, key
    assert info["default_namespace"] == "default"
    assert "avro" in info["capabilities"]["payload_codecs"]
    assert info["limits"]["max_payload_bytes"] == 2 * 1024 * 1024
    assert info["limits"]["max_memo_bytes"] == 256 * 1024
    fleet = info["worker_fleet"]
    assert (fleet["namespace"], fleet["active_workers"], fleet["queues"], fleet["build_ids"]) == (
        "default",
        1,
        ["q"],
        ["b1"],
    )
    # Appendix B: what the official SDK's Worker checks before it starts.
    control = info["control_plane"]
    assert (control["version"], control["header"]) == ("2", CONTROL)
    assert (control["request_contract"]["schema"], control["request_contract"]["version"]) == (
        "durable-workflow.v2.control-plane-request.contract",
        1,
    )
    contract = info["auth_composition_contract"]
    assert (contract["schema"], contract["version"]) == ("durable-workflow.v2.auth-composition.contract", 1)
    assert contract["auth_material"]["token"] == {"status": "supported", "effective_config_value": "redacted"}
    assert {"server_url", "namespace", "profile", "auth", "tls", "identity"} <= set(
        contract["effective_config"]["required_fields"]
    )
    worker = info["worker_protocol"]
    assert worker["version"] == "1.20"
    caps = worker["server_capabilities"]
    assert caps["query_tasks"] is True
    assert caps["history_compression"] == {"supported_encodings": ["gzip", "deflate"], "compression_threshold": 50}
    assert set(ALL_TYPES) <= set(caps["supported_workflow_task_commands"])
    # Invariant 7: the same object as on every worker-plane response.
    _status, polled = h.poll("w1")
    assert polled["server_capabilities"] == caps
    assert polled["protocol_version"] == worker["version"]
    # Appendix C: the test knobs in force, read-only.
    profile = worker["test_profile"]
    assert (
        profile["workflow_task_lease_seconds"],
        profile["activity_task_lease_seconds"],
        profile["query_task_timeout_seconds"],
        profile["max_active_leases_per_queue"],
        profile["auth_enabled"],
        "faults" in profile,
    ) == (7, 11, 4, 3, False, False)
