"""``recipes/server-ci.sh``, the suite's third use, run the way a server's CI runs it, and ``action.yml``, the same
script as a composite GitHub Action. The recipe is copied into a server's repository (a project of its own, which
must never be built as "the suite") and installs the suite by its package name and release — here found beside
the package index, built from this checkout as a release is — into a virtualenv of its own; the server under
test (the reference server from that wheel, with the embedded target's test profile and its test clock) is
started by the command the job names, waited for, and certified failures first: a whole ``--certify`` run, run
through the action's own step with its inputs, whose signed bundle the installed ``dw-certify`` verifies. The
same job fails on a NOT CONFORMANT server and on a server that never starts, and refuses its own bad settings."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from suite.certify import MANIFEST, key_fingerprint, keygen
from suite.target import EMBEDDED_ARGS
from tests.suite.decoys import health_decoy

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "server-ci.sh"
WORKFLOW = ROOT / "recipes" / "github-actions.yml"
ACTION = ROOT / "action.yml"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
RELEASE = f"{PROJECT['name']}=={PROJECT['version']}"
# Each input of the action and the recipe's setting it becomes.
ACTION_SETTINGS = {
    "server-command": "DW_SERVER_CMD",
    "target": "DW_TARGET",
    "worker-token": "DW_WORKER_TOKEN",
    "operator-token": "DW_OPERATOR_TOKEN",
    "auth-token": "DW_AUTH_TOKEN",
    "certify": "DW_CERTIFY",
    "sign-key": "DW_SIGN_KEY",
    "artifacts": "DW_REPORTS",
    "suite": "DW_SUITE",
    "restart-command": "DW_RESTART_CMD",
    "start-timeout": "DW_START_TIMEOUT",
}


def _free_port() -> int:
    """A free port outside the range the system hands out for port 0. The recipe is given its port in advance
    and binds it only after installing the suite; a port picked by binding port 0 may meanwhile be handed to
    another test's server (every reference server a test starts asks for port 0), which would then answer on
    it. The recipe refuses such a port (``test_the_recipe_refuses_a_port_another_process_serves``); this keeps
    the tests from meeting it."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {low}")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's virtualenv, created by the recipe's first job in this module and reused by the next."""
    return tmp_path_factory.mktemp("suite-venv") / "venv"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's release as a package index holds it: the wheel built from this checkout, named for the package
    (``dw_conformance-<version>-py3-none-any.whl``). The jobs find it beside the index pip is configured with."""
    out = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def _vendor_repository(tmp_path: Path) -> Path:
    """A server's repository with the recipe copied in as ci/server-ci.sh, as the workflow says: a Python project
    of its own, which the recipe must never install as the suite."""
    repo = tmp_path / "vendor"
    (repo / "ci").mkdir(parents=True, exist_ok=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "vendor-server"\nversion = "9.9.9"\n', encoding="utf-8")
    shutil.copy(RECIPE, repo / "ci" / "server-ci.sh")
    return repo


def _settings(tmp_path: Path, venv: Path, name: str, server_args: str, port: int | None) -> dict[str, str]:
    """One job's settings: its server on its port with its own tokens, its reports, the shared virtualenv."""
    port = port or _free_port()
    work = tmp_path / name
    work.mkdir()
    tokens = {name: secrets.token_urlsafe(12) for name in ("worker", "operator", "auth")}
    credentials = " ".join(f"--{name}-token={token}" for name, token in tokens.items())
    server = f"{venv}/bin/python -m reference_server --port {port} --db {work}/dw.sqlite {credentials} {server_args}"
    return {
        # The job's secrets: role tokens and the full-access token, so the auth requirements are covered too.
        "DW_WORKER_TOKEN": tokens["worker"],
        "DW_OPERATOR_TOKEN": tokens["operator"],
        "DW_AUTH_TOKEN": tokens["auth"],
        "DW_SERVER_CMD": server,
        "DW_TARGET": f"http://127.0.0.1:{port}",
        "DW_REPORTS": str(work / "reports"),
        "DW_START_TIMEOUT": "60",
    }


def _base_env(venv: Path, wheelhouse: Path) -> dict[str, str]:
    """The CI machine's environment: no setting of the suite's own, the job's virtualenv, and the release found
    beside the package index (PIP_FIND_LINKS, a space-separated list, keeps what the machine already had)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DW_"))},
        "DW_SUITE_VENV": str(venv),
        "PIP_FIND_LINKS": f"{os.environ.get('PIP_FIND_LINKS', '')} {wheelhouse}".strip(),
    }


def _job(
    tmp_path: Path,
    venv: Path,
    wheelhouse: Path,
    name: str,
    server_args: str,
    *pytest_args: str,
    port: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """One CI job: the recipe copied into the server's repository, its settings in the environment (DW_SUITE
    left unset: the release), run from the repository's root."""
    repo = _vendor_repository(tmp_path)
    env = {**_base_env(venv, wheelhouse), **_settings(tmp_path, venv, name, server_args, port)}
    return subprocess.run(
        ["bash", "ci/server-ci.sh", *pytest_args], capture_output=True, text=True, timeout=1500, cwd=repo, env=env
    )


_EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _action() -> dict[str, Any]:
    doc = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _run_action(inputs: Mapping[str, str], env: Mapping[str, str], cwd: Path) -> tuple[int, str, dict[str, str]]:
    """The action's ``run`` steps as a runner runs them: each input's value (or its default) put in for
    ``${{ inputs.NAME }}``, the step's script run by ``bash --noprofile --norc -eo pipefail`` with the step's
    environment, ``GITHUB_ACTION_PATH`` (the action's own checkout) and a ``GITHUB_OUTPUT`` file; returns the
    exit status, the output and the action's outputs, read from the step's."""
    action = _action()
    declared = action["inputs"]
    assert set(inputs) <= set(declared), set(inputs) - set(declared)
    given = {name: inputs.get(name, str(spec.get("default", ""))) for name, spec in declared.items()}

    def expand(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            kind, _, name = match.group(1).partition(".")
            assert kind == "inputs", f"{match.group(0)}: a step reads only its inputs"
            return given[name]

        return _EXPRESSION.sub(one, text)

    outputs, log, status = {}, "", 0
    for number, step in enumerate(action["runs"]["steps"]):
        if "run" not in step:
            continue
        assert step["shell"] == "bash"
        script = cwd.parent / f"action-step-{number}.sh"
        script.write_text(expand(step["run"]), encoding="utf-8")
        out = cwd.parent / f"action-step-{number}.out"
        out.write_text("", encoding="utf-8")
        step_env = {
            **env,
            **{k: expand(str(v)) for k, v in step.get("env", {}).items()},
            "GITHUB_ACTION_PATH": str(ROOT),
            "GITHUB_OUTPUT": str(out),
        }
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            capture_output=True,
            text=True,
            timeout=1500,
            cwd=cwd,
            env=step_env,
        )
        log += proc.stdout + "\n--- stderr ---\n" + proc.stderr
        written = dict(line.split("=", 1) for line in out.read_text(encoding="utf-8").splitlines() if "=" in line)
        for name, spec in action.get("outputs", {}).items():
            match = re.fullmatch(rf"\$\{{\{{\s*steps\.{step.get('id')}\.outputs\.([\w-]+)\s*\}}\}}", spec["value"])
            if match and match.group(1) in written:
                outputs[name] = written[match.group(1)]
        status = proc.returncode
        if status:
            break
    return status, log, outputs


def _evidence(job: subprocess.CompletedProcess[str] | str) -> str:
    """What a failed job said: the end of its output and of its errors, without pip's notes on index locations
    that hold no such package (hundreds of lines that would push the reason out of the message)."""
    text = job if isinstance(job, str) else f"{job.stdout}\n--- stderr ---\n{job.stderr}"
    lines = [line for line in text.splitlines() if not line.startswith("WARNING: Location ")]
    return "\n".join(lines)[-6000:]


