"""The suite's own input: every bad option fails before the first request, in one line, with exit 4 — and
``--certify`` refuses, just as early, everything that would narrow the run.

The target of these runs is an address nothing listens on: a run that got past its option checks would end
in a harness error (exit 10) instead, so exit 4 shows the check came before any request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

import schemas
from suite.outcomes import EXIT_USAGE
from suite.plugin import HINT
from suite.protocol.requirements import REGISTRY
from suite.settings import LIMITS
from tests.conftest import ServerProcess, run_suite, start_server
from tests.suite.runs import UNREACHABLE, pytest_cli

SCHEMA = Draft202012Validator(schemas.load_json("json/report.schema.json"))


def _usage_error(run_output: str) -> str:
    errors = [line for line in run_output.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1, run_output[-2000:]
    assert "Traceback" not in run_output
    return errors[0]


# A bad argument → the start of the one line that refuses it.
BAD = {
    "--max-wait -5": "--max-wait=-5: must be a number of seconds from 1 to 3600",
    "--max-wait soon": "--max-wait=soon: must be a number of seconds from 1 to 3600",
    "--max-wait nan": "--max-wait=nan: must be a number",
    "--machine-examples -1": "--machine-examples=-1: must be a whole number from 1 to 10000",
    "--machine-steps 0": "--machine-steps=0: must be a whole number from 1 to 10000",
    "--fuzz-examples -3": "--fuzz-examples=-3: must be a whole number from 0 to 10000",
    "--fuzz-examples 2.5": "--fuzz-examples=2.5: must be a whole number",
    "--fault-seed -1": "--fault-seed=-1: must be a whole number from 0 to 4294967295",
    "--protocol-version 2.0": "--protocol-version=2.0: must be 1.0 … 1.20",
    "--requirement NOT-A-REQ": "--requirement=NOT-A-REQ: not a requirement ID",
    "--faults explode=1": "--faults=explode=1:",
    "--namespace=": "--namespace='': give the name of an existing namespace",
    "--format xml": "--format=xml: must be text or json",
    "dw::NOT-A-REQ": "dw::NOT-A-REQ: no item of the suite has this id or prefix",
    "tests/": "tests/: with --target the suite runs its own items",
    "--sign-key k.pem": "--sign-key=k.pem: signing needs --certify",
    # --certify refuses whatever would narrow the run, in the same way
    "--certify --requirement VERSION-TRIM": "--certify cannot run with --requirement VERSION-TRIM: a certification",
    "--certify -k version": "--certify cannot run with -k 'version': a certification",
    "--certify -m dw_check": "--certify cannot run with -m 'dw_check': a certification",
    "--certify --deselect dw::machine::x": "--certify cannot run with --deselect dw::machine::x: a certification",
    "--certify dw::VERSION-TRIM": "--certify cannot run with dw::VERSION-TRIM: a certification",
    "--certify --machine-examples 2": "--certify cannot run with --machine-examples 2 (below the default 8)",
    "--certify --machine-steps 10": "--certify cannot run with --machine-steps 10 (below the default 40)",
    "--certify --fuzz-examples 0": "--certify cannot run with --fuzz-examples 0 (below the default 20)",
    "--certify --max-wait 10": "--certify cannot run with --max-wait 10 (below the default 30)",
    "--certify --faults standard": "--certify cannot run with --faults standard: a certification",
    "--certify --collect-only": "--certify cannot run with --collect-only: a certification",
}


@pytest.mark.parametrize("given", list(BAD))
def test_bad_options_fail_before_the_first_request(tmp_path: Path, given: str) -> None:
    args, says = given.split(), BAD[given]
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", *args)
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    assert says in _usage_error(run.output)


def test_every_budget_and_wait_has_a_range() -> None:
    """Each numeric option of the suite is parsed through a Limit: none is accepted unchecked."""
    assert set(LIMITS) == {
        "max_wait",
        "machine_examples",
        "machine_steps",
        "fuzz_examples",
        "fault_seed",
        "seed",
        "concurrency",
    }
    for limit in LIMITS.values():
        with pytest.raises(pytest.UsageError, match=limit.option):
            limit.parse(limit.low - 1)
        with pytest.raises(pytest.UsageError, match=limit.option):
            limit.parse(limit.high + 1)
        assert limit.parse(limit.low) == limit.low


def test_a_bad_seed_in_the_environment_is_a_usage_error(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", env={"DW_CONFORMANCE_SEED": "lucky"})
    assert run.returncode == EXIT_USAGE
    assert "DW_CONFORMANCE_SEED=lucky: must be a whole number" in _usage_error(run.output)


@pytest.mark.parametrize("target", ["notaurl", "ftp://example.com", "http://", "http://host:99999", "localhost:8080"])
def test_a_target_that_is_not_an_http_url_is_a_usage_error(tmp_path: Path, target: str) -> None:
    run = pytest_cli(tmp_path, f"--target={target}")
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    assert f"--target={target}: give an http(s) URL" in _usage_error(run.output)


def test_a_report_dir_that_cannot_be_written_is_refused_first(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", f"--report-dir={blocker / 'reports'}")
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    line = _usage_error(run.output)
    assert f"--report-dir={blocker / 'reports'}: cannot create or write it" in line
    assert "pass a writable directory" in line


def test_an_unknown_namespace_is_a_usage_error_not_the_targets_failure(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, "--target=embedded", "--namespace", "NoSuchSpace", f"--report-dir={tmp_path / 'r'}")
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    line = _usage_error(run.output)
    assert "--namespace=nosuchspace: the target has no such namespace" in line
    assert "404 namespace_not_found" in line
    assert not list((tmp_path / "r").glob("*/results.json"))  # no verdict was written on the target


def test_certify_refuses_a_sign_key_that_is_not_an_ed25519_private_key(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key", encoding="utf-8")
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", "--certify", "--sign-key", str(key))
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    assert f"--sign-key={key}:" in _usage_error(run.output)


def test_list_requirements_as_text_and_json(tmp_path: Path) -> None:
    text = pytest_cli(tmp_path, "--list-requirements")
    assert text.returncode == 0, text.output[-2000:]
    lines = text.output.strip().splitlines()
    assert len(lines) == len(REGISTRY)
    trim = next(line for line in lines if line.startswith("VERSION-TRIM "))
    assert "MUST" in trim
    assert "versioning" in trim
    assert REGISTRY["VERSION-TRIM"].section in trim
    doc = pytest_cli(tmp_path, "--list-requirements", "--format", "json")
    assert doc.returncode == 0
    rows = json.loads(doc.output)
    assert [r["id"] for r in rows] == list(REGISTRY)
    assert {"id", "level", "area", "minor", "section", "sentence"} <= set(rows[0])
    assert rows[0]["sentence"] == next(iter(REGISTRY.values())).sentence


def test_plain_pytest_without_target_prints_a_hint_when_it_collects_nothing(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path)
    assert run.returncode == 5  # pytest's own "no tests collected"
    assert HINT in run.output.splitlines()
    (tmp_path / "test_other.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    other = pytest_cli(tmp_path)
    assert other.returncode == 0
    assert HINT not in other.output  # any other pytest run is left alone


def test_help_documents_every_exit_status(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, "--help")
    flat = " ".join(run.output.split())
    for text in (
        "0 CONFORMANT",
        "1 NOT CONFORMANT",
        "4 usage error",
        "10 harness error",
        "11 INCOMPLETE under --certify",
    ):
        assert text in flat, text


# -- the tokens: probed on their planes before the first check ------------------------------------------------

WORKER, OPERATOR, FULL = "worker-token-of-the-server", "operator-token-of-the-server", "full-token-of-the-server"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A reference server with role tokens and a full-access token beside them, shared by the runs that only
    probe it."""
    db = tmp_path_factory.mktemp("auth") / "db.sqlite"
    server = start_server(db, f"--worker-token={WORKER}", f"--operator-token={OPERATOR}", f"--auth-token={FULL}")
    yield server
    server.stop()


