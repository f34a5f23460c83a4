"""Workflow-task command batches, retry policies and start input: docs/reference.md: Commands, Retries, Control plane.

:func:`validate_batch` turns the ``commands`` member of a complete request into a list of :class:`Command`, or
raises :class:`~suite.protocol.errors.Rejection`. Two families, checked in this order:

1. **Body shape → 422 ``validation_failed``**, with ``errors`` and ``validation_errors`` (the same map of
   field path → messages, e.g. ``"commands.0.delay_seconds"``). Every shape error of the whole batch is
   collected before raising. This covers: ``commands`` missing, not an array or empty; an item that is not
   an object; a missing or non-string ``type``; a required field missing; a field of the wrong type or out
   of range; a field not allowed on that type (the §8.7.1 scope rules); timeout ordering; the retry-policy
   shape; payload envelopes, including ``unsupported_payload_codec:`` for a codec other than ``avro``.
2. **Batch semantics → 409 ``invalid_commands``** with ``recorded:false`` and ``command_errors`` (the same
   path → messages shape; named differently because §2.2 reserves ``errors`` for 422): an unknown command
   ``type``, two or more terminal commands, and ``complete_update``/``fail_update`` for an update that is not
   accepted-and-open on the run (or that an earlier command of the batch already closed).
   §8.7: "The RS may use 409 or 422, and the suite accepts both" — the model uses 409, as UPS does.

Decisions where the spec is loose:

- ``null`` for an optional field means "absent" (Laravel ``nullable``), including for the scope rules: a
  scoped field is "present" only when it is not ``null``. A required field that is ``null`` is missing.
- Integers are JSON integers: ``true``/``false`` are not integers, and neither are ``5.0`` or ``"5"``.
- ``retry_policy: {}`` is treated as **no policy** (``None``), which §8.7.1 allows: "the RS SHOULD treat `{}`
  as "no policy" **or** reject it". A policy without ``max_attempts`` gets the default 1.
- Unknown fields on a command are ignored (§0 "Unknown request fields MUST be ignored"); only the fields the
  scope rules name are refused on the wrong command type. Unknown keys *inside* ``retry_policy`` are refused.
- Payload fields (``result``, ``arguments``) must be an envelope (exactly ``{codec, blob}`` or
  ``{codec, external_storage}``) or a bare base64 string. A ``blob`` must be non-empty standard base64 with
  padding (§13.1): an empty blob can never hold an Avro frame.
- ``upsert_search_attributes.attributes`` must be a non-empty object (it is required, and an upsert of
  nothing is a worker bug).
- The terminal command may sit anywhere in the batch; :func:`apply_order` puts it last, as §8.7 says the
  server applies it ("Non-terminal commands … are applied **in order**, then the terminal command").
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn

from suite.protocol.codec import decode_blob, encode_blob, json_to_value, value_to_json
from suite.protocol.errors import CodecError, Rejection
from suite.protocol.lifecycles import RunEvent
from suite.protocol.sessions import parse_options as parse_session_options
from suite.protocol.wording import plural

__all__ = [
    "ACTIVITY_TASK_FENCE",
    "ACTIVITY_TIMEOUTS",
    "ALL_TYPES",
    "CHILD_TIMEOUTS",
    "DEFAULT_CHILD_CANCELLATION_POLICY",
    "DEFAULT_PARENT_CLOSE_POLICY",
    "DEFAULT_QUERY_FAILURE_REASON",
    "DEFAULT_RETRY_POLICY",
    "DUPLICATE_POLICIES",
    "FAILURE_KINDS",
    "HEARTBEAT_PROGRESS",
    "LEGACY_START_FIELDS",
    "MAX_MEMO_BYTES",
    "NON_TERMINAL_TYPES",
    "OPTIONAL_TYPES",
    "PARENT_CLOSE_POLICIES",
    "QUERY_TASK_FENCE",
    "REPORT_BODIES",
    "SCOPED_FIELDS",
    "START_TIMEOUT_FIELDS",
    "SUPPORTED_PAYLOAD_CODECS",
    "TERMINAL_TYPES",
    "TIMEOUT_TYPES",
    "UPDATE_CLOSING_TYPES",
    "WORKFLOW_ID_MAX_LENGTH",
    "WORKFLOW_TASK_FENCE",
    "ActivityFailure",
    "ActivityFence",
    "Command",
    "FieldSpec",
    "HeartbeatProgress",
    "RetryPolicy",
    "StartInput",
    "StartRequest",
    "apply_order",
    "batch_run_event",
    "terminal_command",
    "validate_activity_complete",
    "validate_activity_fail",
    "validate_activity_heartbeat",
    "validate_batch",
    "validate_query_complete",
    "validate_query_fail",
    "validate_retry_policy",
    "validate_start_input",
    "validate_start_request",
    "validate_workflow_failure",
    "validate_workflow_fence",
    "validate_workflow_id",
    "validation_failed",
]

# §5.2 `supported_workflow_task_commands`: "Terminal types first, then non-terminal" in S0's order.
TERMINAL_TYPES: Final[tuple[str, ...]] = ("complete_workflow", "fail_workflow", "continue_as_new")
# Commands that close an accepted update (§8.7.1): valid only for an update open on the run.
UPDATE_CLOSING_TYPES: Final[tuple[str, ...]] = ("complete_update", "fail_update")
NON_TERMINAL_TYPES: Final[tuple[str, ...]] = (
    "schedule_activity",
    "start_timer",
    "start_child_workflow",
    "complete_update",
    "fail_update",
    "record_side_effect",
    "record_version_marker",
    "upsert_search_attributes",
)
ALL_TYPES: Final[tuple[str, ...]] = TERMINAL_TYPES + NON_TERMINAL_TYPES
# §5.2: "[UPP] also lists `start_service_operation`, `open_condition_wait` and `open_signal_wait`. The RS MAY
# add them only if it implements them." These types are validated only when the caller passes them in
# ``validate_batch(optional_types=…)`` — a server that implements and advertises them; for everyone else they
# stay unknown types (409 ``invalid_commands``), exactly like any other type outside S0's 11.
OPTIONAL_TYPES: Final[tuple[str, ...]] = ("open_condition_wait",)

# §8.7.1: "`parent_close_policy` ∈ {`abandon`, `request_cancel`, `request_cancellation`, `terminate`} [S0];
# anything else is invalid."
PARENT_CLOSE_POLICIES: Final[frozenset[str]] = frozenset(
    {"abandon", "request_cancel", "request_cancellation", "terminate"}
)
# What a start_child_workflow without `parent_close_policy` means. The seed names the four values and no
# default; the upstream engine and the official SDK 2.12.0 both read an omitted policy as `abandon`, and the
# SDK compares the policy recorded on ChildWorkflowScheduled with the one it assumes on every replay
# (`child_workflow_policy_changed`), so a server must record `abandon` (Python SDK 2.12.0, Child workflow cancellation).
DEFAULT_PARENT_CLOSE_POLICY: Final = "abandon"
# The same for the child's `cancellation_policy` (an SDK field outside S0's list, recorded for replay):
# the SDK compares it the same way and assumes `abandon` when absent.
DEFAULT_CHILD_CANCELLATION_POLICY: Final = "abandon"

# §13.1: "v2 has **one** language-neutral codec: **`avro`**."
SUPPORTED_PAYLOAD_CODECS: Final[tuple[str, ...]] = ("avro",)

ACTIVITY_TIMEOUTS: Final[tuple[str, ...]] = (
    "start_to_close_timeout",
    "schedule_to_start_timeout",
    "schedule_to_close_timeout",
    "heartbeat_timeout",
)
"""The four §11.7 activity timeouts a ``schedule_activity`` may carry (seconds, ≥1), in snapshot order."""
CHILD_TIMEOUTS: Final[tuple[str, ...]] = ("execution_timeout_seconds", "run_timeout_seconds")

# §8.7.1 "Which fields are allowed on which command (UPS `validateWorkflowTaskCommandScopes`; 422 with
# per-field errors)".
SCOPED_FIELDS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        # "`retry_policy` only on `schedule_activity` and `start_child_workflow`."
        "retry_policy": frozenset({"schedule_activity", "start_child_workflow"}),
        # "`start_to_close_timeout`, `schedule_to_start_timeout`, `schedule_to_close_timeout` and
        # `heartbeat_timeout` only on `schedule_activity`."
        **{name: frozenset({"schedule_activity"}) for name in ACTIVITY_TIMEOUTS},
        # "`execution_timeout_seconds` and `run_timeout_seconds` only on `start_child_workflow`."
        **{name: frozenset({"start_child_workflow"}) for name in CHILD_TIMEOUTS},
        # "`non_retryable` only on `fail_workflow` and `fail_update`."
        "non_retryable": frozenset({"fail_workflow", "fail_update"}),
    }
)

WORKFLOW_ID_MAX_LENGTH: Final = 128
_WORKFLOW_ID = re.compile(r"[a-zA-Z0-9._:-]+", re.ASCII)
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", re.ASCII)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# ---------------------------------------------------------------------------------------------------------
# Error collection
# ---------------------------------------------------------------------------------------------------------


class _Errors:
    """Field path → messages, in the order found."""

    def __init__(self) -> None:
        self.by_path: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.by_path.setdefault(path, []).append(message)

    def __bool__(self) -> bool:
        return bool(self.by_path)

    def raise_422(self, what: str) -> None:
        """Raise the 422 if any error was collected."""
        if self.by_path:
            self.reject(what)

    def reject(self, what: str) -> NoReturn:
        first_path, first = next(iter(self.by_path.items()))
        more = len(self.by_path) - 1
        suffix = f" (and {more} more field error{'s' if more != 1 else ''})" if more else ""
        raise Rejection(
            422,
            "validation_failed",
            f"The {what} is invalid: {first_path}: {first[0]}{suffix}. Fix the listed fields and retry.",
            {"errors": self.by_path, "validation_errors": {k: list(v) for k, v in self.by_path.items()}},
        )


def _is_int(value: object) -> bool:
    # JSON booleans arrive as Python bools, which are ints; the protocol's integers exclude them.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_base64(value: str) -> bool:
    if not value or _BASE64.fullmatch(value) is None:
        return False
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Retry policy (§8.7.1 shape, §11.6 semantics)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """A validated ``retry_policy``; the defaults are §11.6's "no retry_policy is given" policy.

    §11.6: "Default when no `retry_policy` is given | **`max_attempts = 1`**, i.e. no retry".
    """

    max_attempts: int = 1
    backoff_seconds: tuple[int, ...] = ()
    non_retryable_error_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if any(b < 0 for b in self.backoff_seconds):
            raise ValueError(f"backoff_seconds must all be >= 0, got {self.backoff_seconds}")

    def is_non_retryable(
        self, failure_type: str | None = None, failure_class: str | None = None, non_retryable: bool = False
    ) -> bool:
        """§11.6: "`failure.non_retryable == true`, or `failure.type` or `failure.class` ∈
        `non_retryable_error_types`"."""
        listed = self.non_retryable_error_types
        return non_retryable or (failure_type in listed) or (failure_class in listed)

    def should_retry(
        self,
        attempt_number: int,
        failure_type: str | None = None,
        failure_class: str | None = None,
        non_retryable: bool = False,
    ) -> bool:
        """Whether a failure of attempt ``attempt_number`` (1-based) schedules another attempt.

        §11.6: "Retry if | The failure is not non-retryable **and** `attempt_number < max_attempts`".
        """
        if attempt_number < 1:
            raise ValueError(f"attempt_number is 1-based, got {attempt_number}")
        if self.is_non_retryable(failure_type, failure_class, non_retryable):
            return False
        return attempt_number < self.max_attempts

    def backoff_before(self, next_attempt: int) -> int:
        """Seconds to wait before attempt ``next_attempt`` (≥ 2).

        §11.6: "Backoff before attempt n+1 | `backoff_seconds[min(n-1, len-1)]`, or 0 if the list is empty.
        For example `[1,5,30]` gives 1 s, 5 s, 30 s, 30 s, …" — so attempt 2 waits 1 s, attempt 5 waits 30 s.
        """
        if next_attempt < 2:
            raise ValueError(f"backoff applies before attempt 2 or later, got next_attempt={next_attempt}")
        if not self.backoff_seconds:
            return 0
        n = next_attempt - 1
        return self.backoff_seconds[min(n - 1, len(self.backoff_seconds) - 1)]

    def to_json(self) -> dict[str, Any]:
        """The policy as JSON (the policy part of the §11.1 ``retry_policy`` snapshot)."""
        return {
            "max_attempts": self.max_attempts,
            "backoff_seconds": list(self.backoff_seconds),
            "non_retryable_error_types": list(self.non_retryable_error_types),
        }


