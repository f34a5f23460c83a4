"""Shared fixtures: the reference server as a subprocess, and running the suite against a URL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from suite.processes import read_url, stop_process


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    db: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)


def start_server(
    db: Path, *args: str, port: int = 0, timeout: float = 30.0, env: dict[str, str] | None = None
) -> ServerProcess:
    """``python -m reference_server`` on a free port; returns once it printed its URL. ``env`` is added to this
    process's environment (tokens: ``DW_WORKER_TOKEN`` …)."""
    cmd = [sys.executable, "-m", "reference_server", "--port", str(port), "--db", str(db), *args]
    environ = {**os.environ, **env} if env else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environ)
    url = read_url(proc, timeout)
    if url is not None:
        return ServerProcess(proc, url, db)
    proc.kill()
    raise RuntimeError(f"reference server did not start: {' '.join(cmd)}")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def make(*args: str, db: Path | None = None, port: int = 0, env: dict[str, str] | None = None) -> ServerProcess:
        server = start_server(db or tmp_path / f"db{len(started)}.sqlite", *args, port=port, env=env)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@dataclass
class SuiteRun:
    returncode: int
    stdout: str
    results: dict[str, Any] | None

    def verdict(self, requirement: str) -> str:
        assert self.results is not None, self.stdout[-3000:]
        for req in self.results["requirements"]:
            if req["id"] == requirement:
                return str(req["verdict"])
        raise KeyError(requirement)


def run_suite(
    target: str, report_dir: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> SuiteRun:
    """Run the conformance suite as a user would (a separate pytest process, from another directory)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        f"--target={target}",
        f"--report-dir={report_dir}",
        "-p",
        "no:cacheprovider",
        "-q",
        *args,
    ]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=report_dir.parent, env=env)
    results = None
    found = sorted(report_dir.glob("*/results.json"))
    if found:
        results = json.loads(found[-1].read_text(encoding="utf-8"))
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, results)


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n`` the controller hands each worker its items two at a time (``--maxschedchunk 1``) instead of
    one consecutive quarter of the list at the start: a worker busy with a whole-suite test then holds one item
    back, not a hundred slow ones while the other workers run dry."""
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` starts one worker more than there are CPUs. Many of these tests spend much of their time
    waiting rather than computing — on subprocesses, on a fault proxy's delays, on leases that run out in real
    time — so one more worker keeps the CPUs busy through those waits. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still
    decides when it is set (xdist's own hook reads it), and a conformance run started from this directory
    (``--target``) keeps one worker per CPU."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.getoption("--target", default=None) is not None:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus + 1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kill-matrix",
        action="store_true",
        default=False,
        help="Also run the tests marked kill_matrix (the whole mutant kill matrix: every named fault of the "
        "reference server against the whole suite, minutes of both CPUs); .ci/run runs them as a step of its own",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kill matrix only when asked for (``--kill-matrix``, or its test named by id), then the order below."""
    named = [str(a) for a in config.args if "::" in str(a)]
    matrix = [
        i
        for i in items
        if i.get_closest_marker("kill_matrix")
        and not config.getoption("--kill-matrix", default=False)
        and not any(i.nodeid == a or i.nodeid.endswith(a) for a in named)
    ]
    if matrix:
        config.hook.pytest_deselected(items=matrix)
        items[:] = [i for i in items if i not in matrix]
    _longest_first(items)


def _longest_first(items: list[pytest.Item]) -> None:
    """Longest first: the whole-suite runs, then the other slow tests, then the rest (a stable sort), so that
    under ``-n`` the workers start with the long tests and finish together instead of one running a long test
    alone at the end. Each worker starts with two consecutive items, so every whole-suite run is followed by a
    quick test: no two of them land on one worker while another has none."""
    whole = [i for i in items if i.get_closest_marker("whole_suite")]
    slow = [i for i in items if i.get_closest_marker("slow") and not i.get_closest_marker("whole_suite")]
    rest = [i for i in items if not i.get_closest_marker("slow") and not i.get_closest_marker("whole_suite")]
    head: list[pytest.Item] = []
    for item in whole:
        head.append(item)
        if rest:
            head.append(rest.pop(0))
    items[:] = [*head, *slow, *rest]
