r"""OpenAPI-driven fuzzing: Schemathesis generates requests from ``schemas/openapi.yaml``, the suite judges
the answers.

For every operation of the document, Schemathesis' coverage phase gives deterministic cases for every
parameter and body property (boundary values, wrong types, missing required values, unexpected content
types and methods; up to 5 × ``--fuzz-examples``, round-robin over their kinds), and Hypothesis draws
``--fuzz-examples`` random cases: positive ones (bodies, paths and queries the schemas describe, with the
version, namespace and credential headers of the operation's plane) and negative ones (each with at least
one part that breaks the schema: bodies of the wrong type, non-JSON and invalid UTF-8 bytes, bad path and
query values, and in a third of them bad headers too). Operations that act on a workflow first get a
*live world* — a run built through the control plane with a registered worker and a leased task — and a
case targets it with some probability: its ids go into the path parameters, and sometimes its fencing
values into the body. Every answer is judged by the plain check functions below, each tied to one
requirement ID:

================================  ========================================  ===============================
check                             rule                                      requirement
================================  ========================================  ===============================
``not_a_server_error``            no 5xx unless the operation documents it  ROBUST-NO-5XX
                                  (503 on polls, 503/504 on queries)
``status_code_conformance``       the status is documented for the          ROBUST-STATUS-SET
                                  operation, or 413 for an oversized body
``response_schema_conformance``   the body matches the documented schema    SCHEMA-RESPONSES
``error_envelope``                a 4xx carries ``reason``; on worker       ROBUST-ENVELOPE-ON-ERROR
                                  routes also the worker envelope           (worker plane), otherwise
                                                                            ENVELOPE-ERROR-REASON
``rejected_changes_nothing``      a 4xx on a live world leaves describe     ROBUST-REJECTED-NO-STATE-CHANGE
                                  and control-plane history unchanged
================================  ========================================  ===============================

The document has no OpenAPI ``links``, so Schemathesis cannot chain operations by itself;
:func:`fuzz_stateful` is the hand-written sequence start → register → poll → complete, where the start,
register and poll bodies and the command batch are all drawn from the document's schemas; an accepted
complete, repeated, must be fenced with 409 (FENCE-AFTER-COMPLETE) and change nothing.

Failures are :class:`FuzzFailure` (a :class:`~suite.outcomes.CheckFailure`) carrying the recorded exchange,
whose ``curl`` line reproduces the case. A run never stops at the first failure: every case is judged,
the first few failures of each requirement are kept as evidence, and the result becomes
:class:`~suite.outcomes.Record`\ s (check name ``fuzz:<operationId>``) with its statistics as a labelled
:class:`~suite.outcomes.FuzzStats` row.

Everything here is synchronous (Schemathesis sends with ``requests``; the live worlds use ``httpx.Client``).
The embedded server's 3-second leases are renewed between cases, never between the two snapshots of a
comparison; a world that accepted a call (or answered 5xx) is rebuilt before the next case targets it, so
nothing a generated command scheduled (a timer, an activity) can change a world while it is compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import random
import secrets
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core import NotSet
from schemathesis.transport.requests import ManagedCookiesSession

from suite.protocol.codec import INT64_MAX, INT64_MIN, encode_blob
from suite.protocol.requirements import REGISTRY, applicable
from suite.protocol.retries import classify
from suite.protocol.versions import CONTROL_PLANE_VERSION

from .client import (
    CONTROL_HEADER,
    LOST_ANSWER,
    REDACTED,
    WORKER_HEADER,
    Exchange,
    ProtocolClient,
    SyncHttp11Transport,
    direct_http,
    resendable_poll,
    tls,
)
from .context import CheckContext, TargetInfo
from .outcomes import FUZZ_COUNTERS, CheckFailure, FuzzStats, HarnessError, Kind, Record, Verdict, broken

__all__ = [
    "AVRO_VALUE_FORMAT",
    "FUZZ_CHECKS",
    "FUZZ_REQUIREMENTS",
    "GROUPS",
    "STATEFUL",
    "WORLDS",
    "Answer",
    "FuzzBudget",
    "FuzzFailure",
    "FuzzResult",
    "Operation",
    "all_groups",
    "avro_values",
    "fuzz_group",
    "fuzz_operation",
    "fuzz_stateful",
    "group_members",
    "group_requirements",
    "judge",
    "judged_requirements",
    "load_schema",
    "operations",
]

AVRO_VALUE_FORMAT: Final = "durable-workflow-avro-value"
# Invariant 67 lists the statuses of a hostile request; an oversized body may also meet the HTTP layer's
# 413 before any route runs, which is a legitimate answer to a request no server has to buffer.
ALWAYS_ALLOWED: Final = frozenset({413})
# Long polls, update waits and history waits are pinned to this many seconds so a case never holds a
# connection for the target's default (30 s); the value stays inside every schema's positive space.
R = TypeVar("R")

SHORT_HOLD: Final = 1
CALL_TIMEOUT: Final = 30.0
KEPT_FAILURES: Final = 3  # exchanges kept as evidence per failing requirement and operation
SUBSTITUTE: Final = ("none", "ids", "ids+fence")  # how a case targets the live world, drawn per case
# The requirement IDs the fuzz checks judge.
NO_5XX: Final = "ROBUST-NO-5XX"
STATUS_SET: Final = "ROBUST-STATUS-SET"
SCHEMA: Final = "SCHEMA-RESPONSES"
ENVELOPE: Final = "ROBUST-ENVELOPE-ON-ERROR"
ERROR_REASON: Final = "ENVELOPE-ERROR-REASON"
NO_CHANGE: Final = "ROBUST-REJECTED-NO-STATE-CHANGE"
AFTER_COMPLETE: Final = "FENCE-AFTER-COMPLETE"  # judged by the stateful sequence only
FUZZ_REQUIREMENTS: Final = (NO_5XX, STATUS_SET, SCHEMA, ENVELOPE, ERROR_REASON, NO_CHANGE)


# -- budget, failures, results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzBudget:
    """``examples`` random cases per operation (half positive, half negative) plus up to ``coverage_cap``
    cases of Schemathesis' coverage phase; ``seed`` makes the draw repeatable."""

    examples: int = 20
    seed: int = 0
    coverage: int | None = None  # coverage-phase cases per operation; None: 5 × examples

    @property
    def coverage_cap(self) -> int:
        # 5 × 20 keeps at least one case of every coverage description for all operations but one.
        return self.coverage if self.coverage is not None else 5 * self.examples

    def seed_for(self, name: str) -> int:
        return (self.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32


class FuzzFailure(CheckFailure):
    """A fuzz check failed on one case; ``exchanges[0]`` is the case as sent, with its curl line."""

    def __init__(
        self,
        check: str,
        message: str,
        *,
        requirement: str,
        exchange: Exchange,
        expected: Any = None,
        received: Any = None,
    ) -> None:
        self.check = check
        super().__init__(
            f"{check}: {message}",
            expected=expected,
            received=received,
            exchanges=[exchange],
            requirement=requirement,
        )


@dataclass
class FuzzResult:
    """What fuzzing one operation (or the stateful sequence) found."""

    name: str
    doc: str
    judged: set[str] = field(default_factory=set)
    failures: dict[str, list[FuzzFailure]] = field(default_factory=dict)
    failure_counts: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    duration: float = 0.0

    def fail(self, failure: FuzzFailure) -> None:
        req = failure.requirement or NO_5XX
        self.failure_counts[req] += 1
        kept = self.failures.setdefault(req, [])
        if len(kept) < KEPT_FAILURES:
            kept.append(failure)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def summary(self) -> str:
        s = self.stats
        if s["sequences"]:
            parts = [
                f"{s['sequences']} sequences ({s['started']} started, {s['leased']} leased, "
                f"{s['completed']} completed), {s['cases']} cases"
            ]
        else:
            parts = [
                f"{s['cases']} cases ({s['coverage']} coverage-phase, {s['positive']} positive, "
                f"{s['negative']} negative)"
            ]
        if s["live"]:
            parts.append(f"{s['live']} on a live workflow, {s['compared']} state comparisons")
        if s["unsendable"]:
            parts.append(f"{s['unsendable']} unsendable by the HTTP client")
        statuses = ", ".join(f"{code}×{n}" for code, n in sorted(self.statuses.items()))
        return "; ".join(parts) + (f"; statuses {statuses}" if statuses else "") + f"; {self.duration:.1f}s"

    def first_failure(self) -> FuzzFailure | None:
        for req in FUZZ_REQUIREMENTS:
            if self.failures.get(req):
                return self.failures[req][0]
        return next((f[0] for f in self.failures.values() if f), None)

    def stats_row(self, group: str) -> FuzzStats:
        """The labelled statistics of this run (a row of the report's fuzz table, never truncated)."""
        statuses = {str(k): v for k, v in sorted(self.statuses.items())}
        counters = {name: self.stats[name] for name in FUZZ_COUNTERS}
        return FuzzStats(self.name, group, **counters, statuses=statuses, seconds=round(self.duration, 3))

    def records(self, target: TargetInfo, group: str = "") -> list[Record]:
        """One passing record for every requirement the run judged without a failure, and one record per
        failed requirement; the first carries the run's statistics and request count."""
        seconds = round(self.duration, 3)
        base = Record(
            Kind.FUZZ, f"fuzz:{self.name}", doc=self.doc, duration_seconds=seconds, fuzz=self.stats_row(group)
        )
        base = replace(base, requests=self.stats["requests"])
        records: list[Record] = []
        order = [*FUZZ_REQUIREMENTS, *sorted(self.judged - set(FUZZ_REQUIREMENTS))]
        passed = [r for r in order if r in self.judged and r not in self.failures]
        passed = [r for r in passed if applicable(REGISTRY[r], target.certified_minor)]
        if self.error is not None:
            message = f"{self.error} (after {self.summary()})"
            records.append(
                replace(base, requirements=tuple(passed or [NO_5XX]), verdict=Verdict.ERROR, message=message)
            )
        elif passed:
            records.append(replace(base, requirements=tuple(passed)))
        for req, kept in self.failures.items():
            if not applicable(REGISTRY[req], target.certified_minor):
                continue
            first = kept[0]
            more = self.failure_counts[req] - 1
            message = (
                f"{first}"
                + (f"\n  ({more} more failing case(s) of this rule)" if more else "")
                + f"\n  Reproduce: {first.exchanges[0].curl()}"
                + f"\n  ({self.summary()})"
            )
            records.append(
                replace(
                    base,
                    requirements=(req,),
                    verdict=broken(req),
                    message=message,
                    failed_requirement=req,
                    exchanges=tuple(f.exchanges[0].to_json() for f in kept),
                )
            )
        # The report sums requests and lists statistics over records: the operation's count once.
        return [records[0], *(replace(r, requests=0, fuzz=None) for r in records[1:])] if records else []


# -- the document -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One operation of the document, as the checks need it."""

    op_id: str
    method: str
    path: str
    plane: str  # worker | control | discovery (the operation's first tag)
    statuses: frozenset[int]
    optional: bool
    summary: str


@functools.cache
def operations() -> dict[str, Operation]:
    """Every operation of ``schemas/openapi.yaml`` by ``operationId``."""
    import schemas

    found: dict[str, Operation] = {}
    for path, item in schemas.openapi()["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "delete", "patch") or not isinstance(op, dict):
                continue
            statuses = frozenset(int(code) for code in op.get("responses", {}) if str(code).isdigit())
            tags = op.get("tags") or ["control"]
            found[op["operationId"]] = Operation(
                op_id=op["operationId"],
                method=method.upper(),
                path=path,
                plane=str(tags[0]),
                statuses=statuses,
                optional=bool(op.get("x-optional")),
                summary=str(op.get("summary", "")),
            )
    return found


def avro_values() -> st.SearchStrategy[Any]:
    """Native values the Avro ``Value`` schema can carry (§13.2): null, booleans, 64-bit longs, finite
    doubles, bytes, Unicode text, and arrays and string-keyed maps of them."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(INT64_MIN, INT64_MAX)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.binary(max_size=12)
        | st.text(max_size=12)  # st.text never draws lone surrogates, which UTF-8 cannot encode
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=8,
    )


_LOCK = threading.Lock()


@functools.cache
def load_schema() -> Any:
    """The document as a Schemathesis schema, loaded from its packaged file so the relative ``$ref`` to
    ``./json/*.schema.json`` resolve (the files are real files in a checkout and in site-packages).

    The ``durable-workflow-avro-value`` format gets a generator of valid single-object Avro frames, so a
    positive payload really is a payload."""
    with _LOCK:
        schemathesis.openapi.format(AVRO_VALUE_FORMAT, avro_values().map(encode_blob))
        # The real file path (a checkout, or site-packages for a wheel): Schemathesis resolves the relative
        # $refs against it, lazily, so the JSON Schema files must stay where they are.
        path = resources.files("schemas").joinpath("openapi.yaml")
        return schemathesis.openapi.from_path(str(path))


@functools.cache
def _validator() -> Any:
    from .schema_check import ResponseValidator

    return ResponseValidator()


# -- the checks ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """What a fuzz check sees: the operation, the exchange and the parsed answer."""

    op: Operation
    exchange: Exchange
    status: int
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None
    path: str  # the raw request path, without the query
    target: TargetInfo
    probe: bool = False  # a method the operation does not have (Schemathesis' unexpected-method cases)

    @property
    def reason(self) -> Any:
        return self.body.get("reason") if isinstance(self.body, dict) else None

    @functools.cached_property
    def schema_problems(self) -> list[str]:
        """The body against the schema documented for the operation and status (validated once per answer:
        the exchange's record and :func:`response_schema_conformance` read the same list)."""
        return list(_validator()(self.op.method, self.path, self.status, self.body))

    def received(self) -> str:
        text = json.dumps(self.body)[:300] if self.body is not None else repr(self.exchange.response_body)[:300]
        return f"{self.status} {text}"


FuzzCheck = Callable[[Answer], None]
FUZZ_CHECKS: dict[str, tuple[FuzzCheck, tuple[str, ...]]] = {}


def fuzz_check(*requirements: str) -> Callable[[FuzzCheck], FuzzCheck]:
    """Register a response check; its function name is its stable ID, ``requirements`` what it judges."""

    def register(fn: FuzzCheck) -> FuzzCheck:
        FUZZ_CHECKS[fn.__name__] = (fn, requirements)
        return fn

    return register


@fuzz_check(NO_5XX)
def not_a_server_error(a: Answer) -> None:
    """Invariant 67: no request, however malformed, gets a 5xx (a documented 503/504 is an answer)."""
    # 501 is the HTTP answer to a method the server does not implement at all.
    if a.status >= 500 and a.status not in a.op.statuses and not (a.probe and a.status == 501):
        raise FuzzFailure(
            "not_a_server_error",
            f"{a.op.op_id} answered a server error",
            requirement=NO_5XX,
            exchange=a.exchange,
            expected="a 2xx or 4xx answer (never 5xx, PROTOCOL.md invariant 67)",
            received=a.received(),
        )


@fuzz_check(STATUS_SET)
def status_code_conformance(a: Answer) -> None:
    """The status is one the document lists for the operation (or 413 for a body over the size limit)."""
    if a.status < 500 and a.status not in a.op.statuses | ALWAYS_ALLOWED and not a.probe:
        raise FuzzFailure(
            "status_code_conformance",
            f"{a.op.op_id} answered an undocumented status",
            requirement=STATUS_SET,
            exchange=a.exchange,
            expected=f"one of {sorted(a.op.statuses | ALWAYS_ALLOWED)}",
            received=a.received(),
        )


@fuzz_check(SCHEMA)
def response_schema_conformance(a: Answer) -> None:
    """The body matches the schema documented for the operation and status."""
    if a.probe or (a.status >= 500 and a.status not in a.op.statuses):
        return  # a server error is not_a_server_error's finding; its body has no schema
    problems = a.schema_problems
    if problems:
        raise FuzzFailure(
            "response_schema_conformance",
            f"{a.op.op_id} {a.status} does not match its schema: {problems[0]}",
            requirement=SCHEMA,
            exchange=a.exchange,
            expected=f"a body valid against the {a.status} response schema of {a.op.op_id}",
            received="; ".join(problems[:3]),
        )


@fuzz_check(ENVELOPE, ERROR_REASON)
def error_envelope(a: Answer) -> None:
    """A 4xx carries ``reason``; a worker-route 4xx also the worker envelope (invariants 5 and 67)."""
    if a.probe or not 400 <= a.status < 500:
        return
    worker = a.op.plane == "worker"
    req = ENVELOPE if worker else ERROR_REASON
    problems: list[str] = []
    if not (isinstance(a.reason, str) and a.reason):
        problems.append(f"reason={a.reason!r}")
    # The HTTP layer's 413 answers before any route: only its reason is required.
    if worker and a.status != 413:
        advertised = a.target.advertised_version
        body = a.body if isinstance(a.body, dict) else {}
        if a.headers.get(WORKER_HEADER.lower()) != advertised:
            problems.append(f"header {WORKER_HEADER}={a.headers.get(WORKER_HEADER.lower())!r}")
        if body.get("protocol_version") != advertised:
            problems.append(f"protocol_version={body.get('protocol_version')!r}")
        if not isinstance(body.get("server_capabilities"), dict):
            problems.append("no server_capabilities object")
    if problems:
        raise FuzzFailure(
            "error_envelope",
            f"{a.op.op_id} {a.status} lacks " + ", ".join(problems),
            requirement=req,
            exchange=a.exchange,
            expected="reason" + (f", {WORKER_HEADER}, protocol_version, server_capabilities" if worker else ""),
            received=a.received(),
        )


def judged_requirements(a: Answer) -> set[str]:
    """The requirements a response says something about."""
    if a.probe:
        return {NO_5XX}
    out = {NO_5XX, STATUS_SET, SCHEMA}
    if 400 <= a.status < 500:
        out.add(ENVELOPE if a.op.plane == "worker" else ERROR_REASON)
    return out


def judge(a: Answer) -> list[FuzzFailure]:
    found = []
    for fn, _ in FUZZ_CHECKS.values():
        try:
            fn(a)
        except FuzzFailure as failure:
            found.append(failure)
    return found


# -- talking to the target outside Schemathesis (live worlds, snapshots) ------------------------------------


class WorldUnavailable(Exception):
    """A live world could not be built or read; the case runs without it (never the target's failure here,
    the conformance checks judge the calls a world is made of)."""


class _AnswerLost(WorldUnavailable, HarnessError):
    """Under ``--faults``: the answer to a world-building call that may have been applied was lost; the world
    cannot be trusted (a harness matter, never the target's failure)."""


# What a lost answer looks like to requests (matched by name: the suite does not import requests).
_LOST_NAMES = frozenset({"ConnectionError", "ChunkedEncodingError", "ContentDecodingError"})


class _Driver:
    """Plain protocol calls for building worlds and reading state (a synchronous httpx client), the session
    Schemathesis sends the cases on, and the event loop the held ones are awaited on."""

    def __init__(self, target: TargetInfo) -> None:
        self.target = target
        transport = SyncHttp11Transport() if direct_http(target.url) else None
        self.http = httpx.Client(base_url=target.url, timeout=CALL_TIMEOUT, verify=tls(), transport=transport)
        self.requests = 0
        # One keep-alive session for the cases, as a fresh one per case would send them: no default headers (those
        # of the session are set aside while a case is sent only when the session has none), no cookie kept from
        # one case to the next. Not under --faults: a request lost on a kept-alive connection would be sent again
        # by Schemathesis, on a fresh one, a delivery the suite neither made nor could judge.
        self.session: ManagedCookiesSession | None = None
        if target.fault_ledger is None:
            self.session = ManagedCookiesSession()
            self.session.headers.clear()
            # requests reads the environment's proxies and looks for a netrc file before every request: where
            # neither applies to the target, the same requests go out without those reads.
            self.session.trust_env = not direct_http(target.url) or _netrc_present()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: CheckContext | None = None

    def close(self) -> None:
        self.http.close()
        if self.session is not None:
            self.session.close()
        if self._loop is not None and self._ctx is not None:
            self._loop.run_until_complete(self._ctx.client.aclose())
            self._loop.close()

    def now(self) -> datetime:
        return self.target.clock.now()

    def held(self, send: Callable[[], R], hold: float) -> R:
        """``send()`` (blocking) as a request the target may hold ``hold`` s. The fuzzer's waits go through the
        check context's one helper like every check's: with a test clock, the hold is ended by moving the clock
        once the request had :data:`suite.context.HELD_GRACE` to answer (``CheckContext.held``)."""
        if not self.target.clock.skips:
            return send()
        if self._loop is None or self._ctx is None:
            self._loop = asyncio.new_event_loop()
            self._ctx = CheckContext(target=self.target, client=ProtocolClient(self.target.url), check_name="fuzz")
        ctx = self._ctx

        async def go() -> R:
            return await ctx.held(asyncio.to_thread(send), hold)

        try:
            return self._loop.run_until_complete(go())
        finally:
            ctx.client.exchanges.clear()  # the clock's moves: test equipment, never a case's evidence

    def headers(self, plane: str) -> dict[str, str]:
        return plane_headers(self.target, plane)

    def call(
        self,
        plane: str,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        prefix = "/api/worker" if plane == "worker" else "/api"
        op = classify(method, prefix + path)
        faulty = self.target.fault_ledger is not None
        if faulty:
            body = resendable_poll(op, body)
        for _ in range(6 if faulty else 1):
            self.requests += 1
            try:
                return self.http.request(
                    method,
                    prefix + path,
                    headers=self.headers(plane),
                    json=body,
                    params=params,
                    timeout=timeout or CALL_TIMEOUT,
                )
            except LOST_ANSWER as exc:
                if not faulty:
                    raise HarnessError(f"{method} {prefix}{path}: {type(exc).__name__}: {exc}") from exc
                if not op.resendable(body):
                    raise _AnswerLost(f"{method} {prefix}{path}: the answer was lost ({exc}); maybe applied") from exc
            except httpx.HTTPError as exc:
                raise HarnessError(f"{method} {prefix}{path}: {type(exc).__name__}: {exc}") from exc
        raise _AnswerLost(f"{method} {prefix}{path}: the answers of 6 deliveries in a row were lost")

    def ok(self, reply: httpx.Response, statuses: tuple[int, ...], what: str) -> dict[str, Any]:
        try:
            body = reply.json()
        except ValueError:
            body = None
        if reply.status_code not in statuses or not isinstance(body, dict):
            raise WorldUnavailable(f"{what}: {reply.status_code} {reply.text[:200]}")
        return body

    def register(self, queue: str) -> str:
        worker = uid("w")
        body = {"worker_id": worker, "task_queue": queue, "runtime": "python"}
        self.ok(self.call("worker", "POST", "/register", body), (200, 201), "worker registration")
        return worker

    def start(self, queue: str) -> tuple[str, str]:
        wid = uid("wf")
        body = {"workflow_type": "conformance.Fuzz", "workflow_id": wid, "task_queue": queue}
        out = self.ok(self.call("control", "POST", "/workflows", body), (200, 201), "workflow start")
        return wid, str(out.get("run_id"))

    def lease(self, kind: str, worker: str, queue: str, within: float = 10.0) -> dict[str, Any]:
        deadline = self.now() + timedelta(seconds=within)
        while self.now() < deadline:
            body = {"worker_id": worker, "task_queue": queue, "timeout_seconds": 1}
            reply = self.held(functools.partial(self.call, "worker", "POST", f"/{kind}/poll", body, timeout=20), 1)
            out = self.ok(reply, (200,), f"{kind} poll")
            if isinstance(out.get("task"), dict):
                return dict(out["task"])
        raise WorldUnavailable(f"no {kind} task leased on {queue} within {within:g}s")

    def complete_wf(self, task: dict[str, Any], commands: list[dict[str, Any]]) -> None:
        body = {
            "lease_owner": task.get("lease_owner"),
            "workflow_task_attempt": task.get("workflow_task_attempt"),
            "commands": commands,
        }
        self.ok(
            self.call("worker", "POST", f"/workflow-tasks/{task['task_id']}/complete", body),
            (200,),
            "workflow-task complete",
        )

    def snapshot(self, world: World) -> tuple[Any, list[Any]]:
        """Describe and the whole control-plane history of the world's run."""
        reply = self.call("control", "GET", f"/workflows/{world.workflow_id}")
        if reply.status_code != 200:
            raise WorldUnavailable(f"describe answered {reply.status_code}: {reply.text[:200]}")
        describe = reply.json()
        events: list[Any] = []
        token: str | None = None
        for _ in range(100):
            params = {"page_size": "1000", **({"next_page_token": token} if token else {})}
            path = f"/workflows/{world.workflow_id}/runs/{world.run_id}/history"
            reply = self.call("control", "GET", path, params=params)
            if reply.status_code != 200:
                raise WorldUnavailable(f"history answered {reply.status_code}: {reply.text[:200]}")
            page = reply.json()
            events.extend(page.get("events") or [])
            nxt = page.get("next_page_token")
            if not nxt or nxt == token:
                break
            token = str(nxt)
        return describe, events


def _netrc_present() -> bool:
    """Whether requests would find a netrc file (credentials it adds to a request that has none)."""
    if os.environ.get("NETRC") is not None:
        return True
    return any(Path(f"~/{name}").expanduser().exists() for name in (".netrc", "_netrc"))


def uid(prefix: str) -> str:
    return f"fz-{prefix}-{secrets.token_hex(5)}"


def plane_headers(target: TargetInfo, plane: str) -> dict[str, str]:
    """The headers a well-formed request of ``plane`` carries (§3, §4)."""
    headers: dict[str, str] = {}
    token: str | None
    if plane == "worker":
        headers = {WORKER_HEADER: target.protocol_version, "X-Namespace": target.namespace}
        token = target.worker_token
    elif plane == "control":
        headers = {CONTROL_HEADER: CONTROL_PLANE_VERSION, "X-Namespace": target.namespace}
        token = target.operator_token
    else:
        token = target.operator_token or target.worker_token
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


# -- live worlds ------------------------------------------------------------------------------------------

# Which world an operation's cases may target. "workflow": a run whose workflow task is leased; "activity":
# an activity task leased by the run's worker; "query": a query task leased while a control-plane query
# waits; "parked": a run whose queue has no worker, so a query is refused at once (409
# query_worker_unavailable) instead of holding the caller for the target's query timeout. The "-ready"
# worlds of the polls hold the same task ready but not yet leased, so a valid poll returns at once.
WORLDS: Final[dict[str, str]] = {
    "register_worker": "workflow",
    "heartbeat_worker": "workflow",
    "deregister_worker": "workflow",
    "poll_workflow_task": "workflow-ready",
    "fetch_workflow_task_history": "workflow",
    "heartbeat_workflow_task": "workflow",
    "complete_workflow_task": "workflow",
    "fail_workflow_task": "workflow",
    "poll_query_task": "query-ready",
    "complete_query_task": "query",
    "fail_query_task": "query",
    "poll_activity_task": "activity-ready",
    "complete_activity_task": "activity",
    "fail_activity_task": "activity",
    "heartbeat_activity_task": "activity",
    "get_activity_task_status": "activity",
    "start_workflow": "workflow",
    "describe_workflow": "workflow",
    "list_workflow_runs": "workflow",
    "describe_workflow_run": "workflow",
    "get_workflow_run_history": "workflow",
    "signal_workflow": "workflow",
    "signal_workflow_run": "workflow",
    "query_workflow": "parked",
    "query_workflow_run": "parked",
    "update_workflow": "workflow",
    "update_workflow_run": "workflow",
    "cancel_workflow": "workflow",
    "cancel_workflow_run": "workflow",
    "request_workflow_cancellation": "workflow",
    "request_workflow_run_cancellation": "workflow",
    "terminate_workflow": "workflow",
    "terminate_workflow_run": "workflow",
    "drain_build_id": "workflow",
    "resume_build_id": "workflow",
    "deliver_workflow_task_cancellation": "workflow",
    "create_worker_session": "workflow",
    "heartbeat_worker_session": "workflow",
    "close_worker_session": "workflow",
    "list_worker_sessions": "workflow",
    "describe_worker_session": "workflow",
}


@dataclass
class World:
    """A run built for one operation's cases, and the ids and fencing values a case may borrow."""

    kind: str
    queue: str
    worker: str
    workflow_id: str
    run_id: str
    task: dict[str, Any] | None = None  # the leased workflow, activity or query task
    renewed_at: float = 0.0
    built_at: float = 0.0
    dirty: bool = False
    query_call: threading.Thread | None = None

    def path_values(self) -> dict[str, str]:
        values = {"workflow_id": self.workflow_id, "run_id": self.run_id, "queue": self.queue}
        values["worker_id"] = self.worker
        # A session id of this world's worker: a session route's cases name a session that may exist.
        values["session_id"] = f"{self.worker}-session"
        if self.task is not None:
            values["task_id"] = str(self.task.get("task_id", ""))
            values["query_task_id"] = str(self.task.get("query_task_id", ""))
        return {k: v for k, v in values.items() if v}

    def body_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {"worker_id": self.worker, "task_queue": self.queue, "workflow_id": self.workflow_id}
        values["session_id"] = f"{self.worker}-session"
        if self.task is not None:
            for key in ("lease_owner", "workflow_task_attempt", "activity_attempt_id", "query_task_attempt"):
                if key in self.task:
                    values[key] = self.task[key]
            values.setdefault("lease_owner", self.worker)
        return values


class Worlds:
    """Builds, renews and rebuilds the live world of one operation."""

    def __init__(self, driver: _Driver, kind: str) -> None:
        self.driver = driver
        self.kind = kind
        self.world: World | None = None
        self.failed: str | None = None
        self.builds = 0
        profile = driver.target.test_profile
        lease = profile.get("activity_task_lease_seconds" if kind == "activity" else "workflow_task_lease_seconds", 3)
        self.renew_every = max(0.25, min(float(lease) / 4, 30.0)) if isinstance(lease, int | float) else 0.75
        q_timeout = profile.get("query_task_timeout_seconds", 3)
        q_lease = profile.get("query_task_lease_seconds", 3)
        q_life = min(float(q_timeout), float(q_lease)) if isinstance(q_timeout, int | float) else 3.0
        self.query_life = max(0.5, q_life * 0.4)

    def get(self) -> World | None:
        """A usable world, renewed so its lease outlives the next call; None when none can be built."""
        if self.failed is not None:
            return None
        world = self.world
        try:
            if world is None or world.dirty or not self._fresh(world):
                self.close()
                world = self.world = self._build()
                self.builds += 1
            return world
        except WorldUnavailable as exc:
            self.failed = str(exc)
            self.world = None
            return None

    def _fresh(self, world: World) -> bool:
        # On the target's clock: a test clock moved by a held case ages the world's lease and query too.
        now = self.driver.now().timestamp()
        if world.kind in ("query", "query-ready"):
            return now - world.built_at < self.query_life
        if world.kind not in ("workflow", "activity") or now - world.renewed_at < self.renew_every:
            return True
        task = world.task or {}
        if world.kind == "workflow":
            body = {"lease_owner": task.get("lease_owner"), "workflow_task_attempt": task.get("workflow_task_attempt")}
            path = f"/workflow-tasks/{task.get('task_id')}/heartbeat"
        else:
            body = {"activity_attempt_id": task.get("activity_attempt_id"), "lease_owner": task.get("lease_owner")}
            path = f"/activity-tasks/{task.get('task_id')}/heartbeat"
        reply = self.driver.call("worker", "POST", path, body)
        try:
            out = reply.json()
        except ValueError:
            out = None
        alive = reply.status_code == 200 and isinstance(out, dict) and out.get("can_continue", True) is not False
        world.renewed_at = self.driver.now().timestamp()
        return alive

    def _build(self) -> World:
        d = self.driver
        queue = uid("q")
        # A parked run has no worker at all, so a query is refused at once (no query target).
        worker = uid("w-none") if self.kind == "parked" else d.register(queue)
        workflow_id, run_id = d.start(queue)
        world = World(self.kind, queue, worker, workflow_id, run_id, built_at=d.now().timestamp())
        base = self.kind.removesuffix("-ready")
        if base in ("workflow", "activity", "query") and self.kind != "workflow-ready":
            world.task = d.lease("workflow-tasks", worker, queue)
        if base == "activity":
            command = {
                "type": "schedule_activity",
                "activity_type": "conformance.fuzz",
                "queue": queue,
                "arguments": {"codec": "avro", "blob": encode_blob(["fuzz"])},
            }
            d.complete_wf(world.task or {}, [command])
            world.task = None if self.kind == "activity-ready" else d.lease("activity-tasks", worker, queue)
        elif base == "query":
            d.complete_wf(world.task or {}, [{"type": "start_timer", "delay_seconds": 3600}])
            world.task = None
            world.query_call = self._start_query(world)
            if self.kind == "query":
                world.task = d.lease("query-tasks", worker, queue, within=5.0)
        world.renewed_at = d.now().timestamp()
        return world

    def _start_query(self, world: World) -> threading.Thread:
        """The control-plane query that waits for the worker's answer, on its own thread and client."""
        target = self.driver.target

        def run() -> None:
            headers = plane_headers(target, "control")
            url = f"{target.url}/api/workflows/{world.workflow_id}/query/fuzz"
            with contextlib.suppress(httpx.HTTPError):  # the world is rebuilt if its query task goes away
                httpx.post(url, headers=headers, json={}, timeout=CALL_TIMEOUT + 60, verify=tls())

        thread = threading.Thread(target=run, name=f"fuzz-query-{world.workflow_id}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Release what the current world holds (a pending query call is answered so its thread ends)."""
        world, self.world = self.world, None
        if world is None or world.kind != "query" or world.task is None:
            return
        task = world.task
        body = {"lease_owner": task.get("lease_owner"), "query_task_attempt": task.get("query_task_attempt")}
        body["result_envelope"] = {"codec": "avro", "blob": encode_blob("fuzz")}
        with contextlib.suppress(HarnessError):
            self.driver.call("worker", "POST", f"/query-tasks/{task.get('query_task_id')}/complete", body)
        if world.query_call is not None:
            world.query_call.join(timeout=2.0)


# -- preparing and sending one case ---------------------------------------------------------------------


def _integral_floats_to_ints(value: Any) -> Any:
    """Schemathesis may draw 3.0 for an integer; JSON Schema counts it as one but a server may refuse it
    (``x-implementation-defined``), so positive cases send 3."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_to_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_to_ints(v) for k, v in value.items()}
    return value


def _pin_holds(op: Operation, case: Any) -> None:
    """Keep a case from holding its connection for the target's default wait (long polls, update and
    history waits); the pinned values are inside the positive space, so a negative case stays negative."""
    body = case.body
    if op.op_id.startswith("update_") and isinstance(body, NotSet):
        # No body waits for completion for the default 30 s (§12.2); the shortest wait is still no-body-like.
        body = case.body = {"wait_timeout_seconds": SHORT_HOLD}
    if isinstance(body, dict):
        if op.op_id.startswith("poll_"):
            t = body.get("timeout_seconds")
            if t is None or (isinstance(t, int | float) and not isinstance(t, bool) and t > SHORT_HOLD):
                body["timeout_seconds"] = SHORT_HOLD
        if op.op_id.startswith("update_"):
            t = body.get("wait_timeout_seconds")
            if t is None or (isinstance(t, int | float) and not isinstance(t, bool) and t > SHORT_HOLD):
                body["wait_timeout_seconds"] = SHORT_HOLD
    query = case.query
    if isinstance(query, dict) and str(query.get("wait_new_event", "")).lower() in ("1", "true", "yes", "on"):
        query["wait_new_event"] = "false"


def _pin_headers(target: TargetInfo, op: Operation, case: Any, keep: str | None = None) -> None:
    """The plane's version, namespace and credential headers, except ``keep`` (the header a coverage case
    is about, left exactly as generated, absent included)."""
    keep = (keep or "").lower()
    headers = dict(case.headers or {})
    for name in list(headers):
        lower = name.lower()
        if lower != keep and lower in ("authorization", "x-namespace", WORKER_HEADER.lower(), CONTROL_HEADER.lower()):
            del headers[name]
    headers.update({k: v for k, v in plane_headers(target, op.plane).items() if k.lower() != keep})
    case.headers = headers
    if isinstance(case.query, dict):
        case.query.pop("namespace", None)  # X-Namespace decides (§4.2); a stray query value is noise


def _negative_in(case: Any, location: str) -> bool:
    """Whether the case was generated to break its ``location`` (path, query, header, body)."""
    meta = case.meta
    if meta is None:
        return False
    return any(
        getattr(loc, "value", loc) == location and info.mode is GenerationMode.NEGATIVE
        for loc, info in meta.components.items()
    )


def _substitute(world: World, case: Any, how: str) -> bool:
    """Point the case at the live world: its ids into the path (unless the path is what the case breaks),
    and with ``ids+fence`` its fencing values into the body keys the case already has. Returns whether
    anything was substituted."""
    changed = False
    if isinstance(case.path_parameters, dict) and case.path_parameters and not _negative_in(case, "path"):
        values = world.path_values()
        for name in case.path_parameters:
            if name in values:
                case.path_parameters[name] = values[name]
                changed = True
    if how == "ids+fence" and isinstance(case.body, dict):
        for key, value in world.body_values().items():
            if key in case.body:
                case.body[key] = value
                changed = True
    return changed


def _exchange_of(response: Any) -> Exchange:
    """The suite's record of what Schemathesis sent and got (tokens redacted; ``curl()`` reproduces it)."""
    req = response.request
    body = req.body
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    headers = {
        k: (REDACTED if k.lower() == "authorization" else str(v))
        for k, v in req.headers.items()
        if not k.lower().startswith("x-schemathesis")
    }
    content = bytes(response.content or b"")
    try:
        parsed: Any = json.loads(content) if content else None
    except ValueError:
        parsed = None
    return Exchange(
        method=str(req.method),
        url=str(req.url),
        request_headers=headers,
        request_body=text,
        status=int(response.status_code),
        response_headers={k: ", ".join(v) for k, v in response.headers.items()},
        response_body=parsed if parsed is not None else content[:4000].decode("utf-8", "replace"),
        started_at=time.time(),
        elapsed=float(response.elapsed),
    )


def _transport_problem(exc: BaseException) -> bool:
    """A connection refused, reset or timed out (``requests`` exceptions, matched by name so the suite
    does not import ``requests``): the harness's error, not the target's failure."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ConnectionError", "Timeout", "ChunkedEncodingError", "ContentDecodingError"})


class _CaseRunner:
    """Sends prepared cases, judges them, and compares live-world snapshots around rejected ones."""

    def __init__(self, target: TargetInfo, result: FuzzResult, driver: _Driver) -> None:
        self.target = target
        self.result = result
        self.driver = driver
        self.aborted = False
        # The world's run as read after the last case, rejected, changed nothing; with what had been sent and how far
        # this process had moved the target's clock by then. It is the next case's "before" when that case targets
        # the same world and nothing was sent and no time was skipped in between (no renewal, no other case).
        self._seen: tuple[World, tuple[Any, list[Any]], tuple[int, int, float]] | None = None

    def _marker(self) -> tuple[int, int, float]:
        return self.driver.requests, self.result.stats["requests"], self.target.clock.advanced

    def _before(self, world: World) -> tuple[Any, list[Any]]:
        """The world's run now: as the last comparison read it if nothing happened since, else read again."""
        seen, self._seen = self._seen, None
        if seen is not None and seen[0] is world and seen[2] == self._marker() and not world.dirty:
            return seen[1]
        return self.driver.snapshot(world)

    def send(self, op: Operation, case: Any, world: World | None = None, *, probe: bool = False) -> Answer | None:
        """Send ``case`` and judge the answer; with a ``world``, a 4xx must leave it unchanged."""
        if self.aborted:
            return None
        r = self.result
        before = None
        if world is not None:
            try:
                before = self._before(world)
            except WorldUnavailable:
                world.dirty = True
                world = None
        r.stats["requests"] += 1
        try:
            # A poll or update case may be held (its hold is pinned to SHORT_HOLD): a wait like any other.
            holds = op.op_id.startswith(("poll_", "update_"))
            send = functools.partial(
                case.call, base_url=self.target.url, session=self.driver.session, timeout=CALL_TIMEOUT
            )
            response = self.driver.held(send, SHORT_HOLD) if holds else send()
        except Exception as exc:
            if self.target.fault_ledger is not None and {c.__name__ for c in type(exc).__mro__} & _LOST_NAMES:
                # --faults: the proxy lost the answer (the case may have been applied): nothing to judge.
                r.stats["answers_lost"] += 1
                if world is not None:
                    world.dirty = True
                return None
            if _transport_problem(exc):
                self.aborted = True
                r.error = f"harness error (not a conformance failure): {op.op_id}: {type(exc).__name__}: {exc}"
                try:
                    curl = case.as_curl_command(base_url=self.target.url)
                except Exception:
                    curl = None
                if curl:
                    r.error += f"\n  Reproduce: {curl}"
                return None
            r.stats["unsendable"] += 1  # e.g. a header value the HTTP client refuses to put on the wire
            return None
        ex = _exchange_of(response)
        answer = Answer(
            op=op,
            exchange=ex,
            status=ex.status or 0,
            headers={k.lower(): v for k, v in ex.response_headers.items()},
            body=ex.response_body if not isinstance(ex.response_body, str) else None,
            path=urlsplit(ex.url).path,
            target=self.target,
            probe=probe,
        )
        ex.schema_errors = answer.schema_problems
        r.stats["cases"] += 1
        r.statuses[answer.status] += 1
        r.judged |= judged_requirements(answer)
        for failure in judge(answer):
            r.fail(failure)
        if world is not None and before is not None:
            r.stats["live"] += 1
            if 400 <= answer.status < 500:
                self._compare(world, before, answer)
            elif op.method != "GET":
                world.dirty = True  # accepted (or maybe applied): the world may now change on its own
        return answer

    def _compare(self, world: World, before: tuple[Any, list[Any]], answer: Answer) -> None:
        r = self.result
        r.stats["compared"] += 1
        r.judged.add(NO_CHANGE)
        try:
            after = self.driver.snapshot(world)
            diff = _diff(before, after) if after != before else ""
            if not diff:
                self._seen = (world, after, self._marker())
        except WorldUnavailable as exc:
            diff = f"the run could no longer be read: {exc}"
        if diff:
            world.dirty = True
            r.fail(
                FuzzFailure(
                    "rejected_changes_nothing",
                    f"{answer.op.op_id} was rejected with {answer.status} {answer.reason or ''} but changed "
                    f"workflow {world.workflow_id}",
                    requirement=NO_CHANGE,
                    exchange=answer.exchange,
                    expected="describe and control-plane history unchanged (PROTOCOL.md invariant 68)",
                    received=diff,
                )
            )


def _diff(before: tuple[Any, list[Any]], after: tuple[Any, list[Any]]) -> str:
    if before[1] != after[1]:
        new = [e.get("event_type") if isinstance(e, dict) else e for e in after[1][len(before[1]) :]]
        return f"history went from {len(before[1])} to {len(after[1])} events (new: {new})"
    b = before[0] if isinstance(before[0], dict) else {}
    a = after[0] if isinstance(after[0], dict) else {}
    changed = sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k))
    return "describe changed: " + ", ".join(f"{k}: {b.get(k)!r} -> {a.get(k)!r}" for k in changed)


# -- fuzzing one operation ----------------------------------------------------------------------------------


def _hypothesis_run(strategy: st.SearchStrategy[Any], examples: int, seed: int, body: Callable[[Any], None]) -> str:
    """Run ``body`` over ``examples`` draws; returns "" or why no example could be drawn."""
    if examples <= 0:
        return ""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(strategy)
    def test(value: Any) -> None:
        body(value)

    try:
        test()
    except Unsatisfiable:
        return "the schema leaves nothing to draw"
    return ""


def _coverage_cases(schema: Any, api_op: Any, cap: int, rng: random.Random) -> list[Any]:
    """Schemathesis' coverage phase for the operation: deterministic positive and negative cases for every
    parameter and body property (boundaries, wrong types, missing required values, unexpected content
    types and methods). Over ``cap``, a seeded round-robin over the case descriptions keeps every kind."""
    if cap <= 0:
        return []
    cases = list(
        schema.iter_coverage_cases(
            api_op,
            generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            generation_config=schema.config.generation_for(operation=api_op, phase="coverage"),
        )
    )
    if len(cases) <= cap:
        return cases
    groups: dict[str, list[Any]] = {}
    for case in cases:
        groups.setdefault(str(case.meta.phase.data.description), []).append(case)
    pools = list(groups.values())
    for pool in pools:
        rng.shuffle(pool)
    rng.shuffle(pools)
    picked: list[Any] = []
    while len(picked) < cap:
        for pool in pools:
            if pool and len(picked) < cap:
                picked.append(pool.pop())
    return picked


def _steer(op: Operation, case: Any, how: str, *, coverage: bool) -> str:
    """Keep a case from waiting on the target. A valid poll as the live worker finds its ready task
    instead of holding; a query always names the parked run (whose queue has no worker) unless its
    path is what the case breaks; a coverage update asks only for acceptance unless its wait is what
    the case is about."""
    positive = case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE
    if op.op_id.startswith("poll_") and coverage and positive:
        return "ids+fence"
    if op.op_id.startswith("query_") and how == "none" and not _negative_in(case, "path"):
        return "ids"
    about = getattr(case.meta.phase.data, "parameter", None) if case.meta is not None else None
    waits = about in ("wait_for", "wait_timeout_seconds")
    if op.op_id.startswith("update_") and coverage and isinstance(case.body, dict) and not waits:
        case.body["wait_for"] = "accepted"
    return how


def _case_strategies(target: TargetInfo, api_op: Any, pinned: dict[str, str]) -> tuple[Any, Any]:
    """The drawn cases of one operation: valid ones with the target's headers pinned, and invalid ones, two
    thirds pinned and one third free (the headers broken too); each paired with how a live world is used."""
    query = {"namespace": target.namespace}  # X-Namespace decides; a negated query value is noise
    positive = st.tuples(
        api_op.as_strategy(GenerationMode.POSITIVE, headers=pinned).map(lambda c: ("pinned", c)),
        st.sampled_from(SUBSTITUTE),
    )
    negative_cases = st.one_of(
        api_op.as_strategy(GenerationMode.NEGATIVE, headers=pinned, query=query).map(lambda c: ("pinned", c)),
        api_op.as_strategy(GenerationMode.NEGATIVE, headers=pinned, query=query).map(lambda c: ("pinned", c)),
        api_op.as_strategy(GenerationMode.NEGATIVE).map(lambda c: ("free", c)),
    )
    negative = st.tuples(negative_cases, st.sampled_from(SUBSTITUTE))
    return positive, negative


def fuzz_operation(target: TargetInfo, op_id: str, budget: FuzzBudget) -> FuzzResult:
    """Fuzz one operation with ``budget.examples`` cases; never raises for what the target answers."""
    op = operations()[op_id]
    result = FuzzResult(op_id, f"Schemathesis cases for {op.method} {op.path}: {op.summary}")
    started = time.monotonic()
    schema = load_schema()
    api_op = schema.find_operation_by_id(op_id)
    driver = _Driver(target)
    runner = _CaseRunner(target, result, driver)
    kind = WORLDS.get(op_id)
    worlds = Worlds(driver, kind) if kind is not None else None
    pinned = plane_headers(target, op.plane)

    def dispatch(case: Any, how: str, stat: str, *, positive: bool, coverage: bool) -> None:
        if positive and isinstance(case.body, dict | list):
            case.body = _integral_floats_to_ints(case.body)
        _pin_holds(op, case)
        how = _steer(op, case, how, coverage=coverage)
        world = None
        if worlds is not None and how != "none":
            world = worlds.get()
            if world is not None and not _substitute(world, case, how):
                world = None
        result.stats[stat] += 1
        runner.send(op, case, world, probe=str(case.method).upper() != op.method)

    def covered(case: Any, how: str) -> None:
        if runner.aborted:
            return
        data = case.meta.phase.data
        about = data.parameter if getattr(data.parameter_location, "value", None) == "header" else None
        _pin_headers(target, op, case, keep=about)
        positive = case.meta.generation.mode is GenerationMode.POSITIVE
        dispatch(case, how, "coverage", positive=positive, coverage=True)

    def one(mode: str, drawn: tuple[tuple[str, Any], str]) -> None:
        (branch, case), how = drawn
        if runner.aborted:
            return
        if branch != "free":
            _pin_headers(target, op, case)
        dispatch(case, how, mode, positive=mode == "positive", coverage=False)

    try:
        rng = random.Random(budget.seed_for(f"{op_id}:coverage"))
        for case in _coverage_cases(schema, api_op, budget.coverage_cap, rng):
            covered(case, rng.choice(SUBSTITUTE))
        positive, negative = _case_strategies(target, api_op, pinned)
        n_pos = math.ceil(budget.examples / 2)
        for mode, strategy, n in (("positive", positive, n_pos), ("negative", negative, budget.examples - n_pos)):
            why = _hypothesis_run(strategy, n, budget.seed_for(f"{op_id}:{mode}"), functools.partial(one, mode))
            if why:
                result.notes.append(f"{mode}: {why}")
    except HarnessError as exc:
        result.error = f"harness error (not a conformance failure): {exc}"
    finally:
        if worlds is not None:
            if worlds.failed:
                result.notes.append(f"no live world: {worlds.failed}")
            result.stats["worlds"] = worlds.builds
            worlds.close()
        result.stats["requests"] += driver.requests
        driver.close()
        result.duration = time.monotonic() - started
    return result


# -- the hand-written stateful sequence ---------------------------------------------------------------------

STATEFUL: Final = "stateful_start_register_poll_complete"


def fuzz_stateful(target: TargetInfo, budget: FuzzBudget) -> FuzzResult:
    """start → register → poll → complete, each body drawn from its schema (the command batch too).

    The document has no OpenAPI links for Schemathesis to follow, so the chaining is written here: each
    example uses a fresh queue and workflow id; the drawn start, register and poll bodies keep their
    generated optional fields but get the ids that chain them; the complete carries a drawn command batch
    with the real fencing values. Every answer is judged by the fuzz checks; a rejected complete must leave
    the run unchanged, and an accepted one must be fenced (409) when repeated, again changing nothing.
    """
    result = FuzzResult(STATEFUL, fuzz_stateful.__doc__.splitlines()[0] if fuzz_stateful.__doc__ else STATEFUL)
    started = time.monotonic()
    driver = _Driver(target)
    sequence = _StatefulSequence(target, result, _CaseRunner(target, result, driver))
    try:
        why = _hypothesis_run(st.data(), max(1, budget.examples // 4), budget.seed_for(STATEFUL), sequence.run)
        if why:
            result.notes.append(why)
    except HarnessError as exc:
        result.error = f"harness error (not a conformance failure): {exc}"
    finally:
        result.stats["requests"] += driver.requests
        driver.close()
        result.duration = time.monotonic() - started
    return result


class _StatefulSequence:
    """One drawn start → register → poll → complete (and the repeated complete) per Hypothesis example."""

    STEPS = ("start_workflow", "register_worker", "poll_workflow_task", "complete_workflow_task")

    def __init__(self, target: TargetInfo, result: FuzzResult, runner: _CaseRunner) -> None:
        self.target, self.result, self.runner = target, result, runner
        self.ops = operations()
        schema = load_schema()
        self.strategies = {
            name: schema.find_operation_by_id(name).as_strategy(
                GenerationMode.POSITIVE, headers=plane_headers(target, self.ops[name].plane)
            )
            for name in self.STEPS
        }

    def draw(self, data: st.DataObject, name: str) -> Any:
        case = data.draw(self.strategies[name], label=name)
        _pin_headers(self.target, self.ops[name], case)
        if isinstance(case.body, dict | list):
            case.body = _integral_floats_to_ints(case.body)
        return case

    def run(self, data: st.DataObject) -> None:
        if self.runner.aborted:
            return
        self.result.stats["sequences"] += 1
        queue, worker, workflow_id = uid("q"), uid("w"), uid("wf")
        run_id = self.start(data, queue, workflow_id)
        if run_id is None or not self.register(data, queue, worker):
            return
        task = self.lease(data, queue, worker)
        if task is None:
            return
        self.complete_twice(data, World("workflow", queue, worker, workflow_id, run_id, task=task), task)

    def start(self, data: st.DataObject, queue: str, workflow_id: str) -> str | None:
        start = self.draw(data, "start_workflow")
        if not isinstance(start.body, dict):
            return None
        start.body.update(workflow_id=workflow_id, task_queue=queue)
        # A drawn run or execution timeout could close the run before the poll: the sequence needs it open.
        for key in ("run_timeout_seconds", "execution_timeout_seconds", "workflow_execution_timeout_seconds"):
            start.body.pop(key, None)
        started_reply = self.runner.send(self.ops["start_workflow"], start)
        if started_reply is None or started_reply.status not in (200, 201):
            return None
        self.result.stats["started"] += 1
        return str((started_reply.body or {}).get("run_id", ""))

    def register(self, data: st.DataObject, queue: str, worker: str) -> bool:
        register = self.draw(data, "register_worker")
        if not isinstance(register.body, dict):
            return False
        register.body.update(worker_id=worker, task_queue=queue)
        for key in ("build_id", "supported_workflow_types"):
            register.body.pop(key, None)  # a drawn build id or type list could keep the run's task away
        reply = self.runner.send(self.ops["register_worker"], register)
        return reply is not None and reply.status in (200, 201)

    def lease(self, data: st.DataObject, queue: str, worker: str) -> dict[str, Any] | None:
        for _ in range(5):
            poll = self.draw(data, "poll_workflow_task")
            if not isinstance(poll.body, dict):
                return None
            poll.body.update(worker_id=worker, task_queue=queue, timeout_seconds=SHORT_HOLD)
            poll.body.pop("build_id", None)
            reply = self.runner.send(self.ops["poll_workflow_task"], poll)
            if reply is None or reply.status != 200:
                return None
            got = (reply.body or {}).get("task")
            if isinstance(got, dict):
                self.result.stats["leased"] += 1
                return got
        self.result.stats["never_leased"] += 1
        return None

    def complete_twice(self, data: st.DataObject, world: World, task: dict[str, Any]) -> None:
        complete = self.draw(data, "complete_workflow_task")
        if not isinstance(complete.body, dict):
            return
        complete.path_parameters = {"task_id": str(task.get("task_id"))}
        complete.body.update(
            lease_owner=task.get("lease_owner", world.worker), workflow_task_attempt=task.get("workflow_task_attempt")
        )
        reply = self.runner.send(self.ops["complete_workflow_task"], complete, world)
        if reply is None or reply.status != 200:
            return
        self.result.stats["completed"] += 1
        # The same complete again is fenced: a task completes once (§8.9), and the refusal changes nothing.
        world.dirty = False
        again = self.runner.send(self.ops["complete_workflow_task"], complete, world)
        if again is not None:
            self.result.judged.add(AFTER_COMPLETE)
        if again is not None and again.status != 409:
            self.runner.result.fail(
                FuzzFailure(
                    "repeated_complete_is_fenced",
                    f"a second complete of workflow task {task.get('task_id')} answered {again.status}",
                    requirement=AFTER_COMPLETE,
                    exchange=again.exchange,
                    expected="409 (the task is no longer leased)",
                    received=again.received(),
                )
            )


# -- groups (one pytest item each) --------------------------------------------------------------------------

GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "worker-registration": ("register_worker", "heartbeat_worker", "deregister_worker"),
    "workflow-tasks": (
        "poll_workflow_task",
        "fetch_workflow_task_history",
        "heartbeat_workflow_task",
        "complete_workflow_task",
        "fail_workflow_task",
        "deliver_workflow_task_cancellation",
    ),
    "activity-tasks": (
        "poll_activity_task",
        "complete_activity_task",
        "fail_activity_task",
        "heartbeat_activity_task",
        "get_activity_task_status",
    ),
    "query-tasks": ("poll_query_task", "complete_query_task", "fail_query_task"),
    "workflows": (
        "start_workflow",
        "describe_workflow",
        "list_workflow_runs",
        "describe_workflow_run",
        "get_workflow_run_history",
    ),
    "workflow-commands": (
        "signal_workflow",
        "signal_workflow_run",
        "query_workflow",
        "query_workflow_run",
        "update_workflow",
        "update_workflow_run",
        "cancel_workflow",
        "cancel_workflow_run",
        "request_workflow_cancellation",
        "request_workflow_run_cancellation",
        "terminate_workflow",
        "terminate_workflow_run",
    ),
    "worker-sessions": (
        "create_worker_session",
        "heartbeat_worker_session",
        "close_worker_session",
        "list_worker_sessions",
        "describe_worker_session",
    ),
    "task-queues-and-discovery": ("drain_build_id", "resume_build_id", "get_cluster_info", "get_health", "get_ready"),
    "stateful": (STATEFUL,),
}


def _with_unlisted(groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Every operation of the document is fuzzed: one the table does not list goes to ``other``."""
    listed = {name for names in groups.values() for name in names}
    rest = tuple(sorted(set(operations()) - listed))
    return {**groups, "other": rest} if rest else dict(groups)


def group_members(group: str) -> tuple[str, ...]:
    return _with_unlisted(GROUPS).get(group, ())


def group_requirements(group: str) -> tuple[str, ...]:
    """The requirement IDs a group's item may judge (what ``--requirement`` selects it by)."""
    return (*FUZZ_REQUIREMENTS, AFTER_COMPLETE) if STATEFUL in group_members(group) else FUZZ_REQUIREMENTS


def all_groups() -> list[str]:
    return list(_with_unlisted(GROUPS))


def fuzz_group(target: TargetInfo, group: str, budget: FuzzBudget) -> Iterator[FuzzResult]:
    """Fuzz every operation of ``group`` in turn."""
    for name in group_members(group):
        if name == STATEFUL:
            yield fuzz_stateful(target, budget)
        else:
            yield fuzz_operation(target, name, budget)
