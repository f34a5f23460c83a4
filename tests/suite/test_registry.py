"""Every requirement has a check and every check names real requirements (STYLE.md §3-§4)."""

from __future__ import annotations

import inspect

from suite.protocol.requirements import REGISTRY
from suite.registry import all_checks


def test_every_requirement_has_a_check() -> None:
    covered = {req for c in all_checks() for req in c.requirements}
    missing = sorted(set(REGISTRY) - covered)
    assert missing == [], f"requirements without a check: {missing}"


def test_every_check_names_known_requirements_and_is_documented() -> None:
    for c in all_checks():
        assert c.requirements, c.name
        assert set(c.requirements) <= set(REGISTRY), c.name
        assert c.doc, f"check {c.name} needs a one-line docstring stating the rule"
        assert inspect.iscoroutinefunction(c.fn), c.name


def test_check_names_are_unique_and_stable_identifiers() -> None:
    names = [c.name for c in all_checks()]
    assert len(names) == len(set(names))
    assert all(n.isidentifier() and n == n.lower() for n in names)
