"""The Avro Value payload codec of worker protocol 1.20 (docs/reference.md: Codec).

Every payload that crosses the worker protocol is one Avro datum of the record
``durable_workflow.protocol.Value`` (a union of null, boolean, long, double, bytes, string, array and
map branches), written in Avro **single-object framing**::

    C3 01 | e2 a3 3d ff 55 80 22 37 | datum ...
    magic | CRC-64-AVRO fingerprint  | binary Avro encoding of one Value
          | of the schema's Parsing  |
          | Canonical Form, little-  |
          | endian                   |

On JSON documents the frame travels as standard base64 (RFC 4648 §4, with padding) inside an envelope
``{"codec": "avro", "blob": "<base64>"}``; every blob therefore starts with ``wwHioz3/VYAiN``.

The native value domain is ``None, bool, int (signed 64-bit), float (finite), bytes, str, list,
dict[str, ...]``; decoding yields the same domain. Nothing else is guessed or converted: a tuple, a set,
a ``bytearray`` or any other type is refused with :class:`UnsupportedValueType`, because decoding could
never give it back. Subclasses of the accepted types (``IntEnum``, ``OrderedDict``, ...) are encoded as
their base type.

Encoding goes through fastavro with one block per array or map and map entries in insertion order, which
reproduces every golden vector byte for byte. Decoding goes through fastavro too, but only after
:class:`_DatumScanner` has walked the datum and enforced the §13.3 decoder MUSTs that fastavro is lenient
about (it reads boolean byte ``02`` as true, a negative union index as a branch counted from the end,
NaN and infinities as floats, over-long varints as wrapped longs, and ignores trailing bytes), and capped
the nesting depth, because fastavro's C reader overflows the C stack (a segfault, not an exception) on a
frame of a few kilobytes that nests a few thousand arrays.

Only the packaged schema is read, once, at import; there is no other I/O and no clock.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, TypedDict, TypeGuard

import fastavro
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

import schemas
from suite.protocol.errors import (
    IntegerOverflow,
    InvalidMapKey,
    InvalidPayloadFraming,
    NonFiniteFloat,
    UnsupportedPayloadCodec,
    UnsupportedPayloadSchema,
    UnsupportedValueType,
)
from suite.protocol.wording import plural

__all__ = [
    "AVRO_CODEC",
    "FINGERPRINT",
    "GOLDEN_IMPLICIT_VALUES",
    "INT64_MAX",
    "INT64_MIN",
    "MAGIC",
    "MAX_DEPTH",
    "SCHEMA_CANONICAL_FORM",
    "Envelope",
    "Value",
    "decode_blob",
    "decode_envelope",
    "decode_value",
    "encode_blob",
    "encode_value",
    "golden_value",
    "is_envelope",
    "json_to_value",
    "make_envelope",
    "same_value",
    "value_to_json",
]

Value: TypeAlias = "bool | int | float | bytes | str | list[Value] | dict[str, Value] | None"
"""A native payload value: what :func:`decode_value` returns and :func:`encode_value` accepts."""


class Envelope(TypedDict):
    """An inline payload envelope, ``{"codec": "avro", "blob": <standard base64 of the frame>}``."""

    codec: str
    blob: str


AVRO_CODEC: Final = "avro"
"""The one payload codec of protocol v2 (§13.1). JSON is the document transport, never a codec."""

MAGIC: Final = b"\xc3\x01"
"""The two single-object-framing marker bytes that open every frame (§13.3)."""

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

MAX_DEPTH: Final = 256
"""How many arrays and maps may nest inside each other, on both sides of the codec.

