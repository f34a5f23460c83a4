"""Child processes that serve HTTP: the reference server, as the suite, the kill matrix, the tests and the
benchmark start it, and a vendor's server started by the server-CI recipe. Read the URL a child prints, prove
that the socket answering on a port is a child's and not whatever else listens there, wait until it answers,
and stop it (politely, then not).

A server is proven to be the one started in one of two ways. The reference server binds its port itself
(``--port 0`` picks one) and prints the URL after binding: a URL read from its own standard output is its own.
A server started on a port named in advance (the recipe's ``DW_TARGET``) is proven by the listening socket: on
Linux ``/proc/net/tcp{,6}`` names the socket's inode and ``/proc/PID/fd`` the process holding it, elsewhere
``lsof``; it must be held by the started process or one of its descendants, and by nothing else. A port picked
free and handed to a server later may be taken meanwhile by another process, whose answers would otherwise
be judged as the started server's.

``python -m suite.processes wait URL --pid PID --timeout SECONDS`` is that wait as a command (the recipe's):
exit 0 once the process tree of PID holds every socket listening on the URL's port and ``GET /api/health``
answers 200; 1, with one line on standard error saying why, when it exits first, another process holds the
port, or the time passes; 2 on bad usage.

``python -m suite.processes restart SPEC`` restarts a server hard, as ``--restart-command`` must: it kills the
process a restart spec names and its descendants (``SIGKILL``), starts the spec's command again (the same port
and state), records the new pid in the spec and waits as ``wait`` does. ``spec SPEC --url URL --pid PID --log
LOG -- CMD…`` writes the spec of a running server and prints that restart command; ``stop SPEC`` stops the
server the spec names now. The embedded target, the kill matrix and the server-CI recipe restart servers this
way (:func:`write_restart_spec`, :func:`stop_restarted`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Listeners",
    "listeners",
    "main",
    "read_url",
    "restart",
    "start_redis",
    "stop_process",
    "stop_restarted",
    "wait_until_served",
    "write_restart_spec",
]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def start_redis(folder: Path, timeout: float = 20.0) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of one's own (a campaign's example database, for a bench or a test): on a Unix socket in
    ``folder``, no TCP port, no snapshots. Returns the process and its URL once it answers a ping; RuntimeError
    when redis-server is not installed or does not answer within ``timeout`` seconds."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    import redis  # optional (hypothesis[redis]): only a campaign's database needs it

    sock = folder / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(sock), "--dir", str(folder), "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"unix://{sock}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.RedisError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


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


# -- who listens on a port -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listeners:
    """The sockets listening on one port: how many there are, and how many the process tree holds."""

    total: int
    ours: int
    # The other processes holding one of them, as "pid N (command line)": what the error names, so that whoever
    # reads it can tell which process took the port.
    others: tuple[str, ...] = ()

    @property
    def proven(self) -> bool:
        """Something listens, and every listener is the tree's: a connection can reach no other process."""
        return self.total > 0 and self.ours == self.total

    @property
    def foreign(self) -> int:
        return self.total - self.ours


def _descendants(pid: int, parents: dict[int, int]) -> set[int]:
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def _proc_parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid …"; comm may hold spaces and parentheses, so split after the last ")".
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parents


def _proc_listeners(port: int, pid: int) -> Listeners:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    held = {inode for member in _descendants(pid, _proc_parents()) for inode in _sockets_of(member)}
    return Listeners(total=len(inodes), ours=len(inodes & held), others=_holders(inodes - held, pid))


def _holders(inodes: set[str], pid: int) -> tuple[str, ...]:
    """Every process outside ``pid``'s tree that holds one of the sockets ``inodes`` (none to look for: ())."""
    if not inodes:
        return ()
    return tuple(
        _described(int(entry.name))
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != pid and inodes & _sockets_of(int(entry.name))
    )


def _sockets_of(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds open (none when it is gone or not ours to read)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed since it was listed
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    found.add(link[8:-1])
    return found


def _described(pid: int) -> str:
    with contextlib.suppress(OSError):
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        line = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv if a)
        return f"pid {pid} ({line[:200]})" if line else f"pid {pid}"
    return f"pid {pid}"


