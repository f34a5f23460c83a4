"""Version negotiation, table-driven over every case of docs/reference.md: Versioning and invariants 1-4 and 9."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from suite.protocol.errors import Rejection
from suite.protocol.versions import (
    ADVERTISED_MINOR,
    ADVERTISED_VERSION,
    CONTROL_PLANE_VERSION,
    CONTROL_PLANE_VERSION_HEADER,
    WORKER_PROTOCOL_VERSION_HEADER,
    minor_supports,
    negotiate_control_plane_version,
    negotiate_worker_version,
    parse_version,
)

ALL_ACCEPTED_MINORS = range(ADVERTISED_MINOR + 1)


def rejected(
    negotiate: Callable[[str | None], object], raw: str | None, reason: str, requested: str | None, supported: str
) -> Rejection:
    """The 400 ``reason`` rejection of ``raw``: the requested version echoed, the supported one, a remediation."""
    with pytest.raises(Rejection) as caught:
        negotiate(raw)
    rejection = caught.value
    assert (rejection.status, rejection.reason) == (400, reason)
    assert rejection.fields["requested_version"] == requested
    assert rejection.fields["supported_version"] == supported
    assert rejection.fields["remediation"]
    return rejection


def test_constants() -> None:
    assert ADVERTISED_VERSION == "1.20"
    assert ADVERTISED_MINOR == 20
    assert CONTROL_PLANE_VERSION == "2"
    assert WORKER_PROTOCOL_VERSION_HEADER == "X-Durable-Workflow-Protocol-Version"
    assert CONTROL_PLANE_VERSION_HEADER == "X-Durable-Workflow-Control-Plane-Version"


# ---- accepted: VERSION-OLDER-MINOR-ACCEPTED, VERSION-TRIM --------------------------------------------------


@pytest.mark.parametrize("minor", ALL_ACCEPTED_MINORS, ids=lambda m: f"1.{m}")
def test_every_minor_up_to_advertised_is_accepted(minor: int) -> None:
    assert negotiate_worker_version(f"1.{minor}") == minor


@pytest.mark.parametrize(
    ("raw", "minor"),
    [
        (" 1.20 ", 20),
        ("1.20\n", 20),
        ("\t1.1\t", 1),
        ("\r\n1.13 ", 13),
        ("1.0", 0),
    ],
    ids=repr,
)
def test_surrounding_whitespace_is_trimmed(raw: str, minor: int) -> None:
    assert negotiate_worker_version(raw) == minor


# ---- missing: VERSION-MISSING, VERSION-EMPTY-IS-MISSING ----------------------------------------------------


@pytest.mark.parametrize("raw", [None, "", " ", "   ", "\t", " \t\r\n "], ids=repr)
def test_missing_empty_or_whitespace_is_missing(raw: str | None) -> None:
    rejection = rejected(negotiate_worker_version, raw, "missing_protocol_version", None, "1.20")
    assert rejection.message == "Missing worker protocol version header."
    assert rejection.fields["accepted_versions"] == {"min": "1.0", "max": "1.20"}


# ---- unsupported: VERSION-MAJOR-MISMATCH, VERSION-MINOR-ABOVE, VERSION-MALFORMED, VERSION-REQUESTED-ECHO

UNSUPPORTED = [
    # (sent, requested_version echoed after trimming)
    ("1.21", "1.21"),  # minor above the server's
    ("1.100", "1.100"),
    ("0.9", "0.9"),  # other major
    ("0.0", "0.0"),
    ("2.0", "2.0"),
    ("2.20", "2.20"),
    ("999", "999"),  # other major and malformed
    ("abc", "abc"),  # malformed
    ("1", "1"),
    ("1.", "1."),
    (".1", ".1"),
    ("1.2.3", "1.2.3"),
    ("1.2.0", "1.2.0"),
    ("v1.2", "v1.2"),
    ("1.x", "1.x"),
    ("1.05", "1.05"),
    ("01.0", "01.0"),
    ("-1.0", "-1.0"),
    ("1.-1", "1.-1"),
    ("+1.0", "+1.0"),
    ("1 .20", "1 .20"),
    ("1. 20", "1. 20"),
    ("1,20", "1,20"),
    ("1.20.", "1.20."),
    ("1.2e1", "1.2e1"),
    ("١.٢", "١.٢"),  # non-ASCII digits are not [0-9]
    ("1.\u00b2", "1.\u00b2"),
    ("\u00a01.20", "\u00a01.20"),  # NBSP is not trimmed (judgement, documented in versions.py)
    ("1.20 1.19", "1.20 1.19"),
    ("1.20\n1.19", "1.20\n1.19"),
    (" 1.21 ", "1.21"),  # echoed after trimming
    ("\t2.0\n", "2.0"),
    ("1." + "9" * 40, "1." + "9" * 40),  # longer than any accepted version
]


@pytest.mark.parametrize(("raw", "echoed"), UNSUPPORTED, ids=repr)
def test_unsupported_versions(raw: str, echoed: str) -> None:
    rejection = rejected(negotiate_worker_version, raw, "unsupported_protocol_version", echoed, "1.20")
    assert rejection.message == "Unsupported worker protocol version."
    assert rejection.fields["accepted_versions"] == {"min": "1.0", "max": "1.20"}


def test_rejection_body_has_error_message_and_fields() -> None:
    with pytest.raises(Rejection) as caught:
        negotiate_worker_version("1.21")
    body = caught.value.body()
    assert body["reason"] == "unsupported_protocol_version"
    assert body["error"] == body["message"] == "Unsupported worker protocol version."
    assert body["requested_version"] == "1.21"
    assert body["supported_version"] == "1.20"
    assert "1.20" in body["remediation"]


# ---- an older advertised minor: §3.1 "Server 1.N accepts 1.M for every M ≤ N" ------------------------------


@pytest.mark.parametrize("advertised", [0, 1, 13, 15, 19])
def test_older_server_accepts_up_to_its_minor(advertised: int) -> None:
    for minor in range(advertised + 1):
        assert negotiate_worker_version(f"1.{minor}", advertised_minor=advertised) == minor
    with pytest.raises(Rejection) as caught:
        negotiate_worker_version(f"1.{advertised + 1}", advertised_minor=advertised)
    assert caught.value.reason == "unsupported_protocol_version"
    assert caught.value.fields["supported_version"] == f"1.{advertised}"
    assert caught.value.fields["accepted_versions"] == {"min": "1.0", "max": f"1.{advertised}"}


def test_negative_advertised_minor_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="advertised_minor"):
        negotiate_worker_version("1.0", advertised_minor=-1)


# ---- parse_version -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("1.20", (1, 20)),
        ("0.0", (0, 0)),
        (" 1.0 ", (1, 0)),
        ("2.0", (2, 0)),
        ("10.100", (10, 100)),
        ("1.05", None),
        ("01.5", None),
        ("1", None),
        ("1.2.3", None),
        ("v1.2", None),
        ("1.x", None),
        ("-1.0", None),
        ("", None),
        ("1.20\n", (1, 20)),
        ("1.20\n\n", (1, 20)),
        ("1." + "0" * 40, None),
    ],
    ids=repr,
)
def test_parse_version(raw: str, parsed: tuple[int, int] | None) -> None:
    assert parse_version(raw) == parsed


# ---- minor_supports ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "introduced", "supported"),
    [(20, 0, True), (0, 0, True), (9, 10, False), (10, 10, True), (19, 20, False), (20, 20, True)],
)
def test_minor_supports(requested: int, introduced: int, supported: bool) -> None:
    assert minor_supports(requested, introduced) is supported


# ---- control plane: CONTROL-VERSION-MISSING, CONTROL-VERSION-UNSUPPORTED -----------------------------------


@pytest.mark.parametrize("raw", ["2", " 2 ", "2\n", "\t2"], ids=repr)
def test_control_plane_accepts_2(raw: str) -> None:
    assert negotiate_control_plane_version(raw) == "2"


@pytest.mark.parametrize("raw", [None, "", "   ", "\t\n"], ids=repr)
def test_control_plane_missing(raw: str | None) -> None:
    rejection = rejected(negotiate_control_plane_version, raw, "missing_control_plane_version", None, "2")
    assert "accepted_versions" not in rejection.fields


@pytest.mark.parametrize(
    ("raw", "echoed"),
    [("1", "1"), ("3", "3"), ("2.0", "2.0"), ("02", "02"), ("v2", "v2"), (" 1 ", "1"), ("1.20", "1.20")],
    ids=repr,
)
def test_control_plane_unsupported(raw: str, echoed: str) -> None:
    rejected(negotiate_control_plane_version, raw, "unsupported_control_plane_version", echoed, "2")
