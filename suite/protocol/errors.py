"""Typed errors of the protocol model.

The tree::

    ProtocolModelError                 anything the model refuses
    ├── IllegalTransition              a (state, event) pair that is not in a lifecycle table
    ├── Rejection                      a rejected request: HTTP status, reason and body fields
    ├── Violation                      the peer broke a rule: requirement ID, what was expected and received
    └── CodecError                     the Avro Value codec refused a frame or a value
        ├── InvalidPayloadFraming      frame too short, wrong magic, bad datum, trailing bytes, not base64
        ├── UnsupportedPayloadSchema   the fingerprint is not the pinned Value schema's
        ├── UnsupportedPayloadCodec    an envelope names a codec other than ``avro``
        └── EncodeError                a native value cannot be encoded
            ├── IntegerOverflow        int outside signed 64-bit
            ├── NonFiniteFloat         NaN or ±Infinity
            ├── InvalidMapKey          a map key that is not a string
            └── UnsupportedValueType   any other native type

Every leaf knows its wire name (``code``), which is the string the golden vectors and the protocol use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ProtocolModelError(Exception):
    """Base of every error the protocol model raises."""


class IllegalTransition(ProtocolModelError):
    """A lifecycle table has no row for this (state, event) pair; the state is unchanged."""

    def __init__(self, machine: str, state: object, event: object) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        super().__init__(f"{machine}: event {event!r} is not allowed in state {state!r}")


class Rejection(ProtocolModelError):
    """A request the protocol rejects, with everything needed to answer it on the wire.

    ``fields`` are the extra body keys of the rejection (e.g. ``current_attempt``); they never include
    the envelope, which the server adds.
    """

    def __init__(self, status: int, reason: str, message: str, fields: Mapping[str, Any] | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.fields: dict[str, Any] = dict(fields or {})
        super().__init__(f"{status} {reason}: {message}")

    def body(self) -> dict[str, Any]:
        """The error body without the envelope: ``reason``, ``error`` and ``message`` plus context fields."""
        return {"reason": self.reason, "error": self.message, "message": self.message, **self.fields}


class Violation(ProtocolModelError):
    """What a peer did breaks a rule: the requirement ID it breaks, what the rule expects, what was received.

    The model's judges (the history oracle, a machine's shadow of the target) raise it; they know no exchanges,
    so the caller attaches the evidence when it turns a violation into a verdict.
    """

    def __init__(self, requirement: str, message: str, *, expected: Any = None, received: Any = None) -> None:
        self.requirement = requirement
        self.message = message
        self.expected = expected
        self.received = received
        super().__init__(f"{requirement}: {message}")


class CodecError(ProtocolModelError):
    """The Avro Value codec refused a frame or a value."""

    code = "codec_error"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{self.code}: {detail}")


class InvalidPayloadFraming(CodecError):
    code = "invalid_payload_framing"


class UnsupportedPayloadSchema(CodecError):
    code = "unsupported_payload_schema"


class UnsupportedPayloadCodec(CodecError):
    code = "unsupported_payload_codec"


class EncodeError(CodecError):
    code = "encode_error"


class IntegerOverflow(EncodeError):
    code = "integer_overflow"


class NonFiniteFloat(EncodeError):
    code = "non_finite_float"


class InvalidMapKey(EncodeError):
    code = "invalid_map_key"


class UnsupportedValueType(EncodeError):
    code = "unsupported_value_type"