DEFAULT_RETRY_POLICY: Final = RetryPolicy()

_RETRY_KEYS = frozenset({"max_attempts", "backoff_seconds", "non_retryable_error_types"})


def _retry_policy(obj: object, path: str, errs: _Errors) -> RetryPolicy | None:
    # §8.7.1 "`retry_policy` object (shared by activities and children [S0])".
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        errs.add(path, "must be an object with max_attempts, backoff_seconds and non_retryable_error_types")
        return None
    if not obj:
        return None  # Decision (module docstring): `{}` is "no policy".
    before = len(errs.by_path)
    for key in obj:
        if key not in _RETRY_KEYS:
            errs.add(
                f"{path}.{key}",
                "is not a retry_policy field; allowed: " + ", ".join(sorted(_RETRY_KEYS)),
            )
    max_attempts = obj.get("max_attempts")
    if max_attempts is not None and not (_is_int(max_attempts) and max_attempts >= 1):
        # "`max_attempts`: int ≥1."
        errs.add(f"{path}.max_attempts", "must be an integer >= 1")
    # "`backoff_seconds`: list of ints ≥0."
    backoff = _list_of(
        obj, "backoff_seconds", path, errs, lambda b: _is_int(b) and b >= 0, "integers >= 0", "an integer >= 0"
    )
    # "`non_retryable_error_types`: list of non-empty strings."
    kinds = _list_of(
        obj,
        "non_retryable_error_types",
        path,
        errs,
        lambda k: isinstance(k, str) and bool(k),
        "non-empty strings",
        "a non-empty string",
    )
    if len(errs.by_path) != before:
        return None
    return RetryPolicy(
        max_attempts=max_attempts if max_attempts is not None else 1,
        backoff_seconds=tuple(backoff or ()),
        non_retryable_error_types=tuple(kinds or ()),
    )


