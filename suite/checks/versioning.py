"""Versioning, the worker envelope and discovery (§2, §3, §5; invariants 1-10): the version header and its
negotiation, the envelope on every worker-plane answer, and what cluster/info advertises.
"""

from __future__ import annotations

from typing import Any

from suite.context import CheckContext
from suite.outcomes import NotCovered
from suite.protocol.capabilities import S0_CAPABILITY_KEYS, S0_COMMAND_TYPES, S0_FEATURE_FLAGS
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import PROBE_BODY, lease_wf

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.VERSIONING, Area.ENVELOPE, Area.DISCOVERY)


async def _raw_worker(ctx: CheckContext, path: str, body: dict[str, Any], version_value: str) -> Any:
    """A worker call whose version header value is sent byte for byte (httpx refuses padded values)."""
    import json

    headers = list(ctx.client.worker_headers(version=None).items())
    headers += [("Content-Type", "application/json"), ("X-Durable-Workflow-Protocol-Version", version_value)]
    return await ctx.client.raw("POST", "/api/worker" + path, headers, json.dumps(body).encode())


def _advertised(ctx: CheckContext) -> str:
    v = ctx.target.advertised_version
    if v is None:
        raise ctx.fail("cluster/info has no worker_protocol.version", expected="a string such as '1.20'", received=None)
    return v


def _version_rejection(ctx: CheckContext, reply: Any, reason: str, requested: str | None, req: str) -> None:
    body = ctx.expect(reply, 400, reason, requirement=req)
    ctx.require(
        body.get("requested_version") == requested,
        f"requested_version must echo the header sent ({requested!r})",
        expected=repr(requested),
        received=repr(body.get("requested_version")),
        replies=[reply],
        requirement="VERSION-REQUESTED-ECHO" if requested is not None else req,
    )


@check("VERSION-MISSING", "VERSION-ERROR-BODY")
async def version_header_missing(ctx: CheckContext) -> None:
    """A worker request without the version header is 400 missing_protocol_version with requested_version null."""
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None)
    _version_rejection(ctx, reply, "missing_protocol_version", None, "VERSION-MISSING")
    body = reply.json()
    ctx.require_equal(
        body.get("supported_version"),
        _advertised(ctx),
        "a version rejection names the advertised version in supported_version",
        replies=[reply],
        requirement="VERSION-ERROR-BODY",
    )


@check("VERSION-EMPTY-IS-MISSING")
async def version_header_empty(ctx: CheckContext) -> None:
    """An empty or whitespace-only version header behaves exactly like a missing one."""
    for value in ("", "   "):
        reply = await _raw_worker(ctx, "/workflow-tasks/poll", PROBE_BODY, value)
        _version_rejection(ctx, reply, "missing_protocol_version", None, "VERSION-EMPTY-IS-MISSING")


@check("VERSION-MAJOR-MISMATCH", "VERSION-REQUESTED-ECHO")
async def version_other_major(ctx: CheckContext) -> None:
    """A different major (0.9, 2.0, 999) is 400 unsupported_protocol_version echoing the value."""
    for value in ("0.9", "2.0", "999"):
        reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=value)
        _version_rejection(ctx, reply, "unsupported_protocol_version", value, "VERSION-MAJOR-MISMATCH")


@check("VERSION-MINOR-ABOVE")
async def version_minor_above(ctx: CheckContext) -> None:
    """A minor above the advertised one is 400 unsupported_protocol_version."""
    major, _, minor = _advertised(ctx).partition(".")
    value = f"{major}.{int(minor) + 1}" if minor.isdigit() else "1.21"
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=value)
    _version_rejection(ctx, reply, "unsupported_protocol_version", value, "VERSION-MINOR-ABOVE")


@check("VERSION-MALFORMED")
async def version_malformed(ctx: CheckContext) -> None:
    """Malformed values (abc, 1, 1.2.3, v1.2, 1.x, 1.05) are 400 unsupported_protocol_version."""
    for value in ("abc", "1", "1.2.3", "v1.2", "1.x", "1.05"):
        reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=value)
        _version_rejection(ctx, reply, "unsupported_protocol_version", value, "VERSION-MALFORMED")


