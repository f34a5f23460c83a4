"""A server waited for is the one started: ``suite.processes`` tells the started process tree's listening
socket from another process's on the same port, and the wait refuses a port another process holds even when
that process answers ``GET /api/health`` with 200 (a decoy: another test's server, in a shared CI machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from suite.processes import listeners, wait_until_served
from tests.suite.decoys import health_decoy

# A child that listens on a port of its own (SO_REUSEADDR as asyncio's server has it) and prints it.
LISTENER = """
import os, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print(s.getsockname()[1], os.getpid(), flush=True)
time.sleep(120)
"""


@pytest.fixture
def decoy() -> Iterator[int]:
    """A server in this process that answers ``GET /api/health`` with 200 on a port of its own."""
    with health_decoy() as port:
        yield port


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True)


def test_the_listening_socket_is_told_by_the_process_holding_it() -> None:
    child = _child("-c", LISTENER, "0")
    bystander = _child("-c", "import time; time.sleep(120)")
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline().split()[0])
        mine = listeners(port, child.pid)
        assert (mine.total, mine.ours, mine.proven) == (1, 1, True)
        theirs = listeners(port, bystander.pid)
        assert (theirs.total, theirs.ours, theirs.proven, theirs.foreign) == (1, 0, False, 1)
        assert len(theirs.others) == 1
        assert theirs.others[0].startswith(f"pid {child.pid} ({sys.executable} -c import")
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            nobody = int(free.getsockname()[1])
        assert listeners(nobody, child.pid).total == 0
    finally:
        for proc in (child, bystander):
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def test_a_descendant_of_the_started_process_holds_the_port() -> None:
    shell = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c '{LISTENER}' 0; true"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert shell.stdout is not None
        port, grandchild = map(int, shell.stdout.readline().split())
        assert grandchild != shell.pid
        assert listeners(port, shell.pid).proven
        assert wait_until_served(f"http://127.0.0.1:{port}", shell.pid, 0.5) is not None  # it never answers HTTP
        os.kill(grandchild, signal.SIGKILL)
    finally:
        shell.kill()
        shell.wait()
        shell.stdout.close()  # type: ignore[union-attr]


def test_the_wait_refuses_a_decoy_answering_on_the_port(decoy: int) -> None:
    # The started "server" never binds (it is busy starting, or failed to bind the decoy's port); the decoy
    # answers 200. The old wait (GET /api/health until 200) took the decoy for the server.
    started = _child("-c", "import time; time.sleep(120)")
    try:
        problem = wait_until_served(f"http://127.0.0.1:{decoy}", started.pid, 30)
        assert problem is not None
        assert f"port {decoy} is held by a process this job did not start" in problem
        assert f"pid {os.getpid()} (" in problem  # the decoy's holder, named: this test process
    finally:
        started.kill()
        started.wait()
        assert started.stdout is not None
        started.stdout.close()


def test_the_wait_says_when_the_server_exits_first_and_how() -> None:
    done = _child("-c", "import sys; sys.exit(3)")
    assert done.stdout is not None
    done.stdout.close()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = int(free.getsockname()[1])
    problem = wait_until_served(f"http://127.0.0.1:{port}", done.pid, 30)
    assert problem == f"the server under test (pid {done.pid}) exited before it answered (exit status 3)"
    done.wait()  # reaped by the wait already: Popen only learns that it is gone


def test_the_wait_accepts_the_started_reference_server(tmp_path: Path) -> None:
    server = _child("-m", "reference_server", "--port", "0", "--db", str(tmp_path / "dw.sqlite"))
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert wait_until_served(url, server.pid, 30) is None
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


def test_a_server_restarted_from_its_spec_is_killed_and_serves_again_on_its_port(tmp_path: Path) -> None:
    """``spec`` records a running reference server; ``restart`` kills it with SIGKILL and starts the command again
    on the same port and database (it answers what the first one wrote); ``stop`` stops the one started last."""
    import json
    import urllib.request

    from suite.processes import read_url, stop_process

    db, log = tmp_path / "dw.sqlite", tmp_path / "server.log"
    first = subprocess.Popen(
        [sys.executable, "-m", "reference_server", "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = read_url(first, 30)
        assert url is not None
        body = json.dumps({"workflow_type": "t", "workflow_id": "kept", "task_queue": "q"}).encode()
        headers = {"Content-Type": "application/json", "X-Durable-Workflow-Control-Plane-Version": "2"}
        with urllib.request.urlopen(urllib.request.Request(url + "/api/workflows", body, headers), timeout=10) as r:
            assert r.status == 201
        spec = tmp_path / "restart.json"
        again = [sys.executable, "-m", "reference_server", "--port", url.rsplit(":", 1)[1], "--db", str(db)]
        cli = [sys.executable, "-m", "suite.processes"]
        printed = subprocess.run(
            [*cli, "spec", str(spec), "--url", url, "--pid", str(first.pid), "--log", str(log), "--", *again],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert printed.endswith(f"suite.processes restart {spec}")
        done = subprocess.run([*cli, "restart", str(spec)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert first.wait(timeout=10) == -signal.SIGKILL
        second = json.loads(spec.read_text(encoding="utf-8"))["pid"]
        assert second != first.pid
        describe = urllib.request.Request(url + "/api/workflows/kept", headers=headers)
        with urllib.request.urlopen(describe, timeout=10) as r:
            assert json.loads(r.read())["workflow_id"] == "kept"
        assert subprocess.run([*cli, "stop", str(spec)], timeout=30).returncode == 0
        stat = Path(f"/proc/{second}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or a zombie
    finally:
        stop_process(first)


def test_a_restart_whose_port_another_process_took_meanwhile_starts_again_once_it_is_free(tmp_path: Path) -> None:
    """Between the kill and the new start the kernel may hand the port to another process (the local port of an
    outgoing connection): the first new server cannot bind it and exits, and ``restart`` starts it again once
    the port is free, instead of failing the restart."""
    import json
    import time
    import urllib.request

    from suite.processes import stop_restarted

    holder = socket.socket()  # the other process's socket: bound, never listening, no SO_REUSEADDR
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    victim = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    spec, log = tmp_path / "restart.json", tmp_path / "server.log"
    command = [sys.executable, "-m", "reference_server", "--port", str(port), "--db", str(tmp_path / "dw.sqlite")]
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "suite.processes", "spec", str(spec), "--url", url, "--pid", str(victim.pid)]
    subprocess.run([*cli, "--log", str(log), "--", *command], check=True, capture_output=True)
    again = subprocess.Popen([sys.executable, "-m", "suite.processes", "restart", str(spec)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while "address already in use" not in (log.read_text() if log.exists() else "").lower():
            assert time.monotonic() < deadline, "the first new server never met the taken port"
            time.sleep(0.05)
        holder.close()  # the other process lets the port go
        assert again.wait(timeout=60) == 0, again.stderr.read() if again.stderr else ""
        assert victim.wait(timeout=10) == -signal.SIGKILL
        with urllib.request.urlopen(url + "/api/health", timeout=10) as r:
            assert r.status == 200
        assert json.loads(spec.read_text())["pid"] != victim.pid
    finally:
        holder.close()
        stop_restarted(spec)
        for proc in (again, victim):
            proc.kill()
            proc.wait(timeout=10)
        if again.stderr:
            again.stderr.close()
