"""Robustness: hostile bodies, rejected calls, unknown fields and telemetry hooks (§0, §14.1, invariants
67-68).

The fuzz corpus is fixed and deterministic, so a failure replays exactly: every worker route gets
non-JSON and invalid UTF-8 bytes, non-object JSON, deep nesting, and every field of its body set to wrong
types, nulls and huge strings (bodies stay under 1 MiB so the body-size limit never decides the answer).
Task routes are fuzzed twice: with an unknown task id, where every field may be broken, and with a live
leased task, where only the fencing fields are broken (so that no fuzz body can be a valid request).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas import load_json
from suite.client import WORKER_HEADER, Reply
from suite.context import CheckContext
from suite.protocol.commands import REPORT_BODIES
from suite.protocol.requirements import Area
from suite.registry import check
from suite.text import plural
from suite.worlds import (
    ActivityRun,
    activity_call,
    lease_activity,
    lease_query,
    lease_wf,
    schedule_activities,
    settle,
    shortest_lease,
    start_query,
    still_within,
    waiting_run,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.ROBUSTNESS, Area.LIFECYCLE_HOOKS)

# Invariant 67: the only statuses a hostile request may get.
HOSTILE_STATUSES = frozenset({400, 404, 409, 412, 415, 422})
HUGE = "h" * (512 * 1024)
JSON = "application/json"

# -- the corpus ---------------------------------------------------------------------------------------------

# Whole bodies that are never a valid request for any route: (label, bytes, content type).
GENERIC_BODIES: tuple[tuple[str, bytes, str], ...] = (
    ("an empty body", b"", JSON),
    ("bytes that are not JSON", b"this is not json", JSON),
    ("truncated JSON", b'{"worker_id": "w', JSON),
    ("a trailing comma", b'{"a": 1,}', JSON),
    ("invalid UTF-8", b'{"worker_id": "\xff\xfe\xfd"}', JSON),
    ("overlong UTF-8", b'{"worker_id": "\xc0\xaf"}', JSON),
    ("a UTF-8 byte-order mark", b"\xef\xbb\xbf{}", JSON),
    ("UTF-16 text", '{"worker_id": "w"}'.encode("utf-16"), JSON),
    ("a NaN literal", b'{"worker_id": NaN}', JSON),
    ("an Infinity literal", b'{"lease_owner": -Infinity}', JSON),
    ("a JSON array", b"[]", JSON),
    ("a JSON array of an object", b'[{"worker_id": "w", "task_queue": "q"}]', JSON),
    ("a JSON string", b'"hello"', JSON),
    ("a JSON number", b"42", JSON),
    ("a JSON number beyond double range", b"1e400", JSON),
    ("JSON null", b"null", JSON),
    ("JSON true", b"true", JSON),
    ("10,000 nested arrays", b"[" * 10_000 + b"]" * 10_000, JSON),
    ("10,000 nested objects", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, JSON),
    ("a lone surrogate key", b'{"\\ud800": 1}', JSON),
    ("NUL characters", b'{"worker_id": "\\u0000\\u0000", "lease_owner": "\\u0000"}', JSON),
    ("duplicate keys", b'{"worker_id": "a", "worker_id": 7, "lease_owner": "a", "lease_owner": []}', JSON),
    ("40,000 unknown keys", json.dumps({f"k{i}": i for i in range(40_000)}).encode(), JSON),
    ("a text/plain body", b"hello", "text/plain"),
    ("a form-encoded body", b"worker_id=w&task_queue=q", "application/x-www-form-urlencoded"),
)

STRING_BAD: tuple[Any, ...] = (12345, True, [], {}, ["x"], None, "", "\ud800", HUGE)
INT_BAD: tuple[Any, ...] = ("abc", "1", 1.5, True, [], {}, -1, 0, 2**70, None, 1e308, HUGE)
NUMBER_BAD: tuple[Any, ...] = ("abc", [], {}, True, 2**70, HUGE)
LIST_BAD: tuple[Any, ...] = ("x", {}, 5, None, [None], [5], [[]], [{}], [HUGE])
OBJECT_BAD: tuple[Any, ...] = ("x", [], 5, None, True, {"": [[[[[]]]]]}, HUGE)
COMMANDS_BAD: tuple[Any, ...] = (
    "x",
    {},
    [],
    None,
    5,
    [1],
    ["complete_workflow"],
    [{}],
    [{"type": 5}],
    [{"type": "no_such_command"}],
    [{"type": "start_timer", "delay_seconds": -1}],
    [{"type": "schedule_activity"}],
    [{"type": "complete_workflow", "result": {"codec": "json", "blob": "e30="}}],
    [{"type": "complete_workflow"}, {"type": "fail_workflow", "message": "two terminal commands"}],
    [{"type": HUGE}],
)
FAILURE_BAD: tuple[Any, ...] = ("x", [], 5, None, {}, {"message": None}, {"message": []}, HUGE)
PAYLOAD_BAD: tuple[Any, ...] = (
    {"codec": "json", "blob": "e30="},
    {"codec": "avro"},
    {"codec": "avro", "blob": "!!!"},
    {"codec": "avro", "blob": "AAAA"},
    {"codec": "avro", "blob": 5},
    {"codec": None, "blob": None},
    5,
    [],
    True,
    {"codec": "avro", "blob": HUGE},
)
# On a live task only the fencing fields are broken, with values no server can take for the real ones.
LIVE_STRING_BAD: tuple[Any, ...] = (12345, [], {}, None, "", "\ud800", HUGE)
LIVE_INT_BAD: tuple[Any, ...] = ("abc", 1.5, [], {}, -1, 0, None, 2**70)

BAD_VALUES: dict[str, tuple[Any, ...]] = {
    "str": STRING_BAD,
    "int": INT_BAD,
    "num": NUMBER_BAD,
    "list": LIST_BAD,
    "obj": OBJECT_BAD,
    "commands": COMMANDS_BAD,
    "failure": FAILURE_BAD,
    "payload": PAYLOAD_BAD,
}
LIVE_BAD_VALUES: dict[str, tuple[Any, ...]] = {
    "str": LIVE_STRING_BAD,
    "int": LIVE_INT_BAD,
    "commands": COMMANDS_BAD,
    "failure": ("x", [], 5, None, {}),
}


@dataclass(frozen=True)
class Route:
    """A worker route's body: field name → (kind, required)."""

    name: str
    path: str  # ``{id}`` is replaced by a task id
    fields: Mapping[str, tuple[str, bool]]


