"""Validate every response the suite receives against ``schemas/``.

The OpenAPI document maps (method, path, status) to the message schema; the JSON Schemas are loaded
into one ``referencing`` registry keyed by their ``$id``. A violation is reported with the JSON path
and the offending value, e.g. ``$.task.workflow_task_attempt: 0 is less than the minimum of 1``.

``jsonschema`` is the judge. Running it on every answer of a run (thousands) costs more CPU than the answers
themselves, so each schema is also compiled (:func:`compile_schema`) into one predicate that answers the same
"valid or not" for the keywords the schemas use, with jsonschema's own semantics (types, JSON equality, Python's
``re.search``); a schema using any other keyword jsonschema validates is not compiled. A body the predicate
accepts is valid; any other is handed to jsonschema, which says what is wrong.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import schemas

__all__ = ["Predicate", "ResponseValidator", "Unsupported", "compile_schema", "json_equal", "schema_registry"]

Predicate = Callable[[Any], bool]


def _ref_to_id(ref: str) -> str:
    """``./json/worker/x.schema.json#/…`` (relative to openapi.yaml) → the schema's ``$id``."""
    path, _, fragment = ref.partition("#")
    path = path.removeprefix("./")
    uri = schemas.schema_id(path) if path.startswith("json/") else path
    return uri + ("#" + fragment if fragment else "")


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
                out[key] = _ref_to_id(value)
            else:
                out[key] = _rewrite_refs(value)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


@cache
def schema_registry() -> Registry[Any]:
    resources = []
    for path in schemas.list_json_schemas():
        doc = schemas.load_json(path)
        resources.append((doc.get("$id", schemas.schema_id(path)), Resource.from_contents(doc, DRAFT202012)))
    return Registry().with_resources(resources)


# -- the compiled predicate ----------------------------------------------------------------------------------


class Unsupported(Exception):
    """The schema uses a keyword the compiler does not implement (jsonschema alone judges it)."""