def _list_of(
    obj: Mapping[str, Any], key: str, path: str, errs: _Errors, ok: Callable[[Any], bool], items: str, item: str
) -> list[Any] | None:
    """``obj[key]``: absent or null, or else an array of ``items``, each bad one named as not ``item``."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        errs.add(f"{path}.{key}", f"must be an array of {items}")
        return None
    for i, each in enumerate(value):
        if not ok(each):
            errs.add(f"{path}.{key}.{i}", f"must be {item}")
    return value


def validate_retry_policy(obj: object, path: str = "retry_policy") -> RetryPolicy | None:
    """Validate a ``retry_policy``: ``None`` for null or ``{}`` ("no policy"), else a :class:`RetryPolicy`.

    Raises ``Rejection(422, "validation_failed")`` with per-field paths under ``path``.
    """
    errs = _Errors()
    policy = _retry_policy(obj, path, errs)
    errs.raise_422("retry_policy")
    return policy


# ---------------------------------------------------------------------------------------------------------
# Field validators
# ---------------------------------------------------------------------------------------------------------


def _string(cmd: Mapping[str, Any], key: str, p: str, errs: _Errors, *, required: bool) -> str | None:
    value = cmd.get(key)
    if value is None:
        if required:
            errs.add(f"{p}.{key}", "is required")
        return None
    if not isinstance(value, str):
        errs.add(f"{p}.{key}", "must be a string")
        return None
    if required and not value.strip():
        errs.add(f"{p}.{key}", "must be a non-empty string")
        return None
    return value


def _integer(
    cmd: Mapping[str, Any], key: str, p: str, errs: _Errors, *, required: bool, minimum: int | None
) -> int | None:
    value = cmd.get(key)
    if value is None:
        if required:
            errs.add(f"{p}.{key}", "is required")
        return None
    if not _is_int(value):
        errs.add(f"{p}.{key}", "must be an integer" + (f" >= {minimum}" if minimum is not None else ""))
        return None
    if minimum is not None and value < minimum:
        errs.add(f"{p}.{key}", f"must be an integer >= {minimum}, got {value}")
        return None
    assert isinstance(value, int)
    return value


def _boolean(cmd: Mapping[str, Any], key: str, p: str, errs: _Errors) -> None:
    value = cmd.get(key)
    if value is not None and not isinstance(value, bool):
        errs.add(f"{p}.{key}", "must be a boolean")


def _object(cmd: Mapping[str, Any], key: str, p: str, errs: _Errors) -> None:
    value = cmd.get(key)
    if value is not None and not isinstance(value, Mapping):
        errs.add(f"{p}.{key}", "must be an object")


def _unsupported_codec(codec: object) -> str:
    # §13.1: "a command, start input, activity result or failure-details envelope with `codec ≠ "avro"` gives
    # **422**, with a message that begins `unsupported_payload_codec:`."
    return (
        f"unsupported_payload_codec: codec {codec!r} is not supported; "
        f"use one of {list(SUPPORTED_PAYLOAD_CODECS)} and carry the blob as base64"
    )


def _payload(cmd: Mapping[str, Any], key: str, p: str, errs: _Errors, *, required: bool) -> str | None:
    """Check one payload field; returns the envelope codec when it is a valid envelope."""
    # §8.7.1: "Payload fields (`result`, `arguments`) accept either a `{codec:"avro", blob:<base64>}` envelope
    # or a bare base64 blob string … An envelope is an object whose keys are **exactly** `{codec, blob}` (or
    # `{codec, external_storage}`)."
    value = cmd.get(key)
    path = f"{p}.{key}"
    if value is None:
        if required:
            errs.add(path, "is required")
        return None
    if isinstance(value, str):
        if not _is_base64(value):
            errs.add(path, "must be a non-empty standard base64 blob (RFC 4648 §4, with padding)")
        return None
    if not isinstance(value, Mapping):
        errs.add(path, "must be a {codec, blob} envelope or a base64 blob string")
        return None
    keys = set(value)
    if keys not in ({"codec", "blob"}, {"codec", "external_storage"}):
        errs.add(path, f"must be an envelope with exactly the keys {{codec, blob}}, got {sorted(keys)}")
        return None
    codec = value["codec"]
    if codec not in SUPPORTED_PAYLOAD_CODECS:
        errs.add(f"{path}.codec", _unsupported_codec(codec))
        return None
    if "blob" in value:
        blob = value["blob"]
        if not (isinstance(blob, str) and _is_base64(blob)):
            errs.add(f"{path}.blob", "must be a non-empty standard base64 string (RFC 4648 §4, with padding)")
    elif not isinstance(value["external_storage"], Mapping):
        errs.add(f"{path}.external_storage", "must be an object")
    assert isinstance(codec, str)
    return codec


def _payload_fields(
    cmd: Mapping[str, Any], keys: Sequence[str], p: str, errs: _Errors, *, required: bool = False
) -> None:
    codecs = [c for c in (_payload(cmd, k, p, errs, required=required) for k in keys) if c is not None]
    codec = cmd.get("payload_codec")
    if codec is None:
        return
    # §8.7.1: "An optional `payload_codec` must agree with the envelope codec."
    if not isinstance(codec, str):
        errs.add(f"{p}.payload_codec", "must be a string")
    elif codec not in SUPPORTED_PAYLOAD_CODECS:
        errs.add(f"{p}.payload_codec", _unsupported_codec(codec))
    elif any(c != codec for c in codecs):
        errs.add(f"{p}.payload_codec", "must agree with the codec of the payload envelope")


def _ordered(values: Mapping[str, int | None], smaller: str, larger: str, p: str, errs: _Errors) -> None:
    lo, hi = values.get(smaller), values.get(larger)
    if lo is not None and hi is not None and lo > hi:
        errs.add(f"{p}.{smaller}", f"must be less than or equal to {larger} ({lo} > {hi})")


# ---------------------------------------------------------------------------------------------------------
# Per-type rules (§8.7.1 tables)
# ---------------------------------------------------------------------------------------------------------


def _schedule_activity(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`activity_type` (non-empty)", "`arguments` (envelope of an Avro array), `payload_codec`, `connection`,
    # `queue`, `retry_policy`, … timeouts …, `worker_session`". "Timeouts are ints ≥1."
    _string(cmd, "activity_type", p, errs, required=True)
    _payload_fields(cmd, ("arguments",), p, errs)
    _string(cmd, "connection", p, errs, required=False)
    _string(cmd, "queue", p, errs, required=False)
    _retry_policy(cmd.get("retry_policy"), f"{p}.retry_policy", errs)
    t = {name: _integer(cmd, name, p, errs, required=False, minimum=1) for name in ACTIVITY_TIMEOUTS}
    # §8.7.1 / §11.7: "`heartbeat ≤ start_to_close`, `start_to_close ≤ schedule_to_close`,
    # `schedule_to_start ≤ schedule_to_close`".
    _ordered(t, "heartbeat_timeout", "start_to_close_timeout", p, errs)
    _ordered(t, "start_to_close_timeout", "schedule_to_close_timeout", p, errs)
    _ordered(t, "schedule_to_start_timeout", "schedule_to_close_timeout", p, errs)
    # SESSION-OPTIONS-VALID: `worker_session` follows workerSessionOptions (worker-sessions-runtime.schema.json).
    if cmd.get("worker_session") is not None:
        _, problems = parse_session_options(cmd["worker_session"], f"{p}.worker_session")
        for path, messages in problems.items():
            for message in messages:
                errs.add(path, message)


def _start_timer(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`delay_seconds` (int ≥0) … Negative or non-int values are invalid".
    _integer(cmd, "delay_seconds", p, errs, required=True, minimum=0)


def _start_child_workflow(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`workflow_type`" required; "`arguments`, `payload_codec`, `connection`, `queue`, `parent_close_policy`,
    # `retry_policy`, `execution_timeout_seconds`, `run_timeout_seconds`" optional.
    _string(cmd, "workflow_type", p, errs, required=True)
    _payload_fields(cmd, ("arguments",), p, errs)
    _string(cmd, "connection", p, errs, required=False)
    _string(cmd, "queue", p, errs, required=False)
    policy = cmd.get("parent_close_policy")
    # isinstance first: an unhashable value (a JSON object) is a field error, not a TypeError.
    if policy is not None and (not isinstance(policy, str) or policy not in PARENT_CLOSE_POLICIES):
        errs.add(f"{p}.parent_close_policy", f"must be one of {sorted(PARENT_CLOSE_POLICIES)}")
    _retry_policy(cmd.get("retry_policy"), f"{p}.retry_policy", errs)
    # "Timeouts are ints ≥1 with `run ≤ execution`."
    t = {name: _integer(cmd, name, p, errs, required=False, minimum=1) for name in CHILD_TIMEOUTS}
    _ordered(t, "run_timeout_seconds", "execution_timeout_seconds", p, errs)


def _complete_update(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`update_id`" required; "`result` (`{codec, blob}`), `payload_codec`" optional.
    _string(cmd, "update_id", p, errs, required=True)
    _payload_fields(cmd, ("result",), p, errs)


def _fail_update(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`update_id`, `message`" required; "`exception_class`, `exception_type`, `non_retryable` (bool)"
    # optional.
    _string(cmd, "update_id", p, errs, required=True)
    _string(cmd, "message", p, errs, required=True)
    _string(cmd, "exception_class", p, errs, required=False)
    _string(cmd, "exception_type", p, errs, required=False)
    _boolean(cmd, "non_retryable", p, errs)


def _record_side_effect(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`result` (non-empty blob or envelope) … An empty result is invalid".
    _payload_fields(cmd, ("result",), p, errs, required=True)


def _record_version_marker(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`change_id` (non-empty), `version`, `min_supported`, `max_supported` (all ints) … `min_supported ≤
    # version ≤ max_supported`".
    _string(cmd, "change_id", p, errs, required=True)
    v = {
        k: _integer(cmd, k, p, errs, required=True, minimum=None) for k in ("version", "min_supported", "max_supported")
    }
    version, lo, hi = v["version"], v["min_supported"], v["max_supported"]
    if version is not None and lo is not None and hi is not None and not lo <= version <= hi:
        errs.add(
            f"{p}.version",
            f"must satisfy min_supported <= version <= max_supported ({lo} <= {version} <= {hi})",
        )


def _is_attribute_value(value: object) -> bool:
    # "`attributes` (object: key → scalar | string[] | null)".
    if value is None or isinstance(value, (str, bool)) or _is_int(value):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _upsert_search_attributes(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    attributes = cmd.get("attributes")
    if attributes is None:
        errs.add(f"{p}.attributes", "is required")
    elif not isinstance(attributes, Mapping):
        errs.add(f"{p}.attributes", "must be an object of key → scalar, string array or null")
    elif not attributes:
        errs.add(f"{p}.attributes", "must contain at least one attribute")
    else:
        for key, value in attributes.items():
            if not key:
                errs.add(f"{p}.attributes", "attribute keys must be non-empty")
            elif not _is_attribute_value(value):
                errs.add(f"{p}.attributes.{key}", "must be a string, number, boolean, array of strings or null")
    types = cmd.get("attribute_types")
    if types is not None:
        # "`attribute_types` (key → type)".
        if not isinstance(types, Mapping):
            errs.add(f"{p}.attribute_types", "must be an object of key → type name")
        else:
            for key, value in types.items():
                if not isinstance(value, str):
                    errs.add(f"{p}.attribute_types.{key}", "must be a string")


def _complete_workflow(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "–" required; "`result` (`{codec, blob}`), `payload_codec`" optional.
    _payload_fields(cmd, ("result",), p, errs)


def _fail_workflow(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`message` (non-empty)" required; "`exception_class`, `exception_type`, `exception` (object; minimum
    # protocol 1.10), `non_retryable` (bool)" optional.
    _string(cmd, "message", p, errs, required=True)
    _string(cmd, "exception_class", p, errs, required=False)
    _string(cmd, "exception_type", p, errs, required=False)
    _object(cmd, "exception", p, errs)
    _boolean(cmd, "non_retryable", p, errs)


def _continue_as_new(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # "`arguments`, `payload_codec`, `workflow_type` (defaults to the current type), `queue`" optional.
    _payload_fields(cmd, ("arguments",), p, errs)
    workflow_type = cmd.get("workflow_type")
    if workflow_type is not None and not (isinstance(workflow_type, str) and workflow_type.strip()):
        errs.add(f"{p}.workflow_type", "must be a non-empty string")
    _string(cmd, "queue", p, errs, required=False)


def _open_condition_wait(cmd: Mapping[str, Any], p: str, errs: _Errors) -> None:
    # Optional type (§5.2, [UPP]); the shape the official Python SDK 2.12.0 sends (its worker handshake,
    # workflow-task complete): `open_condition_wait{condition_key,
    # condition_definition_fingerprint:"sha256:…", [timeout_seconds]}`. The SDK omits a null key or
    # fingerprint, so all three are optional; `timeout_seconds` is an int ≥0 like
    # `start_timer.delay_seconds` (the SDK rounds fractions up).
    _string(cmd, "condition_key", p, errs, required=False)
    _string(cmd, "condition_definition_fingerprint", p, errs, required=False)
    _integer(cmd, "timeout_seconds", p, errs, required=False, minimum=0)


_OPTIONAL_RULES: Final[Mapping[str, Callable[[Mapping[str, Any], str, _Errors], None]]] = {
    "open_condition_wait": _open_condition_wait,
}


_RULES: Final[Mapping[str, Callable[[Mapping[str, Any], str, _Errors], None]]] = {
    "complete_workflow": _complete_workflow,
    "fail_workflow": _fail_workflow,
    "continue_as_new": _continue_as_new,
    "schedule_activity": _schedule_activity,
    "start_timer": _start_timer,
    "start_child_workflow": _start_child_workflow,
    "complete_update": _complete_update,
    "fail_update": _fail_update,
    "record_side_effect": _record_side_effect,
    "record_version_marker": _record_version_marker,
    "upsert_search_attributes": _upsert_search_attributes,
}


# ---------------------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One validated command: its ``type``, the command object as sent (``fields``, including ``type``), and
    its ``index`` in the batch."""

    type: str
    fields: Mapping[str, Any] = field(hash=False)
    index: int

    @property
    def is_terminal(self) -> bool:
        """Whether this is ``complete_workflow``, ``fail_workflow`` or ``continue_as_new``."""
        return self.type in TERMINAL_TYPES

    def retry_policy(self) -> RetryPolicy | None:
        """The command's validated ``retry_policy`` (``None`` when absent, null or ``{}``)."""
        return _retry_policy(self.fields.get("retry_policy"), f"commands.{self.index}.retry_policy", _Errors())


