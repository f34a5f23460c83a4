"""The catalogue of legal variations: per variation, the choice it makes and the requirements whose checks it
puts to the test (they must pass, or be reported as the server's option: never fail)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VARIATIONS", "Variation"]


@dataclass(frozen=True)
class Variation:
    """One legal choice another server may make: what it does, and the requirements it bears on."""

    description: str
    bears_on: tuple[str, ...]


# The page size of the small-default-page-size variation: far below the protocol's default of 500.
SMALL_DEFAULT_PAGE_SIZE = 10
# How late the late-empty-polls variation delivers an empty long poll's answer (inside the 3 s the rule allows).
EMPTY_POLL_LATENESS_SECONDS = 1.5

VARIATIONS: dict[str, Variation] = {
    "small-default-page-size": Variation(
        f"Advertises history_page_size_default (and default_history_page_size) {SMALL_DEFAULT_PAGE_SIZE} and applies"
        " it: a poll or history request without a page size gets that many events a page.",
        (
            "HISTORY-SEQUENCE-CONTIGUOUS",
            "COMPRESSION-ROUNDTRIP",
            "COMPRESSION-OPT-IN-ONLY",
            "HISTORY-INLINE-PAGE",
            "HISTORY-INLINE-DEFAULT-PAGE",
        ),
    ),
    "late-empty-polls": Variation(
        f"The answer of an empty long poll reaches the client {EMPTY_POLL_LATENESS_SECONDS:g} s after the hold ended"
        " (its Date says when the server answered): latency inside the tolerance.",
        ("LONGPOLL-HOLD", "LONGPOLL-CLAMP-MAX", "LONGPOLL-CLAMP-MIN", "LONGPOLL-DEFAULT-HOLD"),
    ),
    "never-compress": Variation(
        "Never compresses history, though it advertises the encodings: compression above 50 events is the server's"
        " option.",
        ("COMPRESSION-ROUNDTRIP", "COMPRESSION-ABOVE-THRESHOLD", "COMPRESSION-BELOW-THRESHOLD"),
    ),
}
