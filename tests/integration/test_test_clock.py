"""The test clock over sockets: ``python -m reference_server --test-clock``. The ``Date`` header follows the
moved clock (the suite judges with server timestamps), a lease granted under it keeps its instants across a
``kill -9`` and a restart (with or without the flag: time never goes back), and without the flag the route is
``404 route_not_found``."""

from __future__ import annotations

import signal
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

from suite.protocol.fencing import parse_rfc3339
from tests.conftest import ServerProcess

WORKER = {"X-Durable-Workflow-Protocol-Version": "1.20"}
CONTROL = {"X-Durable-Workflow-Control-Plane-Version": "2"}
DAY = 86_400


def _date_seconds(response: httpx.Response) -> float:
    return parsedate_to_datetime(response.headers["date"]).timestamp()


def test_date_follows_the_clock_and_a_restart_never_goes_back(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    db = tmp_path / "dw.sqlite"
    server = server_factory("--test-clock", "--lease-seconds", "30", db=db)
    info = httpx.get(server.url + "/api/cluster/info").json()
    assert info["worker_protocol"]["test_profile"]["clock_advance"] == "/api/test/clock/advance"
    before = _date_seconds(httpx.get(server.url + "/api/health"))
    moved = httpx.post(server.url + "/api/test/clock/advance", json={"seconds": DAY}, headers=CONTROL)
    assert moved.status_code == 200, moved.text
    now = parse_rfc3339(moved.json()["now"]).timestamp()
    assert DAY - 1 <= _date_seconds(moved) - before <= DAY + 60
    assert abs(_date_seconds(moved) - now) <= 1

    # A lease granted under the moved clock.
    body = {"workflow_type": "wf", "workflow_id": "wf-1", "task_queue": "q", "input": []}
    assert httpx.post(server.url + "/api/workflows", json=body, headers=CONTROL).status_code == 201
    reg = {"worker_id": "w1", "task_queue": "q", "runtime": "python"}
    assert httpx.post(server.url + "/api/worker/register", json=reg, headers=WORKER).status_code == 201
    poll = {"worker_id": "w1", "task_queue": "q", "timeout_seconds": 1}
    task = httpx.post(server.url + "/api/worker/workflow-tasks/poll", json=poll, headers=WORKER).json()["task"]
    expires = parse_rfc3339(task["lease_expires_at"]).timestamp()
    assert expires >= now + 29

    server.stop(signal.SIGKILL)
    # Restarted without the flag: the offset still applies, and the route is gone.
    again = server_factory("--lease-seconds", "30", db=db)
    assert _date_seconds(httpx.get(again.url + "/api/health")) >= now - 1
    refused = httpx.post(again.url + "/api/test/clock/advance", json={"seconds": 5}, headers=CONTROL)
    assert (refused.status_code, refused.json()["reason"]) == (404, "route_not_found")
    assert "clock_advance" not in httpx.get(again.url + "/api/cluster/info").json()["worker_protocol"]["test_profile"]
    heartbeat = {"lease_owner": "w1", "workflow_task_attempt": 1}
    renewed = httpx.post(
        again.url + f"/api/worker/workflow-tasks/{task['task_id']}/heartbeat", json=heartbeat, headers=WORKER
    )
    # The lease is renewed from the moved clock: had the clock gone back a day, the renewal would end a day early.
    assert renewed.status_code == 200, renewed.text
    assert expires - 1 <= parse_rfc3339(renewed.json()["lease_expires_at"]).timestamp() <= expires + 60
