"""Unit tests of the Avro Value codec (docs/reference.md: Codec) against the golden vectors and by property."""

from __future__ import annotations

import base64
import enum
import inspect
import json
import math
import re
import struct
from collections import OrderedDict
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from suite.protocol import codec, errors
from suite.protocol.codec import (
    FINGERPRINT,
    GOLDEN_IMPLICIT_VALUES,
    INT64_MAX,
    INT64_MIN,
    MAGIC,
    MAX_DEPTH,
    decode_blob,
    decode_envelope,
    decode_value,
    encode_blob,
    encode_value,
    golden_value,
    is_envelope,
    json_to_value,
    make_envelope,
    value_to_json,
)

GOLDEN: dict[str, Any] = schemas.load_json("avro/avro-value-v1-golden.json")
HEADER = bytes.fromhex("c301e2a33dff55802237")

APPENDIX_D = {k: v for k, v in GOLDEN_IMPLICIT_VALUES.items() if k != "nested_map_list"}
APPENDIX_D_ALTERNATE = {"nested_map_list": GOLDEN_IMPLICIT_VALUES["nested_map_list"]}

ERRORS_BY_CODE: dict[str, type[errors.CodecError]] = {
    "invalid_payload_framing": errors.InvalidPayloadFraming,
    "unsupported_payload_schema": errors.UnsupportedPayloadSchema,
}


def expected_value(case: dict[str, Any]) -> Any:
    return golden_value(case)


def strict(value: Any) -> Any:
    """A comparison key that tells bool from int, -0.0 from 0.0 and one map order from another."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, list):
        return ("list", [strict(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(key, strict(item)) for key, item in value.items()])
    return (type(value).__name__, value)


def varint(number: int) -> bytes:
    """Zigzag varint of a signed 64-bit long, written independently of the codec."""
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def datum(value: Any) -> bytes:
    return encode_value(value)[len(HEADER) :]


# --------------------------------------------------------------------------------------------------
# Golden vectors (§13.4)
# --------------------------------------------------------------------------------------------------


def test_golden_file_shape() -> None:
    assert GOLDEN["fingerprint"] == FINGERPRINT.hex() == "e2a33dff55802237"
    assert GOLDEN["magic_hex"] == MAGIC.hex() == "c301"
    assert len(GOLDEN["cases"]) == 16
    assert len(GOLDEN["alternate_map_orders"]) == 1
    assert len(GOLDEN["malformed_frames"]) == 18
    without_value = {c["name"] for c in GOLDEN["cases"] if "value" not in c and "value_base64" not in c}
    assert without_value == set(APPENDIX_D)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_golden_case_decodes_and_reencodes_byte_for_byte(case: dict[str, Any]) -> None:
    wire = base64.b64decode(case["wire_base64"])
    decoded = decode_value(wire)
    assert strict(decoded) == strict(expected_value(case))
    assert encode_value(decoded) == wire
    assert encode_value(expected_value(case)) == wire
    assert decode_blob(case["wire_base64"]) == decoded
    assert encode_blob(decoded) == case["wire_base64"]
    assert case["wire_base64"].startswith("wwHioz3/VYAiN")


def test_negative_zero_keeps_its_sign_bit() -> None:
    (case,) = [c for c in GOLDEN["cases"] if c["name"] == "negative_zero"]
    decoded = decode_value(base64.b64decode(case["wire_base64"]))
    assert isinstance(decoded, float)
    assert math.copysign(1.0, decoded) == -1.0
    assert encode_value(-0.0).hex().endswith("0000000000000080")
    assert encode_value(-0.0) != encode_value(0.0)


@pytest.mark.parametrize("group", GOLDEN["alternate_map_orders"], ids=lambda g: g["name"])
def test_alternate_map_orders_decode_to_the_same_value(group: dict[str, Any]) -> None:
    first, second = (base64.b64decode(blob) for blob in group["wire_base64"])
    assert first != second
    assert decode_value(first) == decode_value(second) == APPENDIX_D_ALTERNATE[group["name"]]
    # Decoding keeps the wire order, so each encoding still round-trips byte for byte.
    assert encode_value(decode_value(first)) == first
    assert encode_value(decode_value(second)) == second


@pytest.mark.parametrize("frame", GOLDEN["malformed_frames"], ids=lambda f: f["name"])
def test_golden_malformed_frame_fails_with_its_error(frame: dict[str, Any]) -> None:
    error = ERRORS_BY_CODE[frame["error"]]
    with pytest.raises(errors.CodecError) as caught:
        decode_blob(frame["wire_base64"])
    assert type(caught.value) is error
    assert caught.value.code == frame["error"]
    assert str(caught.value).startswith(frame["error"] + ": ")
    if frame["wire_base64"]:
        with pytest.raises(error):
            decode_value(base64.b64decode(frame["wire_base64"]))


# --------------------------------------------------------------------------------------------------
# Fingerprint (§13.3)
# --------------------------------------------------------------------------------------------------


def crc64_avro(data: bytes) -> bytes:
    """CRC-64-AVRO (Rabin), table driven as in the Avro specification, returned little-endian."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


