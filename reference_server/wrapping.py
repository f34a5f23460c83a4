"""Layers over the executable spec: named changes, each of which wraps one named function of the server (a rule,
a store or a route function), installed at start-up only when asked for, so the spec's own modules never hold a
branch for them. The deliberate bugs of the kill matrix and the legal variations (``reference_server.variations``:
choices the protocol leaves to each server) are such layers.

A layer's modules declare each of their wraps with :meth:`Layer.wraps`; :meth:`Layer.install` puts the wraps of
the named changes in place and returns the function that takes them out again. A wrapper is called as
``wrapper(original, *args, **kwargs)`` with the function it replaces; an ``async`` original gets an ``async``
replacement, and the replacement keeps the original's name, docstring and attributes (a route's registration
among them).

A function of the server is looked up where it is called: in its own module, and in every module of the server
that imported it by name. Installing a wrap rebinds all of them, so the change holds wherever the rule is used. A
function the server imports from elsewhere (the pure protocol model) is replaced only in the module named, so the
model itself and the suite that shares it stay as they are. A method is replaced on its class.

A layer is process-wide: one set of its changes at a time (installing another set is refused until the first is
taken out), installed before the server is built, since routes are bound when the server mounts them. The test
profile of a server with changes installed names them under the layer's key.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from .config import Settings

__all__ = ["Layer", "Wrap"]

_W = TypeVar("_W", bound=Callable[..., Any])

_SERVER = __name__.rpartition(".")[0]  # reference_server


@dataclass(frozen=True)
class Wrap:
    """One change's wrap of one function: ``owner.attr`` (a module or a class) is replaced by ``wrapper`` called
    with the function it replaces."""

    name: str
    owner: ModuleType | type
    attr: str
    wrapper: Callable[..., Any]

    @property
    def target(self) -> str:
        """``module.function`` or ``module.Class.method``: what the change wraps, for listings and tests."""
        owner = self.owner
        name = owner.__name__ if isinstance(owner, ModuleType) else f"{owner.__module__}.{owner.__qualname__}"
        return f"{name}.{self.attr}"


class Layer:
    """The named changes of one package (``package``), described by ``catalog``; the test profile of a server
    with some installed names them under ``profile_key``."""

    def __init__(self, package: str, catalog: Mapping[str, object], profile_key: str) -> None:
        self.package = package
        self.catalog = catalog
        self.profile_key = profile_key
        self._wraps: dict[str, list[Wrap]] = {}
        self._active: frozenset[str] = frozenset()
        self._undo: list[Callable[[], None]] = []

    def wraps(self, name: str, owner: ModuleType | type, attr: str) -> Callable[[_W], _W]:
        """Declare that the change ``name`` replaces ``owner.attr`` by the decorated wrapper."""
        if name not in self.catalog:
            raise KeyError(f"{name!r} is not in the catalogue of {self.package}")
        if not callable(_own(owner, attr)):
            raise TypeError(f"{owner!r}.{attr} is not a function")

        def register(wrapper: _W) -> _W:
            self._wraps.setdefault(name, []).append(Wrap(name, owner, attr, wrapper))
            return wrapper

        return register

    def wraps_of(self, name: str) -> list[Wrap]:
        """Every wrap the change ``name`` installs (the layer's modules loaded)."""
        self._load()
        return list(self._wraps.get(name, ()))

    def active(self) -> frozenset[str]:
        """The names of the changes installed now."""
        return self._active

    def install(self, names: Iterable[str]) -> Callable[[], None]:
        """Put the wraps of the changes ``names`` in place; returns the function that takes them out again."""
        wanted = frozenset(names)
        unknown = sorted(wanted - self.catalog.keys())
        if unknown:
            raise KeyError(f"unknown {self.profile_key} {', '.join(unknown)}")
        if self._active and wanted != self._active:
            raise RuntimeError(
                f"{self.profile_key} {sorted(self._active)} are installed; take them out before installing others"
            )
        if not wanted or self._active:
            return lambda: None
        self._load()
        for name in sorted(wanted):
            for wrap in self._wraps.get(name, ()):
                self._undo.append(_replace(wrap, self.package))
        naming = Wrap(min(wanted), Settings, "test_profile", _profile_naming(self.profile_key, wanted))
        self._undo.append(_replace(naming, self.package))
        self._active = wanted
        return self._uninstall

    @contextlib.contextmanager
    def installed(self, names: Iterable[str]) -> Iterator[None]:
        """The changes ``names`` in place for the block (a server built and closed inside it, in process)."""
        undo = self.install(names)
        try:
            yield
        finally:
            undo()

    def _uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()
        self._active = frozenset()

    def _load(self) -> None:
        """Import every module of the layer's package, so that each has declared its wraps."""
        package = sys.modules[self.package]
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{self.package}.{info.name}")


def _profile_naming(key: str, names: frozenset[str]) -> Callable[..., dict[str, Any]]:
    """The test profile names the installed changes, so a report shows which server it judged."""

    def profile(original: Callable[[Settings], dict[str, Any]], settings: Settings) -> dict[str, Any]:
        return {**original(settings), key: sorted(names)}

    return profile


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


def _replace(wrap: Wrap, package: str) -> Callable[[], None]:
    original = _own(wrap.owner, wrap.attr)
    new = _replacement(original, wrap.wrapper)
    places: list[tuple[ModuleType | type, str]] = [(wrap.owner, wrap.attr)]
    if isinstance(wrap.owner, ModuleType) and getattr(original, "__module__", "").startswith(_SERVER + "."):
        places += [
            (module, name)
            for module in _server_modules(package)
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


def _server_modules(package: str) -> list[ModuleType]:
    """The server's loaded modules but the layer's own."""
    return [
        module
        for name, module in list(sys.modules.items())
        if (name == _SERVER or name.startswith(_SERVER + ".")) and not name.startswith(package)
    ]
