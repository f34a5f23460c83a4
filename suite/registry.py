"""The registry of everything a run executes: plain checks, state machines and fuzz groups, each an entry
that knows its kind.

A check is a plain ``async`` function registered with :func:`check`; the function name is its stable ID
(used on the command line and in reports); the decorator names the
requirement IDs it enforces and the guards that decide whether it can run against a target. The state
machines (``suite.machines.MACHINES``) and the fuzz groups (``suite.fuzz``) join the registry as entries of
their own kind. Every entry has one pytest item with a stable, re-runnable id (:attr:`Check.test_id`), and
every entry, whatever its kind, produces :class:`~suite.outcomes.Record`\\ s.

The fuzz groups judge every answer they get with *response checks*: plain synchronous functions of one answer,
registered with :func:`response_check` the way a check is with :func:`check` (the function name is the stable
ID, the decorator names the requirement IDs, both refused when unknown or taken). The fuzz package registers
them when it is imported, which the registry does lazily, as it does the check package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from suite.protocol.requirements import REGISTRY, Requirement

from .outcomes import Kind

if TYPE_CHECKING:
    from .context import CheckContext

__all__ = [
    "CHECKS",
    "RESPONSE_CHECKS",
    "TEST_ID_ROOT",
    "Check",
    "ResponseCheck",
    "all_checks",
    "check",
    "checks_for",
    "entries",
    "response_check",
    "response_checks",
]

CheckFn = Callable[["CheckContext"], Awaitable[None]]

# Every item id starts here: dw::<REQUIREMENT>::<check>, dw::machine::<machine>, dw::fuzz::<group>. The ids
# do not depend on where the suite is installed, so one item can be re-run by name from anywhere.
TEST_ID_ROOT = "dw"


@dataclass(frozen=True)
class Check:
    """One entry of the registry. ``fn`` is the check function (checks only); ``subject`` what a machine or
    fuzz entry runs (the machine class, the fuzz group's name)."""

    name: str
    fn: CheckFn | None
    requirements: tuple[str, ...]
    capability: str | None
    slow: bool
    doc: str
    kind: Kind = Kind.CHECK
    subject: Any = None
    # It restarts the target (CheckContext.restart): no other item of the run may be in flight meanwhile.
    restarts: bool = False

    @property
    def primary(self) -> Requirement:
        return REGISTRY[self.requirements[0]]

    @property
    def group(self) -> str:
        """The middle part of the item id: the primary requirement of a check, else the kind."""
        return self.requirements[0] if self.kind is Kind.CHECK else self.kind.value

    @property
    def test_id(self) -> str:
        return f"{TEST_ID_ROOT}::{self.group}::{self.name}"

    @property
    def record_name(self) -> str:
        """The ``check`` field of this entry's records (a fuzz group's records name their operation)."""
        return self.name if self.kind is Kind.CHECK else f"{self.kind.value}:{self.name}"


CHECKS: dict[str, Check] = {}


def _known(requirements: tuple[str, ...], what: str) -> None:
    """Refuse a registration that names no requirement or one the registry does not have."""
    if not requirements:
        raise ValueError(f"a {what} must name the requirement IDs it enforces")
    unknown = [r for r in requirements if r not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown requirement IDs {unknown}; see suite.protocol.requirements")


def check(
    *requirements: str, capability: str | None = None, slow: bool = False, restarts: bool = False
) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check of ``requirements`` (at least one, each an ID of the registry); ``restarts``:
    it restarts the target, alone in the run."""
    _known(requirements, "check")

    def register(fn: CheckFn) -> CheckFn:
        name = fn.__name__
        if name in CHECKS or name in RESPONSE_CHECKS:
            raise ValueError(f"duplicate check name {name!r}")
        doc = (fn.__doc__ or "").strip()
        CHECKS[name] = Check(name, fn, tuple(requirements), capability, slow, doc, restarts=restarts)
        return fn

    return register


# -- response checks: what the fuzz groups judge each answer by -----------------------------------------------

ResponseFn = Callable[[Any], None]


@dataclass(frozen=True)
class ResponseCheck:
    """A check of one answer (``suite.fuzz.Answer``): it returns when the answer keeps ``requirements`` and raises
    ``suite.fuzz.FuzzFailure`` naming the one it breaks."""

    name: str
    fn: ResponseFn
    requirements: tuple[str, ...]
    doc: str


RESPONSE_CHECKS: dict[str, ResponseCheck] = {}


def response_check(*requirements: str) -> Callable[[ResponseFn], ResponseFn]:
    """Register ``fn`` as a response check of ``requirements``; its function name is its stable ID."""
    _known(requirements, "response check")

    def register(fn: ResponseFn) -> ResponseFn:
        name = fn.__name__
        if name in CHECKS or name in RESPONSE_CHECKS:
            raise ValueError(f"duplicate check name {name!r}")
        RESPONSE_CHECKS[name] = ResponseCheck(name, fn, tuple(requirements), (fn.__doc__ or "").strip())
        return fn

    return register


def response_checks() -> list[ResponseCheck]:
    """Every response check, in the order they were registered (the order a fuzz case is judged in)."""
    from . import fuzz  # noqa: F401  - importing the package registers its response checks

    return list(RESPONSE_CHECKS.values())


def _load() -> None:
    from . import checks  # noqa: F401  - importing the package registers every check module


def all_checks() -> list[Check]:
    _load()
    return sorted(CHECKS.values(), key=lambda c: (c.primary.area.value, c.name))


def checks_for(requirement_ids: Iterable[str]) -> list[Check]:
    wanted = set(requirement_ids)
    return [c for c in all_checks() if wanted & set(c.requirements)]


def _machines() -> list[Check]:
    from .machines import MACHINES

    out = []
    for cls in MACHINES:
        doc = next((k.__doc__ for k in cls.__mro__ if k.__doc__), cls.name) or cls.name
        requirements = tuple(cls.REQUIREMENTS)
        out.append(Check(cls.name, None, requirements, None, True, doc.strip().splitlines()[0], Kind.MACHINE, cls))
    return out


def _fuzz_groups() -> list[Check]:
    from .fuzz import all_groups, group_members, group_requirements

    out = []
    for group in all_groups():
        doc = (
            f"Schemathesis cases for {', '.join(group_members(group))}: no 5xx, documented statuses and schemas, "
            "error envelopes, rejected calls change nothing."
        )
        out.append(Check(group, None, group_requirements(group), None, False, doc, Kind.FUZZ, group))
    return out


def entries() -> list[Check]:
    """Every entry of a run in the order they run: the checks by area, then the machines, then fuzzing."""
    return [*all_checks(), *_machines(), *_fuzz_groups()]
