"""The requirement registry, the reason catalogue and the canonical capability data."""

from __future__ import annotations

import copy
import json
from http import HTTPStatus
from typing import Any

import pytest

from suite.protocol import capabilities, reasons, requirements, versions
from suite.protocol.capabilities import (
    S0_CAPABILITY_KEYS,
    S0_COMMAND_TYPES,
    S0_SESSION_CAPABILITY_KEYS,
    TERMINAL_COMMAND_TYPES,
    auth_composition_contract,
    control_plane_contract,
    platform_capabilities,
    server_capabilities,
    worker_protocol_manifest,
)
from suite.protocol.errors import Rejection
from suite.protocol.reasons import (
    ACTIVITY_HEARTBEAT,
    ACTIVITY_HEARTBEAT_STOP_REASONS,
    REASONS,
    WORKER_HEARTBEAT,
    PollStatus,
    heartbeat_cancel_requested,
    reject,
    stop_reason_for,
)
from suite.protocol.requirements import (
    REGISTRY,
    REQUIREMENT_ID_PATTERN,
    Area,
    Level,
    Requirement,
    applicable,
    by_area,
    by_level,
    validate_registry,
)

# ============================================================================================ registry


def test_validate_registry_passes() -> None:
    validate_registry()


@pytest.mark.parametrize("req_id", sorted(REGISTRY))
def test_requirement_is_well_formed(req_id: str) -> None:
    req = REGISTRY[req_id]
    assert req.id == req_id
    assert REQUIREMENT_ID_PATTERN.fullmatch(req_id)
    assert req_id == req_id.upper()
    assert isinstance(req.level, Level)
    assert isinstance(req.area, Area)
    assert 0 <= req.minor <= versions.ADVERTISED_MINOR
    assert req.sentence.strip()
    assert req.cites
    assert req.source.startswith(str(req.cites[0]))


@pytest.mark.parametrize(
    "bad_id", ["lease-exclusive", "LEASE", "LEASE_EXCLUSIVE", "LEASE--X", "-LEASE-X", "1LEASE-X", "LEASE-X-"]
)
def test_id_pattern_rejects(bad_id: str) -> None:
    assert REQUIREMENT_ID_PATTERN.fullmatch(bad_id) is None


def test_stable_ids_named_in_the_brief_exist() -> None:
    for req_id in (
        "VERSION-MISSING",
        "VERSION-MINOR-ABOVE",
        "LEASE-EXCLUSIVE",
        "FENCE-OWNER",
        "ACTIVITY-RETRY-BACKOFF",
    ):
        assert req_id in REGISTRY


def test_levels_follow_the_spec() -> None:
    # The worker plane SHOULD ignore an extra control-plane header; its responses MUST NOT carry control marks.
    assert REGISTRY["ENVELOPE-IGNORE-EXTRA-CONTROL-HEADER"].level is Level.SHOULD
    assert REGISTRY["ENVELOPE-NO-CONTROL-PLANE-MARKS"].level is Level.MUST
    # All 11 capability keys of the Discovery capabilities list SHOULD be present.
    assert REGISTRY["DISCOVERY-S0-KEYS"].level is Level.SHOULD
    assert len(by_level(Level.MUST)) > len(by_level(Level.SHOULD)) > len(by_level(Level.MAY)) > 0


def test_minors() -> None:
    assert REGISTRY["COMMANDS-FAIL-WORKFLOW-EXCEPTION"].minor == 10
    for req_id in (
        "POLL-STATUS-PRESENT",
        "POLL-STATUS-DRAINING-409",
        "POLL-STATUS-THROTTLED",
        "DRAIN-RESUME",
    ):
        assert REGISTRY[req_id].minor == 20
    assert REGISTRY["LEASE-EXCLUSIVE"].minor == 0


def test_applicable() -> None:
    draining = REGISTRY["POLL-STATUS-DRAINING-409"]
    exception = REGISTRY["COMMANDS-FAIL-WORKFLOW-EXCEPTION"]
    lease = REGISTRY["LEASE-EXCLUSIVE"]
    assert applicable(draining, 20)
    assert not applicable(draining, 19)
    assert applicable(exception, 10)
    assert not applicable(exception, 9)
    assert applicable(lease, 0)
    assert all(applicable(req, versions.ADVERTISED_MINOR) for req in REGISTRY.values())


def test_by_area_partitions_the_registry() -> None:
    seen: list[Requirement] = []
    for area in Area:
        reqs = by_area(area)
        assert reqs, f"area {area} has no requirement"
        assert all(req.area is area for req in reqs)
        seen.extend(reqs)
    assert sorted(req.id for req in seen) == sorted(REGISTRY)