# The tokens given → the option the one line names, and the plane.
REFUSED_TOKENS = {
    "wrong worker token": (("--worker-token", "WRONG", "--operator-token", OPERATOR), "--worker-token", "worker"),
    "operator token as worker token": (
        ("--worker-token", OPERATOR, "--operator-token", OPERATOR),
        "--worker-token",
        "worker",
    ),
    "wrong operator token": (("--worker-token", WORKER, "--operator-token", "WRONG"), "--operator-token", "control"),
    "no operator token": (("--worker-token", WORKER), "--operator-token", "control"),
    "wrong full-access token alone": (("--auth-token", "WRONG"), "--auth-token", "worker"),
    "wrong full-access token beside role tokens": (
        ("--worker-token", WORKER, "--operator-token", OPERATOR, "--auth-token", "WRONG"),
        "--auth-token",
        "worker",
    ),
    "no token at all": ((), "--worker-token and --operator-token", "both"),
}


@pytest.mark.parametrize("case", list(REFUSED_TOKENS))
def test_a_refused_token_is_a_usage_error_naming_it_and_its_plane(
    auth_server: ServerProcess, tmp_path: Path, case: str
) -> None:
    """A wrong token (a typo, a secret that is not set) is the user's to fix: one line naming the option and the
    plane, exit 4, before any check ran — never hundreds of failures blamed on a correct server."""
    tokens, option, plane = REFUSED_TOKENS[case]
    reports = tmp_path / "r"
    run = pytest_cli(tmp_path, f"--target={auth_server.url}", f"--report-dir={reports}", *tokens)
    assert run.returncode == EXIT_USAGE, run.output[-3000:]
    line = _usage_error(run.output)
    assert line.startswith(f"ERROR: {option}:"), line
    assert ("on both planes" if plane == "both" else f"on the {plane} plane") in line, line
    assert any(status in line for status in ("401 unauthorized", "403 forbidden")), line
    assert "pass the server's" in line
    assert not list(reports.glob("*/results.json"))  # no verdict on the target
    assert " passed" not in run.output  # no check ran
    assert "FAILED" not in run.output


