"""Canonical discovery data: what a 1.20 server advertises (docs/reference.md: Discovery).

Pure builders. Every call returns a fresh, independent ``dict`` (the server mutates what it sends, the
suite compares against what it expects, and neither may see the other's edits). Nothing here knows
about server state: the worker fleet, limits and structural budgets of ``GET /api/cluster/info`` are the
server's to add.

* :func:`server_capabilities` is ``worker_protocol.server_capabilities``, also sent as
  ``server_capabilities`` on every worker-plane response (§5.2, Appendix A.1).
* :func:`platform_capabilities` is the top-level ``capabilities`` object (§5.1).
* :func:`worker_protocol_manifest`, :func:`control_plane_contract` and :func:`auth_composition_contract`
  are the three cluster-info objects the official SDK's worker gate reads (Appendix B, Python SDK 2.12.0, Worker
  handshake).
"""

from __future__ import annotations

from typing import Any, Final

from suite.protocol.commands import ALL_TYPES, NON_TERMINAL_TYPES, TERMINAL_TYPES
from suite.protocol.versions import ADVERTISED_VERSION, CONTROL_PLANE_VERSION, CONTROL_PLANE_VERSION_HEADER

__all__ = [
    "AUTH_COMPOSITION_CONTRACT_SCHEMA",
    "CONTROL_PLANE_REQUEST_CONTRACT_SCHEMA",
    "CONTROL_PLANE_RESPONSE_CONTRACT_SCHEMA",
    "CONTROL_PLANE_RESPONSE_SCHEMA",
    "DEFAULT_HISTORY_PAGE_SIZE",
    "HISTORY_COMPRESSION_ENCODINGS",
    "HISTORY_COMPRESSION_THRESHOLD",
    "LONG_POLL_TIMEOUT_DEFAULT",
    "MAX_HISTORY_PAGE_SIZE",
    "NON_TERMINAL_COMMAND_TYPES",
    "PAYLOAD_CODECS",
    "PLATFORM_FLAGS",
    "RESPONSE_COMPRESSION_ENCODINGS",
    "S0_CAPABILITY_KEYS",
    "S0_COMMAND_TYPES",
    "S0_FEATURE_FLAGS",
    "S0_SESSION_CAPABILITY_KEYS",
    "TERMINAL_COMMAND_TYPES",
    "auth_composition_contract",
    "control_plane_contract",
    "platform_capabilities",
    "server_capabilities",
    "worker_protocol_manifest",
]

# §5.2: "Terminal types first, then non-terminal: complete_workflow, fail_workflow, continue_as_new,
# schedule_activity, start_timer, start_child_workflow, complete_update, fail_update, record_side_effect,
# record_version_marker, upsert_search_attributes". UPS keeps this order (index 0 = complete_workflow,
# index 3 = schedule_activity).
TERMINAL_COMMAND_TYPES: Final = TERMINAL_TYPES
NON_TERMINAL_COMMAND_TYPES: Final = NON_TERMINAL_TYPES
S0_COMMAND_TYPES: Final = ALL_TYPES

# §5.2 flags that are ``true`` on a 1.20 server; §16.8 asserts each is exactly ``true``.
S0_FEATURE_FLAGS: Final = (
    "query_tasks",
    "activity_retry_policy",
    "activity_timeouts",
    "child_workflow_retry_policy",
    "child_workflow_timeouts",
    "parent_close_policy",
    "non_retryable_failures",
)
# §5.2: "worker_session_verbs … worker_sessions … Advertise only if worker sessions are implemented".
S0_SESSION_CAPABILITY_KEYS: Final = ("worker_session_verbs", "worker_sessions")
# §5.2: "All 11 S0 capability keys (the §5.2 keys marked S0, including poll_status) SHOULD be present."
# They are exactly the keys the seed's "Discovery capabilities" list names. The two session keys are
# also "advertise only if implemented", so a server without worker sessions (the RS) sends 9 of the 11;
# a check of this SHOULD exempts S0_SESSION_CAPABILITY_KEYS when sessions are not advertised.
S0_CAPABILITY_KEYS: Final = (
    "supported_workflow_task_commands",
    "poll_status",
    *S0_FEATURE_FLAGS,
    *S0_SESSION_CAPABILITY_KEYS,
)