@check("VERSION-TRIM")
async def version_trimmed(ctx: CheckContext) -> None:
    """Surrounding whitespace is trimmed: ' 1.20 ' is accepted like '1.20'."""
    reply = await _raw_worker(ctx, "/heartbeat", {"worker_id": ctx.uid("nobody")}, f"  {_advertised(ctx)}  ")
    # An unregistered worker's heartbeat is the domain 404: reaching it proves the version was accepted.
    ctx.expect(reply, 404, "worker_not_registered", what="a padded but valid version header is accepted")


@check("VERSION-OLDER-MINOR-ACCEPTED", "ENVELOPE-NO-MINOR-ECHO")
async def version_older_minors_accepted(ctx: CheckContext) -> None:
    """Every minor 1.0..advertised is accepted on worker routes, and the answer names the advertised version."""
    advertised = _advertised(ctx)
    top = int(advertised.partition(".")[2])
    queue = ctx.uid("q")
    for minor in sorted({0, 1, min(13, top), top}):
        version = f"1.{minor}"
        wid = ctx.uid("w")
        reply = await ctx.client.worker(
            "/register", {"worker_id": wid, "task_queue": queue, "runtime": "python"}, version=version
        )
        ctx.expect(reply, (200, 201), what=f"register with {version}", requirement="VERSION-OLDER-MINOR-ACCEPTED")
        poll = await ctx.held(
            ctx.client.worker(
                "/workflow-tasks/poll", {"worker_id": wid, "task_queue": queue, "timeout_seconds": 1}, version=version
            ),
            ctx.poll_hold(1),
        )
        ctx.expect(poll, 200, what=f"poll with {version}", requirement="VERSION-OLDER-MINOR-ACCEPTED")
        for r in (reply, poll):
            ctx.require(
                r.headers.get("x-durable-workflow-protocol-version") == advertised
                and r.json().get("protocol_version") == advertised,
                f"a request at {version} is answered with the advertised version, never the requested one",
                expected=advertised,
                received=f"header {r.headers.get('x-durable-workflow-protocol-version')!r}, "
                f"body {r.json().get('protocol_version')!r}",
                replies=[r],
                requirement="ENVELOPE-NO-MINOR-ECHO",
            )


def _envelope_ok(ctx: CheckContext, reply: Any, advertised: str, caps: dict[str, Any]) -> None:
    body = reply.json()
    ctx.require_equal(
        reply.headers.get("x-durable-workflow-protocol-version"),
        advertised,
        f"every worker-plane response ({reply.status}) carries the version header",
        replies=[reply],
        requirement="ENVELOPE-VERSION-HEADER",
    )
    ctx.require_equal(
        body.get("protocol_version"),
        advertised,
        f"every worker-plane response ({reply.status}) carries protocol_version",
        replies=[reply],
        requirement="ENVELOPE-PROTOCOL-VERSION-BODY",
    )
    ctx.require(
        isinstance(body.get("server_capabilities"), dict),
        f"every worker-plane response ({reply.status}) carries a server_capabilities object",
        expected="an object",
        received=type(body.get("server_capabilities")).__name__,
        replies=[reply],
        requirement="ENVELOPE-SERVER-CAPABILITIES",
    )
    ctx.require(
        body.get("server_capabilities") == caps,
        "worker-plane server_capabilities deep-equals cluster/info worker_protocol.server_capabilities",
        expected="the cluster/info object",
        received="a different object",
        replies=[reply],
        requirement="DISCOVERY-CAPABILITIES-MATCH",
    )
    if reply.status >= 400:
        ctx.require(
            isinstance(body.get("reason"), str) and bool(body.get("reason")),
            "every error body carries a machine-readable reason",
            expected="reason: str",
            received=body.get("reason"),
            replies=[reply],
            requirement="ENVELOPE-ERROR-REASON",
        )


