"""Worker registration (§6; invariants 11-13): register answers 201 and is an upsert, its input is validated
and the SDKs' extras tolerated, a fingerprint conflict is refused, a worker heartbeat is acknowledged, a poll
from a worker that is not registered (or for another queue or build id, or missing fields) is refused, and a
deregistered holder's workflow tasks are ready again at once.
"""

from __future__ import annotations

from typing import Any

from suite.context import CheckContext
from suite.outcomes import Indeterminate, NotCovered
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import ACTIVITY_TYPE, TASK_KINDS, lease_wf, next_activity, require_no_task, send_poll

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.REGISTRATION,)


# §6.1: the SDK extras a register must tolerate, with the shapes the Python SDK sends.
SDK_EXTRAS: dict[str, Any] = {
    "capabilities": ["query_tasks"],
    "workflow_command_contracts": {"schema": "durable-workflow.v2.workflow-command.contract", "version": 1},
    "task_slots": {"workflow": {"max": 10, "available": 10}, "activity": {"max": 10, "available": 10}},
    "process_metrics": {"pid": 4242, "rss_bytes": 52428800, "cpu_percent": 1.5},
    "heartbeat_interval_seconds": 30,
    "sdk_version": "0.0.0-conformance",
    "conformance_unknown_field": {"ignored": True},
}


@check("REGISTER-CREATED")
async def register_returns_201(ctx: CheckContext) -> None:
    """register with task_queue and runtime python is 201 {registered: true, worker_id}; an absent id is generated."""
    queue = ctx.uid("q")
    wid = ctx.uid("w")
    reply = await ctx.client.worker("/register", {"worker_id": wid, "task_queue": queue, "runtime": "python"})
    body = ctx.expect(reply, 201, what="register")
    ctx.require(
        body.get("registered") is True and body.get("worker_id") == wid,
        "register answers registered: true and the worker_id",
        expected={"registered": True, "worker_id": wid},
        received={k: body.get(k) for k in ("registered", "worker_id")},
        replies=[reply],
    )
    reply = await ctx.client.worker("/register", {"task_queue": queue, "runtime": "python"})
    body = ctx.expect(reply, 201, what="register without worker_id")
    generated = body.get("worker_id")
    ctx.require(
        body.get("registered") is True and isinstance(generated, str) and bool(generated),
        "register without worker_id generates one and returns it",
        expected="registered: true, worker_id: str",
        received={k: body.get(k) for k in ("registered", "worker_id")},
        replies=[reply],
    )
    poll = await send_poll(ctx, "workflow", str(generated), queue)
    ctx.expect(poll, 200, what="poll by the generated worker id")


@check("REGISTER-IDEMPOTENT")
async def register_is_upsert(ctx: CheckContext) -> None:
    """Re-registering a worker id is 201 again and replaces the registration (upsert keyed by worker id)."""
    first, second = ctx.uid("q"), ctx.uid("q")
    wid = ctx.uid("w")
    for queue in (first, first, second):
        reply = await ctx.client.worker("/register", {"worker_id": wid, "task_queue": queue, "runtime": "python"})
        body = ctx.expect(reply, 201, what=f"register {wid} on {queue}")
        ctx.require(
            body.get("registered") is True and body.get("worker_id") == wid,
            "a re-registration answers registered: true with the same worker_id",
            expected=wid,
            received={k: body.get(k) for k in ("registered", "worker_id")},
            replies=[reply],
        )
    now = await send_poll(ctx, "workflow", wid, second)
    ctx.expect(now, 200, what="poll of the queue of the latest registration")
    old = await send_poll(ctx, "workflow", wid, first)
    ctx.expect(old, 409, "task_queue_mismatch", what="poll of the queue the upsert replaced")


@check("REGISTER-VALIDATION")
async def register_validation(ctx: CheckContext) -> None:
    """register without task_queue, without runtime, or with an unknown runtime is 422 and registers nothing."""
    queue = ctx.uid("q")
    cases = {
        "missing task_queue": {"runtime": "python"},
        "missing runtime": {"task_queue": queue},
        "unknown runtime": {"task_queue": queue, "runtime": "cobol"},
    }
    for what, body in cases.items():
        wid = ctx.uid("w")
        reply = await ctx.client.worker("/register", {"worker_id": wid, **body})
        ctx.expect(reply, 422, "validation_failed", what=f"register with {what}")
        poll = await send_poll(ctx, "workflow", wid, queue)
        ctx.expect(poll, 412, "worker_not_registered", what=f"poll after a rejected register ({what})")


