"""Validate every response the suite receives against ``schemas/``.

The OpenAPI document maps (method, path, status) to the message schema; the JSON Schemas are loaded
into one ``referencing`` registry keyed by their ``$id``. A violation is reported with the JSON path
and the offending value, e.g. ``$.task.workflow_task_attempt: 0 is less than the minimum of 1``.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import schemas

__all__ = ["ResponseValidator", "schema_registry"]


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


class ResponseValidator:
    """Callable ``(method, path, status, body) -> [problems]`` for :class:`suite.client.ProtocolClient`."""

    def __init__(self) -> None:
        doc = schemas.openapi()
        self._components = doc.get("components", {})
        self._ops: list[tuple[re.Pattern[str], str, dict[str, Any]]] = []
        for template, item in doc.get("paths", {}).items():
            pattern = re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", template) + "$")
            for method, op in item.items():
                if method in ("get", "post", "put", "delete", "patch") and isinstance(op, dict):
                    self._ops.append((pattern, method.upper(), op))
        self._validators: dict[str, Draft202012Validator] = {}

    def _schema_for(self, method: str, path: str, status: int) -> dict[str, Any] | None:
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

    def _deref_component(self, node: Any) -> Any:
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/components/"):
            parts = node["$ref"].removeprefix("#/components/").split("/")
            target: Any = self._components
            for part in parts:
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = target
        return node

    def __call__(self, method: str, path: str, status: int, body: Any) -> list[str]:
        schema = self._schema_for(method, path.split("?")[0], status)
        if schema is None:
            return []
        key = repr(sorted(schema.items())) if "$ref" not in schema else schema["$ref"]
        validator = self._validators.get(key)
        if validator is None:
            validator = Draft202012Validator(_rewrite_refs(schema), registry=schema_registry())
            self._validators[key] = validator
        problems = []
        for err in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))[:5]:
            value = repr(err.instance)
            problems.append(
                f"{err.json_path}: {err.message if len(err.message) < 300 else err.message[:300]}"
                + ("" if value in err.message else f" (value {value[:120]})")
            )
        return problems
