"""Control-plane payload input (§12.1): a JSON array, or an explicit ``{codec, blob}`` envelope."""

from __future__ import annotations

from typing import Any

from suite.protocol.codec import decode_blob, encode_blob, json_to_value
from suite.protocol.errors import CodecError

from ...app import validation_error

__all__ = ["payload_blob"]


def payload_blob(value: Any, field: str, *, require_array: bool = False) -> str | None:
    """Control-plane input: a JSON array (converted to one Avro array blob) or an explicit
    ``{codec, blob}`` envelope stored unchanged (§12.1). Decoding checks the blob is well formed."""
    if value is None:
        return None
    if isinstance(value, list):
        try:
            return encode_blob(json_to_value(value))
        except CodecError as exc:
            raise validation_error({field: [str(exc)]}) from None
    if isinstance(value, dict):
        codec = value.get("codec")
        if set(value) != {"codec", "blob"} or not isinstance(value.get("blob"), str):
            raise validation_error({field: ["must be a JSON array or an envelope {codec, blob}."]})
        if codec != "avro":
            raise validation_error({f"{field}.codec": [f"unsupported_payload_codec: {codec!r} is not 'avro'."]})
        blob: str = value["blob"]
        try:
            decoded = decode_blob(blob)
        except CodecError as exc:
            raise validation_error({f"{field}.blob": [str(exc)]}) from None
        if require_array and not isinstance(decoded, list):
            raise validation_error({f"{field}.blob": ["the payload must decode to an Avro array of arguments."]})
        return blob
    raise validation_error({field: ["must be a JSON array or an envelope {codec, blob}."]})