@check("REGISTER-ACCEPT-RUST")
async def register_accepts_rust(ctx: CheckContext) -> None:
    """runtime rust SHOULD be accepted (S0 names Rust among the SDKs)."""
    queue = ctx.uid("q")
    reply = await ctx.client.worker("/register", {"worker_id": ctx.uid("w"), "task_queue": queue, "runtime": "rust"})
    ctx.expect(reply, 201, what="register with runtime rust")


@check("REGISTER-TOLERATE-EXTRAS")
async def register_tolerates_sdk_extras(ctx: CheckContext) -> None:
    """The SDK's extra register fields (capabilities, task_slots, process_metrics, …) are accepted."""
    queue = ctx.uid("q")
    wid = ctx.uid("w")
    reply = await ctx.client.worker(
        "/register", {"worker_id": wid, "task_queue": queue, "runtime": "python", **SDK_EXTRAS}
    )
    ctx.expect(reply, 201, what="register with SDK extras")
    ctx.expect(await send_poll(ctx, "workflow", wid, queue), 200, what="poll after a register with SDK extras")


@check("REGISTER-FINGERPRINT-CONFLICT")
async def register_fingerprint_conflict(ctx: CheckContext) -> None:
    """An active worker re-registering another fingerprint for a type is 409 workflow_definition_changed."""
    queue = ctx.uid("q")
    wid = ctx.uid("w")
    wf_type = "conformance.Fingerprinted"

    def body(fp: str) -> dict[str, Any]:
        return {
            "worker_id": wid,
            "task_queue": queue,
            "runtime": "python",
            "supported_workflow_types": [wf_type],
            "workflow_definition_fingerprints": {wf_type: fp},
        }

    ctx.expect(await ctx.client.worker("/register", body("fp-a")), 201, what="first register")
    ctx.expect(
        await ctx.client.worker("/register", body("fp-a")),
        201,
        what="re-register with the same fingerprint",
        requirement="REGISTER-IDEMPOTENT",
    )
    reply = await ctx.client.worker("/register", body("fp-b"))
    what = "re-register with another fingerprint"
    ctx.expect(reply, 409, "workflow_definition_changed", what=what, fields={"workflow_type": wf_type})


@check("WORKER-HEARTBEAT-ACK")
async def worker_heartbeat_ack(ctx: CheckContext) -> None:
    """POST /worker/heartbeat is 200 acknowledged: true for a registered worker, 404 for an unknown one."""
    wid = await ctx.register(ctx.uid("q"))
    reply = await ctx.client.worker("/heartbeat", {"worker_id": wid, "task_slots": {"workflow": {"available": 1}}})
    ctx.expect(reply, 200, what="worker heartbeat", fields={"acknowledged": True})
    reply = await ctx.client.worker("/heartbeat", {"worker_id": ctx.uid("nobody")})
    ctx.expect(reply, 404, "worker_not_registered", what="heartbeat of an unknown worker")


@check("POLL-NOT-REGISTERED")
async def poll_unregistered_worker(ctx: CheckContext) -> None:
    """A workflow, activity or query poll by an unregistered worker_id is 412 worker_not_registered."""
    queue = ctx.uid("q")
    await ctx.register(queue)  # the queue exists; only this worker id does not
    for kind in TASK_KINDS:
        reply = await send_poll(ctx, kind, ctx.uid("nobody"), queue)
        ctx.expect(reply, 412, "worker_not_registered", what=f"{kind} poll by an unregistered worker")


@check("POLL-QUEUE-MISMATCH")
async def poll_queue_mismatch(ctx: CheckContext) -> None:
    """Polling another queue than the registered one is 409 task_queue_mismatch naming both queues."""
    queue, other = ctx.uid("q"), ctx.uid("q-other")
    wid = await ctx.register(queue)
    for kind in TASK_KINDS:
        reply = await send_poll(ctx, kind, wid, other)
        ctx.expect(
            reply,
            409,
            "task_queue_mismatch",
            what=f"{kind} poll of an unregistered queue",
            fields={"registered_task_queue": queue, "requested_task_queue": other},
        )


