"""Version negotiation for the worker plane and the control plane (docs/reference.md: Versioning).

Both planes carry their version in a request header. The rules, in the order this module applies them:

worker plane, header ``X-Durable-Workflow-Protocol-Version`` (§3.1)
    trim → empty means missing (400 ``missing_protocol_version``) → strict ``MAJOR.MINOR`` grammar →
    same major and minor ≤ advertised, else 400 ``unsupported_protocol_version``.
control plane, header ``X-Durable-Workflow-Control-Plane-Version`` (§3.2)
    trim → empty means missing (400 ``missing_control_plane_version``) → exactly ``"2"``, else 400
    ``unsupported_control_plane_version``.

Negotiation only decides; it never builds the envelope. A success echoes the **advertised** version,
never the requested one (§3.1 "Echo on success"), which is the server's job, not this module's.
Requirement IDs: ``VERSION-*`` and ``CONTROL-VERSION-*`` in :mod:`suite.protocol.requirements`.
"""

from __future__ import annotations

import re
from typing import Final

from suite.protocol.errors import Rejection

__all__ = [
    "ADVERTISED_MAJOR",
    "ADVERTISED_MINOR",
    "ADVERTISED_VERSION",
    "CONTROL_PLANE_VERSION",
    "CONTROL_PLANE_VERSION_HEADER",
    "MAX_VERSION_LENGTH",
    "MINIMUM_VERSION",
    "WORKER_PROTOCOL_VERSION_HEADER",
    "format_version",
    "minor_supports",
    "negotiate_control_plane_version",
    "negotiate_worker_version",
    "parse_version",
]

WORKER_PROTOCOL_VERSION_HEADER: Final = "X-Durable-Workflow-Protocol-Version"
CONTROL_PLANE_VERSION_HEADER: Final = "X-Durable-Workflow-Control-Plane-Version"

# §3.1: "Advertised version (1.20 server): "1.20" (string, MAJOR.MINOR)".
ADVERTISED_MAJOR: Final = 1
ADVERTISED_MINOR: Final = 20
ADVERTISED_VERSION: Final = "1.20"
# §3.1: "A 1.20 server accepts 1.0 … 1.20".
MINIMUM_VERSION: Final = "1.0"
# §3.2: "Supported value: "2", matched exactly after trimming".
CONTROL_PLANE_VERSION: Final = "2"

# A version longer than this cannot be one a server accepts; refusing to parse it bounds the work done on
# a caller-chosen header (``int()`` on thousands of digits is quadratic, and raises past 4300 digits).
MAX_VERSION_LENGTH: Final = 32

# §3.1: "Recommended strict grammar: ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$". Written with explicit ASCII
# classes and used with ``fullmatch``: ``\d`` would admit non-ASCII digits and ``$`` a trailing newline.
_VERSION_GRAMMAR: Final = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)", re.ASCII)

# §3.1: "Trim whitespace." HTTP optional whitespace is SP and HTAB; the other ASCII whitespace is also
# trimmed (as PHP ``trim`` does upstream). Non-ASCII spaces (U+00A0 …) are *not* trimmed, so such a
# value is malformed: a judgement, since the spec does not say which whitespace it means.
_TRIMMED: Final = " \t\r\n\x0b\x0c"

_WORKER_MISSING_MESSAGE: Final = "Missing worker protocol version header."
_WORKER_UNSUPPORTED_MESSAGE: Final = "Unsupported worker protocol version."
_CONTROL_MISSING_MESSAGE: Final = "Missing control plane version header."
_CONTROL_UNSUPPORTED_MESSAGE: Final = "Unsupported control plane version."


def format_version(major: int, minor: int) -> str:
    """``(1, 20)`` → ``"1.20"``."""
    return f"{major}.{minor}"


def _trim(raw: str | None) -> str | None:
    """The header value after trimming, or ``None`` when it is absent or empty after trimming.

    §3.1: "Trim whitespace. Empty after trimming counts as missing."
    """
    if raw is None:
        return None
    trimmed = raw.strip(_TRIMMED)
    return trimmed or None