def test_seed_semantics_are_registered() -> None:
    # §14.1 (seed-003) and §14.2 (seed-001).
    for req_id in (
        "DISPATCH-ONE-LEASE-PER-DELIVERY",
        "DISPATCH-CRASH-TAKEOVER",
        "DISPATCH-LATE-EVENT-FENCED",
        "DISPATCH-CANCEL-DURABLE",
        "DISPATCH-LOST-NOTIFICATION",
        "HOOKS-OBSERVE-ONLY",
        "HOOKS-FAIL-OPEN",
        "RETRY-ATTEMPTS-CONTIGUOUS",
        "RETRY-FAILED-ATTEMPTS-BOUNDED",
        "ACTIVITY-RETRY-BACKOFF",
        "RETRY-NON-RETRYABLE-FLAG",
        "HISTORY-ONE-TERMINAL-PER-ATTEMPT",
        "RETRY-ONE-OUTCOME-PER-EXECUTION",
        "RETRY-RESUME-ONLY-FINAL",
    ):
        assert req_id in REGISTRY


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        REGISTRY["X-Y"] = REGISTRY["LEASE-EXCLUSIVE"]  # type: ignore[index]


# ============================================================================================= reasons

# Every reason string the protocol names (plus the deregistration and transport ones).
SPEC_REASONS = {
    "unauthorized": 401,
    "forbidden": 403,
    "missing_protocol_version": 400,
    "unsupported_protocol_version": 400,
    "missing_control_plane_version": 400,
    "unsupported_control_plane_version": 400,
    "namespace_not_found": 404,
    "validation_failed": 422,
    "worker_not_registered": 412,
    "task_queue_mismatch": 409,
    "build_id_mismatch": 409,
    "workflow_definition_changed": 409,
    "worker_draining": 409,
    "task_not_found": 404,
    "history_not_available": 404,
    "run_closed": 409,
    "task_not_leased": 409,
    "lease_expired": 409,
    "lease_owner_mismatch": 409,
    "workflow_task_attempt_mismatch": 409,
    "invalid_page_token": 400,
    "invalid_commands": 409,
    "structural_limit_exceeded": 422,
    "run_already_closed": 409,
    "run_timed_out": 409,
    "attempt_not_found": 404,
    "task_mismatch": 409,
    "stale_attempt": 409,
    "run_cancelled": 409,
    "run_terminated": 409,
    "query_task_not_found": 404,
    "query_task_not_leased": 409,
    "query_task_attempt_mismatch": 409,
    "rejected_unknown_query": 404,
    "query_rejected": 409,
    "invalid_query_arguments": 409,
    "query_worker_unavailable": 409,
    "query_worker_timeout": 504,
    "query_task_queue_full": 429,
    "query_task_queue_unavailable": 503,
    "matching_unavailable": 503,
    "instance_not_found": 404,
    "run_not_found": 404,
    "rejected_duplicate": 409,
    "workflow_id_reserved_in_namespace": 409,
    "historical_run_command_rejected": 409,
    "rejected_not_active": 409,
    "rejected_unknown_signal": 404,
    "rejected_unknown_update": 404,
    "rejected_invalid_arguments": 422,
    "update_failed": 422,
    "worker_not_found": 404,
    "unsupported_payload_codec": 422,
    "payload_too_large": 413,
    "headers_too_large": 431,
    "malformed_json": 400,
    "unsupported_media_type": 415,
    "method_not_allowed": 405,
    "route_not_found": 404,
}


@pytest.mark.parametrize(("code", "status"), sorted(SPEC_REASONS.items()))
def test_spec_reason_is_catalogued_with_its_status(code: str, status: int) -> None:
    assert REASONS[code].status == status


@pytest.mark.parametrize("code", sorted(REASONS))
def test_every_catalogued_reason_has_valid_statuses(code: str) -> None:
    reason = REASONS[code]
    assert reason.code == code
    assert code == code.lower()
    assert code.replace("_", "").isalpha()
    for status in reason.accepted_statuses:
        assert HTTPStatus(status)  # a registered HTTP status
    assert reason.status in reason.accepted_statuses
    assert reason.plane in ("worker", "control", "both")
    assert reason.section.strip()
    assert reason.meaning.strip()
    assert reason.default_message.strip()


def test_invalid_json_is_not_a_second_name() -> None:
    assert "invalid_json" not in REASONS


