"""The exact build of the installed suite: its version, the commit it was built from and whether it was changed.

A bundle names the build that made it (:func:`suite_build`), so a third party can install the same one and a
verifier whose install differs is told which build to install. The commit comes from the checkout the suite
runs from (``git rev-parse HEAD``, dirty when ``suite/`` or ``schemas/`` differ from it), else from the
``suite/_build.json`` a wheel built from a checkout carries (``hatch_build.py``), else it is unknown. The files
digest covers the suite's own files either way, so two installs of one build agree on it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import schemas
import suite

__all__ = [
    "BUILD_FILE",
    "describe",
    "git_build",
    "install_hint",
    "same_build",
    "sha256_file",
    "suite_build",
    "suite_digest",
]

# Written into a wheel by hatch_build.py; never part of the digest, which must not depend on how it was installed.
BUILD_FILE = "_build.json"


def sha256_file(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def suite_digest() -> dict[str, Any]:
    """One sha256 over the installed suite's own files (``suite`` and ``schemas``, without bytecode): a
    modified suite gives another digest."""
    digest = hashlib.sha256()
    count = 0
    for package in (Path(suite.__file__).parent, Path(schemas.__file__).parent):
        for path in sorted(package.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            rel = f"{package.name}/{path.relative_to(package).as_posix()}"
            if rel == f"suite/{BUILD_FILE}":
                continue
            digest.update(f"{rel}\0{sha256_file(path)}\n".encode())
            count += 1
    return {"algorithm": "sha256", "files": count, "digest": digest.hexdigest()}


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_build(root: Path) -> dict[str, Any] | None:
    """The commit of the checkout at ``root`` and whether the suite's files differ from it (``None``: not a
    checkout). A remote's address is kept without any user name or password in it."""
    if not (root / ".git").exists():
        return None
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git(root, "status", "--porcelain", "--", "suite", "schemas", "pyproject.toml")
    remote = _git(root, "remote", "get-url", "origin") or None
    if remote is not None:
        remote = re.sub(r"^(\w+://)[^/@]*@", r"\1", remote)
    return {"commit": commit, "dirty": bool(status), "repository": remote}


def suite_build() -> dict[str, Any]:
    """The installed suite's build: ``version``, ``commit`` (``None``: unknown), ``dirty``, ``repository`` and
    where the commit was read (``source``), with the files digest. Read once per process (a run's files do not
    change under it); each caller gets its own copy."""
    return copy.deepcopy(_read_build())


@functools.lru_cache(maxsize=1)
def _read_build() -> dict[str, Any]:
    package = Path(suite.__file__).parent
    found = git_build(package.parent)
    source = "git checkout"
    if found is None:
        stamped = package / BUILD_FILE
        try:
            found = json.loads(stamped.read_text(encoding="utf-8"))
            source = "wheel"
        except (OSError, ValueError):
            found, source = {}, "unknown"
    return {
        "version": suite.__version__,
        "commit": found.get("commit"),
        "dirty": bool(found.get("dirty")),
        "repository": found.get("repository"),
        "source": source,
        "files": suite_digest(),
    }


def describe(build: dict[str, Any]) -> str:
    """``suite 0.2.0.dev0 at commit 1a2b3c4d5e6f`` (with uncommitted changes, or of unknown commit)."""
    commit = build.get("commit")
    where = f"at commit {commit[:12]}" if commit else "of unknown commit"
    return f"suite {build.get('version')} {where}{', with uncommitted changes' if build.get('dirty') else ''}"


def same_build(recorded: dict[str, Any], installed: dict[str, Any]) -> bool:
    """Two builds are the same when their versions and their files agree (the commit alone proves nothing
    about uncommitted changes, and two commits may hold the same files)."""
    return bool(
        recorded.get("version") == installed.get("version")
        and (recorded.get("files") or {}).get("digest") == (installed.get("files") or {}).get("digest")
    )


def install_hint(build: dict[str, Any]) -> str:
    """What to install to get ``build``, or why no one can."""
    commit = build.get("commit")
    if not commit:
        return f"install dw-conformance {build.get('version')} as the bundle's maker did (its commit was not recorded)"
    if build.get("dirty"):
        return (
            f"it was made with uncommitted changes on commit {commit[:12]}, so no one else can install that build; "
            "ask its maker for a bundle made by a committed build"
        )
    repo = build.get("repository") or "<the suite's repository>"
    return f"install that build: pip install 'dw-conformance @ git+{repo}@{commit}'"