def test_fingerprint_bytes() -> None:
    assert FINGERPRINT.hex() == "e2a33dff55802237"
    assert crc64_avro(codec.SCHEMA_CANONICAL_FORM.encode("utf-8")) == FINGERPRINT
    assert encode_value(None)[:10] == HEADER
    assert encode_blob(None).startswith("wwHioz3/VYAiN")


def test_canonical_form_uses_full_names() -> None:
    canonical = json.loads(codec.SCHEMA_CANONICAL_FORM)
    assert canonical["name"] == "durable_workflow.protocol.Value"
    assert list(canonical) == ["name", "type", "fields"]


# --------------------------------------------------------------------------------------------------
# Encoder (§13.3 encoder MUSTs)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (INT64_MAX + 1, errors.IntegerOverflow),
        (INT64_MIN - 1, errors.IntegerOverflow),
        (2**100, errors.IntegerOverflow),
        ([{"a": [-(2**64)]}], errors.IntegerOverflow),
        (math.nan, errors.NonFiniteFloat),
        (math.inf, errors.NonFiniteFloat),
        (-math.inf, errors.NonFiniteFloat),
        ({"x": [math.nan]}, errors.NonFiniteFloat),
        ({1: "x"}, errors.InvalidMapKey),
        ({None: 1}, errors.InvalidMapKey),
        ({b"k": 1}, errors.InvalidMapKey),
        ({True: 1}, errors.InvalidMapKey),
        ([{"ok": {2.5: 1}}], errors.InvalidMapKey),
        ({1, 2}, errors.UnsupportedValueType),
        (frozenset(), errors.UnsupportedValueType),
        ((1, 2), errors.UnsupportedValueType),
        (object(), errors.UnsupportedValueType),
        (bytearray(b"x"), errors.UnsupportedValueType),
        (memoryview(b"x"), errors.UnsupportedValueType),
        (Decimal("1.5"), errors.UnsupportedValueType),
        (1j, errors.UnsupportedValueType),
        (["fine", {"nested": (1,)}], errors.UnsupportedValueType),
        ("\ud800", errors.UnsupportedValueType),
        ({"\udfff": 1}, errors.UnsupportedValueType),
    ],
    # Ids must be stable across processes (pytest-xdist compares collections): no memory addresses.
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v)),
)
def test_encoder_refuses(value: Any, error: type[errors.CodecError]) -> None:
    with pytest.raises(error) as caught:
        encode_value(value)
    assert type(caught.value) is error
    assert str(caught.value).startswith(error.code + ": ")


def test_error_messages_stay_short_for_huge_values() -> None:
    with pytest.raises(errors.IntegerOverflow) as too_big:
        encode_value(10**5000)  # too many digits for str() under the default int_max_str_digits
    with pytest.raises(errors.UnsupportedValueType) as surrogate:
        encode_value("x" * 1_000_000 + "\ud800")
    assert len(str(too_big.value)) < 300
    assert len(str(surrogate.value)) < 300


