"""Counted nouns that agree with their number, for every message of the suite and the model alike (the model's
own messages count events, bytes and commands; :mod:`suite.text` re-exports this for the rest of the suite)."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 requirement``, ``2 requirements`` (``nouns``: an irregular plural, ``1 hard state reached``…)."""
    return f"{n} {noun if n == 1 else (nouns if nouns is not None else noun + 's')}"
