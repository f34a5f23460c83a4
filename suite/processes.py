"""Child processes that print the URL they serve: the reference server, as the suite, the kill matrix, the
tests and the benchmark start it. Read the URL it prints, and stop it (politely, then not)."""

from __future__ import annotations

import select
import signal
import subprocess
import time

__all__ = ["read_url", "stop_process"]


def read_url(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The first line beginning with ``http`` that ``proc`` prints within ``timeout`` seconds; ``None`` when
    it exits first or the time passes."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline().strip()
            if line.startswith("http"):
                return line
    return None


def stop_process(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Send ``sig``, wait up to ``grace`` seconds, then kill; close its stdout."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)
    if proc.stdout is not None:
        proc.stdout.close()