# A JSON Schema type → the kind of bad values a field of it gets. A field the schema leaves untyped takes any
# value (§6.2's SDK extras "must be tolerated"), so no value of its own is hostile: it gets none.
_KIND_OF_TYPE = {"string": "str", "integer": "int", "number": "num", "array": "list", "object": "obj"}


def _resolve(path: str, ref: str) -> tuple[str, Mapping[str, Any]]:
    """The schema ``ref`` (relative to the schema file ``path``, with a JSON pointer) names, and its file."""
    file, _, pointer = ref.partition("#")
    target = posixpath.normpath(posixpath.join(posixpath.dirname(path), file)) if file else path
    node: Any = load_json(target)
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return target, node


def _schema_kind(path: str, prop: Mapping[str, Any]) -> str:
    if "$ref" in prop:
        return _schema_kind(*_resolve(path, prop["$ref"]))
    types = prop.get("type")
    named = [t for t in ([types] if isinstance(types, str) else types or []) if t != "null"]
    if not named and prop.get("enum"):
        return "str" if all(isinstance(v, str) for v in prop["enum"]) else "any"
    return _KIND_OF_TYPE.get(named[0], "any") if len(named) == 1 else "any"


def _schema_fields(path: str) -> dict[str, tuple[str, bool]]:
    """A request body's fields as ``schemas/json/`` declares them: name → (kind, required), the fields of the
    schemas it extends (``allOf``) first."""
    schema = load_json(path)
    fields: dict[str, tuple[str, bool]] = {}
    for ref in (part["$ref"] for part in schema.get("allOf", ()) if "$ref" in part):
        fields.update(_schema_fields(_resolve(path, ref)[0]))
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        fields[name] = (_schema_kind(path, prop), name in required)
    return fields


def _schema_route(name: str, path: str, schema: str) -> Route:
    return Route(name, path, _schema_fields(f"json/worker/{schema}.request.schema.json"))


REGISTER = _schema_route("register", "/register", "register")
WORKER_HEARTBEAT = _schema_route("worker heartbeat", "/heartbeat", "heartbeat")
POLLS = tuple(
    _schema_route(f"{kind}-task poll", f"/{kind}-tasks/poll", f"{kind}-task-poll")
    for kind in ("workflow", "activity", "query")
)


def _report_routes(kind: str, verbs: Iterable[str]) -> tuple[Route, ...]:
    """The report routes of one task kind, with the model's fields (``suite.protocol.commands``)."""
    return tuple(
        Route(f"{kind}-task {verb}", f"/{kind}-tasks/{{id}}/{verb}", dict(REPORT_BODIES[f"{kind}-tasks/{{id}}/{verb}"]))
        for verb in verbs
    )


WORKFLOW_TASK_ROUTES = _report_routes("workflow", ("history", "heartbeat", "complete", "fail"))
# §1.1: status is optional; a server without it answers 404, which is in the allowed set.
ACTIVITY_TASK_ROUTES = _report_routes("activity", ("complete", "fail", "heartbeat", "status"))
QUERY_TASK_ROUTES = _report_routes("query", ("complete", "fail"))


