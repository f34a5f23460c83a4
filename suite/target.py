"""Reaching a target: probe a URL, or start the reference server as its own process.

``--target=embedded`` runs ``python -m reference_server`` in a subprocess with a fresh temporary
database, exactly as a vendor's server would run; the suite never imports the server. The embedded
server gets short leases and timeouts so every lease-expiry and timeout check fits ``--max-wait``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .client import tls
from .outcomes import HarnessError
from .processes import read_url, stop_process

__all__ = [
    "EMBEDDED_ARGS",
    "REAL_TIME_ARGS",
    "EmbeddedServer",
    "measure_clock_skew",
    "namespace_missing",
    "probe_cluster_info",
]

# Short but not racy: long enough that a healthy check finishes its work inside one lease.
EMBEDDED_ARGS: tuple[str, ...] = (
    "--lease-seconds",
    "3",
    "--activity-lease-seconds",
    "3",
    "--query-timeout",
    "3",
    "--query-lease-seconds",
    "3",
    "--max-active-leases-per-queue",
    "16",
    "--long-poll-max",
    "8",
    "--cancellation-cleanup-seconds",
    "3",
    # Leases, timers and timeouts pass by moving the server's clock (suite.timing), not by waiting.
    "--test-clock",
)
# The same server waiting in real time: what a target without a test clock looks like to the suite.
REAL_TIME_ARGS: tuple[str, ...] = tuple(a for a in EMBEDDED_ARGS if a != "--test-clock")


def probe_cluster_info(url: str, token: str | None, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /api/cluster/info`` with only a credential (§5): the target's advertised facts.

    Any transport problem or a non-JSON answer is a :class:`HarnessError` with one clear line.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/api/cluster/info", headers=headers, timeout=timeout, verify=tls())
    except httpx.ConnectError as exc:
        raise HarnessError(f"cannot connect to {url}: {exc} — is the server running?") from None
    except httpx.TimeoutException:
        raise HarnessError(f"{url} did not answer GET /api/cluster/info within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise HarnessError(f"GET {url}/api/cluster/info failed: {type(exc).__name__}: {exc}") from None
    if resp.status_code in (401, 403):
        raise HarnessError(
            f"{url} refused GET /api/cluster/info with {resp.status_code}: pass --worker-token/--operator-token"
        )
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if resp.status_code != 200 or not isinstance(doc, dict):
        raise HarnessError(
            f"GET {url}/api/cluster/info answered {resp.status_code} without a JSON object; "
            "this does not look like a Durable Workflow server"
        )
    return doc


def namespace_missing(
    url: str,
    namespace: str,
    *,
    worker_token: str | None,
    operator_token: str | None,
    worker_version: str,
    timeout: float = 10.0,
) -> str | None:
    """Whether the target knows ``namespace``: ``None`` if so, else the request that showed it does not.

    One read the target answers only after its namespace check (§2.3: auth, role, version, then namespace):
    a describe of a workflow id no one uses, or, with only a worker token, a heartbeat of a task id no one
    has. Neither changes anything; an unknown namespace is answered 404 ``namespace_not_found``.
    """
    from suite.protocol.versions import CONTROL_PLANE_VERSION

    from .client import CONTROL_HEADER, WORKER_HEADER

    probe_id = f"dw-namespace-probe-{secrets.token_hex(4)}"
    headers = {"X-Namespace": namespace}
    if operator_token or not worker_token:
        method, path = "GET", f"/api/workflows/{probe_id}"
        headers[CONTROL_HEADER] = CONTROL_PLANE_VERSION
        token = operator_token
    else:
        method, path = "POST", f"/api/worker/workflow-tasks/{probe_id}/heartbeat"
        headers[WORKER_HEADER] = worker_version
        token = worker_token
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        resp = httpx.request(method, url.rstrip("/") + path, headers=headers, json=None, timeout=timeout)
    except httpx.HTTPError as exc:
        raise HarnessError(f"{method} {url}{path} (namespace probe) failed: {type(exc).__name__}: {exc}") from None
    try:
        reason = resp.json().get("reason")
    except (ValueError, AttributeError):
        reason = None
    return f"{method} {path} answered {resp.status_code} {reason}" if reason == "namespace_not_found" else None


def measure_clock_skew(url: str, timeout: float = 10.0) -> float | None:
    """Server clock minus local clock, in seconds, from the ``Date`` header of ``GET /api/health`` (1 s
    resolution: the midpoint of the request is compared with the header). ``None`` without a Date header.

    Timing checks never compare clocks across machines — they use server timestamps — so a skew is only
    reported, never held against the target.
    """
    from email.utils import parsedate_to_datetime

    try:
        sent = time.time()
        resp = httpx.get(url.rstrip("/") + "/api/health", timeout=timeout, verify=tls())
        received = time.time()
    except httpx.HTTPError:
        return None
    date = resp.headers.get("date")
    if not date:
        return None
    try:
        server = parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None
    # The header is truncated to whole seconds: +0.5 s is its expected midpoint.
    return round(server + 0.5 - (sent + received) / 2, 1)


@dataclass
class EmbeddedServer:
    """The reference server in a subprocess on a free port with a throwaway database."""

    extra_args: tuple[str, ...] = EMBEDDED_ARGS
    startup_timeout: float = 30.0
    url: str = ""
    _proc: subprocess.Popen[str] | None = None
    _dir: str = ""
    log_path: str = ""
    worker_token: str | None = None
    operator_token: str | None = None
    full_token: str | None = None
    _env: dict[str, str] = field(default_factory=dict)

    def start(self) -> str:
        # Role tokens, so the auth requirements are covered too; they live only in this process.
        self.worker_token = secrets.token_urlsafe(18)
        self.operator_token = secrets.token_urlsafe(18)
        self.full_token = secrets.token_urlsafe(18)
        self._dir = tempfile.mkdtemp(prefix="dw-embedded-")
        self.log_path = os.path.join(self._dir, "server.log")
        log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - handed to the child
        cmd = [
            sys.executable,
            "-m",
            "reference_server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--db",
            os.path.join(self._dir, "dw.sqlite"),
            *self.extra_args,
            # name=value: a token may begin with "-", which argparse would take for an option.
            f"--worker-token={self.worker_token}",
            f"--operator-token={self.operator_token}",
            f"--admin-token={secrets.token_urlsafe(18)}",
            f"--auth-token={self.full_token}",
        ]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **self._env}
        )
        log.close()
        url = read_url(self._proc, self.startup_timeout)
        if url is not None:
            self.url = url
            return url
        tail = ""
        with contextlib.suppress(OSError), open(self.log_path, encoding="utf-8") as fh:
            tail = fh.read()[-2000:]
        self.stop()
        raise HarnessError(f"the embedded reference server did not start: {' '.join(cmd)}\n{tail}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""