@check(
    "ENVELOPE-VERSION-HEADER",
    "ENVELOPE-PROTOCOL-VERSION-BODY",
    "ENVELOPE-SERVER-CAPABILITIES",
    "ENVELOPE-ERROR-REASON",
    "DISCOVERY-CAPABILITIES-MATCH",
    "DISCOVERY-VERSION-MATCHES",
)
async def envelope_on_every_worker_response(ctx: CheckContext) -> None:
    """Success and error answers (201, 200, 400, 404, 409, 412, 422) all carry the worker envelope."""
    advertised = _advertised(ctx)
    caps = ctx.caps
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    replies = [
        await ctx.client.worker("/register", {"worker_id": wid, "task_queue": queue, "runtime": "python"}),  # 201
        await ctx.poll_wf(wid, queue, 1),
        await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None),  # 400
        await ctx.client.worker(
            "/workflow-tasks/no-such-task/heartbeat", {"lease_owner": wid, "workflow_task_attempt": 1}
        ),  # 404
        await ctx.client.worker("/workflow-tasks/poll", {"worker_id": wid, "task_queue": queue + "-other"}),  # 409
        await ctx.client.worker("/workflow-tasks/poll", {"worker_id": ctx.uid("nobody"), "task_queue": queue}),  # 412
        await ctx.client.worker("/workflow-tasks/poll", {"task_queue": queue}),  # 422
    ]
    for expected, reply in zip((201, 200, 400, 404, 409, 412, 422), replies, strict=True):
        ctx.expect(reply, (expected, 200) if expected == 201 else expected, what="envelope probe")
        _envelope_ok(ctx, reply, advertised, caps)


