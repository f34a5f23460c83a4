"""The OpenAPI document as the fuzzer reads it: its operations, the Schemathesis schema loaded from the packaged
file, and the generator of valid Avro payloads its ``durable-workflow-avro-value`` format names."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import schemathesis
from hypothesis import strategies as st

from suite.protocol.codec import INT64_MAX, INT64_MIN, encode_blob

__all__ = ["AVRO_VALUE_FORMAT", "Operation", "avro_values", "load_schema", "operations", "validator"]

AVRO_VALUE_FORMAT: Final = "durable-workflow-avro-value"


@dataclass(frozen=True)
class Operation:
    """One operation of the document, as the checks need it."""

    op_id: str
    method: str
    path: str
    plane: str  # worker | control | discovery (the operation's first tag)
    statuses: frozenset[int]
    optional: bool
    summary: str


@functools.cache
def operations() -> dict[str, Operation]:
    """Every operation of ``schemas/openapi.yaml`` by ``operationId``."""
    import schemas

    found: dict[str, Operation] = {}
    for path, item in schemas.openapi()["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "delete", "patch") or not isinstance(op, dict):
                continue
            statuses = frozenset(int(code) for code in op.get("responses", {}) if str(code).isdigit())
            tags = op.get("tags") or ["control"]
            found[op["operationId"]] = Operation(
                op_id=op["operationId"],
                method=method.upper(),
                path=path,
                plane=str(tags[0]),
                statuses=statuses,
                optional=bool(op.get("x-optional")),
                summary=str(op.get("summary", "")),
            )
    return found


def avro_values() -> st.SearchStrategy[Any]:
    """Native values the Avro ``Value`` schema can carry (§13.2): null, booleans, 64-bit longs, finite
    doubles, bytes, Unicode text, and arrays and string-keyed maps of them."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(INT64_MIN, INT64_MAX)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.binary(max_size=12)
        | st.text(max_size=12)  # st.text never draws lone surrogates, which UTF-8 cannot encode
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=8,
    )


_LOCK = threading.Lock()


@functools.cache
def load_schema() -> Any:
    """The document as a Schemathesis schema, loaded from its packaged file so the relative ``$ref`` to
    ``./json/*.schema.json`` resolve (the files are real files in a checkout and in site-packages).

    The ``durable-workflow-avro-value`` format gets a generator of valid single-object Avro frames, so a
    positive payload really is a payload."""
    with _LOCK:
        schemathesis.openapi.format(AVRO_VALUE_FORMAT, avro_values().map(encode_blob))
        # The real file path (a checkout, or site-packages for a wheel): Schemathesis resolves the relative
        # $refs against it, lazily, so the JSON Schema files must stay where they are.
        path = resources.files("schemas").joinpath("openapi.yaml")
        return schemathesis.openapi.from_path(str(path))


@functools.cache
def validator() -> Any:
    from suite.schema_check import ResponseValidator

    return ResponseValidator()