LONG_POLL_TIMEOUT_DEFAULT: Final = 30  # §7.2 default hold, seconds
DEFAULT_HISTORY_PAGE_SIZE: Final = 500  # §8.4 DEFAULT_HISTORY_PAGE_SIZE
MAX_HISTORY_PAGE_SIZE: Final = 1000  # §8.4 "maximum 1000"
HISTORY_COMPRESSION_ENCODINGS: Final = ("gzip", "deflate")  # §8.5, gzip preferred
HISTORY_COMPRESSION_THRESHOLD: Final = 50  # §8.5
RESPONSE_COMPRESSION_ENCODINGS: Final = ("gzip", "deflate")  # §5.1 when HTTP compression is on
# §5.1: "payload_codecs: array of strings, exactly ["avro"] in v2".
PAYLOAD_CODECS: Final = ("avro",)

# §5.1: "capabilities (platform flags) … (all true)".
PLATFORM_FLAGS: Final = (
    "workflow_tasks",
    "activity_tasks",
    "signals",
    "queries",
    "updates",
    "schedules",
    "schedule_jitter",
    "schedule_max_runs",
    "search_attributes",
    "history_export",
    "continue_as_new",
    "child_workflows",
    "activity_timeouts",
    "activity_retry_policy",
    "child_workflow_retry_policy",
    "child_workflow_timeouts",
    "parent_close_policy",
    "non_retryable_failures",
    "history_retention",
    "payload_codec_envelope",
    "payload_codec_envelope_responses",
    "bridge_adapter_outcome_contract",
    "external_executor_config_contract",
    "invocable_carrier_contract",
)

AUTH_COMPOSITION_CONTRACT_SCHEMA: Final = "durable-workflow.v2.auth-composition.contract"
CONTROL_PLANE_REQUEST_CONTRACT_SCHEMA: Final = "durable-workflow.v2.control-plane-request.contract"
CONTROL_PLANE_RESPONSE_SCHEMA: Final = "durable-workflow.v2.control-plane-response"
CONTROL_PLANE_RESPONSE_CONTRACT_SCHEMA: Final = "durable-workflow.v2.control-plane-response.contract"


def _response_compression(response_compression: list[str] | None) -> list[str]:
    # §5.1: "["gzip","deflate"] when HTTP response compression is on, otherwise []".
    return list(response_compression) if response_compression is not None else []


def server_capabilities(*, response_compression: list[str] | None = None) -> dict[str, Any]:
    """``worker_protocol.server_capabilities`` of a 1.20 server: Appendix A.1, key for key and in order.

    ``response_compression`` is the list of HTTP ``Content-Encoding`` values the server applies
    (``["gzip", "deflate"]`` when on); the default ``[]`` is A.1 verbatim. Worker-session keys are never
    added: §5.2 "Advertise only if worker sessions are implemented".
    """
    return {
        "supported_workflow_task_commands": list(S0_COMMAND_TYPES),
        # §5.2: "S0 gives no type, so the RS emits true and the suite accepts true or a non-empty object".
        "poll_status": True,
        "long_poll_timeout": LONG_POLL_TIMEOUT_DEFAULT,
        "workflow_task_poll_request_idempotency": True,
        # §5.2: "The RS should emit both names" (UPS history_page_size_default, S0 default_history_page_size).
        "history_page_size_default": DEFAULT_HISTORY_PAGE_SIZE,
        "default_history_page_size": DEFAULT_HISTORY_PAGE_SIZE,
        "history_page_size_max": MAX_HISTORY_PAGE_SIZE,
        "history_compression": {
            "supported_encodings": list(HISTORY_COMPRESSION_ENCODINGS),
            "compression_threshold": HISTORY_COMPRESSION_THRESHOLD,
        },
        **dict.fromkeys(S0_FEATURE_FLAGS, True),
        "response_compression": _response_compression(response_compression),
    }


def worker_protocol_manifest(*, response_compression: list[str] | None = None) -> dict[str, Any]:
    """``cluster_info.worker_protocol``: ``{version: "1.20", server_capabilities: {…}}`` (§5.1).

    The version is a **string**: "[SPEC] … types worker_protocol.version … as integer. Every
    implementation sends strings … Use strings".
    """
    return {
        "version": ADVERTISED_VERSION,
        "server_capabilities": server_capabilities(response_compression=response_compression),
    }


