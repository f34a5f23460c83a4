"""``--restart-command`` against a URL target, as a vendor uses it: a shell script starts the reference server and,
run again, kills it with ``kill -9`` and starts it on the same port and database, returning once it answers. The
suite runs the script mid-flight; the restart requirements pass on the correct server and fail on one that loses
an acknowledged completion; without the option they are not covered, naming it; a bad option is a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite.outcomes import EXIT_USAGE
from suite.target import EMBEDDED_ARGS
from tests.conftest import run_suite
from tests.integration.scripted_server import scripted

RESTART = (
    "RESTART-ACKNOWLEDGED-DURABLE",
    "RESTART-WORK-TAKEN-OVER",
    "RESTART-LEASE-TAKEOVER",
    "RESTART-STALE-LEASE-FENCED",
)
ROLES = {"DW_WORKER_TOKEN": "restart-worker-1", "DW_OPERATOR_TOKEN": "restart-operator-1"}


def _selection() -> list[str]:
    return ["-m", "dw_check", *[a for r in RESTART for a in ("--requirement", r)]]


def test_a_scripted_restart_passes_the_restart_requirements(tmp_path: Path) -> None:
    with scripted(tmp_path / "srv", *EMBEDDED_ARGS, env=ROLES) as server:
        first = (tmp_path / "srv" / "pid").read_text(encoding="utf-8")
        run = run_suite(
            server.url, tmp_path / "reports", *_selection(), f"--restart-command={server.script}", env=ROLES
        )
        assert run.returncode == 0, run.stdout[-3000:]
        assert {r: run.verdict(r) for r in RESTART} == dict.fromkeys(RESTART, "passed")
        assert (tmp_path / "srv" / "pid").read_text(encoding="utf-8") != first  # it was restarted
        assert run.results is not None
        assert run.results["options"]["restart_command"] == "<set>"


def test_under_xdist_each_worker_restarts_its_own_embedded_server(tmp_path: Path) -> None:
    """With ``--target=embedded -n 2`` each worker runs its checks on a server of its own, so its restart checks
    restart that server: restarting the controller's instead, from both workers at once, killed one worker's fresh
    start (a harness error) and judged a server the checks never restarted."""
    run = run_suite("embedded", tmp_path / "reports", *_selection(), "-n", "2")
    assert run.returncode == 0, run.stdout[-3000:]
    assert {r: run.verdict(r) for r in RESTART} == dict.fromkeys(RESTART, "passed")


def test_a_server_that_loses_an_acknowledged_completion_across_a_restart_is_not_conformant(tmp_path: Path) -> None:
    with scripted(tmp_path / "srv", *EMBEDDED_ARGS, "--fault", "completion-commit-deferred", env=ROLES) as server:
        run = run_suite(
            server.url, tmp_path / "reports", *_selection(), f"--restart-command={server.script}", env=ROLES
        )
        assert run.returncode == 1, run.stdout[-3000:]
        assert run.verdict("RESTART-ACKNOWLEDGED-DURABLE") == "failed"
        assert "recorded before the restart is there after it" in run.stdout


def test_without_a_restart_command_the_restart_requirements_are_not_covered_naming_the_option(tmp_path: Path) -> None:
    with scripted(tmp_path / "srv", *EMBEDDED_ARGS, env=ROLES) as server:
        run = run_suite(server.url, tmp_path / "reports", *_selection(), env=ROLES)
        assert run.returncode == 0, run.stdout[-3000:]
        assert run.results is not None
        rows = {r["id"]: r for r in run.results["requirements"]}
        for req in RESTART:
            assert rows[req]["verdict"] == "not-covered", rows[req]
            assert rows[req]["setting"].startswith("--restart-command CMD"), rows[req]


@pytest.mark.parametrize(
    ("target", "command", "message"),
    [
        ("http://127.0.0.1:1", "/no/such/restart-script", "/no/such/restart-script is not an executable file"),
        ("http://127.0.0.1:1", "", "--restart-command='': give the command"),
        ("http://127.0.0.1:1", "'unbalanced", "not a command line"),
        ("embedded", "/bin/true", "the embedded target restarts itself"),
    ],
)
def test_a_bad_restart_command_is_refused_before_the_first_request(
    tmp_path: Path, target: str, command: str, message: str
) -> None:
    run = run_suite(target, tmp_path / "reports", f"--restart-command={command}")
    assert run.returncode == EXIT_USAGE, run.stdout[-2000:]
    assert message in run.stdout
    assert run.results is None