The protocol sets no limit; this is an implementation guard. fastavro's C reader and writer recurse on
the C stack and segfault a little above a thousand levels, so a frame nesting deeper than this is
refused with :class:`InvalidPayloadFraming` before fastavro sees it, and a native value nesting deeper
(or containing itself) is refused with :class:`UnsupportedValueType`.
"""

_PINNED_FINGERPRINT: Final = bytes.fromhex("e2a33dff55802237")

_SCHEMA_JSON: Final[dict[str, Any]] = json.loads(schemas.load_text("avro/durable_workflow.protocol.Value.v1.avsc"))
SCHEMA_CANONICAL_FORM: Final[str] = to_parsing_canonical_form(_SCHEMA_JSON)
"""The Parsing Canonical Form of ``durable_workflow.protocol.Value``, the input of the fingerprint."""

# fastavro renders CRC-64-AVRO as the hex of the little-endian bytes, i.e. the wire order (§13.3).
FINGERPRINT: Final = bytes.fromhex(_fastavro_fingerprint(SCHEMA_CANONICAL_FORM, "CRC-64-AVRO"))
"""The 8 fingerprint bytes that follow the magic, ``e2a33dff55802237``."""

# Computed rather than copied so a changed schema file cannot go unnoticed; an explicit raise instead of
# ``assert`` so the guard survives ``python -O``.
if FINGERPRINT != _PINNED_FINGERPRINT:  # pragma: no cover - only a corrupted schema file gets here
    raise RuntimeError(
        f"the packaged Value schema fingerprints to {FINGERPRINT.hex()}, not the pinned "
        f"{_PINNED_FINGERPRINT.hex()} of the protocol's Avro Value schema; restore schemas/avro/ from a release of "
        "the suite"
    )

_HEADER: Final = MAGIC + FINGERPRINT
_HEADER_LEN: Final = len(_HEADER)
_PARSED_SCHEMA: Final = fastavro.parse_schema(_SCHEMA_JSON)

# The union branches of Value.value, in schema order: the index is the zigzag varint written first (§13.2).
_NS: Final = "durable_workflow.protocol."
_BOOLEAN: Final = _NS + "BooleanValue"
_LONG: Final = _NS + "LongValue"
_DOUBLE: Final = _NS + "DoubleValue"
_BYTES: Final = _NS + "BytesValue"
_STRING: Final = _NS + "StringValue"
_ARRAY: Final = _NS + "ArrayValue"
_MAP: Final = _NS + "MapValue"
_NULL_INDEX, _BOOLEAN_INDEX, _LONG_INDEX, _DOUBLE_INDEX = 0, 1, 2, 3
_BYTES_INDEX, _STRING_INDEX, _ARRAY_INDEX, _MAP_INDEX = 4, 5, 6, 7

_DOUBLE_STRUCT: Final = struct.Struct("<d")


# --------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------


def encode_value(value: object) -> bytes:
    """Encode a native value as one single-object-framed Avro ``Value`` (magic, fingerprint, datum).

    Raises :class:`IntegerOverflow`, :class:`NonFiniteFloat`, :class:`InvalidMapKey` or
    :class:`UnsupportedValueType` (the §13.3 encoder MUSTs); nothing is ever stringified or coerced.
    """
    record = _to_record(value, 0)
    out = io.BytesIO()
    out.write(_HEADER)
    # fastavro writes each array and map as one counted block plus the 00 terminator and iterates dicts in
    # insertion order: exactly the encoder that reproduces the golden bytes (§13.4).
    fastavro.schemaless_writer(out, _PARSED_SCHEMA, record)
    return out.getvalue()


def encode_blob(value: object) -> str:
    """Encode a native value and return the frame as standard base64 with padding (§13.1)."""
    return base64.b64encode(encode_value(value)).decode("ascii")


def _to_record(value: object, depth: int) -> dict[str, Any]:
    """The fastavro datum of ``value``: ``{"value": None}`` or ``{"value": (branch name, fields)}``.

    The (name, fields) tuple notation selects the union branch directly, so fastavro never has to guess
    a branch by trying each record in turn.
    """
    if value is None:
        return {"value": None}
    # bool before int: bool is an int subclass, and True must travel as BooleanValue, never LongValue 1.
    if isinstance(value, bool):
        return {"value": (_BOOLEAN, {"boolean": value})}
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise IntegerOverflow(
                f"{_preview(value)} is outside the signed 64-bit range [{INT64_MIN}, {INT64_MAX}] of an "
                "Avro long; send it as a string or bytes instead"
            )
        return {"value": (_LONG, {"long": int(value)})}
    if isinstance(value, float):
        # §13.3 encoder MUST: "Non-finite floats are refused". Avro could carry them, the protocol does
        # not. -0.0 is finite and keeps its sign bit (golden `negative_zero`).
        if not math.isfinite(value):
            raise NonFiniteFloat(f"{value!r} is not a finite double; the Avro Value codec refuses NaN and ±Infinity")
        return {"value": (_DOUBLE, {"double": float(value)})}
    if isinstance(value, bytes):
        return {"value": (_BYTES, {"bytes": bytes(value)})}
    if isinstance(value, str):
        _check_text(value, "string")
        return {"value": (_STRING, {"string": str(value)})}
    if isinstance(value, list):
        _check_depth(depth)
        return {"value": (_ARRAY, {"items": [_to_record(item, depth + 1) for item in value]})}
    if isinstance(value, dict):
        _check_depth(depth)
        entries: dict[str, dict[str, Any]] = {}
        for key, item in value.items():
            # §13.3: map keys must be strings and are never stringified; {1: x} and {"1": x} differ.
            if not isinstance(key, str):
                raise InvalidMapKey(
                    f"map key {_preview(key)} is a {type(key).__name__}; Avro map keys are strings and are "
                    "never converted, so convert the key yourself"
                )
            _check_text(key, "map key")
            entries[str(key)] = _to_record(item, depth + 1)
        return {"value": (_MAP, {"entries": entries})}
    raise UnsupportedValueType(
        f"a {type(value).__name__} has no Avro Value branch; convert it to None, bool, int, float, bytes, "
        "str, list or dict[str, ...] first (a tuple becomes a list, a set a sorted list, ...)"
    )


def _preview(obj: object) -> str:
    """A bounded repr for error messages: a peer's multi-megabyte string must not become the message."""
    try:
        text = repr(obj)
    except ValueError:  # an int beyond sys.get_int_max_str_digits() cannot be rendered at all
        return f"<{type(obj).__name__} too large to print>"
    return text if len(text) <= 80 else text[:77] + "..."