def _installed(venv: Path) -> dict[str, str]:
    listed = subprocess.run(
        [f"{venv}/bin/python", "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    return {row["name"].lower(): row["version"] for row in json.loads(listed.stdout)}


@pytest.mark.slow
@pytest.mark.whole_suite
def test_the_recipe_certifies_a_server_and_fails_the_job_when_it_should(
    tmp_path: Path, venv: Path, wheelhouse: Path
) -> None:
    assert [p.name for p in wheelhouse.glob("*.whl")] == [
        f"{PROJECT['name'].replace('-', '_')}-{PROJECT['version']}-py3-none-any.whl"
    ]
    private, public = keygen(tmp_path / "vendor.key")
    profile = " ".join(EMBEDDED_ARGS)

    # The certification, through the action's own step: its inputs become the recipe's settings.
    settings = _settings(tmp_path, venv, "certify", profile, None)
    repo = _vendor_repository(tmp_path)
    inputs = {
        "server-command": settings["DW_SERVER_CMD"],
        "target": settings["DW_TARGET"],
        "worker-token": settings["DW_WORKER_TOKEN"],
        "operator-token": settings["DW_OPERATOR_TOKEN"],
        "auth-token": settings["DW_AUTH_TOKEN"],
        "certify": "true",
        "sign-key": str(private),
        "artifacts": settings["DW_REPORTS"],
    }
    status, log, outputs = _run_action(inputs, _base_env(venv, wheelhouse), repo)
    assert status == 0, _evidence(log)
    assert outputs == {"verdict": "CONFORMANT", "exit-status": "0"}, _evidence(log)
    assert "\nCONFORMANT: http://127.0.0.1:" in log
    # The suite's release, by its name and version, in the job's own virtualenv — never the server's repository.
    installed = _installed(venv)
    assert installed.get(PROJECT["name"]) == PROJECT["version"]
    assert "vendor-server" not in installed
    where = subprocess.run(
        [f"{venv}/bin/python", "-c", "import suite; print(suite.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(venv)), where.stdout
    reports = Path(settings["DW_REPORTS"])
    assert (reports / "server.log").exists()
    (folder,) = [p.parent for p in reports.glob(f"*/{MANIFEST}")]
    verified = subprocess.run(
        [f"{venv}/bin/dw-certify", "verify", str(folder), "--public-key", str(public)], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"VERIFIED: signed by {key_fingerprint(private)}: {folder}: CONFORMANT")
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert results["target"]["time"]["test_clock_used"] is True  # one process: the target's clock moved
    assert results["completeness"]["not_run"] == []
    assert results["summary"]["checked"] == results["summary"]["applicable"]
    assert "[dw] machine workflow_leases:" in log  # a progress line per machine…
    assert "[dw] versioning:" in log  # …and per area
    assert "[dw]" not in (folder / "report.html").read_text(encoding="utf-8")  # …that never reaches a report

    # A server broken in one rule fails the job (exit 1, NOT CONFORMANT); the venv is reused.
    broken = _job(
        tmp_path,
        venv,
        wheelhouse,
        "broken",
        f"{profile} --fault ignore-version-header",
        "--requirement",
        "VERSION-MISSING",
    )
    assert broken.returncode == 1, _evidence(broken)
    assert "\nNOT CONFORMANT: " in broken.stdout
    assert "server-ci: verdict NOT CONFORMANT (exit status 1); reports in " in broken.stdout
    # A server that exits before it answers fails the job with the recipe's own status.
    dead = _job(tmp_path, venv, wheelhouse, "dead", "--no-such-option")
    assert dead.returncode == 3, _evidence(dead)
    assert "exited before it answered" in dead.stderr
    assert "server-ci: verdict SERVER NOT STARTED (exit status 3)" in dead.stdout
    assert "vendor-server" not in _installed(venv)


@pytest.fixture
def decoy() -> Iterator[int]:
    """Another process's server on the port the job was given, answering ``GET /api/health`` with 200 — as
    another test's reference server did when it was handed the port the job had picked and not yet bound."""
    with health_decoy(_free_port()) as port:
        yield port


@pytest.mark.slow
def test_the_recipe_refuses_a_port_another_process_serves(
    tmp_path: Path, venv: Path, wheelhouse: Path, decoy: int
) -> None:
    # The job's server cannot bind the decoy's port; the decoy answers 200. The job never judges the decoy.
    job = _job(tmp_path, venv, wheelhouse, "decoy", " ".join(EMBEDDED_ARGS), port=decoy)
    assert job.returncode == 3, _evidence(job)
    assert f"port {decoy} is held by a process this job did not start" in job.stderr
    assert "suite exit status" not in job.stdout


def test_the_recipe_refuses_its_own_bad_settings_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DW_")}
    not_a_checkout = tmp_path / "not-a-checkout"
    not_a_checkout.mkdir()
    key = tmp_path / "vendor.key"
    key.write_text("a key", encoding="utf-8")
    for extra, message in (
        ({}, "DW_SERVER_CMD is not set"),
        ({"DW_SERVER_CMD": "true", "DW_TARGET": "ftp://x"}, "is not an http(s) URL"),
        ({"DW_SERVER_CMD": "true", "DW_START_TIMEOUT": "0"}, "is not a whole number of seconds"),
        ({"DW_SERVER_CMD": "true", "DW_CERTIFY": "yes"}, "DW_CERTIFY=yes is neither true nor false"),
        ({"DW_SERVER_CMD": "true", "DW_CERTIFY": "true", "DW_SIGN_KEY": "nokey"}, "DW_SIGN_KEY=nokey is not a file"),
        ({"DW_SERVER_CMD": "true", "DW_SIGN_KEY": str(key)}, "DW_SIGN_KEY is set without DW_CERTIFY=true"),
        ({"DW_SERVER_CMD": "true", "DW_SUITE": str(not_a_checkout)}, "is a directory without pyproject.toml"),
    ):
        proc = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path, env={**env, **extra})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert message in proc.stderr
        assert proc.stdout == "server-ci: verdict SETTINGS ERROR (exit status 2); reports in none\n"
        assert not (tmp_path / ".dw-suite-venv").exists()  # refused before anything was installed


def test_the_recipe_installs_the_suites_release_by_its_name_unless_told_otherwise() -> None:
    """The default is the suite's package at the release the recipe names — the project's own name and version —
    never the repository the recipe was copied into; a checkout is built only when DW_SUITE names it."""
    script = RECIPE.read_text(encoding="utf-8")
    (release,) = re.findall(r'^SUITE_RELEASE="([^"]+)"$', script, re.M)
    assert release == RELEASE
    assert 'suite="${DW_SUITE:-$SUITE_RELEASE}"' in script
    # The only wheel built is from a directory DW_SUITE names; nothing is built from where the script lives.
    assert "BASH_SOURCE" not in script
    (build,) = [line.strip() for line in script.splitlines() if "pip wheel" in line]
    assert build.endswith('"$suite"')
    # The examples name the same release, and no wheel URL that nobody publishes.
    for doc in (WORKFLOW, ROOT / "README.md", ROOT / "docs" / "certification.md"):
        text = doc.read_text(encoding="utf-8")
        assert not re.search(r"https?://\S+\.whl", text), doc
        for named in re.findall(r"dw-conformance==[\w.]+", text):
            assert named == RELEASE, (doc, named)
        for wheel in re.findall(r"dw_conformance-[\w.]+?-py3-none-any\.whl", text):
            assert wheel == f"dw_conformance-{PROJECT['version']}-py3-none-any.whl", (doc, wheel)


def test_every_line_a_server_changes_is_marked() -> None:
    """In the workflow a server copies, each line that names the server (how it is built, started, where it
    listens, its secrets, certify or not) sits under a ``# CHANGE ME:`` comment; the script itself is copied
    unchanged (its settings are the environment)."""
    lines = WORKFLOW.read_text(encoding="utf-8").splitlines()

    def marked(index: int) -> bool:
        above = index - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            if lines[above].strip().startswith("# CHANGE ME:"):
                return True
            above -= 1
        return False

    vendor_specific = ("DW_SERVER_CMD:", "DW_TARGET:", "run: make build", "DW_CERTIFY:", "DW_WORKER_TOKEN:")
    for needle in vendor_specific:
        (index,) = [i for i, line in enumerate(lines) if line.strip().startswith(needle)]
        assert marked(index), f"{needle} is not under a '# CHANGE ME:' comment"
    assert "CHANGE ME" not in RECIPE.read_text(encoding="utf-8").replace('"CHANGE ME"', "")
    steps = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]["conformance"]["steps"]
    assert any(step.get("run") == "bash ci/server-ci.sh" for step in steps)


def test_the_action_is_the_recipe_with_its_inputs_as_the_settings() -> None:
    """``action.yml`` is a composite action whose one run step calls the recipe (from the action's own checkout)
    with each input as the recipe's setting, and whose outputs are the recipe's."""
    action = _action()
    assert action["runs"]["using"] == "composite"
    inputs = action["inputs"]
    assert {"target", "worker-token", "operator-token", "certify", "sign-key", "artifacts"} <= set(inputs)
    assert set(inputs) - {"artifact-name"} == set(ACTION_SETTINGS)
    assert inputs["server-command"].get("required") is True
    (run,) = [step for step in action["runs"]["steps"] if "run" in step]
    assert run["shell"] == "bash"
    assert run["env"] == {setting: f"${{{{ inputs.{name} }}}}" for name, setting in ACTION_SETTINGS.items()}
    calls = [line.strip() for line in run["run"].splitlines() if "server-ci.sh" in line]
    assert calls == ['bash "$GITHUB_ACTION_PATH/recipes/server-ci.sh"']
    documented = RECIPE.read_text(encoding="utf-8").split("set -euo pipefail")[0]
    for setting in ACTION_SETTINGS.values():
        assert setting in documented, setting
    assert action["outputs"]["verdict"]["value"] == "${{ steps.conformance.outputs.verdict }}"
    assert run["id"] == "conformance"
    (upload,) = [step for step in action["runs"]["steps"] if "uses" in step]
    assert upload["uses"].startswith("actions/upload-artifact@")
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "${{ inputs.artifacts }}"


def test_the_action_passes_no_empty_token_and_refuses_what_the_recipe_refuses(tmp_path: Path) -> None:
    """Run as a runner runs it: an input left out is no setting at all (the suite refuses an empty token), and a
    bad input is the recipe's one-line refusal, with the verdict output saying so."""
    work = tmp_path / "repo"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DW_")}
    status, log, outputs = _run_action({"server-command": "true", "certify": "maybe"}, env, work)
    assert status == 2, log
    assert "DW_CERTIFY=maybe is neither true nor false" in log
    assert outputs == {"verdict": "SETTINGS ERROR", "exit-status": "2"}
    probe = tmp_path / "probe.sh"
    probe.write_text('printf "%s|" "${DW_WORKER_TOKEN-unset}" "${DW_OPERATOR_TOKEN-unset}"\n', encoding="utf-8")
    step = next(step for step in _action()["runs"]["steps"] if "run" in step)["run"]
    shown = subprocess.run(
        ["bash", "-c", step.replace('bash "$GITHUB_ACTION_PATH/recipes/server-ci.sh"', f"bash {probe}")],
        capture_output=True,
        text=True,
        env={**env, "DW_WORKER_TOKEN": "", "DW_OPERATOR_TOKEN": "o-token"},
        check=True,
    )
    assert shown.stdout == "unset|o-token|"
