"""Optional command types (§5.2: "[UPP] also lists … `open_condition_wait` … The RS MAY add them only if it
implements them"): unknown unless the caller opts in, validated when it does (Python SDK 2.12.0, Worker handshake)."""

from __future__ import annotations

from typing import Any

import pytest

from suite.protocol.commands import ALL_TYPES, OPTIONAL_TYPES, validate_batch
from suite.protocol.errors import Rejection

# What the official Python SDK 2.12.0 sends for `ctx.wait_condition(pred, key="approval", timeout=5)`.
SDK_WAIT: dict[str, Any] = {
    "type": "open_condition_wait",
    "condition_key": "approval",
    "condition_definition_fingerprint": "sha256:" + "0" * 64,
    "timeout_seconds": 5,
}
OPT_IN = {"optional_types": ("open_condition_wait",)}


def rejection(batch: object, **kwargs: Any) -> Rejection:
    with pytest.raises(Rejection) as info:
        validate_batch(batch, **kwargs)
    return info.value


def test_optional_types_are_not_s0_types() -> None:
    assert not set(OPTIONAL_TYPES) & set(ALL_TYPES)


def test_without_opt_in_an_optional_type_is_an_unknown_type() -> None:
    err = rejection([SDK_WAIT])
    assert (err.status, err.reason) == (409, "invalid_commands")
    assert list(err.fields["command_errors"]) == ["commands.0.type"]
    assert "open_condition_wait" not in err.fields["command_errors"]["commands.0.type"][0].split("supported:")[1]


@pytest.mark.parametrize(
    "command",
    [
        SDK_WAIT,
        {"type": "open_condition_wait"},  # the SDK omits a null key, fingerprint and timeout
        {**SDK_WAIT, "condition_key": None, "timeout_seconds": 0},
    ],
)
def test_with_opt_in_the_sdk_shape_is_accepted(command: dict[str, Any]) -> None:
    [parsed] = validate_batch([command], **OPT_IN)
    assert parsed.type == "open_condition_wait"
    assert not parsed.is_terminal


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_seconds", -1),
        ("timeout_seconds", 1.5),
        ("timeout_seconds", True),
        ("condition_key", 7),
        ("condition_definition_fingerprint", ["sha256:x"]),
    ],
)
def test_with_opt_in_bad_fields_are_422(field: str, value: object) -> None:
    err = rejection([{**SDK_WAIT, field: value}], **OPT_IN)
    assert (err.status, err.reason) == (422, "validation_failed")
    assert list(err.fields["errors"]) == [f"commands.0.{field}"]


def test_with_opt_in_the_unknown_type_message_lists_it_as_supported() -> None:
    err = rejection([{"type": "teleport"}], **OPT_IN)
    assert "open_condition_wait" in err.fields["command_errors"]["commands.0.type"][0]


def test_opting_in_to_a_type_that_is_not_optional_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not optional command types"):
        validate_batch([SDK_WAIT], optional_types=("open_signal_wait",))
