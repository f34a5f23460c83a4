"""History pagination and compression: docs/reference.md: History, Compression (plus sequence checks for §16
#41/#45/#69).

Pagination speaks both cursor styles the spec asks for (§15 "History cursor … **Emit both. Accept both**"):
S0's ``after_sequence`` / ``has_more`` / ``next_after_sequence`` and UPS's ``next_history_page_token`` (base64
of the ASCII decimal ``after_sequence``). Compression is the body-level ``accept_history_encoding`` opt-in,
separate from HTTP ``Accept-Encoding``.

Decisions where the spec is loose:

- ``page_size`` above 1000 is **clamped** to 1000 (the UPP bridge behaviour; §8.4 allows "422 (UPS) or …
  clamped to 1000 (UPP bridge)", and invariant 46 accepts either). Below 1 or not an integer → 422.
- If both ``after_sequence`` and a token are sent, ``after_sequence`` wins; ``next_history_page_token`` wins
  over its alias ``page_token``. Neither → ``after_sequence = 0``.
- A token that is not a string, not canonical base64, or not a plain non-negative ASCII decimal (no sign,
  no spaces) below 2**63 → 400 ``invalid_page_token``.
- Compression applies at ``len(events) >= 50`` (UPP's ``count >= 50``; §8.5 "Exactly 50 is
  implementation-defined"). The JSON is compact and UTF-8; gzip uses ``mtime=0`` so output is deterministic.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

from suite.protocol.errors import Rejection

__all__ = [
    "ACTIVITY_ATTEMPT_EVENTS",
    "ACTIVITY_OUTCOME_EVENTS",
    "COMPRESSION_THRESHOLD",
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "RUN_TERMINAL_EVENTS",
    "SUPPORTED_ENCODINGS",
    "Cursor",
    "Encoding",
    "Page",
    "check_sequences",
    "choose_encoding",
    "compress_page",
    "decode_page_token",
    "decompress_events",
    "encode_page_token",
    "paginate",
    "resolve_cursor",
]

# §8.4: "Default `page_size` 500 (`DEFAULT_HISTORY_PAGE_SIZE`); maximum **1000**."
DEFAULT_PAGE_SIZE: Final = 500
MAX_PAGE_SIZE: Final = 1000
# §8.5: "Compression applies only when the number of events in *that response* is at or above the threshold
# of **50**."
COMPRESSION_THRESHOLD: Final = 50

# §8.7.1 and §12.2: the events that close a run (continue_as_new closes it too, as completed/"continued"; a run
# timeout records WorkflowTimedOut). §16.69: "more than one terminal run event per run" is a violation.
RUN_TERMINAL_EVENTS: Final = frozenset(
    {
        "WorkflowCompleted",
        "WorkflowFailed",
        "WorkflowCancelled",
        "WorkflowTerminated",
        "WorkflowContinuedAsNew",
        "WorkflowTimedOut",
    }
)
# §11.3, §11.4, §11.5, §11.7: the one outcome an activity execution ends with.
ACTIVITY_OUTCOME_EVENTS: Final = frozenset(
    {"ActivityCompleted", "ActivityFailed", "ActivityTimedOut", "ActivityCancelled"}
)
# An attempt ends with one of these; §11.6: ActivityRetryScheduled records the failure of an intermediate attempt.
ACTIVITY_ATTEMPT_EVENTS: Final = ACTIVITY_OUTCOME_EVENTS | {"ActivityRetryScheduled"}

Encoding = Literal["gzip", "deflate"]
SUPPORTED_ENCODINGS: Final[tuple[Encoding, ...]] = ("gzip", "deflate")

_DECIMAL = re.compile(r"[0-9]+", re.ASCII)
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", re.ASCII)
_MAX_SEQUENCE = 2**63 - 1

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------------
# Cursors
# ---------------------------------------------------------------------------------------------------------


def encode_page_token(after_sequence: int) -> str:
    """§8.4: "Base64 of the ASCII decimal `after_sequence`, e.g. `"MQ=="` = 1"."""
    if isinstance(after_sequence, bool) or not isinstance(after_sequence, int) or after_sequence < 0:
        raise ValueError(f"after_sequence must be an integer >= 0, got {after_sequence!r}")
    return base64.b64encode(str(after_sequence).encode("ascii")).decode("ascii")


def _invalid_token(token: object, why: str) -> Rejection:
    shown = token if isinstance(token, str) and len(token) <= 64 else type(token).__name__
    return Rejection(
        400,
        "invalid_page_token",
        f"The history page token {shown!r} is invalid ({why}); send back the next_history_page_token "
        "from the previous page unchanged, or use after_sequence.",
    )


def decode_page_token(token: object) -> int:
    """The ``after_sequence`` a token stands for; 400 ``invalid_page_token`` if it is not a valid token.

    §8.4: "An invalid token gives **400** `invalid_page_token`".
    """
    if not isinstance(token, str):
        raise _invalid_token(token, "not a string")
    if not token or _BASE64.fullmatch(token) is None:
        raise _invalid_token(token, "not standard base64")
    try:
        text = base64.b64decode(token, validate=True).decode("ascii")
    except (binascii.Error, ValueError):
        raise _invalid_token(token, "not base64 of ASCII text") from None
    if _DECIMAL.fullmatch(text) is None:
        raise _invalid_token(token, "not a non-negative decimal sequence number")
    value = int(text)
    if value > _MAX_SEQUENCE:
        raise _invalid_token(token, "sequence number out of range")
    return value


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts (exclusive) and how long it may be."""

    after_sequence: int
    page_size: int


