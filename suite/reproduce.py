"""Reproduce a recorded run against a live target and compare every requirement's verdict with the record.

``dw-certify reproduce DIR --target URL [--worker-token T --operator-token T]`` reads the run of ``DIR`` (a
``--certify`` bundle, or any run's report directory): its command line (tokens redacted), its seed and the
suite build that made it. It refuses, exit 4, when the installed suite is another build, naming the build to
install; otherwise it runs the same command again — same options, same selection, same seed — against
``URL`` with the tokens given (never the bundle's, which it does not hold), from an empty directory so no
project configuration applies, and prints one line per requirement: ``agrees`` or ``DIFFERS`` with both
verdicts. Exit 0 when every verdict agrees, 1 when one differs, 4 when the run cannot be reproduced here
(another build, a run that recorded no command, a refused option or token of the new run), 10 when the new run
ended without results (the harness or the network broke).

A signature says who made a bundle; this says whether the target still earns it, without trusting anyone's key.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .build import describe, install_hint, same_build, suite_build
from .settings import SEED_ENV
from .text import clip

__all__ = ["EXIT_AGREE", "EXIT_CANNOT", "EXIT_DIFFER", "EXIT_NO_RESULTS", "Comparison", "compare", "reproduce"]

EXIT_AGREE, EXIT_DIFFER, EXIT_CANNOT, EXIT_NO_RESULTS = 0, 1, 4, 10

# Options of the recorded command that belong to the recording machine, not to the run: the new run gets its
# own target, tokens, report directory and restart command; a reproduction is never signed.
_OWN_OPTIONS = (
    "--target",
    "--worker-token",
    "--operator-token",
    "--auth-token",
    "--report-dir",
    "--sign-key",
    "--restart-command",
)
# What a recorded command may hold to be run again: the suite's options that shape the run, pytest's selection
# and output options. Nothing else — a bundle is someone else's file, and options such as --basetemp, --junitxml,
# -c or --example-db DIR would read or write files on the reproducing machine.
_VALUED = frozenset(
    {
        "--namespace",
        "--protocol-version",
        "--requirement",
        "--faults",
        "--fault-seed",
        "--campaign",
        "--campaign-worker",
        "--campaign-progress",
        "--max-wait",
        "--concurrency",
        "--machine-examples",
        "--machine-steps",
        "--fuzz-examples",
        "-k",
        "-m",
        "--maxfail",
        "-n",
        "--numprocesses",
        "--dist",
        "--deselect",
        "-p",
        "--tb",
        "-r",
        "--color",
    }
)
_FLAGS = frozenset(
    {
        "--certify",
        "--area-order",
        "--real-time",
        "--no-machine-shrink",
        "--strict",
        "--strict-markers",
        "-x",
        "--exitfirst",
        "-q",
        "--quiet",
        "-v",
        "--verbose",
        "-s",
        "--no-header",
    }
)


def _allowed(option: str, value: str | None) -> bool:
    if option == "-p":  # only turning a plugin off: turning one on imports a module named by the bundle
        return value is not None and value.startswith("no:")
    if option == "--deselect":
        return value is not None and value.startswith("dw::")
    return (option in _VALUED) == (value is not None) and (option in _VALUED or option in _FLAGS)


class CannotReproduce(Exception):
    """The recorded run cannot be run again here; the message says why and what to do."""


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CannotReproduce(f"{path} is missing: give a run's report directory (reports/<run-id>/)") from None
    except (OSError, ValueError) as exc:
        raise CannotReproduce(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CannotReproduce(f"{path} is not a JSON object")
    return doc


def recorded_args(command: str) -> list[str]:
    """The recorded command's pytest arguments without the options of the recording machine (``_OWN_OPTIONS``),
    in their order; an option outside what a reproduction runs again is refused, naming it."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise CannotReproduce(f"the recorded command line does not parse: {exc}") from None
    if not words or Path(words[0]).name not in ("pytest", "py.test"):
        raise CannotReproduce("the run recorded no pytest command line, so it cannot be run again")
    out: list[str] = []
    rest = words[1:]
    while rest:
        word = rest.pop(0)
        option, value, glued = word, None, False
        if word.startswith("--") and "=" in word:
            option, value = word.split("=", 1)
            glued = True
        elif word.startswith("-") and not word.startswith("--") and len(word) > 2:
            if word[:2] in _VALUED:  # -kexpr, -n4, -ra
                option, value, glued = word[:2], word[2:], True
            elif all(f"-{c}" in _FLAGS for c in word[1:]):  # -xq, -vv
                out.append(word)
                continue
        if option in _OWN_OPTIONS:
            if not glued and rest:
                rest.pop(0)
            continue
        if not word.startswith("-"):
            if not word.startswith("dw::"):
                raise CannotReproduce(
                    f"the recorded command line names {word!r}, which is not an item of the suite (dw::…); "
                    "reproduce runs only the suite's own items"
                )
            out.append(word)
            continue
        if option in _VALUED and not glued:
            if not rest:
                raise CannotReproduce(f"the recorded command line ends with {option} and no value")
            value = rest.pop(0)
        if not _allowed(option, value):
            shown = option if value is None else f"{option} {value}"
            raise CannotReproduce(
                f"the recorded command line has {shown}, which reproduce does not run again (it could read or "
                "write files on this machine, or is not an option of a conformance run); run that command yourself"
            )
        out.extend([word] if glued else [option] if value is None else [option, value])
    return out


