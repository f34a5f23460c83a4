"""The OpenAPI fuzzing (suite/fuzz/): its response checks are the registry's, they fire on the answers they
exist for, its Avro generator makes real frames, the reference server survives a small budget, and a server that
answers one kind of request with a 500 is caught with ROBUST-NO-5XX and a curl line that reproduces it.

The broken server is the reference server behind a tiny in-test proxy (no named fault of
``reference_server/faults/`` yields a 5xx): the proxy turns every 422 of the worker heartbeat route into
a 500, the way a server crashes in its validation error path.
"""

from __future__ import annotations

import http.client
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings

from suite import fuzz, registry
from suite.client import WORKER_HEADER, Exchange
from suite.context import TargetInfo
from suite.outcomes import EXIT_HARNESS_ERROR
from suite.protocol.codec import decode_blob, encode_blob
from tests.conftest import ServerProcess, run_suite

TARGET = TargetInfo(
    url="http://127.0.0.1:9",
    cluster_info={"worker_protocol": {"version": "1.20", "server_capabilities": {}}},
)


def _answer(op_id: str, status: int, body: Any, headers: dict[str, str] | None = None) -> fuzz.Answer:
    op = fuzz.operations()[op_id]
    path = op.path.replace("{", "").replace("}", "")
    ex = Exchange(
        method=op.method,
        url=TARGET.url + path,
        request_headers={"Authorization": "<redacted>"},
        request_body='{"worker_id": 5}',
        status=status,
        response_body=body,
    )
    return fuzz.Answer(op, ex, status, {k.lower(): v for k, v in (headers or {}).items()}, body, path, TARGET)


def _failed(answer: fuzz.Answer) -> set[str]:
    return {f.requirement for f in fuzz.judge(answer) if f.requirement}


WORKER_ERROR = {"reason": "validation_failed", "protocol_version": "1.20", "server_capabilities": {}}


# -- fast: the pieces --------------------------------------------------------------------------------------


def test_every_operation_is_fuzzed_and_every_world_names_an_operation() -> None:
    ops = fuzz.operations()
    assert len(ops) == 44
    grouped = [name for group in fuzz.all_groups() for name in fuzz.group_members(group)]
    assert sorted(n for n in grouped if n != fuzz.STATEFUL) == sorted(ops)
    assert set(fuzz.WORLDS) <= set(ops)


def test_the_response_checks_are_registered_with_the_registry_and_judge_the_fuzz_requirements() -> None:
    checks = {c.name: c.requirements for c in registry.response_checks()}
    assert checks == {
        "not_a_server_error": (fuzz.NO_5XX,),
        "status_code_conformance": (fuzz.STATUS_SET,),
        "response_schema_conformance": (fuzz.SCHEMA,),
        "error_envelope": (fuzz.ENVELOPE, fuzz.ERROR_REASON),
    }
    judged = {r for reqs in checks.values() for r in reqs} | {fuzz.NO_CHANGE}
    assert judged == set(fuzz.FUZZ_REQUIREMENTS)
    assert fuzz.group_requirements("workflows") == fuzz.FUZZ_REQUIREMENTS
    assert fuzz.group_requirements("stateful") == (*fuzz.FUZZ_REQUIREMENTS, fuzz.AFTER_COMPLETE)


def test_the_registry_refuses_a_response_check_of_an_unknown_requirement_or_a_taken_name() -> None:
    with pytest.raises(ValueError, match="unknown requirement IDs"):
        registry.response_check("NO-SUCH-REQUIREMENT")
    with pytest.raises(ValueError, match="must name the requirement IDs"):
        registry.response_check()

    def error_envelope(answer: Any) -> None:
        """A second check by a taken name."""

    with pytest.raises(ValueError, match="duplicate check name 'error_envelope'"):
        registry.response_check(fuzz.NO_5XX)(error_envelope)


@settings(max_examples=50, deadline=None)
@given(fuzz.avro_values())
def test_avro_value_format_generates_valid_frames(value: Any) -> None:
    blob = encode_blob(value)
    assert blob.startswith("wwHioz3/VYAiN")  # magic C3 01 + the Value fingerprint (§13.3)
    decode_blob(blob)


def test_a_500_fails_no_5xx_but_a_documented_504_does_not() -> None:
    assert fuzz.NO_5XX in _failed(_answer("heartbeat_worker", 500, {"error": "boom"}))
    assert fuzz.NO_5XX not in _failed(_answer("query_workflow", 504, {"reason": "query_worker_timeout"}))


def test_undocumented_status_fails_the_status_set_but_413_is_legitimate() -> None:
    assert fuzz.STATUS_SET in _failed(_answer("heartbeat_worker", 418, WORKER_ERROR, {WORKER_HEADER: "1.20"}))
    assert fuzz.STATUS_SET not in _failed(_answer("heartbeat_worker", 413, {"reason": "payload_too_large"}))


def test_worker_4xx_needs_the_worker_envelope_and_control_4xx_a_reason() -> None:
    ok = _answer("heartbeat_worker", 404, {**WORKER_ERROR, "reason": "worker_not_registered"}, {WORKER_HEADER: "1.20"})
    assert fuzz.ENVELOPE not in _failed(ok)
    bare = _answer("heartbeat_worker", 404, {"reason": "worker_not_registered"}, {WORKER_HEADER: "1.20"})
    assert fuzz.ENVELOPE in _failed(bare)
    assert fuzz.ERROR_REASON in _failed(_answer("describe_workflow", 404, {"message": "no reason"}))
    assert fuzz.ERROR_REASON not in _failed(_answer("describe_workflow", 404, {"reason": "workflow_not_found"}))