def test_map_keys_are_never_stringified() -> None:
    with pytest.raises(errors.InvalidMapKey, match="never"):
        encode_value({0: "zero"})
    assert decode_value(encode_value({"0": "zero"})) == {"0": "zero"}


def test_bool_is_boolean_value_not_long() -> None:
    (true_case,) = [c for c in GOLDEN["cases"] if c["name"] == "boolean_true"]
    assert encode_value(True) == base64.b64decode(true_case["wire_base64"])
    assert encode_value(True) != encode_value(1)
    assert decode_value(encode_value(True)) is True
    assert type(decode_value(encode_value(1))) is int


def test_subclasses_of_accepted_types_encode_as_their_base_type() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    assert encode_value(Colour.RED) == encode_value(1)
    assert encode_value(OrderedDict([("b", 1), ("a", 2)])) == encode_value({"b": 1, "a": 2})


def test_int64_bounds_encode() -> None:
    for bound in (INT64_MIN, INT64_MAX):
        assert decode_value(encode_value(bound)) == bound


def nested_lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_encoder_depth_limit() -> None:
    assert decode_value(encode_value(nested_lists(MAX_DEPTH))) == nested_lists(MAX_DEPTH)
    with pytest.raises(errors.UnsupportedValueType, match="nests more than"):
        encode_value(nested_lists(MAX_DEPTH + 1))
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(errors.UnsupportedValueType, match="contains itself"):
        encode_value(cycle)


# --------------------------------------------------------------------------------------------------
# Round trip over the whole domain
# --------------------------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
    | st.sampled_from([INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 0, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308])
    | st.binary()
    | st.text()
    | st.text(alphabet=st.characters(min_codepoint=0x10000))
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


# Generating nested values of up to 40 leaves is slow when the machine is busy (the whole project runs in
# parallel): that is a property of the machine, not of the codec, so the too-slow health check is off.
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_round_trip(value: Any) -> None:
    wire = encode_value(value)
    decoded = decode_value(wire)
    assert strict(decoded) == strict(value)
    assert encode_value(decoded) == wire
    assert strict(decode_blob(encode_blob(value))) == strict(value)
    assert strict(decode_envelope(make_envelope(value))) == strict(value)


# --------------------------------------------------------------------------------------------------
# Block encodings the decoder must accept (§13.2)
# --------------------------------------------------------------------------------------------------


def test_multi_block_array() -> None:
    # [None, True, 7] written as a block of one and a block of two.
    wire = HEADER + b"\x0c" + varint(1) + b"\x00" + varint(2) + b"\x02\x01" + b"\x04\x0e" + b"\x00"
    assert strict(decode_value(wire)) == strict([None, True, 7])


def test_negative_count_array_block() -> None:
    items = b"\x02\x01" + b"\x04\x0e"
    wire = HEADER + b"\x0c" + varint(-2) + varint(len(items)) + items + b"\x00"
    assert strict(decode_value(wire)) == strict([True, 7])


def test_negative_count_and_multi_block_map() -> None:
    first = b"\x02a" + b"\x00"
    second = b"\x02b" + b"\x04\x02" + b"\x02c" + b"\x0a\x02z"
    wire = HEADER + b"\x0e" + varint(-1) + varint(len(first)) + first + varint(2) + second + b"\x00"
    assert decode_value(wire) == {"a": None, "b": 1, "c": "z"}


def test_blocks_nested_inside_blocks() -> None:
    inner = b"\x0c" + varint(-1) + varint(1) + b"\x00" + varint(1) + b"\x00" + b"\x00"  # [None, None]
    entry = b"\x02k" + inner
    wire = HEADER + b"\x0e" + varint(-1) + varint(len(entry)) + entry + b"\x00"
    assert decode_value(wire) == {"k": [None, None]}


