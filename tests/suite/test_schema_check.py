"""Response validation: the compiled predicate of every response schema says "valid" exactly when jsonschema does.

The predicate (``suite.schema_check.compile_schema``) only ever shortens the way to jsonschema's verdict: a body it
accepts is not handed to jsonschema. So every response schema of ``schemas/openapi.yaml`` compiles; on real answers
of the reference server — each then broken in one place, however deep: a value replaced, a key dropped, a number
nudged — and on arbitrary JSON, the predicate and ``Draft202012Validator.is_valid`` agree, body for body; and each
keyword alone is shown rejecting what jsonschema rejects.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from suite.schema_check import ResponseValidator, Unsupported, compile_schema, json_equal, schema_registry

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.sampled_from([0, 1, -1, 1.0, 0.5, "", "x"])
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
RESPONSES = [(f"{m} {t} {s}", schema) for m, t, s, schema in ResponseValidator().response_schemas()]
# Answers of the reference server during a run of the suite, one or two per distinct response schema, each valid
# against its schema when recorded (ResponseValidator's calls, bodies under 4 KB): the near-valid bodies the
# mutations below start from. Regenerate by recording those calls in a run of ``pytest --target=embedded``.
CORPUS: list[dict[str, Any]] = json.loads(gzip.decompress((Path(__file__).parent / "responses.json.gz").read_bytes()))


@st.composite
def broken(draw: st.DrawFn, body: Any) -> Any:
    """``body`` with one place changed: a value replaced (by JSON, a nudged number, another type), a key dropped."""
    if not isinstance(body, dict | list) or not body or draw(st.integers(0, 4)) == 0:
        return draw(st.one_of(JSON, _nudged(body)))
    key = draw(st.sampled_from(list(body) if isinstance(body, dict) else list(range(len(body)))))
    copy: Any = dict(body) if isinstance(body, dict) else list(body)
    if isinstance(copy, dict) and draw(st.integers(0, 3)) == 0:
        del copy[key]
        return copy
    copy[key] = draw(broken(copy[key]))
    return copy


def _nudged(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return st.sampled_from([value, None, 0, "", [], {}])
    return st.sampled_from([value - 1, value + 1, float(value), -value, str(value), bool(value)])


def test_every_response_schema_compiles() -> None:
    assert len(RESPONSES) > 50
    for name, schema in RESPONSES:
        try:
            compile_schema(schema, schema_registry())
        except Unsupported as exc:  # pragma: no cover - the failure names the keyword
            pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize("entry", CORPUS, ids=[f"{e['method']} {e['path']} {e['status']}" for e in CORPUS])
def test_the_predicate_agrees_with_jsonschema_around_real_answers(entry: dict[str, Any]) -> None:
    schema = ResponseValidator().checked_schema(entry["method"], entry["path"], entry["status"])
    assert schema is not None
    registry = schema_registry()
    fast = compile_schema(schema, registry)
    judge = Draft202012Validator(schema, registry=registry)
    assert judge.is_valid(entry["body"])
    assert fast(entry["body"])

    @settings(max_examples=80, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(broken(entry["body"]) | JSON)
    def agree(body: Any) -> None:
        assert fast(body) == judge.is_valid(body), body

    agree()


def test_the_corpus_covers_the_documents_response_schemas() -> None:
    validator = ResponseValidator()
    covered = {
        json.dumps(validator.checked_schema(e["method"], e["path"], e["status"]), sort_keys=True) for e in CORPUS
    }
    documented = {json.dumps(schema, sort_keys=True) for _, schema in RESPONSES}
    assert len(covered & documented) >= 0.9 * len(documented)


def test_the_predicate_rejects_what_jsonschema_rejects_by_each_keyword() -> None:
    """One body per keyword the compiler knows, invalid by that keyword alone (a compiler that skipped it fails)."""
    cases: list[tuple[dict[str, Any], Any, Any]] = [
        ({"type": "integer"}, 1.0, True),
        ({"type": ["string", "null"]}, None, 0),
        ({"properties": {"a": {"type": "string"}}}, {"a": "x"}, {"a": 1}),
        ({"patternProperties": {"^x": {"type": "string"}}}, {"xa": "1"}, {"xa": 1}),
        ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1}, {"a": 1, "b": 2}),
        ({"additionalProperties": {"type": "string"}}, {"b": "x"}, {"b": 2}),
        ({"required": ["a"]}, {"a": None}, {}),
        ({"items": {"type": "integer"}}, [1, 2], [1, "2"]),
        ({"prefixItems": [{"type": "string"}], "items": False}, ["a"], ["a", "b"]),
        ({"contains": {"const": 1}, "maxContains": 1}, [1, 2], [1, 1]),
        ({"uniqueItems": True}, [1, True], [{"a": 1}, {"a": 1.0}]),
        ({"dependentRequired": {"a": ["b"]}}, {"b": 1}, {"a": 1}),
        ({"dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1, "b": 1}, {"a": 1}),
        ({"if": {"const": 1}, "then": {"type": "integer"}, "else": {"type": "string"}}, "x", 2),
        ({"allOf": [{"minimum": 1}, {"maximum": 3}]}, 2, 4),
        ({"anyOf": [{"type": "string"}, {"minimum": 5}]}, 6, 4),
        ({"oneOf": [{"minimum": 1}, {"maximum": 3}]}, 5, 2),
        ({"not": {"type": "null"}}, 0, None),
        ({"const": 1}, 1.0, True),
        ({"enum": [[0], {"a": False}]}, {"a": False}, [False]),
        ({"exclusiveMinimum": 1, "exclusiveMaximum": 3}, 2, 3),
        ({"minLength": 2, "maxLength": 3}, "ab", "a"),
        ({"pattern": "^a+$"}, "aa", "ab"),
        ({"minItems": 1, "maxItems": 1}, [0], []),
        ({"minProperties": 1, "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
        ({"format": "date-time", "type": "string"}, "not a date", 1),
    ]
    for schema, good, bad in cases:
        fast = compile_schema(schema, schema_registry())
        judge = Draft202012Validator(schema)
        assert (judge.is_valid(good), fast(good)) == (True, True), schema
        assert (judge.is_valid(bad), fast(bad)) == (False, False), schema


def test_a_keyword_the_compiler_does_not_know_leaves_the_schema_to_jsonschema() -> None:
    with pytest.raises(Unsupported):
        compile_schema({"properties": {"a": {"multipleOf": 2}}}, schema_registry())
    compile_schema({"title": "t", "x-vendor": 1, "then": {}}, schema_registry())  # annotations only


def test_json_equality_keeps_booleans_apart_from_numbers() -> None:
    assert json_equal(1, 1.0)
    assert not json_equal(1, True)
    assert not json_equal([0], [False])
    assert json_equal({"a": [1]}, {"a": [1.0]})
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})
