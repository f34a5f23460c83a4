"""The server's ids: ULIDs, 26 Crockford base32 characters of 48 bits of milliseconds and 80 random bits."""

from __future__ import annotations

import os

import pytest

from reference_server.store import new_id

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def decode(ulid: str) -> int:
    value = 0
    for char in ulid:
        value = value * 32 + CROCKFORD.index(char)
    return value


@pytest.mark.parametrize(
    ("now_us", "random"),
    [
        (0, bytes(10)),
        (1_796_278_934_555_888, bytes.fromhex("0123456789abcdef0123")),
        ((2**48 - 1) * 1000, b"\xff" * 10),  # the last millisecond a ULID can hold, all random bits set
    ],
)
def test_an_id_is_its_millisecond_and_its_random_bits_in_crockford_base32(
    now_us: int, random: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: random[:n])  # the module reads os.urandom at each call
    ulid = new_id(now_us)
    assert len(ulid) == 26
    assert set(ulid) <= set(CROCKFORD)
    assert decode(ulid) == ((now_us // 1000) << 80) | int.from_bytes(random, "big")


def test_ids_of_later_milliseconds_sort_after_and_ids_of_one_millisecond_differ() -> None:
    earlier = [new_id(1_000_000 * s) for s in range(50)]
    assert earlier == sorted(earlier)
    same = {new_id(5_000_000) for _ in range(200)}
    assert len(same) == 200