def parse_version(raw: str) -> tuple[int, int] | None:
    """Parse ``MAJOR.MINOR`` with the strict grammar of §3.1, after trimming; ``None`` if malformed.

    §3.1: "[SPEC] enumerates exact strings "1.0"…, so "1.05", "1.2.0", "1", "v1.2" and "1.x" are
    malformed and rejected."
    """
    text = raw.strip(_TRIMMED)
    if len(text) > MAX_VERSION_LENGTH:
        return None
    match = _VERSION_GRAMMAR.fullmatch(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def minor_supports(requested_minor: int, introduced_minor: int) -> bool:
    """Whether a peer speaking ``1.<requested_minor>`` can use a rule or field introduced in
    ``1.<introduced_minor>``.

    §3.3: "Workers may use an older minor of the same major … A server MUST NOT require fields that were
    introduced after the worker's minor." So a feature applies exactly when it is not newer than the
    negotiated minor.
    """
    return introduced_minor <= requested_minor


def _worker_fields(requested: str | None, advertised_minor: int) -> dict[str, object]:
    supported = format_version(ADVERTISED_MAJOR, advertised_minor)
    return {
        # §3.1 error body: "supported_version (the advertised version, e.g. "1.20")".
        "supported_version": supported,
        # §3.1 error body: "requested_version (the raw string after trimming, or null)".
        "requested_version": requested,
        "remediation": (
            f"Send the {WORKER_PROTOCOL_VERSION_HEADER} header with a version from {MINIMUM_VERSION} to "
            f"{supported} (same major, minor at most the server's), for example {supported!r}."
        ),
        # §3.1: "The RS MAY add "accepted_versions": {"min": "1.0", "max": "1.20"} to version errors."
        "accepted_versions": {"min": MINIMUM_VERSION, "max": supported},
    }


def negotiate_worker_version(raw: str | None, *, advertised_minor: int = ADVERTISED_MINOR) -> int:
    """Accept a worker-plane version header and return the requested minor, or raise a 400 :class:`Rejection`.

    ``raw`` is the header value as received (``None`` when absent). ``advertised_minor`` lets a server
    that advertises an older ``1.N`` reuse the same rule: §3.1 "Server 1.N accepts 1.M for every M ≤ N and
    answers with 1.N".
    """
    if advertised_minor < 0:
        raise ValueError(f"advertised_minor must be >= 0, got {advertised_minor}")
    requested = _trim(raw)
    if requested is None:
        # VERSION-MISSING, VERSION-EMPTY-IS-MISSING. §3.1: "reason when missing or empty:
        # missing_protocol_version"; §16.1: "requested_version is null".
        raise Rejection(
            400,
            "missing_protocol_version",
            _WORKER_MISSING_MESSAGE,
            _worker_fields(None, advertised_minor),
        )
    parsed = parse_version(requested)
    # VERSION-MALFORMED, VERSION-MAJOR-MISMATCH, VERSION-MINOR-ABOVE. §3.1 "Rejected: missing header,
    # malformed value, different major (0.x, 2.x, 999), minor above the server's (1.21)"; "reason for
    # every other rejection: unsupported_protocol_version. UPS has no separate "malformed" code".
    if parsed is None or parsed[0] != ADVERTISED_MAJOR or parsed[1] > advertised_minor:
        raise Rejection(
            400,
            "unsupported_protocol_version",
            _WORKER_UNSUPPORTED_MESSAGE,
            _worker_fields(requested, advertised_minor),
        )
    # VERSION-OLDER-MINOR-ACCEPTED. §3.1: "Same major and minor ≤ advertised."
    return parsed[1]


def _control_fields(requested: str | None) -> dict[str, object]:
    return {
        "supported_version": CONTROL_PLANE_VERSION,
        "requested_version": requested,
        "remediation": (
            f"Send the {CONTROL_PLANE_VERSION_HEADER} header with the value {CONTROL_PLANE_VERSION!r}; "
            "GET /api/cluster/info publishes it under control_plane.version."
        ),
    }


def negotiate_control_plane_version(raw: str | None) -> str:
    """Accept a control-plane version header (only ``"2"``) and return it, or raise a 400 :class:`Rejection`.

    §3.2 body: "message, reason, supported_version: "2", requested_version, remediation".
    """
    requested = _trim(raw)
    if requested is None:
        # CONTROL-VERSION-MISSING. §3.2: "Missing: 400 missing_control_plane_version".
        raise Rejection(400, "missing_control_plane_version", _CONTROL_MISSING_MESSAGE, _control_fields(None))
    if requested != CONTROL_PLANE_VERSION:
        # CONTROL-VERSION-UNSUPPORTED. §3.2: "Any other value: 400 unsupported_control_plane_version".
        raise Rejection(
            400,
            "unsupported_control_plane_version",
            _CONTROL_UNSUPPORTED_MESSAGE,
            _control_fields(requested),
        )
    return CONTROL_PLANE_VERSION