@given(st.data())
def test_any_block_split_decodes_to_the_same_value(data: st.DataObject) -> None:
    is_map = data.draw(st.booleans(), label="map")
    if is_map:
        value: Any = data.draw(st.dictionaries(st.text(), values, max_size=6), label="value")
        parts = [datum(key)[1:] + datum(item) for key, item in value.items()]  # key: a string sans index
    else:
        value = data.draw(st.lists(values, max_size=6), label="value")
        parts = [datum(item) for item in value]
    body = bytearray(b"\x0e" if is_map else b"\x0c")
    start = 0
    while start < len(parts):
        end = data.draw(st.integers(start + 1, len(parts)), label="block end")
        block = b"".join(parts[start:end])
        if data.draw(st.booleans(), label="negative count"):
            body += varint(-(end - start)) + varint(len(block)) + block
        else:
            body += varint(end - start) + block
        start = end
    body += b"\x00"
    assert strict(decode_value(HEADER + bytes(body))) == strict(value)


# --------------------------------------------------------------------------------------------------
# Malformed datums beyond the golden set, where fastavro alone is lenient
# --------------------------------------------------------------------------------------------------

DEEP = b"\x0c\x02" * 5000 + b"\x00" + b"\x00" * 5000  # segfaults fastavro's C reader unchecked


@pytest.mark.parametrize(
    ("datum_bytes", "match"),
    [
        pytest.param(b"\x02\x02", "boolean byte 02", id="boolean_byte_02"),
        pytest.param(b"\x02\xff", "boolean byte ff", id="boolean_byte_ff"),
        pytest.param(b"\x0c\x02\x02\x02\x00", "boolean byte 02", id="boolean_byte_02_in_array"),
        pytest.param(b"\x01\x00", "union index -1", id="negative_union_index_reads_as_map"),
        pytest.param(b"\x03\x00", "union index -2", id="negative_union_index_reads_as_array"),
        pytest.param(b"\x04" + b"\xff" * 10 + b"\x01", "longer than 10 bytes", id="overlong_varint"),
        pytest.param(b"\x04" + b"\xff" * 9 + b"\x7f", "64 bits", id="varint_beyond_64_bits"),
        pytest.param(b"\x08\x03abc", "negative bytes length", id="negative_bytes_length"),
        pytest.param(b"\x0a\x03abc", "negative string length", id="negative_string_length"),
        pytest.param(b"\x0a\x06\xed\xa0\x80", "UTF-8", id="utf8_encoded_surrogate"),
        pytest.param(b"\x0a\x04\xc0\x80", "UTF-8", id="overlong_utf8"),
        pytest.param(b"\x0e\x02\x02\xff\x00\x00", "map key is not valid UTF-8", id="invalid_utf8_map_key"),
        pytest.param(b"\x0c" + varint(-1) + varint(2) + b"\x00\x00", "declares 2", id="block_size_too_big"),
        pytest.param(b"\x0c" + varint(-2) + varint(1) + b"\x00\x00\x00", "declares 1", id="block_size_small"),
        pytest.param(b"\x0c" + varint(-1) + varint(-1) + b"\x00\x00", "negative array block", id="neg_size"),
        pytest.param(b"\x0c" + varint(INT64_MAX) + b"\x00", "truncated", id="huge_count"),
        pytest.param(b"\x08" + varint(INT64_MAX) + b"x", "truncated", id="huge_length"),
        pytest.param(b"\x0c\x02" * (MAX_DEPTH + 1) + b"\x00" * (MAX_DEPTH + 2), "nest", id="too_deep"),
        pytest.param(DEEP, "nest", id="deep_enough_to_crash_fastavro"),
        pytest.param(b"\x0c\x02\x00\x00\x00", "trailing", id="trailing_after_array"),
    ],
)
def test_malformed_datum(datum_bytes: bytes, match: str) -> None:
    with pytest.raises(errors.InvalidPayloadFraming, match=match):
        decode_value(HEADER + datum_bytes)


def test_depth_limit_boundary_decodes() -> None:
    wire = HEADER + b"\x0c\x02" * (MAX_DEPTH - 1) + b"\x0c\x00" + b"\x00" * (MAX_DEPTH - 1)
    assert decode_value(wire) == nested_lists(MAX_DEPTH)