def test_alternative_statuses() -> None:
    assert REASONS["invalid_commands"].accepted_statuses == {409, 422}
    assert REASONS["query_task_queue_unavailable"].accepted_statuses == {503, 200}


def test_worker_not_registered_per_endpoint() -> None:
    reason = REASONS["worker_not_registered"]
    assert reason.status_at() == 412
    assert reason.status_at("POST /api/worker/workflow-tasks/poll") == 412
    assert reason.status_at(WORKER_HEARTBEAT) == 404
    assert reject("worker_not_registered", worker_id="w").status == 412
    assert reject("worker_not_registered", endpoint=WORKER_HEARTBEAT, worker_id="w").status == 404


def test_reject_builds_a_rejection() -> None:
    rejection = reject("workflow_task_attempt_mismatch", current_attempt=2, task_id="t1")
    assert isinstance(rejection, Rejection)
    assert rejection.status == 409
    assert rejection.reason == "workflow_task_attempt_mismatch"
    assert rejection.fields == {"current_attempt": 2, "task_id": "t1"}
    assert rejection.message == REASONS["workflow_task_attempt_mismatch"].meaning


def test_reject_uses_spec_messages_and_overrides() -> None:
    assert reject("unauthorized").message == "Invalid or missing authentication token."
    assert reject("run_closed").message == "Workflow run is already closed."
    assert reject("task_not_found", "Workflow task t1 was not found.").message == "Workflow task t1 was not found."


def test_reject_allows_fields_named_code_and_message() -> None:
    rejection = reject("validation_failed", "bad", code=7)
    assert rejection.fields == {"code": 7}


def test_reject_unknown_code() -> None:
    with pytest.raises(ValueError, match="unknown reason code 'nope'"):
        reject("nope")


@pytest.mark.parametrize("code", ["stale_attempt", "run_cancelled", "run_closed", "task_not_leased"])
def test_heartbeat_body_reasons_are_not_rejections(code: str) -> None:
    assert reject(code).status == 409
    assert REASONS[code].status_at(ACTIVITY_HEARTBEAT) == 200
    with pytest.raises(ValueError, match="not as a rejection"):
        reject(code, endpoint=ACTIVITY_HEARTBEAT)


def test_activity_heartbeat_stop_reasons_table() -> None:
    # §11.5, row by row.
    assert {code: sorted(values) for code, values in ACTIVITY_HEARTBEAT_STOP_REASONS.items()} == {
        "run_cancelled": [True],
        "run_terminated": [True],
        "activity_cancelled": [True],
        "task_cancelled": [True],
        "run_closed": [False],
        "activity_not_running": [False],
        "stale_attempt": [False],
        "stale_task": [False],
        "task_not_leased": [False],
        "attempt_closed": [False, True],
    }
    for code in ACTIVITY_HEARTBEAT_STOP_REASONS:
        assert REASONS[code].status_at(ACTIVITY_HEARTBEAT) == 200
    assert heartbeat_cancel_requested("run_cancelled") is True
    assert heartbeat_cancel_requested("stale_attempt") is False
    assert heartbeat_cancel_requested("attempt_closed") is False
    assert heartbeat_cancel_requested("attempt_closed", attempt_cancelled=True) is True
    with pytest.raises(ValueError, match="not an activity-heartbeat stop reason"):
        heartbeat_cancel_requested("lease_expired")


def test_stop_reasons() -> None:
    assert stop_reason_for("cancelled") == "run_cancelled"
    assert stop_reason_for("terminated") == "run_terminated"
    assert stop_reason_for("completed") == "run_completed"
    assert stop_reason_for("failed") == "run_failed"
    assert stop_reason_for("something_else") == "run_closed"


@pytest.mark.parametrize(
    ("status", "http", "has_task", "reason"),
    [
        (PollStatus.LEASED, 200, True, None),
        (PollStatus.EMPTY, 200, False, None),
        (PollStatus.THROTTLED, 200, False, None),
        (PollStatus.UNAVAILABLE, 503, False, None),
        (PollStatus.DRAINING, 409, False, "worker_draining"),
    ],
)
def test_poll_status(status: PollStatus, http: int, has_task: bool, reason: str | None) -> None:
    assert status.http_status == http
    assert status.has_task is has_task
    assert status.reason == reason
    assert http in status.accepted_http_statuses
    if reason is not None:
        assert REASONS[reason].status == http


def test_poll_status_values() -> None:
    assert [s.value for s in PollStatus] == ["leased", "empty", "throttled", "unavailable", "draining"]
    assert PollStatus.UNAVAILABLE.accepted_http_statuses == {503, 200}
    assert not set(reasons.TOLERATED_POLL_STATUSES) & {s.value for s in PollStatus}