def _check_depth(depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise UnsupportedValueType(
            f"the value nests more than {MAX_DEPTH} arrays and maps (or contains itself); flatten it"
        )


def _check_text(text: str, what: str) -> None:
    # A str holding a lone surrogate is not Unicode text and has no UTF-8 encoding; refuse it here with a
    # typed error instead of letting fastavro raise UnicodeEncodeError from deep inside the writer.
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnsupportedValueType(
            f"{what} {_preview(text)} holds a lone surrogate and cannot be encoded as UTF-8; fix the text first"
        ) from exc


# --------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------


def decode_value(data: bytes) -> Value:
    """Decode one single-object-framed Avro ``Value`` into a native value.

    Raises :class:`InvalidPayloadFraming` for a short frame, a wrong magic or a malformed datum, and
    :class:`UnsupportedPayloadSchema` for a fingerprint other than ``e2a33dff55802237`` (§13.3).
    """
    data = bytes(data)
    # §13.3: "Bytes shorter than 10, or a wrong magic: invalid_payload_framing."
    if len(data) < _HEADER_LEN:
        raise InvalidPayloadFraming(
            f"a frame is at least {_HEADER_LEN} bytes (magic c301 and an 8-byte fingerprint); got {len(data)}"
        )
    if data[:2] != MAGIC:
        raise InvalidPayloadFraming(
            f"a frame starts with the magic c301, this one with {data[:2].hex()}; is it really an Avro frame?"
        )
    # §13.3: "A fingerprint ≠ e2a33dff55802237: unsupported_payload_schema."
    if data[2:_HEADER_LEN] != FINGERPRINT:
        raise UnsupportedPayloadSchema(
            f"fingerprint {data[2:_HEADER_LEN].hex()} is not the durable_workflow.protocol.Value schema's "
            f"{FINGERPRINT.hex()}; only that schema is supported"
        )
    _DatumScanner(data, _HEADER_LEN).scan()
    try:
        record: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
            io.BytesIO(data[_HEADER_LEN:]), _PARSED_SCHEMA, None, return_record_name=True
        )
    except Exception as exc:  # pragma: no cover - the scanner accepts nothing fastavro refuses
        # Defence in depth: a peer's bytes must never surface as an untyped error (a 5xx on a server).
        raise InvalidPayloadFraming(f"the datum does not decode: {exc!r}") from exc
    return _from_record(record)