def test_duplicate_map_keys_last_wins() -> None:
    wire = HEADER + b"\x0e" + varint(2) + b"\x02a\x00" + b"\x02a\x04\x02" + b"\x00"
    assert decode_value(wire) == {"a": 1}


def test_non_minimal_varint_is_accepted() -> None:
    # 0x8e 0x00 is 7 with a redundant continuation byte; a valid, if non-canonical, Avro long.
    assert decode_value(HEADER + b"\x04\x8e\x00") == 7


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"", errors.InvalidPayloadFraming),
        (HEADER[:9], errors.InvalidPayloadFraming),
        (b"\xc3\x02" + FINGERPRINT + b"\x00", errors.InvalidPayloadFraming),
        (b"\x00\x00" + FINGERPRINT + b"\x00", errors.InvalidPayloadFraming),
        (MAGIC + bytes(8) + b"\x00", errors.UnsupportedPayloadSchema),
        (MAGIC + FINGERPRINT[::-1] + b"\x00", errors.UnsupportedPayloadSchema),
    ],
    ids=["empty", "nine_bytes", "magic_c302", "magic_0000", "zero_fingerprint", "big_endian_fingerprint"],
)
def test_framing_header(frame: bytes, error: type[errors.CodecError]) -> None:
    with pytest.raises(error):
        decode_value(frame)


# --------------------------------------------------------------------------------------------------
# Base64 and envelopes (§13.1)
# --------------------------------------------------------------------------------------------------


def test_make_envelope() -> None:
    envelope = make_envelope(["hello", 42])
    assert envelope == {"codec": "avro", "blob": encode_blob(["hello", 42])}
    assert envelope["blob"].startswith("wwHioz3/VYAiN")
    assert is_envelope(envelope)
    assert decode_envelope(envelope) == ["hello", 42]
    assert decode_envelope(json.loads(json.dumps(envelope))) == ["hello", 42]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"codec": "avro", "blob": "wwHioz3/VYAiNwA="}, True),
        ({"codec": "json", "blob": "x"}, True),
        ({"codec": "avro", "external_storage": {"uri": "s3://b/k"}}, True),
        ({"codec": "avro"}, False),
        ({"blob": "wwHioz3/VYAiNwA="}, False),
        ({"codec": "avro", "blob": "wwHioz3/VYAiNwA=", "extra": 1}, False),
        ({"codec": "avro", "blob": "x", "external_storage": {}}, False),
        ({}, False),
        (["codec", "blob"], False),
        ("wwHioz3/VYAiNwA=", False),
        (None, False),
    ],
    ids=repr,
)
def test_is_envelope(obj: Any, expected: bool) -> None:
    assert is_envelope(obj) is expected


@pytest.mark.parametrize("name", ["json", "php", "base64", "Y", "AVRO", "avro ", "", None, 5])
def test_unknown_codec(name: Any) -> None:
    # A valid avro blob still fails: the codec is checked first and the content never guessed from.
    with pytest.raises(errors.UnsupportedPayloadCodec) as caught:
        decode_envelope({"codec": name, "blob": "wwHioz3/VYAiNwA="})
    assert str(caught.value).startswith("unsupported_payload_codec:")
    assert repr(name) in str(caught.value)


def test_unknown_codec_wins_over_a_bad_blob() -> None:
    with pytest.raises(errors.UnsupportedPayloadCodec):
        decode_envelope({"codec": "json", "blob": "not base64 at all"})


@pytest.mark.parametrize(
    "blob",
    [
        "",
        "wwHioz3/VYAiNwA",  # padding missing
        "wwHioz3/VYAiNwA=\n",
        "wwHi oz3/VYAiNwA=",
        "wwHioz3_VYAiNwA=",  # URL-safe alphabet
        "!!!!",
        "wwHioz3/VYAiNwA=wwHi",
        "é",
    ],
    ids=repr,
)
def test_bad_blob(blob: str) -> None:
    with pytest.raises(errors.InvalidPayloadFraming):
        decode_blob(blob)
    with pytest.raises(errors.InvalidPayloadFraming):
        decode_envelope({"codec": "avro", "blob": blob})