def _valid_value(kind: str) -> Any:
    """A well-formed value for a field (the base body every mutation starts from)."""
    return {
        "str": "conformance",
        "int": 1,
        "num": 1,
        "list": [],
        "obj": {},
        "failure": {"message": "m"},
        "commands": [{"type": "complete_workflow"}],
        "payload": None,
    }[kind]


@dataclass(frozen=True)
class Case:
    label: str
    path: str
    content: bytes
    content_type: str
    allowed: frozenset[int]


def _dump(body: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes: valid JSON text, hostile content.
    return json.dumps(body, separators=(",", ":")).encode("ascii")


def corpus(
    route: Route,
    path: str,
    base: dict[str, Any],
    bad: dict[str, tuple[Any, ...]],
    *,
    only_required: bool = False,
    lenient_optional: frozenset[int] = frozenset(),
) -> list[Case]:
    """The hostile cases of one route: every generic body, then every field broken in turn.

    ``lenient_optional`` are the extra statuses a broken *optional* field may get (a server may ignore an
    optional field it cannot use, e.g. 201 for a registration).
    """
    cases = [
        Case(f"{route.name}: {label}", path, content, ctype, HOSTILE_STATUSES)
        for label, content, ctype in GENERIC_BODIES
    ]
    first = next(iter(route.fields))
    rest = _dump({k: v for k, v in base.items() if k != first})
    tail = b"," + rest[1:] if rest != b"{}" else b"}"
    nested = b'{"' + first.encode() + b'":' + b"[" * 10_000 + b"]" * 10_000 + tail
    cases.append(Case(f"{route.name}: {first} nested 10,000 arrays deep", path, nested, JSON, HOSTILE_STATUSES))
    for name, (kind, required) in route.fields.items():
        if only_required and not required:
            continue
        allowed = HOSTILE_STATUSES if required else HOSTILE_STATUSES | lenient_optional
        for value in bad.get(kind, ()):
            body = {**base, name: value}
            shown = "a huge string" if value == HUGE else ("[huge]" if value == [HUGE] else json.dumps(value)[:60])
            cases.append(Case(f"{route.name}: {name} = {shown}", path, _dump(body), JSON, allowed))
        if required:
            cases.append(
                Case(
                    f"{route.name}: without {name}",
                    path,
                    _dump({k: v for k, v in base.items() if k != name}),
                    JSON,
                    allowed,
                )
            )
    return cases


def _base(route: Route, **known: Any) -> dict[str, Any]:
    return {
        name: known.get(name, _valid_value(kind))
        for name, (kind, required) in route.fields.items()
        if required or name in known
    }


# -- judging ---------------------------------------------------------------------------------------------


async def _send(ctx: CheckContext, case: Case) -> Reply:
    headers = ctx.client.worker_headers(version=ctx.client.worker_version)
    headers["Content-Type"] = case.content_type
    return await ctx.client.request(
        "POST", "/api/worker" + case.path, headers=headers, content=case.content, timeout=30
    )


def _envelope_problem(ctx: CheckContext, reply: Reply) -> str | None:
    advertised = ctx.target.advertised_version
    body = reply.json()
    if reply.headers.get(WORKER_HEADER) != advertised:
        return f"header {WORKER_HEADER}={reply.headers.get(WORKER_HEADER)!r}"
    if body.get("protocol_version") != advertised:
        return f"protocol_version={body.get('protocol_version')!r}"
    if not isinstance(body.get("server_capabilities"), dict):
        return "no server_capabilities object"
    if reply.status >= 400 and not (isinstance(body.get("reason"), str) and body.get("reason")):
        return f"reason={body.get('reason')!r}"
    return None


async def run_corpus(ctx: CheckContext, cases: Iterable[Case]) -> None:
    """Send every case; fail on the first broken rule class (5xx, then status set, then envelope)."""
    server_errors: list[tuple[Case, Reply]] = []
    off_set: list[tuple[Case, Reply]] = []
    bad_envelope: list[tuple[Case, Reply, str]] = []
    for case in cases:
        reply = await _send(ctx, case)
        if reply.status >= 500:
            server_errors.append((case, reply))
        elif reply.status not in case.allowed:
            off_set.append((case, reply))
        problem = _envelope_problem(ctx, reply)
        if problem is not None:
            bad_envelope.append((case, reply, problem))
    for found, req, rule in (
        (server_errors, "ROBUST-NO-5XX", "a hostile request never gets a 5xx"),
        (off_set, "ROBUST-STATUS-SET", f"a hostile request gets one of {sorted(HOSTILE_STATUSES)}"),
    ):
        if found:
            raise ctx.fail(
                f"{rule}: {plural(len(found), 'request')} broke it",
                expected=sorted(HOSTILE_STATUSES),
                received=[f"{c.label} -> {r.status} {r.reason or ''}".strip() for c, r in found[:8]],
                replies=[r for _, r in found[:3]],
                requirement=req,
            )
    if bad_envelope:
        raise ctx.fail(
            f"every answer to a hostile request carries the worker envelope and a reason: {len(bad_envelope)} did not",
            expected="protocol_version, server_capabilities, reason",
            received=[f"{c.label} -> {p}" for c, _, p in bad_envelope[:8]],
            replies=[r for _, r, _ in bad_envelope[:3]],
            requirement="ROBUST-ENVELOPE-ON-ERROR",
        )


async def _fuzz_absent(ctx: CheckContext, routes: Iterable[Route], fence: dict[str, Any]) -> None:
    """Every hostile body of ``routes`` for a task id nobody has, where every field may be broken."""
    out: list[Case] = []
    for route in routes:
        path = route.path.replace("{id}", ctx.uid("absent-task"))
        out += corpus(route, path, _base(route, **fence), BAD_VALUES)
    await run_corpus(ctx, out)


async def _fuzz_live(
    ctx: CheckContext, routes: Iterable[Route], task_id: str, fence: dict[str, Any], **extra: Any
) -> None:
    """Every hostile body of ``routes`` for the live leased task ``task_id``, only its fencing fields broken (the
    ``extra`` fields a route takes valid, so that no body is a valid request)."""
    out: list[Case] = []
    for route in routes:
        path = route.path.replace("{id}", task_id)
        base = {**_base(route, **fence), **{k: v for k, v in extra.items() if k in route.fields}}
        out += corpus(route, path, base, LIVE_BAD_VALUES, only_required=True)
    await run_corpus(ctx, out)


ROBUST = ("ROBUST-NO-5XX", "ROBUST-STATUS-SET", "ROBUST-ENVELOPE-ON-ERROR")


@check(*ROBUST)
async def fuzz_registration_and_poll_routes(ctx: CheckContext) -> None:
    """register, worker heartbeat and the three polls answer hostile bodies with 4xx in the allowed set,
    in the worker envelope, never 5xx."""
    queue = ctx.uid("q-fuzz")
    nobody = ctx.uid("unregistered")
    cases = corpus(
        REGISTER,
        REGISTER.path,
        _base(REGISTER, worker_id=ctx.uid("w-fuzz"), task_queue=queue, runtime="python"),
        BAD_VALUES,
        lenient_optional=frozenset({200, 201}),
    )
    cases += corpus(WORKER_HEARTBEAT, WORKER_HEARTBEAT.path, _base(WORKER_HEARTBEAT, worker_id=nobody), BAD_VALUES)
    for route in POLLS:  # an unregistered worker: no body can lease or hold
        cases += corpus(route, route.path, _base(route, worker_id=nobody, task_queue=queue), BAD_VALUES)
    await run_corpus(ctx, cases)


@check(*ROBUST)
async def fuzz_workflow_task_routes(ctx: CheckContext) -> None:
    """Workflow-task history, heartbeat, complete and fail answer hostile bodies within the allowed set,
    for an unknown task and for a live leased one."""
    queue = ctx.uid("q-fuzz")
    worker = await ctx.register(queue)
    await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue)
    fence = {"lease_owner": worker, "workflow_task_attempt": task.get("workflow_task_attempt")}
    await _fuzz_live(
        ctx,
        WORKFLOW_TASK_ROUTES,
        str(task["task_id"]),
        fence,
        commands=[{"type": "complete_workflow"}],
        failure={"message": "m"},
    )
    await _fuzz_absent(ctx, WORKFLOW_TASK_ROUTES, fence)