def validate_batch(
    commands: object, *, open_update_ids: Collection[str] = (), optional_types: Collection[str] = ()
) -> list[Command]:
    """Validate the ``commands`` of a workflow-task complete (§8.7, §8.7.1); see the module docstring.

    ``commands`` is the body member as parsed (``None`` when absent). ``open_update_ids`` are the updates that
    are accepted and open on the run. ``optional_types`` are the :data:`OPTIONAL_TYPES` the server implements
    and advertises in ``supported_workflow_task_commands``; any other optional type is an unknown type.
    Returns the commands in batch order.
    """
    unknown_optional = sorted(set(optional_types) - set(OPTIONAL_TYPES))
    if unknown_optional:
        raise ValueError(f"not optional command types: {unknown_optional}; known: {list(OPTIONAL_TYPES)}")
    rules = {**_RULES, **{kind: _OPTIONAL_RULES[kind] for kind in optional_types}}
    supported = (*ALL_TYPES, *(kind for kind in OPTIONAL_TYPES if kind in optional_types))
    errs = _Errors()
    # §8.7: "`commands` is a **non-empty** array of objects, each with a string `type`. An empty array, a
    # missing array or a missing `type` gives **422** `validation_failed`."
    if commands is None:
        errs.add("commands", "is required: send a non-empty array of command objects")
    elif not isinstance(commands, list):
        errs.add("commands", "must be an array of command objects")
    elif not commands:
        errs.add("commands", "must contain at least one command")
    errs.raise_422("command batch")
    assert isinstance(commands, list)

    parsed = _parse_commands(commands, rules, errs)
    errs.raise_422("command batch")
    _check_batch_semantics(parsed, rules, supported, open_update_ids)
    return parsed