# ======================================================================================== capabilities

# Appendix A.1, verbatim (only the long command list is re-wrapped).
APPENDIX_A1 = json.loads(
    """
{
  "supported_workflow_task_commands": ["complete_workflow","fail_workflow","continue_as_new",
    "schedule_activity","start_timer","start_child_workflow","complete_update","fail_update",
    "record_side_effect","record_version_marker","upsert_search_attributes"],
  "poll_status": true,
  "long_poll_timeout": 30,
  "workflow_task_poll_request_idempotency": true,
  "history_page_size_default": 500,
  "default_history_page_size": 500,
  "history_page_size_max": 1000,
  "history_compression": {"supported_encodings": ["gzip","deflate"], "compression_threshold": 50},
  "query_tasks": true,
  "activity_retry_policy": true,
  "activity_timeouts": true,
  "child_workflow_retry_policy": true,
  "child_workflow_timeouts": true,
  "parent_close_policy": true,
  "non_retryable_failures": true,
  "response_compression": []
}
"""
)


def test_server_capabilities_is_appendix_a1() -> None:
    caps = server_capabilities()
    assert caps == APPENDIX_A1
    assert list(caps) == list(APPENDIX_A1)  # same key order as A.1
    assert json.dumps(caps) == json.dumps(APPENDIX_A1)


def test_server_capabilities_commands_in_order() -> None:
    commands = server_capabilities()["supported_workflow_task_commands"]
    assert tuple(commands) == S0_COMMAND_TYPES
    assert len(S0_COMMAND_TYPES) == 11
    assert commands[: len(TERMINAL_COMMAND_TYPES)] == list(TERMINAL_COMMAND_TYPES)
    assert commands[0] == "complete_workflow"
    assert commands[3] == "schedule_activity"


def test_server_capabilities_fresh_each_call() -> None:
    first = server_capabilities()
    first["supported_workflow_task_commands"].append("x")
    first["history_compression"]["supported_encodings"].clear()
    first["poll_status"] = False
    assert server_capabilities() == APPENDIX_A1


def test_server_capabilities_response_compression() -> None:
    encodings = ["gzip", "deflate"]
    caps = server_capabilities(response_compression=encodings)
    assert caps["response_compression"] == ["gzip", "deflate"]
    encodings.append("br")
    assert caps["response_compression"] == ["gzip", "deflate"]
    assert {k: v for k, v in caps.items() if k != "response_compression"} == {
        k: v for k, v in APPENDIX_A1.items() if k != "response_compression"
    }


def test_s0_capability_keys() -> None:
    assert len(S0_CAPABILITY_KEYS) == 11
    assert "poll_status" in S0_CAPABILITY_KEYS
    present = set(server_capabilities())
    # The RS implements no worker sessions, so it sends exactly the other nine (§5.2, Appendix A.1).
    assert set(S0_CAPABILITY_KEYS) - present == set(S0_SESSION_CAPABILITY_KEYS)


def test_invariant_8_holds_for_the_canonical_data() -> None:
    caps = server_capabilities()
    assert "avro" in platform_capabilities()["payload_codecs"]
    assert set(S0_COMMAND_TYPES) <= set(caps["supported_workflow_task_commands"])
    for flag in capabilities.S0_FEATURE_FLAGS:
        assert caps[flag] is True
    assert caps["poll_status"]


def test_platform_capabilities() -> None:
    caps = platform_capabilities()
    assert caps["payload_codecs"] == ["avro"]
    assert caps["response_compression"] == []
    assert "payload_codecs_engine_specific" not in caps
    assert all(caps[flag] is True for flag in capabilities.PLATFORM_FLAGS)
    assert len(capabilities.PLATFORM_FLAGS) == 24
    assert platform_capabilities(response_compression=["gzip", "deflate"])["response_compression"] == [
        "gzip",
        "deflate",
    ]
    caps["payload_codecs"].append("json")
    assert platform_capabilities()["payload_codecs"] == ["avro"]


def test_worker_protocol_manifest() -> None:
    manifest = worker_protocol_manifest()
    assert manifest == {"version": "1.20", "server_capabilities": APPENDIX_A1}
    assert isinstance(manifest["version"], str)


