"""Command batches (§8.7, §8.7.1; invariants 33–35), retry policy (§11.6) and start input (§12.1)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite.protocol import commands as commands_module
from suite.protocol.commands import (
    ALL_TYPES,
    DEFAULT_RETRY_POLICY,
    NON_TERMINAL_TYPES,
    PARENT_CLOSE_POLICIES,
    TERMINAL_TYPES,
    Command,
    RetryPolicy,
    apply_order,
    batch_run_event,
    terminal_command,
    validate_batch,
    validate_retry_policy,
    validate_start_input,
    validate_workflow_id,
)
from suite.protocol.errors import Rejection
from suite.protocol.lifecycles import RunEvent

BLOB = "wwHioz3/VYAiNwoMaMOpbGxv"  # §8.7 example result blob
ENVELOPE = {"codec": "avro", "blob": BLOB}

MINIMAL: dict[str, dict[str, Any]] = {
    "complete_workflow": {"type": "complete_workflow"},
    "fail_workflow": {"type": "fail_workflow", "message": "boom"},
    "continue_as_new": {"type": "continue_as_new"},
    "schedule_activity": {"type": "schedule_activity", "activity_type": "greet"},
    "start_timer": {"type": "start_timer", "delay_seconds": 0},
    "start_child_workflow": {"type": "start_child_workflow", "workflow_type": "child"},
    "complete_update": {"type": "complete_update", "update_id": "u1"},
    "fail_update": {"type": "fail_update", "update_id": "u1", "message": "nope"},
    "record_side_effect": {"type": "record_side_effect", "result": BLOB},
    "record_version_marker": {
        "type": "record_version_marker",
        "change_id": "c1",
        "version": 1,
        "min_supported": 1,
        "max_supported": 2,
    },
    "upsert_search_attributes": {"type": "upsert_search_attributes", "attributes": {"k": "v"}},
}


def invalid(batch: object, **kwargs: Any) -> Rejection:
    with pytest.raises(Rejection) as info:
        validate_batch(batch, **kwargs)
    return info.value


def errors_of(batch: object, **kwargs: Any) -> dict[str, list[str]]:
    err = invalid(batch, **kwargs)
    assert (err.status, err.reason) == (422, "validation_failed"), err
    assert err.fields["errors"] == err.fields["validation_errors"]
    errors: dict[str, list[str]] = err.fields["errors"]
    return errors


def semantic_errors_of(batch: object, **kwargs: Any) -> dict[str, list[str]]:
    err = invalid(batch, **kwargs)
    assert (err.status, err.reason) == (409, "invalid_commands"), err
    assert err.fields["recorded"] is False
    assert "errors" not in err.fields  # §2.2: errors/validation_errors are 422-only
    errors: dict[str, list[str]] = err.fields["command_errors"]
    return errors


def test_exported_names_exist() -> None:
    for name in commands_module.__all__:
        assert hasattr(commands_module, name), name


def test_type_lists_follow_s0_order() -> None:
    # Appendix A.1 supported_workflow_task_commands, "Terminal types first, then non-terminal".
    spec = json.loads((Path(__file__).parent / "spec_documents.json").read_text(encoding="utf-8"))
    assert list(ALL_TYPES) == spec["appendix_a1_server_capabilities"]["supported_workflow_task_commands"]
    assert set(TERMINAL_TYPES) | set(NON_TERMINAL_TYPES) == set(ALL_TYPES) == set(MINIMAL)
    assert not set(TERMINAL_TYPES) & set(NON_TERMINAL_TYPES)


# ---------------------------------------------------------------------------------------------------------
# Valid batches
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_minimal_command_of_each_type_is_accepted(kind: str) -> None:
    [command] = validate_batch([MINIMAL[kind]], open_update_ids={"u1"})
    assert command == Command(type=kind, fields=MINIMAL[kind], index=0)
    assert command.is_terminal is (kind in TERMINAL_TYPES)


def test_full_featured_commands_are_accepted() -> None:
    batch = [
        {
            "type": "schedule_activity",
            "activity_type": "charge",
            "arguments": ENVELOPE,
            "payload_codec": "avro",
            "connection": None,
            "queue": "payments",
            "retry_policy": {
                "max_attempts": 3,
                "backoff_seconds": [1, 5],
                "non_retryable_error_types": ["Fatal"],
            },
            "heartbeat_timeout": 5,
            "start_to_close_timeout": 5,
            "schedule_to_start_timeout": 60,
            "schedule_to_close_timeout": 60,
            "worker_session": {"session_id": "s"},
            "some_future_field": 1,  # §0: unknown request fields MUST be ignored
        },
        {"type": "start_timer", "delay_seconds": 3600},
        {
            "type": "start_child_workflow",
            "workflow_type": "child",
            "arguments": BLOB,
            "parent_close_policy": "request_cancellation",
            "retry_policy": {},
            "execution_timeout_seconds": 10,
            "run_timeout_seconds": 10,
        },
        {"type": "record_side_effect", "result": ENVELOPE, "payload_codec": "avro"},
        {"type": "record_side_effect", "result": {"codec": "avro", "external_storage": {"uri": "s3://x"}}},
        {
            "type": "upsert_search_attributes",
            "attributes": {"s": "x", "i": 1, "f": 1.5, "b": True, "n": None, "kw": ["a", "b"], "empty": []},
            "attribute_types": {"s": "keyword"},
        },
        {
            "type": "fail_update",
            "update_id": "u2",
            "message": "bad",
            "non_retryable": True,
            "exception_type": "E",
        },
        {"type": "complete_update", "update_id": "u1", "result": ENVELOPE},
        {
            "type": "fail_workflow",
            "message": "boom",
            "exception_class": "RuntimeError",
            "exception_type": "app",
            "exception": {"trace": []},
            "non_retryable": False,
        },
    ]
    parsed = validate_batch(batch, open_update_ids=["u1", "u2"])
    assert [c.index for c in parsed] == list(range(len(batch)))
    assert parsed[0].retry_policy() == RetryPolicy(3, (1, 5), ("Fatal",))
    assert parsed[2].retry_policy() is None  # {} is "no policy"


@pytest.mark.parametrize("policy", sorted(PARENT_CLOSE_POLICIES))
def test_every_parent_close_policy_is_accepted(policy: str) -> None:
    validate_batch([{**MINIMAL["start_child_workflow"], "parent_close_policy": policy}])


def test_terminal_may_sit_anywhere_but_is_applied_last() -> None:
    batch = [MINIMAL["complete_workflow"], MINIMAL["start_timer"], MINIMAL["record_side_effect"]]
    parsed = validate_batch(batch)
    assert [c.type for c in apply_order(parsed)] == ["start_timer", "record_side_effect", "complete_workflow"]
    terminal = terminal_command(parsed)
    assert terminal is not None
    assert terminal.index == 0
    assert batch_run_event(parsed) is RunEvent.BATCH_COMPLETE


@pytest.mark.parametrize(
    ("kind", "event"),
    [
        ("complete_workflow", RunEvent.BATCH_COMPLETE),
        ("fail_workflow", RunEvent.BATCH_FAIL),
        ("continue_as_new", RunEvent.BATCH_CONTINUE_AS_NEW),
        ("start_timer", RunEvent.BATCH_OPEN_WAITS),
    ],
)
def test_batch_run_event(kind: str, event: RunEvent) -> None:
    assert batch_run_event(validate_batch([MINIMAL[kind]])) is event


# ---------------------------------------------------------------------------------------------------------
# 422: body shape (invariant 33, 34, 35)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [None, [], {}, "complete_workflow", 0, {"type": "complete_workflow"}])
def test_missing_empty_or_non_array_commands(batch: object) -> None:
    assert list(errors_of(batch)) == ["commands"]


@pytest.mark.parametrize(
    ("item", "path"),
    [
        (1, "commands.0"),
        ("complete_workflow", "commands.0"),
        (None, "commands.0"),
        ([], "commands.0"),
        ({}, "commands.0.type"),
        ({"type": None}, "commands.0.type"),
        ({"type": 7}, "commands.0.type"),
        ({"type": ""}, "commands.0.type"),
        ({"type": ["complete_workflow"]}, "commands.0.type"),
    ],
)
def test_bad_items(item: object, path: str) -> None:
    assert list(errors_of([item])) == [path]


@pytest.mark.parametrize(
    ("command", "path"),
    [
        # invariant 34
        ({"type": "schedule_activity"}, "commands.0.activity_type"),
        ({"type": "schedule_activity", "activity_type": ""}, "commands.0.activity_type"),
        ({"type": "schedule_activity", "activity_type": 5}, "commands.0.activity_type"),
        ({"type": "start_timer", "delay_seconds": -1}, "commands.0.delay_seconds"),
        ({"type": "start_timer"}, "commands.0.delay_seconds"),
        ({"type": "start_timer", "delay_seconds": "5"}, "commands.0.delay_seconds"),
        ({"type": "start_timer", "delay_seconds": 1.5}, "commands.0.delay_seconds"),
        ({"type": "start_timer", "delay_seconds": 5.0}, "commands.0.delay_seconds"),
        ({"type": "start_timer", "delay_seconds": True}, "commands.0.delay_seconds"),
        ({"type": "fail_workflow"}, "commands.0.message"),
        ({"type": "fail_workflow", "message": ""}, "commands.0.message"),
        ({"type": "fail_workflow", "message": "m", "exception": "x"}, "commands.0.exception"),
        ({"type": "fail_workflow", "message": "m", "non_retryable": "yes"}, "commands.0.non_retryable"),
        ({"type": "complete_update"}, "commands.0.update_id"),
        ({"type": "fail_update", "update_id": "u1"}, "commands.0.message"),
        ({"type": "start_child_workflow"}, "commands.0.workflow_type"),
        (
            {**MINIMAL["start_child_workflow"], "parent_close_policy": "bogus"},
            "commands.0.parent_close_policy",
        ),
        ({**MINIMAL["start_child_workflow"], "parent_close_policy": 1}, "commands.0.parent_close_policy"),
        ({**MINIMAL["start_child_workflow"], "run_timeout_seconds": 0}, "commands.0.run_timeout_seconds"),
        (
            {**MINIMAL["start_child_workflow"], "run_timeout_seconds": 20, "execution_timeout_seconds": 10},
            "commands.0.run_timeout_seconds",
        ),
        ({**MINIMAL["record_version_marker"], "version": 3}, "commands.0.version"),
        ({**MINIMAL["record_version_marker"], "version": 0}, "commands.0.version"),
        ({**MINIMAL["record_version_marker"], "min_supported": "1"}, "commands.0.min_supported"),
        ({**MINIMAL["record_version_marker"], "change_id": ""}, "commands.0.change_id"),
        (
            {"type": "record_version_marker", "change_id": "c", "min_supported": 1, "max_supported": 2},
            "commands.0.version",
        ),
        ({"type": "record_side_effect"}, "commands.0.result"),
        ({"type": "record_side_effect", "result": ""}, "commands.0.result"),
        ({"type": "record_side_effect", "result": {"codec": "avro", "blob": ""}}, "commands.0.result.blob"),
        ({"type": "upsert_search_attributes"}, "commands.0.attributes"),
        ({"type": "upsert_search_attributes", "attributes": {}}, "commands.0.attributes"),
        ({"type": "upsert_search_attributes", "attributes": ["k"]}, "commands.0.attributes"),
        ({"type": "upsert_search_attributes", "attributes": {"k": {"x": 1}}}, "commands.0.attributes.k"),
        ({"type": "upsert_search_attributes", "attributes": {"k": [1, 2]}}, "commands.0.attributes.k"),
        ({"type": "upsert_search_attributes", "attributes": {"k": math.inf}}, "commands.0.attributes.k"),
        (
            {**MINIMAL["upsert_search_attributes"], "attribute_types": {"k": 1}},
            "commands.0.attribute_types.k",
        ),
        ({"type": "continue_as_new", "workflow_type": ""}, "commands.0.workflow_type"),
        ({"type": "continue_as_new", "queue": 3}, "commands.0.queue"),
    ],
)
def test_field_rules(command: dict[str, Any], path: str) -> None:
    errors = errors_of([MINIMAL["start_timer"], command], open_update_ids={"u1"})
    assert list(errors) == [path.replace("commands.0", "commands.1")]


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        # invariant 35: "heartbeat_timeout on start_timer, retry_policy on complete_workflow"
        ("start_timer", "heartbeat_timeout", 5),
        ("complete_workflow", "retry_policy", {"max_attempts": 2}),
        ("start_child_workflow", "start_to_close_timeout", 5),
        ("start_child_workflow", "schedule_to_close_timeout", 5),
        ("start_child_workflow", "schedule_to_start_timeout", 5),
        ("schedule_activity", "execution_timeout_seconds", 5),
        ("schedule_activity", "run_timeout_seconds", 5),
        ("complete_workflow", "non_retryable", True),
        ("complete_update", "non_retryable", True),
        ("record_side_effect", "retry_policy", {}),
        ("continue_as_new", "run_timeout_seconds", 5),
    ],
)
def test_scope_rules(kind: str, field: str, value: object) -> None:
    errors = errors_of([{**MINIMAL[kind], field: value}], open_update_ids={"u1"})
    assert f"commands.0.{field}" in errors
    assert "not allowed" in errors[f"commands.0.{field}"][0]


def test_scoped_field_set_to_null_is_absent() -> None:
    validate_batch([{**MINIMAL["start_timer"], "heartbeat_timeout": None, "retry_policy": None}])


@pytest.mark.parametrize(
    ("timeouts", "path"),
    [
        ({"heartbeat_timeout": 10, "start_to_close_timeout": 5}, "heartbeat_timeout"),
        ({"start_to_close_timeout": 10, "schedule_to_close_timeout": 5}, "start_to_close_timeout"),
        ({"schedule_to_start_timeout": 10, "schedule_to_close_timeout": 5}, "schedule_to_start_timeout"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
        ({"start_to_close_timeout": -3}, "start_to_close_timeout"),
        ({"schedule_to_close_timeout": False}, "schedule_to_close_timeout"),
        ({"schedule_to_start_timeout": "30"}, "schedule_to_start_timeout"),
    ],
)
def test_activity_timeouts(timeouts: dict[str, object], path: str) -> None:
    assert list(errors_of([{**MINIMAL["schedule_activity"], **timeouts}])) == [f"commands.0.{path}"]


def test_timeout_equalities_are_allowed() -> None:
    validate_batch(
        [
            {
                **MINIMAL["schedule_activity"],
                "heartbeat_timeout": 5,
                "start_to_close_timeout": 5,
                "schedule_to_start_timeout": 5,
                "schedule_to_close_timeout": 5,
            }
        ]
    )


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"codec": "json", "blob": BLOB}, "commands.0.result.codec"),
        ({"codec": "", "blob": BLOB}, "commands.0.result.codec"),
        ({"codec": None, "blob": BLOB}, "commands.0.result.codec"),
        ({"codec": "AVRO", "blob": BLOB}, "commands.0.result.codec"),
    ],
)
def test_unsupported_payload_codec(value: object, path: str) -> None:
    errors = errors_of([{"type": "complete_workflow", "result": value}])
    assert list(errors) == [path]
    assert errors[path][0].startswith("unsupported_payload_codec:")


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"codec": "avro", "blob": BLOB, "extra": 1}, "commands.0.result"),
        ({"codec": "avro"}, "commands.0.result"),
        ({"blob": BLOB}, "commands.0.result"),
        ({"value": 1}, "commands.0.result"),
        ({"codec": "avro", "blob": "not base64!"}, "commands.0.result.blob"),
        ({"codec": "avro", "blob": "abc"}, "commands.0.result.blob"),
        ({"codec": "avro", "blob": 12}, "commands.0.result.blob"),
        ({"codec": "avro", "external_storage": "s3://x"}, "commands.0.result.external_storage"),
        ("%%%", "commands.0.result"),
        (42, "commands.0.result"),
        ([BLOB], "commands.0.result"),
    ],
)
def test_payload_shapes(value: object, path: str) -> None:
    assert list(errors_of([{"type": "complete_workflow", "result": value}])) == [path]


def test_payload_codec_must_be_avro_and_agree() -> None:
    errors = errors_of([{"type": "record_side_effect", "result": BLOB, "payload_codec": "json"}])
    assert errors["commands.0.payload_codec"][0].startswith("unsupported_payload_codec:")
    errors = errors_of([{"type": "schedule_activity", "activity_type": "a", "arguments": ENVELOPE, "payload_codec": 1}])
    assert list(errors) == ["commands.0.payload_codec"]


def test_every_shape_error_of_the_batch_is_reported() -> None:
    errors = errors_of(
        [
            {"type": "start_timer", "delay_seconds": -1},
            {"type": "fail_workflow"},
            {
                "type": "schedule_activity",
                "activity_type": "a",
                "heartbeat_timeout": 9,
                "start_to_close_timeout": 3,
            },
        ]
    )
    assert list(errors) == ["commands.0.delay_seconds", "commands.1.message", "commands.2.heartbeat_timeout"]


def test_shape_errors_win_over_semantic_errors() -> None:
    # Unknown type (409) and a bad field (422) in one batch: the body-shape family is checked first.
    errors = errors_of([{"type": "teleport"}, {"type": "start_timer", "delay_seconds": -1}])
    assert list(errors) == ["commands.1.delay_seconds"]


# ---------------------------------------------------------------------------------------------------------
# 409 invalid_commands
# ---------------------------------------------------------------------------------------------------------


def test_two_terminal_commands() -> None:
    errors = semantic_errors_of([MINIMAL["complete_workflow"], MINIMAL["start_timer"], MINIMAL["fail_workflow"]])
    assert list(errors) == ["commands.0.type", "commands.2.type"]


@pytest.mark.parametrize(("a", "b"), [(a, b) for a in TERMINAL_TYPES for b in TERMINAL_TYPES])
def test_every_pair_of_terminal_commands(a: str, b: str) -> None:
    semantic_errors_of([MINIMAL[a], MINIMAL[b]])


def test_unknown_type_invalidates_the_whole_batch() -> None:
    errors = semantic_errors_of([MINIMAL["start_timer"], {"type": "teleport", "to": "mars"}])
    assert list(errors) == ["commands.1.type"]
    assert "teleport" in errors["commands.1.type"][0]


@pytest.mark.parametrize("kind", ["complete_update", "fail_update"])
def test_update_must_be_open(kind: str) -> None:
    assert list(semantic_errors_of([MINIMAL[kind]])) == ["commands.0.update_id"]
    assert list(semantic_errors_of([MINIMAL[kind]], open_update_ids={"u9"})) == ["commands.0.update_id"]


def test_update_cannot_be_closed_twice_in_one_batch() -> None:
    batch = [MINIMAL["complete_update"], MINIMAL["fail_update"]]
    assert list(semantic_errors_of(batch, open_update_ids={"u1"})) == ["commands.1.update_id"]


def test_rejection_message_tells_the_worker_what_to_do() -> None:
    err = invalid([MINIMAL["complete_workflow"], MINIMAL["continue_as_new"]])
    assert "nothing was applied" in err.message
    assert "complete again" in err.message


# ---------------------------------------------------------------------------------------------------------
# Retry policy
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "path"),
    [
        ("3", "retry_policy"),
        ([], "retry_policy"),
        ({"max_attempts": 0}, "retry_policy.max_attempts"),
        ({"max_attempts": True}, "retry_policy.max_attempts"),
        ({"max_attempts": 2.0}, "retry_policy.max_attempts"),
        ({"backoff_seconds": 5}, "retry_policy.backoff_seconds"),
        ({"backoff_seconds": [1, -1]}, "retry_policy.backoff_seconds.1"),
        ({"backoff_seconds": [1, "2"]}, "retry_policy.backoff_seconds.1"),
        ({"non_retryable_error_types": "Fatal"}, "retry_policy.non_retryable_error_types"),
        ({"non_retryable_error_types": [""]}, "retry_policy.non_retryable_error_types.0"),
        ({"non_retryable_error_types": [3]}, "retry_policy.non_retryable_error_types.0"),
        ({"initial_interval": 1}, "retry_policy.initial_interval"),
    ],
)
def test_retry_policy_shape(policy: object, path: str) -> None:
    with pytest.raises(Rejection) as info:
        validate_retry_policy(policy)
    assert info.value.status == 422
    assert list(info.value.fields["errors"]) == [path]
    # Same rule inside a command, under the command's path.
    errors = errors_of([{**MINIMAL["schedule_activity"], "retry_policy": policy}])
    assert list(errors) == [f"commands.0.{path}"]


def test_retry_policy_values() -> None:
    assert validate_retry_policy(None) is None
    assert validate_retry_policy({}) is None  # decision: {} is "no policy"
    assert validate_retry_policy({"backoff_seconds": [2]}) == RetryPolicy(1, (2,), ())
    assert validate_retry_policy({"max_attempts": 3, "non_retryable_error_types": ["E"]}, "x") == RetryPolicy(
        3, (), ("E",)
    )


def test_default_policy_never_retries() -> None:
    # §11.6: "Default when no retry_policy is given | max_attempts = 1".
    assert RetryPolicy(max_attempts=1) == DEFAULT_RETRY_POLICY
    assert not DEFAULT_RETRY_POLICY.should_retry(1)


def test_backoff_example_of_section_11_6() -> None:
    # "For example [1,5,30] gives 1 s, 5 s, 30 s, 30 s, …"
    policy = RetryPolicy(max_attempts=10, backoff_seconds=(1, 5, 30))
    assert [policy.backoff_before(n) for n in range(2, 7)] == [1, 5, 30, 30, 30]
    assert RetryPolicy(max_attempts=3).backoff_before(2) == 0
    with pytest.raises(ValueError, match="attempt 2"):
        policy.backoff_before(1)


@given(st.lists(st.integers(0, 100), max_size=6), st.integers(2, 50))
def test_backoff_formula(backoff: list[int], next_attempt: int) -> None:
    policy = RetryPolicy(max_attempts=50, backoff_seconds=tuple(backoff))
    n = next_attempt - 1
    expected = backoff[min(n - 1, len(backoff) - 1)] if backoff else 0
    assert policy.backoff_before(next_attempt) == expected


@pytest.mark.parametrize(
    ("attempt", "kwargs", "retry"),
    [
        (1, {}, True),
        (2, {}, True),
        (3, {}, False),  # attempt_number < max_attempts
        (1, {"non_retryable": True}, False),
        (1, {"failure_type": "Fatal"}, False),
        (1, {"failure_class": "Fatal"}, False),
        (1, {"failure_type": "Other", "failure_class": "Transient"}, True),
    ],
)
def test_should_retry(attempt: int, kwargs: dict[str, Any], retry: bool) -> None:
    policy = RetryPolicy(max_attempts=3, backoff_seconds=(2,), non_retryable_error_types=("Fatal",))
    assert policy.should_retry(attempt, **kwargs) is retry


def test_policy_invariants_and_json() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(backoff_seconds=(-1,))
    with pytest.raises(ValueError, match="1-based"):
        DEFAULT_RETRY_POLICY.should_retry(0)
    assert RetryPolicy(2, (1,), ("E",)).to_json() == {
        "max_attempts": 2,
        "backoff_seconds": [1],
        "non_retryable_error_types": ["E"],
    }


# ---------------------------------------------------------------------------------------------------------
# Start input and workflow id (§12.1, §0)
# ---------------------------------------------------------------------------------------------------------


def start_errors(value: object) -> dict[str, list[str]]:
    with pytest.raises(Rejection) as info:
        validate_start_input(value)
    assert (info.value.status, info.value.reason) == (422, "validation_failed")
    errors: dict[str, list[str]] = info.value.fields["errors"]
    return errors


def test_start_input_forms() -> None:
    assert validate_start_input(["hello", 42]) == ("json_array", ["hello", 42])
    assert validate_start_input([None, True, 1.5, {"k": [1]}, []]) == (
        "json_array",
        [None, True, 1.5, {"k": [1]}, []],
    )
    assert validate_start_input(None) == ("json_array", [])
    assert validate_start_input(ENVELOPE) == ("envelope", BLOB)


@pytest.mark.parametrize("codec", ["json", "", None, "php", "base64", "Y"])
def test_start_input_codec_must_be_avro(codec: object) -> None:
    errors = start_errors({"codec": codec, "blob": BLOB})
    assert list(errors) == ["input.codec"]
    assert errors["input.codec"][0].startswith("unsupported_payload_codec:")


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"codec": "avro", "blob": ""}, "input.blob"),
        ({"codec": "avro", "blob": "***"}, "input.blob"),
        ({"codec": "avro", "blob": BLOB, "x": 1}, "input"),
        ({"hello": "world"}, "input"),
        ({"codec": "avro", "external_storage": {}}, "input.external_storage"),
        ("hello", "input"),
        (42, "input"),
        ([1, 2**63], "input.1"),
        ([-(2**63) - 1], "input.0"),
        ([{"a": [math.nan]}], "input.0.a.0"),
    ],
)
def test_start_input_rejections(value: object, path: str) -> None:
    assert list(start_errors(value)) == [path]


def test_start_input_int64_bounds_and_deep_nesting() -> None:
    validate_start_input([2**63 - 1, -(2**63)])
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    assert validate_start_input(deep)[0] == "json_array"  # no RecursionError


@pytest.mark.parametrize("workflow_id", ["order-123", "a", "A.b_c:d-e", "x" * 128])
def test_valid_workflow_ids(workflow_id: str) -> None:
    assert validate_workflow_id(workflow_id) == workflow_id


@pytest.mark.parametrize("workflow_id", ["", "x" * 129, "has space", "slash/", "ünicode", "tab\t", None, 7])
def test_invalid_workflow_ids(workflow_id: object) -> None:
    with pytest.raises(Rejection) as info:
        validate_workflow_id(workflow_id)
    assert info.value.status == 422
    assert list(info.value.fields["errors"]) == ["workflow_id"]


# ---------------------------------------------------------------------------------------------------------
# Optional command types (§5.2: "The RS MAY add them only if it implements them")
# ---------------------------------------------------------------------------------------------------------

WAIT = {"type": "open_condition_wait", "condition_key": "ready", "timeout_seconds": 30}


def test_optional_type_is_unknown_unless_implemented() -> None:
    assert "open_condition_wait" in commands_module.OPTIONAL_TYPES
    assert "open_condition_wait" not in ALL_TYPES
    assert list(semantic_errors_of([WAIT])) == ["commands.0.type"]


def test_optional_type_is_validated_when_implemented() -> None:
    [command] = validate_batch([WAIT], optional_types={"open_condition_wait"})
    assert (command.type, command.is_terminal) == ("open_condition_wait", False)
    assert batch_run_event([command]) is RunEvent.BATCH_OPEN_WAITS
    validate_batch([{"type": "open_condition_wait"}], optional_types={"open_condition_wait"})
    errors = errors_of([{**WAIT, "timeout_seconds": -1}], optional_types={"open_condition_wait"})
    assert list(errors) == ["commands.0.timeout_seconds"]
    errors = errors_of([{**WAIT, "retry_policy": {"max_attempts": 2}}], optional_types={"open_condition_wait"})
    assert list(errors) == ["commands.0.retry_policy"]


def test_only_known_optional_types_can_be_enabled() -> None:
    with pytest.raises(ValueError, match="not optional command types"):
        validate_batch([MINIMAL["start_timer"]], optional_types={"teleport"})


@pytest.mark.parametrize("policy", [{}, [], 1.5, True])
def test_parent_close_policy_of_any_json_type_is_a_field_error(policy: object) -> None:
    """A JSON object or array where a string is expected is a 422, never a crash (TypeError: unhashable)."""
    with pytest.raises(Rejection) as caught:
        validate_batch([{"type": "start_child_workflow", "workflow_type": "x", "parent_close_policy": policy}])
    assert caught.value.status == 422
    assert "commands.0.parent_close_policy" in caught.value.fields["errors"]
