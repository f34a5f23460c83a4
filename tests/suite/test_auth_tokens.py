"""A full-access token is a server's option: judged only when the run declares one (``--auth-token``), never
failing or withholding a verdict from a server with role tokens only, and legal under upstream's rule (admin-only
once role tokens exist) as under the reference server's (full access beside them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from suite.target import EMBEDDED_ARGS
from tests.conftest import ServerProcess, run_suite
from tests.integration.scripted_server import scripted

AUTH = ("AUTH-MISSING-TOKEN", "AUTH-BAD-TOKEN", "AUTH-BEFORE-VERSION", "AUTH-ROLE-FORBIDDEN", "AUTH-FULL-ACCESS-TOKEN")
ROLES = {"DW_WORKER_TOKEN": "worker-secret-1", "DW_OPERATOR_TOKEN": "operator-secret-1"}
FULL = {"DW_AUTH_TOKEN": "full-secret-1"}


def _auth_run(server: ServerProcess, report_dir: Path, env: dict[str, str], *, exit: int = 0) -> dict[str, str]:
    selection = [a for r in AUTH for a in ("--requirement", r)]
    run = run_suite(server.url, report_dir, *selection, "-m", "dw_check", env=env)
    assert run.returncode == exit, run.stdout[-3000:]
    assert run.results is not None
    return {r["id"]: r["verdict"] for r in run.results["requirements"] if r["id"] in AUTH}


def test_upstream_rule_admin_only_beside_role_tokens_passes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Upstream's legacy token is admin-only once role tokens exist: the worker plane answers it 403, the control
    plane accepts it. Legal: the requirement passes."""
    server = server_factory("--auth-token-admin-beside-roles", env={**ROLES, **FULL})
    verdicts = _auth_run(server, tmp_path / "reports", {**ROLES, **FULL})
    assert verdicts == dict.fromkeys(AUTH, "passed"), verdicts


def test_a_full_access_token_kept_off_the_control_plane_fails(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--fault", "full-token-worker-only", env={**ROLES, **FULL})
    verdicts = _auth_run(server, tmp_path / "reports", {**ROLES, **FULL}, exit=1)
    assert verdicts["AUTH-FULL-ACCESS-TOKEN"] == "failed", verdicts


def test_without_a_declared_full_access_token_the_requirement_is_not_judged_and_withholds_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Role tokens only on the server and in the run: the other auth rules pass, the full-access token's is
    unimplemented (checked: it keeps no run from CONFORMANT)."""
    server = server_factory(env=ROLES)
    verdicts = _auth_run(server, tmp_path / "reports", ROLES)
    assert verdicts == {**dict.fromkeys(AUTH, "passed"), "AUTH-FULL-ACCESS-TOKEN": "unimplemented"}, verdicts


@pytest.mark.slow
def test_a_server_with_role_tokens_only_run_with_role_tokens_only_is_conformant(tmp_path: Path) -> None:
    """A full run against a URL target, the restart checks included (the server started by a script that is the
    run's --restart-command)."""
    with scripted(tmp_path / "srv", *EMBEDDED_ARGS, env=ROLES) as server:
        restart = f"--restart-command={server.script}"
        run = run_suite(server.url, tmp_path / "reports", restart, env=ROLES, timeout=900)
    assert run.results is not None, run.stdout[-3000:]
    summary = run.results["summary"]
    assert (run.returncode, summary["verdict"]) == (0, "CONFORMANT"), (summary["gaps"], run.stdout[-3000:])
    rows = {r["id"]: r for r in run.results["requirements"]}
    assert rows["AUTH-FULL-ACCESS-TOKEN"]["verdict"] == "unimplemented"
    assert rows["AUTH-ROLE-FORBIDDEN"]["verdict"] == "passed"