def _validation(path: str, message: str) -> Rejection:
    errors = {path: [message]}
    return Rejection(
        422,
        "validation_failed",
        f"The history request is invalid: {path}: {message}.",
        {"errors": errors, "validation_errors": {path: [message]}},
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_cursor(body: Mapping[str, Any], *, default_page_size: int = DEFAULT_PAGE_SIZE) -> Cursor:
    """Read the cursor and page size of a history request body (§8.4 table; see the module docstring).

    422 ``validation_failed`` for a non-integer or negative ``after_sequence`` and a non-integer or < 1
    page size; 400 ``invalid_page_token`` for a bad token. Page sizes above 1000 are clamped to 1000.
    """
    after = body.get("after_sequence")
    if after is not None:
        # "`after_sequence` | int ≥0 | S0 style | Exclusive cursor".
        if not _is_int(after) or after < 0:
            raise _validation("after_sequence", "must be an integer >= 0")
        after_sequence: int = after
    else:
        # "`next_history_page_token` (alias `page_token`) | string | UPS style". "If neither `after_sequence`
        # nor a token is given, the RS treats it as `after_sequence = 0`."
        token = body.get("next_history_page_token")
        if token is None:
            token = body.get("page_token")
        after_sequence = 0 if token is None else decode_page_token(token)

    key = "page_size" if body.get("page_size") is not None else "history_page_size"
    size = body.get(key)
    if size is None:
        page_size = default_page_size
    elif not _is_int(size) or size < 1:
        # "`page_size` or `history_page_size` | int 1..1000 | no | Default 500."
        raise _validation(key, "must be an integer between 1 and 1000")
    else:
        # "Values above 1000 give 422 (UPS) or are clamped to 1000 (UPP bridge). Pages never exceed 1000
        # events".
        page_size = min(size, MAX_PAGE_SIZE)
    return Cursor(after_sequence=after_sequence, page_size=min(page_size, MAX_PAGE_SIZE))


# ---------------------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------------------


def _sequence(event: object) -> int:
    value = event.get("sequence") if isinstance(event, Mapping) else getattr(event, "sequence", None)
    if not _is_int(value):
        raise TypeError(f"history event has no integer sequence: {event!r}")
    assert isinstance(value, int)
    return value


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of history with both cursor styles.

    §8.4: "`next_after_sequence`, which is the sequence of the last returned event when `has_more`, else
    `null`"; ``next_history_page_token`` encodes the same value, or is ``None``.
    """

    events: list[T]
    has_more: bool
    next_after_sequence: int | None
    next_history_page_token: str | None


def paginate(events: Sequence[T], after_sequence: int, page_size: int) -> Page[T]:
    """The events with ``sequence > after_sequence``, ascending, at most ``min(page_size, 1000)`` of them.

    ``events`` are objects with a ``.sequence`` or mappings with ``"sequence"``, in ascending order (a run's
    history as stored). §8.4: "Returns events with `sequence > after_sequence`, ascending, up to `page_size`."
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    limit = min(page_size, MAX_PAGE_SIZE)
    # Binary search on the ascending sequences: O(log N + page) per page, so walking a long history page by
    # page stays linear overall.
    start = bisect.bisect_right(events, after_sequence, key=_sequence)
    page = list(events[start : start + limit])
    has_more = len(events) > start + limit
    next_after = _sequence(page[-1]) if has_more else None
    return Page(
        events=page,
        has_more=has_more,
        next_after_sequence=next_after,
        next_history_page_token=None if next_after is None else encode_page_token(next_after),
    )


# ---------------------------------------------------------------------------------------------------------
# Compression (§8.5)
# ---------------------------------------------------------------------------------------------------------


def choose_encoding(accept: object) -> Encoding | None:
    """The encoding to use for an ``accept_history_encoding`` value, or ``None`` for "do not compress".

    §8.5: "Values are `gzip` or `deflate`, or a comma list. If both are listed, **gzip is preferred**.
    Matching is case-insensitive." "Unsupported encodings are ignored". Parameters (``;q=0.5``) are ignored.
    """
    if not isinstance(accept, str):
        return None
    offered = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return next((enc for enc in SUPPORTED_ENCODINGS if enc in offered), None)


def _compress(encoding: Encoding, data: bytes) -> bytes:
    if encoding == "gzip":
        # "`gzip` means an RFC 1952 gzip member."
        return gzip.compress(data, mtime=0)
    # "`deflate` means **raw** RFC 1951 DEFLATE (PHP `gzdeflate`), with no zlib header."
    compressor = zlib.compressobj(level=6, wbits=-15)
    return compressor.compress(data) + compressor.flush()


def compress_page(
    events: list[dict[str, Any]], accept: object, threshold: int = COMPRESSION_THRESHOLD
) -> dict[str, Any]:
    """The history part of a response body: plain, or compressed if opted in and ``len(events) >= threshold``.

    §8.5: "Compressed form: `history_events: []`,
    `history_events_compressed: base64(compress(json_encode(events)))` and
    `history_events_encoding: "gzip"|"deflate"`." "No opt-in, or fewer events than the threshold, means the
    normal uncompressed array."
    """
    encoding = choose_encoding(accept)
    if encoding is None or len(events) < threshold:
        return {"history_events": events}
    raw = json.dumps(events, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return {
        "history_events": [],
        "history_events_compressed": base64.b64encode(_compress(encoding, raw)).decode("ascii"),
        "history_events_encoding": encoding,
    }


def decompress_events(encoding: str, blob: str) -> list[Any]:
    """Decode ``history_events_compressed``: base64, then decompress, then JSON; must be a JSON array.

    §8.5: "In Python that is `gzip.decompress`" for gzip, and for deflate "`zlib.decompress(b, -15)`. A robust
    client also tries `zlib.decompress(b)`." Raises ``ValueError`` on any malformed input.
    """
    try:
        data = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"history_events_compressed is not base64: {exc}") from None
    enc = encoding.lower() if isinstance(encoding, str) else encoding
    try:
        if enc == "gzip":
            raw = gzip.decompress(data)
        elif enc == "deflate":
            try:
                raw = zlib.decompress(data, -15)
            except zlib.error:
                raw = zlib.decompress(data)
        else:
            raise ValueError(f"unknown history_events_encoding {encoding!r}; expected gzip or deflate")
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"history_events_compressed does not {encoding}-decompress: {exc}") from None
    try:
        events = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"decompressed history is not UTF-8 JSON: {exc}") from None
    if not isinstance(events, list):
        raise ValueError(f"decompressed history is a JSON {type(events).__name__}, not an array")
    return events


