"""The control plane (§12, §13): starts and their duplicate policies, historical and unknown runs,
cancel and terminate closing a run, its version header and envelope, signals and updates.
"""

from __future__ import annotations

from typing import Any

from suite.context import CheckContext
from suite.protocol.commands import LEGACY_START_FIELDS
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import LIVE_RUN_STATUSES, lease_workflow_task

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.CONTROL_PLANE,)


@check("CONTROL-START")
async def control_start_outcomes(ctx: CheckContext) -> None:
    """Start is 201 started_new, then 409 rejected_duplicate under the default policy and 200
    returned_existing_active with use-existing; a bad duplicate_policy, a legacy field or a timeout ≤ 0 is
    422 and starts nothing."""
    queue = ctx.uid("q")
    wid = ctx.uid("wf")
    body = {"workflow_type": "conformance.Probe", "workflow_id": wid, "task_queue": queue}
    reply = await ctx.client.control("POST", "/workflows", body)
    first = ctx.expect(reply, 201, what="a new start")
    ctx.require(
        first.get("outcome") == "started_new" and bool(first.get("run_id")),
        "a new start says outcome started_new and names its run_id",
        expected="started_new",
        received={k: first.get(k) for k in ("outcome", "run_id")},
        replies=[reply],
    )
    reply = await ctx.client.control("POST", "/workflows", body)
    dup = ctx.expect(reply, 409, what="a second start of an active workflow id")
    ctx.require(
        "rejected_duplicate" in (dup.get("reason"), dup.get("outcome")),
        "the duplicate start is rejected_duplicate",
        expected="reason or outcome rejected_duplicate",
        received={k: dup.get(k) for k in ("reason", "outcome")},
        replies=[reply],
    )
    reply = await ctx.client.control("POST", "/workflows", {**body, "duplicate_policy": "use-existing"})
    same = ctx.expect(reply, 200, what="a start with duplicate_policy use-existing")
    existing = same.get("outcome") == "returned_existing_active" and same.get("run_id") == first.get("run_id")
    ctx.require(
        existing,
        "use-existing returns the active run",
        expected={"outcome": "returned_existing_active", "run_id": first.get("run_id")},
        received={k: same.get(k) for k in ("outcome", "run_id")},
        replies=[reply],
    )
    bad: dict[str, dict[str, Any]] = {
        "duplicate_policy use_existing": {"duplicate_policy": "use_existing"},
        "duplicate_policy reject": {"duplicate_policy": "reject"},
        "execution_timeout_seconds 0": {"execution_timeout_seconds": 0},
        "execution_timeout_seconds -5": {"execution_timeout_seconds": -5},
        "run_timeout_seconds 0": {"run_timeout_seconds": 0},
    }
    for legacy in LEGACY_START_FIELDS:
        bad[f"legacy field {legacy}"] = {legacy: {"max_attempts": 1} if legacy == "retry_policy" else "x1"}
    for what, extra in bad.items():
        other = ctx.uid("wf")
        reply = await ctx.client.control("POST", "/workflows", {**body, "workflow_id": other, **extra})
        ctx.expect(reply, 422, what=f"a start with {what}")
        probe = await ctx.client.control("GET", f"/workflows/{other}")
        ctx.expect(probe, 404, "instance_not_found", what=f"describe after the rejected start with {what}")


@check("CONTROL-HISTORICAL-RUN")
async def control_historical_run_rejected(ctx: CheckContext) -> None:
    """After continue_as_new, signal, cancel and terminate aimed at the first run are 409
    historical_run_command_rejected and leave the current run alone."""
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    wid, first_run = await ctx.start(queue)
    task, _ = await lease_workflow_task(ctx, worker, queue)
    ctx.expect(await ctx.complete(task, [{"type": "continue_as_new"}]), 200, what="complete with continue_as_new")
    described = await ctx.describe(wid)
    current = described.get("run_id")
    ctx.require(
        bool(current) and current != first_run,
        "continue_as_new makes a new current run",
        expected=f"a run_id other than {first_run}",
        received=current,
    )
    for path in ("signal/ping", "cancel", "terminate"):
        reply = await ctx.client.control("POST", f"/workflows/{wid}/runs/{first_run}/{path}", {})
        ctx.expect(reply, 409, "historical_run_command_rejected", what=f"{path} aimed at the historical run")
    described = await ctx.describe(wid)
    ctx.require(
        described.get("run_id") == current and described.get("status") in LIVE_RUN_STATUSES,
        "rejected historical-run commands do not touch the current run",
        expected=f"run {current} still live",
        received={k: described.get(k) for k in ("run_id", "status")},
    )
    # The same route on the current run is accepted: the 409 above is about the run, not the route.
    reply = await ctx.client.control("POST", f"/workflows/{wid}/runs/{current}/signal/ping", {})
    ctx.expect(reply, 202, what="a signal aimed at the current run")


@check("CONTROL-UNKNOWN-WORKFLOW")
async def control_unknown_workflow_and_run(ctx: CheckContext) -> None:
    """An unknown workflow is 404 instance_not_found; an unknown run of a known one is 404 run_not_found."""
    absent = ctx.uid("absent")
    calls = [
        ("GET", f"/workflows/{absent}"),
        ("POST", f"/workflows/{absent}/signal/ping"),
        ("POST", f"/workflows/{absent}/cancel"),
        ("POST", f"/workflows/{absent}/terminate"),
    ]
    for method, path in calls:
        reply = await ctx.client.control(method, path, {} if method == "POST" else None)
        ctx.expect(reply, 404, "instance_not_found", what=f"{method} on an unknown workflow")
    wid, _ = await ctx.start(ctx.uid("q"))
    ghost = ctx.uid("no-such-run")
    run = f"/workflows/{wid}/runs/{ghost}"
    calls = [("GET", run), ("GET", f"{run}/history"), ("POST", f"{run}/signal/ping"), ("POST", f"{run}/cancel")]
    for method, path in calls:
        reply = await ctx.client.control(method, path, {} if method == "POST" else None)
        ctx.expect(reply, 404, "run_not_found", what=f"{method} on an unknown run of a known workflow")


@check("CONTROL-CANCEL-CLOSES-RUN")
async def control_cancel_closes_run(ctx: CheckContext) -> None:
    """Cancel and terminate close the run at once: describe shows status and closed_reason cancelled
    (terminated), and a second cancel is 409."""
    queue = ctx.uid("q")
    for op, status in (("cancel", "cancelled"), ("terminate", "terminated")):
        wid, run_id = await ctx.start(queue)
        reply = await ctx.client.control("POST", f"/workflows/{wid}/{op}", {"reason": "conformance"})
        ctx.expect(reply, 200, what=op, requirement="CONTROL-CANCEL-CLOSES-RUN", fields={"outcome": status})
        described = await ctx.describe(wid)
        got = {k: described.get(k) for k in ("run_id", "status", "closed_reason")}
        want = {"run_id": run_id, "status": status, "closed_reason": status}
        ctx.require_equal(got, want, f"{op} closes the run immediately", requirement="CONTROL-CANCEL-CLOSES-RUN")
        reply = await ctx.client.control("POST", f"/workflows/{wid}/cancel", {"reason": "again"})
        ctx.expect(reply, 409, what=f"cancel of a run already {status}", requirement="CONTROL-CANCEL-CLOSES-RUN")