@check(*ROBUST)
async def fuzz_activity_task_routes(ctx: CheckContext) -> None:
    """Activity-task complete, fail, heartbeat (and status) answer hostile bodies within the allowed set,
    for an unknown task and for a live leased one."""
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    fence = {"activity_attempt_id": task.get("activity_attempt_id"), "lease_owner": run.worker}
    await _fuzz_live(
        ctx, ACTIVITY_TASK_ROUTES, str(task["task_id"]), fence, result=ctx.envelope("ok"), failure={"message": "m"}
    )
    await _fuzz_absent(ctx, ACTIVITY_TASK_ROUTES, fence)


@check(*ROBUST)
async def fuzz_query_task_routes(ctx: CheckContext) -> None:
    """Query-task complete and fail answer hostile bodies within the allowed set, for an unknown query task
    and for a live leased one."""
    run = await waiting_run(ctx)
    call = start_query(ctx, run, "fuzzed")
    fence: dict[str, Any] = {"lease_owner": run.worker, "query_task_attempt": 1}
    try:
        task = await lease_query(ctx, run, call, requirement="ROBUST-NO-5XX")
        fence["query_task_attempt"] = task.get("query_task_attempt")
        await _fuzz_live(
            ctx,
            QUERY_TASK_ROUTES,
            str(task["query_task_id"]),
            fence,
            result_envelope=ctx.envelope("ok"),
            failure={"message": "m"},
        )
    finally:
        await settle(call)
    await _fuzz_absent(ctx, QUERY_TASK_ROUTES, fence)


