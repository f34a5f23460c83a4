"""``dw-certify reproduce``: a recorded run run again against a live target, every requirement's verdict compared.

The bundles here are real runs of a small selection against the reference server (a certification is the same
command without the selection); the same run again agrees, a server broken in one rule is named where it now
differs, another build of the suite and a refused token are refused before any verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, run_suite
from tests.suite.runs import UNREACHABLE, complete_records, results_of

SELECTION = ("--requirement", "VERSION-MISSING", "--requirement", "VERSION-TRIM", "-m", "dw_check")
ROLES = {"DW_WORKER_TOKEN": "worker-secret-1", "DW_OPERATOR_TOKEN": "operator-secret-1"}


def _bundle(server: ServerProcess, tmp_path: Path, env: dict[str, str] | None = None) -> Path:
    run = run_suite(server.url, tmp_path / "reports", *SELECTION, env=env)
    assert run.returncode == 0, run.stdout[-3000:]
    (folder,) = [p.parent for p in (tmp_path / "reports").glob("*/results.json")]
    return folder


def _reproduce(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("dw-certify")
    return subprocess.run([str(script), "reproduce", *args], capture_output=True, text=True, timeout=120)


def _lines(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The comparison's line of each requirement, by id."""
    out = {}
    for line in proc.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("agrees", "DIFFERS"):
            out[words[1].rstrip(":")] = line.strip()
    return out


def test_the_same_run_again_agrees_and_a_server_broken_in_one_rule_is_named(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    folder = _bundle(server_factory(), tmp_path)
    recorded = json.loads((folder / "results.json").read_text(encoding="utf-8"))

    again = _reproduce(str(folder), "--target", server_factory().url)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = _lines(again)
    assert set(lines) == {r["id"] for r in recorded["requirements"]}  # one line per requirement
    assert lines["VERSION-MISSING"] == "agrees   VERSION-MISSING: passed"
    assert f"(seed {recorded['seed']})" in again.stdout  # the recorded seed, not a new one
    assert again.stdout.splitlines()[-1].startswith(f"REPRODUCED: all {len(lines)} requirements' verdicts agree")

    broken = _reproduce(str(folder), "--target", server_factory("--fault", "ignore-version-header").url)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    lines = _lines(broken)
    assert lines["VERSION-MISSING"].startswith(
        "DIFFERS  VERSION-MISSING: the bundle says passed, the target now failed"
    )
    assert lines["VERSION-TRIM"] == "agrees   VERSION-TRIM: passed"
    last = broken.stdout.splitlines()[-1]
    assert last.startswith("DIFFERS: "), last
    assert "VERSION-MISSING" in last, last
    assert "the target now NOT CONFORMANT" in last


def test_another_build_of_the_suite_is_refused_naming_the_build_to_install(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory()
    folder = _bundle(server, tmp_path)
    path = folder / "results.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["suite_build"].update(commit="b" * 40, dirty=False, repository="https://git.example/dw-conformance")
    doc["suite_build"]["files"]["digest"] = "0" * 64
    path.write_text(json.dumps(doc), encoding="utf-8")
    refused = _reproduce(str(folder), "--target", server.url)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    (line,) = refused.stdout.splitlines()  # one line, and no run
    assert line.startswith(f"CANNOT REPRODUCE: {folder} was made by suite ")
    assert "at commit bbbbbbbbbbbb" in line
    assert line.endswith(
        "install that build: pip install 'dw-conformance @ git+https://git.example/dw-conformance@" + "b" * 40 + "'"
    )


def test_a_refused_token_of_the_new_run_is_a_usage_error_naming_it(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(env=ROLES)
    folder = _bundle(server, tmp_path, env=ROLES)
    assert "worker-secret-1" not in (folder / "results.json").read_text(encoding="utf-8")  # a bundle holds no token
    tokens = ("--worker-token", "WRONG", "--operator-token", ROLES["DW_OPERATOR_TOKEN"])
    refused = _reproduce(str(folder), "--target", server.url, *tokens)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    last = refused.stdout.splitlines()[-1]
    assert last.startswith("CANNOT REPRODUCE: the new run ended without results (exit 4): ERROR: --worker-token:"), last
    assert "on the worker plane" in last
    right = _reproduce(str(folder), "--target", server.url, "--worker-token", ROLES["DW_WORKER_TOKEN"], *tokens[2:])
    assert right.returncode == 0, right.stdout + right.stderr


@pytest.mark.parametrize(
    ("added", "named"),
    [
        ("--basetemp=/home", "--basetemp /home"),
        ("--junitxml /etc/passwd", "--junitxml"),
        ("-p evil_plugin", "-p evil_plugin"),
        ("/tmp/tests.py", "'/tmp/tests.py', which is not an item of the suite"),
    ],
)
def test_a_recorded_option_that_could_touch_this_machine_is_refused_before_any_run(
    tmp_path: Path, added: str, named: str
) -> None:
    """A bundle is someone else's file: its command line runs again only with the options of a conformance run."""
    results = results_of(complete_records())
    results["command"] += f" {added}"
    (tmp_path / "results.json").write_text(json.dumps(results), encoding="utf-8")
    refused = _reproduce(str(tmp_path), "--target", UNREACHABLE)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    (line,) = refused.stdout.splitlines()
    assert line.startswith("CANNOT REPRODUCE: the recorded command line "), line
    assert named in line, line
    assert "reproducing run" not in refused.stdout


def test_a_recorded_restart_command_not_given_again_is_said_and_an_unreachable_target_has_no_results(
    tmp_path: Path,
) -> None:
    results = results_of(complete_records(), options={"restart_command": "<set>"})
    (tmp_path / "results.json").write_text(json.dumps(results), encoding="utf-8")
    proc = _reproduce(str(tmp_path), "--target", UNREACHABLE)
    assert "note: the recorded run had a --restart-command and this one has none" in proc.stdout, proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("CANNOT REPRODUCE: the new run ended without results (exit "), last
    assert proc.returncode == 10, proc.stdout  # the harness could not reach the target: no verdict either way
    assert "cannot connect to http://127.0.0.1:1" in last
