"""Campaigns: the state machines run until a time budget is spent, against an example database that a run, a
worker of the same campaign and every later CI run share (Redis, or a directory).

Two hazards shape the keys. Hypothesis deletes a stored example that no longer fails, so one target's pass
would erase another target's failure: every Hypothesis key is prefixed with the suite's build and the target's
identity (:class:`KeyedDatabase`). And Hypothesis' keys hash the test's source, so a new suite build orphans
them: every failure found is also kept as its replay program (:class:`ReplayStore`), keyed by the target and the
machine alone, which a run given the database replays before it explores.

Nothing here contacts the target. :func:`open_store` reaches the database (a usage error when it cannot, before
the first request).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    InMemoryExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

__all__ = [
    "EXPIRY",
    "CampaignClock",
    "KeyedDatabase",
    "ReplayStore",
    "Store",
    "check_program",
    "open_store",
    "parse_duration",
    "parse_worker",
    "suite_build",
    "target_identity",
    "worker_seed",
]

# How long Redis keeps what a campaign stored without anyone touching it: a failure nobody replays for a month
# belongs to a server nobody tests any more.
EXPIRY = timedelta(days=30)
HYPOTHESIS_PREFIX = b"dw-hypothesis:"
REPLAY_PREFIX = "dw-replays:"

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(raw: str) -> float | None:
    """Seconds of ``20s``, ``10m``, ``2h`` or a bare number of seconds; ``None`` when it is none of them or lies
    outside 1 s … 7 days."""
    match = _DURATION.match(raw.strip())
    if match is None:
        return None
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return seconds if 1 <= seconds <= 7 * 86400 else None


def parse_worker(raw: str | None, env: dict[str, str]) -> tuple[int, int | None] | None:
    """``I/N`` (0 ≤ I < N), or the index a Kubernetes Indexed Job gives (``JOB_COMPLETION_INDEX``; N unknown);
    ``(0, None)`` when neither is given; ``None`` when ``raw`` is malformed."""
    if raw is None:
        index = env.get("JOB_COMPLETION_INDEX")
        if index is None:
            return 0, None
        return (int(index), None) if index.isdigit() else None
    left, sep, right = raw.partition("/")
    if not (sep and left.isdigit() and right.isdigit()):
        return None
    i, n = int(left), int(right)
    return (i, n) if 0 <= i < n <= 10_000 else None


def worker_seed(seed: int, worker: int, round_: int = 0) -> int:
    """The seed of one round of one worker: the run's seed mixed with both, so identical workers given the same
    DW_CONFORMANCE_SEED still explore different sequences."""
    digest = hashlib.sha256(f"{seed}:{worker}:{round_}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


_BUILD: str | None = None


def suite_build() -> str:
    """A digest of the suite's own source and schemas: what Hypothesis' stored examples are valid for."""
    global _BUILD
    if _BUILD is None:
        root = Path(__file__).resolve().parent
        digest = hashlib.sha256()
        for path in sorted([*root.rglob("*.py"), *(root.parent / "schemas").rglob("*.json")]):
            digest.update(path.relative_to(root.parent).as_posix().encode())
            digest.update(path.read_bytes())
        _BUILD = digest.hexdigest()[:12]
    return _BUILD


def target_identity(cluster_info: dict[str, Any], url: str, embedded: bool, name: str | None = None) -> str:
    """Who the stored failures belong to: ``name`` when the user gave one (--example-db-target), else the
    server's name and version and, for a server at a URL, that URL (an embedded server's port changes)."""
    if name:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    server = cluster_info.get("server_name") or cluster_info.get("name") or "server"
    version = cluster_info.get("version") or ""
    where = "embedded" if embedded else url
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{server}-{version}")
    return f"{readable}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


class KeyedDatabase(ExampleDatabase):
    """Another database with every key prefixed: the suite's build, the target, the machine."""

    def __init__(self, inner: ExampleDatabase, prefix: str) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix.encode()

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)


