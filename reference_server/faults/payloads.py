"""Faults of control-plane payload envelopes: the codec left unchecked, the blob re-encoded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from suite.protocol.codec import decode_blob, encode_blob

from ..routes.control import payloads
from .patching import wraps


@wraps("accept-non-avro-input", payloads, "payload_blob")
def _any_codec(original: Callable[..., str | None], value: Any, field: str, **how: Any) -> str | None:
    envelope = isinstance(value, dict) and set(value) == {"codec", "blob"} and isinstance(value["blob"], str)
    if envelope and value["codec"] != "avro":
        return str(value["blob"])  # the codec is never checked, the blob stored as sent
    return original(value, field, **how)


@wraps("reencode-start-input", payloads, "payload_blob")
def _reencoded(original: Callable[..., str | None], value: Any, field: str, **how: Any) -> str | None:
    blob = original(value, field, **how)
    if isinstance(value, dict) and blob is not None:
        return encode_blob(decode_blob(blob))  # a non-canonical blob comes back changed
    return blob
