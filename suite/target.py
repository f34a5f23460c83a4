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
from pathlib import Path
from typing import Any

import httpx

from .client import tls
from .outcomes import HarnessError
from .processes import read_url, stop_process, stop_restarted, write_restart_spec

__all__ = [
    "EMBEDDED_ARGS",
    "REAL_TIME_ARGS",
    "Credential",
    "Credentials",
    "EmbeddedServer",
    "TokenRefused",
    "measure_clock_skew",
    "probe_cluster_info",
    "probe_credentials",
    "probe_plane",
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


def _send(
    method: str, url: str, path: str, headers: dict[str, str], body: Any, timeout: float, what: str
) -> httpx.Response:
    """One probe request; any transport problem is a :class:`HarnessError` of one line."""
    try:
        return httpx.request(method, url.rstrip("/") + path, headers=headers, json=body, timeout=timeout, verify=tls())
    except httpx.ConnectError as exc:
        raise HarnessError(f"cannot connect to {url}: {exc} — is the server running?") from None
    except httpx.TimeoutException:
        raise HarnessError(f"{url} did not answer {method} {path} ({what}) within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise HarnessError(f"{method} {url}{path} ({what}) failed: {type(exc).__name__}: {exc}") from None


def _reason(resp: httpx.Response) -> str | None:
    try:
        reason = resp.json().get("reason")
    except (ValueError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


def probe_cluster_info(url: str, token: str | None, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /api/cluster/info`` with only a credential (§5): the target's advertised facts.

    Any transport problem or a non-JSON answer is a :class:`HarnessError` with one clear line. The run's
    tokens are probed before (:func:`probe_credentials`), so a refusal here is the target's inconsistency.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = _send("GET", url, "/api/cluster/info", headers, None, timeout, "discovery")
    if resp.status_code in (401, 403):
        raise HarnessError(
            f"{url} refused GET /api/cluster/info with {resp.status_code} {_reason(resp) or ''}".rstrip()
            + (" although it accepted the same token on its plane" if token else " without a token")
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


WORKER_PLANE = "worker"
CONTROL_PLANE = "control"
# Which option gives a plane its token when the user passes none of them, and the role a plane needs.
_PLANE_OPTION = {WORKER_PLANE: "--worker-token", CONTROL_PLANE: "--operator-token"}
_PLANE_ROLE = {WORKER_PLANE: "worker", CONTROL_PLANE: "operator"}
REFUSED = (401, 403)


@dataclass(frozen=True)
class Credential:
    """The token a run uses on one plane, and the option it came from (``None``: the run's own, such as the
    embedded server's, so a refusal is the harness's problem, not the user's)."""

    plane: str
    token: str | None
    option: str | None


@dataclass(frozen=True)
class Answer:
    """What one probe request got: its status, its ``reason`` and the request line (for the messages)."""

    status: int
    reason: str | None
    request: str

    @property
    def refused(self) -> bool:
        return self.status in REFUSED

    def __str__(self) -> str:
        return f"{self.status}{' ' + self.reason if self.reason else ''} on {self.request}"

    def answered(self) -> str:
        return f"{self.request} answered {self.status}{' ' + self.reason if self.reason else ''}"


def probe_plane(
    url: str, plane: str, token: str | None, namespace: str, *, worker_version: str, timeout: float = 10.0
) -> Answer:
    """One call on ``plane`` that needs that plane's role and changes nothing, sent with ``token``.

    The worker plane: a history read of a workflow task id no one has (a leased task's history is a pure
    read, and an unknown task is answered 404) — never a heartbeat or a registration, which may create or
    renew state. The control plane: a describe of a workflow id no one uses (404). Both are answered only
    after authentication, role, version and namespace, in that order (§2.3), so 401/403 is the token's
    refusal and 404 ``namespace_not_found`` the namespace's absence, whatever else the target would say.
    """
    from suite.protocol.versions import CONTROL_PLANE_VERSION

    from .client import CONTROL_HEADER, WORKER_HEADER

    probe_id = f"dw-credential-probe-{secrets.token_hex(4)}"
    headers = {"X-Namespace": namespace}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body: Any = None
    if plane == WORKER_PLANE:
        method, path = "POST", f"/api/worker/workflow-tasks/{probe_id}/history"
        headers[WORKER_HEADER] = worker_version
        body = {"lease_owner": probe_id, "workflow_task_attempt": 1}
    else:
        method, path = "GET", f"/api/workflows/{probe_id}"
        headers[CONTROL_HEADER] = CONTROL_PLANE_VERSION
    resp = _send(method, url, path, headers, body, timeout, f"{plane}-plane credential probe")
    return Answer(resp.status_code, _reason(resp), f"{method} {path}")


@dataclass(frozen=True)
class Credentials:
    """What the probes found: whether the target enforces auth, the one line that says so, and the request
    that showed the namespace missing (``None``: it exists)."""

    auth_enabled: bool
    summary: str
    namespace_missing: str | None

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.auth_enabled, "summary": self.summary}


class TokenRefused(Exception):
    """A token of the user's own the target refused (or one it needs and was not given): a usage error."""


def probe_credentials(
    url: str,
    namespace: str,
    planes: tuple[Credential, Credential],
    *,
    full: Credential | None = None,
    worker_version: str,
    timeout: float = 10.0,
) -> Credentials:
    """Probe every token of the run on its own plane before the first check (:func:`probe_plane`).

    A refused token the user gave (or a plane that needs one and got none) raises :class:`TokenRefused` with
    one line naming the option and the plane; a refused token of the run's own is a :class:`HarnessError`.
    ``full`` is a full-access token given beside role tokens: the target not knowing it (401) is the user's
    mistake, a known token it keeps off a plane (403) is what AUTH-FULL-ACCESS-TOKEN judges, left to it.
    Then a worker-plane call without a token and one with a token no server issued: both accepted means the
    target has auth off, and the auth requirements cannot be judged.
    """
    answers = {
        c.plane: probe_plane(url, c.plane, c.token, namespace, worker_version=worker_version, timeout=timeout)
        for c in planes
    }
    refused = [c for c in planes if answers[c.plane].refused]
    if refused:
        raise _refusal(refused, answers)
    if full is not None:
        for plane in (WORKER_PLANE, CONTROL_PLANE):
            answer = probe_plane(url, plane, full.token, namespace, worker_version=worker_version, timeout=timeout)
            if answer.status == 401 and full.option is None:
                raise HarnessError(f"the target does not know the run's own full-access token ({answer})")
            if answer.status == 401:
                raise TokenRefused(
                    f"{full.option}: the target does not know this token ({answer}, on the {plane} plane); "
                    "pass the server's full-access token, or leave --auth-token out"
                )
    missing = next((a.answered() for a in answers.values() if a.reason == "namespace_not_found"), None)
    tokenless = [
        probe_plane(url, WORKER_PLANE, token, namespace, worker_version=worker_version, timeout=timeout)
        for token in (None, f"dw-no-such-token-{secrets.token_hex(8)}")
    ]
    if any(a.refused for a in tokenless):
        given = [c for c in (*planes, *([full] if full else [])) if c.token and c.option]
        names = " and ".join(dict.fromkeys(str(c.option) for c in given)) or "the run's own tokens"
        return Credentials(
            True, f"on — the target refuses a request without a valid token, and it accepted {names}", missing
        )
    return Credentials(
        False,
        "off — the target accepted worker-plane requests without a token and with a made-up one, so the auth "
        "requirements are not covered; turning auth on in the server's configuration covers them",
        missing,
    )


def _refusal(refused: list[Credential], answers: dict[str, Answer]) -> Exception:
    """The one line for the first refused plane (both planes, when the user gave no token at all)."""
    if all(c.option is None for c in refused):
        shown = "; ".join(f"{c.plane} plane: {answers[c.plane]}" for c in refused)
        return HarnessError(f"the target refused the run's own tokens ({shown})")
    if len(refused) == 2 and all(c.token is None for c in refused):
        shown = "; ".join(f"{answers[c.plane]}" for c in refused)
        return TokenRefused(
            "--worker-token and --operator-token: not given, and the target requires a token on both planes "
            f"({shown}); pass the server's worker and operator tokens, or --auth-token for both planes"
        )
    c = refused[0]
    answer = answers[c.plane]
    if c.token is None:
        return TokenRefused(
            f"{c.option}: not given, and the target requires a token on the {c.plane} plane ({answer}); pass "
            f"the server's {_PLANE_ROLE[c.plane]} token (or --auth-token, one token for both planes)"
        )
    wanted = "full-access token" if c.option == "--auth-token" else f"{_PLANE_ROLE[c.plane]} token"
    return TokenRefused(
        f"{c.option}: the target refused this token on the {c.plane} plane ({answer}); pass the server's {wanted}"
    )


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
    # The command that kills it hard and starts it again on the same port and database (the restart checks).
    restart_command: str | None = None
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
            port = url.rsplit(":", 1)[1].split("/")[0]
            again = [port if i > 0 and cmd[i - 1] == "--port" else a for i, a in enumerate(cmd)]
            self.restart_command = write_restart_spec(
                self._spec, command=again, url=url, pid=self._proc.pid, log=self.log_path, env=self._env
            )
            return url
        tail = ""
        with contextlib.suppress(OSError), open(self.log_path, encoding="utf-8") as fh:
            tail = fh.read()[-2000:]
        self.stop()
        raise HarnessError(f"the embedded reference server did not start: {' '.join(cmd)}\n{tail}")

    @property
    def _spec(self) -> Path:
        return Path(self._dir) / "restart.json"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
            if self._dir and self._spec.exists():
                stop_restarted(self._spec, unless=proc.pid)  # a restart check may have started it again, detached
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""
