"""The normative data under ``schemas/``: the JSON Schemas and the OpenAPI document.

Static checks, no server: every schema is valid 2020-12 and carries the ``$id`` of its path, every
``$ref`` resolves inside the package, the command schemas encode docs/reference.md: Commands (invariants 33-35),
the OpenAPI document is valid OpenAPI 3.1 and covers the §1 endpoint map, and every example in it
validates against its schema. Expected values are written here from the protocol, not read back from the
schemas, so a schema that drifts from the spec fails.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import schemas
from suite.protocol.sessions import RUNTIME_CONTRACT

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_PATHS = schemas.list_json_schemas()
# The protocol messages live in these folders; files directly under json/ (the report schema) describe the
# suite's own artefacts and are not part of the HTTP surface.
MESSAGE_DIRS = ("json/common/", "json/commands/", "json/worker/", "json/control/")
MESSAGE_SCHEMAS = [p for p in SCHEMA_PATHS if p.startswith(MESSAGE_DIRS)]
PACKAGE_DIR = Path(str(resources.files(schemas)))
OPENAPI_URI = (PACKAGE_DIR / "openapi.yaml").as_uri()

# docs/reference.md: Discovery (Python SDK 2.12.0, Worker handshake), verbatim, kept as data: spec_documents.json.
SPEC_DOCUMENTS: dict[str, Any] = json.loads((Path(__file__).parent / "spec_documents.json").read_text(encoding="utf-8"))
CAPABILITIES_A1: dict[str, Any] = SPEC_DOCUMENTS["appendix_a1_server_capabilities"]
S0_COMMANDS = CAPABILITIES_A1["supported_workflow_task_commands"]
TERMINAL = {"complete_workflow", "fail_workflow", "continue_as_new"}

# docs/reference.md: Worker sessions: the model's runtime contract, which the reference server advertises.
WORKER_SESSIONS_A2: dict[str, Any] = dict(RUNTIME_CONTRACT)

# The minimal document that passes the SDK's start-up gate.
SDK_GATE_CLUSTER_INFO: dict[str, Any] = SPEC_DOCUMENTS["appendix_b_cluster_info"]

ENVELOPE = {"protocol_version": "1.20", "server_capabilities": CAPABILITIES_A1}
AVRO = {"codec": "avro", "blob": "wwHioz3/VYAiNwoMaMOpbGxv"}  # golden string_utf8 "héllo"

# --------------------------------------------------------------------------------------------- helpers


@cache
def registry() -> Registry[Any]:
    """Every schema under its ``$id`` and its file URI, plus openapi.yaml under its file URI."""
    pairs: list[tuple[str, Resource[Any]]] = []
    for path in SCHEMA_PATHS:
        resource = Resource.from_contents(schemas.load_json(path))
        pairs.append((schemas.schema_id(path), resource))
        pairs.append(((PACKAGE_DIR / path).as_uri(), resource))
    pairs.append((OPENAPI_URI, DRAFT202012.create_resource(openapi_doc())))
    return Registry().with_resources(pairs)


@cache
def openapi_doc() -> dict[str, Any]:
    """openapi.yaml parsed once; callers must not mutate it."""
    return schemas.openapi()


def validator(path: str, fragment: str = "") -> Draft202012Validator:
    """A validator for the schema file at ``path`` (below ``json/``), or one of its subschemas."""
    ref = schemas.schema_id(f"json/{path}") + (f"#{fragment}" if fragment else "")
    return Draft202012Validator({"$ref": ref}, registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER)


def accepts(path: str, instance: Any, fragment: str = "") -> bool:
    return validator(path, fragment).is_valid(instance)


def assert_valid(path: str, instance: Any, fragment: str = "") -> None:
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator(path, fragment).iter_errors(instance)
    ]
    assert not errors, f"{path}{'#' + fragment if fragment else ''} rejected a valid instance: {errors}"


def assert_invalid(path: str, instance: Any, fragment: str = "") -> None:
    assert not accepts(path, instance, fragment), (
        f"{path}{'#' + fragment if fragment else ''} accepted an instance the spec rejects: {instance!r}"
    )


def walk_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from walk_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_refs(item)


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def openapi_examples() -> Iterator[tuple[str, Any]]:
    """(JSON pointer of the schema, example value) for every example in openapi.yaml."""

    def walk(node: Any, pointer: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            if "schema" in node:
                if "example" in node:
                    yield pointer + "/schema", node["example"]
                for example in node.get("examples", {}).values():
                    assert "$ref" not in example, "examples are inline so the test sees them"
                    yield pointer + "/schema", example["value"]
            for key, value in node.items():
                yield from walk(value, f"{pointer}/{escape(str(key))}")
        elif isinstance(node, list):
            for index, item in enumerate(node):
                yield from walk(item, f"{pointer}/{index}")

    yield from walk(openapi_doc(), "")


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi_doc()["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield method.upper(), path, operation


def resolve_component(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    assert ref.startswith("#/components/"), ref
    target: Any = openapi_doc()
    for token in ref[2:].split("/"):
        target = target[token]
    assert isinstance(target, dict)
    return target


# ------------------------------------------------------------------------------------ the schema files


def test_list_json_schemas_finds_every_file() -> None:
    on_disk = sorted(p.relative_to(PACKAGE_DIR).as_posix() for p in (PACKAGE_DIR / "json").rglob("*") if p.is_file())
    assert on_disk == SCHEMA_PATHS, "every file under json/ is a *.schema.json that list_json_schemas() finds"
    assert len(MESSAGE_SCHEMAS) >= 60


@pytest.mark.parametrize("path", SCHEMA_PATHS)
def test_schema_is_valid_2020_12(path: str) -> None:
    schema = schemas.load_json(path)
    assert schema["$schema"] == DIALECT
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", SCHEMA_PATHS)
def test_schema_id_matches_path(path: str) -> None:
    schema = schemas.load_json(path)
    assert schema["$id"] == schemas.schema_id(path)
    nested = list(_nested_ids(schema))
    assert not nested, f"only the root carries $id, so relative refs resolve against the file: {nested}"


def _nested_ids(node: Any, root: bool = True) -> Iterator[str]:
    if isinstance(node, dict):
        if not root and isinstance(node.get("$id"), str):
            yield node["$id"]
        for key, value in node.items():
            if key not in {"const", "enum", "examples", "default"}:
                yield from _nested_ids(value, root=False)
    elif isinstance(node, list):
        for item in node:
            yield from _nested_ids(item, root=False)


@pytest.mark.parametrize("path", MESSAGE_SCHEMAS)
def test_schema_has_title_and_description(path: str) -> None:
    schema = schemas.load_json(path)
    assert isinstance(schema.get("title"), str)
    assert schema["title"]
    assert isinstance(schema.get("description"), str)
    assert schema["description"]


@pytest.mark.parametrize("path", SCHEMA_PATHS)
def test_every_ref_resolves(path: str) -> None:
    schema = schemas.load_json(path)
    resolver = registry().resolver(base_uri=schemas.schema_id(path))
    for ref in walk_refs(schema):
        assert not re.match(r"^[a-z]+:", ref), f"cross-file refs are relative, got {ref!r}"
        resolver.lookup(ref)  # raises referencing.exceptions.Unresolvable


def test_every_schema_is_reachable_from_openapi() -> None:
    """No orphan files: each schema is used by the OpenAPI document, directly or through another schema."""
    seen: set[str] = set()
    todo = [
        "json/" + ref.removeprefix("./json/").partition("#")[0]
        for ref in walk_refs(openapi_doc())
        if ref.startswith("./json/")
    ]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        assert path in SCHEMA_PATHS, f"openapi.yaml or a schema references a missing file: {path}"
        seen.add(path)
        base = path.rpartition("/")[0]
        for ref in walk_refs(schemas.load_json(path)):
            file = ref.partition("#")[0]
            if file:
                parts: list[str] = []
                for part in f"{base}/{file}".split("/"):
                    if part == "..":
                        parts.pop()
                    elif part != ".":
                        parts.append(part)
                todo.append("/".join(parts))
    assert sorted(set(MESSAGE_SCHEMAS) - seen) == []


# ------------------------------------------------------------------------------------------- commands

# A valid example of each S0 command type (docs/reference.md: Commands), with every optional field it allows.
VALID_COMMANDS: dict[str, dict[str, Any]] = {
    "complete_workflow": {"type": "complete_workflow", "result": AVRO, "payload_codec": "avro"},
    "fail_workflow": {
        "type": "fail_workflow",
        "message": "order rejected",
        "exception_class": "OrderRejected",
        "exception_type": "order_rejected",
        "exception": {"class": "OrderRejected", "message": "order rejected"},
        "non_retryable": True,
    },
    "continue_as_new": {
        "type": "continue_as_new",
        "arguments": AVRO,
        "payload_codec": "avro",
        "workflow_type": "order-processing",
        "queue": "orders",
    },
    "schedule_activity": {
        "type": "schedule_activity",
        "activity_type": "charge-card",
        "arguments": AVRO,
        "payload_codec": "avro",
        "connection": None,
        "queue": "orders",
        "retry_policy": {
            "max_attempts": 3,
            "backoff_seconds": [1, 5, 30],
            "non_retryable_error_types": ["Declined"],
        },
        "start_to_close_timeout": 60,
        "schedule_to_start_timeout": 30,
        "schedule_to_close_timeout": 600,
        "heartbeat_timeout": 10,
    },
    "start_timer": {"type": "start_timer", "delay_seconds": 0},
    "start_child_workflow": {
        "type": "start_child_workflow",
        "workflow_type": "shipment",
        "arguments": AVRO["blob"],
        "payload_codec": "avro",
        "queue": "shipping",
        "parent_close_policy": "request_cancellation",
        "retry_policy": {"max_attempts": 2},
        "execution_timeout_seconds": 3600,
        "run_timeout_seconds": 600,
    },
    "complete_update": {
        "type": "complete_update",
        "update_id": "upd-1",
        "result": AVRO,
        "payload_codec": "avro",
    },
    "fail_update": {
        "type": "fail_update",
        "update_id": "upd-1",
        "message": "quota too high",
        "exception_type": "quota",
        "non_retryable": True,
    },
    "record_side_effect": {"type": "record_side_effect", "result": AVRO["blob"]},
    "record_version_marker": {
        "type": "record_version_marker",
        "change_id": "use-v2-pricing",
        "version": 2,
        "min_supported": 1,
        "max_supported": 2,
    },
    "upsert_search_attributes": {
        "type": "upsert_search_attributes",
        "attributes": {"customer": "acme", "total": 12.5, "vip": True, "tags": ["a", "b"], "obsolete": None},
        "attribute_types": {"customer": "keyword"},
    },
}

# The "Required" column of the §8.7.1 tables.
REQUIRED_FIELDS: dict[str, list[str]] = {
    "complete_workflow": [],
    "fail_workflow": ["message"],
    "continue_as_new": [],
    "schedule_activity": ["activity_type"],
    "start_timer": ["delay_seconds"],
    "start_child_workflow": ["workflow_type"],
    "complete_update": ["update_id"],
    "fail_update": ["update_id", "message"],
    "record_side_effect": ["result"],
    "record_version_marker": ["change_id", "version", "min_supported", "max_supported"],
    "upsert_search_attributes": ["attributes"],
}

# §8.7.1 "Which fields are allowed on which command", with a valid value for each field.
SCOPED_FIELDS: dict[str, tuple[set[str], Any]] = {
    "retry_policy": ({"schedule_activity", "start_child_workflow"}, {"max_attempts": 2}),
    "start_to_close_timeout": ({"schedule_activity"}, 60),
    "schedule_to_start_timeout": ({"schedule_activity"}, 60),
    "schedule_to_close_timeout": ({"schedule_activity"}, 600),
    "heartbeat_timeout": ({"schedule_activity"}, 10),
    "execution_timeout_seconds": ({"start_child_workflow"}, 3600),
    "run_timeout_seconds": ({"start_child_workflow"}, 600),
    "non_retryable": ({"fail_workflow", "fail_update"}, True),
}


def minimal(ctype: str) -> dict[str, Any]:
    return {k: v for k, v in VALID_COMMANDS[ctype].items() if k == "type" or k in REQUIRED_FIELDS[ctype]}


def test_command_schemas_cover_exactly_the_s0_types() -> None:
    dispatcher = schemas.load_json("json/commands/command.schema.json")
    assert dispatcher["$defs"]["type"]["enum"] == S0_COMMANDS
    assert [branch["$ref"] for branch in dispatcher["oneOf"]] == [f"{t}.schema.json" for t in S0_COMMANDS]
    assert set(dispatcher["$defs"]["terminal_type"]["enum"]) == TERMINAL
    on_disk = {
        p.removeprefix("json/commands/").removesuffix(".schema.json")
        for p in SCHEMA_PATHS
        if p.startswith("json/commands/")
    }
    assert on_disk == set(S0_COMMANDS) | {"command", "batch"}
    for ctype in S0_COMMANDS:
        schema = schemas.load_json(f"json/commands/{ctype}.schema.json")
        assert schema["properties"]["type"] == {"const": ctype}
        assert sorted(schema["required"]) == sorted(["type", *REQUIRED_FIELDS[ctype]])


@pytest.mark.parametrize("ctype", S0_COMMANDS)
def test_valid_command_is_accepted(ctype: str) -> None:
    assert_valid(f"commands/{ctype}.schema.json", VALID_COMMANDS[ctype])
    assert_valid("commands/command.schema.json", VALID_COMMANDS[ctype])
    assert_valid("commands/command.schema.json", minimal(ctype))


@pytest.mark.parametrize("ctype", S0_COMMANDS)
def test_unknown_command_fields_are_tolerated(ctype: str) -> None:
    assert_valid("commands/command.schema.json", {**VALID_COMMANDS[ctype], "x_vendor_hint": {"any": 1}})


@pytest.mark.parametrize(
    ("ctype", "field"),
    [(c, f) for c in S0_COMMANDS for f in REQUIRED_FIELDS[c]] + [(c, "type") for c in S0_COMMANDS],
)
def test_command_missing_a_required_field_is_rejected(ctype: str, field: str) -> None:
    command = {k: v for k, v in VALID_COMMANDS[ctype].items() if k != field}
    assert_invalid("commands/command.schema.json", command)


@pytest.mark.parametrize(("field", "ctype"), [(f, c) for f in SCOPED_FIELDS for c in S0_COMMANDS])
def test_scope_restricted_fields(field: str, ctype: str) -> None:
    """§8.7.1 scope table, invariant 35: a scoped field is accepted exactly on the commands that allow it."""
    allowed, value = SCOPED_FIELDS[field]
    command = {**minimal(ctype), field: value}
    assert accepts("commands/command.schema.json", command) == (ctype in allowed), (
        f"{field} on {ctype} should be {'accepted' if ctype in allowed else 'rejected (422)'}"
    )


@pytest.mark.parametrize(
    "command",
    [
        # invariant 34
        {"type": "not_a_command"},
        {"type": "schedule_activity"},
        {"type": "schedule_activity", "activity_type": ""},
        {"type": "start_timer", "delay_seconds": -1},
        {"type": "start_timer", "delay_seconds": 1.5},
        {"type": "start_timer", "delay_seconds": "5"},
        {"type": "fail_workflow"},
        {"type": "fail_workflow", "message": ""},
        {"type": "complete_update"},
        {
            "type": "record_version_marker",
            "change_id": "c",
            "version": "2",
            "min_supported": 1,
            "max_supported": 2,
        },
        # invariant 35
        {"type": "start_timer", "delay_seconds": 5, "heartbeat_timeout": 10},
        {"type": "complete_workflow", "retry_policy": {"max_attempts": 2}},
        {"type": "complete_workflow", "non_retryable": True},
        {"type": "schedule_activity", "activity_type": "a", "execution_timeout_seconds": 10},
        {"type": "start_child_workflow", "workflow_type": "w", "start_to_close_timeout": 10},
        # field rules of §8.7.1 and §13.1
        {"type": "schedule_activity", "activity_type": "a", "start_to_close_timeout": 0},
        {"type": "schedule_activity", "activity_type": "a", "retry_policy": {"max_attempts": 0}},
        {"type": "schedule_activity", "activity_type": "a", "retry_policy": {"backoff_seconds": [-1]}},
        {
            "type": "schedule_activity",
            "activity_type": "a",
            "retry_policy": {"non_retryable_error_types": [""]},
        },
        {"type": "schedule_activity", "activity_type": "a", "retry_policy": {}},
        {"type": "schedule_activity", "activity_type": "a", "retry_policy": "3"},
        {"type": "start_child_workflow", "workflow_type": "w", "parent_close_policy": "cancel"},
        {"type": "complete_workflow", "result": {"codec": "json", "blob": "e30="}},
        {"type": "complete_workflow", "result": {"codec": "avro", "blob": "e30=", "extra": 1}},
        {"type": "complete_workflow", "payload_codec": "json"},
        {"type": "record_side_effect", "result": ""},
        {"type": "record_side_effect", "result": "not base64!"},
        {"type": "upsert_search_attributes", "attributes": {"k": {"nested": 1}}},
        {"type": "upsert_search_attributes", "attributes": ["k"]},
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())[:80],
)
def test_invalid_command_is_rejected(command: dict[str, Any]) -> None:
    assert_invalid("commands/command.schema.json", command)


@pytest.mark.parametrize(
    "command",
    [
        {
            "type": "record_version_marker",
            "change_id": "c",
            "version": 5,
            "min_supported": 1,
            "max_supported": 2,
        },
        {
            "type": "schedule_activity",
            "activity_type": "a",
            "heartbeat_timeout": 60,
            "start_to_close_timeout": 10,
        },
        {
            "type": "schedule_activity",
            "activity_type": "a",
            "start_to_close_timeout": 60,
            "schedule_to_close_timeout": 10,
        },
        {
            "type": "start_child_workflow",
            "workflow_type": "w",
            "execution_timeout_seconds": 10,
            "run_timeout_seconds": 60,
        },
    ],
)
def test_cross_field_rules_are_left_to_the_model(command: dict[str, Any]) -> None:
    """Orderings between two fields (invariants 34-35) are beyond JSON Schema: the schema accepts them, says
    so in its description, and the protocol model must reject them."""
    assert_valid("commands/command.schema.json", command)
    description = schemas.load_json(f"json/commands/{command['type']}.schema.json")["description"]
    assert "model enforces it" in description


def test_batch_rules() -> None:
    complete = VALID_COMMANDS["complete_workflow"]
    timer = VALID_COMMANDS["start_timer"]
    assert_valid("commands/batch.schema.json", [complete])
    assert_valid("commands/batch.schema.json", [timer, VALID_COMMANDS["schedule_activity"]])
    assert_valid("commands/batch.schema.json", [timer, timer, complete])
    assert_invalid("commands/batch.schema.json", [])  # invariant 33
    assert_invalid("commands/batch.schema.json", [complete, VALID_COMMANDS["fail_workflow"]])  # invariant 33
    assert_invalid("commands/batch.schema.json", [timer, complete, VALID_COMMANDS["continue_as_new"]])
    assert_invalid("commands/batch.schema.json", [timer, {"type": "nope"}])  # invariant 34
    assert_invalid("commands/batch.schema.json", [{"result": AVRO}])  # missing type
    assert_invalid("commands/batch.schema.json", complete)


def test_complete_request_requires_a_non_empty_batch_and_the_fence() -> None:
    body = {
        "lease_owner": "w1",
        "workflow_task_attempt": 1,
        "commands": [VALID_COMMANDS["complete_workflow"]],
    }
    path = "worker/workflow-task-complete.request.schema.json"
    assert_valid(path, body)
    assert_valid(path, {**body, "message_stream_cursors": {}, "sticky_cache": None})  # SDK extras are ignored
    assert_invalid(path, {**body, "commands": []})
    assert_invalid(path, {k: v for k, v in body.items() if k != "commands"})
    assert_invalid(path, {k: v for k, v in body.items() if k != "lease_owner"})
    assert_invalid(path, {**body, "workflow_task_attempt": 0})


# ------------------------------------------------------------------------- capabilities and envelopes


def test_appendix_a1_capabilities_validate() -> None:
    assert_valid("common/server-capabilities.schema.json", CAPABILITIES_A1)
    assert_valid("common/server-capabilities.schema.json", CAPABILITIES_A1, "/$defs/recommended")
    assert_valid("common/envelope.schema.json", ENVELOPE)


def test_appendix_a2_worker_sessions_validate() -> None:
    caps = {
        **CAPABILITIES_A1,
        "worker_session_verbs": ["create", "heartbeat", "close"],
        "worker_sessions": WORKER_SESSIONS_A2,
    }
    assert_valid("common/server-capabilities.schema.json", caps, "/$defs/recommended")
    assert_invalid("common/server-capabilities.schema.json", {**CAPABILITIES_A1, "worker_sessions": WORKER_SESSIONS_A2})
    assert_invalid("common/server-capabilities.schema.json", {**caps, "worker_session_verbs": ["create", "close"]})


def test_capability_types_are_musts_and_presence_is_a_should() -> None:
    path = "common/server-capabilities.schema.json"
    sparse = {k: v for k, v in CAPABILITIES_A1.items() if k != "default_history_page_size"}
    assert_valid(path, sparse)
    assert_invalid(path, sparse, "/$defs/recommended")
    assert_valid(path, {**CAPABILITIES_A1, "poll_status": {"statuses": ["leased"]}}, "/$defs/recommended")
    assert_invalid(path, {**CAPABILITIES_A1, "poll_status": {}}, "/$defs/recommended")
    assert_invalid(path, {**CAPABILITIES_A1, "query_tasks": False}, "/$defs/recommended")
    missing_timer = [c for c in S0_COMMANDS if c != "start_timer"]
    assert_invalid(path, {**CAPABILITIES_A1, "supported_workflow_task_commands": missing_timer}, "/$defs/recommended")
    extended = [*S0_COMMANDS, "open_condition_wait"]
    assert_valid(path, {**CAPABILITIES_A1, "supported_workflow_task_commands": extended}, "/$defs/recommended")
    assert_invalid(path, {**CAPABILITIES_A1, "long_poll_timeout": "30"})
    assert_invalid(path, {**CAPABILITIES_A1, "query_tasks": "true"})
    assert_valid(path, {**CAPABILITIES_A1, "some_future_flag": {"x": 1}})


def test_worker_envelope_rules() -> None:
    path = "common/envelope.schema.json"
    assert_invalid(path, {**ENVELOPE, "control_plane": {"version": "2"}})  # invariant 6
    assert_invalid(path, {"protocol_version": "1.20"})
    for bad in ("1.2.0", "v1.2", "1", "1.x", "1.05", 1.2):
        assert_invalid(path, {**ENVELOPE, "protocol_version": bad})
    defs = schemas.load_json("json/common/envelope.schema.json")["$defs"]
    # invariant 4: a 1.20 server accepts every minor from 1.0 to 1.20
    assert defs["accepted_request_version"]["enum"] == [f"1.{minor}" for minor in range(21)]


def test_payload_envelope_key_set_and_codec() -> None:
    path = "common/payload-envelope.schema.json"
    assert_valid(path, AVRO)
    external = {"codec": "avro", "external_storage": {"ref": "s3://bucket/key"}}
    # external payload storage is an optional feature: tolerated when reading, not required of requests
    assert_invalid(path, external)
    assert_valid(path, external, "/$defs/any_form")
    assert_valid(path, AVRO, "/$defs/any_form")
    assert_invalid(path, {**external, "blob": AVRO["blob"]}, "/$defs/any_form")
    assert_invalid(path, {**AVRO, "extra": True})
    assert_invalid(path, {"codec": "json", "blob": AVRO["blob"]})
    assert_invalid(path, {"codec": "avro", "blob": "***"})
    assert_invalid(path, {"codec": "avro"})
    # recognised as an envelope by its key set, then refused for its codec
    assert_valid(path, {"codec": "json", "blob": "e30="}, "/$defs/shape")
    assert_invalid(path, {"codec": "avro", "blob": "x", "meta": 1}, "/$defs/shape")


def test_golden_blobs_carry_the_framing_prefix() -> None:
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    for case in golden["cases"]:
        assert_valid("common/payload-envelope.schema.json", case["wire_base64"], "/$defs/avro_frame_blob")
        assert_valid("common/payload-envelope.schema.json", {"codec": "avro", "blob": case["wire_base64"]})


def test_resume_context() -> None:
    path = "common/resume-context.schema.json"
    first = schemas.load_json("json/common/resume-context.schema.json")["required"]
    assert len(first) == 20  # §8.3
    all_null = dict.fromkeys(first)
    assert_valid(path, all_null, "/$defs/first_task")
    timer = {
        **all_null,
        "workflow_wait_kind": "timer",
        "open_wait_id": "timer:t1",
        "resume_source_kind": "timer",
        "resume_source_id": "t1",
        "timer_id": "t1",
        "workflow_sequence": 3,
        "workflow_event_type": "TimerFired",
    }
    assert_valid(path, timer)
    assert_invalid(path, timer, "/$defs/first_task")
    assert_invalid(path, {**timer, "timer_id": None})
    assert_invalid(path, {**timer, "open_wait_id": "t1"})
    update = {
        **all_null,
        "workflow_wait_kind": "update",
        "open_wait_id": "update:u1",
        "resume_source_kind": "workflow_update",
        "workflow_update_id": "u1",
    }
    assert_valid(path, update)
    assert_invalid(path, {**update, "workflow_update_id": None})
    assert_valid(path, {**all_null, "workflow_wait_kind": "signal", "signal_name": "approve"})
    assert_invalid(path, {**all_null, "workflow_wait_kind": "signal"})
    assert_valid(path, {**all_null, "workflow_wait_kind": "activity", "activity_execution_id": "a1"})
    assert_invalid(path, {**all_null, "workflow_wait_kind": "sleep"})
    assert_invalid(path, {k: v for k, v in all_null.items() if k != "condition_key"})  # invariant 40


def test_poll_response_task_matches_poll_status() -> None:
    path = "worker/workflow-task-poll.response.schema.json"
    empty = {"task": None, "poll_status": "empty", **ENVELOPE}
    assert_valid(path, empty)
    assert_invalid(path, {k: v for k, v in empty.items() if k != "poll_status"})  # invariant 17
    assert_invalid(path, {**empty, "poll_status": "leased"})
    assert_invalid(path, {**empty, "task": {"task_id": "t"}})
    assert_invalid(path, {**empty, "poll_status": "draining"})  # needs reason worker_draining (invariant 18)
    assert_valid(path, {**empty, "poll_status": "draining", "reason": "worker_draining"})
    assert_invalid(path, {**empty, "poll_status": "workflow_task_pending"})
    assert_valid("worker/query-task-poll.response.schema.json", {**empty, "poll_status": "workflow_task_pending"})
    assert_invalid("worker/query-task-poll.response.schema.json", {**empty, "poll_status": "timeout"})


def test_error_body_reason_rules() -> None:
    path = "common/error.schema.json"
    worker = "/$defs/worker"
    assert_valid(path, {"reason": "task_not_found", "error": "Workflow task not found.", **ENVELOPE}, worker)
    assert_invalid(path, {"error": "no reason"})
    assert_invalid(path, {"reason": "Task Not Found"})
    # the worker envelope is mandatory on worker-plane errors (invariant 5)
    assert_invalid(path, {"reason": "task_not_found"}, worker)
    assert_invalid(path, {"reason": "workflow_task_attempt_mismatch"})  # needs current_attempt
    assert_valid(path, {"reason": "workflow_task_attempt_mismatch", "current_attempt": 2})
    missing = {"reason": "missing_protocol_version", "supported_version": "1.20", "remediation": "send it"}
    assert_valid(path, {**missing, "requested_version": None})
    assert_invalid(path, {**missing, "requested_version": "1.1"})  # invariant 1
    run_closed = {
        "reason": "run_closed",
        "can_continue": False,
        "cancel_requested": True,
        "stop_reason": "run_cancelled",
        "run_status": "cancelled",
        "run_closed_reason": "cancelled",
        "run_closed_at": "2026-04-18T12:00:30Z",
        "task_status": "cancelled",
        "lease_owner": "w1",
        "lease_expires_at": None,
    }
    assert_valid(path, run_closed)  # invariant 49
    assert_invalid(path, {**run_closed, "outcome": "rejected"})  # §8.9 row 2: no outcome key
    assert_invalid(path, {**run_closed, "cancel_requested": False})
    # invariant 29: a second complete after the batch closed the run
    completed = {"run_status": "completed", "cancel_requested": False, "stop_reason": "run_completed"}
    assert_valid(path, {**run_closed, **completed})
    assert_valid(path, {"reason": "validation_failed", "message": "m", "errors": {"commands": ["required"]}})
    assert_invalid(path, {"reason": "validation_failed", "message": "m"})
    assert_invalid(path, {"reason": "validation_failed", "errors": {"commands": "required"}})


def test_activity_heartbeat_cancel_table() -> None:
    path = "worker/activity-task-heartbeat.response.schema.json"
    live = {
        "task_id": "t",
        "activity_attempt_id": "a",
        "lease_owner": "w1",
        "cancel_requested": False,
        "can_continue": True,
        "reason": None,
        "run_closed_reason": None,
        "run_closed_at": None,
        "heartbeat_recorded": True,
        "lease_expires_at": "2026-04-18T12:05:00Z",
        "last_heartbeat_at": "2026-04-18T12:00:00Z",
        **ENVELOPE,
    }
    assert_valid(path, live)
    cancelled = {
        **live,
        "can_continue": False,
        "cancel_requested": True,
        "reason": "run_cancelled",
        "heartbeat_recorded": False,
        "run_closed_reason": "cancelled",
        "run_closed_at": "2026-04-18T12:00:30Z",
    }
    assert_valid(path, cancelled)  # invariant 51
    assert_invalid(path, {**cancelled, "cancel_requested": False})
    assert_invalid(path, {**cancelled, "run_closed_at": None})
    assert_invalid(path, {**cancelled, "reason": "because"})
    assert_valid(
        path,
        {
            **cancelled,
            "cancel_requested": False,
            "reason": "stale_attempt",
            "run_closed_reason": None,
            "run_closed_at": None,
        },
    )
    assert_invalid(path, {**live, "heartbeat_recorded": False})
    assert_valid("worker/activity-task-status.response.schema.json", {**live, "heartbeat_recorded": False})


def test_cluster_info_gate() -> None:
    path = "control/cluster-info.response.schema.json"
    info = {**copy.deepcopy(SDK_GATE_CLUSTER_INFO), "capabilities": {"payload_codecs": ["avro"]}}
    assert_valid(path, info)
    assert_invalid(path, SDK_GATE_CLUSTER_INFO)  # the suite also needs capabilities.payload_codecs ∋ avro
    assert_invalid(path, {**info, "capabilities": {"payload_codecs": ["json"]}})
    no_mtls = copy.deepcopy(info)
    del no_mtls["auth_composition_contract"]["auth_material"]["mtls"]
    assert_invalid(path, no_mtls)
    short_never_echo = copy.deepcopy(info)
    short_never_echo["auth_composition_contract"]["redaction"]["never_echo"] = ["bearer_tokens"]
    assert_invalid(path, short_never_echo)
    integer_version = copy.deepcopy(info)
    # [SPEC] types it as integer; every implementation sends a string
    integer_version["worker_protocol"]["version"] = 1
    assert_invalid(path, integer_version)
    full = copy.deepcopy(info)
    full["worker_protocol"]["server_capabilities"] = CAPABILITIES_A1
    assert_valid(path, full)


def test_control_plane_envelope_has_no_worker_keys() -> None:
    assert_valid("control/cancel.response.schema.json", {"workflow_id": "w", "outcome": "cancelled", "reason": None})
    assert_invalid(
        "control/cancel.response.schema.json",
        {"workflow_id": "w", "outcome": "cancelled", "reason": None, "protocol_version": "1.20"},
    )


def test_start_request_rules() -> None:
    path = "control/start.request.schema.json"
    assert_valid(path, {"workflow_type": "t", "input": ["hello", 42]})
    assert_valid(path, {"workflow_type": "t", "input": AVRO, "duplicate_policy": "use-existing"})
    assert_invalid(path, {"workflow_type": "t", "duplicate_policy": "use_existing"})
    assert_invalid(path, {"workflow_type": "t", "input": {"codec": "json", "blob": "e30="}})  # invariant 44
    assert_invalid(path, {"workflow_type": "t", "input": [2**63]})
    assert_invalid(path, {"workflow_type": "t", "workflow_id": "has space"})
    assert_invalid(path, {"workflow_type": "t", "execution_timeout_seconds": 0})
    assert_invalid(path, {"workflow_type": "t", "retry_policy": {"max_attempts": 2}})
    assert_invalid(path, {"input": []})


# ---------------------------------------------------------------------------------------------- OpenAPI

# The protocol's endpoint map (run-targeted variants and build-id verbs spelled out).
ENDPOINTS = {
    ("POST", "/api/worker/register"),
    ("POST", "/api/worker/heartbeat"),
    ("DELETE", "/api/worker/registrations/{worker_id}"),
    ("POST", "/api/worker/workflow-tasks/poll"),
    ("POST", "/api/worker/workflow-tasks/{task_id}/history"),
    ("POST", "/api/worker/workflow-tasks/{task_id}/heartbeat"),
    ("POST", "/api/worker/workflow-tasks/{task_id}/complete"),
    ("POST", "/api/worker/workflow-tasks/{task_id}/fail"),
    ("POST", "/api/worker/query-tasks/poll"),
    ("POST", "/api/worker/query-tasks/{query_task_id}/complete"),
    ("POST", "/api/worker/query-tasks/{query_task_id}/fail"),
    ("POST", "/api/worker/activity-tasks/poll"),
    ("POST", "/api/worker/activity-tasks/{task_id}/complete"),
    ("POST", "/api/worker/activity-tasks/{task_id}/fail"),
    ("POST", "/api/worker/activity-tasks/{task_id}/heartbeat"),
    ("POST", "/api/worker/activity-tasks/{task_id}/status"),
    ("POST", "/api/worker/workflow-tasks/{task_id}/deliver-cancellation"),
    ("POST", "/api/worker/sessions"),
    ("POST", "/api/worker/sessions/{session_id}/heartbeat"),
    ("DELETE", "/api/worker/sessions/{session_id}"),
    ("GET", "/api/worker-sessions"),
    ("GET", "/api/worker-sessions/{session_id}"),
    ("GET", "/api/cluster/info"),
    ("POST", "/api/workflows"),
    ("GET", "/api/workflows/{workflow_id}"),
    ("GET", "/api/workflows/{workflow_id}/runs"),
    ("GET", "/api/workflows/{workflow_id}/runs/{run_id}"),
    ("GET", "/api/workflows/{workflow_id}/runs/{run_id}/history"),
    ("POST", "/api/workflows/{workflow_id}/signal/{signal_name}"),
    ("POST", "/api/workflows/{workflow_id}/query/{query_name}"),
    ("POST", "/api/workflows/{workflow_id}/update/{update_name}"),
    ("POST", "/api/workflows/{workflow_id}/cancel"),
    ("POST", "/api/workflows/{workflow_id}/terminate"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/signal/{signal_name}"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/query/{query_name}"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/update/{update_name}"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/cancel"),
    ("POST", "/api/workflows/{workflow_id}/request-cancellation"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/request-cancellation"),
    ("POST", "/api/workflows/{workflow_id}/runs/{run_id}/terminate"),
    ("POST", "/api/task-queues/{queue}/build-ids/drain"),
    ("POST", "/api/task-queues/{queue}/build-ids/resume"),
    ("GET", "/api/health"),
    ("GET", "/api/ready"),
}

# Stable: the suite, reports and fuzz configuration refer to operations by these ids.
OPERATION_IDS = {
    "deliver_workflow_task_cancellation",
    "create_worker_session",
    "heartbeat_worker_session",
    "close_worker_session",
    "list_worker_sessions",
    "describe_worker_session",
    "register_worker",
    "heartbeat_worker",
    "deregister_worker",
    "poll_workflow_task",
    "fetch_workflow_task_history",
    "heartbeat_workflow_task",
    "complete_workflow_task",
    "fail_workflow_task",
    "poll_query_task",
    "complete_query_task",
    "fail_query_task",
    "poll_activity_task",
    "complete_activity_task",
    "fail_activity_task",
    "heartbeat_activity_task",
    "get_activity_task_status",
    "get_cluster_info",
    "start_workflow",
    "describe_workflow",
    "list_workflow_runs",
    "describe_workflow_run",
    "get_workflow_run_history",
    "signal_workflow",
    "query_workflow",
    "update_workflow",
    "cancel_workflow",
    "terminate_workflow",
    "signal_workflow_run",
    "query_workflow_run",
    "update_workflow_run",
    "cancel_workflow_run",
    "request_workflow_cancellation",
    "request_workflow_run_cancellation",
    "terminate_workflow_run",
    "drain_build_id",
    "resume_build_id",
    "get_health",
    "get_ready",
}
EXEMPT = {"/api/cluster/info", "/api/health", "/api/ready"}


def test_openapi_document_is_valid_openapi_3_1() -> None:
    doc = schemas.openapi()
    assert doc["openapi"] == "3.1.0"
    assert doc["jsonSchemaDialect"] == DIALECT
    validate_openapi(doc, base_uri=OPENAPI_URI)


def test_openapi_covers_the_endpoint_map() -> None:
    assert {(method, path) for method, path, _ in operations()} == ENDPOINTS


def test_operation_ids_are_stable_snake_case_and_unique() -> None:
    ids = [operation["operationId"] for _, _, operation in operations()]
    assert len(ids) == len(set(ids))
    assert set(ids) == OPERATION_IDS
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", i) for i in ids)


def test_version_headers_per_plane() -> None:
    doc = openapi_doc()
    for path, item in doc["paths"].items():
        refs = {p.get("$ref") for p in item.get("parameters", [])}
        headers = (
            "#/components/parameters/ProtocolVersion" in refs,
            "#/components/parameters/ControlPlaneVersion" in refs,
        )
        if path in EXEMPT:
            assert headers == (False, False), path
        elif path.startswith("/api/worker/"):
            assert headers == (True, False), path
        else:
            assert headers == (False, True), path
    for path in ("/api/health", "/api/ready"):
        assert doc["paths"][path]["get"]["security"] == []


def test_every_request_body_and_success_response_has_an_example() -> None:
    for method, path, operation in operations():
        if "requestBody" in operation:
            media = operation["requestBody"]["content"]["application/json"]
            assert media.get("examples") or "example" in media, f"{method} {path}: request example"
        successes = {s: r for s, r in operation["responses"].items() if s.startswith("2")}
        assert successes, f"{method} {path}: no success response"
        for status, resp in successes.items():
            media = resolve_component(resp)["content"]["application/json"]
            assert media.get("examples") or "example" in media, f"{method} {path} {status}: response example"


def test_error_responses_document_their_reasons() -> None:
    for method, path, operation in operations():
        for status, resp in operation["responses"].items():
            if status.startswith("2") or status == "415" or (path == "/api/ready" and status == "503"):
                continue
            resolved = resolve_component(resp)
            reasons = resolved.get("x-reasons")
            assert reasons, f"{method} {path} {status}: x-reasons missing"
            for reason in reasons:
                assert re.fullmatch(r"[a-z][a-z0-9_]*", reason), reason
                assert f"`{reason}`" in resolved["description"], f"{method} {path} {status}: {reason}"
            if path.startswith("/api/worker/"):
                assert "X-Durable-Workflow-Protocol-Version" in resolved["headers"]  # invariant 5


def test_worker_operations_document_the_common_errors() -> None:
    for method, path, operation in operations():
        if not path.startswith("/api/worker/"):
            continue
        statuses = set(operation["responses"])
        assert {"400", "401", "403", "404"} <= statuses, f"{method} {path}"
        reasons_404 = resolve_component(operation["responses"]["404"])["x-reasons"]
        assert "namespace_not_found" in reasons_404
        if "requestBody" in operation:
            assert "validation_failed" in resolve_component(operation["responses"]["422"])["x-reasons"]


OPENAPI_EXAMPLES = list(openapi_examples())


def test_openapi_has_examples() -> None:
    assert len(OPENAPI_EXAMPLES) >= 2 * len(ENDPOINTS)


@pytest.mark.parametrize(("pointer", "value"), OPENAPI_EXAMPLES, ids=[p for p, _ in OPENAPI_EXAMPLES])
def test_openapi_example_validates(pointer: str, value: Any) -> None:
    schema_validator = Draft202012Validator(
        {"$ref": f"{OPENAPI_URI}#{pointer}"},
        registry=registry(),
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in schema_validator.iter_errors(value)
    ]
    assert not errors, errors