@check("POLL-BUILD-ID-MISMATCH")
async def poll_build_id_mismatch(ctx: CheckContext) -> None:
    """A poll build_id other than the registered non-empty build_id is 409 build_id_mismatch."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue, build_id="conformance-b1")
    for kind in TASK_KINDS:
        ctx.expect(
            await send_poll(ctx, kind, wid, queue, build_id="conformance-b1"),
            200,
            what=f"{kind} poll with the registered build_id",
        )
        reply = await send_poll(ctx, kind, wid, queue, build_id="conformance-b2")
        ctx.expect(reply, 409, "build_id_mismatch", what=f"{kind} poll with another build_id")


@check("POLL-MISSING-FIELDS")
async def poll_missing_fields(ctx: CheckContext) -> None:
    """A workflow, activity or query poll without worker_id or task_queue is 422 validation_failed, not 5xx."""
    queue = ctx.uid("q")
    wid = await ctx.register(queue)
    for kind in TASK_KINDS:
        for what, worker, q in (("worker_id", None, queue), ("task_queue", wid, None), ("both", None, None)):
            reply = await send_poll(ctx, kind, worker, q)
            ctx.expect(reply, 422, "validation_failed", what=f"{kind} poll without {what}")


@check("MATCH-REGISTERED-TYPES")
async def tasks_matched_by_registered_type(ctx: CheckContext) -> None:
    """On one queue, a worker registered for other types is offered neither the workflow task nor the activity
    task; the worker registered for their types leases both."""
    queue = ctx.uid("q")
    other = await ctx.register(
        queue, supported_workflow_types=["conformance.Other"], supported_activity_types=["conformance.other"]
    )
    owner = await ctx.register(
        queue, supported_workflow_types=["conformance.Probe"], supported_activity_types=[ACTIVITY_TYPE]
    )
    await ctx.start(queue)
    why = "a task is leased only to a worker that registered its type"
    reply = await send_poll(ctx, "workflow", other, queue)
    require_no_task(
        ctx, reply, what="workflow poll by a worker of other types", requirement="MATCH-REGISTERED-TYPES", why=why
    )
    task = await lease_wf(ctx, owner, queue)
    schedule = {"type": "schedule_activity", "activity_type": ACTIVITY_TYPE, "arguments": ctx.envelope([])}
    ctx.expect(await ctx.complete(task, [schedule]), 200, what="schedule_activity")
    reply = await send_poll(ctx, "activity", other, queue)
    require_no_task(
        ctx, reply, what="activity poll by a worker of other types", requirement="MATCH-REGISTERED-TYPES", why=why
    )
    await next_activity(ctx, owner, queue)


@check("DEREGISTER-RELEASES-LEASES")
async def deregistration_releases_workflow_leases(ctx: CheckContext) -> None:
    """The holder of a workflow task deregisters: recovered_workflow_task_count 1, and another worker's next poll
    leases the task as attempt 2 while the lease it gave up would still run; the old holder is then fenced."""
    queue = ctx.uid("q")
    holder, other = ctx.uid("w"), ctx.uid("w")
    for worker in (holder, other):
        await ctx.register(queue, worker_id=worker)
    await ctx.start(queue)
    task = await lease_wf(ctx, holder, queue)
    leased_at = ctx.now()
    reply = await ctx.client.worker(f"/registrations/{holder}", method="DELETE")
    if reply.status in (404, 405) and reply.reason != "worker_not_found":
        raise NotCovered("the target serves no worker deregistration (DELETE /api/worker/registrations/{worker_id})")
    ctx.expect(reply, 200, what="deregistration of a task's holder", fields={"outcome": "deregistered"})
    ctx.require_equal(reply.json().get("recovered_workflow_task_count"), 1, "the holder's one live lease is recovered")
    polled = await send_poll(ctx, "workflow", other, queue)
    lease = float(ctx.target.test_profile.get("workflow_task_lease_seconds") or 300)
    again = ctx.expect(polled, 200, what="the next poll").get("task")
    if not isinstance(again, dict) and (ctx.now() - leased_at).total_seconds() >= lease:
        raise Indeterminate("the lease the holder gave up may have lapsed on its own before the next poll")
    ctx.require(
        isinstance(again, dict)
        and again.get("task_id") == task["task_id"]
        and again.get("workflow_task_attempt") == int(task["workflow_task_attempt"]) + 1,
        "the task its holder left is ready at once: the next poll leases it as the next attempt",
        expected={"task_id": task["task_id"], "workflow_task_attempt": int(task["workflow_task_attempt"]) + 1},
        received=None
        if not isinstance(again, dict)
        else {k: again.get(k) for k in ("task_id", "workflow_task_attempt")},
        replies=[reply, polled],
    )
    late = await ctx.wf_call(task, "heartbeat", {})
    ctx.require(
        late.status == 409,
        "the worker that deregistered is fenced from the task it left",
        expected="409",
        received=f"{late.status} {late.reason}",
        replies=[late],
    )
