"""How the suite lets the target's time pass: move its test clock, or wait in real time.

A target built for testing may advertise ``worker_protocol.test_profile.clock_advance``: the path of a
control-plane route, ``POST {path} {"seconds": s}``, that moves its clock ``s`` seconds forward for everything
time-driven (leases, timers, backoffs, timeouts, long-poll holds) and answers ``{"now": RFC 3339, ...}`` once
what became due has happened. Every wait of a check, a machine or the fuzzer goes through
:meth:`suite.context.CheckContext.wait`, which uses the route when :attr:`TargetClock.skips` and sleeps otherwise.

The clock is moved only where nothing else can see the jump: one process of the suite per target. With
``--target=embedded`` every xdist worker starts its own server; a URL target shared by several xdist workers
falls back to real time (a jump made by one check would expire the leases of checks running on another
worker), as does ``--real-time``. The advance goes straight to the target, never through the fault proxy:
it is test equipment, not protocol under test.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from suite.protocol.fencing import parse_rfc3339
from suite.protocol.versions import CONTROL_PLANE_VERSION

from .client import CONTROL_HEADER, Exchange, ProtocolClient, tls
from .outcomes import HarnessError

__all__ = [
    "FOREIGN_TOLERANCE",
    "GRACE_FACTOR",
    "GRACE_FLOOR",
    "HELD_GRACE",
    "REAL_TIME_REASONS",
    "TargetClock",
    "advertised_route",
    "plan",
]

# Rounding of the offset to microseconds on both sides, over many advances: anything beyond is someone else's.
FOREIGN_TOLERANCE = 0.001
# With a test clock, the longest a held request (a long poll) may take to answer at once before the clock is moved
# to the end of its hold: time for the request to reach the target and be served, never the hold itself.
HELD_GRACE = 0.25
# The grace measured on the target (TargetClock.grace): this many times the slowest of its last LATENCY_SAMPLES
# round trips that were served at once, never less than GRACE_FLOOR nor more than HELD_GRACE.
GRACE_FACTOR = 4.0
GRACE_FLOOR = 0.05
LATENCY_SAMPLES = 32
GRACE_SAMPLES_FIRST = 2  # round trips seen before the grace is measured (the clock is read after every item)
MOVES_KEPT = 256  # TargetClock.moves: far more than a held request sees while it waits

# Why a run waits in real time, by case (shown in the terminal header and the reports).
REAL_TIME_REASONS = {
    "absent": "the target advertises no test clock (worker_protocol.test_profile.clock_advance)",
    "option": "--real-time",
    "shared": "{n} xdist workers share the target, and a clock jump by one would expire the leases of the others",
}


def plan(test_profile: dict[str, Any], *, processes: int, embedded: bool, real_time: bool) -> str | None:
    """Why this run waits in real time, or ``None`` when it moves the target's test clock: the target has one,
    ``--real-time`` was not given, and no other process of the run shares the target (an embedded target
    gives each xdist worker its own server; a URL target is shared by ``processes`` > 1 workers)."""
    if advertised_route(test_profile) is None:
        return REAL_TIME_REASONS["absent"]
    if real_time:
        return REAL_TIME_REASONS["option"]
    if processes > 1 and not embedded:
        return REAL_TIME_REASONS["shared"].format(n=processes)
    return None


def advertised_route(test_profile: dict[str, Any]) -> str | None:
    """The test clock's path from a test profile, or ``None`` (absent or not a path below ``/api/``)."""
    path = test_profile.get("clock_advance")
    return path if isinstance(path, str) and path.startswith("/api/") and " " not in path else None


