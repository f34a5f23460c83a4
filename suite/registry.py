"""The check registry: a check is a plain ``async`` function registered with :func:`check`.

The function name is the check's stable ID (used on the command line, in reports and in the
known-deviation list); the decorator names the requirement IDs it enforces and the guards that decide
whether it can run against a target (an optional capability, the need for short leases, auth).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from suite.protocol.requirements import REGISTRY, Requirement

if TYPE_CHECKING:
    from .context import CheckContext

__all__ = ["CHECKS", "Check", "all_checks", "check", "checks_for"]

CheckFn = Callable[["CheckContext"], Awaitable[None]]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    requirements: tuple[str, ...]
    capability: str | None
    slow: bool
    doc: str

    @property
    def primary(self) -> Requirement:
        return REGISTRY[self.requirements[0]]


CHECKS: dict[str, Check] = {}


def check(*requirements: str, capability: str | None = None, slow: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check of ``requirements`` (at least one, each an ID of the registry)."""
    if not requirements:
        raise ValueError("a check must name the requirement IDs it enforces")
    unknown = [r for r in requirements if r not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown requirement IDs {unknown}; see suite.protocol.requirements")

    def register(fn: CheckFn) -> CheckFn:
        name = fn.__name__
        if name in CHECKS:
            raise ValueError(f"duplicate check name {name!r}")
        CHECKS[name] = Check(name, fn, tuple(requirements), capability, slow, (fn.__doc__ or "").strip())
        return fn

    return register


def _load() -> None:
    from . import checks  # noqa: F401  - importing the package registers every check module


def all_checks() -> list[Check]:
    _load()
    return sorted(CHECKS.values(), key=lambda c: (c.primary.area.value, c.name))


def checks_for(requirement_ids: Iterable[str]) -> list[Check]:
    wanted = set(requirement_ids)
    return [c for c in all_checks() if wanted & set(c.requirements)]
