"""The requirement registry: every normative rule of worker protocol 1.20 with a stable ID.

Every requirement has a stable ID, its level (MUST / SHOULD / MAY), the protocol minor that introduced it, its
normative sentence, and its provenance: the sections of the public documents it comes from
(:mod:`suite.protocol.documents`). ``docs/reference.md`` is generated from this registry
(``python -m suite.reference``); the code that enforces a rule — in the model, the server or a check — cites
its ID.

IDs are UPPER-KEBAB, grouped by a prefix that names the subject (``VERSION-``, ``LEASE-``, ``FENCE-`` …).
**An ID never changes once published**: reports, ``-k`` selections and configuration key on it.
Add new requirements; retire an old one only by keeping its ID with an updated sentence.

``minor`` is the protocol minor that introduced the rule (1.0 ⇒ 0). Where the documents do not say, the
reading is a judgement and is marked ``# minor: judgement`` next to the entry. The rules used:

* everything the 1.0–1.15 releases of the server and the workflow package already have is 0;
* ``fail_workflow.exception`` is 10 (its command type says "minimum protocol 1.10");
* ``poll_status`` and the poll outcomes ``throttled`` / ``draining`` (409 ``worker_draining``) exist
  only in worker protocol 1.20; no earlier release has them, so they are 20.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from suite.protocol.documents import (
    DISPATCH,
    PYTHON_SDK,
    READINGS,
    SCHEDULING,
    SERVER,
    WORKER_PROTOCOL,
    WORKFLOW_PACKAGE,
    Citation,
    Document,
    cite,
)
from suite.protocol.versions import ADVERTISED_MINOR, minor_supports

__all__ = [
    "REGISTRY",
    "REQUIREMENT_ID_PATTERN",
    "TEST_PROFILE",
    "Area",
    "Level",
    "Requirement",
    "applicable",
    "by_area",
    "by_level",
    "validate_registry",
]


class Level(StrEnum):
    """RFC 2119 level. A broken MUST is a failure, a broken SHOULD is non-strict (STYLE.md §5)."""

    MUST = "MUST"
    SHOULD = "SHOULD"
    MAY = "MAY"


class Area(StrEnum):
    """The subject a requirement belongs to; a report groups by it."""

    VERSIONING = "versioning"
    ENVELOPE = "envelope"
    AUTH = "auth"
    DISCOVERY = "discovery"
    REGISTRATION = "registration"
    LONG_POLL = "long-poll"
    POLL_STATUS = "poll-status"
    LEASING = "leasing"
    IDEMPOTENCY = "idempotency"
    FENCING = "fencing"
    EXPIRY = "expiry"
    COMMANDS = "commands"
    PAYLOAD_SHAPE = "payload-shape"
    HISTORY = "history"
    COMPRESSION = "compression"
    CANCELLATION = "cancellation"
    ACTIVITIES = "activities"
    RETRIES = "retries"
    TIMEOUTS = "timeouts"
    QUERIES = "queries"
    CONTROL_PLANE = "control-plane"
    CODEC = "codec"
    ROBUSTNESS = "robustness"
    LIFECYCLE_HOOKS = "lifecycle-hooks"
    DISPATCH = "dispatch"
    SESSIONS = "worker-sessions"
    CHILDREN = "children"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One normative rule."""

    id: str
    level: Level
    area: Area
    minor: int  # protocol minor that introduced it (1.0 => 0); judgements are commented at the entry
    cites: tuple[Citation, ...]  # where the rule comes from, the section that states it first
    sentence: str  # the normative sentence
    # The key of worker_protocol.test_profile (a setting or a control, see TEST_PROFILE) through which alone
    # a black-box suite can cover this rule in reasonable time; None: any conforming server can be checked.
    profile: str | None = None

    @property
    def source(self) -> str:
        """The provenance as one line: every citation, the first one the section that states the rule."""
        return "; ".join(str(c) for c in self.cites)

    @property
    def section(self) -> str:
        """The section that states the rule, as a table cell shows it (document · section)."""
        return self.cites[0].short


REQUIREMENT_ID_PATTERN: Final = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$")

MUST, SHOULD, MAY = Level.MUST, Level.SHOULD, Level.MAY
_A = Area


def _citer(document: Document) -> Callable[..., Citation]:
    def citation(section: str, detail: str = "") -> Citation:
        return cite(document, section, detail)

    return citation


_wp, _hook, _af = _citer(WORKER_PROTOCOL), _citer(DISPATCH), _citer(SCHEDULING)
_srv, _pkg, _sdk, _read = _citer(SERVER), _citer(WORKFLOW_PACKAGE), _citer(PYTHON_SDK), _citer(READINGS)


def _r(
    id: str,
    level: Level,
    area: Area,
    sentence: str,
    *,
    cites: tuple[Citation, ...],
    minor: int = 0,
) -> Requirement:
    return Requirement(id=id, level=level, area=area, minor=minor, cites=cites, sentence=sentence)