@dataclass
class TargetClock:
    """The target's clock as one process of the suite sees it, and the means to move it.

    ``offset`` is the target's clock minus the local one, in seconds: read from the route at the start (so a
    target whose clock was moved by an earlier run is judged on its own time) and after every advance. Without
    a route it stays 0 and the local clock stands in, as it always has for real-time targets.
    """

    url: str | None = None  # the route's full URL, straight to the target; None: the target has none
    token: str | None = None
    skips: bool = False  # True: waits move the clock; False: they take real time
    real_time_reason: str | None = None
    offset: float = 0.0
    advanced: float = field(default=0.0)  # seconds this process moved the clock, in all
    # The target's own account of its offset (``offset_seconds`` in the route's answers), as last read, and how
    # far the clock moved beyond what this process asked for since the last :meth:`moved_by_others`.
    reported: float | None = None
    foreign: float = 0.0
    # Round trips the target served at once (clock advances, held requests answered before their grace ended),
    # newest last: how long serving a request takes on this target, as this process sees it.
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES), repr=False)
    # The longest the network between this process and the target may hold a request back before delivering it
    # (the fault proxy's delay and reorder window): a held request's grace adds it, or the clock could be moved
    # to the end of a hold that has not begun.
    network_hold: float = 0.0
    # The offset in force from each local instant on: (local time the read or advance was sent, offset after it),
    # oldest first, so the target's time of an answer that came before later moves can still be told (:meth:`at`).
    moves: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MOVES_KEPT), repr=False)

    def now(self) -> datetime:
        """The target's current time, as far as this process knows it."""
        return datetime.now(UTC) + timedelta(seconds=self.offset)

    def at(self, local: float) -> datetime:
        """The target's time at the local instant ``local`` (a ``time.time()`` value, e.g. when an answer
        arrived). A move in flight at that instant counts as made: an answer that arrives during an advance may
        have been released by it, and a hold is never told shorter than the clock allows."""
        earliest = self.moves[0][1] if self.moves else self.offset
        offset = next((after for sent, after in reversed(self.moves) if sent <= local), earliest)
        return datetime.fromtimestamp(local, UTC) + timedelta(seconds=offset)

    def served(self, seconds: float) -> None:
        """One round trip the target served at once."""
        self.latencies.append(seconds)

    def grace(self) -> float:
        """How long a request the target may hold gets to answer at once before the clock is moved to the end of
        its hold: :data:`GRACE_FACTOR` times the slowest recent round trip served at once, within
        [:data:`GRACE_FLOOR`, :data:`HELD_GRACE`] (:data:`HELD_GRACE` until two round trips were seen). A target
        that serves in milliseconds is not waited on for a quarter of a second per empty poll; a loaded one gets as
        long as before."""
        if len(self.latencies) < GRACE_SAMPLES_FIRST:
            return self.long_grace()
        return self.network_hold + min(HELD_GRACE, max(GRACE_FLOOR, GRACE_FACTOR * max(self.latencies)))

    def long_grace(self) -> float:
        """The grace of a request held for longer than a short span: :data:`HELD_GRACE`, plus the network's hold."""
        return self.network_hold + HELD_GRACE

    def headers(self) -> dict[str, str]:
        headers = {CONTROL_HEADER: CONTROL_PLANE_VERSION, "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def read(self, timeout: float = 10.0) -> None:
        """Synchronously read the target's clock (``seconds: 0``) to learn the offset; once per process."""
        if self.url is None:
            return
        started, sent = time.monotonic(), time.time()
        try:
            resp = httpx.post(self.url, json={"seconds": 0}, headers=self.headers(), timeout=timeout, verify=tls())
        except httpx.HTTPError as exc:
            raise HarnessError(f"POST {self.url} (the advertised test clock) failed: {exc}") from None
        self.served(time.monotonic() - started)  # a connection opened and a request served: a slow round trip
        self.offset = self._offset_from(resp, time.time(), 0.0)
        self.moves.append((sent, self.offset))

    def moved_by_others(self) -> str | None:
        """Whether anyone but this process moved the target's clock since the last call (one read of the route):
        a check that ran meanwhile saw leases and timers jump, so its verdict cannot stand (a harness error)."""
        if self.url is None:
            return None
        self.read()
        moved, self.foreign = self.foreign, 0.0
        if abs(moved) <= FOREIGN_TOLERANCE:
            return None
        return (
            f"the target's test clock moved {moved:+.3f} s that this process did not ask for: another process "
            "is moving it (several suite runs or xdist workers on one URL target?); run one suite process per "
            "target, or pass --real-time"
        )

    async def advance(self, http: ProtocolClient, seconds: float, timeout: float = 30.0) -> Exchange:
        """Move the target's clock ``seconds`` forward over ``http``'s connections (straight to the target, never
        through the fault proxy); the exchange, recorded for a failing check's evidence."""
        assert self.url is not None
        assert self.skips
        body = {"seconds": round(seconds, 6)}
        exchange = Exchange(
            method="POST",
            url=self.url,
            request_headers={CONTROL_HEADER: CONTROL_PLANE_VERSION},
            request_body=str(body).replace("'", '"'),
            started_at=time.time(),
        )
        t0, sent = time.monotonic(), time.time()
        try:
            resp = await http.direct(self.url, body, self.headers(), timeout)
        except httpx.HTTPError as exc:
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise HarnessError(f"POST {self.url} (moving the test clock {seconds:g} s) failed: {exc}") from None
        exchange.elapsed = time.monotonic() - t0
        self.served(exchange.elapsed)
        exchange.status = resp.status_code
        exchange.response_headers = dict(resp.headers)
        exchange.response_body = resp.text[:2000]
        self.offset = max(self.offset, self._offset_from(resp, time.time(), body["seconds"]))
        self.moves.append((sent, self.offset))
        self.advanced += seconds
        return exchange

    def _offset_from(self, resp: httpx.Response, received: float, asked: float) -> float:
        try:
            doc = resp.json()
            now = parse_rfc3339(doc["now"]).timestamp()
        except (ValueError, KeyError, TypeError):
            raise HarnessError(
                f"POST {self.url} (the advertised test clock) answered {resp.status_code} without "
                f'{{"now": RFC 3339}}: {resp.text[:200]}'
            ) from None
        if resp.status_code != 200:
            raise HarnessError(f"POST {self.url} (the advertised test clock) answered {resp.status_code}")
        reported = doc.get("offset_seconds")
        if isinstance(reported, int | float) and not isinstance(reported, bool):
            if self.reported is not None:
                self.foreign += float(reported) - self.reported - asked
            self.reported = float(reported)
        # The target read its clock before answering: at receipt its clock is at least that far ahead.
        return now - received