@pytest.mark.parametrize(
    "obj",
    [
        {"codec": "avro", "blob": None},
        {"codec": "avro", "blob": 123},
        {"codec": "avro", "external_storage": {"uri": "s3://b/k"}},
        {"codec": "avro", "blob": "wwHioz3/VYAiNwA=", "extra": 1},
        "wwHioz3/VYAiNwA=",
        None,
    ],
    ids=repr,
)
def test_decode_envelope_refuses_non_inline_envelopes(obj: Any) -> None:
    with pytest.raises(errors.InvalidPayloadFraming):
        decode_envelope(obj)


# --------------------------------------------------------------------------------------------------
# JSON views
# --------------------------------------------------------------------------------------------------


def test_json_to_value_passes_json_through() -> None:
    text = '{"s": "héllo 😀", "i": 9223372036854775807, "f": 2.5, "z": -0.0, "b": true, "n": null, "l": [1, []]}'
    value = json_to_value(json.loads(text))
    assert strict(value) == strict(json.loads(text))
    assert strict(decode_value(encode_value(value))) == strict(value)


def test_json_to_value_keeps_floats_and_ints_apart() -> None:
    assert strict(json_to_value(json.loads("[1, 1.0]"))) == strict([1, 1.0])


def test_json_to_value_does_not_guess_bytes() -> None:
    view = {"$type": "bytes", "base64": "AP8="}
    assert json_to_value(view) == view


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("9223372036854775808", errors.IntegerOverflow),
        ("[-9223372036854775809]", errors.IntegerOverflow),
        ('{"a": NaN}', errors.NonFiniteFloat),
        ("Infinity", errors.NonFiniteFloat),
        ("[-Infinity]", errors.NonFiniteFloat),
        ("1e400", errors.NonFiniteFloat),
        ('"\\ud800"', errors.UnsupportedValueType),
        ('{"\\udfff": 1}', errors.UnsupportedValueType),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), errors.UnsupportedValueType),
    ],
)
def test_json_to_value_refuses(text: str, error: type[errors.CodecError]) -> None:
    with pytest.raises(error):
        json_to_value(json.loads(text))


@pytest.mark.parametrize(
    ("obj", "error"),
    [((1, 2), errors.UnsupportedValueType), ({1: "x"}, errors.InvalidMapKey), (b"x", errors.UnsupportedValueType)],
    ids=repr,
)
def test_json_to_value_refuses_non_json_types(obj: Any, error: type[errors.CodecError]) -> None:
    with pytest.raises(error):
        json_to_value(obj)


def test_value_to_json() -> None:
    value = {"b": b"\x00\xff", "l": [b"", 1, -0.0, None, True, "t"], "m": {}}
    view = value_to_json(value)
    assert view == {
        "b": {"$type": "bytes", "base64": "AP8="},
        "l": [{"$type": "bytes", "base64": ""}, 1, -0.0, None, True, "t"],
        "m": {},
    }
    assert json.loads(json.dumps(view, allow_nan=False)) == view


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({1: "x"}, errors.InvalidMapKey),
        ((1,), errors.UnsupportedValueType),
        (math.nan, errors.NonFiniteFloat),
        (2**64, errors.IntegerOverflow),
    ],
    ids=repr,
)
def test_value_to_json_refuses(value: Any, error: type[errors.CodecError]) -> None:
    with pytest.raises(error):
        value_to_json(value)


@given(values)
def test_value_to_json_is_json_and_bytes_free(value: Any) -> None:
    text = json.dumps(value_to_json(value), allow_nan=False)
    assert strict(json_to_value(json.loads(text))) == strict(json.loads(text))


# --------------------------------------------------------------------------------------------------
# Public surface
# --------------------------------------------------------------------------------------------------


def test_all_lists_the_public_names() -> None:
    defined = {
        name
        for name, obj in vars(codec).items()
        if not name.startswith("_")
        and (((inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == codec.__name__) or name.isupper())
    }
    assert defined | {"Value"} == set(codec.__all__)
    for name in codec.__all__:
        assert hasattr(codec, name), name
