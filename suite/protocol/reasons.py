"""The catalogue of wire ``reason`` codes and their HTTP statuses (every area of docs/reference.md).

"``reason``: snake-case, machine-readable code. **The suite keys on this field**" (§2.2). One table,
:data:`REASONS`, says for every code which status it travels with, on which plane, and where the spec
defines it; :func:`reject` builds a :class:`~suite.protocol.errors.Rejection` from it so no caller
writes a status number by hand.

Three kinds of entry live here:

* **rejections** (status ≥ 400), the usual case;
* **body reasons on a 200** (§11.5 activity heartbeat: "the response is still HTTP 200 … with
  ``can_continue:false`` … and a ``reason``"), whose status is 200 and which :func:`reject` refuses;
* **transport reasons the reference server chose** (``malformed_json``, ``payload_too_large`` …) for
  things the spec names only by status (§16.67 lists 400 and 415), marked "RS choice" in ``section``.

A code whose status depends on the endpoint carries ``overrides``: ``worker_not_registered`` is 412 on a
poll (§7.5) but 404 on ``POST /api/worker/heartbeat`` (§6.2); ``run_cancelled`` is 409 on an activity
complete (§11.5 "outcome ignored") but a 200 body reason on an activity heartbeat. A code for which the
spec allows more than one status lists the others in ``also`` (``invalid_commands`` is 409 or 422).

Naming decision: a body that is not JSON is ``malformed_json`` (400). ``invalid_json`` is not used.
Codec error names (``invalid_payload_framing``, ``unsupported_payload_schema`` …) are
:mod:`suite.protocol.errors` codes, not wire reasons; only ``unsupported_payload_codec`` appears here,
because §13.1 calls it "the stable fail-closed reason".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal

from suite.protocol.errors import Rejection

__all__ = [
    "ACTIVITY_HEARTBEAT",
    "ACTIVITY_HEARTBEAT_STOP_REASONS",
    "ACTIVITY_STATUS",
    "REASONS",
    "STOP_REASONS",
    "TOLERATED_POLL_STATUSES",
    "WORKER_HEARTBEAT",
    "Plane",
    "PollStatus",
    "Reason",
    "heartbeat_cancel_requested",
    "reject",
    "stop_reason_for",
]

Plane = Literal["worker", "control", "both"]

# Endpoint keys used by ``Reason.overrides``: "METHOD path-template", as in §1.
WORKER_HEARTBEAT: Final = "POST /api/worker/heartbeat"
ACTIVITY_HEARTBEAT: Final = "POST /api/worker/activity-tasks/{task_id}/heartbeat"
# §1.1: the optional activity ``status`` verb answers with "the heartbeat response shape".
ACTIVITY_STATUS: Final = "POST /api/worker/activity-tasks/{task_id}/status"


@dataclass(frozen=True, slots=True)
class Reason:
    """One wire ``reason`` code.

    ``status`` is the usual HTTP status; ``also`` other statuses the spec allows for the same code;
    ``section`` the areas of docs/reference.md that define it; ``overrides`` per-endpoint statuses
    (endpoint key → status); ``message`` the human text the spec
    fixes, if any (otherwise ``meaning`` is used as the message).
    """

    code: str
    status: int
    plane: Plane
    section: str
    meaning: str
    also: frozenset[int] = frozenset()
    overrides: tuple[tuple[str, int], ...] = ()
    message: str | None = None

    @property
    def accepted_statuses(self) -> frozenset[int]:
        """Every status a conforming server may send with this code, on any endpoint."""
        return frozenset({self.status, *self.also, *(status for _, status in self.overrides)})

    def status_at(self, endpoint: str | None = None) -> int:
        """The status on ``endpoint`` (an ``"METHOD /path/template"`` key), or the usual status."""
        if endpoint is not None:
            for key, status in self.overrides:
                if key == endpoint:
                    return status
        return self.status

    @property
    def default_message(self) -> str:
        return self.message if self.message is not None else self.meaning


_HB_200: Final = ((ACTIVITY_HEARTBEAT, 200), (ACTIVITY_STATUS, 200))

_CATALOGUE: Final[tuple[Reason, ...]] = (
    # ---- §2.3 steps 1-5: authentication, role, version, namespace, body -------------------------------
    Reason(
        "unauthorized",
        401,
        "both",
        "Auth",
        "The credential is missing or invalid.",
        message="Invalid or missing authentication token.",
    ),
    Reason(
        "forbidden",
        403,
        "both",
        "Auth",
        "The authenticated role may not call this route; the body names role and allowed_roles.",
        message="Authenticated role is not allowed to access this endpoint.",
    ),
    Reason(
        "missing_protocol_version",
        400,
        "worker",
        "Versioning",
        "X-Durable-Workflow-Protocol-Version is absent or empty after trimming.",
        message="Missing worker protocol version header.",
    ),
    Reason(
        "unsupported_protocol_version",
        400,
        "worker",
        "Versioning",
        "The worker version is malformed, of another major, or of a minor above the server's.",
        message="Unsupported worker protocol version.",
    ),
    Reason(
        "missing_control_plane_version",
        400,
        "control",
        "Versioning",
        "X-Durable-Workflow-Control-Plane-Version is absent or empty after trimming.",
        message="Missing control plane version header.",
    ),
    Reason(
        "unsupported_control_plane_version",
        400,
        "control",
        "Versioning",
        'The control-plane version is anything other than "2".',
        message="Unsupported control plane version.",
    ),
    Reason(
        "namespace_not_found",
        404,
        "both",
        "Auth",
        "The namespace (X-Namespace, ?namespace=, or the default) does not exist.",
    ),
    Reason(
        "validation_failed",
        422,
        "both",
        "Envelope, Fencing",
        "The body failed validation; errors and validation_errors map field paths to messages.",
    ),
    # ---- §6 registration and worker heartbeat --------------------------------------------------------
    Reason(
        "workflow_definition_changed",
        409,
        "worker",
        "Registration",
        "An active registration re-registered with a different fingerprint for the same workflow type.",
    ),
    Reason(
        "worker_not_registered",
        412,
        "worker",
        "Leasing, Registration",
        "The worker_id is not registered in this namespace.",
        # §7.5: poll → "412 worker_not_registered"; §6.2: worker heartbeat → "Unknown worker: 404
        # worker_not_registered". Same code, two statuses: modelled as a per-endpoint override.
        overrides=((WORKER_HEARTBEAT, 404),),
    ),
    Reason(
        "worker_not_found",
        404,
        "worker",
        "Registration (deregister)",
        "Deregistration of a worker that is not registered; the SDK reads it as already deregistered.",
    ),
    # ---- §7 polling ----------------------------------------------------------------------------------
    Reason(
        "task_queue_mismatch",
        409,
        "worker",
        "Leasing",
        "The poll's task_queue differs from the registered queue.",
    ),
    Reason(
        "build_id_mismatch",
        409,
        "worker",
        "Leasing",
        "The poll's build_id differs from the registered non-empty build_id.",
    ),
    Reason(
        "worker_draining",
        409,
        "worker",
        "Poll status",
        "The worker's build-id cohort is draining on this queue; no new lease is granted.",
    ),
    Reason(
        "matching_unavailable",
        503,
        "worker",
        "Fencing",
        "The matching layer could not coordinate safely (poll_status unavailable).",
        also=frozenset({200}),
    ),
    # ---- §8.9 workflow-task rejection matrix ---------------------------------------------------------
    Reason(
        "task_not_found",
        404,
        "worker",
        "Fencing, Activities",
        "The task id is unknown in this namespace.",
    ),
    Reason(
        "history_not_available",
        404,
        "worker",
        "History",
        "The task has no history available.",
    ),
    Reason(
        "run_closed",
        409,
        "worker",
        "Fencing, Activities",
        "The run is terminal; the body carries can_continue:false, cancel_requested and stop_reason.",
        # §11.5: on an activity heartbeat, "run_closed (completed or failed run)" is a 200 body reason.
        overrides=_HB_200,
        message="Workflow run is already closed.",
    ),
    Reason(
        "task_not_leased",
        409,
        "worker",
        "Fencing, Commands, Activities",
        "The task is not leased (ready, completed or failed) and the run is live.",
        overrides=_HB_200,
    ),
    Reason(
        "lease_expired",
        409,
        "worker",
        "Fencing, Queries",
        "The lease expired (lease_expires_at ≤ now); whoever asks is refused.",
    ),
    Reason(
        "lease_owner_mismatch",
        409,
        "worker",
        "Fencing, Queries, Activities",
        "lease_owner is not the current owner; the body's lease_owner names the current owner.",
    ),
    Reason(
        "workflow_task_attempt_mismatch",
        409,
        "worker",
        "Fencing",
        "workflow_task_attempt is not the current attempt; the body carries current_attempt.",
    ),
    Reason(
        "invalid_page_token",
        400,
        "worker",
        "History, Fencing",
        "The history page token is not base64 of a decimal sequence.",
    ),
    Reason(
        "invalid_commands",
        409,
        "worker",
        "Commands",
        "The command batch is semantically invalid (two terminals, unknown type …); nothing is applied.",
        # §8.7: "UPS returns 409 … The RS may use 409 or 422, and the suite accepts both."
        also=frozenset({422}),
    ),
    Reason(
        "structural_limit_exceeded",
        422,
        "worker",
        "Commands",
        "A history budget would be exceeded; the body carries limit_kind, current_value, configured_limit.",
    ),
    Reason(
        "run_already_closed",
        409,
        "worker",
        "Commands",
        "Bridge rejection: the run closed before the completion was applied (recorded:false).",
    ),
    Reason(
        "run_timed_out",
        409,
        "worker",
        "Commands",
        "Bridge rejection: the run deadline passed (recorded:false).",
    ),
    # ---- §11 activity tasks --------------------------------------------------------------------------
    Reason(
        "attempt_not_found",
        404,
        "worker",
        "Activities",
        "The activity_attempt_id is unknown.",
    ),
    Reason(
        "task_mismatch",
        409,
        "worker",
        "Activities",
        "The activity attempt belongs to a different task.",
    ),
    Reason(
        "stale_attempt",
        409,
        "worker",
        "Activities, Timeouts",
        "The attempt already has an outcome or was superseded; outcome completed, recorded:false.",
        overrides=_HB_200,
    ),
    Reason(
        "run_cancelled",
        409,
        "worker",
        "Activities",
        "The run was cancelled: an activity outcome is ignored (409); a heartbeat reports it in a 200.",
        overrides=_HB_200,
        message="Activity outcome ignored because the workflow run is already closed.",
    ),
    Reason(
        "run_terminated",
        409,
        "worker",
        "Activities",
        "The run was terminated: an activity outcome is ignored (409); a heartbeat reports it in a 200.",
        overrides=_HB_200,
        message="Activity outcome ignored because the workflow run is already closed.",
    ),
    Reason(
        "activity_cancelled",
        200,
        "worker",
        "Activities",
        "Heartbeat body reason: the activity execution was cancelled.",
    ),
    Reason(
        "task_cancelled",
        200,
        "worker",
        "Activities",
        "Heartbeat body reason: the activity task was cancelled.",
    ),
    Reason(
        "activity_not_running",
        200,
        "worker",
        "Activities",
        "Heartbeat body reason: the activity execution is not running.",
    ),
    Reason(
        "stale_task",
        200,
        "worker",
        "Activities",
        "Heartbeat body reason: the task was superseded.",
    ),
    Reason(
        "attempt_closed",
        200,
        "worker",
        "Activities",
        "Heartbeat body reason: the attempt already has an outcome.",
    ),
    # ---- §10 query tasks -----------------------------------------------------------------------------
    Reason(
        "query_task_not_found",
        404,
        "worker",
        "Queries",
        "The query task id is unknown in this namespace.",
    ),
    Reason(
        "query_task_not_leased",
        409,
        "worker",
        "Queries",
        "The query task is not leased (completed, failed, timed out or pending).",
    ),
    Reason(
        "query_task_attempt_mismatch",
        409,
        "worker",
        "Queries",
        "query_task_attempt is not the current attempt; the body carries current_attempt.",
    ),
    Reason(
        "query_task_timed_out",
        409,
        "worker",
        "Queries (SDK reads it as final)",
        "The query task timed out; the RS itself answers query_task_not_leased after a timeout.",
    ),
    Reason(
        "query_task_queue_unavailable",
        503,
        "both",
        "Queries",
        "The query-task queue lock or cache is unavailable (poll_status unavailable).",
        also=frozenset({200}),
    ),
    Reason(
        "rejected_unknown_query",
        404,
        "both",
        "Queries",
        "The workflow type has no query handler with that name.",
    ),
    Reason(
        "query_rejected",
        409,
        "both",
        "Queries",
        "The worker failed the query for any other reason.",
    ),
    Reason(
        "invalid_query_arguments",
        409,
        "both",
        "Queries",
        "The worker refused the query arguments (UPS 409; UPP's in-process path 422).",
        also=frozenset({422}),
    ),
    Reason(
        "query_worker_unavailable",
        409,
        "control",
        "Queries",
        "No active, fresh query-capable worker can take the query.",
    ),
    Reason(
        "query_worker_timeout",
        504,
        "control",
        "Queries",
        "No query result arrived before the configured timeout.",
    ),
    Reason(
        "query_task_queue_full",
        429,
        "control",
        "Queries",
        "Pending query tasks on the queue reached the cap (1024).",
    ),
    # ---- §12 control plane ---------------------------------------------------------------------------
    Reason(
        "instance_not_found",
        404,
        "control",
        "Control plane",
        "The workflow id is unknown in this namespace.",
    ),
    Reason(
        "run_not_found",
        404,
        "control",
        "Control plane",
        "The run id is unknown for this workflow.",
    ),
    Reason(
        "rejected_duplicate",
        409,
        "control",
        "Control plane",
        "A run with this workflow_id is active and duplicate_policy is fail.",
    ),
    Reason(
        "workflow_id_reserved_in_namespace",
        409,
        "control",
        "Control plane",
        "The workflow_id is reserved in this namespace.",
    ),
    Reason(
        "historical_run_command_rejected",
        409,
        "control",
        "Control plane",
        "A run-targeted command named a run that is not the current run.",
    ),
    Reason(
        "rejected_not_active",
        409,
        "control",
        "Control plane",
        "The run is closed, so the signal, update, cancel or terminate was not accepted.",
    ),
    Reason(
        "rejected_unknown_signal",
        404,
        "control",
        "Control plane",
        "The workflow type declares no signal with that name (only when the contract is known).",
    ),
    Reason(
        "rejected_unknown_update",
        404,
        "control",
        "Control plane",
        "The workflow type declares no update with that name.",
    ),
    Reason(
        "rejected_invalid_arguments",
        422,
        "control",
        "Control plane",
        "The signal or update arguments are invalid.",
    ),
    Reason(
        "update_failed",
        422,
        "control",
        "Control plane",
        "The worker failed the update (fail_update).",
    ),
    # ---- §13 codec -----------------------------------------------------------------------------------
    Reason(
        "unsupported_payload_codec",
        422,
        "both",
        "Codec",
        "An envelope names a codec other than avro (the server's 422 message begins with this code).",
    ),
    # ---- transport: statuses the spec names, codes the reference server chose ----------------------
    Reason(
        "malformed_json",
        400,
        "both",
        "Robustness (RS choice)",
        "The body is not valid UTF-8 JSON.",
    ),
    Reason(
        "unsupported_media_type",
        415,
        "both",
        "Robustness (RS choice)",
        "The body is not application/json.",
    ),
    Reason(
        "route_not_found",
        404,
        "both",
        "Envelope (RS choice)",
        "No route matches the path.",
    ),
    Reason(
        "method_not_allowed",
        405,
        "both",
        "Envelope (RS choice)",
        "The route exists but not for this HTTP method.",
    ),
    Reason(
        "payload_too_large",
        413,
        "both",
        "Discovery limits (RS choice)",
        "The request body exceeds the transport limit.",
    ),
    Reason(
        "headers_too_large",
        431,
        "both",
        "RS choice",
        "The request headers exceed the transport limit.",
    ),
    # ---- worker sessions (worker-sessions-runtime.schema.json workerSessionOperationResult.reason) ----------
    Reason(
        "invalid_worker_session", 422, "worker", "A.2; SPEC workerSessionOptions", "The session options are invalid."
    ),
    Reason(
        "session_queue_mismatch",
        409,
        "worker",
        "A.2 admission.queue_routing_first",
        "The session's queue differs from the queue the worker registered for.",
    ),
    Reason("session_not_found", 404, "worker", "A.2; SPEC", "No worker session with this id exists in the namespace."),
    Reason(
        "session_not_active",
        409,
        "worker",
        "A.2 lifecycle",
        "The session is expired, orphaned, failed or closed; only an active session is renewed.",
    ),
    Reason(
        "session_owner_mismatch",
        409,
        "worker",
        "A.2 ownership",
        "The worker is not the session's lease owner (it may have lost the session to another worker).",
    ),
    Reason(
        "session_missing",
        409,
        "worker",
        "A.2 admission.create_if_missing_default",
        "The session does not exist and create_if_missing is false.",
    ),
    Reason(
        "session_requirements_not_met",
        409,
        "worker",
        "A.2 admission.requires_capabilities",
        "The worker's registered capabilities do not cover every session requirement.",
    ),
    Reason(
        "worker_session_limit_exceeded",
        409,
        "worker",
        "A.2 limits.max_concurrent_worker_sessions",
        "The worker already holds max_concurrent_worker_sessions active sessions.",
    ),
    Reason(
        "session_owned_by_another_worker",
        409,
        "worker",
        "A.2 ownership single_worker_lease_owner",
        "Another worker holds the session's lease.",
    ),
    Reason(
        "session_activity_limit_exceeded",
        409,
        "worker",
        "A.2 limits.max_concurrent_activities",
        "The session already runs max_concurrent_activities leased attempts.",
    ),
    Reason("session_closed", 409, "worker", "A.2 terminal_statuses", "The session is closed; its id cannot be reused."),
    Reason(
        "session_reacquire_disallowed",
        409,
        "worker",
        "A.2 terminal_conditions allow_reacquire_after_failure_false",
        "The session lost its lease or holder and forbids reacquisition.",
    ),
)

REASONS: Final[Mapping[str, Reason]] = MappingProxyType({reason.code: reason for reason in _CATALOGUE})
if len(REASONS) != len(_CATALOGUE):  # pragma: no cover - a duplicate code is an editing error
    raise RuntimeError("suite.protocol.reasons: duplicate reason code in _CATALOGUE")


def reject(code: str, message: str | None = None, /, *, endpoint: str | None = None, **fields: Any) -> Rejection:
    """A :class:`Rejection` for ``code`` with the catalogue's status (on ``endpoint`` if given).

    ``fields`` become extra body keys (``current_attempt=2``, ``lease_owner="w1"`` …). ``code`` and
    ``message`` are positional-only so a body field may itself be called ``code`` or ``message``.
    """
    try:
        reason = REASONS[code]
    except KeyError:
        raise ValueError(
            f"unknown reason code {code!r}: add it to REASONS in suite/protocol/reasons.py "
            "with its status and the spec section that defines it"
        ) from None
    status = reason.status_at(endpoint)
    if status < 400:
        raise ValueError(
            f"reason {code!r} is reported in an HTTP {status} body on {endpoint or 'its endpoint'}, "
            "not as a rejection; build that response body instead of raising"
        )
    return Rejection(status, code, message if message is not None else reason.default_message, fields)


# §11.5: "When the attempt cannot continue, the response is still HTTP 200 (only attempt_not_found gives
# 404), with can_continue:false, heartbeat_recorded:false and a reason". reason → the allowed values of
# cancel_requested. attempt_closed: "false, or true if the attempt itself was cancelled".
ACTIVITY_HEARTBEAT_STOP_REASONS: Final[Mapping[str, frozenset[bool]]] = MappingProxyType(
    {
        "run_cancelled": frozenset({True}),
        "run_terminated": frozenset({True}),
        "activity_cancelled": frozenset({True}),
        "task_cancelled": frozenset({True}),
        "run_closed": frozenset({False}),
        "activity_not_running": frozenset({False}),
        "stale_attempt": frozenset({False}),
        "stale_task": frozenset({False}),
        "task_not_leased": frozenset({False}),
        "attempt_closed": frozenset({False, True}),
    }
)


def heartbeat_cancel_requested(reason: str, *, attempt_cancelled: bool = False) -> bool:
    """``cancel_requested`` for an activity heartbeat that cannot continue with ``reason`` (§11.5)."""
    allowed = ACTIVITY_HEARTBEAT_STOP_REASONS.get(reason)
    if allowed is None:
        raise ValueError(
            f"{reason!r} is not an activity-heartbeat stop reason; expected one of "
            f"{sorted(ACTIVITY_HEARTBEAT_STOP_REASONS)} (docs/reference.md: Activities)"
        )
    if len(allowed) == 1:
        return next(iter(allowed))
    return attempt_cancelled


# §8.9 row 2: "stop_reason (run_cancelled|run_terminated|run_completed|run_failed|run_closed)", keyed by
# the terminal run status; run_closed is the fallback for any other closed state.
STOP_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "cancelled": "run_cancelled",
        "terminated": "run_terminated",
        "completed": "run_completed",
        "failed": "run_failed",
    }
)


def stop_reason_for(run_status: str) -> str:
    """The ``stop_reason`` of a ``run_closed`` rejection for a run in ``run_status``."""
    return STOP_REASONS.get(run_status, "run_closed")


class PollStatus(StrEnum):
    """§7.4: "every worker poll response carries it". The S0 set; see :data:`TOLERATED_POLL_STATUSES`."""

    LEASED = "leased"
    EMPTY = "empty"
    THROTTLED = "throttled"
    UNAVAILABLE = "unavailable"
    DRAINING = "draining"

    @property
    def http_status(self) -> int:
        """The status a 1.20 server sends with this poll outcome."""
        return _POLL_HTTP_STATUS[self]

    @property
    def accepted_http_statuses(self) -> frozenset[int]:
        """Every status §7.4 allows (``unavailable`` is "503 or 200")."""
        return _POLL_ACCEPTED_STATUSES[self]

    @property
    def has_task(self) -> bool:
        """§16.17: "task != null ⇔ poll_status == "leased"."""
        return self is PollStatus.LEASED

    @property
    def reason(self) -> str | None:
        """The ``reason`` the body must carry, if §7.4 fixes one (``draining`` → ``worker_draining``)."""
        return "worker_draining" if self is PollStatus.DRAINING else None


_POLL_HTTP_STATUS: Final[Mapping[PollStatus, int]] = MappingProxyType(
    {
        PollStatus.LEASED: 200,
        PollStatus.EMPTY: 200,
        # §7.4: "backpressure, not idleness"; HTTP 200.
        PollStatus.THROTTLED: 200,
        PollStatus.UNAVAILABLE: 503,
        PollStatus.DRAINING: 409,
    }
)
_POLL_ACCEPTED_STATUSES: Final[Mapping[PollStatus, frozenset[int]]] = MappingProxyType(
    {
        status: frozenset({code, 200}) if status is PollStatus.UNAVAILABLE else frozenset({code})
        for status, code in _POLL_HTTP_STATUS.items()
    }
)

# §7.4: "Extensions seen upstream that the suite must tolerate on query polls: workflow_task_pending …
# and stale_worker_registration. The SDK also tolerates no_compatible_worker and a client-synthesised
# timeout." A reader accepts these; a 1.20 server does not need to send them.
TOLERATED_POLL_STATUSES: Final = frozenset(
    {"workflow_task_pending", "stale_worker_registration", "no_compatible_worker", "timeout"}
)
