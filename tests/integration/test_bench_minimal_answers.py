"""``bench/minimal_server.py --protocol-answers``: the minimal server answers a cycle with what the reference
server's answers hold — the same members at every level, the same capabilities, the history inline — so that the
benchmark's comparison with it (``poll_complete.py --minimal-answers protocol``) weighs the reference server's
rules, not the size of the protocol's answers."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.integration.bench_scripts import load


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One cycle on each server (register, start, poll, complete): every answer, by server and call."""
    bench = load("poll_complete")
    tmp = tmp_path_factory.mktemp("answers")
    procs = []
    out: dict[str, dict[str, Any]] = {}
    try:
        capabilities: Path | None = None
        for kind in ("reference", "minimal"):
            proc, url = bench.start_server(tmp / f"{kind}.sqlite", 30, kind, capabilities=capabilities)
            procs.append(proc)
            if capabilities is None:
                capabilities = tmp / "capabilities.json"
                capabilities.write_text(json.dumps(bench.advertised_capabilities(url)), encoding="utf-8")
            out[kind] = _cycle(url, bench)
    finally:
        for proc in procs:
            bench.stop_server(proc)
    return out


def _cycle(url: str, bench: ModuleType) -> dict[str, Any]:
    worker, control = bench.WORKER_HEADERS, bench.CONTROL_HEADERS
    with httpx.Client(base_url=url, timeout=30.0) as client:
        got: dict[str, Any] = {}
        register = {"worker_id": "w", "task_queue": "q", "runtime": "python"}
        got["register"] = client.post("/api/worker/register", json=register, headers=worker)
        start = {"workflow_type": "bench", "workflow_id": "wf", "task_queue": "q", "input": []}
        assert client.post("/api/workflows", json=start, headers=control).status_code == 201
        got["poll"] = client.post(
            "/api/worker/workflow-tasks/poll", json={"worker_id": "w", "task_queue": "q"}, headers=worker
        )
        task = got["poll"].json()["task"]
        body = {
            "lease_owner": "w",
            "workflow_task_attempt": task["workflow_task_attempt"],
            "commands": [{"type": "complete_workflow", "result": bench.RESULT_BLOB}],
        }
        got["complete"] = client.post(
            f"/api/worker/workflow-tasks/{task['task_id']}/complete", json=body, headers=worker
        )
        return got


def _shape(value: Any) -> Any:
    """The members of every object, recursively (lists by their items); leaves by their JSON type."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


@pytest.mark.slow
@pytest.mark.parametrize("call", ["register", "poll", "complete"])
def test_each_answer_has_the_reference_servers_members_at_every_level(
    answers: dict[str, dict[str, Any]], call: str
) -> None:
    reference, minimal = answers["reference"][call], answers["minimal"][call]
    assert minimal.status_code == reference.status_code
    assert _shape(minimal.json()) == _shape(reference.json())
    assert minimal.json()["server_capabilities"] == reference.json()["server_capabilities"]
    assert minimal.headers["x-durable-workflow-protocol-version"] == "1.20"
    assert "date" in minimal.headers
    # The same members with ids of another length (32 hexadecimal digits against 26 of a ULID): within 2 %.
    assert abs(len(minimal.content) - len(reference.content)) <= 0.02 * len(reference.content)


@pytest.mark.slow
def test_the_poll_shows_the_runs_history_as_the_reference_server_does(answers: dict[str, dict[str, Any]]) -> None:
    for kind in ("reference", "minimal"):
        task = answers[kind]["poll"].json()["task"]
        events = task["history_events"]
        assert [(e["sequence"], e["event_type"]) for e in events] == [(1, "StartAccepted"), (2, "WorkflowStarted")]
        assert all(e["payload"]["run_id"] == task["run_id"] and e["payload"]["workflow_id"] == "wf" for e in events)
        assert task["last_history_sequence"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "copied"),
    [
        ((), True),
        (("--server", "minimal", "--blocks", "0"), True),
        (("--minimal-answers", "bare"), False),
        (("--server", "reference", "--blocks", "0"), False),
    ],
)
def test_the_capabilities_are_copied_whenever_a_minimal_server_answers_as_the_protocol_says(
    tmp_path: Path, argv: tuple[str, ...], copied: bool
) -> None:
    bench = load("poll_complete")
    path = bench.protocol_capabilities(bench.parse_args(list(argv)), tmp_path)
    if not copied:
        assert path is None
        return
    capabilities = json.loads(path.read_text(encoding="utf-8"))
    assert "complete_workflow" in capabilities["supported_workflow_task_commands"]
    assert capabilities["worker_session_verbs"] == ["create", "heartbeat", "close"]  # the server's own additions


class _Started(Exception):
    """Stops a measurement when its minimal server is started, once the arguments are seen."""


@pytest.mark.parametrize("blocks", ["20", "0"])
def test_every_measurement_starts_its_minimal_server_with_the_copied_capabilities(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, blocks: str
) -> None:
    """Blocks and rounds alike: no server is run; the starts are recorded, the minimal server's ends the run."""
    bench = load("poll_complete")
    args = bench.parse_args(["--blocks", blocks, "--concurrency", "1"])
    args.capabilities = tmp_path / "capabilities.json"
    started: dict[str, Path | None] = {}

    def start_server(db: Path, lease_seconds: int, kind: str = "reference", **options: Any) -> tuple[None, str]:
        started[kind] = options.get("capabilities")
        if kind == "minimal":
            raise _Started
        return None, "http://127.0.0.1:9"

    monkeypatch.setattr(bench, "start_server", start_server)
    monkeypatch.setattr(bench, "stop_server", lambda proc: None)
    measure = (
        (lambda: bench.measure_one("minimal", 1, args))
        if blocks == "0"
        else (lambda: bench.measure_interleaved(1, args))
    )
    with pytest.raises(_Started):
        measure()
    assert started["minimal"] == args.capabilities