@check("ENVELOPE-NO-CONTROL-PLANE-MARKS", "ENVELOPE-IGNORE-EXTRA-CONTROL-HEADER")
async def worker_plane_has_no_control_marks(ctx: CheckContext) -> None:
    """A worker request that also sends the control-plane header is answered in the worker envelope only."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    body = {"worker_id": wid, "task_queue": queue, "timeout_seconds": 1}
    extra = {"X-Durable-Workflow-Control-Plane-Version": "2"}
    reply = await ctx.held(ctx.client.worker("/workflow-tasks/poll", body, headers=extra), ctx.poll_hold(1))
    ctx.expect(reply, 200, requirement="ENVELOPE-IGNORE-EXTRA-CONTROL-HEADER")
    ctx.require(
        "x-durable-workflow-control-plane-version" not in reply.headers and "control_plane" not in reply.json(),
        "worker-plane responses never carry the control-plane header or a control_plane key",
        expected="no control-plane marks",
        received=dict(reply.headers),
        replies=[reply],
        requirement="ENVELOPE-NO-CONTROL-PLANE-MARKS",
    )
    ctx.require_equal(
        reply.json().get("protocol_version"),
        _advertised(ctx),
        "the worker envelope is still present",
        replies=[reply],
        requirement="ENVELOPE-IGNORE-EXTRA-CONTROL-HEADER",
    )


@check("ENVELOPE-ERROR-AND-MESSAGE")
async def error_bodies_have_error_and_message(ctx: CheckContext) -> None:
    """Error bodies SHOULD carry both error and message."""
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None)
    body = ctx.expect(reply, 400)
    ctx.require(
        isinstance(body.get("error"), str) and isinstance(body.get("message"), str),
        "error bodies carry both 'error' and 'message'",
        expected="both keys",
        received=sorted(k for k in ("error", "message") if k in body),
        replies=[reply],
    )


@check("ENVELOPE-JSON-BODIES")
async def bodies_are_json(ctx: CheckContext) -> None:
    """Every body, including errors, is application/json."""
    probes = [
        await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None),
        await ctx.client.control("GET", f"/workflows/{ctx.uid('absent')}"),
        await ctx.client.request("GET", "/api/cluster/info", headers=ctx.client.control_headers()),
    ]
    for reply in probes:
        ctype = reply.headers.get("content-type", "")
        ctx.require(
            ctype.split(";")[0].strip() == "application/json" and reply.body is not None,
            "the body is application/json",
            expected="application/json",
            received=ctype or "(none)",
            replies=[reply],
        )


@check("DISCOVERY-CLUSTER-INFO", "CONTROL-VERSION-EXEMPT")
async def cluster_info_with_credential_only(ctx: CheckContext) -> None:
    """GET /api/cluster/info, /api/health and /api/ready answer without any version header."""
    tok = ctx.target.operator_token or ctx.target.worker_token
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    info = await ctx.client.request("GET", "/api/cluster/info", headers=headers)
    ctx.expect(info, 200, requirement="DISCOVERY-CLUSTER-INFO")
    for path in ("/api/health", "/api/ready"):
        reply = await ctx.client.request("GET", path)
        ctx.expect(reply, 200, what=path, requirement="CONTROL-VERSION-EXEMPT")


@check("DISCOVERY-VERSION-MATCHES")
async def cluster_info_version_matches_worker_plane(ctx: CheckContext) -> None:
    """worker_protocol.version equals protocol_version of worker-plane responses."""
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY)
    ctx.require_equal(
        reply.json().get("protocol_version"),
        ctx.target.advertised_version,
        "cluster/info worker_protocol.version equals the worker-plane protocol_version",
        replies=[reply],
    )


@check(
    "DISCOVERY-PAYLOAD-CODECS-AVRO",
    "DISCOVERY-S0-COMMANDS",
    "DISCOVERY-FEATURE-FLAGS",
    "DISCOVERY-POLL-STATUS",
)
async def capabilities_advertise_s0(ctx: CheckContext) -> None:
    """payload_codecs has avro; the 11 S0 command types and the S0 feature flags are advertised."""
    info = ctx.target.cluster_info
    codecs = (info.get("capabilities") or {}).get("payload_codecs")
    ctx.require(
        isinstance(codecs, list) and "avro" in codecs,
        "capabilities.payload_codecs contains 'avro'",
        expected="['avro', …]",
        received=codecs,
        requirement="DISCOVERY-PAYLOAD-CODECS-AVRO",
    )
    commands = ctx.caps.get("supported_workflow_task_commands")
    missing = [c for c in S0_COMMAND_TYPES if not isinstance(commands, list) or c not in commands]
    ctx.require(
        not missing,
        "supported_workflow_task_commands includes every S0 command type",
        expected=list(S0_COMMAND_TYPES),
        received=f"missing {missing}",
        requirement="DISCOVERY-S0-COMMANDS",
    )
    flags = S0_FEATURE_FLAGS
    off = [f for f in flags if ctx.caps.get(f) is not True]
    ctx.require(
        not off,
        "the S0 feature flags are true",
        expected="true",
        received=f"not true: {off}",
        requirement="DISCOVERY-FEATURE-FLAGS",
    )
    ps = ctx.caps.get("poll_status")
    ctx.require(
        ps is True or (isinstance(ps, dict) and bool(ps)),
        "poll_status is truthy",
        expected="true or a non-empty object",
        received=ps,
        requirement="DISCOVERY-POLL-STATUS",
    )


@check("DISCOVERY-S0-KEYS", "DISCOVERY-SESSIONS-ONLY-IF-IMPLEMENTED")
async def capabilities_s0_keys_present(ctx: CheckContext) -> None:
    """All S0 capability keys SHOULD be present (session keys only when sessions are implemented)."""
    sessions = "worker_sessions" in ctx.caps or "worker_session_verbs" in ctx.caps
    if sessions:
        reply = await ctx.client.worker("/sessions", {"worker_id": ctx.uid("w")})
        ctx.require(
            reply.status != 404 or reply.reason not in (None, "route_not_found"),
            "worker sessions are advertised, so the session endpoint exists",
            expected="a session route",
            received=f"{reply.status} {reply.reason}",
            replies=[reply],
            requirement="DISCOVERY-SESSIONS-ONLY-IF-IMPLEMENTED",
        )
    skip = set() if sessions else {"worker_session_verbs", "worker_sessions"}
    missing = [k for k in S0_CAPABILITY_KEYS if k not in skip and k not in ctx.caps]
    ctx.require(
        not missing,
        "every S0 capability key is present",
        expected=sorted(set(S0_CAPABILITY_KEYS) - skip),
        received=f"missing {missing}",
        requirement="DISCOVERY-S0-KEYS",
    )


@check("DISCOVERY-PAGE-SIZE-BOTH-NAMES")
async def capabilities_page_size_both_names(ctx: CheckContext) -> None:
    """Both history_page_size_default and default_history_page_size are advertised."""
    missing = [k for k in ("history_page_size_default", "default_history_page_size") if k not in ctx.caps]
    ctx.require(
        not missing,
        "both page-size capability names are present",
        expected="both",
        received=f"missing {missing}",
    )


@check("DISCOVERY-VERSION-STRINGS")
async def cluster_info_versions_are_strings(ctx: CheckContext) -> None:
    """worker_protocol.version and control_plane.version are strings."""
    info = ctx.target.cluster_info
    wp = (info.get("worker_protocol") or {}).get("version")
    cp = (info.get("control_plane") or {}).get("version")
    ctx.require(
        isinstance(wp, str) and isinstance(cp, str),
        "discovery versions are strings",
        expected="strings",
        received=f"worker_protocol.version={wp!r}, control_plane.version={cp!r}",
    )


@check("DISCOVERY-SDK-GATE")
async def cluster_info_passes_sdk_gate(ctx: CheckContext) -> None:
    """cluster/info carries what the official SDK's worker gate requires (Appendix B)."""
    info = ctx.target.cluster_info
    cp = info.get("control_plane") or {}
    rc = cp.get("request_contract") or {}
    problems = []
    if str(cp.get("version")) != "2":
        problems.append("control_plane.version != '2'")
    if rc.get("schema") != "durable-workflow.v2.control-plane-request.contract" or str(rc.get("version")) != "1":
        problems.append("control_plane.request_contract")
    acc = info.get("auth_composition_contract") or {}
    if acc.get("schema") != "durable-workflow.v2.auth-composition.contract":
        problems.append("auth_composition_contract.schema")
    env = acc.get("canonical_environment") or {}
    for key in ("server_url", "namespace", "auth_token", "tls_verify", "profile"):
        if key not in env:
            problems.append(f"auth_composition_contract.canonical_environment.{key}")
    never = (acc.get("redaction") or {}).get("never_echo") or []
    for item in ("bearer_tokens", "private_keys", "raw_authorization_headers"):
        if item not in never:
            problems.append(f"redaction.never_echo lacks {item}")
    ctx.require(
        not problems,
        "cluster/info satisfies the SDK compatibility gate",
        expected="Appendix B fields",
        received=problems,
    )