def _from_record(record: dict[str, Any]) -> Value:
    """The native value of a fastavro ``Value`` record read with ``return_record_name=True``."""
    branch = record["value"]
    if branch is None:
        return None
    name, fields = branch
    if name == _BOOLEAN:
        return bool(fields["boolean"])
    if name == _LONG:
        return int(fields["long"])
    if name == _DOUBLE:
        return float(fields["double"])
    if name == _BYTES:
        return bytes(fields["bytes"])
    if name == _STRING:
        return str(fields["string"])
    if name == _ARRAY:
        return [_from_record(item) for item in fields["items"]]
    if name == _MAP:
        return {str(key): _from_record(item) for key, item in fields["entries"].items()}
    raise InvalidPayloadFraming(f"fastavro returned unknown branch {name!r}")  # pragma: no cover


class _DatumScanner:
    """A strict walk over one binary ``Value`` datum that decides validity; fastavro then decodes it.

    It enforces, with :class:`InvalidPayloadFraming`, every §13.3 decoder MUST, including those fastavro
    1.13 does not: a boolean byte other than 00/01, a negative union index (fastavro indexes the branch
    list from the end), NaN and ±Infinity doubles, and trailing bytes after the datum. It also refuses
    what is not a valid Avro encoding at all even where fastavro wraps silently: a varint longer than 10
    bytes or outside 64 bits, a negative length, and a negative-count block whose byte size does not match
    its contents (the size exists so readers can skip the block; a wrong one makes readers disagree). And
    it caps nesting at :data:`MAX_DEPTH`, which keeps fastavro's recursive C reader off its stack limit.

    Duplicate map keys are accepted, the last one winning, as fastavro and Java Avro do: neither the Avro
    specification nor §13 forbids them.
    """

    def __init__(self, data: bytes, start: int) -> None:
        self.data = data
        self.pos = start

    def scan(self) -> None:
        self.value(0)
        # §13.3: trailing bytes after the datum are invalid_payload_framing (fastavro stops reading early).
        if self.pos != len(self.data):
            raise self.fail(f"{plural(len(self.data) - self.pos, 'trailing byte')} after the datum")

    def fail(self, detail: str, at: int | None = None) -> InvalidPayloadFraming:
        offset = self.pos if at is None else at
        return InvalidPayloadFraming(f"{detail} (frame offset {offset}; see docs/reference.md: Codec)")

    def take(self, count: int, what: str) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise self.fail(f"truncated datum: {what} needs {plural(count, 'byte')}, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def long(self, what: str) -> int:
        # An Avro long is a zigzag varint of at most 10 bytes whose payload fits in 64 bits.
        start = self.pos
        accumulated = 0
        for shift in range(0, 70, 7):
            if self.pos >= len(self.data):
                raise self.fail(f"truncated datum: the varint of the {what} runs past the end", start)
            byte = self.data[self.pos]
            self.pos += 1
            accumulated |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
        else:
            raise self.fail(f"the varint of the {what} is longer than 10 bytes", start)
        if accumulated >> 64:
            raise self.fail(f"the varint of the {what} does not fit in 64 bits", start)
        return (accumulated >> 1) ^ -(accumulated & 1)

    def length(self, what: str) -> int:
        start = self.pos
        size = self.long(f"{what} length")
        if size < 0:
            raise self.fail(f"negative {what} length {size}", start)
        return size

    def text(self, what: str) -> None:
        start = self.pos
        raw = self.take(self.length(what), what)
        # §13.3: invalid UTF-8 in a string or map key is invalid_payload_framing.
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"the {what} is not valid UTF-8: {exc.reason}", start) from exc

    def value(self, depth: int) -> None:
        start = self.pos
        index = self.long("union index")
        if index == _NULL_INDEX:
            return
        if index == _BOOLEAN_INDEX:
            # §13.2: "then one byte 00 or 01"; fastavro reads any non-zero byte as true.
            byte = self.take(1, "boolean")[0]
            if byte > 1:
                raise self.fail(f"boolean byte {byte:02x} is neither 00 nor 01", self.pos - 1)
        elif index == _LONG_INDEX:
            self.long("long")
        elif index == _DOUBLE_INDEX:
            at = self.pos
            (number,) = _DOUBLE_STRUCT.unpack(self.take(8, "double"))
            # §13.3: NaN or ±Infinity doubles are invalid_payload_framing; fastavro returns them as floats.
            if not math.isfinite(number):
                raise self.fail(f"double {number!r} is not finite", at)
        elif index == _BYTES_INDEX:
            self.take(self.length("bytes"), "bytes")
        elif index == _STRING_INDEX:
            self.text("string")
        elif index in (_ARRAY_INDEX, _MAP_INDEX):
            if depth >= MAX_DEPTH:
                raise self.fail(f"arrays and maps nest more than {MAX_DEPTH} deep", start)
            self.blocks(is_map=index == _MAP_INDEX, depth=depth + 1)
        else:
            # §13.3: an invalid union index is invalid_payload_framing. fastavro raises IndexError above 7
            # but silently picks a branch from the end for a negative index.
            raise self.fail(f"union index {index} is not a Value branch (0-7)", start)

    def blocks(self, *, is_map: bool, depth: int) -> None:
        # §13.2: standard Avro blocks; decoders accept several blocks and negative counts with a byte size.
        what = "map" if is_map else "array"
        while True:
            count = self.long(f"{what} block count")
            if count == 0:
                return
            size: int | None = None
            if count < 0:
                count = -count
                size = self.length(f"{what} block byte size")
            block_start = self.pos
            for _ in range(count):
                if is_map:
                    self.text("map key")
                self.value(depth)
            used = self.pos - block_start
            if size is not None and used != size:
                raise self.fail(
                    f"{what} block declares {plural(size, 'byte')}; its {plural(count, 'item')} use {used}",
                    block_start,
                )