# -- rejected calls change nothing (invariant 68) ------------------------------------------------------------


Snapshot = tuple[dict[str, Any], list[dict[str, Any]]]
RENEW_EVERY = 0.75  # seconds: far inside any lease, including the embedded server's 3 s


@dataclass
class _LiveRun:
    """One run holding a leased workflow task and two leased activities, all owned by ``worker``."""

    run: ActivityRun
    wf: dict[str, Any]
    a: dict[str, Any]
    b: dict[str, Any]
    renewed_at: datetime  # on ctx.now(): the leases age on the target's clock, which a test clock moves
    sent_at: datetime  # before the last renewal (or the leases) was sent: no lease is older on the target


async def _live_run(ctx: CheckContext) -> _LiveRun:
    run = await schedule_activities(ctx, count=2, requirement="ROBUST-REJECTED-NO-STATE-CHANGE")
    sent = ctx.now()
    a = await lease_activity(ctx, run, requirement="ROBUST-REJECTED-NO-STATE-CHANGE")
    b = await lease_activity(ctx, run, requirement="ROBUST-REJECTED-NO-STATE-CHANGE")
    reply = await ctx.client.control("POST", f"/workflows/{run.workflow_id}/signal/conformance_wake", {"input": []})
    ctx.expect(reply, 202, what="a signal that opens a workflow task", requirement="ROBUST-REJECTED-NO-STATE-CHANGE")
    wf = await lease_wf(ctx, run.worker, run.queue)
    return _LiveRun(run, wf, a, b, ctx.now(), sent)


async def _renew(ctx: CheckContext, live: _LiveRun) -> None:
    """Keep the three leases alive (a heartbeat may write history, so it happens outside any comparison)."""
    if (ctx.now() - live.renewed_at).total_seconds() < RENEW_EVERY:
        return
    req = "ROBUST-REJECTED-NO-STATE-CHANGE"
    sent = ctx.now()
    # A lease that ran out while the calls between two renewals were delayed (a loaded machine, a distant
    # target) is no evidence against the target: the check cannot judge and runs again.
    lapsed = "a lease held through the rejected calls"
    reply = await ctx.wf_call(live.wf, "heartbeat")
    if reply.status != 200:
        still_within(ctx, live.sent_at, shortest_lease(ctx), lapsed)
    ctx.expect(
        reply,
        200,
        what="the owner's workflow-task heartbeat (a rejected call must not have taken the lease)",
        requirement=req,
    )
    for task in (live.a, live.b):
        reply = await activity_call(ctx, task, "heartbeat")
        if reply.status != 200 or reply.json().get("can_continue") is not True:
            still_within(ctx, live.sent_at, shortest_lease(ctx), lapsed)
        body = ctx.expect(reply, 200, what="the owner's activity heartbeat", requirement=req)
        ctx.require(
            body.get("can_continue") is True,
            "a rejected call must not have ended the attempt",
            expected="can_continue: true",
            received=body.get("can_continue"),
            requirement=req,
        )
    live.renewed_at, live.sent_at = ctx.now(), sent


async def _snapshot(ctx: CheckContext, run: ActivityRun) -> Snapshot:
    return await ctx.describe(run.workflow_id), await ctx.history(run.workflow_id, run.run_id)


def _diff(before: Snapshot, after: Snapshot) -> str:
    if before[1] != after[1]:
        new = [e.get("event_type") for e in after[1][len(before[1]) :]]
        return f"history went from {len(before[1])} to {plural(len(after[1]), 'event')} (new: {new})"
    changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
    return "describe changed: " + ", ".join(f"{k}: {before[0].get(k)!r} -> {after[0].get(k)!r}" for k in changed)


Call = tuple[str, Callable[[], Awaitable[Reply]]]