def _parse_commands(commands: list[Any], rules: Mapping[str, Any], errs: _Errors) -> list[Command]:
    """Family 1: each command's shape (an object with a string type, its scoped fields, its own rule)."""
    parsed: list[Command] = []
    for index, item in enumerate(commands):
        p = f"commands.{index}"
        if not isinstance(item, Mapping):
            errs.add(p, "must be an object with a string type")
            continue
        kind = item.get("type")
        if kind is None:
            errs.add(f"{p}.type", "is required")
            continue
        if not isinstance(kind, str):
            errs.add(f"{p}.type", "must be a string")
            continue
        if not kind:
            errs.add(f"{p}.type", "must be a non-empty string")
            continue
        rule = rules.get(kind)
        if rule is not None:
            for name, allowed in SCOPED_FIELDS.items():
                if item.get(name) is not None and kind not in allowed:
                    errs.add(f"{p}.{name}", f"is not allowed on {kind}; only on {', '.join(sorted(allowed))}")
            rule(item, p, errs)
        parsed.append(Command(type=kind, fields=dict(item), index=index))
    return parsed


def _check_batch_semantics(
    parsed: list[Command], rules: Mapping[str, Any], supported: Sequence[str], open_update_ids: Collection[str]
) -> None:
    """Family 2 → 409 ``invalid_commands``: unknown types, two terminal commands, closing an update that is
    not accepted and open."""
    semantic = _Errors()
    for command in parsed:
        if command.type not in rules:
            # §8.7: "An unknown `type` makes the whole batch invalid (`invalid_commands`)."
            semantic.add(
                f"commands.{command.index}.type",
                f"unknown command type {command.type!r}; supported: {', '.join(supported)}",
            )
    terminals = [c for c in parsed if c.is_terminal]
    if len(terminals) > 1:
        # §8.7: "**At most one terminal command** per completion. Two or more gives a rejection with
        # `invalid_commands`."
        for command in terminals:
            semantic.add(
                f"commands.{command.index}.type",
                f"is one of {plural(len(terminals), 'terminal command')}; a batch may hold at most one "
                f"({', '.join(TERMINAL_TYPES)})",
            )
    open_updates = set(open_update_ids)
    for command in parsed:
        if command.type in UPDATE_CLOSING_TYPES:
            # §8.7.1: "The update must be accepted and open for this run, otherwise it is invalid".
            update_id = command.fields["update_id"]
            if update_id in open_updates:
                open_updates.discard(update_id)  # closed by this command; a second close is invalid
            else:
                semantic.add(
                    f"commands.{command.index}.update_id",
                    f"update {update_id!r} is not accepted and open on this run "
                    "(or an earlier command of this batch already closed it)",
                )
    if semantic:
        first_path, first = next(iter(semantic.by_path.items()))
        raise Rejection(
            409,
            "invalid_commands",
            f"The command batch was rejected and nothing was applied: {first_path}: {first[0]}. "
            "The task is still leased; fix the batch and complete again.",
            {"recorded": False, "command_errors": semantic.by_path},
        )


def terminal_command(commands: Sequence[Command]) -> Command | None:
    """The batch's terminal command, or ``None`` (call on a validated batch: at most one)."""
    return next((c for c in commands if c.is_terminal), None)


def apply_order(commands: Sequence[Command]) -> list[Command]:
    """Non-terminal commands in batch order, then the terminal one (§8.7 "applied **in order**, then the
    terminal command if there is one")."""
    return [c for c in commands if not c.is_terminal] + [c for c in commands if c.is_terminal]


_TERMINAL_RUN_EVENTS: Final[Mapping[str, RunEvent]] = {
    "complete_workflow": RunEvent.BATCH_COMPLETE,
    "fail_workflow": RunEvent.BATCH_FAIL,
    "continue_as_new": RunEvent.BATCH_CONTINUE_AS_NEW,
}


def batch_run_event(commands: Sequence[Command]) -> RunEvent:
    """The :data:`~suite.protocol.lifecycles.RUN` event a validated batch fires.

    §8.7: "With only non-terminal commands, the run becomes `waiting`" → ``BATCH_OPEN_WAITS``; otherwise the
    terminal command's event.
    """
    terminal = terminal_command(commands)
    return RunEvent.BATCH_OPEN_WAITS if terminal is None else _TERMINAL_RUN_EVENTS[terminal.type]


# ---------------------------------------------------------------------------------------------------------
# Start request (§12.1)
# ---------------------------------------------------------------------------------------------------------

StartInput = tuple[Literal["json_array"], list[Any]] | tuple[Literal["envelope"], str]
"""``("json_array", values)`` for a plain JSON array, ``("envelope", blob)`` for an explicit Avro envelope."""


def _json_value_errors(root: object, root_path: str, errs: _Errors) -> None:
    # §12.1: "null→null, boolean→boolean, integer→long (outside int64 gives 422), non-integer number→double,
    # string→string, array→ArrayValue, object→MapValue with string keys". Iterative, so deep nesting cannot
    # exhaust the interpreter stack.
    stack: list[tuple[object, str]] = [(root, root_path)]
    while stack:
        value, path = stack.pop()
        if value is None or isinstance(value, (bool, str)):
            continue
        if isinstance(value, int):
            if not _INT64_MIN <= value <= _INT64_MAX:
                errs.add(path, "integer is outside the signed 64-bit range of an Avro long")
        elif isinstance(value, float):
            if not math.isfinite(value):
                errs.add(path, "number must be finite")
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}") for i, item in reversed(list(enumerate(value))))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    errs.add(path, "object keys must be strings")
                else:
                    stack.append((item, f"{path}.{key}"))
        else:
            errs.add(path, f"{type(value).__name__} is not a JSON value")


def validate_start_input(obj: object) -> StartInput:
    """Validate the ``input`` of ``POST /api/workflows`` (§12.1 "Input forms").

    A JSON array gives ``("json_array", values)``; an explicit ``{codec:"avro", blob}`` envelope gives
    ``("envelope", blob)`` (stored unchanged). Decision: an absent or null ``input`` is the empty argument
    list ``("json_array", [])``. Anything else → 422 ``validation_failed``; a codec other than ``avro``
    (including an empty one) → ``errors["input.codec"] = ["unsupported_payload_codec: …"]``.
    """
    errs = _Errors()
    if obj is None:
        return ("json_array", [])
    if isinstance(obj, list):
        _json_value_errors(obj, "input", errs)
        errs.raise_422("workflow input")
        return ("json_array", obj)
    # §13.1: "The envelope is recognised by its exact key set `{codec, blob}`, or `{codec, external_storage}`
    # … Any other object is treated as a plain JSON value" — and a plain object is not an argument array.
    if isinstance(obj, Mapping) and set(obj) == {"codec", "blob"}:
        codec, blob = obj["codec"], obj["blob"]
        # "An unknown or empty codec gives **422** (`unsupported_payload_codec: …` in
        # `errors["input.codec"]`)."
        if codec not in SUPPORTED_PAYLOAD_CODECS:
            errs.add("input.codec", _unsupported_codec(codec))
        if not (isinstance(blob, str) and _is_base64(blob)):
            errs.add("input.blob", "must be a non-empty standard base64 string (RFC 4648 §4, with padding)")
        errs.raise_422("workflow input")
        assert isinstance(blob, str)
        return ("envelope", blob)
    if isinstance(obj, Mapping) and set(obj) == {"codec", "external_storage"}:
        errs.add("input.external_storage", "external payload storage is not supported for start input")
    else:
        errs.add("input", 'must be a JSON array of arguments or a {codec: "avro", blob} envelope')
    return errs.reject("workflow input")


