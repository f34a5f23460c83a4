"""Stamps a wheel with the commit it was built from (``suite/_build.json``, read by :mod:`suite.build`), so an
installed wheel names its exact build as a checkout does."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _git(root: str, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


class BuildStamp(BuildHookInterface):  # type: ignore[misc]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install reads its checkout directly
        commit = _git(self.root, "rev-parse", "HEAD")
        if commit is None:
            return  # built from an sdist: the commit is unknown, and said so
        status = _git(self.root, "status", "--porcelain", "--", "suite", "schemas", "pyproject.toml")
        remote = _git(self.root, "remote", "get-url", "origin") or None
        if remote is not None:
            remote = re.sub(r"^(\w+://)[^/@]*@", r"\1", remote)
        stamp = Path(tempfile.mkdtemp(prefix="dw-build-")) / "_build.json"
        stamp.write_text(json.dumps({"commit": commit, "dirty": bool(status), "repository": remote}), encoding="utf-8")
        build_data["force_include"][str(stamp)] = "suite/_build.json"