def _rejected_calls(ctx: CheckContext, live: _LiveRun) -> list[Call]:
    wf, a, b = live.wf, live.a, live.b
    intruder = ctx.uid("intruder")
    attempt = wf.get("workflow_task_attempt")
    nxt = attempt + 1 if isinstance(attempt, int) else 2
    done = [{"type": "complete_workflow", "result": ctx.envelope("sneaky")}]
    calls: list[Call] = []

    def wf_call(label: str, verb: str, body: dict[str, Any] | None = None, **kw: Any) -> None:
        calls.append((f"workflow task: {label}", lambda: ctx.wf_call(wf, verb, body, **kw)))

    def act_call(label: str, task: dict[str, Any], verb: str, body: dict[str, Any] | None = None, **kw: Any) -> None:
        calls.append((f"activity: {label}", lambda: activity_call(ctx, task, verb, body, **kw)))

    def raw(label: str, path: str, content: bytes) -> None:
        calls.append((label, lambda: _send(ctx, Case(label, path, content, JSON, HOSTILE_STATUSES))))

    for verb, body in (
        ("heartbeat", {}),
        ("complete", {"commands": done}),
        ("fail", {"failure": {"message": "x"}}),
        ("history", {}),
    ):
        wf_call(f"{verb} by another worker", verb, body, owner=intruder)
        wf_call(f"{verb} with the next attempt", verb, body, attempt=nxt)
    wf_call("heartbeat with attempt 0", "heartbeat", attempt=0)
    for label, commands in (
        ("no commands", []),
        ("two terminal commands", [{"type": "complete_workflow"}, {"type": "fail_workflow", "message": "x"}]),
        (
            "an unknown command",
            [{"type": "start_timer", "delay_seconds": 5}, {"type": "conformance_no_such"}],
        ),
        ("a negative timer", [{"type": "start_timer", "delay_seconds": -1}]),
        ("schedule_activity without a type", [{"type": "schedule_activity", "queue": live.run.queue}]),
        ("a json-codec result", [{"type": "complete_workflow", "result": {"codec": "json", "blob": "e30="}}]),
        (
            "retry_policy on complete_workflow",
            [{"type": "complete_workflow", "retry_policy": {"max_attempts": 2}}],
        ),
    ):
        wf_call(f"complete with {label}", "complete", {"commands": commands})
    wf_call("complete without commands", "complete", {})
    wf_call("fail without a message", "fail", {"failure": {}})
    for verb, body in (
        ("complete", {"result": ctx.envelope("stolen")}),
        ("fail", {"failure": {"message": "x"}}),
        ("heartbeat", {}),
    ):
        act_call(f"{verb} by another worker", a, verb, body, owner=intruder)
    act_call("complete with an unknown attempt", a, "complete", {"result": None}, attempt_id=ctx.uid("no-attempt"))
    act_call(
        "complete with another task's attempt",
        a,
        "complete",
        {"result": None},
        attempt_id=b.get("activity_attempt_id"),
    )
    for label, result in (("a json-codec result", {"codec": "json", "blob": "e30="}),):
        act_call(f"complete with {label}", a, "complete", {"result": result})
    for label, failure in (
        ("no message", {"type": "X"}),
        ("an unknown kind", {"message": "x", "kind": "bogus"}),
        ("an unknown timeout_type", {"message": "x", "timeout_type": "bogus"}),
        ("json-codec details", {"message": "x", "details": {"codec": "json", "blob": "e30="}}),
    ):
        act_call(f"fail with {label}", a, "fail", {"failure": failure})
    for task_id, route in ((wf["task_id"], "workflow-tasks"), (a["task_id"], "activity-tasks")):
        for label, content, _ in GENERIC_BODIES:
            raw(f"{route} complete: {label}", f"/{route}/{task_id}/complete", content)
    return calls


async def _rejected_without_change(
    ctx: CheckContext,
    run: ActivityRun,
    label: str,
    call: Callable[[], Awaitable[Reply]],
    rejected: Callable[[int], bool],
    expected: str,
) -> None:
    """``call`` is rejected (its status ``rejected``, as ``expected`` says) and leaves the run's describe and history
    as they were."""
    before = await _snapshot(ctx, run)
    reply = await call()
    ctx.require(
        rejected(reply.status),
        f"{label} is rejected",
        expected=expected,
        received=f"{reply.status} {reply.reason or ''}".strip(),
        replies=[reply],
    )
    after = await _snapshot(ctx, run)
    ctx.require(
        after == before,
        f"a rejected call changes nothing: {label}",
        expected="describe and history unchanged",
        received=_diff(before, after),
        replies=[reply],
    )