LEGACY_START_FIELDS: Final[tuple[str, ...]] = (
    "workflow_execution_timeout",
    "workflow_run_timeout",
    "workflow_task_timeout",
    "retry_policy",
    "idempotency_key",
    "request_id",
)
"""Start fields of older APIs that §12.1 does not accept (cluster/info ``legacy_field_policy:
"reject_non_canonical"``): each one present is a 422 naming it."""

DUPLICATE_POLICIES: Final[tuple[str, ...]] = ("fail", "use-existing")
START_TIMEOUT_FIELDS: Final[tuple[str, ...]] = ("execution_timeout_seconds", "run_timeout_seconds")
MAX_MEMO_BYTES: Final = 256 * 1024
"""cluster/info ``limits.max_memo_bytes``: the memo's size as compact UTF-8 JSON."""
_NAME_MAX = 255


@dataclass(frozen=True)
class StartRequest:
    """A validated ``POST /api/workflows`` body (§12.1), except ``input`` (see :func:`validate_start_input`)."""

    workflow_type: str
    workflow_id: str | None
    task_queue: str
    execution_timeout_seconds: int | None
    run_timeout_seconds: int | None
    duplicate_policy: str
    memo: dict[str, Any]
    search_attributes: dict[str, Any]
    business_key: str | None
    input: object


def validate_start_request(body: Mapping[str, Any], *, max_duration_seconds: int) -> StartRequest:
    """Validate a start request (§12.1); one 422 ``validation_failed`` naming every bad field.

    ``max_duration_seconds`` bounds the two timeouts above (the spec bounds them only below, "ints ≥1"; a
    server bounds them by the longest duration it can store). Decisions: ``task_queue`` defaults to
    ``"default"``; only an absent or null ``memo`` / ``search_attributes`` means "none" (§12.1 types both as
    objects, so ``[]``, ``""``, ``0`` or ``false`` are 422).
    """
    errors: dict[str, list[str]] = {}
    for legacy in LEGACY_START_FIELDS:
        if legacy in body:
            errors[legacy] = [f"{legacy} is not accepted by this API."]
    wf_type = body.get("workflow_type")
    if not isinstance(wf_type, str) or not wf_type or len(wf_type) > _NAME_MAX:
        errors["workflow_type"] = ["workflow_type is required: a non-empty string of at most 255 characters."]
    workflow_id = body.get("workflow_id")
    if workflow_id is not None:
        try:
            validate_workflow_id(workflow_id)
        except Rejection as rej:
            errors.update(rej.fields.get("errors", {"workflow_id": [rej.message]}))
    queue = body.get("task_queue", "default")
    if not isinstance(queue, str) or not queue or len(queue) > _NAME_MAX:
        errors["task_queue"] = ["task_queue must be a non-empty string."]
    timeouts: dict[str, int | None] = {}
    for name in START_TIMEOUT_FIELDS:
        v = body.get(name)
        if v is not None and (not _is_int(v) or not 1 <= v <= max_duration_seconds):
            errors[name] = [f"{name} must be an integer from 1 to {max_duration_seconds}."]
        timeouts[name] = v if _is_int(v) else None
    policy = body.get("duplicate_policy", "fail")
    if policy not in DUPLICATE_POLICIES:
        errors["duplicate_policy"] = ["duplicate_policy must be 'fail' or 'use-existing'."]
    memo = body.get("memo")
    memo = {} if memo is None else memo
    attrs = body.get("search_attributes")
    attrs = {} if attrs is None else attrs
    if not isinstance(memo, dict):
        errors["memo"] = ["memo must be an object."]
    elif len(json.dumps(memo, separators=(",", ":"), ensure_ascii=False).encode()) > MAX_MEMO_BYTES:
        errors["memo"] = ["memo exceeds 256 KiB."]
    if not isinstance(attrs, dict):
        errors["search_attributes"] = ["search_attributes must be an object."]
    business_key = body.get("business_key")
    if business_key is not None and not isinstance(business_key, str):
        errors["business_key"] = ["business_key must be a string."]
    if errors:
        raise Rejection(
            422,
            "validation_failed",
            "The request body is invalid.",
            {"errors": errors, "validation_errors": {k: list(v) for k, v in errors.items()}},
        )
    assert isinstance(wf_type, str)
    assert isinstance(queue, str)
    assert isinstance(policy, str)
    return StartRequest(
        workflow_type=wf_type,
        workflow_id=workflow_id,
        task_queue=queue,
        execution_timeout_seconds=timeouts["execution_timeout_seconds"],
        run_timeout_seconds=timeouts["run_timeout_seconds"],
        duplicate_policy=policy,
        memo=memo,
        search_attributes=attrs,
        business_key=business_key,
        input=body.get("input"),
    )


def validate_workflow_id(value: object) -> str:
    """Validate a client-supplied ``workflow_id``; 422 with ``errors["workflow_id"]`` if it is not valid.

    §0: "Client-supplied `workflow_id` must match `^[a-zA-Z0-9._:-]+$` and be at most 128 characters."
    """
    errs = _Errors()
    if not isinstance(value, str):
        errs.add("workflow_id", "must be a string")
    elif len(value) > WORKFLOW_ID_MAX_LENGTH:
        errs.add("workflow_id", f"must be at most {WORKFLOW_ID_MAX_LENGTH} characters, got {len(value)}")
    elif _WORKFLOW_ID.fullmatch(value) is None:
        errs.add("workflow_id", "must match ^[a-zA-Z0-9._:-]+$ (letters, digits, '.', '_', ':' and '-')")
    errs.raise_422("workflow_id")
    assert isinstance(value, str)
    return value


# ---------------------------------------------------------------------------------------------------------
# Report bodies: what a worker sends after a poll (§8.5–§8.9, §10.3–§10.6, §11.2–§11.5)
# ---------------------------------------------------------------------------------------------------------

FieldSpec = tuple[str, bool]
"""A body field's kind (``str``, ``int``, ``num``, ``obj``, ``list``, ``payload``, ``failure``, ``commands``)
and whether it is required."""

