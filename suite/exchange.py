"""One recorded HTTP exchange: the request, what came back (or why nothing did), and a ``curl`` line.

Its own module so that both the client that records exchanges (:mod:`suite.client`) and the failures that
carry them (:mod:`suite.outcomes`) can name it without importing each other.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Exchange"]


@dataclass
class Exchange:
    """One request and what came back (or why nothing did)."""

    method: str
    url: str
    request_headers: dict[str, str]
    request_body: str | None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: Any = None
    started_at: float = 0.0
    elapsed: float = 0.0
    error: str | None = None
    schema_errors: list[str] = field(default_factory=list)

    def curl(self) -> str:
        """A ``curl`` line that repeats the request; tokens appear as shell variables, never in clear."""
        parts = ["curl", "-sS", "-X", self.method]
        for name, value in self.request_headers.items():
            if name.lower() in (
                "content-length",
                "host",
                "accept-encoding",
                "connection",
                "user-agent",
                "accept",
            ):
                continue
            if name.lower() == "authorization":
                parts += ["-H", "Authorization: Bearer $DW_TOKEN"]
                continue
            parts += ["-H", f"{name}: {value}"]
        if self.request_body is not None:
            parts += ["--data-binary", self.request_body]
        parts.append(self.url)
        return " ".join(shlex.quote(p) if not p.startswith("Authorization: Bearer $") else f'"{p}"' for p in parts)

    def to_json(self) -> dict[str, Any]:
        request = ("method", "url", "request_headers", "request_body", "status", "response_headers", "response_body")
        return {
            **{name: getattr(self, name) for name in request},
            "elapsed_seconds": round(self.elapsed, 4),
            "error": self.error,
            "schema_errors": self.schema_errors,
            "curl": self.curl(),
        }

    def summary(self) -> str:
        reason = self.response_body.get("reason") if isinstance(self.response_body, dict) else None
        got = self.error or f"{self.status}" + (f" {reason}" if reason else "")
        return f"{self.method} {self.url} -> {got}"
