"""The module graph of ARCHITECTURE.md: what each package may import, no import cycle, no private name
imported from another module.

* **The allow-list is the document's.** The "may import" column of ARCHITECTURE.md's "Allowed imports" table
  is read here (its backticked names, and "the standard library"), so the document and the code cannot drift:
  a package that imports anything its row does not name fails, and so does a row naming an import nobody
  makes any more.
* **No import cycle between modules**, counting every import: at module level, inside functions and under
  ``TYPE_CHECKING``. Two edges are exempt, and ARCHITECTURE.md says why: the registry loads the check package
  and the fuzz package lazily, when a run asks for them (their modules import the registry to register their
  checks).
* **No private name crosses a module boundary**: ``from m import _name`` is refused anywhere in the tree.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREE = ("suite", "reference_server", "schemas", "tests", "bench")
# The allowed cycle edges (ARCHITECTURE.md "Allowed imports"): the registry imports the packages that register
# checks with it lazily.
LAZY_EDGES = {("suite.registry", "suite.checks"), ("suite.registry", "suite.fuzz")}
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` below ``root``, by its dotted name."""
    return {_module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


MODULES = _modules(ROOT, TREE)


def _imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) for every import statement of ``path``, wherever it stands."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            yield node.lineno, base, [alias.name for alias in node.names]


def _project_target(module: str, names: list[str], modules: dict[str, Path] = MODULES) -> set[str]:
    """The project modules an import reaches. A ``from package import module`` reaches the submodule and the
    package too: the name is looked up in the package's namespace, so a submodule that imports a sibling that
    way depends on its package's ``__init__``, which may be importing that very submodule."""
    out = {module} if names and module in modules else set()
    for target in [f"{module}.{n}" for n in names] or [module]:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target:
            out.add(target)
    return out


def _graph(modules: dict[str, Path] = MODULES, root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the project modules it imports (every import, wherever it stands), the lazy edges left out."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _line, module, names in _imports(path, root):
            for target in _project_target(module, names, modules):
                lazy = any(name == a and (target == b or target.startswith(b + ".")) for a, b in LAZY_EDGES)
                if target != name and not lazy:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_a_sibling_imported_through_its_package_depends_on_the_package() -> None:
    # suite/machines/__init__.py imports its machine modules; one of them written as ``from . import sibling``
    # would import the package back.
    assert _project_target("suite.machines", ["world"]) == {"suite.machines", "suite.machines.world"}
    assert _project_target("suite.machines.world", ["RunShadow"]) == {"suite.machines.world"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_a_cycle_injected_into_a_package_on_disk_is_found(tmp_path: Path) -> None:
    # The graph is read from the files, as for the tree: a package whose rules module imports its model at the
    # top and whose model imports the rules back inside a function (a late import, still a cycle).
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import rules\n")
    (package / "sub" / "rules.py").write_text("from pkg.model import Model\n")
    (package / "model.py").write_text("class Model:\n    pass\n")
    (package / "leaf.py").write_text("import pkg.model\n")
    modules = _modules(tmp_path, ("pkg",))
    assert _cycles(_graph(modules, tmp_path)) == []
    (package / "model.py").write_text("class Model:\n    def rules(self) -> None:\n        from .sub import rules\n")
    assert _cycles(_graph(modules, tmp_path)) == [["pkg.model", "pkg.sub", "pkg.sub.rules"]]


@pytest.mark.parametrize("package", sorted(b for _, b in LAZY_EDGES))
def test_each_lazy_edge_is_the_registrys_lazy_load_of_a_package(package: str) -> None:
    registry = MODULES["suite.registry"]
    lazy = [
        (line, module)
        for line, module, names in _imports(registry)
        if any(t == package or t.startswith(package + ".") for t in _project_target(module, names))
    ]
    assert lazy, f"the registry no longer loads {package}: drop it from LAZY_EDGES and its ARCHITECTURE.md note"
    top_level = {n.lineno for n in ast.parse(registry.read_text(encoding="utf-8")).body}
    assert all(line not in top_level for line, _ in lazy), f"the registry must load {package} lazily"
    importers = [name for name, path in MODULES.items() if name.startswith(package + ".") or name == package]
    assert any(
        "suite.registry" in _project_target(module, names)
        for name in importers
        for _, module, names in _imports(MODULES[name])
    ), f"nothing in {package} imports the registry any more: the edge is not a cycle, drop it from LAZY_EDGES"


def test_no_private_name_is_imported_from_another_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {module}"
        for path in MODULES.values()
        for line, module, names in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert found == []


# -- the allow-list -------------------------------------------------------------------------------------------


def _allow_list() -> dict[str, set[str]]:
    """The "may import" column of ARCHITECTURE.md, by package: backticked names, "stdlib" for the library."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Allowed imports", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    allowed: dict[str, set[str]] = {}
    for row in rows:
        package_cell, may_cell = (cell.strip() for cell in row.strip("|").split("|")[:2])
        package = re.findall(r"`([^`]+)`", package_cell)[0]
        names = {name.removesuffix(".*") for name in re.findall(r"`([^`]+)`", may_cell)}
        if "the standard library" in may_cell:
            names.add("stdlib")
        allowed[package] = names
    return allowed


ALLOWED = _allow_list()
PACKAGES = ("suite.protocol", "reference_server", "schemas", "suite")  # most specific first


def _package_of(module: str) -> str | None:
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), None)


def _allows(package: str, names: set[str], module: str) -> bool:
    if _package_of(module) == package:
        return True  # a package's own modules
    top = module.split(".")[0]
    if top in STDLIB:
        return "stdlib" in names
    return top in names or any(module == n or module.startswith(n + ".") for n in names)


def test_the_document_has_a_row_for_every_package() -> None:
    assert set(ALLOWED) == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_row_allows(package: str) -> None:
    found = []
    for name, path in MODULES.items():
        if _package_of(name) != package:
            continue
        for line, module, _names in _imports(path):
            if module and not _allows(package, ALLOWED[package], module):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert found == [], f"not in the 'may import' row of {package} in ARCHITECTURE.md"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_allowed_import_of_a_row_is_used(package: str) -> None:
    used: set[str] = set()
    for name, path in MODULES.items():
        if _package_of(name) == package:
            for _line, module, _names in _imports(path):
                if not module or _package_of(module) == package:
                    continue
                top = module.split(".")[0]
                used.add("stdlib" if top in STDLIB else top)
                used.update(n for n in ALLOWED[package] if module == n or module.startswith(n + "."))
    assert sorted(ALLOWED[package] - used - {package}) == [], f"the row of {package} names imports nobody makes"
