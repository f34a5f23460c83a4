"""The server's timestamps: ``engine.ts`` writes an instant exactly as the model's ``rfc3339`` does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reference_server.engine import ts
from reference_server.store import from_us
from suite.protocol.fencing import rfc3339

# From 0001-01-01 to 9999-12-31T23:59:59.999999, as microseconds since the epoch.
FIRST_US = -62_135_596_800_000_000
LAST_US = 253_402_300_799_999_999


@given(st.integers(min_value=FIRST_US, max_value=LAST_US))
def test_ts_is_rfc3339_of_the_instant(us: int) -> None:
    assert ts(us) == rfc3339(from_us(us))


@given(st.integers(min_value=FIRST_US, max_value=LAST_US - 10_000_000), st.integers(0, 9_999_999))
def test_instants_of_the_same_and_of_later_seconds_keep_their_own_time(us: int, later: int) -> None:
    # The date and time of day are formatted once per second and reused: an instant read after another of the
    # same second, or of the next ones, still gets its own.
    assert ts(us) == rfc3339(from_us(us))
    assert ts(us + later) == rfc3339(from_us(us + later))


def test_edges() -> None:
    assert ts(None) is None
    assert ts(0) == "1970-01-01T00:00:00.000000Z"
    assert ts(-1) == "1969-12-31T23:59:59.999999Z"
    assert ts(FIRST_US) == "0001-01-01T00:00:00.000000Z"
    assert ts(LAST_US) == "9999-12-31T23:59:59.999999Z"