def test_under_certify_a_refused_token_writes_no_bundle(auth_server: ServerProcess, tmp_path: Path) -> None:
    reports = tmp_path / "r"
    run = pytest_cli(
        tmp_path,
        f"--target={auth_server.url}",
        f"--report-dir={reports}",
        "--certify",
        "-x",  # on a suite that does not probe, the run stops at its first (false) failure instead of running on
        "--worker-token",
        "WRONG",
        "--operator-token",
        OPERATOR,
    )
    assert run.returncode == EXIT_USAGE, run.output[-3000:]
    assert _usage_error(run.output).startswith("ERROR: --worker-token: the target refused this token")
    assert not list(reports.glob("*/manifest.json"))
    assert not list(reports.glob("*/results.json"))


@pytest.mark.parametrize(
    "given", [("--operator-token=",), ("--worker-token", " ")], ids=["empty option", "blank option"]
)
def test_an_empty_token_is_refused_before_the_first_request(tmp_path: Path, given: tuple[str, ...]) -> None:
    option = given[0].removesuffix("=")
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", *given)
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    assert f"ERROR: {option} is empty" in _usage_error(run.output)


def test_an_unset_secret_in_the_environment_is_an_empty_token(tmp_path: Path) -> None:
    run = pytest_cli(tmp_path, f"--target={UNREACHABLE}", env={"DW_OPERATOR_TOKEN": ""})
    assert run.returncode == EXIT_USAGE, run.output[-2000:]
    assert "--operator-token is empty (given as '' or through an empty DW_OPERATOR_TOKEN)" in _usage_error(run.output)


def test_the_right_tokens_are_reported_accepted(auth_server: ServerProcess, tmp_path: Path) -> None:
    run = run_suite(
        auth_server.url,
        tmp_path / "r",
        "--requirement",
        "AUTH-MISSING-TOKEN",
        "-m",
        "dw_check",
        env={"DW_WORKER_TOKEN": WORKER, "DW_OPERATOR_TOKEN": OPERATOR, "DW_AUTH_TOKEN": FULL},
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.results is not None
    assert run.results["target"]["auth"]["enabled"] is True
    assert run.verdict("AUTH-MISSING-TOKEN") == "passed"


def test_a_target_with_auth_off_is_reported_and_its_auth_requirements_name_the_servers_configuration(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Auth off (the server was started without tokens): one line in the header and in results.json, and every
    auth requirement not covered, naming the server's configuration — passing tokens would not cover it."""
    server = server_factory("--test-clock")
    auth = (
        "AUTH-MISSING-TOKEN",
        "AUTH-BAD-TOKEN",
        "AUTH-BEFORE-VERSION",
        "AUTH-ROLE-FORBIDDEN",
        "AUTH-FULL-ACCESS-TOKEN",
    )
    selection = [a for r in auth for a in ("--requirement", r)]
    for tokens in ({}, {"DW_WORKER_TOKEN": "any", "DW_OPERATOR_TOKEN": "thing"}):
        run = run_suite(server.url, tmp_path / f"r{len(tokens)}", *selection, "-m", "dw_check", env=tokens)
        assert run.returncode == 0, run.stdout[-3000:]
        assert run.results is not None
        doc = run.results["target"]["auth"]
        assert doc["enabled"] is False
        assert doc["summary"].startswith("off — the target accepted worker-plane requests without a token")
        # -q: no header, so the summary at the end says it (wrapped to the terminal's width)
        assert f"auth: {doc['summary']}" in " ".join(run.stdout.split())
        SCHEMA.validate(run.results)
        for row in run.results["requirements"]:
            if row["id"] == "AUTH-FULL-ACCESS-TOKEN":  # no full-access token declared: a server's option
                assert row["verdict"] == "unimplemented", row
            elif row["id"] in auth:
                assert row["verdict"] == "not-covered", row
                assert row["reason"] == "the target has auth off: it accepts requests without a token", row
                assert "server's configuration" in row["setting"], row
                assert not row["setting"].startswith("--"), row  # not "pass --worker-token": tokens cover nothing