@dataclass(frozen=True)
class Comparison:
    """Each requirement's verdict in the record and in the new run."""

    rows: list[tuple[str, str, str, str]]  # id, recorded verdict, new verdict, the new run's message
    recorded_verdict: str
    new_verdict: str

    @property
    def differences(self) -> list[tuple[str, str, str, str]]:
        return [row for row in self.rows if row[1] != row[2]]

    def lines(self) -> list[str]:
        out = []
        for req_id, before, now, message in self.rows:
            if before == now:
                out.append(f"  agrees   {req_id}: {now}")
            else:
                why = f" — {message}" if message else ""
                out.append(f"  DIFFERS  {req_id}: the bundle says {before}, the target now {now}{why}")
        n, k = len(self.rows), len(self.differences)
        if k == 0:
            out.append(
                f"REPRODUCED: all {n} requirements' verdicts agree with the bundle ({self.new_verdict} as recorded)"
            )
        else:
            ids = ", ".join(row[0] for row in self.differences)
            out.append(
                f"DIFFERS: {k} of {n} requirements' verdicts differ from the bundle ({ids}); the bundle says "
                f"{self.recorded_verdict}, the target now {self.new_verdict}"
            )
        return out


def compare(recorded: Mapping[str, Any], new: Mapping[str, Any]) -> Comparison:
    """Every requirement of the record against the new run (a requirement missing from it counts as differing)."""
    now = {r["id"]: r for r in new["requirements"]}
    rows = []
    for row in recorded["requirements"]:
        other = now.get(row["id"], {})
        message = " ".join(str(other.get("reason") or "").split())
        rows.append((row["id"], row["verdict"], str(other.get("verdict", "missing")), clip(message, 300)))
    return Comparison(rows, recorded["summary"]["verdict"], new["summary"]["verdict"])


def reproduce(
    bundle: Path,
    target: str,
    tokens: Mapping[str, str | None],
    *,
    restart_command: str | None = None,
    report_dir: Path | None = None,
    out: Any = None,
) -> int:
    """Run ``bundle``'s recorded run against ``target`` and print the comparison; the exit status."""
    out = out or sys.stdout
    try:
        results = _load(bundle / "results.json")
        manifest_path = bundle / "manifest.json"
        build = _load(manifest_path)["suite"] if manifest_path.exists() else results.get("suite_build")
        if not isinstance(build, dict):
            raise CannotReproduce(
                f"{bundle} records no suite build (made by suite {results.get('suite_version')}); "
                "install that version and run its command line again"
            )
        installed = suite_build()
        if not same_build(build, installed):
            raise CannotReproduce(
                f"{bundle} was made by {describe(build)}; this is {describe(installed)}: {install_hint(build)}"
            )
        args = recorded_args(str(results.get("command") or ""))
    except CannotReproduce as exc:
        print(f"CANNOT REPRODUCE: {exc}", file=out)
        return EXIT_CANNOT
    with tempfile.TemporaryDirectory(prefix="dw-reproduce-") as scratch:
        reports = report_dir or Path(scratch) / "reports"
        cmd = [sys.executable, "-m", "pytest", f"--target={target}", f"--report-dir={reports}", *args]
        if restart_command:
            cmd.append(f"--restart-command={restart_command}")
        # The tokens go by the environment, so they never show in a process listing or the new run's command.
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DW_"))}
        environ.update({name: value for name, value in tokens.items() if value})
        environ[SEED_ENV] = str(results["seed"])
        print(f"reproducing run {results['run_id']} (seed {results['seed']}) against {target}", file=out)
        print(f"  {shlex.join(['pytest', f'--target={target}', *args])}", file=out)
        if (results.get("options") or {}).get("restart_command") and not restart_command:
            print(
                "  note: the recorded run had a --restart-command and this one has none: its restart checks "
                "will not be covered (pass --restart-command CMD)",
                file=out,
            )
        proc = subprocess.run(cmd, cwd=scratch, env=environ, capture_output=True, text=True, check=False)
        found = sorted(reports.glob("*/results.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
            last = next((line for line in reversed(lines) if line.startswith("ERROR:")), lines[-1] if lines else "")
            print(f"CANNOT REPRODUCE: the new run ended without results (exit {proc.returncode}): {last}", file=out)
            return EXIT_CANNOT if proc.returncode == EXIT_CANNOT else EXIT_NO_RESULTS
        new = json.loads(found[-1].read_text(encoding="utf-8"))
    comparison = compare(results, new)
    for line in comparison.lines():
        print(line, file=out)
    return EXIT_DIFFER if comparison.differences else EXIT_AGREE
