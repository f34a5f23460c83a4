"""Check modules by area: every module of ``suite/checks/`` declares the registry areas whose checks it holds
(``AREAS``, a tuple of :class:`suite.protocol.requirements.Area`), and every check stands in a module that declares
the area of its primary requirement (the one its item id is grouped by). A module declares no area it has no check
of, and every area of the registry that has a check has a module.

So a newcomer looking for the checks of an area opens the module that declares it, and a check added to the wrong
module fails here, naming the modules that would take it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping

import suite.checks
from suite.protocol.requirements import Area
from suite.registry import Check, all_checks

MODULES = sorted(f"suite.checks.{m.name}" for m in pkgutil.iter_modules(suite.checks.__path__))


def declared() -> dict[str, tuple[Area, ...]]:
    return {name: getattr(importlib.import_module(name), "AREAS", ()) for name in MODULES}


def misplaced(checks: Iterable[Check], areas: Mapping[str, tuple[Area, ...]]) -> list[str]:
    """Each check whose primary requirement's area its module does not declare, with the modules that do."""
    out = []
    for check in checks:
        assert check.fn is not None
        module, area = check.fn.__module__, check.primary.area
        if area not in areas.get(module, ()):
            homes = [name for name, held in areas.items() if area in held] or ["none"]
            out.append(f"{module}.{check.name} is of area {area.value}; modules declaring it: {', '.join(homes)}")
    return out


def test_every_check_module_declares_its_areas() -> None:
    areas = declared()
    assert [name for name, held in areas.items() if not held] == []
    assert all(isinstance(a, Area) for held in areas.values() for a in held)


def test_every_check_stands_in_a_module_of_its_area() -> None:
    assert misplaced(all_checks(), declared()) == []


def test_a_module_declares_only_areas_it_has_checks_of() -> None:
    used = {(c.fn.__module__, c.primary.area) for c in all_checks() if c.fn is not None}
    stale = [f"{name}: {area.value}" for name, held in declared().items() for area in held if (name, area) not in used]
    assert stale == []


def test_a_check_in_a_module_of_another_area_is_refused() -> None:
    # The fencing module's checks, with the module declaring only dispatch: each is named with its real home.
    fencing = [c for c in all_checks() if c.fn is not None and c.fn.__module__ == "suite.checks.fencing"]
    areas = {**declared(), "suite.checks.fencing": (Area.DISPATCH,)}
    found = misplaced(fencing, areas)
    assert len(found) == len(fencing) > 0
    assert any("suite.checks.fencing.fence_wrong_owner is of area fencing" in line for line in found)