@check("ROBUST-REJECTED-NO-STATE-CHANGE")
async def rejected_calls_change_nothing(ctx: CheckContext) -> None:
    """Fenced, rejected and invalid calls on a live run leave describe and history exactly as they were, and
    the owner can still complete every task afterwards."""
    live = await _live_run(ctx)
    for label, call in _rejected_calls(ctx, live):
        await _renew(ctx, live)
        await _rejected_without_change(
            ctx, live.run, label, call, lambda status: 400 <= status < 500, "a 4xx rejection"
        )
    reply = await ctx.complete(live.wf, [{"type": "start_timer", "delay_seconds": 3600}])
    ctx.expect(reply, 200, what="the owner's workflow-task complete after the rejected calls")
    for task in (live.a, live.b):
        reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("fine")})
        ctx.expect(reply, 200, what="the owner's activity complete after the rejected calls")
    # Rejections of tasks that are already finished change nothing either.
    finished: list[Call] = [
        ("a second workflow-task complete", lambda: ctx.complete(live.wf, [{"type": "complete_workflow"}])),
        ("a second activity complete", lambda: activity_call(ctx, live.a, "complete", {"result": None})),
    ]
    for label, call in finished:
        await _rejected_without_change(ctx, live.run, label, call, lambda status: status == 409, "409")


# -- unknown fields (§0) -------------------------------------------------------------------------------------

UNKNOWN: dict[str, Any] = {
    "x_conformance_unknown": {"nested": [1, {"deep": None}]},
    "another_unknown_field": "ignored",
}


@check("ROBUST-UNKNOWN-FIELDS-IGNORED")
async def unknown_fields_ignored(ctx: CheckContext) -> None:
    """Unknown fields on register, heartbeat, poll and complete bodies are ignored: every call succeeds."""
    req = "ROBUST-UNKNOWN-FIELDS-IGNORED"
    queue = ctx.uid("q")
    worker = ctx.uid("w")
    reply = await ctx.client.worker(
        "/register", {"worker_id": worker, "task_queue": queue, "runtime": "python", **UNKNOWN}
    )
    ctx.expect(reply, (200, 201), what="register with unknown fields", requirement=req)
    ctx.expect(
        await ctx.client.worker("/heartbeat", {"worker_id": worker, **UNKNOWN}),
        200,
        what="worker heartbeat with unknown fields",
        requirement=req,
    )
    workflow_id, _ = await ctx.start(queue)
    task = await lease_wf(ctx, worker, queue, **UNKNOWN)
    command = {
        "type": "schedule_activity",
        "activity_type": "conformance.act",
        "queue": queue,
        "arguments": ctx.envelope([1]),
    }
    reply = await ctx.wf_call(task, "complete", {"commands": [command], **UNKNOWN})
    ctx.expect(reply, 200, what="workflow-task complete with unknown fields", requirement=req)
    run = ActivityRun(queue, worker, workflow_id, "", {}, {})
    act = await lease_activity(ctx, run, requirement=req, extra=UNKNOWN)
    body = ctx.expect(
        await activity_call(ctx, act, "heartbeat", UNKNOWN),
        200,
        what="activity heartbeat with unknown fields",
        requirement=req,
    )
    ctx.require_equal(body.get("can_continue"), True, "unknown fields do not stop a heartbeat", requirement=req)
    reply = await activity_call(ctx, act, "complete", {"result": ctx.envelope("ok"), **UNKNOWN})
    what = "activity complete with unknown fields"
    ctx.expect(reply, 200, what=what, requirement=req, fields={"recorded": True})
    task = await lease_wf(ctx, worker, queue)
    reply = await ctx.wf_call(task, "complete", {"commands": [{"type": "complete_workflow"}], **UNKNOWN})
    ctx.expect(reply, 200, what="workflow-task complete_workflow with unknown fields", requirement=req)
    status = (await ctx.describe(workflow_id)).get("status")
    ctx.require(status == "completed", "the run completed", expected="completed", received=status, requirement=req)


# -- lifecycle hooks (§14.1) ---------------------------------------------------------------------------------