WORKFLOW_TASK_FENCE: Final[Mapping[str, FieldSpec]] = {
    "lease_owner": ("str", True),
    "workflow_task_attempt": ("int", True),
}
ACTIVITY_TASK_FENCE: Final[Mapping[str, FieldSpec]] = {
    "activity_attempt_id": ("str", True),
    "lease_owner": ("str", True),
}
QUERY_TASK_FENCE: Final[Mapping[str, FieldSpec]] = {"lease_owner": ("str", True), "query_task_attempt": ("int", True)}
HEARTBEAT_PROGRESS: Final[Mapping[str, FieldSpec]] = {
    "message": ("str", False),
    "current": ("num", False),
    "total": ("num", False),
    "unit": ("str", False),
    "details": ("obj", False),
}
REPORT_BODIES: Final[Mapping[str, Mapping[str, FieldSpec]]] = MappingProxyType(
    {
        "workflow-tasks/{id}/history": {
            **WORKFLOW_TASK_FENCE,
            "after_sequence": ("int", False),
            "page_size": ("int", False),
            "history_page_size": ("int", False),
            "next_history_page_token": ("str", False),
            "page_token": ("str", False),
            "accept_history_encoding": ("str", False),
        },
        "workflow-tasks/{id}/heartbeat": WORKFLOW_TASK_FENCE,
        "workflow-tasks/{id}/complete": {**WORKFLOW_TASK_FENCE, "commands": ("commands", True)},
        "workflow-tasks/{id}/fail": {**WORKFLOW_TASK_FENCE, "failure": ("failure", True)},
        "activity-tasks/{id}/complete": {**ACTIVITY_TASK_FENCE, "result": ("payload", False)},
        "activity-tasks/{id}/fail": {**ACTIVITY_TASK_FENCE, "failure": ("failure", True)},
        "activity-tasks/{id}/heartbeat": {**ACTIVITY_TASK_FENCE, **HEARTBEAT_PROGRESS},
        "activity-tasks/{id}/status": {**ACTIVITY_TASK_FENCE, **HEARTBEAT_PROGRESS},
        "query-tasks/{id}/complete": {**QUERY_TASK_FENCE, "result_envelope": ("payload", False)},
        "query-tasks/{id}/fail": {**QUERY_TASK_FENCE, "failure": ("failure", True)},
    }
)
"""Every report body of the worker plane by its path below ``/api/worker/``: the fields the validators below
read, the suite's hostile-body checks break one by one (``suite.checks.robustness``)."""


DEFAULT_QUERY_FAILURE_REASON: Final = "query_rejected"
"""§10.4: "The failure reason defaults to `query_rejected`"."""


def validation_failed(errors: Mapping[str, list[str]], message: str = "The request body is invalid.") -> Rejection:
    """422 ``validation_failed`` with the per-field errors under both names UPS uses (§2.2)."""
    errs = {k: list(v) for k, v in errors.items()}
    return Rejection(422, "validation_failed", message, {"errors": errs, "validation_errors": errs})


def validate_workflow_fence(body: Mapping[str, Any]) -> tuple[str, int]:
    """§8.9's fencing fields of every workflow-task call after the poll: ``lease_owner`` and the attempt."""
    errors: dict[str, list[str]] = {}
    fence = _owner_attempt(body, "workflow_task_attempt", errors)
    if errors:
        raise validation_failed(errors)
    return fence


def _owner_attempt(body: Mapping[str, Any], attempt_key: str, errors: dict[str, list[str]]) -> tuple[str, int]:
    """``lease_owner`` and the attempt under ``attempt_key``, each error under its field (``""``/0 if bad)."""
    owner = body.get("lease_owner")
    attempt = body.get(attempt_key)
    if not isinstance(owner, str) or not owner:
        errors["lease_owner"] = ["lease_owner is required and must be a non-empty string."]
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        errors[attempt_key] = [f"{attempt_key} is required and must be an integer >= 1."]
    return (owner if isinstance(owner, str) else ""), (attempt if isinstance(attempt, int) else 0)


def validate_workflow_failure(body: Mapping[str, Any]) -> None:
    """§8.8: a workflow-task fail carries ``failure.message``, a non-empty string."""
    failure = body.get("failure")
    if not isinstance(failure, dict) or not isinstance(failure.get("message"), str) or not failure["message"]:
        raise validation_failed({"failure.message": ["failure.message is required and must be a non-empty string."]})


# §11.4: "`kind` | enum | `application`, `timeout`, `cancellation`, `malformed_output`, `handler_crash`,
# `decode_failure`, `unsupported_payload`. Any other value gives 422".
FAILURE_KINDS = frozenset(
    {
        "application",
        "timeout",
        "cancellation",
        "malformed_output",
        "handler_crash",
        "decode_failure",
        "unsupported_payload",
    }
)
# §11.4: "`timeout_type` | enum | `schedule_to_start`, `start_to_close`, `schedule_to_close`, `heartbeat`,
# `deadline_exceeded`. Any other value gives 422".
TIMEOUT_TYPES = frozenset(
    {"schedule_to_start", "start_to_close", "schedule_to_close", "heartbeat", "deadline_exceeded"}
)

# §11.4 failure_category ∈ {application, cancelled, terminated, timeout, activity, …}. Decision: a worker's
# `kind` maps onto the category that names it; the kinds that say "the activity machinery broke" rather
# than "the business logic failed" are category `activity`.
_CATEGORY_BY_KIND = {
    "application": "application",
    "timeout": "timeout",
    "cancellation": "cancelled",
    "malformed_output": "activity",
    "handler_crash": "activity",
    "decode_failure": "activity",
    "unsupported_payload": "activity",
}


@dataclass(frozen=True)
class ActivityFence:
    """§11.2: "Request bodies always include `activity_attempt_id` (required) and `lease_owner`
    (required)"."""

    activity_attempt_id: str
    lease_owner: str


@dataclass(frozen=True)
class ActivityFailure:
    """A validated §11.4 ``failure`` object."""

    message: str
    type: str | None
    class_: str | None
    code: int | None
    stack_trace: str | None
    non_retryable: bool
    kind: str | None
    timeout_type: str | None
    cancelled: bool
    details: dict[str, str] | None

    def category(self) -> str:
        if self.kind is not None:
            return _CATEGORY_BY_KIND[self.kind]
        return "cancelled" if self.cancelled else "application"


@dataclass(frozen=True)
class HeartbeatProgress:
    """The §11.5 heartbeat progress, recorded as ``ActivityHeartbeatRecorded.progress``."""

    message: str | None = None
    current: int | float | None = None
    total: int | float | None = None
    unit: str | None = None
    details: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FieldErrors = dict[str, list[str]]


def _activity_fence(body: Mapping[str, Any], errors: _FieldErrors) -> ActivityFence:
    attempt_id = body.get("activity_attempt_id")
    owner = body.get("lease_owner")
    if not isinstance(attempt_id, str) or not attempt_id:
        errors["activity_attempt_id"] = [
            "activity_attempt_id is required: send the activity_attempt_id from the poll response."
        ]
    if not isinstance(owner, str) or not owner:
        errors["lease_owner"] = ["lease_owner is required: send the worker_id that polled the task."]
    return ActivityFence(attempt_id if isinstance(attempt_id, str) else "", owner if isinstance(owner, str) else "")


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _optional_str(body: Mapping[str, Any], key: str, path: str, errors: _FieldErrors) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        errors[path] = [f"{path} must be a string or null."]
        return None
    return value


def _report_blob(value: object, path: str, errors: _FieldErrors, *, bare_ok: bool) -> str | None:
    """A payload: ``null``, an envelope with exactly ``{codec, blob}``, or (where allowed) a bare base64 blob.

    §13.1: "A worker or server MUST check the codec before decoding", and "an activity result or
    failure-details envelope with `codec ≠ "avro"` gives **422**, with a message that begins
    `unsupported_payload_codec:`". The blob is decoded only to prove it is a well-formed frame; the stored
    text is the worker's, byte for byte (§11.4 "The server stores the blob **unchanged**").
    """
    if value is None:
        return None
    if isinstance(value, str) and bare_ok:
        blob = value
    elif isinstance(value, dict):
        if "codec" in value and value["codec"] != "avro":
            errors[f"{path}.codec"] = [
                f"unsupported_payload_codec: codec {value['codec']!r} is not supported; "
                'the only payload codec is \'avro\' (send {"codec": "avro", "blob": <base64>}).'
            ]
            return None
        if set(value) != {"codec", "blob"} or not isinstance(value["blob"], str):
            errors[path] = [f"{path} must be an envelope with exactly the keys codec and blob."]
            return None
        blob = value["blob"]
    else:
        shapes = "an envelope {codec, blob}, a base64 blob string or null" if bare_ok else "an envelope or null"
        errors[path] = [f"{path} must be {shapes}."]
        return None
    try:
        decode_blob(blob)
    except CodecError as exc:
        errors[f"{path}.blob" if isinstance(value, dict) else path] = [f"{exc.code}: {exc.detail}"]
        return None
    return blob


