"""``recipes/server-ci.sh``, the suite's third use, run the way a server's CI runs it: the suite installed from
the wheel built from this checkout into a virtualenv of its own, the server under test (here the reference
server from that wheel, with the embedded target's test profile and its test clock) started by the command the
job names, waited for, and certified failures first — a whole ``--certify`` run whose signed bundle the
installed ``dw-certify`` verifies. The same job fails on a NOT CONFORMANT server and on a server that never
starts, and refuses its own bad settings. The recipe installs from the package index (as a CI job does)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import random
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from suite.certify import MANIFEST, key_fingerprint, keygen
from suite.target import EMBEDDED_ARGS

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "server-ci.sh"


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


def _job(
    tmp_path: Path, venv: Path, name: str, server_args: str, *pytest_args: str, port: int | None = None
) -> subprocess.CompletedProcess[str]:
    """One CI job: the recipe with its settings in the environment, from an empty working directory."""
    port = port or _free_port()
    work = tmp_path / name
    work.mkdir()
    tokens = {name: secrets.token_urlsafe(12) for name in ("worker", "operator", "auth")}
    credentials = " ".join(f"--{name}-token={token}" for name, token in tokens.items())
    server = f"{venv}/bin/python -m reference_server --port {port} --db {work}/dw.sqlite {credentials} {server_args}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DW_"))},
        # The job's secrets: role tokens and the full-access token, so the auth requirements are covered too.
        "DW_WORKER_TOKEN": tokens["worker"],
        "DW_OPERATOR_TOKEN": tokens["operator"],
        "DW_AUTH_TOKEN": tokens["auth"],
        "DW_SERVER_CMD": server,
        "DW_TARGET": f"http://127.0.0.1:{port}",
        "DW_SUITE_VENV": str(venv),
        "DW_REPORTS": str(work / "reports"),
        "DW_START_TIMEOUT": "60",
    }
    return subprocess.run(
        ["bash", str(RECIPE), *pytest_args], capture_output=True, text=True, timeout=1500, cwd=work, env=env
    )


def _evidence(job: subprocess.CompletedProcess[str]) -> str:
    """What a failed job said: the end of its output and of its errors, without pip's notes on index locations
    that hold no such package (hundreds of lines that would push the reason out of the message)."""
    errors = "\n".join(line for line in job.stderr.splitlines() if not line.startswith("WARNING: Location "))
    return f"{job.stdout[-3000:]}\n--- stderr ---\n{errors[-3000:]}"


@pytest.mark.slow
@pytest.mark.whole_suite
def test_the_recipe_certifies_a_server_and_fails_the_job_when_it_should(tmp_path: Path, venv: Path) -> None:
    private, public = keygen(tmp_path / "vendor.key")
    profile = " ".join(EMBEDDED_ARGS)

    job = _job(tmp_path, venv, "certify", profile, "--certify", f"--sign-key={private}")
    assert job.returncode == 0, _evidence(job)
    assert "\nCONFORMANT: http://127.0.0.1:" in job.stdout
    # The suite ran from the wheel in the job's own virtualenv, not from this checkout.
    where = subprocess.run(
        [f"{venv}/bin/python", "-c", "import suite; print(suite.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(venv)), where.stdout
    reports = tmp_path / "certify" / "reports"
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
    assert "[dw] machine workflow_leases:" in job.stdout  # a progress line per machine…
    assert "[dw] versioning:" in job.stdout  # …and per area
    assert "[dw]" not in (folder / "report.html").read_text(encoding="utf-8")  # …that never reaches a report

    # A server broken in one rule fails the job (exit 1, NOT CONFORMANT); the venv is reused.
    broken = _job(
        tmp_path, venv, "broken", f"{profile} --fault ignore-version-header", "--requirement", "VERSION-MISSING"
    )
    assert broken.returncode == 1, _evidence(broken)
    assert "\nNOT CONFORMANT: " in broken.stdout
    # A server that exits before it answers fails the job with the recipe's own status.
    dead = _job(tmp_path, venv, "dead", "--no-such-option")
    assert dead.returncode == 3, _evidence(dead)
    assert "exited before it answered" in dead.stderr


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "serving"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def decoy() -> Iterator[int]:
    """Another process's server on the port the job was given, answering ``GET /api/health`` with 200 — as
    another test's reference server did when it was handed the port the job had picked and not yet bound."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_recipe_refuses_a_port_another_process_serves(tmp_path: Path, venv: Path, decoy: int) -> None:
    # The job's server cannot bind the decoy's port; the decoy answers 200. The job never judges the decoy.
    job = _job(tmp_path, venv, "decoy", " ".join(EMBEDDED_ARGS), port=decoy)
    assert job.returncode == 3, _evidence(job)
    assert f"port {decoy} is held by a process this job did not start" in job.stderr
    assert "suite exit status" not in job.stdout


def test_the_recipe_refuses_its_own_bad_settings_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DW_")}
    for extra, message in (
        ({}, "DW_SERVER_CMD is not set"),
        ({"DW_SERVER_CMD": "true", "DW_TARGET": "ftp://x"}, "is not an http(s) URL"),
        ({"DW_SERVER_CMD": "true", "DW_START_TIMEOUT": "0"}, "is not a whole number of seconds"),
    ):
        proc = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path, env={**env, **extra})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert message in proc.stderr
        assert not (tmp_path / ".dw-suite-venv").exists()  # refused before anything was installed
