"""The normative data of worker protocol 1.20: JSON Schemas, the OpenAPI document, the Avro schema and
golden vectors.

Everything is read through :mod:`importlib.resources`, so it works from an installed wheel as well as
from a checkout. Reading packaged data is the only I/O here; the pure protocol model builds on it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["list_json_schemas", "load_json", "load_text", "openapi", "schema_id"]

SCHEMA_BASE_URI = "https://durable-workflow.dev/conformance/schemas/"


def load_text(path: str) -> str:
    """Return the text of a packaged data file, ``path`` relative to this package (``avro/x.avsc``)."""
    node = resources.files(__name__)
    for part in path.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


@cache
def _load_json_cached(path: str) -> str:
    return load_text(path)


def load_json(path: str) -> Any:
    """Parse a packaged JSON file. A fresh object is returned on every call, so callers may mutate it."""
    return json.loads(_load_json_cached(path))


def list_json_schemas() -> list[str]:
    """Every JSON Schema file under ``json/``, as paths relative to this package, sorted."""
    found: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for child in node.iterdir():
            name = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, name + "/")
            elif child.name.endswith(".schema.json"):
                found.append(name)

    walk(resources.files(__name__).joinpath("json"), "json/")
    return sorted(found)


def schema_id(path: str) -> str:
    """The ``$id`` a schema file under ``json/`` carries: the base URI plus its path below ``json/``."""
    return SCHEMA_BASE_URI + path.removeprefix("json/")


@cache
def _openapi_text() -> str:
    return load_text("openapi.yaml")


@cache
def _openapi_json() -> str:
    import yaml

    # libyaml's loader reads the same document about 30 times faster than the pure-Python one; its objects are
    # still built in Python, so the parse is done once per process and kept as JSON, which parses in C.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc = yaml.load(_openapi_text(), Loader=loader)
    assert isinstance(doc, dict)
    return json.dumps(doc)


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the whole HTTP surface, parsed. A fresh object on every call (callers may
    mutate it)."""
    doc = json.loads(_openapi_json())
    assert isinstance(doc, dict)
    return doc
