"""The report bodies of ``suite.protocol.commands``: one list of fields for the validators and the checks.

``REPORT_BODIES`` is what ``suite.checks.robustness`` breaks field by field; the validators here are what the
reference server runs on the same bodies. Each required field of the list is refused, by name, when absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from suite.protocol.codec import encode_blob
from suite.protocol.commands import (
    FAILURE_KINDS,
    REPORT_BODIES,
    TIMEOUT_TYPES,
    ActivityFailure,
    validate_activity_complete,
    validate_activity_fail,
    validate_activity_heartbeat,
    validate_query_complete,
    validate_query_fail,
    validate_workflow_failure,
    validate_workflow_fence,
)
from suite.protocol.errors import Rejection

VALID: dict[str, Any] = {
    "str": "conformance",
    "int": 1,
    "num": 1,
    "obj": {},
    "list": [],
    "payload": {"codec": "avro", "blob": encode_blob(["ok"])},
    "failure": {"message": "m"},
    "commands": [{"type": "complete_workflow"}],
}

Validator = Callable[[Mapping[str, Any]], object]


def _workflow_fail(body: Mapping[str, Any]) -> None:
    validate_workflow_fence(body)
    validate_workflow_failure(body)


VALIDATORS: dict[str, Validator] = {
    "workflow-tasks/{id}/history": validate_workflow_fence,
    "workflow-tasks/{id}/heartbeat": validate_workflow_fence,
    "workflow-tasks/{id}/fail": _workflow_fail,
    "activity-tasks/{id}/complete": validate_activity_complete,
    "activity-tasks/{id}/fail": validate_activity_fail,
    "activity-tasks/{id}/heartbeat": validate_activity_heartbeat,
    "activity-tasks/{id}/status": validate_activity_heartbeat,
    "query-tasks/{id}/complete": validate_query_complete,
    "query-tasks/{id}/fail": validate_query_fail,
}
# complete's commands are the batch validator's (validate_batch, tests/unit/test_commands.py).
CASES = [(path, name) for path, fields in REPORT_BODIES.items() if path in VALIDATORS for name in fields]


def _body(path: str) -> dict[str, Any]:
    return {name: VALID[kind] for name, (kind, _required) in REPORT_BODIES[path].items()}


@pytest.mark.parametrize("path", sorted(VALIDATORS))
def test_a_body_with_every_field_of_the_list_is_valid(path: str) -> None:
    VALIDATORS[path](_body(path))


@pytest.mark.parametrize(("path", "name"), CASES)
def test_each_required_field_is_refused_by_name_when_absent(path: str, name: str) -> None:
    _kind, required = REPORT_BODIES[path][name]
    body = {k: v for k, v in _body(path).items() if k != name}
    if not required:
        VALIDATORS[path](body)
        return
    with pytest.raises(Rejection) as info:
        VALIDATORS[path](body)
    assert (info.value.status, info.value.reason) == (422, "validation_failed")
    assert any(field == name or field.startswith(name + ".") for field in info.value.fields["errors"]), info.value


def test_every_report_body_but_the_batch_has_a_validator() -> None:
    assert set(REPORT_BODIES) - set(VALIDATORS) == {"workflow-tasks/{id}/complete"}


@pytest.mark.parametrize("kind", sorted(FAILURE_KINDS))
def test_every_failure_kind_is_accepted(kind: str) -> None:
    fence = {"activity_attempt_id": "a", "lease_owner": "w"}
    _fence, failure = validate_activity_fail({**fence, "failure": {"message": "m", "kind": kind}})
    assert isinstance(failure, ActivityFailure)
    assert failure.kind == kind


def test_an_unknown_failure_kind_or_timeout_type_is_refused() -> None:
    fence = {"activity_attempt_id": "a", "lease_owner": "w"}
    for field, value in (("kind", "other"), ("timeout_type", "other"), ("kind", {"x": 1})):
        with pytest.raises(Rejection) as info:
            validate_activity_fail({**fence, "failure": {"message": "m", field: value}})
        assert f"failure.{field}" in info.value.fields["errors"]
    assert "deadline_exceeded" in TIMEOUT_TYPES