# --------------------------------------------------------------------------------------------------
# Base64 and envelopes (§13.1)
# --------------------------------------------------------------------------------------------------


def decode_blob(blob: str) -> Value:
    """Decode an envelope ``blob``: strict standard base64 (padding required, no whitespace), then a frame."""
    if not isinstance(blob, str):
        raise InvalidPayloadFraming(f"a blob is a base64 string, not a {type(blob).__name__}")
    # §13.3: "Empty blob, or blob that is not base64: invalid_payload_framing."
    if not blob:
        raise InvalidPayloadFraming("the blob is empty; it must be the base64 of a whole frame")
    try:
        # validate=True refuses characters outside the standard alphabet (including whitespace and the
        # URL-safe -_) instead of skipping them; a missing padding is refused either way.
        data = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidPayloadFraming(f"the blob is not standard base64 with padding (RFC 4648 §4): {exc}") from exc
    return decode_value(data)


def make_envelope(value: object) -> Envelope:
    """``{"codec": "avro", "blob": <base64 frame of value>}``."""
    return {"codec": AVRO_CODEC, "blob": encode_blob(value)}


_INLINE_KEYS: Final = frozenset({"codec", "blob"})
_EXTERNAL_KEYS: Final = frozenset({"codec", "external_storage"})


def is_envelope(obj: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``obj`` is a payload envelope: exactly the keys {codec, blob} or {codec, external_storage}.

    §13.1: any other object, even one with extra keys next to ``codec`` and ``blob``, is a plain JSON value.
    """
    return isinstance(obj, Mapping) and frozenset(obj.keys()) in (_INLINE_KEYS, _EXTERNAL_KEYS)


def decode_envelope(obj: object) -> Value:
    """Decode an inline envelope. The codec is checked before anything is decoded (§13.1).

    Raises :class:`UnsupportedPayloadCodec` for a codec other than ``avro``, and
    :class:`InvalidPayloadFraming` for something that is not an inline envelope or a bad blob.
    """
    if not is_envelope(obj):
        raise InvalidPayloadFraming(
            "not a payload envelope: expected an object with exactly the keys codec and blob "
            "(or codec and external_storage)"
        )
    codec = obj["codec"]
    # §13.1: "An unknown codec is an error, and the format must never be guessed from the content."
    if codec != AVRO_CODEC:
        raise UnsupportedPayloadCodec(f"codec {_preview(codec)} is not supported; the only payload codec is 'avro'")
    if "external_storage" in obj:
        raise InvalidPayloadFraming(
            "an external_storage envelope carries no bytes; fetch the frame from storage and decode that"
        )
    return decode_blob(obj["blob"])


# --------------------------------------------------------------------------------------------------
# JSON views (control plane, §12.3)
# --------------------------------------------------------------------------------------------------


def json_to_value(obj: Any) -> Value:
    """Check a parsed JSON document (``json.loads`` output) against the native domain and copy it.

    Integers outside signed 64-bit raise :class:`IntegerOverflow`; ``NaN``/``Infinity`` literals (which
    ``json.loads`` accepts) raise :class:`NonFiniteFloat`; floats stay floats. A ``{"$type": "bytes"}``
    object stays a map: that spelling is an output-only view (:func:`value_to_json`), never guessed back.
    """
    return _json_to_value(obj, 0)


def _json_to_value(obj: Any, depth: int) -> Value:
    if obj is None or isinstance(obj, bool | int | float | str):
        # One set of rules: the encoder's range, finiteness and text checks decide (json.loads happily
        # returns 2**64, NaN, and lone surrogates from "\ud800" escapes).
        _to_record(obj, depth)
        return obj
    if isinstance(obj, list | dict):
        return _copy_container(obj, depth, _json_to_value, "JSON object key")
    raise UnsupportedValueType(f"a {type(obj).__name__} is not a JSON value")


def _copy_container(
    obj: list[Any] | dict[Any, Any], depth: int, copy: Callable[[Any, int], Any], key_name: str
) -> list[Any] | dict[str, Any]:
    """A list or map copied item by item with ``copy``, one level deeper; map keys must be valid text."""
    _check_depth(depth)
    if isinstance(obj, list):
        return [copy(item, depth + 1) for item in obj]
    out: dict[str, Any] = {}
    for key, item in obj.items():
        if not isinstance(key, str):
            raise InvalidMapKey(f"{key_name} {_preview(key)} is a {type(key).__name__}, not a string")
        _check_text(key, "map key")
        out[key] = copy(item, depth + 1)
    return out


def value_to_json(value: Value) -> Any:
    """A JSON-serialisable view of a native value; bytes become ``{"$type": "bytes", "base64": ...}``.

    The view is lossy (a map that happens to look like the bytes spelling is indistinguishable), which is
    why §12.3 makes only the ``*_envelope`` fields authoritative.
    """
    return _value_to_json(value, 0)


def _value_to_json(value: object, depth: int) -> Any:
    if isinstance(value, bytes):
        return {"$type": "bytes", "base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, list | dict):
        return _copy_container(value, depth, _value_to_json, "map key")
    if value is None or isinstance(value, bool | int | float | str):
        _to_record(value, depth)  # the same range, finiteness and text checks as the encoder
        return value
    raise UnsupportedValueType(f"a {type(value).__name__} has no Avro Value branch")


# -- the golden vectors (schemas/avro/avro-value-v1-golden.json, docs/reference.md: Codec) -------------------

GOLDEN_IMPLICIT_VALUES: Final[dict[str, Value]] = {
    "null": None,
    "array": [None, True, 7, 7.0, b"\x00\xff", "text"],
    "map": {"a": 1, "b": [False]},
    "map_empty": {},
    "map_key_0": {"0": "zero"},
    "map_keys_0_1": {"0": "zero", "1": "one"},
    "nested": {"items": [{"enabled": True}, b"bytes", -2.5]},
    "nested_map_list": {"outer": [{"left": 1, "right": b"x"}], "tail": "done"},
}
"""Appendix D's decoded values of the golden cases (and alternate map orders) the file gives no ``value``."""


def golden_value(case: Mapping[str, Any]) -> Any:
    """A golden case's decoded value: longs and -0.0 are strings in the file, bytes are in ``value_base64``,
    and the cases without a ``value`` are :data:`GOLDEN_IMPLICIT_VALUES`."""
    if "value_base64" in case:
        return base64.b64decode(case["value_base64"])
    if "value" not in case:
        return GOLDEN_IMPLICIT_VALUES[case["name"]]
    value = case["value"]
    if case["kind"] == "long":
        return int(value)
    if case["kind"] == "double":
        return float(value)
    return value


def same_value(a: Any, b: Any) -> bool:
    """Equality that tells 7 from 7.0, True from 1 and -0.0 from 0.0 (the golden negative_zero case)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)