def _nested(depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


MALFORMED_PROGRESS: tuple[dict[str, Any], ...] = (
    {"current": "abc"},
    {"total": []},
    {"current": {}, "total": "many"},
    {"unit": 5},
    {"message": {"m": 1}},
    {"details": "not an object"},
    {"details": [1, 2]},
    {"current": 2**70},
    {"current": -1e308, "total": 1e308},
    {"current": True},
    {"details": {"deep": _nested(20)}},
    {"message": HUGE[:65536]},
)
MALFORMED_METRICS: tuple[dict[str, Any], ...] = (
    {"process_metrics": "garbage"},
    {"process_metrics": [1, 2, 3]},
    {"process_metrics": {"cpu": "hot", "rss": -1}},
    {"task_slots": "many"},
    {"task_slots": {"workflow": -5, "activity": "x"}},
    {"heartbeat_interval_seconds": "soon"},
    {"heartbeat_interval_seconds": -1},
    {"heartbeat_interval_seconds": 2**70},
    {"process_metrics": None},
    {"process_metrics": {"nested": _nested(16)}},
)


def _fail_open(ctx: CheckContext, reply: Reply, what: str, *, ok: frozenset[int] = frozenset({200})) -> None:
    req = "HOOKS-FAIL-OPEN"
    ctx.require(
        reply.status in ok | {422},
        f"malformed telemetry ({what}) is ignored or 422, never 5xx",
        expected=f"{sorted(ok)} (ignored) or 422",
        received=f"{reply.status} {reply.reason or ''}".strip(),
        replies=[reply],
        requirement=req,
    )
    problem = _envelope_problem(ctx, reply)
    ctx.require(
        problem is None,
        "the answer keeps the worker envelope",
        expected="the worker envelope",
        received=problem,
        replies=[reply],
        requirement=req,
    )


def _never_5xx(ctx: CheckContext, reply: Reply, what: str) -> None:
    """HOOKS-FAIL-OPEN for telemetry whose answer is not judged further: whatever it is, never a server error."""
    ctx.require(
        reply.status < 500,
        f"{what} never fails the server",
        expected="< 500",
        received=reply.status,
        replies=[reply],
        requirement="HOOKS-FAIL-OPEN",
    )


@check("HOOKS-FAIL-OPEN")
async def hooks_fail_open(ctx: CheckContext) -> None:
    """Malformed activity progress and worker metrics are ignored or 422, never 5xx, and break nothing."""
    run = await schedule_activities(ctx)
    # The worker's own telemetry first, before any lease is held: these calls renew no activity lease, and a
    # distant target's round trips (tens of them) would otherwise outlast a short one.
    for metrics in MALFORMED_METRICS:
        _fail_open(
            ctx,
            await ctx.client.worker("/heartbeat", {"worker_id": run.worker, **metrics}),
            f"worker heartbeat {sorted(metrics)}",
        )
        _fail_open(
            ctx,
            await ctx.client.worker(
                "/register",
                {"worker_id": ctx.uid("w"), "task_queue": run.queue, "runtime": "python", **metrics},
            ),
            f"register {sorted(metrics)}",
            ok=frozenset({200, 201}),
        )
    reply = await ctx.client.worker("/heartbeat", {"worker_id": run.worker})
    ctx.expect(reply, 200, what="a clean worker heartbeat after the malformed ones")
    task = await lease_activity(ctx, run)
    for progress in MALFORMED_PROGRESS:
        reply = await activity_call(ctx, task, "heartbeat", progress)
        _fail_open(ctx, reply, f"activity heartbeat {sorted(progress)}")
        if reply.status == 200:
            ctx.require(
                reply.json().get("can_continue") is True,
                "an ignored malformed progress report still renews a live attempt",
                expected="can_continue: true",
                received=reply.json().get("can_continue"),
                replies=[reply],
            )
        else:  # refused (422) renews nothing: a clean heartbeat keeps the lease, so only the telemetry is judged
            reply = await activity_call(ctx, task, "heartbeat", {})
            ctx.expect(reply, 200, what="a clean activity heartbeat after a refused malformed one")
    reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("done")})
    ctx.expect(reply, 200, what="the activity complete after malformed telemetry")


@check("HOOKS-OBSERVE-ONLY")
async def hooks_observe_only(ctx: CheckContext) -> None:
    """Malformed telemetry never turns a complete into a failure, and never changes a committed result."""
    req = "HOOKS-OBSERVE-ONLY"
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    for progress in MALFORMED_PROGRESS[:6]:
        await activity_call(ctx, task, "heartbeat", progress)
    result = ctx.envelope({"committed": True})
    reply = await activity_call(
        ctx, task, "complete", {"result": result, "progress": "garbage", "process_metrics": [1, {}]}
    )
    what = "activity complete after malformed progress reports"
    ctx.expect(reply, 200, what=what, requirement=req, fields={"recorded": True})
    resume = await lease_wf(ctx, run.worker, run.queue)
    output = ctx.envelope("workflow output")
    ctx.expect(
        await ctx.complete(resume, [{"type": "complete_workflow", "result": output}]),
        200,
        what="complete_workflow",
        requirement=req,
    )
    before = await _snapshot(ctx, run)
    for progress in MALFORMED_PROGRESS:
        _never_5xx(ctx, await activity_call(ctx, task, "heartbeat", progress), "telemetry after the outcome")
    for metrics in MALFORMED_METRICS:
        reply = await ctx.client.worker("/heartbeat", {"worker_id": run.worker, **metrics})
        _never_5xx(ctx, reply, "a worker heartbeat's metrics after the outcome")
    after = await _snapshot(ctx, run)
    ctx.require(
        after == before,
        "telemetry after the outcome changes no committed result",
        expected="describe and history unchanged",
        received=_diff(before, after),
        requirement=req,
    )
    got = after[0].get("output_envelope") or {}
    ctx.require(
        got.get("blob") == output["blob"],
        "the committed workflow result is the one completed",
        expected=output,
        received=got,
        requirement=req,
    )