# ---------------------------------------------------------------------------------------------------------
# Sequence invariants (§8.2, §16 #41, #45, #69)
# ---------------------------------------------------------------------------------------------------------


def check_sequences(sequences: Iterable[object], *, start: int | None = 1) -> str | None:
    """Describe the first problem in a run's sequence numbers, or ``None`` if they are contiguous.

    §8.2: "Sequences within a run start at 1 and increase by exactly 1, with no gaps." Pass ``start=None`` to
    check a slice that need not begin at 1 (a later page), or another ``start`` for a page after a cursor.
    """
    previous: int | None = None
    for index, seq in enumerate(sequences):
        if not _is_int(seq):
            return f"sequence at index {index} is {seq!r}, not an integer"
        assert isinstance(seq, int)
        if previous is None:
            if start is not None and seq != start:
                return f"first sequence is {seq}, expected {start}"
        elif seq == previous:
            return f"duplicate sequence {seq} at index {index}"
        elif seq < previous:
            return f"sequence {seq} at index {index} is lower than the previous {previous} (not ascending)"
        elif seq != previous + 1:
            missing = f"{previous + 1}" if seq == previous + 2 else f"{previous + 1}..{seq - 1}"
            return f"gap at index {index}: {seq} follows {previous} (missing {missing})"
        previous = seq
    return None
