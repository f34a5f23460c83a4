"""How a fault takes hold: it wraps one named function of the server (a rule, a store or a route function) and
is installed over it at start-up, so the spec's own modules never hold a faulty branch.

A fault module declares each of its wraps with :func:`wraps`; :func:`install` puts the wraps of the named faults
in place and returns the function that takes them out again. A wrapper is called as ``wrapper(original, *args,
**kwargs)`` with the function it replaces; an ``async`` original gets an ``async`` replacement, and the
replacement keeps the original's name, docstring and attributes (a route's registration among them).

A function of the server is looked up where it is called: in its own module, and in every module of the server
that imported it by name. Installing a wrap rebinds all of them, so the fault holds wherever the rule is used. A
function the server imports from elsewhere (the pure protocol model) is replaced only in the module named, so
the model itself and the suite that shares it stay correct. A method is replaced on its class.

Faults are process-wide: one set at a time (a second :func:`install` of another set is refused until the first is
taken out), installed before the server is built, since routes are bound when the server mounts them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from ..config import Settings
from .catalog import FAULTS

__all__ = ["Wrap", "active", "install", "installed", "wraps", "wraps_of"]

_W = TypeVar("_W", bound=Callable[..., Any])

_PACKAGE = __name__.rpartition(".")[0]  # reference_server.faults
_SERVER = _PACKAGE.rpartition(".")[0]  # reference_server


@dataclass(frozen=True)
class Wrap:
    """One fault's wrap of one function: ``owner.attr`` (a module or a class) is replaced by ``wrapper`` called
    with the function it replaces."""

    fault: str
    owner: ModuleType | type
    attr: str
    wrapper: Callable[..., Any]

    @property
    def target(self) -> str:
        """``module.function`` or ``module.Class.method``: what the fault breaks, for ``--fault list`` and tests."""
        owner = self.owner
        name = owner.__name__ if isinstance(owner, ModuleType) else f"{owner.__module__}.{owner.__qualname__}"
        return f"{name}.{self.attr}"


_WRAPS: dict[str, list[Wrap]] = {}
_active: frozenset[str] = frozenset()
_undo: list[Callable[[], None]] = []


def wraps(fault: str, owner: ModuleType | type, attr: str) -> Callable[[_W], _W]:
    """Declare that ``fault`` replaces ``owner.attr`` by the decorated wrapper (see the module docstring)."""
    if fault not in FAULTS:
        raise KeyError(f"{fault!r} is not in the fault catalogue")
    if not callable(_own(owner, attr)):
        raise TypeError(f"{owner!r}.{attr} is not a function")

    def register(wrapper: _W) -> _W:
        _WRAPS.setdefault(fault, []).append(Wrap(fault, owner, attr, wrapper))
        return wrapper

    return register


def wraps_of(fault: str) -> list[Wrap]:
    """Every wrap ``fault`` installs (the modules of this package loaded)."""
    _load()
    return list(_WRAPS.get(fault, ()))


def active() -> frozenset[str]:
    """The names of the faults installed now."""
    return _active


def install(names: Iterable[str]) -> Callable[[], None]:
    """Put the wraps of the faults ``names`` in place; returns the function that takes them out again."""
    global _active
    wanted = frozenset(names)
    unknown = sorted(wanted - FAULTS.keys())
    if unknown:
        raise KeyError(f"unknown faults {', '.join(unknown)}")
    if _active and wanted != _active:
        raise RuntimeError(f"faults {sorted(_active)} are installed; take them out before installing others")
    if not wanted or _active:
        return lambda: None
    _load()
    for name in sorted(wanted):
        for wrap in _WRAPS.get(name, ()):
            _undo.append(_replace(wrap))
    _undo.append(_replace(Wrap(min(wanted), Settings, "test_profile", _profile_naming(wanted))))
    _active = wanted
    return _uninstall


@contextlib.contextmanager
def installed(names: Iterable[str]) -> Iterator[None]:
    """The faults ``names`` in place for the block (a server built and closed inside it, in process)."""
    undo = install(names)
    try:
        yield
    finally:
        undo()


def _profile_naming(names: frozenset[str]) -> Callable[..., dict[str, Any]]:
    """The test profile of a faulty server names its faults, so a report shows which server it judged."""

    def profile(original: Callable[[Settings], dict[str, Any]], settings: Settings) -> dict[str, Any]:
        return {**original(settings), "faults": sorted(names)}

    return profile


def _uninstall() -> None:
    global _active
    while _undo:
        _undo.pop()()
    _active = frozenset()


def _load() -> None:
    """Import every fault module of this package, so that each has declared its wraps."""
    package = sys.modules[_PACKAGE]
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{_PACKAGE}.{info.name}")


def _own(owner: ModuleType | type, attr: str) -> Any:
    # A class's own attribute, not one bound through the instance protocol (a method stays a plain function).
    return owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)


def _replacement(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        async def replaced_async(*args: Any, **kwargs: Any) -> Any:
            return await wrapper(original, *args, **kwargs)

        return functools.wraps(original)(replaced_async)

    def replaced(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    return functools.wraps(original)(replaced)


def _replace(wrap: Wrap) -> Callable[[], None]:
    original = _own(wrap.owner, wrap.attr)
    new = _replacement(original, wrap.wrapper)
    places: list[tuple[ModuleType | type, str]] = [(wrap.owner, wrap.attr)]
    if isinstance(wrap.owner, ModuleType) and getattr(original, "__module__", "").startswith(_SERVER + "."):
        places += [
            (module, name)
            for module in _server_modules()
            if module is not wrap.owner
            for name, value in vars(module).items()
            if value is original
        ]
    for owner, name in places:
        setattr(owner, name, new)

    def undo() -> None:
        for owner, name in places:
            setattr(owner, name, original)

    return undo


def _server_modules() -> list[ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if (name == _SERVER or name.startswith(_SERVER + ".")) and not name.startswith(_PACKAGE)
    ]
