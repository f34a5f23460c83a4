"""History pagination and compression (§8.4, §8.5; invariants 41, 45–48, 69)."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite.protocol import history
from suite.protocol.errors import Rejection
from suite.protocol.history import (
    COMPRESSION_THRESHOLD,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Cursor,
    check_sequences,
    choose_encoding,
    compress_page,
    decode_page_token,
    decompress_events,
    encode_page_token,
    paginate,
    resolve_cursor,
)


def test_exported_names_exist() -> None:
    for name in history.__all__:
        assert hasattr(history, name), name


def test_constants_match_capabilities() -> None:
    # Appendix A.1: history_page_size_default 500, history_page_size_max 1000, compression_threshold 50.
    assert (DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, COMPRESSION_THRESHOLD) == (500, 1000, 50)


def events(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"e{i}", "sequence": i, "event_type": "SignalReceived", "payload": {"n": i, "text": "héllo"}}
        for i in range(1, n + 1)
    ]


# ---------------------------------------------------------------------------------------------------------
# Tokens and cursors
# ---------------------------------------------------------------------------------------------------------


def test_token_examples() -> None:
    assert encode_page_token(1) == "MQ=="  # §8.4 example
    assert encode_page_token(0) == "MA=="
    assert decode_page_token("MQ==") == 1
    assert decode_page_token(base64.b64encode(b"500").decode()) == 500


@given(st.integers(0, 2**63 - 1))
def test_token_round_trip(n: int) -> None:
    assert decode_page_token(encode_page_token(n)) == n


@pytest.mark.parametrize(
    "token",
    [
        "",
        "!!!",
        "MQ",  # missing padding
        "MQ==MQ==",
        base64.b64encode(b"-1").decode(),
        base64.b64encode(b"1.5").decode(),
        base64.b64encode(b" 1").decode(),
        base64.b64encode(b"abc").decode(),
        base64.b64encode(b"").decode(),
        base64.b64encode("١".encode()).decode(),  # a non-ASCII digit
        base64.b64encode(b"\xff\xfe").decode(),
        base64.b64encode(str(2**63).encode()).decode(),
        1,
        ["MQ=="],
    ],
)
def test_invalid_tokens(token: object) -> None:
    with pytest.raises(Rejection) as info:
        decode_page_token(token)
    assert (info.value.status, info.value.reason) == (400, "invalid_page_token")


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_encode_refuses_non_sequence(bad: Any) -> None:
    with pytest.raises(ValueError, match="after_sequence"):
        encode_page_token(bad)


@pytest.mark.parametrize(
    ("body", "cursor"),
    [
        ({}, Cursor(0, 500)),
        ({"after_sequence": 0}, Cursor(0, 500)),
        ({"after_sequence": 7, "page_size": 10}, Cursor(7, 10)),
        ({"next_history_page_token": "MQ==", "history_page_size": 2}, Cursor(1, 2)),
        ({"page_token": "NQ=="}, Cursor(5, 500)),
        ({"next_history_page_token": "MQ==", "page_token": "NQ=="}, Cursor(1, 500)),
        ({"after_sequence": 3, "next_history_page_token": "MQ=="}, Cursor(3, 500)),
        ({"after_sequence": None, "next_history_page_token": None}, Cursor(0, 500)),
        ({"page_size": 5000}, Cursor(0, 1000)),  # decision: clamp (invariant 46 allows it)
        ({"history_page_size": 1000}, Cursor(0, 1000)),
        ({"page_size": 3, "history_page_size": 9}, Cursor(0, 3)),
        ({"page_size": None, "history_page_size": 9}, Cursor(0, 9)),
        (
            {"lease_owner": "w1", "workflow_task_attempt": 1, "accept_history_encoding": "gzip"},
            Cursor(0, 500),
        ),
    ],
)
def test_resolve_cursor(body: dict[str, Any], cursor: Cursor) -> None:
    assert resolve_cursor(body) == cursor


def test_resolve_cursor_default_page_size_is_configurable() -> None:
    assert resolve_cursor({}, default_page_size=100) == Cursor(0, 100)


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"after_sequence": -1}, "after_sequence"),
        ({"after_sequence": "3"}, "after_sequence"),
        ({"after_sequence": True}, "after_sequence"),
        ({"after_sequence": 1.0}, "after_sequence"),
        ({"page_size": 0}, "page_size"),
        ({"page_size": "10"}, "page_size"),
        ({"page_size": 2.5}, "page_size"),
        ({"history_page_size": -4}, "history_page_size"),
        ({"history_page_size": False}, "history_page_size"),
    ],
)
def test_resolve_cursor_validation(body: dict[str, Any], path: str) -> None:
    with pytest.raises(Rejection) as info:
        resolve_cursor(body)
    assert (info.value.status, info.value.reason) == (422, "validation_failed")
    assert info.value.fields["errors"] == info.value.fields["validation_errors"]
    assert list(info.value.fields["errors"]) == [path]


def test_resolve_cursor_bad_token_is_400() -> None:
    with pytest.raises(Rejection) as info:
        resolve_cursor({"next_history_page_token": "nope"})
    assert info.value.status == 400


# ---------------------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------------------


def test_paginate_example_from_ups() -> None:
    # §8.4: "history_page_size: 1 returns one event and a non-null token. The history call then returns the
    # rest with a null token."
    evs = events(3)
    first = paginate(evs, 0, 1)
    assert [e["sequence"] for e in first.events] == [1]
    assert (first.has_more, first.next_after_sequence, first.next_history_page_token) == (True, 1, "MQ==")
    rest = paginate(evs, decode_page_token("MQ=="), DEFAULT_PAGE_SIZE)
    assert [e["sequence"] for e in rest.events] == [2, 3]
    assert (rest.has_more, rest.next_after_sequence, rest.next_history_page_token) == (False, None, None)


def test_paginate_exact_fit_and_empty() -> None:
    page = paginate(events(500), 0, DEFAULT_PAGE_SIZE)
    assert len(page.events) == 500
    assert not page.has_more
    assert page.next_history_page_token is None
    assert paginate([], 0, 10) == history.Page([], False, None, None)
    assert paginate(events(3), 3, 10).events == []
    assert paginate(events(3), 99, 10).events == []


def test_paginate_never_exceeds_max() -> None:
    page = paginate(events(2500), 0, 5000)
    assert len(page.events) == MAX_PAGE_SIZE
    assert page.next_after_sequence == 1000


@dataclass(frozen=True)
class Row:
    sequence: int


def test_paginate_reads_attribute_sequences() -> None:
    page = paginate([Row(1), Row(2), Row(3)], 1, 1)
    assert page.events == [Row(2)]
    assert page.next_after_sequence == 2
    with pytest.raises(TypeError, match="sequence"):
        paginate([{"seq": 1}], 0, 1)
    with pytest.raises(ValueError, match="page_size"):
        paginate([Row(1)], 0, 0)


@given(st.integers(0, 2600), st.integers(1, 3000))
def test_following_cursors_yields_every_event_once(n: int, p: int) -> None:
    # Invariant 45: every sequence 1..N exactly once, in order; no page larger than min(p, 1000).
    evs = events(n)
    seen: list[int] = []
    after, pages = 0, 0
    while True:
        page = paginate(evs, after, p)
        pages += 1
        assert len(page.events) <= min(p, MAX_PAGE_SIZE)
        seen.extend(e["sequence"] for e in page.events)
        if not page.has_more:
            assert page.next_after_sequence is None
            assert page.next_history_page_token is None
            break
        assert page.next_after_sequence == page.events[-1]["sequence"]
        assert page.next_history_page_token is not None
        after = decode_page_token(page.next_history_page_token)
        assert after == page.next_after_sequence
    assert seen == list(range(1, n + 1))
    assert check_sequences(seen) is None
    limit = min(p, MAX_PAGE_SIZE)
    assert pages == max(1, -(-n // limit))


# ---------------------------------------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("GZIP", "gzip"),
        ("Deflate", "deflate"),
        ("deflate, gzip", "gzip"),
        ("deflate,gzip", "gzip"),
        ("br, deflate", "deflate"),
        ("br", None),
        ("identity", None),
        ("gzip;q=0.5", "gzip"),
        (" gzip ", "gzip"),
        ("gzipx", None),
        (["gzip"], None),
        (1, None),
    ],
)
def test_choose_encoding(accept: object, expected: str | None) -> None:
    assert choose_encoding(accept) == expected


@pytest.mark.parametrize(
    ("n", "accept", "compressed"),
    [
        (49, "gzip", False),  # "< 50 events MUST NOT be compressed"
        (50, "gzip", True),  # decision: >= 50, like UPP
        (51, "gzip", True),
        (50, "deflate", True),
        (51, "deflate", True),
        (500, None, False),  # no opt-in, never
        (500, "br", False),  # unsupported encodings are ignored
        (0, "gzip", False),
    ],
)
def test_compression_threshold(n: int, accept: str | None, compressed: bool) -> None:
    evs = events(n)
    body = compress_page(evs, accept)
    if compressed:
        assert body["history_events"] == []
        assert body["history_events_encoding"] == choose_encoding(accept)
        assert decompress_events(body["history_events_encoding"], body["history_events_compressed"]) == evs
    else:
        assert body == {"history_events": evs}


def test_custom_threshold() -> None:
    assert "history_events_compressed" in compress_page(events(2), "gzip", threshold=2)
    assert "history_events_compressed" not in compress_page(events(1), "gzip", threshold=2)


def test_wire_formats_are_rfc1952_and_raw_deflate() -> None:
    evs = events(60)
    gz = base64.b64decode(compress_page(evs, "gzip")["history_events_compressed"])
    assert gz[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(gz)) == evs
    raw = base64.b64decode(compress_page(evs, "deflate")["history_events_compressed"])
    assert json.loads(zlib.decompress(raw, -15)) == evs  # §8.5: raw RFC 1951, no zlib header
    with pytest.raises(zlib.error):
        zlib.decompress(raw)  # it is *not* zlib-wrapped


def test_compression_is_deterministic() -> None:
    evs = events(80)
    assert compress_page(evs, "gzip") == compress_page(evs, "gzip")
    assert compress_page(evs, "deflate") == compress_page(evs, "deflate")


def test_decompress_accepts_zlib_wrapped_deflate() -> None:
    # §8.5: "A robust client also tries zlib.decompress(b)".
    evs = events(3)
    blob = base64.b64encode(zlib.compress(json.dumps(evs).encode())).decode()
    assert decompress_events("deflate", blob) == evs
    assert decompress_events("GZIP", base64.b64encode(gzip.compress(b"[1]")).decode()) == [1]


@pytest.mark.parametrize(
    ("encoding", "blob", "match"),
    [
        ("gzip", "!!!", "base64"),
        ("gzip", base64.b64encode(b"not gzip").decode(), "decompress"),
        ("deflate", base64.b64encode(b"\xff\xff\xff").decode(), "decompress"),
        ("br", base64.b64encode(b"x").decode(), "unknown"),
        ("gzip", base64.b64encode(gzip.compress(b"{}", mtime=0)).decode(), "not an array"),
        ("gzip", base64.b64encode(gzip.compress(b"\xff", mtime=0)).decode(), "UTF-8 JSON"),
        ("gzip", base64.b64encode(gzip.compress(b"[1,", mtime=0)).decode(), "UTF-8 JSON"),
    ],
)
def test_decompress_rejects_malformed(encoding: str, blob: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decompress_events(encoding, blob)


@given(st.lists(st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.integers(), st.text())), max_size=80))
def test_compressed_round_trip(evs: list[dict[str, Any]]) -> None:
    for accept in ("gzip", "deflate"):
        body = compress_page(evs, accept, threshold=0)
        assert decompress_events(body["history_events_encoding"], body["history_events_compressed"]) == evs


# ---------------------------------------------------------------------------------------------------------
# Sequence checks
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seqs", "kwargs", "problem"),
    [
        ([], {}, None),
        ([1, 2, 3], {}, None),
        ([5, 6], {"start": None}, None),
        ([5, 6], {"start": 5}, None),
        ([2, 3], {}, "first sequence is 2, expected 1"),
        ([1, 2, 2], {}, "duplicate sequence 2 at index 2"),
        ([1, 3, 2], {}, "gap at index 1: 3 follows 1 (missing 2)"),
        ([1, 2, 6], {}, "gap at index 2: 6 follows 2 (missing 3..5)"),
        ([1, 2, 1], {}, "sequence 1 at index 2 is lower than the previous 2 (not ascending)"),
        ([1, "2"], {}, "sequence at index 1 is '2', not an integer"),
        ([True], {}, "sequence at index 0 is True, not an integer"),
    ],
)
def test_check_sequences(seqs: list[object], kwargs: dict[str, Any], problem: str | None) -> None:
    assert check_sequences(seqs, **kwargs) == problem