_REQUIREMENTS: Final[tuple[Requirement, ...]] = (
    # ======================================================================================= versioning
    _r(
        "VERSION-MISSING",
        MUST,
        _A.VERSIONING,
        "A worker-plane request without X-Durable-Workflow-Protocol-Version returns 400 "
        'reason:"missing_protocol_version", and requested_version is null.',
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-EMPTY-IS-MISSING",
        MUST,
        _A.VERSIONING,
        "An empty or whitespace-only X-Durable-Workflow-Protocol-Version behaves exactly like a missing one "
        "(empty after trimming counts as missing).",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-MAJOR-MISMATCH",
        MUST,
        _A.VERSIONING,
        "A worker version header with a different major (0.9, 2.0, 999) returns 400 "
        'reason:"unsupported_protocol_version".',
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-MINOR-ABOVE",
        MUST,
        _A.VERSIONING,
        "A worker version header with the same major and a minor above the server's (1.21 on a 1.20 server) "
        'returns 400 reason:"unsupported_protocol_version".',
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-MALFORMED",
        MUST,
        _A.VERSIONING,
        "A worker version header that does not match ^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)$ after trimming "
        '(abc, 1, 1.2.3, v1.2, 1.x, 1.05) returns 400 reason:"unsupported_protocol_version"; there is no '
        "separate malformed code.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-REQUESTED-ECHO",
        MUST,
        _A.VERSIONING,
        "An unsupported_protocol_version rejection's requested_version echoes the value sent, after trimming.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-ERROR-BODY",
        MUST,
        _A.VERSIONING,
        "A worker version rejection carries reason, error, supported_version (the advertised version), "
        "requested_version and remediation, inside the worker envelope.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-ACCEPTED-RANGE-FIELD",
        MAY,
        _A.VERSIONING,
        'A version rejection may add "accepted_versions": {"min": "1.0", "max": "1.20"}.',
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-TRIM",
        MUST,
        _A.VERSIONING,
        "The worker version header is trimmed of surrounding whitespace before it is parsed, so ' 1.20 ' is "
        "accepted as 1.20.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-OLDER-MINOR-ACCEPTED",
        MUST,
        _A.VERSIONING,
        "Every minor from 1.0 to the advertised minor is accepted on every worker route: a server 1.N "
        "accepts 1.M for every M ≤ N.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "VERSION-NO-NEWER-REQUIRED-FIELDS",
        MUST,
        _A.VERSIONING,
        "A server MUST NOT require fields that were introduced after the worker's minor.",
        cites=(_wp("Protocol version"),),
    ),
    # ========================================================================================= envelope
    _r(
        "ENVELOPE-VERSION-HEADER",
        MUST,
        _A.ENVELOPE,
        "Every worker-plane response, success or error (400, 401, 403, 404, 409, 412, 422, 503), carries "
        "the header X-Durable-Workflow-Protocol-Version equal to the advertised version.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker protocol envelope"),
        ),
    ),
    _r(
        "ENVELOPE-PROTOCOL-VERSION-BODY",
        MUST,
        _A.ENVELOPE,
        "Every worker-plane response body, success or error, carries protocol_version equal to the advertised version.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker protocol envelope"),
        ),
    ),
    _r(
        "ENVELOPE-SERVER-CAPABILITIES",
        MUST,
        _A.ENVELOPE,
        "Every worker-plane response body, success or error, carries a server_capabilities object.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker protocol envelope"),
        ),
    ),
    _r(
        "ENVELOPE-NO-MINOR-ECHO",
        MUST,
        _A.ENVELOPE,
        "The version echoed in the header and in protocol_version is the advertised one, never the client's "
        "older requested minor.",
        cites=(
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
        ),
    ),
    _r(
        "ENVELOPE-NO-CONTROL-PLANE-MARKS",
        MUST,
        _A.ENVELOPE,
        "Worker-plane responses MUST NOT carry the X-Durable-Workflow-Control-Plane-Version header or a "
        "control_plane body key, even when the request sent both version headers.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker protocol envelope"),
        ),
    ),
    _r(
        "ENVELOPE-IGNORE-EXTRA-CONTROL-HEADER",
        SHOULD,
        _A.ENVELOPE,
        "The worker plane SHOULD ignore an extra control-plane header and still answer in the worker envelope.",
        cites=(_srv("AuthNamespaceProtocolOrderingContractTest"),),
    ),
    _r(
        "ENVELOPE-ERROR-REASON",
        MUST,
        _A.ENVELOPE,
        "Every error body carries reason, a snake-case machine-readable code.",
        cites=(_srv("Worker protocol envelope"),),
    ),
    _r(
        "ENVELOPE-ERROR-AND-MESSAGE",
        SHOULD,
        _A.ENVELOPE,
        "A server SHOULD emit both error and message in error bodies.",
        cites=(
            _srv("Worker protocol envelope"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "ENVELOPE-JSON-BODIES",
        MUST,
        _A.ENVELOPE,
        "Every body is application/json, including error bodies.",
        cites=(_pkg("Platform protocol specs"),),
    ),
    _r(
        "SCHEMA-RESPONSES",
        MUST,
        _A.ENVELOPE,
        "Every response matches the JSON Schema of its message in schemas/ (each endpoint and status has one).",
        cites=(
            _srv("Worker protocol envelope"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    # ============================================================================================= auth
    _r(
        "AUTH-BEFORE-VERSION",
        MUST,
        _A.AUTH,
        "A bad credential with no version header gives 401, not 400 (authentication is checked first).",
        cites=(_srv("AuthNamespaceProtocolOrderingContractTest"),),
    ),
    _r(
        "VERSION-BEFORE-NAMESPACE",
        MUST,
        _A.AUTH,
        "No version header with an unknown namespace gives 400, not 404, so a caller cannot learn whether a "
        "namespace exists from the status code.",
        cites=(_srv("AuthNamespaceProtocolOrderingContractTest"),),
    ),
    _r(
        "NAMESPACE-NOT-FOUND",
        MUST,
        _A.AUTH,
        "A valid version header with an unknown X-Namespace gives 404 namespace_not_found.",
        cites=(_srv("Namespaces"),),
    ),
    _r(
        "AUTH-MISSING-TOKEN",
        MUST,
        _A.AUTH,
        "When auth is enabled, a request with no token returns 401 unauthorized in the plane's envelope.",
        cites=(
            _srv("AuthNamespaceProtocolOrderingContractTest"),
            _srv("Authentication and roles"),
        ),
    ),
    _r(
        "AUTH-BAD-TOKEN",
        MUST,
        _A.AUTH,
        "When auth is enabled, a request with a bad token returns 401 unauthorized in the plane's envelope.",
        cites=(
            _srv("AuthNamespaceProtocolOrderingContractTest"),
            _srv("Authentication and roles"),
        ),
    ),
    _r(
        "AUTH-ROLE-FORBIDDEN",
        MUST,
        _A.AUTH,
        "When role tokens are configured, an operator token on a worker route returns 403 forbidden with "
        "role and allowed_roles, in the worker envelope.",
        cites=(
            _srv("AuthNamespaceProtocolOrderingContractTest"),
            _srv("Authentication and roles"),
        ),
    ),
    _r(
        "NAMESPACE-SCOPED",
        MUST,
        _A.AUTH,
        "Everything is namespace-scoped: a task id from namespace A used with X-Namespace: B behaves as not "
        "found (404 task_not_found / query_task_not_found).",
        cites=(_srv("Namespaces"),),
    ),
    # ======================================================================================== discovery
    _r(
        "DISCOVERY-CLUSTER-INFO",
        MUST,
        _A.DISCOVERY,
        "GET /api/cluster/info with only a credential (no version headers) returns 200.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "DISCOVERY-VERSION-MATCHES",
        MUST,
        _A.DISCOVERY,
        "worker_protocol.version MUST equal the protocol_version in worker-plane responses.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-CAPABILITIES-MATCH",
        MUST,
        _A.DISCOVERY,
        "worker_protocol.server_capabilities deep-equals the server_capabilities returned on worker-plane responses.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-PAYLOAD-CODECS-AVRO",
        MUST,
        _A.DISCOVERY,
        'capabilities.payload_codecs MUST contain "avro".',
        cites=(
            _srv("HealthController::clusterInfo"),
            _pkg("Platform protocol specs"),
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-S0-COMMANDS",
        MUST,
        _A.DISCOVERY,
        "supported_workflow_task_commands is a superset of the 11 command types the worker protocol's Command "
        "types list names.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-FEATURE-FLAGS",
        MUST,
        _A.DISCOVERY,
        "query_tasks, activity_retry_policy, activity_timeouts, child_workflow_retry_policy, "
        "child_workflow_timeouts, parent_close_policy and non_retryable_failures are true.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-POLL-STATUS",
        MUST,
        _A.DISCOVERY,
        "The poll_status capability is truthy (true or a non-empty object).",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
        minor=20,  # minor: judgement (poll_status exists only in the 1.20 seed)
    ),
    _r(
        "DISCOVERY-S0-KEYS",
        SHOULD,
        _A.DISCOVERY,
        "All 11 capability keys the worker protocol's Discovery capabilities list names "
        "(supported_workflow_task_commands, poll_status, query_tasks, activity_retry_policy, activity_timeouts, "
        "child_workflow_retry_policy, child_workflow_timeouts, parent_close_policy, non_retryable_failures, "
        "worker_session_verbs, worker_sessions) SHOULD be present; the two worker-session keys only when worker "
        "sessions are implemented.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
    ),
    _r(
        "DISCOVERY-SESSIONS-ONLY-IF-IMPLEMENTED",
        MUST,
        _A.DISCOVERY,
        "worker_session_verbs and worker_sessions are advertised only if worker sessions are implemented.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "DISCOVERY-PAGE-SIZE-BOTH-NAMES",
        SHOULD,
        _A.DISCOVERY,
        "A server should emit both history_page_size_default and default_history_page_size.",
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "DISCOVERY-VERSION-STRINGS",
        SHOULD,
        _A.DISCOVERY,
        'worker_protocol.version and control_plane.version are strings ("1.20" and "2"), not integers.',
        cites=(
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "DISCOVERY-SDK-GATE",
        SHOULD,
        _A.DISCOVERY,
        'cluster/info carries control_plane {version "2", request_contract '
        "durable-workflow.v2.control-plane-request.contract v1} and a valid auth_composition_contract, so "
        "the official Python SDK Worker starts.",
        cites=(_wp("Protocol version"),),
    ),
    # ==================================================================================== control-plane
    _r(
        "CONTROL-VERSION-MISSING",
        MUST,
        _A.CONTROL_PLANE,
        "A control-plane call without X-Durable-Workflow-Control-Plane-Version (or with an empty one) "
        "returns 400 missing_control_plane_version.",
        cites=(_srv("Control-plane version"),),
    ),
    _r(
        "CONTROL-VERSION-UNSUPPORTED",
        MUST,
        _A.CONTROL_PLANE,
        'A control-plane call whose version header is anything other than "2" after trimming returns 400 '
        "unsupported_control_plane_version with supported_version, requested_version and remediation.",
        cites=(_srv("Control-plane version"),),
    ),
    _r(
        "CONTROL-VERSION-EXEMPT",
        MUST,
        _A.CONTROL_PLANE,
        "GET /api/cluster/info, /api/health and /api/ready are exempt from both version headers.",
        cites=(
            _srv("Control-plane version"),
            _wp("Protocol version"),
            _pkg("Platform protocol specs"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "CONTROL-ENVELOPE",
        SHOULD,
        _A.CONTROL_PLANE,
        "Control-plane responses carry X-Durable-Workflow-Control-Plane-Version: 2 and have no "
        "protocol_version or server_capabilities.",
        cites=(_srv("Control-plane version"),),
    ),
    _r(
        "CONTROL-START",
        MUST,
        _A.CONTROL_PLANE,
        "POST /api/workflows returns 201 for started_new, 200 for returned_existing_active (use-existing) "
        "and 409 rejected_duplicate when an active run exists under the default fail policy.",
        cites=(
            _wp("Starting a workflow"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "CONTROL-HISTORICAL-RUN",
        MUST,
        _A.CONTROL_PLANE,
        "A run-targeted command on a non-current run gives 409 historical_run_command_rejected.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "CONTROL-UNKNOWN-WORKFLOW",
        MUST,
        _A.CONTROL_PLANE,
        "An unknown workflow gives 404 instance_not_found; an unknown run gives 404 run_not_found.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "SIGNAL-RECORDED-AND-WAKES",
        MUST,
        _A.CONTROL_PLANE,
        "A signal to an open run returns 202 (outcome signal_received), records one SignalReceived and makes a "
        "workflow task available for the run.",
        cites=(
            _srv("Control-plane workflow routes"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "SIGNAL-CLOSED-RUN-REJECTED",
        MUST,
        _A.CONTROL_PLANE,
        "A signal to a closed run returns 409 (rejected_not_active) and records nothing.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "UPDATE-ACCEPTED-RECORDED",
        MUST,
        _A.CONTROL_PLANE,
        "An update with wait_for accepted returns 202 with update_status accepted and records UpdateAccepted.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "UPDATE-WAIT-COMPLETED",
        MUST,
        _A.CONTROL_PLANE,
        "An update with wait_for completed blocks until a workflow task applies complete_update (200 with the "
        "result) or fail_update (422 update_failed) for that update_id.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "UPDATE-FAIL-FIELDS",
        MUST,
        _A.CONTROL_PLANE,
        "fail_update closes an accepted update as failed with a required message and the optional "
        "exception_class, exception_type and non_retryable: the update's failure, as its history and the "
        "422 update_failed answer carry it, keeps each as given.",
        cites=(
            _wp("Command types", "fail_update"),
            _wp("Discovery capabilities", "non_retryable_failures"),
        ),
    ),
    _r(
        "UPDATE-CLOSED-AT-MOST-ONCE",
        MUST,
        _A.CONTROL_PLANE,
        "An accepted update is closed at most once: complete_update or fail_update for an update that is not "
        "accepted and open is an invalid command batch.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "UPDATE-CLOSED-RUN-REJECTED",
        MUST,
        _A.CONTROL_PLANE,
        "An update to a closed run is refused with 409 and records nothing.",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "CONTROL-CANCEL-CLOSES-RUN",
        MUST,
        _A.CONTROL_PLANE,
        "Cancel and terminate close the run immediately (status cancelled or terminated, with closed_reason "
        "the same value).",
        cites=(_srv("Control-plane workflow routes"),),
    ),
    _r(
        "RUN-TIMEOUT-CLOSES-RUN",
        MUST,
        _A.CONTROL_PLANE,
        "A run started with run_timeout_seconds (or execution_timeout_seconds) that is still open that many "
        "seconds after it started is closed as failed with closed_reason timed_out and one WorkflowTimedOut, "
        "not before, whether a workflow task is open or the run waits; an execution's timeout counts from its "
        "first run, so a run that began with a continue-as-new closes at the deadline its execution had.",
        cites=(
            _srv("Control-plane workflow routes", "start execution_timeout_seconds, run_timeout_seconds"),
            _wp("Completion, heartbeat and fail requests", "run_timed_out"),
        ),
    ),
    # ===================================================================================== registration
    _r(
        "REGISTER-CREATED",
        MUST,
        _A.REGISTRATION,
        'register with task_queue and runtime:"python" returns 201 {registered:true, worker_id}.',
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "REGISTER-IDEMPOTENT",
        MUST,
        _A.REGISTRATION,
        "Re-registering the same worker id is an upsert keyed by (namespace, worker_id) and also returns 201.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "REGISTER-VALIDATION",
        MUST,
        _A.REGISTRATION,
        "register with a missing task_queue or runtime, or an unknown runtime, returns 422 validation_failed.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "REGISTER-ACCEPT-RUST",
        SHOULD,
        _A.REGISTRATION,
        "A server SHOULD also accept runtime rust, because the worker protocol names Rust among the SDKs.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "REGISTER-TOLERATE-EXTRAS",
        MUST,
        _A.REGISTRATION,
        "SDK extras on register (capabilities, workflow_command_contracts, task_slots, process_metrics, "
        "heartbeat_interval_seconds) must be tolerated.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "MATCH-REGISTERED-TYPES",
        MUST,
        _A.REGISTRATION,
        "A poll finds ready tasks by queue and compatibility criteria: a workflow or activity task is leased only "
        "to a worker that registered its workflow or activity type (or registered no types).",
        cites=(
            _wp("Workflow Task Bridge", "poll by queue and compatibility criteria"),
            _wp("Activity Task Bridge", "poll by queue and compatibility criteria"),
        ),
    ),
    _r(
        "REGISTER-FINGERPRINT-CONFLICT",
        MUST,
        _A.REGISTRATION,
        "An active registration that re-registers with a different fingerprint for the same workflow type "
        "gets 409 workflow_definition_changed with workflow_type.",
        cites=(
            _wp("Discovery capabilities"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "DEREGISTER-RELEASES-LEASES",
        MUST,
        _A.REGISTRATION,
        "DELETE /api/worker/registrations/{worker_id} answers 200 outcome deregistered with "
        "recovered_workflow_task_count, the workflow tasks whose live leases it held; each is ready again at once "
        "(the next poll leases it as the next attempt, without waiting for the lease to expire) and the worker's "
        "reports about it are fenced; a task it no longer held is not changed.",
        cites=(
            _sdk("Worker handshake", "DELETE /worker/registrations: recovered_workflow_task_count"),
            _srv("Worker registration"),
        ),
    ),
    _r(
        "WORKER-HEARTBEAT-ACK",
        MUST,
        _A.REGISTRATION,
        "POST /api/worker/heartbeat for a registered worker returns 200 with acknowledged:true; an unknown "
        "worker returns 404 worker_not_registered.",
        cites=(_srv("Worker registration"),),
    ),
    _r(
        "POLL-NOT-REGISTERED",
        MUST,
        _A.REGISTRATION,
        "Polling with an unregistered worker_id returns 412 worker_not_registered.",
        cites=(_srv("WorkflowTaskPoller"),),
    ),
    _r(
        "POLL-QUEUE-MISMATCH",
        MUST,
        _A.REGISTRATION,
        "Polling a task_queue other than the registered one returns 409 task_queue_mismatch with "
        "registered_task_queue and requested_task_queue.",
        cites=(_srv("WorkflowTaskPoller"),),
    ),
    _r(
        "POLL-BUILD-ID-MISMATCH",
        MUST,
        _A.REGISTRATION,
        "A poll build_id different from the registered non-empty build_id returns 409 build_id_mismatch.",
        cites=(_srv("WorkflowTaskPoller"),),
    ),
    _r(
        "POLL-MISSING-FIELDS",
        MUST,
        _A.REGISTRATION,
        "Missing worker_id or task_queue on any poll returns 422 validation_failed, not 5xx.",
        cites=(_srv("WorkflowTaskPoller"),),
    ),
    # ======================================================================================== long-poll
    _r(
        "LONGPOLL-HOLD",
        MUST,
        _A.LONG_POLL,
        "An empty queue polled with timeout_seconds t returns 200 with task:null after roughly t seconds; "
        "timeout_seconds is honoured per request.",
        cites=(
            _wp("Long-poll semantics"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "LONGPOLL-DEFAULT-HOLD",
        MUST,
        _A.LONG_POLL,
        "A poll without timeout_seconds holds the default of 30 s (or the long_poll_default_seconds a test profile "
        "declares, clamped like any other to its long_poll_max_seconds) before it answers task:null on an empty "
        "queue.",
        cites=(_wp("Long-poll semantics"),),
    ),
    _r(
        "LONGPOLL-CLAMP-MAX",
        MUST,
        _A.LONG_POLL,
        "timeout_seconds above 60 is clamped: a poll with 120 returns within 60 s plus slack.",
        cites=(_wp("Long-poll semantics"),),
    ),
    _r(
        "LONGPOLL-CLAMP-MIN",
        MUST,
        _A.LONG_POLL,
        "timeout_seconds of 0 or below is clamped to 1: such a poll returns within 1 s plus slack.",
        cites=(
            _wp("Long-poll semantics"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "LONGPOLL-IMMEDIATE-DELIVERY",
        MUST,
        _A.LONG_POLL,
        "If a matching task becomes ready while the server is waiting, the server MUST return it "
        "immediately, well before the timeout.",
        cites=(_wp("Long-poll semantics"),),
    ),
    # ====================================================================================== poll-status
    _r(
        "POLL-STATUS-EMPTY",
        MUST,
        _A.POLL_STATUS,
        'A poll whose timeout expires returns the normal envelope with task:null and poll_status:"empty", HTTP 200.',
        cites=(
            _wp("Long-poll semantics"),
            _wp("Execution semantics"),
        ),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-PRESENT",
        MUST,
        _A.POLL_STATUS,
        "Every poll response (workflow, activity and query) has poll_status.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-TASK-IFF-LEASED",
        MUST,
        _A.POLL_STATUS,
        'task != null if and only if poll_status == "leased".',
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-NULL-TASK",
        MUST,
        _A.POLL_STATUS,
        "When poll_status is empty, throttled, unavailable or draining, task is null.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-DRAINING-409",
        MUST,
        _A.POLL_STATUS,
        'poll_status "draining" comes with HTTP 409 and reason:"worker_draining".',
        cites=(
            _wp("Poll response status"),
            _read("Where the documents disagree"),
        ),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-THROTTLED",
        MUST,
        _A.POLL_STATUS,
        'Admission backpressure is reported as HTTP 200 with poll_status:"throttled" and task:null, never as '
        "an empty poll.",
        cites=(
            _wp("Poll response status"),
            _read("Where the documents disagree"),
        ),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-RETRY-AFTER",
        SHOULD,
        _A.POLL_STATUS,
        "A throttled poll SHOULD include retry_after_seconds.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "POLL-STATUS-UNAVAILABLE",
        MUST,
        _A.POLL_STATUS,
        "When the queue or matching layer cannot coordinate safely, the poll returns "
        'poll_status:"unavailable" with task:null and a reason, as 503 (or 200).',
        cites=(
            _wp("Poll response status"),
            _srv("Workflow task history, heartbeat, complete and fail"),
        ),
        minor=20,  # minor: judgement
    ),
    _r(
        "DRAIN-REFUSES-LEASE",
        MUST,
        _A.POLL_STATUS,
        "After POST /task-queues/{q}/build-ids/drain {build_id:b}, a poll by a worker registered with "
        "build_id b on q returns 409 draining and never leases, even when ready work exists.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "DRAIN-RESUME",
        MUST,
        _A.POLL_STATUS,
        "After resume, the same worker leases again.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    _r(
        "DRAIN-IDEMPOTENT",
        MUST,
        _A.POLL_STATUS,
        "Drain and resume are idempotent; build_id null drains the unversioned cohort.",
        cites=(_wp("Poll response status"),),
        minor=20,  # minor: judgement
    ),
    # ========================================================================================== leasing
    _r(
        "LEASE-EXCLUSIVE",
        MUST,
        _A.LEASING,
        "With K ≥ 8 concurrent pollers on one queue holding exactly one ready workflow task, exactly one "
        "response is leased.",
        cites=(_hook("How to verify"),),
    ),
    _r(
        "LEASE-NO-DUPLICATE-ATTEMPT",
        MUST,
        _A.LEASING,
        "Two concurrent polls never both receive a lease for the same (task_id, workflow_task_attempt).",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    _r(
        "LEASE-EACH-TASK-ONCE",
        MUST,
        _A.LEASING,
        "With M ready tasks and K ≥ M concurrent pollers, every task is leased exactly once, and the number "
        "of leases equals M.",
        cites=(_wp("Workflow Task Bridge", "claim with a lease"),),
    ),
    _r(
        "LEASE-ONE-PER-POLL",
        MUST,
        _A.LEASING,
        "At most one task per poll; a claim that loses a race is not an error and the server moves on to "
        "the next candidate.",
        cites=(_srv("WorkflowTaskPoller"),),
    ),
    _r(
        "LEASE-OWNER-IS-POLLER",
        MUST,
        _A.LEASING,
        "A leased task has lease_owner == the poller's worker_id.",
        cites=(
            _wp("Long-poll semantics"),
            _srv("WorkflowTaskPoller"),
            _wp("Workflow Task Bridge"),
        ),
    ),
    _r(
        "LEASE-FIRST-ATTEMPT",
        MUST,
        _A.LEASING,
        "workflow_task_attempt is 1 on the first delivery of a task.",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    _r(
        "LEASE-EXPIRY-IN-FUTURE",
        MUST,
        _A.LEASING,
        "A leased task's lease_expires_at is later than the time of the request.",
        cites=(_wp("Workflow Task Bridge", "claim with a lease"),),
    ),
    _r(
        "LEASE-DEFAULT-DURATION",
        # level: judgement. S0 says "lease for 5 minutes" but UPP lets hosts configure it
        # (DW_V2_WORKFLOW_TASK_LEASE_SECONDS), and §16.23 itself allows an advertised shorter test lease.
        SHOULD,
        _A.LEASING,
        "The default workflow-task lease length (lease_expires_at minus server receipt time) is 300 s ± 5 s, "
        "unless the server advertises a shorter test lease.",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    _r(
        "LEASE-NOT-SHARED-WHILE-LIVE",
        MUST,
        _A.LEASING,
        "A leased task is not handed to any other poller while its lease is live.",
        cites=(_wp("Workflow Task Bridge", "claim with a lease"),),
    ),
    _r(
        "LEASE-HEARTBEAT-RENEWS",
        MUST,
        _A.LEASING,
        "A heartbeat by the owner returns 200 with renewed:true and a lease_expires_at ≥ the previous value "
        "(now + lease duration, set fresh).",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "LEASE-HEARTBEAT-RUN-STATUS",
        MUST,
        _A.LEASING,
        "A workflow-task heartbeat returns the renewed lease expiry and the current run status.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    # ====================================================================================== idempotency
    _r(
        "IDEMPOTENT-POLL-REPLAY",
        MUST,
        _A.IDEMPOTENCY,
        "A second poll with the same worker, queue and poll_request_id while the lease is live returns the "
        "same task_id and the same attempt, without incrementing the attempt.",
        cites=(_srv("WorkflowTaskPoller::coordinatedPoll"),),
    ),
    _r(
        "IDEMPOTENT-POLL-OTHER-WORKER",
        MUST,
        _A.IDEMPOTENCY,
        "A different worker using the same poll_request_id does not get that task.",
        cites=(_srv("WorkflowTaskPoller::coordinatedPoll"),),
    ),
    _r(
        "IDEMPOTENT-POLL-AFTER-CLOSE",
        MUST,
        _A.IDEMPOTENCY,
        "Once the task is completed, failed or expired, the cached poll result is dropped, and a fresh poll "
        "follows the normal rules.",
        cites=(_srv("WorkflowTaskPoller::coordinatedPoll"),),
    ),
    # ========================================================================================== fencing
    _r(
        "FENCE-OWNER",
        MUST,
        _A.FENCING,
        "Heartbeat, complete, fail and history with a wrong lease_owner return 409 lease_owner_mismatch and "
        "name the current owner.",
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "FENCE-NO-STATE-CHANGE",
        MUST,
        _A.FENCING,
        "A fenced request changes no state: a later valid complete by the owner still succeeds.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "FENCE-ATTEMPT",
        MUST,
        _A.FENCING,
        "Heartbeat, complete, fail and history with workflow_task_attempt = current+1 (right owner) return "
        "409 workflow_task_attempt_mismatch with current_attempt.",
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "FENCE-UNKNOWN-TASK",
        MUST,
        _A.FENCING,
        "Any call on an unknown workflow or activity task id returns 404 task_not_found.",
        cites=(
            _srv("Workflow task history, heartbeat, complete and fail"),
            _srv("Activity tasks", "guardAttemptOwnership"),
        ),
    ),
    _r(
        "FENCE-UNKNOWN-QUERY-TASK",
        MUST,
        _A.FENCING,
        "Any call on an unknown query task id returns 404 query_task_not_found.",
        cites=(_srv("Query tasks", "guardLease"),),
    ),
    _r(
        "FENCE-AFTER-COMPLETE",
        MUST,
        _A.FENCING,
        "After a successful complete, a second complete or fail with the same lease returns 409: run_closed "
        '(stop_reason:"run_completed", cancel_requested:false) when the batch closed the run, otherwise '
        "task_not_leased.",
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "FENCE-ORDER",
        MUST,
        _A.FENCING,
        "Workflow-task guards run in the order task lookup (404), run closed (409 run_closed), not leased, "
        "lease expired, owner, attempt; stale attempts and wrong owners are rejected before commands are "
        "applied.",
        cites=(
            _srv("Workflow task history, heartbeat, complete and fail"),
            _wp("Completion, heartbeat and fail requests"),
            _wp("Execution semantics"),
        ),
    ),
    _r(
        "FENCE-TASK-FAILED-NOT-LEASED",
        MUST,
        _A.FENCING,
        "After a workflow-task fail, a later complete, fail or heartbeat of that attempt gets 409 "
        "task_not_leased, and the run is not closed by the task failure.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "ACTIVITY-FENCE-OWNER",
        MUST,
        _A.FENCING,
        "Activity complete with a wrong lease_owner returns 409 lease_owner_mismatch.",
        cites=(_srv("Activity tasks", "guardAttemptOwnership"),),
    ),
    _r(
        "ACTIVITY-ATTEMPT-NOT-FOUND",
        MUST,
        _A.FENCING,
        "Activity complete with an unknown activity_attempt_id returns 404 attempt_not_found.",
        cites=(_srv("Activity tasks", "guardAttemptOwnership"),),
    ),
    _r(
        "ACTIVITY-TASK-MISMATCH",
        MUST,
        _A.FENCING,
        "A valid activity_attempt_id under another task's id returns 409 task_mismatch.",
        cites=(_srv("Activity tasks", "guardAttemptOwnership"),),
    ),
    _r(
        "QUERY-FENCE-OWNER",
        MUST,
        _A.FENCING,
        "Query complete with the wrong owner returns 409 lease_owner_mismatch.",
        cites=(_srv("Query tasks", "guardLease"),),
    ),
    _r(
        "QUERY-FENCE-ATTEMPT",
        MUST,
        _A.FENCING,
        "Query complete with the wrong attempt returns 409 query_task_attempt_mismatch.",
        cites=(_srv("Query tasks", "guardLease"),),
    ),
    # =========================================================================================== expiry
    _r(
        "EXPIRY-HOLDER-FENCED",
        MUST,
        _A.EXPIRY,
        "After lease_expires_at passes, the original holder's heartbeat or complete returns 409 "
        "(lease_expired, or lease_owner_mismatch / workflow_task_attempt_mismatch if reclaimed); never 200.",
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "EXPIRY-REDELIVER-SAME-TASK",
        MUST,
        _A.EXPIRY,
        "After expiry, a poll by any eligible worker returns the same task_id with workflow_task_attempt = "
        "previous + 1.",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    _r(
        "EXPIRY-ONLY-NEW-LEASE-COMMITS",
        MUST,
        _A.EXPIRY,
        "After redelivery only the new lease can complete the task.",
        cites=(_wp("Execution semantics", "late reports rejected as stale"),),
    ),
    _r(
        "EXPIRY-SELF-RECOVERY",
        MUST,
        _A.EXPIRY,
        "A server MUST make an expired task pollable again without outside intervention.",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    _r(
        "ACTIVITY-REDELIVERY-NEW-ATTEMPT",
        MUST,
        _A.EXPIRY,
        "An activity lease expiry closes the attempt; the re-claim creates a new activity_attempt_id with "
        "attempt_number + 1 and no backoff, and a late completion of the old attempt gets 409 stale_attempt.",
        cites=(
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
        ),
    ),
    # ========================================================================================= commands
    _r(
        "COMMANDS-NON-EMPTY",
        MUST,
        _A.COMMANDS,
        "Complete with commands: [] or without commands returns 422 validation_failed.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "COMMANDS-ONE-TERMINAL",
        MUST,
        _A.COMMANDS,
        "Complete with two terminal commands is rejected (409 or 422, invalid_commands), and the run state "
        "is unchanged.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "COMMANDS-UNKNOWN-TYPE",
        MUST,
        _A.COMMANDS,
        "An unknown command type makes the whole batch invalid (invalid_commands) and nothing is applied.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "COMMANDS-REQUIRED-FIELDS",
        MUST,
        _A.COMMANDS,
        "A command missing a required field (schedule_activity without activity_type, start_timer with "
        "delay_seconds:-1, fail_workflow without message, complete_update without update_id, "
        "record_version_marker with version outside [min, max]) is rejected and nothing is applied.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "COMMANDS-RETRY-AFTER-REJECT",
        MUST,
        _A.COMMANDS,
        "After a rejected batch the task stays leased, so the same owner can then complete successfully "
        "with a valid batch.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "COMMANDS-ATOMIC",
        MUST,
        _A.COMMANDS,
        "Non-terminal commands are applied in order, then the terminal one; the batch commits atomically: "
        "either everything is applied or nothing is.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "COMMANDS-FIELD-SCOPE",
        MUST,
        _A.COMMANDS,
        "A field on a command that does not allow it (heartbeat_timeout on start_timer, retry_policy on "
        "complete_workflow) returns 422.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "COMMANDS-TIMEOUT-ORDER",
        MUST,
        _A.COMMANDS,
        "Violated timeout ordering (heartbeat_timeout > start_to_close_timeout, start_to_close > "
        "schedule_to_close, schedule_to_start > schedule_to_close) returns 422.",
        cites=(
            _wp("Command types"),
            _wp("Command types", "schedule_activity timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "COMMANDS-COMPLETE-WORKFLOW",
        MUST,
        _A.COMMANDS,
        "complete_workflow moves the run to completed with event WorkflowCompleted.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "COMMANDS-FAIL-WORKFLOW",
        MUST,
        _A.COMMANDS,
        "fail_workflow moves the run to failed with event WorkflowFailed.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "COMMANDS-FAIL-WORKFLOW-EXCEPTION",
        MUST,
        _A.COMMANDS,
        "fail_workflow accepts the optional exception object from protocol 1.10 on.",
        cites=(_wp("Command types"),),
        minor=10,
    ),
    _r(
        "COMMANDS-FAIL-WORKFLOW-FAILURE",
        MUST,
        _A.COMMANDS,
        "fail_workflow takes a required message and the optional exception_class, exception_type and "
        "non_retryable: WorkflowFailed records each as given, the flag included.",
        cites=(
            _wp("Command types", "fail_workflow"),
            _wp("Discovery capabilities", "non_retryable_failures"),
        ),
    ),
    _r(
        "COMMANDS-CONTINUE-AS-NEW",
        MUST,
        _A.COMMANDS,
        'continue_as_new closes the run as completed (closed_reason "continued"), and describe shows a new '
        "run_id with run_number 2 and the same workflow_id.",
        cites=(_wp("Command types"),),
    ),
    _r(
        "COMMANDS-CONTINUE-AS-NEW-CARRIES",
        MUST,
        _A.COMMANDS,
        "continue_as_new with workflow_type and arguments starts the new run with them: describe of the new run "
        "and its first workflow task show that workflow_type, and the task's arguments decode to those arguments.",
        cites=(_wp("Command types", "continue_as_new"),),
    ),
    _r(
        "COMMANDS-CREATED-TASK-IDS",
        MUST,
        _A.COMMANDS,
        "created_task_ids lists the tasks the batch created, never a run id: after start_child_workflow the child "
        "run's first workflow task and after continue_as_new the new run's first workflow task, each by the "
        "task_id a poll then leases.",
        cites=(_wp("Completion, heartbeat and fail requests"), _read("Created task ids")),
    ),
    _r(
        "COMMANDS-UPSERT-SEARCH-ATTRIBUTES",
        MUST,
        _A.COMMANDS,
        "upsert_search_attributes upserts the run's search attributes as describe shows them: each key given is "
        "set to its value (a list kept as a list), a key given null is deleted, and the others are kept.",
        cites=(_wp("Command types", "upsert_search_attributes"),),
    ),
    _r(
        "COMMANDS-NON-TERMINAL-WAITING",
        MUST,
        _A.COMMANDS,
        "A complete with only non-terminal commands (e.g. start_timer) moves the run to waiting, and "
        "created_task_ids is a list.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "TIMER-FIRES",
        MUST,
        _A.COMMANDS,
        "Once start_timer's delay_seconds d has passed, a workflow task is leasable with "
        'workflow_wait_kind:"timer", resume_source_kind:"timer", a non-null timer_id and open_wait_id == '
        '"timer:" + timer_id.',
        cites=(_wp("Command types", "resume context"),),
    ),
    _r(
        "TIMER-NOT-EARLY",
        MUST,
        _A.COMMANDS,
        "The timer's workflow task is not leasable before d seconds have passed.",
        cites=(_wp("Command types", "start_timer"),),
    ),
    # ==================================================================================== payload-shape
    _r(
        "PAYLOAD-RESUME-CONTEXT-KEYS",
        MUST,
        _A.PAYLOAD_SHAPE,
        "Every leased workflow task contains all 20 resume-context keys (the value may be null).",
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
            _wp("Command types", "resume context"),
        ),
    ),
    _r(
        "PAYLOAD-RESUME-CONTEXT-NULL-ON-START",
        MUST,
        _A.PAYLOAD_SHAPE,
        "On the first task after start, every resume-context key is null.",
        cites=(_wp("Command types", "resume context"),),
    ),
    _r(
        "PAYLOAD-RESUME-CONTEXT-SIGNAL",
        MUST,
        _A.PAYLOAD_SHAPE,
        "A workflow task that applies an accepted signal carries workflow_wait_kind signal, the signal_name the "
        "signal was sent to and a non-null workflow_signal_id (the accepted signal being applied).",
        cites=(_wp("Command types", "resume context"),),
    ),
    _r(
        "PAYLOAD-RESUME-CONTEXT-UPDATE",
        MUST,
        _A.PAYLOAD_SHAPE,
        "A workflow task that applies an accepted update carries workflow_wait_kind update, resume_source_kind "
        'workflow_update, workflow_update_id the accepted update\'s id and open_wait_id "update:" + that id.',
        cites=(_wp("Command types", "resume context"),),
    ),
    _r(
        "PAYLOAD-RESUME-CONTEXT-ACTIVITY",
        MUST,
        _A.PAYLOAD_SHAPE,
        "A workflow task woken by an activity's completion or final failure carries its activity_execution_id, "
        "the activity_attempt_id that reported it and its activity_type, and workflow_sequence and "
        "workflow_event_type naming the ActivityCompleted or ActivityFailed event in the run's history.",
        cites=(_wp("Command types", "resume context"),),
    ),
    _r(
        "PAYLOAD-CODEC-AVRO",
        MUST,
        _A.PAYLOAD_SHAPE,
        'A leased workflow task has payload_codec == "avro".',
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
            _wp("Codec avro"),
        ),
    ),
    _r(
        "PAYLOAD-ARGUMENTS-ENVELOPE",
        MUST,
        _A.PAYLOAD_SHAPE,
        'task.arguments is null or {codec:"avro", blob}, and the blob decodes to the array of start inputs.',
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
            _wp("Starting a workflow"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "PAYLOAD-START-ENVELOPE-UNCHANGED",
        MUST,
        _A.PAYLOAD_SHAPE,
        "An explicit start envelope comes back in task.arguments.blob byte-identical.",
        cites=(
            _wp("Starting a workflow"),
            _srv("Control-plane workflow routes"),
        ),
    ),
    _r(
        "PAYLOAD-RESULT-UNCHANGED",
        MUST,
        _A.PAYLOAD_SHAPE,
        "complete_workflow with result envelope E gives describe.output_envelope.blob == E.blob byte for byte.",
        cites=(_wp("Command types", "complete_workflow result"),),
    ),
    _r(
        "PAYLOAD-ACTIVITY-ATTEMPT-ALIAS",
        SHOULD,
        _A.PAYLOAD_SHAPE,
        "A server SHOULD also emit attempt as an alias of attempt_number on activity tasks.",
        cites=(
            _wp("Activity Task Bridge"),
            _read("Where the documents disagree"),
        ),
    ),
    # ========================================================================================== history
    _r(
        "HISTORY-SEQUENCE-CONTIGUOUS",
        MUST,
        _A.HISTORY,
        "history_events sequences are strictly increasing by 1 starting from 1.",
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
        ),
    ),
    _r(
        "HISTORY-FIRST-TASK-STARTED",
        MUST,
        _A.HISTORY,
        "The first workflow task's history contains WorkflowStarted.",
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
        ),
    ),
    _r(
        "HISTORY-INLINE-PAGE",
        MUST,
        _A.HISTORY,
        "With N events and history_page_size p < N, the poll returns exactly p events plus a non-null cursor.",
        cites=(
            _wp("Paginated history"),
            _srv("Workflow task history, heartbeat, complete and fail"),
        ),
    ),
    _r(
        "HISTORY-INLINE-DEFAULT-PAGE",
        MUST,
        _A.HISTORY,
        "A poll without history_page_size returns a first page of the advertised default size "
        "(history_page_size_default or default_history_page_size, else 500): with more events than that, exactly "
        "that many, and a non-null cursor.",
        cites=(_wp("Paginated history"),),
    ),
    _r(
        "HISTORY-PAGINATION-COMPLETE",
        MUST,
        _A.HISTORY,
        "Following the history cursor until has_more == false (or the token is null) yields every sequence "
        "1..N exactly once, in order, and no page is larger than min(p, 1000).",
        cites=(
            _wp("Paginated history"),
            _srv("Workflow task history, heartbeat, complete and fail"),
        ),
    ),
    _r(
        "HISTORY-PAGE-SIZE-CAP",
        MUST,
        _A.HISTORY,
        "A history page request with page_size 5000 returns ≤ 1000 events or a 422; it never returns more than 1000.",
        cites=(
            _wp("Paginated history"),
            _srv("Workflow task history, heartbeat, complete and fail"),
        ),
    ),
    _r(
        "HISTORY-INVALID-TOKEN",
        MUST,
        _A.HISTORY,
        "An invalid next_history_page_token returns 400 invalid_page_token.",
        cites=(
            _wp("Paginated history"),
            _srv("Workflow task history, heartbeat, complete and fail"),
        ),
    ),
    _r(
        "HISTORY-BOTH-CURSORS",
        SHOULD,
        _A.HISTORY,
        "A server SHOULD accept and emit both cursor styles: after_sequence/has_more/next_after_sequence and "
        "next_history_page_token.",
        cites=(
            _wp("Workflow Task Bridge"),
            _srv("WorkflowTaskPoller"),
            _wp("Paginated history"),
            _srv("Workflow task history, heartbeat, complete and fail"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "HISTORY-ONE-TERMINAL-PER-RUN",
        MUST,
        _A.HISTORY,
        "Control-plane history never contains more than one terminal run event per run.",
        cites=(_wp("Execution semantics", "exactly-once durable history"),),
    ),
    _r(
        "HISTORY-ONE-WORKFLOW-COMPLETED",
        MUST,
        _A.HISTORY,
        "After a second complete or fail of an already completed task, history shows exactly one WorkflowCompleted.",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "HISTORY-ONE-TERMINAL-PER-ATTEMPT",
        MUST,
        _A.HISTORY,
        "Control-plane history never contains two terminal events per activity_attempt_id.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    # ====================================================================================== compression
    _r(
        "COMPRESSION-BELOW-THRESHOLD",
        MUST,
        _A.COMPRESSION,
        'With accept_history_encoding:"gzip" and fewer than 50 events in the page, the response is '
        "uncompressed (no history_events_compressed).",
        cites=(
            _wp("History compression"),
            _pkg("HistoryPayloadCompression"),
        ),
    ),
    _r(
        "COMPRESSION-ROUNDTRIP",
        MUST,
        _A.COMPRESSION,
        "When compressed, history_events == [] and base64-decode, then gunzip (or raw inflate for deflate), "
        "then JSON equals the uncompressed page.",
        cites=(
            _wp("History compression"),
            _pkg("HistoryPayloadCompression"),
        ),
    ),
    _r(
        "COMPRESSION-OPT-IN-ONLY",
        MUST,
        _A.COMPRESSION,
        "No opt-in, or an unsupported encoding only, means the normal uncompressed array.",
        cites=(
            _wp("History compression"),
            _pkg("HistoryPayloadCompression"),
        ),
    ),
    _r(
        "COMPRESSION-ABOVE-THRESHOLD",
        MAY,
        _A.COMPRESSION,
        "A page of more than 50 events with opt-in MAY be compressed; exactly 50 is implementation-defined.",
        cites=(
            _wp("History compression"),
            _pkg("HistoryPayloadCompression"),
            _read("Where the documents disagree"),
        ),
    ),
    _r(
        "COMPRESSION-GZIP-PREFERRED",
        SHOULD,
        _A.COMPRESSION,
        "If both gzip and deflate are listed, gzip is preferred; matching is case-insensitive.",
        cites=(
            _wp("History compression"),
            _pkg("HistoryPayloadCompression"),
        ),
    ),
    # ===================================================================================== cancellation
    _r(
        "CANCEL-TASK-RUN-CLOSED",
        MUST,
        _A.CANCELLATION,
        "After the run of a leased workflow task is cancelled, the owner's heartbeat, complete, fail and "
        'history each return 409 reason:"run_closed", can_continue:false, cancel_requested:true, '
        'stop_reason:"run_cancelled" and a non-null run_closed_at.',
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "TERMINATE-TASK-RUN-CLOSED",
        MUST,
        _A.CANCELLATION,
        'After terminate, the same calls return run_closed with stop_reason:"run_terminated".',
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "CANCEL-RUN-CLOSED-BEFORE-FENCING",
        MUST,
        _A.CANCELLATION,
        "The run-closed check comes before the owner and attempt checks, so every caller sees run_closed.",
        cites=(_srv("Workflow task history, heartbeat, complete and fail"),),
    ),
    _r(
        "CANCEL-NO-NEW-LEASES",
        MUST,
        _A.CANCELLATION,
        "After cancel or terminate, no poll ever leases a workflow or activity task of that run.",
        cites=(_hook("How to verify"),),
    ),
    _r(
        "CANCEL-ACTIVITY-HEARTBEAT",
        MUST,
        _A.CANCELLATION,
        "An activity leased before the cancel: its heartbeat returns 200 with cancel_requested:true, "
        "can_continue:false and reason in {run_cancelled, run_terminated}.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "CANCEL-ACTIVITY-OUTCOME-IGNORED",
        MUST,
        _A.CANCELLATION,
        'After a run cancel or terminate, an activity complete or fail returns 409 with outcome:"ignored" '
        "and recorded:false.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    # ======================================================================================= activities
    _r(
        "ACTIVITY-SCHEDULED-LEASABLE",
        MUST,
        _A.ACTIVITIES,
        "A schedule_activity command produces an activity task leasable on the target queue, with "
        "attempt_number 1, non-empty activity_attempt_id and activity_execution_id, and arguments equal to "
        "the scheduled envelope.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-COMPLETE-RECORDED",
        MUST,
        _A.ACTIVITIES,
        "Activity complete by the owner returns 200 with recorded:true.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-DUPLICATE-COMPLETE-STALE",
        MUST,
        _A.ACTIVITIES,
        "A duplicate activity complete returns 409 stale_attempt with recorded:false, and history has "
        "exactly one ActivityCompleted.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-FAILURE-DETAILS-UNCHANGED",
        MUST,
        _A.ACTIVITIES,
        "The failure.details envelope is stored unchanged; the ActivityFailed event or the resumed "
        "workflow's history exposes the same blob and codec.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-FAILURE-CONTRACT",
        MUST,
        _A.ACTIVITIES,
        "The stable cross-language failure contract includes activity_type, failure_category, exception_type, "
        "message, code, non_retryable and details with its codec: a final activity failure records them in "
        "ActivityFailed as the workflow sees it — exception_type from failure.type, the code given, non_retryable "
        "the effective flag (set by the worker or by a type the policy lists as non-retryable) — and runtime "
        "fields such as the stack trace are diagnostics only, in none of those fields.",
        cites=(
            _wp("Payload codecs", "stable cross-language failure contract"),
            _wp("Discovery capabilities", "non_retryable_failures"),
            _wp("Activity Task Bridge"),
        ),
    ),
    _r(
        "ACTIVITY-HEARTBEAT-RENEWS",
        MUST,
        _A.ACTIVITIES,
        "An activity heartbeat by the owner returns 200 with can_continue:true and lease_expires_at ≥ the "
        "previous value.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-HEARTBEAT-STOP-200",
        MUST,
        _A.ACTIVITIES,
        "When the attempt cannot continue, the activity heartbeat is still HTTP 200 (only attempt_not_found "
        "gives 404), with can_continue:false, heartbeat_recorded:false and a reason.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-STATUS-VERB",
        MUST,
        _A.ACTIVITIES,
        "The activity status verb checks liveness and cancellation state without renewing the lease: where a "
        "server serves it (POST /api/worker/activity-tasks/{task_id}/status, the heartbeat's body and answer), it "
        "answers heartbeat_recorded:false, leaves lease_expires_at where it was, records no "
        "ActivityHeartbeatRecorded, and after the run is cancelled says cancel_requested:true, can_continue:false.",
        cites=(_wp("Activity Task Bridge", "status"),),
    ),
    # ========================================================================================== retries
    _r(
        "RETRY-ATTEMPT-NUMBERS",
        MUST,
        _A.RETRIES,
        "With retry_policy {max_attempts:3, backoff_seconds:[2]} and two failures, the lease numbers are 1, 2, 3.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
        ),
    ),
    _r(
        "RETRY-EXECUTION-ID-STABLE",
        MUST,
        _A.RETRIES,
        "activity_execution_id stays constant across all attempts of one activity.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "RETRY-ATTEMPT-ID-DISTINCT",
        MUST,
        _A.RETRIES,
        "Every activity_attempt_id is distinct: a new one for every lease.",
        cites=(_wp("Activity Task Bridge"),),
    ),
    _r(
        "ACTIVITY-RETRY-BACKOFF",
        MUST,
        _A.RETRIES,
        "A retry is never leasable before its backoff has passed: the task for attempt n+1 is not leasable "
        "until ≥ backoff seconds after attempt n failed.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    _r(
        "RETRY-ATTEMPTS-CONTIGUOUS",
        MUST,
        _A.RETRIES,
        "Attempts are numbered 1, 2, 3, … with no gaps and no repeats per activity_execution_id.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    _r(
        "RETRY-FAILED-ATTEMPTS-BOUNDED",
        MUST,
        _A.RETRIES,
        "The number of failed attempts that led to retries is ≤ max_attempts - 1.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
        ),
    ),
    _r(
        "RETRY-NON-RETRYABLE-FLAG",
        MUST,
        _A.RETRIES,
        "failure.non_retryable:true ends the activity after that attempt, even when max_attempts > attempt.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    _r(
        "RETRY-NON-RETRYABLE-TYPE",
        MUST,
        _A.RETRIES,
        "A failure.type or failure.class listed in non_retryable_error_types ends the activity after that attempt.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    _r(
        "RETRY-FINAL-RESUMES-WORKFLOW",
        MUST,
        _A.RETRIES,
        "After a final activity failure the next leasable task is a workflow task (the resume), not an activity retry.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
        ),
    ),
    _r(
        "RETRY-RESUME-ONLY-FINAL",
        MUST,
        _A.RETRIES,
        "The workflow is resumed (a new workflow task) only for the final outcome, never for an intermediate retry.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
        ),
    ),
    _r(
        "RETRY-DEFAULT-NONE",
        MUST,
        _A.RETRIES,
        "With no retry policy (default max_attempts = 1), a single activity failure is final.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
            _af("4.4 Retries"),
            _af("4.3 DAG Run and TaskInstance state machine"),
        ),
    ),
    _r(
        "RETRY-ONE-OUTCOME-PER-EXECUTION",
        MUST,
        _A.RETRIES,
        "There is exactly one terminal outcome per activity_execution_id.",
        cites=(
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    _r(
        "RETRY-BACKOFF-SCHEDULE",
        MUST,
        _A.RETRIES,
        "The backoff before attempt n+1 is backoff_seconds[min(n-1, len-1)], or 0 if the list is empty; a "
        "retry is a new ready task with available_at = now + backoff and an ActivityRetryScheduled event.",
        cites=(
            _wp("Command types", "schedule_activity retry_policy"),
            _pkg("ActivityRetryPolicy"),
            _af("4.3 DAG Run and TaskInstance state machine"),
            _af("4.4 Retries"),
        ),
    ),
    # ========================================================================================= timeouts
    _r(
        "TIMEOUT-LATE-COMPLETE-STALE",
        MUST,
        _A.TIMEOUTS,
        "The expired attempt's late complete gets 409 stale_attempt.",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL",
        SHOULD,  # level: judgement - §11.7 describes the upstream enforcer rather than stating a MUST
        _A.TIMEOUTS,
        "On a timeout the activity retries subject to attempts left and backoff, except schedule_to_close, "
        "which is always terminal.",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "TIMEOUT-TIMED-OUT-EVENT",
        SHOULD,  # level: judgement - as above
        _A.TIMEOUTS,
        'When no retry remains, a terminal ActivityTimedOut with failure_category:"timeout" is recorded and '
        "the workflow is woken.",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "TIMEOUT-HEARTBEAT-ENFORCED",
        MUST,  # level: judgement - a timeout the server advertises (activity_timeouts) and never applies is none
        _A.TIMEOUTS,
        "heartbeat_timeout is the maximum gap between heartbeats: an attempt that heartbeats within it keeps "
        "running, and one whose heartbeats stop for longer is timed out (timeout_type heartbeat), retried as a "
        "new task while its retry policy has attempts left, otherwise ended with ActivityTimedOut.",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _wp("Discovery capabilities", "activity_timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "TIMEOUT-SCHEDULE-TO-START-ENFORCED",
        MUST,  # level: judgement - as above
        _A.TIMEOUTS,
        "schedule_to_start_timeout runs from scheduling to the claim: a task not claimed within it is timed out "
        "(ActivityTimedOut, timeout_type schedule_to_start), is never leased afterwards, and the workflow is "
        "woken; a task claimed in time is not timed out by it.",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _wp("Discovery capabilities", "activity_timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    _r(
        "TIMEOUT-SCHEDULE-TO-CLOSE-WHOLE-EXECUTION",
        MUST,  # level: judgement - as above
        _A.TIMEOUTS,
        "schedule_to_close_timeout bounds the whole execution including retries: it runs from scheduling, a "
        "retry does not restart it, and when it passes the execution ends with ActivityTimedOut (timeout_type "
        "schedule_to_close).",
        cites=(
            _wp("Command types", "schedule_activity timeouts"),
            _wp("Discovery capabilities", "activity_timeouts"),
            _pkg("Activity timeouts"),
        ),
    ),
    # ========================================================================================== queries
    _r(
        "QUERY-TASK-CREATED",
        MUST,
        _A.QUERIES,
        "A query with a query worker registered creates a query task whose poll returns "
        "query_task_attempt:1, query_name, the lease_owner and query_arguments.",
        cites=(_wp("Query tasks"),),
    ),
    _r(
        "QUERY-RESULT-ROUNDTRIP",
        MUST,
        _A.QUERIES,
        "Completing the query task with result_envelope makes the control-plane call return 200 with the "
        "same result_envelope.",
        cites=(_wp("Query tasks"),),
    ),
    _r(
        "QUERY-READ-ONLY",
        MUST,
        _A.QUERIES,
        "Query tasks never append history, never create commands, never mutate the run, and are not retried.",
        cites=(_wp("Query tasks"),),
    ),
    _r(
        "QUERY-UNKNOWN-404",
        MUST,
        _A.QUERIES,
        'A worker fail with reason:"rejected_unknown_query" makes the control-plane call return 404.',
        cites=(_wp("Query tasks"),),
    ),
    _r(
        "QUERY-REJECTED-409",
        MUST,
        _A.QUERIES,
        'A worker fail with reason:"query_rejected" (or any other reason) makes the control-plane call return 409.',
        cites=(_wp("Query tasks"),),
    ),
    _r(
        "QUERY-NO-WORKER-FAST",
        MUST,
        _A.QUERIES,
        "With no registered, fresh query-capable worker on the run's queue, the query returns 409 "
        "query_worker_unavailable quickly, without waiting for the timeout.",
        cites=(
            _wp("Query tasks"),
            _srv("Query tasks"),
        ),
    ),
    _r(
        "QUERY-TIMEOUT-504",
        MUST,
        _A.QUERIES,
        "With a registered worker that never polls, the query returns 504 query_worker_timeout after about "
        "the configured timeout.",
        cites=(
            _wp("Query tasks"),
            _srv("Query tasks"),
        ),
    ),
    _r(
        "QUERY-LATE-COMPLETE-NOT-LEASED",
        MUST,
        _A.QUERIES,
        "A late complete after a query timeout, or a second complete or fail after a terminal one, returns "
        "409 query_task_not_leased.",
        cites=(
            _wp("Query tasks"),
            _srv("Query tasks"),
            _srv("Query tasks", "guardLease"),
        ),
    ),
    # ============================================================================================ codec
    _r(
        "CODEC-GOLDEN-DECODE",
        MUST,
        _A.CODEC,
        "The codec decodes all 16 golden cases to their listed values.",
        cites=(_pkg("Avro Value schema and golden vectors"),),
    ),
    _r(
        "CODEC-GOLDEN-ROUNDTRIP",
        MUST,
        _A.CODEC,
        "Re-encoding each golden case reproduces its bytes.",
        cites=(_pkg("Avro Value schema and golden vectors"),),
    ),
    _r(
        "CODEC-MALFORMED-REJECTED",
        MUST,
        _A.CODEC,
        "All 18 malformed frames fail with the listed error (17 invalid_payload_framing, 1 "
        "unsupported_payload_schema).",
        cites=(_pkg("Avro Value schema and golden vectors"),),
    ),
    _r(
        "CODEC-FINGERPRINT",
        MUST,
        _A.CODEC,
        "The single-object frame's fingerprint bytes are e2a33dff55802237.",
        cites=(_pkg("Avro Value schema and golden vectors"),),
    ),
    _r(
        "CODEC-START-UNKNOWN-CODEC",
        MUST,
        _A.CODEC,
        'A start with input {codec:"json", blob:…} or any codec other than avro returns 422, and no run is created.',
        cites=(
            _wp("Starting a workflow"),
            _srv("Control-plane workflow routes"),
            _wp("Codec avro"),
        ),
    ),
    _r(
        "CODEC-SIGNAL-MALFORMED",
        MUST,
        _A.CODEC,
        "A signal whose input envelope is a malformed golden frame returns 422, never 5xx, and no "
        "SignalReceived is recorded.",
        cites=(_pkg("Avro Value schema and golden vectors"),),
    ),
    _r(
        "CODEC-CHECK-BEFORE-DECODE",
        MUST,
        _A.CODEC,
        "A worker or server MUST check the codec before decoding; an unknown codec is an error and the "
        "format is never guessed from the content.",
        cites=(
            _wp("Codec avro"),
            _wp("Execution semantics"),
        ),
    ),
    _r(
        "CODEC-NON-AVRO-ENVELOPE-422",
        MUST,
        _A.CODEC,
        "A command, start input, activity result or failure-details envelope with codec other than avro "
        "gives 422, with a message that begins unsupported_payload_codec:.",
        cites=(_wp("Codec avro"),),
    ),
    # ======================================================================================= robustness
    _r(
        "ROBUST-NO-5XX",
        MUST,
        _A.ROBUSTNESS,
        "For any worker route, arbitrary JSON (wrong types, nulls, huge strings, deep nesting, non-object "
        "bodies, invalid UTF-8 or non-JSON bodies) never yields 5xx.",
        cites=(_read("Robustness"),),
    ),
    _r(
        "ROBUST-STATUS-SET",
        MUST,
        _A.ROBUSTNESS,
        "The status of a fuzzed worker-route request is in {400, 404, 409, 412, 415, 422}.",
        cites=(_read("Robustness"),),
    ),
    _r(
        "ROBUST-ENVELOPE-ON-ERROR",
        MUST,
        _A.ROBUSTNESS,
        "A fuzzed worker-route request's response has the worker envelope with reason.",
        cites=(_read("Robustness"),),
    ),
    _r(
        "ROBUST-REJECTED-NO-STATE-CHANGE",
        MUST,
        _A.ROBUSTNESS,
        "A fenced, rejected or invalid request never changes observable state (describe and history are unchanged).",
        cites=(_wp("Completion, heartbeat and fail requests"),),
    ),
    _r(
        "ROBUST-UNKNOWN-FIELDS-IGNORED",
        MUST,
        _A.ROBUSTNESS,
        "Unknown request fields MUST be ignored.",
        cites=(_pkg("Platform protocol specs"),),
    ),
    # ========================================================================================= dispatch
    _r(
        "DISPATCH-ONE-LEASE-PER-DELIVERY",
        MUST,
        _A.DISPATCH,
        "The same message delivered twice gives exactly one valid lease: duplicate or concurrent polls never "
        "yield two live leases for the same task and attempt.",
        cites=(_hook("How to verify", "row 1"),),
    ),
    _r(
        "DISPATCH-CRASH-TAKEOVER",
        MUST,
        _A.DISPATCH,
        "A worker that crashes after its claim is replaced once the lease expires: the task is pollable "
        "again by another worker with attempt+1.",
        cites=(_hook("How to verify", "row 2"),),
    ),
    _r(
        "DISPATCH-LATE-EVENT-FENCED",
        MUST,
        _A.DISPATCH,
        "After a takeover, a late lifecycle event from the old worker is rejected by fencing (409) and its "
        "commands leave no trace in history.",
        cites=(_hook("Self-check", "question 2"),),
    ),
    _r(
        "DISPATCH-CANCEL-DURABLE",
        MUST,
        _A.DISPATCH,
        "Cancellation propagates through durable state across processes: a cancel sent over HTTP by a "
        "client other than the worker stops new leases and is observed by the worker as run_closed / "
        "cancel_requested.",
        cites=(
            _hook("How to verify", "row 4"),
            _hook("Command path and work dispatch are separate"),
        ),
    ),
    _r(
        "DISPATCH-LOST-NOTIFICATION",
        MUST,
        _A.DISPATCH,
        "A lost notification is rediscovered: expired leases, due timers and retries whose available_at "
        "passed become pollable without any extra stimulus from the client.",
        cites=(
            _hook("The queue is a notification, not canonical state"),
            _wp("Execution semantics"),
            _srv("Leases and redelivery"),
        ),
    ),
    # ========================================================================================= restarts
    _r(
        "RESTART-ACKNOWLEDGED-DURABLE",
        MUST,
        _A.DISPATCH,
        "Nothing the server acknowledged is lost when it is killed hard and started again: every accepted start "
        "keeps its run id, and every history event recorded before the restart (an accepted signal, a completed "
        "workflow task's commands, a completed activity's result, a closed run's terminal event) is still there, "
        "unchanged, at its sequence.",
        cites=(_hook("Self-check", "question 1"), _hook("How to verify")),
    ),
    _r(
        "RESTART-WORK-TAKEN-OVER",
        MUST,
        _A.DISPATCH,
        "A run accepted right before the server restarts is still dispatched after it: a worker polling its queue "
        "after the restart leases its workflow task, so the work is not bound to the process that accepted it.",
        cites=(_hook("Self-check", "question 1"),),
    ),
    _r(
        "RESTART-LEASE-TAKEOVER",
        MUST,
        _A.DISPATCH,
        "A lease held when the server restarts still ends at its acknowledged lease_expires_at, no earlier, and its "
        "task is then leased to another worker: the same task_id with the next attempt.",
        cites=(_hook("How to verify", "a worker that crashes after its claim"),),
    ),
    _r(
        "RESTART-STALE-LEASE-FENCED",
        MUST,
        _A.DISPATCH,
        "Fencing holds across a restart: once the task is taken over, a report carrying the lease from before the "
        "restart (its old owner and attempt) is refused with 409 and leaves no trace; the new holder's complete "
        "is accepted.",
        cites=(_hook("Self-check", "question 2"),),
    ),
    # ================================================================================== lifecycle-hooks
    _r(
        "HOOKS-OBSERVE-ONLY",
        MUST,
        _A.LIFECYCLE_HOOKS,
        "Hooks observe and never own transitions: malformed optional progress or metrics fields never turn a "
        "successful complete into a failure, and a task result already committed never changes.",
        cites=(
            _hook("How to verify", "row 3"),
            _hook("Lifecycle hooks are observers"),
        ),
    ),
    _r(
        "HOOKS-FAIL-OPEN",
        MUST,
        _A.LIFECYCLE_HOOKS,
        "Malformed telemetry (heartbeat progress, worker metrics) never returns 5xx: it is either 422 or ignored.",
        cites=(_hook("Hooks need a failure policy too"),),
    ),
    # ============================================================================================ auth
    _r(
        "AUTH-FULL-ACCESS-TOKEN",
        MUST,
        _A.AUTH,
        "A full-access token is a server's option, judged only on a server that declares one: such a server "
        "accepts it on the control plane, and on the worker plane too when it has no role tokens; beside role "
        "tokens it may keep full access or make it admin-only (the worker plane answers it 403), but never "
        "refuses it as unknown (401). A server without one is never failed for it.",
        # Decision: a full-access token is optional (the server's legacy DW_AUTH_TOKEN becomes admin-only once role
        # tokens exist; a vendor may have role tokens only). The reference server keeps full access beside role tokens
        # (docs/reference-server.md, "Deliberate deviations") and follows the server with
        # --auth-token-admin-beside-roles.
        cites=(
            _srv("Authentication and roles"),
            _sdk("Worker handshake", "one token for both planes"),
            _read("Full-access token"),
        ),
    ),
    # ======================================================================================== children
    _r(
        "CHILD-PARENT-CLOSE-DEFAULT",
        MUST,
        _A.CHILDREN,
        "A start_child_workflow without parent_close_policy is recorded on ChildWorkflowScheduled as "
        "parent_close_policy abandon, and the child outlives its parent's close.",
        cites=(
            _wp("Command types", "start_child_workflow parent_close_policy"),
            _pkg("Child workflows", "default abandon"),
            _sdk("Replay", "child_workflow_policy_changed"),
        ),
    ),
    _r(
        "CHILD-POLICY-RECORDED",
        MUST,
        _A.CHILDREN,
        "ChildWorkflowScheduled records the parent_close_policy and the child cancellation_policy the command "
        "gave, and abandon for each one it omitted: the values the SDK compares on replay.",
        cites=(_sdk("Replay", "child_workflow_policy_changed"),),
    ),
    _r(
        "CHILD-RESULT-WAKES-PARENT",
        MUST,
        _A.CHILDREN,
        "When a child run completes or fails, its parent's history records ChildRunCompleted or ChildRunFailed, "
        "and the parent's next workflow task carries the child resume context: workflow_wait_kind child, "
        "resume_source_kind child_workflow_run, a child_call_id, child_workflow_run_id naming the child run and "
        "workflow_event_type the recorded event's type.",
        cites=(_wp("Command types", "resume context"), _wp("Command types", "start_child_workflow")),
    ),
    _r(
        "CHILD-PARENT-CLOSE-POLICIES",
        MUST,
        _A.CHILDREN,
        "When a parent closes, a child under parent_close_policy terminate is terminated and one under "
        "request_cancel is closed at once as cancelled.",
        cites=(_wp("Command types", "start_child_workflow parent_close_policy"),),
    ),
    _r(
        "CHILD-RETRY-BACKOFF",
        MUST,
        _A.CHILDREN,
        "A failed child run whose retry_policy allows another attempt is retried after its backoff: a new run of "
        "the same child workflow starts no sooner than backoff_seconds after the failure, and the parent records "
        "no ChildRunFailed for the failed run.",
        cites=(_wp("Command types", "start_child_workflow retry_policy"),),
    ),
    _r(
        "CHILD-INVALID-START-NO-ATTEMPT",
        MUST,
        _A.CHILDREN,
        "An invalid start_child_workflow is a protocol error (its batch is rejected as invalid_commands, 409 or 422) "
        "and spends no child retry attempt: the child started validly afterwards under retry_policy max_attempts 2 "
        "is still retried once after its first run fails.",
        cites=(_wp("Command types", "start_child_workflow retry_policy"),),
    ),
    _r(
        "CHILD-RUN-TIMEOUT",
        MUST,
        _A.CHILDREN,
        "A child run still open run_timeout_seconds after it started is closed as failed with closed_reason "
        "timed_out (WorkflowTimedOut), not before, and its parent's history records ChildRunFailed.",
        cites=(_wp("Command types", "start_child_workflow run_timeout_seconds"),),
    ),
    _r(
        "CHILD-EXECUTION-TIMEOUT",
        MUST,
        _A.CHILDREN,
        "A child still open execution_timeout_seconds after its first run started is closed as failed with "
        "closed_reason timed_out, whatever retries it had by then, and is not retried after it: its parent's "
        "history records ChildRunFailed.",
        cites=(_wp("Command types", "start_child_workflow execution_timeout_seconds"),),
    ),
    _r(
        "CHILD-FAILURE-NON-RETRYABLE",
        MUST,
        _A.CHILDREN,
        "A child run failed by fail_workflow with non_retryable true is not retried, whatever attempts its retry "
        "policy has left: the parent's history records ChildRunFailed with the child's message and "
        "exception_type, and no ChildWorkflowRetryScheduled.",
        cites=(
            _wp("Command types", "start_child_workflow retry_policy"),
            _wp("Discovery capabilities", "non_retryable_failures"),
            _wp("Command types", "fail_workflow"),
        ),
    ),
    # ========================================================================== cooperative cancellation
    _r(
        "CANCEL-COOPERATIVE-REQUEST",
        MUST,
        _A.CANCELLATION,
        "When a parent closes with a child under parent_close_policy request_cancellation, the child is not "
        "closed at once: its history records CooperativeCancellationRequested with the request identity "
        "(workflow_command_id) and a cleanup_deadline_at after the request, and its next workflow task — and every "
        "later one while the child is open, a delivery committed or not — carries cancel_requested true and "
        "cancellation_request {request_id, requested_at, cleanup_deadline_at}.",
        cites=(
            _wp("Command types", "start_child_workflow request_cancellation"),
            _sdk("Child workflow cancellation", "event and field names"),
        ),
    ),
    _r(
        "CANCEL-COOPERATIVE-CLEANUP",
        MUST,
        _A.CANCELLATION,
        "A child asked to cancel cooperatively can still run commands (its cleanup) and close itself before the "
        "deadline; the run ends as the child's own terminal command says.",
        cites=(
            _wp("Command types", "start_child_workflow request_cancellation"),
            _read("Cooperative cancellation"),
        ),
    ),
    _r(
        "CANCEL-COOPERATIVE-DEADLINE",
        MUST,
        _A.CANCELLATION,
        "A child still open past its cleanup_deadline_at is closed by the server as cancelled (WorkflowCancelled "
        "with reason cleanup_deadline_exceeded).",
        cites=(
            _wp("Command types", "start_child_workflow request_cancellation"),
            _read("Cooperative cancellation"),
        ),
    ),
    _r(
        "CANCEL-COOPERATIVE-OUTCOME",
        MUST,
        _A.CANCELLATION,
        "However the child ends, the parent's history records ChildCancellationResolved naming the request, the "
        "child run, its closing status (outcome) and closed_by (child or cleanup_deadline).",
        cites=(_read("Cooperative cancellation"),),
    ),
    _r(
        "CANCEL-COOPERATIVE-DELIVERY",
        SHOULD,
        _A.CANCELLATION,
        "The lease holder of the child's workflow task can commit the delivery of the request at one call "
        "(POST …/workflow-tasks/{id}/deliver-cancellation), recorded once as CooperativeCancellationDelivered; "
        "a repeated delivery answers the committed one.",
        cites=(
            _sdk("Child workflow cancellation", "deliver_workflow_cancellation"),
            _wp("Command types", "start_child_workflow request_cancellation"),
        ),
    ),
    _r(
        "CANCEL-CLIENT-REQUEST",
        MUST,
        _A.CANCELLATION,
        "A server advertising cooperative_cancellation serves a client's request: POST /api/workflows/{id}[/runs/"
        "{run_id}]/request-cancellation {cleanup_timeout_seconds} answers 200 {accepted: true, duplicate: false, "
        "workflow_id, run_id, cancellation_request {request_id, requested_at, cleanup_deadline_at}} with the "
        "deadline cleanup_timeout_seconds after the request; the run stays open and its next workflow task carries "
        "cancel_requested and that request; a repeated request answers duplicate: true with the original "
        "request_id and cleanup_deadline_at.",
        cites=(
            _wp("Command types", "start_child_workflow request_cancellation"),
            _sdk("Child workflow cancellation", "request_workflow_cancellation"),
        ),
    ),
    # ================================================================================= worker sessions
    _r(
        "SESSION-ADVERTISED",
        MUST,
        _A.SESSIONS,
        "A server that implements worker sessions advertises worker_session_verbs (create, heartbeat, close) and "
        "worker_sessions (the A.2 runtime contract) in cluster/info and in every worker-plane response.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs"),
            _wp("Discovery capabilities"),
            _pkg("WorkerProtocolVersion"),
        ),
        minor=8,  # A.2 minimum_protocol_version 1.8
    ),
    _r(
        "SESSION-LAZY-CREATE",
        MUST,
        _A.SESSIONS,
        "The first admitted in-session activity claim creates the session, owned by the claiming worker, and the "
        "leased task carries worker_session with status active and that lease_owner.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "creation is lazy"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-EXPLICIT-LIFECYCLE",
        MUST,
        _A.SESSIONS,
        "POST /api/worker/sessions creates (201 created) or reuses (200 reused) a session for its worker; "
        "POST …/{id}/heartbeat renews it (heartbeat_recorded); DELETE …/{id} closes it (closed, then "
        "already_closed); an unknown id is 404 session_not_found.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
            _pkg("Platform protocol specs", "createWorkerSession, heartbeatWorkerSession, closeWorkerSession"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-SINGLE-OWNER",
        MUST,
        _A.SESSIONS,
        "At most one worker owns a session lease at a time: while one worker holds it, another capable worker is "
        "refused (409 session_owned_by_another_worker) and is leased none of its activities.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Lease And Ownership"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-REQUIREMENTS",
        MUST,
        _A.SESSIONS,
        "A session is admitted only to a registered worker whose capabilities cover every session requirement "
        "(otherwise 409 session_requirements_not_met with missing_requirements; a claim skips the task).",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Admission And Routing"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-ACTIVITY-HEARTBEAT-RENEWS",
        MUST,
        _A.SESSIONS,
        "A recorded heartbeat of an in-session activity by the session's owner renews the session lease.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Renewal And Expiry"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-LEASE-EXPIRY",
        MUST,
        _A.SESSIONS,
        "A session whose lease is not renewed in time becomes expired (failure_reason lease_expired): its old "
        "holder's session heartbeat is refused (409 session_not_active) and a capable worker may reacquire it.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Renewal And Expiry"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-REACQUIRE-DISALLOWED",
        MUST,
        _A.SESSIONS,
        "A session with allow_reacquire_after_failure false that loses its lease or holder is final (status "
        "failed): no worker reacquires it (409 session_reacquire_disallowed).",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "terminal conditions"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
            _read("Worker sessions"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-STALE-HOLDER-FENCED",
        MUST,
        _A.SESSIONS,
        "After another worker reacquired a session, the old holder's session heartbeat and close are refused "
        "(409 session_owner_mismatch) and its activity heartbeats renew nothing of the session.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Holder Failure"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-TTL-TERMINAL",
        MUST,
        _A.SESSIONS,
        "The session TTL is absolute: renewal never moves the lease past ttl_expires_at, and once it passes the "
        "session is closed (failure_reason ttl_expired) and its id is never admitted again (409 session_closed).",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "lifecycle, TTL expiry"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-CLOSE-TERMINAL",
        MUST,
        _A.SESSIONS,
        "An explicit close by the holder makes the session closed; only its holder may close it (409 "
        "session_owner_mismatch), a second close answers already_closed, and the id is never admitted again.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "lifecycle, close"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-ORPHANED",
        MUST,
        _A.SESSIONS,
        "A session whose holder's registration is stale or gone becomes orphaned (failure_reason "
        "worker_heartbeat_stale) and a capable worker may reacquire it.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "failure detection"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-ACTIVITY-LIMIT",
        MUST,
        _A.SESSIONS,
        "At most max_concurrent_activities attempts of one session are leased at once (default 1); the next "
        "in-session task waits until one finishes.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "limits"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-ATTEMPT-LEASE-INDEPENDENT",
        MUST,
        _A.SESSIONS,
        "Inside a session each activity attempt keeps its own lease, heartbeat and cancellation: a lapsed session "
        "does not end a live attempt, and a session lease never hides cancel_requested.",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "lease, cancellation"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
        ),
        minor=8,
    ),
    _r(
        "SESSION-VISIBILITY",
        SHOULD,
        _A.SESSIONS,
        "Operators can list a namespace's sessions with per-status metrics and read one session's snapshot "
        "(holder, queue, requirements, lease and TTL expiry, active activity count, failure reason).",
        cites=(
            _wp("Discovery capabilities", "worker_session_verbs, worker_sessions"),
            _pkg("Worker sessions", "Visibility"),
            _pkg("WorkerProtocolVersion::workerSessionSemantics"),
            _read("Worker sessions"),
        ),
        minor=8,
    ),
)

# What a vendor's test build must expose in GET /api/cluster/info under worker_protocol.test_profile
# (docs/test-profile.md) for the rules below to be checkable: without it a conforming server is INCOMPLETE, never
# CONFORMANT. A duration is read as its value; the suite waits for it only when it fits --max-wait.
TEST_PROFILE: Final[Mapping[str, str]] = MappingProxyType(
    {
        "workflow_task_lease_seconds": "the workflow-task lease, short enough to wait out (the suite waits at most "
        "--max-wait)",
        "activity_task_lease_seconds": "the activity-task lease, short enough to wait out",
        "query_task_timeout_seconds": "the query-task timeout, short enough to wait out",
        "long_poll_max_seconds": "the long-poll clamp, when shorter than 60 s (otherwise --max-wait 65 covers it)",
        "max_active_leases_per_queue": "the admission limit per queue, so a poll can be throttled on purpose",
        "cancellation_cleanup_seconds": "the cleanup deadline of a cooperative cancellation, short enough to wait out",
        "matching_switch": 'a control route (POST …/task-queues/{queue}/matching {"available": false}) that makes '
        "one queue's matching unavailable",
    }
)
_COVERED_THROUGH: Final[Mapping[str, str]] = {
    "EXPIRY-HOLDER-FENCED": "workflow_task_lease_seconds",
    "EXPIRY-REDELIVER-SAME-TASK": "workflow_task_lease_seconds",
    "EXPIRY-ONLY-NEW-LEASE-COMMITS": "workflow_task_lease_seconds",
    "EXPIRY-SELF-RECOVERY": "workflow_task_lease_seconds",
    "DISPATCH-CRASH-TAKEOVER": "workflow_task_lease_seconds",
    "DISPATCH-LATE-EVENT-FENCED": "workflow_task_lease_seconds",
    "RESTART-LEASE-TAKEOVER": "workflow_task_lease_seconds",
    "RESTART-STALE-LEASE-FENCED": "workflow_task_lease_seconds",
    "ACTIVITY-REDELIVERY-NEW-ATTEMPT": "activity_task_lease_seconds",
    "QUERY-TIMEOUT-504": "query_task_timeout_seconds",
    "QUERY-LATE-COMPLETE-NOT-LEASED": "query_task_timeout_seconds",
    "LONGPOLL-CLAMP-MAX": "long_poll_max_seconds",
    "POLL-STATUS-THROTTLED": "max_active_leases_per_queue",
    "POLL-STATUS-RETRY-AFTER": "max_active_leases_per_queue",
    "POLL-STATUS-UNAVAILABLE": "matching_switch",
    "CANCEL-COOPERATIVE-DEADLINE": "cancellation_cleanup_seconds",
}

REGISTRY: Final[Mapping[str, Requirement]] = MappingProxyType(
    {req.id: replace(req, profile=_COVERED_THROUGH.get(req.id)) for req in _REQUIREMENTS}
)


def by_area(area: Area) -> list[Requirement]:
    """The requirements of one area, in registry order."""
    return [req for req in REGISTRY.values() if req.area is area]


def by_level(level: Level) -> list[Requirement]:
    """The requirements of one level, in registry order."""
    return [req for req in REGISTRY.values() if req.level is level]


def applicable(req: Requirement, certified_minor: int) -> bool:
    """Whether ``req`` applies when certifying a server at protocol ``1.<certified_minor>``.

    §3.3: "A server MUST NOT require fields that were introduced after the worker's minor"; likewise a
    server is only held to rules its minor had.
    """
    return minor_supports(certified_minor, req.minor)


def validate_registry() -> None:
    """Raise ``ValueError`` listing every problem in :data:`REGISTRY`; return ``None`` when it is sound.

    Checks: IDs unique and UPPER-KEBAB; sentences non-empty; every requirement cites at least one section
    (each citation names a section its document declares); minors in 0..advertised; test-profile marks
    name known keys.
    """
    problems: list[str] = []
    seen: set[str] = set()
    for req in _REQUIREMENTS:
        if req.id in seen:
            problems.append(f"duplicate requirement id {req.id!r}")
        seen.add(req.id)
        if not REQUIREMENT_ID_PATTERN.fullmatch(req.id):
            problems.append(f"{req.id!r} does not match {REQUIREMENT_ID_PATTERN.pattern}")
        if not req.sentence.strip():
            problems.append(f"{req.id}: empty sentence")
        if not req.cites:
            problems.append(f"{req.id}: cites no document")
        if not 0 <= req.minor <= ADVERTISED_MINOR:
            problems.append(f"{req.id}: minor {req.minor} outside 0..{ADVERTISED_MINOR}")
    for req_id, key in _COVERED_THROUGH.items():
        if req_id not in REGISTRY or key not in TEST_PROFILE:
            problems.append(
                f"{req_id}: covered through {key!r}, but the requirement or the test-profile key is unknown"
            )
    if problems:
        raise ValueError("requirement registry is unsound:\n  " + "\n  ".join(problems))