def platform_capabilities(*, response_compression: list[str] | None = None) -> dict[str, Any]:
    """The top-level ``capabilities`` object of ``GET /api/cluster/info`` (§5.1).

    ``payload_codecs_engine_specific`` is omitted: "present only when non-empty. Omit it in v2."
    """
    return {
        **dict.fromkeys(PLATFORM_FLAGS, True),
        # §5.1 [S0]: "Активний Server оголошує підтримку codecs у capabilities.payload_codecs".
        "payload_codecs": list(PAYLOAD_CODECS),
        "response_compression": _response_compression(response_compression),
    }


def auth_composition_contract() -> dict[str, Any]:
    """``cluster_info.auth_composition_contract``: exactly what the SDK's worker gate requires (Appendix B).

    Each value below answers one Appendix B bullet; removing any of them makes
    ``durable_workflow.auth_composition.parse_auth_composition_contract`` refuse the document.
    """
    return {
        "schema": AUTH_COMPOSITION_CONTRACT_SCHEMA,
        "version": 1,
        # "precedence.connection_values and precedence.profile_selection as string lists".
        "precedence": {
            "connection_values": ["flag", "environment", "selected_profile", "default"],
            "profile_selection": ["flag_env", "DW_ENV", "current_profile", "default_profile"],
        },
        "canonical_environment": {
            "server_url": "DURABLE_WORKFLOW_SERVER_URL",
            "namespace": "DURABLE_WORKFLOW_NAMESPACE",
            "auth_token": "DURABLE_WORKFLOW_AUTH_TOKEN",
            "tls_verify": "DURABLE_WORKFLOW_TLS_VERIFY",
            "profile": "DW_ENV",
        },
        # "auth_material.token as {status:"supported", effective_config_value:"redacted"}";
        # "auth_material.mtls.status and auth_material.signed_headers.status both "reserved"".
        "auth_material": {
            "token": {"status": "supported", "effective_config_value": "redacted"},
            "mtls": {"status": "reserved"},
            "signed_headers": {"status": "reserved"},
        },
        "effective_config": {
            "required_fields": ["server_url", "namespace", "profile", "auth", "tls", "identity"],
        },
        "redaction": {
            "never_echo": ["bearer_tokens", "private_keys", "raw_authorization_headers"],
        },
    }


def control_plane_contract() -> dict[str, Any]:
    """``cluster_info.control_plane`` (§5.1, Appendix B, Python SDK 2.12.0, Worker handshake).

    The SDK gate needs ``version == "2"`` and ``request_contract`` = ``{schema:
    "durable-workflow.v2.control-plane-request.contract", version: 1}``; ``Client.update_workflow`` also
    needs ``request_contract.operations.update.fields.wait_for.canonical_values``. The start
    ``duplicate_policy`` entry states §12.1: "duplicate_policy: fail | use-existing. Any other value
    (including use_existing) gives 422". ``response_contract`` has the upstream shape.
    """
    return {
        "version": CONTROL_PLANE_VERSION,
        "header": CONTROL_PLANE_VERSION_HEADER,
        "response_contract": {
            "schema": CONTROL_PLANE_RESPONSE_SCHEMA,
            "version": 1,
            "contract": {
                "schema": CONTROL_PLANE_RESPONSE_CONTRACT_SCHEMA,
                "version": 1,
                "legacy_field_policy": "reject_non_canonical",
            },
        },
        "request_contract": {
            "schema": CONTROL_PLANE_REQUEST_CONTRACT_SCHEMA,
            "version": 1,
            "operations": {
                "start": {
                    "fields": {
                        "duplicate_policy": {
                            "canonical_values": ["fail", "use-existing"],
                            "rejected_aliases": {"use_existing": "use-existing"},
                        },
                    },
                },
                "update": {
                    "fields": {
                        # §12.2: "wait_for"?: "accepted"|"completed".
                        "wait_for": {"canonical_values": ["accepted", "completed"]},
                    },
                },
            },
        },
    }
