"""Every requirement has a check and every check names real requirements (STYLE.md §3-§4); machines and fuzz
groups are entries of the same registry; requirements that need a test-profile setting say so."""

from __future__ import annotations

import inspect
from pathlib import Path

from suite.context import TargetInfo
from suite.outcomes import Kind
from suite.protocol.requirements import REGISTRY, TEST_PROFILE
from suite.registry import all_checks, entries


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


def test_machines_and_fuzz_groups_join_the_registry_as_entries_of_their_kind() -> None:
    all_entries = entries()
    kinds = {e.kind for e in all_entries}
    assert kinds == set(Kind)
    ids = [e.test_id for e in all_entries]
    assert len(ids) == len(set(ids)), "every item id is unique"
    for e in all_entries:
        assert e.requirements, e.test_id
        assert set(e.requirements) <= set(REGISTRY), e.test_id
        assert e.test_id == f"dw::{e.requirements[0] if e.kind is Kind.CHECK else e.kind.value}::{e.name}"
    assert "dw::VERSION-TRIM::version_trimmed" in ids
    assert "dw::machine::workflow_leases" in ids
    assert "dw::fuzz::stateful" in ids


def test_the_runner_sweeps_exactly_the_machines_that_define_a_sweep() -> None:
    from suite.machines import MACHINES, MachineBase

    class Unswept(MachineBase):
        name = "unswept"

    class Swept(Unswept):
        def sweep(self) -> None:
            """A sweep of its own."""

    assert [m.name for m in MACHINES if not m.sweeps()] == []  # every protocol machine sweeps its cold cells
    assert (MachineBase.sweeps(), Unswept.sweeps(), Swept.sweeps()) == (False, False, True)
    assert Swept.bound(TargetInfo(url="http://127.0.0.1:1", cluster_info={})).sweeps()  # as the runner binds it


def test_requirements_covered_only_through_the_test_profile_are_marked() -> None:
    marked = {r.id: r.profile for r in REGISTRY.values() if r.profile}
    assert marked["EXPIRY-SELF-RECOVERY"] == "workflow_task_lease_seconds"
    assert marked["POLL-STATUS-UNAVAILABLE"] == "matching_switch"
    assert set(marked.values()) == set(TEST_PROFILE)


def test_the_docs_say_what_a_test_build_must_expose() -> None:
    """Every test-profile key, and every requirement covered only through it, is in the table of
    docs/test-profile.md."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "test-profile.md").read_text(encoding="utf-8")
    table = doc[doc.index("## What a test build must expose") :]
    table = table[: table.index("\n## ")]
    for key in TEST_PROFILE:
        row = next((line for line in table.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None, key
        for req in (r.id for r in REGISTRY.values() if r.profile == key):
            assert f"`{req}`" in row, (key, req)


def test_each_requirement_names_its_document_section() -> None:
    """The section column is the first citation: a public document's short name and one of its sections."""
    assert REGISTRY["VERSION-MISSING"].section == "Worker protocol 1.20 · Protocol version"
    assert REGISTRY["DISPATCH-LOST-NOTIFICATION"].section.startswith("Dispatch, Lease and Hooks · ")
    assert REGISTRY["SESSION-LAZY-CREATE"].section == "Worker protocol 1.20 · Discovery capabilities"
    assert REGISTRY["CANCEL-COOPERATIVE-REQUEST"].section == "Worker protocol 1.20 · Command types"
    for r in REGISTRY.values():
        first = r.cites[0]
        assert r.section == f"{first.document.short} · {first.section}"
        assert first.section in first.document.sections


def test_every_not_covered_advice_names_a_known_test_profile_key() -> None:
    """``needs_short(seconds, what, key)``: the key is one the advice can name with its reference-server flag."""
    import ast

    from suite.outcomes import REFERENCE_FLAGS

    root = Path(__file__).resolve().parents[2] / "suite"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "needs_short" and len(node.args) > 2:
                key = node.args[2]
                if isinstance(key, ast.Constant):  # a key passed on from a caller is checked at its literal
                    found.append(key.value)
                    assert key.value in REFERENCE_FLAGS, f"{path.name}:{node.lineno}: {key.value!r}"
    assert "workflow_task_lease_seconds" in found