def json_equal(one: Any, two: Any) -> bool:
    """Equality as JSON Schema (and jsonschema) has it: ``true`` is not ``1``, in arrays and objects too."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(json_equal(i, j) for i, j in zip(one, two, strict=True))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return len(one) == len(two) and all(k in two and json_equal(v, two[k]) for k, v in one.items())
    if isinstance(one, bool) or isinstance(two, bool):
        return isinstance(one, bool) and isinstance(two, bool) and one == two
    return bool(one == two)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


TYPES: dict[str, Predicate] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": _is_number,
    # Draft 6 and later: 1.0 is an integer.
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer()),
}
# Keywords jsonschema validates that assert nothing here: ``format`` without a format checker (as ResponseValidator
# builds its validators). Any other keyword jsonschema does not validate — then, else, minContains, maxContains
# (read by if and contains), titles, descriptions, $defs, OpenAPI's own words — asserts nothing either.
NOT_ASSERTED = frozenset({"format"})


def _all(checks: list[Predicate]) -> Predicate:
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(check(x) for check in checks)


class _Compiler:
    def __init__(self) -> None:
        # Per schema object (kept alive beside its predicate): what a $ref to it compiled to; a reference that
        # loops back calls the predicate through the cell filled once it is compiled.
        self._done: dict[int, tuple[Any, Predicate]] = {}

    def compile(self, schema: Any, resolver: Any) -> Predicate:
        if schema is True:
            return lambda x: True
        if schema is False:
            return lambda x: False
        if not isinstance(schema, dict):
            raise Unsupported(f"a schema that is a {type(schema).__name__}")
        if "$id" in schema:
            resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
        checks: list[Predicate] = []
        for key, value in schema.items():
            build = _KEYWORDS.get(key)
            if build is not None:
                checks.append(build(self, value, schema, resolver))
            elif key in Draft202012Validator.VALIDATORS and key not in NOT_ASSERTED:
                raise Unsupported(key)
        return _all(checks)

    def ref(self, ref: str, resolver: Any) -> Predicate:
        resolved = resolver.lookup(ref)
        target = resolved.contents
        known = self._done.get(id(target))
        if known is not None:
            return known[1]
        cell: list[Predicate] = []
        self._done[id(target)] = (target, lambda x: cell[0](x))
        check = self.compile(target, resolved.resolver)
        cell.append(check)
        self._done[id(target)] = (target, check)
        return check


Builder = Callable[[_Compiler, Any, dict[str, Any], Any], Predicate]


def _type(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    names = [value] if isinstance(value, str) else list(value)
    if any(name not in TYPES for name in names):
        raise Unsupported(f"type {value!r}")
    tests = [TYPES[name] for name in names]
    return tests[0] if len(tests) == 1 else lambda x: any(t(x) for t in tests)


def _properties(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    props = [(name, c.compile(sub, r)) for name, sub in value.items()]
    return lambda x: not isinstance(x, dict) or all(name not in x or check(x[name]) for name, check in props)


def _pattern_properties(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    pats = [(pattern, c.compile(sub, r)) for pattern, sub in value.items()]
    return lambda x: (
        not isinstance(x, dict)
        or all(check(v) for pattern, check in pats for k, v in x.items() if re.search(pattern, k))
    )


def _additional_properties(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    known = schema.get("properties", {})
    patterns = "|".join(schema.get("patternProperties", {}))

    def extras(x: dict[str, Any]) -> list[str]:
        return [k for k in x if k not in known and not (patterns and re.search(patterns, k))]

    if isinstance(value, dict):
        check = c.compile(value, r)
        return lambda x: not isinstance(x, dict) or all(check(x[k]) for k in extras(x))
    if value:
        return lambda x: True
    return lambda x: not isinstance(x, dict) or not extras(x)


def _required(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    names = list(value)
    return lambda x: not isinstance(x, dict) or all(name in x for name in names)


def _items(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    prefix = [c.compile(sub, r) for sub in schema.get("prefixItems", [])]
    rest = c.compile(value, r)
    return lambda x: (
        not isinstance(x, list)
        or (
            all(check(item) for check, item in zip(prefix, x, strict=False))
            and all(rest(item) for item in x[len(prefix) :])
        )
    )


def _prefix_items(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    if "items" in schema:
        return lambda x: True  # judged with items
    prefix = [c.compile(sub, r) for sub in value]
    return lambda x: not isinstance(x, list) or all(check(item) for check, item in zip(prefix, x, strict=False))


def _contains(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    check = c.compile(value, r)
    low, high = schema.get("minContains", 1), schema.get("maxContains")

    def contains(x: Any) -> bool:
        if not isinstance(x, list):
            return True
        matches = sum(1 for item in x if check(item))
        return low <= matches and (high is None or matches <= high)

    return contains


def _unique_items(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    # jsonschema's own uniqueness (sorted, or pairwise with its equality): judged by it, on this keyword alone.
    only = Draft202012Validator({"uniqueItems": value})
    return lambda x: not isinstance(x, list) or only.is_valid(x)


def _dependent_required(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    deps = [(name, list(needed)) for name, needed in value.items()]
    return lambda x: (
        not isinstance(x, dict) or all(name not in x or all(n in x for n in needed) for name, needed in deps)
    )


def _dependent_schemas(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    deps = [(name, c.compile(sub, r)) for name, sub in value.items()]
    return lambda x: not isinstance(x, dict) or all(name not in x or check(x) for name, check in deps)


def _if(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    test = c.compile(value, r)
    then = c.compile(schema["then"], r) if "then" in schema else None
    other = c.compile(schema["else"], r) if "else" in schema else None
    return lambda x: (then is None or then(x)) if test(x) else (other is None or other(x))


def _all_of(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    return _all([c.compile(sub, r) for sub in value])


def _any_of(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    checks = [c.compile(sub, r) for sub in value]
    return lambda x: any(check(x) for check in checks)


def _one_of(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    checks = [c.compile(sub, r) for sub in value]
    return lambda x: sum(1 for check in checks if check(x)) == 1


def _not(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    check = c.compile(value, r)
    return lambda x: not check(x)


def _const(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    return lambda x: json_equal(x, value)


def _enum(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    options = list(value)
    return lambda x: any(json_equal(option, x) for option in options)


def _ref(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
    return c.ref(value, r)


def _bound(test: Callable[[Any, Any], bool], kind: Predicate) -> Builder:
    """A keyword bounding one kind of instance (numbers, strings' or arrays' or objects' sizes)."""

    def build(c: _Compiler, value: Any, schema: dict[str, Any], r: Any) -> Predicate:
        return lambda x: not kind(x) or test(x, value)

    return build


def _string(x: Any) -> bool:
    return isinstance(x, str)


_KEYWORDS: dict[str, Builder] = {
    "type": _type,
    "properties": _properties,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "required": _required,
    "items": _items,
    "prefixItems": _prefix_items,
    "contains": _contains,
    "uniqueItems": _unique_items,
    "dependentRequired": _dependent_required,
    "dependentSchemas": _dependent_schemas,
    "if": _if,
    "allOf": _all_of,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "not": _not,
    "const": _const,
    "enum": _enum,
    "$ref": _ref,
    "minimum": _bound(lambda x, v: not x < v, _is_number),
    "maximum": _bound(lambda x, v: not x > v, _is_number),
    "exclusiveMinimum": _bound(lambda x, v: not x <= v, _is_number),
    "exclusiveMaximum": _bound(lambda x, v: not x >= v, _is_number),
    "minLength": _bound(lambda x, v: not len(x) < v, _string),
    "maxLength": _bound(lambda x, v: not len(x) > v, _string),
    "pattern": _bound(lambda x, v: re.search(v, x) is not None, _string),
    "minItems": _bound(lambda x, v: not len(x) < v, TYPES["array"]),
    "maxItems": _bound(lambda x, v: not len(x) > v, TYPES["array"]),
    "minProperties": _bound(lambda x, v: not len(x) < v, TYPES["object"]),
    "maxProperties": _bound(lambda x, v: not len(x) > v, TYPES["object"]),
}


def compile_schema(schema: Any, registry: Registry[Any]) -> Predicate:
    """One predicate that says whether an instance is valid against ``schema`` (its ``$ref`` resolved in
    ``registry``) exactly as ``Draft202012Validator(schema, registry=registry).is_valid`` does, without a
    format checker; :class:`Unsupported` for a schema using a keyword jsonschema validates that is not compiled."""
    root = registry.resolver_with_root(DRAFT202012.create_resource(schema))
    return _Compiler().compile(schema, root)


# -- the validator --------------------------------------------------------------------------------------------


class ResponseValidator:
    """Callable ``(method, path, status, body) -> [problems]`` for :class:`suite.client.ProtocolClient`."""

    def __init__(self) -> None:
        doc = schemas.openapi()
        self._components = doc.get("components", {})
        self._ops: list[tuple[re.Pattern[str], str, dict[str, Any]]] = []
        self._templates: list[str] = []
        for template, item in doc.get("paths", {}).items():
            pattern = re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", template) + "$")
            for method, op in item.items():
                if method in ("get", "post", "put", "delete", "patch") and isinstance(op, dict):
                    self._ops.append((pattern, method.upper(), op))
                    self._templates.append(template)
        # Per response schema (by identity: the document's own objects, kept alive by it): jsonschema's validator,
        # and the compiled predicate (None: the schema is jsonschema's alone).
        self._validators: dict[int, tuple[Draft202012Validator, Predicate | None]] = {}

    def schema_for(self, method: str, path: str, status: int) -> dict[str, Any] | None:
        """The schema documented for an answer (a concrete path, or a template), ``None`` when none is."""
        for pattern, m, op in self._ops:
            if m == method and pattern.match(path):
                responses = op.get("responses", {})
                resp = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX") or responses.get("default")
                if resp is None:
                    return None
                resp = self._deref_component(resp)
                content = resp.get("content", {}).get("application/json", {})
                schema = content.get("schema")
                return self._deref_component(schema) if isinstance(schema, dict) else None
        return None

    def checked_schema(self, method: str, path: str, status: int) -> dict[str, Any] | None:
        """:meth:`schema_for` as an answer is validated against it: references to the JSON Schema files rewritten
        to their ``$id``."""
        schema = self.schema_for(method, path, status)
        return None if schema is None else dict(_rewrite_refs(schema))

    def response_schemas(self) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
        """Every documented JSON response: (method, path template, status, its schema as validated: references
        to the JSON Schema files rewritten to their ``$id``)."""
        for (_, method, op), template in zip(self._ops, self._templates, strict=True):
            for status, resp in op.get("responses", {}).items():
                content = self._deref_component(resp).get("content", {}).get("application/json", {})
                schema = self._deref_component(content.get("schema"))
                if isinstance(schema, dict):
                    yield method, template, str(status), _rewrite_refs(schema)

    def _deref_component(self, node: Any) -> Any:
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/components/"):
            parts = node["$ref"].removeprefix("#/components/").split("/")
            target: Any = self._components
            for part in parts:
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = target
        return node

    def __call__(self, method: str, path: str, status: int, body: Any) -> list[str]:
        schema = self.schema_for(method, path.split("?")[0], status)
        if schema is None:
            return []
        known = self._validators.get(id(schema))
        if known is None:
            rewritten = _rewrite_refs(schema)
            try:
                fast: Predicate | None = compile_schema(rewritten, schema_registry())
            except Unsupported:
                fast = None
            known = self._validators[id(schema)] = (Draft202012Validator(rewritten, registry=schema_registry()), fast)
        validator, fast = known
        if fast is not None and fast(body):
            return []
        problems = []
        for err in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))[:5]:
            value = repr(err.instance)
            problems.append(
                f"{err.json_path}: {err.message if len(err.message) < 300 else err.message[:300]}"
                + ("" if value in err.message else f" (value {value[:120]})")
            )
        return problems
