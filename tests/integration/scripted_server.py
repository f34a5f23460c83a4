"""The reference server as a vendor's script starts it: run once, the script starts it in the background and
returns once it answers; run again (the suite's ``--restart-command``), it kills it with ``kill -9`` and starts it
on the same port and database."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """#!/bin/sh
# Start the reference server; run again, kill it hard and start it on the same port and database.
here=$(cd "$(dirname "$0")" && pwd)
port=0
if [ -f "$here/url" ]; then
    url=$(cat "$here/url")
    port=${url##*:}
    pid=$(cat "$here/pid")
    kill -9 "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
fi
: > "$here/out"
nohup PYTHON -m reference_server --port "$port" --db "$here/dw.sqlite" ARGS > "$here/out" 2>> "$here/err" &
echo $! > "$here/pid"
tries=0
until grep -q '^http' "$here/out"; do
    kill -0 "$(cat "$here/pid")" 2>/dev/null || exit 1
    tries=$((tries + 1)); [ "$tries" -lt 600 ] || exit 1
    sleep 0.05
done
head -n 1 "$here/out" > "$here/url"
exec PYTHON -m suite.processes wait "$(cat "$here/url")" --pid "$(cat "$here/pid")" --timeout 30
"""


@dataclass
class ScriptedServer:
    script: Path
    url: str


@contextlib.contextmanager
def scripted(folder: Path, *args: str, env: Mapping[str, str]) -> Iterator[ScriptedServer]:
    """The reference server started by a vendor-style script (its path is the restart command); stopped after."""
    folder.mkdir(parents=True)
    script = folder / "serve.sh"
    text = SCRIPT.replace("PYTHON", shlex.quote(sys.executable)).replace("ARGS", shlex.join(args))
    script.write_text(text, encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    try:
        subprocess.run([str(script)], check=True, timeout=60, env={**os.environ, **env})
        yield ScriptedServer(script, (folder / "url").read_text(encoding="utf-8").strip())
    finally:
        with contextlib.suppress(OSError, ValueError):
            pid = int((folder / "pid").read_text(encoding="utf-8"))
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _running(pid):
                time.sleep(0.05)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (the script detached it: whoever reaps orphans here may be slow to, or never)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
