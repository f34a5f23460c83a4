"""Wording every writer shares: counted nouns that agree with their number, and text shown whole.

A message is shown whole, wrapped at word boundaries where a line is too long. Only a text too large for its
place (a field of a fixed-size report, a response body) is cut, and then only between words, with a marker
that says how much was left out and where it is whole.
"""

from __future__ import annotations

import textwrap

from .protocol.wording import plural

__all__ = ["clip", "plural", "wrap"]


def clip(text: str, limit: int, whole_in: str = "") -> str:
    """``text`` if it has at most ``limit`` characters; else its words up to about ``limit`` and a marker naming
    how many characters were left out (and ``whole_in``, where the whole text is). Never cuts a word."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = max(head.rfind(" "), head.rfind("\n"))
    if cut > limit // 2:  # a word boundary not too far back; else the one long word is cut at the limit
        head = head[:cut]
    head = head.rstrip()
    where = f"; whole in {whole_in}" if whole_in else ""
    return f"{head} […{plural(len(text) - len(head), 'more character')}{where}]"


def wrap(text: str, width: int, indent: str) -> list[str]:
    """Every line of ``text``, wrapped at word boundaries to ``width`` columns, each line and continuation after
    ``indent`` (plus the line's own leading spaces). Words longer than a line (a URL, an id) stay whole."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        lead = indent + " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(
            line.strip(),
            width=max(width, len(lead) + 20),
            initial_indent=lead,
            subsequent_indent=lead + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [lead.rstrip()]
    return out