def _lsof_listeners(port: int, pid: int) -> Listeners:
    lsof = shutil.which("lsof")
    ps = shutil.which("ps")
    if lsof is None or ps is None:
        raise OSError("this system has neither /proc/net/tcp nor lsof and ps: which process listens is unknown")
    found = subprocess.run(
        [lsof, "-nP", f"-iTCP:{port}", "-sTCP:LISTEN", "-Fp"], capture_output=True, text=True, check=False
    )
    pids = [int(line[1:]) for line in found.stdout.splitlines() if re.fullmatch(r"p\d+", line)]
    table = subprocess.run([ps, "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    parents = {int(a): int(b) for a, b in (line.split() for line in table.splitlines() if line.strip())}
    tree = _descendants(pid, parents)
    others = tuple(f"pid {p}" for p in pids if p not in tree)
    return Listeners(total=len(pids), ours=len(pids) - len(others), others=others)


def listeners(port: int, pid: int) -> Listeners:
    """The sockets listening on ``port`` and how many of them ``pid`` or its descendants hold. ``OSError``
    when this system cannot say."""
    if Path("/proc/net/tcp").exists():
        return _proc_listeners(port, pid)
    return _lsof_listeners(port, pid)


# -- waiting for a server started on a known port ------------------------------------------------------------


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        done, status = os.waitpid(pid, os.WNOHANG)  # a child of ours that exited is reaped here, else it lingers
        if done:
            _REAPED[pid] = status
        return done == 0
    with contextlib.suppress(OSError, ValueError):  # not a child of ours
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] == "Z":
            return False  # exited, not yet reaped by its parent
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Exit statuses of the children :func:`_alive` reaped, by pid: what an error about one that exited names.
_REAPED: dict[int, int] = {}


def _exit_status(pid: int) -> str:
    status = _REAPED.get(pid)
    if status is None:
        return ""
    if os.WIFSIGNALED(status):
        return f" (killed by signal {os.WTERMSIG(status)})"
    return f" (exit status {os.waitstatus_to_exitcode(status)})"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/health", timeout=2) as answer:
            return int(answer.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def wait_until_served(url: str, pid: int, timeout: float) -> str | None:
    """Wait until the process tree of ``pid`` holds every socket listening on ``url``'s port and
    ``GET /api/health`` answers 200; ``None`` then, else why not (it exited, another process holds the port,
    the time passed)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + timeout
    while True:
        held = listeners(port, pid)
        if held.foreign:
            # The started server cannot bind a port another process holds: whatever answers there is not it.
            who = f": {', '.join(held.others)}" if held.others else ""
            return (
                f"port {port} is held by a process this job did not start ({held.foreign} of {held.total} "
                f"listening sockets{who}): the server under test (pid {pid}) is not the one answering {url}"
            )
        if not _alive(pid):
            return f"the server under test (pid {pid}) exited before it answered{_exit_status(pid)}"
        if held.proven and _healthy(url):
            return None
        if time.monotonic() >= deadline:
            return f"the server under test (pid {pid}) did not answer GET {url}/api/health within {timeout:g} s"
        time.sleep(0.2)


# -- restarting a server hard ----------------------------------------------------------------------------------


def write_restart_spec(
    path: Path, *, command: Sequence[str], url: str, pid: int, log: str, env: Mapping[str, str] | None = None
) -> str:
    """Write the restart spec of a running server (its command, which must bind the same port, the URL it serves,
    its pid, where its output goes, the environment it needs) readable by its owner alone; return the shell
    command that restarts it (``python -m suite.processes restart SPEC``)."""
    doc = {"command": list(command), "url": url, "pid": pid, "log": log, "env": dict(env or {})}
    _write_spec(path, doc)
    return shlex.join([sys.executable, "-m", "suite.processes", "restart", str(path)])


def _write_spec(path: Path, doc: Mapping[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold tokens
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants (a server started through a shell is the shell's child)."""
    try:
        parents = _proc_parents() if Path("/proc").is_dir() else {}
    except OSError:
        parents = {}
    return _descendants(pid, parents)


def _kill_hard(pid: int, timeout: float = 10.0, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` (``SIGKILL``) to ``pid`` and its descendants and wait until they are gone (a zombie holds no
    socket); False if one outlived ``timeout``."""
    members = _tree(pid)
    for member in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, sig)
    deadline = time.monotonic() + timeout
    while any(_alive(m) for m in members):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def restart(spec_path: Path, timeout: float = 60.0) -> str | None:
    """Kill the server a restart spec names with ``SIGKILL``, start its command again (detached: it outlives this
    process), record the new pid and wait until it serves; ``None`` then, else why not.

    Between the kill and the new start the port is free, and the kernel may hand it to any process as the local
    port of an outgoing connection (another suite process's client, on a busy machine): the new server then
    cannot bind it and exits. Such a start is made again once the port can be bound, until ``timeout``."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    if not _kill_hard(int(spec["pid"])):
        return f"the server (pid {spec['pid']}) did not die within 10 s of SIGKILL"
    deadline = time.monotonic() + timeout
    while True:
        logged = os.path.getsize(spec["log"]) if os.path.exists(spec["log"]) else 0
        with open(spec["log"], "a", encoding="utf-8") as log:
            proc = subprocess.Popen(
                spec["command"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **spec["env"]},
                start_new_session=True,
            )
        _write_spec(spec_path, {**spec, "pid": proc.pid})
        why = wait_until_served(spec["url"], proc.pid, max(0.0, deadline - time.monotonic()))
        if why is None or not _lost_its_port(spec["log"], logged):
            return why
        parts = urllib.parse.urlsplit(spec["url"])
        if parts.port is None or not _wait_bindable(parts.hostname or "127.0.0.1", parts.port, deadline):
            return f"{why}: port {parts.port} stayed taken by another process for {timeout:g} s after the kill"


def _lost_its_port(log_path: str, offset: int) -> bool:
    """Whether the server started last wrote, after ``offset`` of its log, that its port was in use."""
    with open(log_path, encoding="utf-8", errors="replace") as log:
        log.seek(offset)
        return "address already in use" in log.read().lower()


def _wait_bindable(host: str, port: int, deadline: float) -> bool:
    """Poll until a listening socket could bind ``host:port`` again, or ``deadline``."""
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                time.sleep(0.1)
                continue
            return True
    return False


def stop_restarted(spec_path: Path, *, unless: int | None = None, grace: float = 10.0) -> None:
    """Stop the server a restart spec names (politely, then not). ``unless``: the pid of the process first
    started, which its owner stops itself (by now that pid may belong to another process)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        pid = int(json.loads(spec_path.read_text(encoding="utf-8"))["pid"])
        if pid == unless:
            return
        if not _kill_hard(pid, grace, signal.SIGTERM):
            _kill_hard(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m suite.processes",
        description="Wait for a server this job started: its process holds the port, and it answers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait", help="wait until PID's process tree serves URL")
    wait.add_argument("url")
    wait.add_argument("--pid", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=60.0)
    again = sub.add_parser("restart", help="kill the server a restart spec names (SIGKILL), start it again, wait")
    again.add_argument("spec", type=Path)
    again.add_argument("--timeout", type=float, default=60.0)
    write = sub.add_parser("spec", help="write the restart spec of a running server; print its restart command")
    write.add_argument("spec", type=Path)
    write.add_argument("--url", required=True)
    write.add_argument("--pid", type=int, required=True)
    write.add_argument("--log", required=True)
    write.epilog = "After the options: -- and the command that starts the server (on the port it serves now)."
    stop = sub.add_parser("stop", help="stop the server a restart spec names")
    stop.add_argument("spec", type=Path)
    given = sys.argv[1:] if argv is None else list(argv)
    # The server's command follows "--" whole: its own options are never this parser's.
    given, command = (given[: given.index("--")], given[given.index("--") + 1 :]) if "--" in given else (given, [])
    args = parser.parse_args(given)
    if args.command == "spec":
        if not command:
            parser.error("spec: give the server's command after --")
        print(write_restart_spec(args.spec, command=command, url=args.url, pid=args.pid, log=args.log))
        return 0
    if args.command == "stop":
        stop_restarted(args.spec)
        return 0
    if args.command == "restart":
        try:
            problem = restart(args.spec, args.timeout)
        except (OSError, ValueError, KeyError) as exc:
            problem = f"cannot restart from {args.spec}: {exc}"
        if problem is not None:
            print(problem, file=sys.stderr)
        return 0 if problem is None else 1
    if not re.match(r"^https?://[^/]+", args.url):
        parser.error(f"{args.url} is not an http(s) URL")
    try:
        problem = wait_until_served(args.url, args.pid, args.timeout)
    except OSError as exc:
        problem = f"cannot tell which process listens on the port: {exc}"
    if problem is None:
        return 0
    print(problem, file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