def test_control_plane_contract() -> None:
    contract = control_plane_contract()
    assert contract["version"] == "2"
    assert contract["header"] == "X-Durable-Workflow-Control-Plane-Version"
    request = contract["request_contract"]
    assert request["schema"] == "durable-workflow.v2.control-plane-request.contract"
    assert request["version"] == 1
    assert request["operations"]["update"]["fields"]["wait_for"]["canonical_values"] == [
        "accepted",
        "completed",
    ]
    assert contract["response_contract"]["schema"] == "durable-workflow.v2.control-plane-response"
    assert control_plane_contract() == contract
    assert control_plane_contract() is not contract


# Appendix B, one assertion per bullet.
def test_auth_composition_contract_satisfies_appendix_b() -> None:
    contract = auth_composition_contract()
    assert contract["schema"] == "durable-workflow.v2.auth-composition.contract"
    assert contract["version"] == 1
    for key in ("connection_values", "profile_selection"):
        values = contract["precedence"][key]
        assert isinstance(values, list)
        assert all(isinstance(v, str) for v in values)
    assert contract["canonical_environment"] == {
        "server_url": "DURABLE_WORKFLOW_SERVER_URL",
        "namespace": "DURABLE_WORKFLOW_NAMESPACE",
        "auth_token": "DURABLE_WORKFLOW_AUTH_TOKEN",
        "tls_verify": "DURABLE_WORKFLOW_TLS_VERIFY",
        "profile": "DW_ENV",
    }
    assert contract["auth_material"]["token"] == {"status": "supported", "effective_config_value": "redacted"}
    assert contract["auth_material"]["mtls"]["status"] == "reserved"
    assert contract["auth_material"]["signed_headers"]["status"] == "reserved"
    assert {"server_url", "namespace", "profile", "auth", "tls", "identity"} <= set(
        contract["effective_config"]["required_fields"]
    )
    assert {"bearer_tokens", "private_keys", "raw_authorization_headers"} <= set(contract["redaction"]["never_echo"])


# ============================================================================ the official SDK's own gate


def cluster_info() -> dict[str, Any]:
    """The part of ``GET /api/cluster/info`` the SDK Worker gate reads, built only from the builders."""
    return {
        "control_plane": control_plane_contract(),
        "worker_protocol": worker_protocol_manifest(),
        "auth_composition_contract": auth_composition_contract(),
        "capabilities": platform_capabilities(),
    }


@pytest.fixture
def sdk_gate(monkeypatch: pytest.MonkeyPatch) -> Any:
    worker = pytest.importorskip("durable_workflow.worker")
    monkeypatch.delenv("DURABLE_WORKFLOW_WORKER_PROTOCOL_VERSION", raising=False)
    return worker._validate_server_compatibility


@pytest.mark.sdk
def test_sdk_accepts_the_canonical_cluster_info(sdk_gate: Any) -> None:
    sdk_gate(cluster_info())


@pytest.mark.sdk
def test_sdk_accepts_it_at_its_minimum_minor(sdk_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_WORKFLOW_WORKER_PROTOCOL_VERSION", "1.19")
    sdk_gate(cluster_info())


@pytest.mark.sdk
def test_sdk_parses_the_auth_contract() -> None:
    auth = pytest.importorskip("durable_workflow.auth_composition")
    parsed = auth.parse_auth_composition_contract(auth_composition_contract())
    assert parsed.supports_token_auth
    assert parsed.reserves_mtls
    assert parsed.reserves_signed_headers


@pytest.mark.sdk
@pytest.mark.parametrize(
    "path",
    [
        ("control_plane", "version"),
        ("control_plane", "request_contract", "schema"),
        ("worker_protocol", "version"),
        ("auth_composition_contract", "auth_material", "mtls"),
        ("auth_composition_contract", "canonical_environment", "profile"),
        ("auth_composition_contract", "redaction", "never_echo"),
    ],
    ids="/".join,
)
def test_sdk_gate_is_really_exercised(sdk_gate: Any, path: tuple[str, ...]) -> None:
    """Removing any one piece the gate needs makes the SDK refuse: the acceptance above is not vacuous."""
    info = copy.deepcopy(cluster_info())
    node = info
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(RuntimeError, match="Server compatibility error"):
        sdk_gate(info)


@pytest.mark.sdk
def test_sdk_refuses_an_older_advertised_minor(sdk_gate: Any) -> None:
    info = cluster_info()
    info["worker_protocol"]["version"] = "1.19"
    with pytest.raises(RuntimeError, match=r"incompatible worker_protocol\.version"):
        sdk_gate(info)


def test_modules_export_what_they_define() -> None:
    for module in (versions, reasons, capabilities, requirements):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.__all__ names missing {name}"