def validate_activity_complete(body: Mapping[str, Any]) -> tuple[ActivityFence, str | None]:
    """§11.3: ``{activity_attempt_id, lease_owner, result: envelope | bare blob | null}``."""
    errors: _FieldErrors = {}
    fence = _activity_fence(body, errors)
    result = _report_blob(body.get("result"), "result", errors, bare_ok=True)
    if errors:
        raise validation_failed(errors)
    return fence, result


def validate_activity_fail(body: Mapping[str, Any]) -> tuple[ActivityFence, ActivityFailure]:
    """§11.4 ``failure`` fields. ``message`` is required; an empty string is accepted, because the SDK sends
    ``str(exc)`` and an exception may have no text — refusing it would strand the attempt until its lease
    expires."""
    errors: _FieldErrors = {}
    fence = _activity_fence(body, errors)
    raw = body.get("failure")
    if not isinstance(raw, dict):
        errors["failure"] = ["failure is required: an object with at least a message."]
        raise validation_failed(errors)
    message = raw.get("message")
    if not isinstance(message, str):
        errors["failure.message"] = ["failure.message is required and must be a string."]
    ftype = _optional_str(raw, "type", "failure.type", errors)
    fclass = _optional_str(raw, "class", "failure.class", errors)
    stack = _optional_str(raw, "stack_trace", "failure.stack_trace", errors)
    code = raw.get("code")
    if code is not None and not _is_int(code):
        errors["failure.code"] = ["failure.code must be an integer or null."]
    flags: dict[str, bool] = {}
    for key in ("non_retryable", "retryable", "cancelled", "malformed_output"):
        value = raw.get(key)
        if value is not None and not isinstance(value, bool):
            errors[f"failure.{key}"] = [f"failure.{key} must be a boolean or null."]
        flags[key] = value is True
    kind = raw.get("kind")
    # isinstance first: an unhashable value (a JSON object) must be a 422, not a TypeError.
    if kind is not None and (not isinstance(kind, str) or kind not in FAILURE_KINDS):
        errors["failure.kind"] = [f"failure.kind must be one of {sorted(FAILURE_KINDS)} or null."]
    timeout_type = raw.get("timeout_type")
    if timeout_type is not None and (not isinstance(timeout_type, str) or timeout_type not in TIMEOUT_TYPES):
        errors["failure.timeout_type"] = [f"failure.timeout_type must be one of {sorted(TIMEOUT_TYPES)} or null."]
    details = _report_blob(raw.get("details"), "failure.details", errors, bare_ok=False)
    if errors:
        raise validation_failed(errors)
    assert isinstance(message, str)
    return fence, ActivityFailure(
        message=message,
        type=ftype,
        class_=fclass,
        code=code,
        stack_trace=stack,
        # §11.4: "`retryable` | bool | Informational alias" — only `non_retryable` decides.
        non_retryable=flags["non_retryable"],
        kind=kind,
        timeout_type=timeout_type,
        cancelled=flags["cancelled"],
        details=None if details is None else {"codec": "avro", "blob": details},
    )


def validate_activity_heartbeat(body: Mapping[str, Any]) -> tuple[ActivityFence, HeartbeatProgress]:
    """§11.5: ``message?``, ``current?: number``, ``total?: number``, ``unit?``, ``details?: object``.

    §14.1: malformed optional progress fields "never return 5xx. Either 422 or ignored" — this server answers
    422 so a worker learns its progress report is being lost.
    """
    errors: _FieldErrors = {}
    fence = _activity_fence(body, errors)
    message = _optional_str(body, "message", "message", errors)
    unit = _optional_str(body, "unit", "unit", errors)
    numbers: dict[str, int | float | None] = {}
    for key in ("current", "total"):
        value = body.get(key)
        if value is not None and not _is_number(value):
            errors[key] = [f"{key} must be a finite number or null."]
            value = None
        numbers[key] = value
    details = body.get("details")
    if details is not None and not isinstance(details, dict):
        errors["details"] = ["details must be a JSON object or null."]
        details = None
    if errors:
        raise validation_failed(errors)
    return fence, HeartbeatProgress(message, numbers["current"], numbers["total"], unit, details)


def validate_query_complete(body: Mapping[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """Validate a complete body (422 before any lookup, §2.3); return owner, attempt and the stored
    ``{result, result_envelope}`` document (the query module of the reference server explains the two result views)."""
    errors: dict[str, list[str]] = {}
    owner, attempt = _owner_attempt(body, "query_task_attempt", errors)
    raw = body.get("result")
    envelope = body.get("result_envelope")
    view: Any = raw
    if envelope is not None:
        if not isinstance(envelope, dict):
            errors["result_envelope"] = ["result_envelope must be an object {codec, blob} or null."]
        else:
            codec, blob = envelope.get("codec"), envelope.get("blob")
            if codec is None:
                errors["result_envelope.codec"] = ["result_envelope.codec is required when an envelope is sent."]
            elif codec != "avro":
                errors["result_envelope.codec"] = [f"unsupported_payload_codec: {codec!r} is not 'avro'."]
            if blob is None:
                errors["result_envelope.blob"] = ["result_envelope.blob is required when an envelope is sent."]
            elif not isinstance(blob, str):
                errors["result_envelope.blob"] = ["result_envelope.blob must be a base64 string."]
            elif codec == "avro":
                try:
                    view = value_to_json(decode_blob(blob))
                except CodecError as exc:
                    errors["result_envelope.blob"] = [str(exc)]
    if errors:
        raise validation_failed(errors)
    if isinstance(envelope, dict):
        stored_env: dict[str, Any] | None = {"codec": "avro", "blob": envelope["blob"]}
    else:
        try:
            stored_env = {"codec": "avro", "blob": encode_blob(json_to_value(raw))}
        except CodecError:
            stored_env = None  # e.g. an integer outside int64: the JSON view is all there is
    return owner, attempt, {"result": view, "result_envelope": stored_env}


def validate_query_fail(body: Mapping[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """Validate a fail body (§10.4): ``failure.message`` required, ``failure.reason`` defaults to
    ``query_rejected``; ``type`` and ``stack_trace`` optional strings, ``validation_errors`` kept as sent."""
    errors: dict[str, list[str]] = {}
    owner, attempt = _owner_attempt(body, "query_task_attempt", errors)
    failure = body.get("failure")
    doc: dict[str, Any] = {}
    if not isinstance(failure, dict):
        errors["failure"] = ["failure is required and must be an object with at least a message."]
    else:
        message = failure.get("message")
        if not isinstance(message, str):
            errors["failure.message"] = ["failure.message is required and must be a string."]
        reason = failure.get("reason")
        if reason is None:
            reason = DEFAULT_QUERY_FAILURE_REASON
        elif not isinstance(reason, str) or not reason or len(reason) > 255:
            errors["failure.reason"] = ["failure.reason must be a non-empty string of at most 255 characters."]
        for name in ("type", "stack_trace"):
            value = failure.get(name)
            if value is not None and not isinstance(value, str):
                errors[f"failure.{name}"] = [f"failure.{name} must be a string or null."]
        doc = {
            "message": message,
            "reason": reason,
            "type": failure.get("type"),
            "stack_trace": failure.get("stack_trace"),
            "validation_errors": failure.get("validation_errors"),
        }
    if errors:
        raise validation_failed(errors)
    return owner, attempt, doc