@check("VERSION-ACCEPTED-RANGE-FIELD")
async def version_error_accepted_range(ctx: CheckContext) -> None:
    """A version rejection MAY carry accepted_versions; when it does, it is {min: "1.0", max: advertised}."""
    reply = await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version="1.99")
    body = ctx.expect(reply, 400, "unsupported_protocol_version")
    if "accepted_versions" not in body:
        raise NotCovered("the target does not send the optional accepted_versions field")
    ctx.require_equal(
        body["accepted_versions"],
        {"min": "1.0", "max": _advertised(ctx)},
        "accepted_versions names the accepted range",
        replies=[reply],
    )


@check("SCHEMA-RESPONSES")
async def responses_match_schemas(ctx: CheckContext) -> None:
    """A representative exchange of every kind validates against schemas/ (every check validates its own too)."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    await ctx.client.worker("/heartbeat", {"worker_id": wid})
    await ctx.poll_wf(wid, queue, 1)
    workflow_id, run_id = await ctx.start(queue, input=["hello", 42])
    task = await lease_wf(ctx, wid, queue)
    await ctx.wf_call(task, "heartbeat")
    await ctx.wf_call(task, "history", {"after_sequence": 0})
    await ctx.complete(task, [{"type": "start_timer", "delay_seconds": 3600}])
    await ctx.complete(task, [{"type": "complete_workflow"}])  # 409: not leased any more
    await ctx.client.control("POST", f"/workflows/{workflow_id}/signal/go", {"input": ["x"]})
    await ctx.describe(workflow_id)
    await ctx.client.control("GET", f"/workflows/{workflow_id}/runs")
    await ctx.history(workflow_id, run_id)
    await ctx.client.control("POST", f"/workflows/{workflow_id}/cancel", {"reason": "done"})
    await ctx.client.worker("/workflow-tasks/poll", PROBE_BODY, version=None)
    await ctx.client.control("GET", f"/workflows/{ctx.uid('absent')}")
    problems = [(e, err) for e in ctx.exchanges for err in e.schema_errors]
    ctx.require(
        not problems,
        "every response matches its schema",
        expected="no schema violations",
        received=[f"{e.summary()}: {err}" for e, err in problems][:5],
    )


# -- an old worker (§3.3) ------------------------------------------------------------------------------------


@check("VERSION-NO-NEWER-REQUIRED-FIELDS")
async def worker_1_0_fully_served(ctx: CheckContext) -> None:
    """A worker speaking 1.0, sending only 1.0 fields, registers, polls, runs an activity and completes."""
    req = "VERSION-NO-NEWER-REQUIRED-FIELDS"
    old = "1.0"
    queue = ctx.uid("q")
    worker = ctx.uid("w")

    async def call(
        path: str, body: dict[str, Any], what: str, status: int | tuple[int, ...] = 200, hold: float = 10
    ) -> dict[str, Any]:
        reply = await ctx.client.worker(path, body, version=old, timeout=hold + 15)
        return ctx.expect(reply, status, what=f"{what} as a 1.0 worker", requirement=req)

    async def poll(kind: str) -> dict[str, Any]:
        # A 1.0 worker sends no timeout_seconds: the task is ready, so the default hold never runs out.
        body = await call(
            f"/{kind}-tasks/poll", {"worker_id": worker, "task_queue": queue}, f"{kind}-task poll", hold=35
        )
        task = body.get("task")
        ctx.require(
            isinstance(task, dict),
            f"a 1.0 worker leases the ready {kind} task",
            expected="a task",
            received=task,
            requirement=req,
        )
        assert isinstance(task, dict)
        return task

    await call("/register", {"worker_id": worker, "task_queue": queue, "runtime": "python"}, "register", (200, 201))
    workflow_id, _ = await ctx.start(queue, input=["old"])
    wf = await poll("workflow")
    fence = {"lease_owner": worker, "workflow_task_attempt": wf.get("workflow_task_attempt")}
    await call(
        f"/workflow-tasks/{wf['task_id']}/complete",
        {
            **fence,
            "commands": [
                {
                    "type": "schedule_activity",
                    "activity_type": "conformance.act",
                    "arguments": ctx.envelope(["old"]),
                }
            ],
        },
        "workflow-task complete",
    )
    act = await poll("activity")
    await call(
        f"/activity-tasks/{act['task_id']}/complete",
        {
            "activity_attempt_id": act.get("activity_attempt_id"),
            "lease_owner": worker,
            "result": ctx.envelope("old result"),
        },
        "activity complete",
    )
    wf = await poll("workflow")
    fence = {"lease_owner": worker, "workflow_task_attempt": wf.get("workflow_task_attempt")}
    await call(
        f"/workflow-tasks/{wf['task_id']}/complete",
        {**fence, "commands": [{"type": "complete_workflow", "result": ctx.envelope("done")}]},
        "workflow-task complete_workflow",
    )
    status = (await ctx.describe(workflow_id)).get("status")
    ctx.require_equal(status, "completed", "a 1.0 worker drives a run to completion", requirement=req)