def test_schema_violations_are_schema_responses_failures() -> None:
    assert fuzz.SCHEMA in _failed(_answer("get_health", 200, ["not", "an", "object"]))


def test_a_failure_record_carries_the_requirement_and_a_curl_line() -> None:
    result = fuzz.FuzzResult("heartbeat_worker", "doc")
    answer = _answer("heartbeat_worker", 500, {"error": "boom"})
    result.judged |= fuzz.judged_requirements(answer)
    for failure in fuzz.judge(answer):
        result.fail(failure)
    records = {r.verdict.value: r for r in result.records(TARGET)}
    failed = records["failed"]
    assert failed.check == "fuzz:heartbeat_worker"
    assert failed.failed_requirement == fuzz.NO_5XX
    assert failed.exchanges[0]["curl"].startswith("curl ")
    assert "Reproduce: curl" in failed.message
    assert fuzz.NO_5XX not in records["passed"].requirements


# -- slow: against the reference server ---------------------------------------------------------------------

FUZZ_VERDICTS = (fuzz.NO_5XX, fuzz.STATUS_SET, fuzz.SCHEMA, fuzz.ENVELOPE, fuzz.ERROR_REASON, fuzz.NO_CHANGE)


@pytest.mark.slow
def test_reference_server_survives_a_small_fuzz_budget(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--lease-seconds", "3", "--activity-lease-seconds", "3", "--query-timeout", "3")
    run = run_suite(server.url, tmp_path / "reports", "-m", "dw_fuzz", "--fuzz-examples", "4")
    assert run.returncode == 0, run.stdout[-4000:]
    for requirement in FUZZ_VERDICTS:
        assert run.verdict(requirement) == "passed", (requirement, run.stdout[-3000:])
    assert run.results is not None
    fuzzed = {c["check"] for c in run.results["checks"] if c["check"].startswith("fuzz:")}
    assert {f"fuzz:{name}" for name in fuzz.operations()} <= fuzzed
    assert f"fuzz:{fuzz.STATEFUL}" in fuzzed


class _BreakHeartbeatValidation(BaseHTTPRequestHandler):
    """Forwards to ``upstream``; a 422 of ``POST /api/worker/heartbeat`` becomes a bare 500."""

    upstream = ""
    protocol_version = "HTTP/1.1"

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive", "host")}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        status, payload = resp.status, resp.read()
        out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in ("connection", "content-length")]
        conn.close()
        if self.command == "POST" and self.path.split("?")[0] == "/api/worker/heartbeat" and status == 422:
            status, payload = 500, b'{"error": "Internal Server Error"}'
            out_headers = [("Content-Type", "application/json")]
        self.send_response(status)
        for name, value in out_headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _relay

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def broken_heartbeat(server_factory: Callable[..., ServerProcess]) -> Iterator[str]:
    server = server_factory("--lease-seconds", "3", "--activity-lease-seconds", "3")
    handler = type("Handler", (_BreakHeartbeatValidation,), {"upstream": server.url})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    proxy.daemon_threads = True
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{proxy.server_address[1]}"
    proxy.shutdown()
    proxy.server_close()
    thread.join(timeout=10)


@pytest.mark.slow
def test_a_server_error_is_caught_with_a_curl_reproduction(broken_heartbeat: str, tmp_path: Path) -> None:
    run = run_suite(broken_heartbeat, tmp_path / "reports", "-k", "worker-registration", "--fuzz-examples", "10")
    assert run.returncode == 1, run.stdout[-4000:]
    assert run.verdict(fuzz.NO_5XX) == "failed", run.stdout[-3000:]
    assert run.results is not None
    failure = next(r for r in run.results["requirements"] if r["id"] == fuzz.NO_5XX)
    assert "fuzz:heartbeat_worker" in failure["checks"]
    evidence = failure["exchanges"][0]
    assert evidence["status"] == 500
    assert "/api/worker/heartbeat" in evidence["curl"]
    assert "Reproduce: curl" in run.stdout  # the failing item prints the reproduction
    # The other operations of the group still pass: one broken route fails one rule, nothing else.
    assert run.verdict(fuzz.ENVELOPE) == "passed", run.stdout[-3000:]
    if shutil.which("curl"):
        replay = subprocess.run(
            [*shlex.split(evidence["curl"]), "-o", "/dev/null", "-w", "%{http_code}"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"DW_TOKEN": "", "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert replay.stdout.strip() == "500", (evidence["curl"], replay.stdout, replay.stderr)


@pytest.mark.slow
def test_a_zero_budget_disables_the_fuzz_items(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """With fuzzing off and only the fuzz items selected nothing is checked: no verdict, never a pass."""
    server = server_factory()
    run = run_suite(server.url, tmp_path / "reports", "-m", "dw_fuzz", "--fuzz-examples", "0")
    assert run.returncode == EXIT_HARNESS_ERROR, run.stdout[-3000:]
    assert run.results is not None
    assert not [c for c in run.results["checks"] if c["check"].startswith("fuzz:")]
    assert "fuzzing disabled" in run.stdout or "skipped" in run.stdout
    assert "no verdict: no item ran" in run.results["summary"]["headline"]
    assert "--fuzz-examples 0 (below the default 20)" in run.results["summary"]["headline"]