class ReplayStore:
    """Failures kept as their step programs, per target and machine, whatever the suite's build."""

    def __init__(self, redis: Any = None, directory: Path | None = None) -> None:
        self.redis = redis
        self.directory = directory

    def _key(self, target: str, machine: str) -> str:
        return f"{REPLAY_PREFIX}{target}:{machine}"

    def _folder(self, target: str, machine: str) -> Path:
        assert self.directory is not None
        return self.directory / "replays" / target / machine

    def entries(self, target: str, machine: str) -> list[dict[str, Any]]:
        raw: list[bytes | str] = []
        if self.redis is not None:
            raw = list(self.redis.hvals(self._key(target, machine)))
        elif self.directory is not None and self._folder(target, machine).is_dir():
            raw = [p.read_text(encoding="utf-8") for p in sorted(self._folder(target, machine).glob("*.json"))]
        out = []
        for value in raw:
            try:
                doc = json.loads(value)
            except ValueError:
                continue  # not written by the suite: never executed
            if isinstance(doc, dict) and isinstance(doc.get("steps"), str):
                out.append(doc)
        return out

    def save(self, target: str, machine: str, entry: dict[str, Any]) -> str:
        digest = hashlib.sha256(entry["steps"].encode()).hexdigest()[:16]
        entry = {**entry, "id": digest}
        text = json.dumps(entry, sort_keys=True)
        if self.redis is not None:
            key = self._key(target, machine)
            self.redis.hset(key, digest, text)
            self.redis.expire(key, int(EXPIRY.total_seconds()))
        elif self.directory is not None:
            folder = self._folder(target, machine)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{digest}.json").write_text(text, encoding="utf-8")
        return digest

    def remove(self, target: str, machine: str, digest: str) -> None:
        if self.redis is not None:
            self.redis.hdel(self._key(target, machine), digest)
        elif self.directory is not None:
            (self._folder(target, machine) / f"{digest}.json").unlink(missing_ok=True)


@dataclass
class Store:
    """An opened example database: Hypothesis' (keyed per machine by :meth:`for_machine`) and the replays."""

    url: str
    readonly: bool
    shared: ExampleDatabase
    replays: ReplayStore

    def for_machine(self, build: str, target: str, machine: str) -> ExampleDatabase:
        keyed = KeyedDatabase(self.shared, f"{build}:{target}:{machine}:")
        if self.readonly:
            # Hypothesis writes while it shrinks; those writes go to memory and the shared database is only read.
            return MultiplexedDatabase(InMemoryExampleDatabase(), ReadOnlyDatabase(keyed))
        return keyed


def open_store(url: str, readonly: bool) -> Store:
    """Open ``url`` (``redis://…``, ``rediss://…``, ``unix://…`` or a directory); raise ``ValueError`` with what
    to fix when it cannot be reached or written."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise ValueError("a redis:// database needs the redis client: pip install 'hypothesis[redis]'") from None
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10)
            client.ping()
        except (redis.RedisError, ValueError, OSError) as exc:
            raise ValueError(f"Redis is not reachable ({type(exc).__name__}: {exc})") from None
        shared: ExampleDatabase = RedisExampleDatabase(client, expire_after=EXPIRY, key_prefix=HYPOTHESIS_PREFIX)
        return Store(url, readonly, shared, ReplayStore(redis=client))
    path = Path(url)
    try:
        if readonly:
            if not path.is_dir():
                raise ValueError("no such directory")
        else:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".dw-write-probe-{os.getpid()}"
            probe.write_text("", encoding="utf-8")
            probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot create or write it ({exc.strerror or type(exc).__name__})") from None
    return Store(url, readonly, DirectoryBasedExampleDatabase(str(path / "hypothesis")), ReplayStore(directory=path))


def check_program(steps: str, class_name: str) -> ast.Module:
    """The stored step program, parsed, refusing anything but what Hypothesis prints for a state machine: the
    machine built once, then rule calls on it whose arguments are literals or earlier results."""
    tree = ast.parse(steps, mode="exec")

    def literal_or_name(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return True
        try:
            ast.literal_eval(node)
        except ValueError:
            return False
        return True

    for i, stmt in enumerate(tree.body):
        value = stmt.value if isinstance(stmt, ast.Assign | ast.Expr) else None
        if not isinstance(value, ast.Call):
            raise ValueError(f"line {stmt.lineno}: not a step")
        func = value.func
        if i == 0:
            built = isinstance(func, ast.Name) and func.id == class_name and not value.args and not value.keywords
            if not (built and isinstance(stmt, ast.Assign)):
                raise ValueError(f"line {stmt.lineno}: the program must start with state = {class_name}()")
            continue
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "state"):
            raise ValueError(f"line {stmt.lineno}: not a rule of the machine")
        if func.attr.startswith("__") or value.args:
            raise ValueError(f"line {stmt.lineno}: not a rule call")
        if not all(k.arg is not None and literal_or_name(k.value) for k in value.keywords):
            raise ValueError(f"line {stmt.lineno}: an argument is neither a literal nor an earlier result")
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if not all(isinstance(n, ast.Name) and n.id != "state" for n in names):
                raise ValueError(f"line {stmt.lineno}: a result must be a plain name")
    return tree


@dataclass
class CampaignClock:
    """One process's campaign: its deadline, the machines still to run, and when it last said how it goes."""

    seconds: float
    machines_left: int
    progress_seconds: float = 60.0
    started: float = field(default_factory=time.monotonic)
    last_line: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def share(self) -> float:
        """The seconds the next machine may spend: what is left, split over the machines left."""
        left = self.seconds - (time.monotonic() - self.started)
        return max(0.0, left / max(1, self.machines_left))

    def due(self) -> bool:
        return time.monotonic() - self.last_line >= self.progress_seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.started
