"""Activity tasks, their fencing, retries and timeouts (docs/reference.md: Activities, Dispatch, invariants 52-59 and
69).

Every check schedules its own activities: it starts a workflow on a fresh queue, leases the first workflow
task and completes it with ``schedule_activity`` commands targeting that queue, then polls
``/activity-tasks/poll`` as a worker registered there. The worlds and worker calls are
:mod:`suite.worlds`.
"""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Any

from suite.client import Reply
from suite.context import CheckContext
from suite.outcomes import Unimplemented
from suite.protocol.codec import encode_value
from suite.protocol.fencing import parse_rfc3339
from suite.protocol.oracle import Accepted, Kind, judge_history
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    ACTIVITY_TYPE,
    READY_WITHIN,
    SCHEDULED,
    ActivityRun,
    activity_call,
    attributed,
    int_or_none,
    judged_by_oracle,
    lease_activity,
    lease_activity_at,
    lease_wf,
    poll_activity,
    require_no_task,
    schedule_activities,
    still_within,
    task_summary,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.ACTIVITIES, Area.RETRIES, Area.TIMEOUTS, Area.FENCING)

__all__ = ["expect_no_activity", "expect_no_workflow_task", "history_events", "lease_resume"]

# Timing tolerance for "not before the backoff" (server and suite clocks tick at the same rate; this
# absorbs scheduling and network jitter, never a missing backoff).
BACKOFF_TOLERANCE = 0.5


# -- shared helpers ---------------------------------------------------------------------------------------


async def expect_no_activity(ctx: CheckContext, run: ActivityRun, *, requirement: str, why: str) -> None:
    """One short activity poll on the run's queue must come back without a task."""
    reply = await poll_activity(ctx, run.worker, run.queue)
    require_no_task(ctx, reply, what="activity-task poll", requirement=requirement, why=why)


async def expect_no_workflow_task(ctx: CheckContext, run: ActivityRun, *, requirement: str, why: str) -> None:
    reply = await ctx.poll_wf(run.worker, run.queue, 1)
    require_no_task(ctx, reply, what="workflow-task poll", requirement=requirement, why=why)


async def lease_resume(ctx: CheckContext, run: ActivityRun, *, requirement: str, why: str) -> dict[str, Any]:
    """The workflow task that resumes the run after an activity's final outcome."""
    task = await attributed(lease_wf(ctx, run.worker, run.queue, within=READY_WITHIN), requirement)
    ctx.require(
        task.get("run_id") == run.run_id,
        why,
        expected=f"a workflow task of run {run.run_id}",
        received=f"run {task.get('run_id')}",
        requirement=requirement,
    )
    return task


def history_events(
    history: list[dict[str, Any]], event_type: str, execution_id: str | None = None
) -> list[dict[str, Any]]:
    """Events of ``event_type``; with ``execution_id``, those that do not name another execution."""
    out = []
    for event in history:
        if event.get("event_type") != event_type:
            continue
        payload = event.get("payload")
        named = payload.get("activity_execution_id") if isinstance(payload, dict) else None
        if execution_id is not None and named not in (None, execution_id):
            continue
        out.append(event)
    return out


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    payload = event.get("payload")
    return payload if isinstance(payload, dict) else {}


def _carries_envelope(obj: Any, blob: str) -> bool:
    """Whether ``obj`` holds ``blob`` with codec avro: as ``{codec, blob}`` or next to a ``*codec`` key."""
    if isinstance(obj, dict):
        if obj.get("blob") == blob and obj.get("codec") == "avro":
            return True
        if blob in obj.values() and any(k.endswith("codec") and v == "avro" for k, v in obj.items()):
            return True
        return any(_carries_envelope(v, blob) for v in obj.values())
    if isinstance(obj, list):
        return any(_carries_envelope(v, blob) for v in obj)
    return False


def _multi_block_blob() -> str:
    """``["detail", 7]`` written as two one-item array blocks: valid (decoders MUST accept several blocks,
    §13.2) but not what a single-block encoder writes, so a server that re-encodes changes the bytes."""
    header = encode_value(None)[:10]  # magic + fingerprint
    datum = bytes([0x0C, 0x02, 0x0A, 0x0C]) + b"detail" + bytes([0x02, 0x04, 0x0E, 0x00])
    return base64.b64encode(header + datum).decode("ascii")


# -- scheduling, completing, heartbeats (invariants 52, 54, 58, 59) -----------------------------------------


@check("ACTIVITY-SCHEDULED-LEASABLE")
async def activity_scheduled_is_leasable(ctx: CheckContext) -> None:
    """schedule_activity yields a leasable task: attempt 1, both ids, and the scheduled arguments."""
    args = ctx.envelope(["conformance", 42, {"k": [True, None]}])
    run = await schedule_activities(ctx, arguments=args)
    task = await lease_activity(ctx, run)
    ctx.require(
        task.get("workflow_id") == run.workflow_id and task.get("run_id") == run.run_id,
        "the activity task belongs to the run that scheduled it",
        expected=f"{run.workflow_id} / {run.run_id}",
        received=f"{task.get('workflow_id')} / {task.get('run_id')}",
        requirement=SCHEDULED,
    )
    ctx.require_equal(
        task.get("attempt_number"), 1, "the first lease of an activity is attempt_number 1", requirement=SCHEDULED
    )
    for key in ("activity_attempt_id", "activity_execution_id"):
        value = task.get(key)
        ctx.require(
            isinstance(value, str) and bool(value),
            f"the leased activity carries a non-empty {key}",
            expected="a non-empty string",
            received=repr(value),
            requirement=SCHEDULED,
        )
    got = task.get("arguments")
    ctx.require(
        isinstance(got, dict) and got.get("codec") == args["codec"] and got.get("blob") == args["blob"],
        "the activity's arguments are the envelope that was scheduled, byte for byte",
        expected=args,
        received=got,
        requirement=SCHEDULED,
    )


@check("ACTIVITY-COMPLETE-RECORDED", "ACTIVITY-DUPLICATE-COMPLETE-STALE")
async def activity_complete_recorded_once(ctx: CheckContext) -> None:
    """Complete is 200 recorded:true; a duplicate is 409 stale_attempt recorded:false; 1 ActivityCompleted."""
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    result = {"result": ctx.envelope({"answer": 42})}
    ctx.expect(
        await activity_call(ctx, task, "complete", result),
        200,
        what="activity complete by the owner",
        requirement="ACTIVITY-COMPLETE-RECORDED",
        fields={"recorded": True},
    )
    ctx.expect(
        await activity_call(ctx, task, "complete", result),
        409,
        "stale_attempt",
        what="a duplicate activity complete",
        requirement="ACTIVITY-DUPLICATE-COMPLETE-STALE",
        fields={"recorded": False},
    )
    done = history_events(
        await ctx.history(run.workflow_id, run.run_id), "ActivityCompleted", task.get("activity_execution_id")
    )
    ctx.require_equal(
        len(done),
        1,
        "history holds exactly one ActivityCompleted after a duplicate complete",
        requirement="ACTIVITY-DUPLICATE-COMPLETE-STALE",
    )


@check("ACTIVITY-FAILURE-DETAILS-UNCHANGED")
async def activity_failure_details_unchanged(ctx: CheckContext) -> None:
    """failure.details comes back byte for byte (blob and codec) in ActivityFailed."""
    req = "ACTIVITY-FAILURE-DETAILS-UNCHANGED"
    details = {"codec": "avro", "blob": _multi_block_blob()}
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    reply = await activity_call(
        ctx,
        task,
        "fail",
        {
            "failure": {
                "message": "conformance failure with details",
                "type": "Conformance.Detailed",
                "details": details,
            }
        },
    )
    ctx.expect(reply, 200, what="activity fail with failure.details")
    failed = history_events(
        await ctx.history(run.workflow_id, run.run_id), "ActivityFailed", task.get("activity_execution_id")
    )
    if any(_carries_envelope(_payload(e), details["blob"]) for e in failed):
        return
    # §16 invariant 58 also accepts the resumed workflow's history as the place the details show up.
    resume = await lease_resume(ctx, run, requirement=req, why="a final activity failure resumes the workflow")
    in_task = [
        e for e in resume.get("history_events") or [] if isinstance(e, dict) and e.get("event_type") == "ActivityFailed"
    ]
    ctx.require(
        any(_carries_envelope(e, details["blob"]) for e in in_task),
        "the ActivityFailed event exposes the failure.details blob unchanged, with codec avro",
        expected=details,
        received=[_payload(e) for e in failed] or "no ActivityFailed event",
    )


CONTRACT = "ACTIVITY-FAILURE-CONTRACT"
# A stack trace as a runtime puts it: diagnostics only, so none of its text belongs in a contract field.
STACK_MARK = "conformance-frame-7f3a"
STACK_TRACE = f'Traceback (most recent call last):\n  File "conformance/act.py", line 7, in {STACK_MARK}\nFatal'
# The failure_category values of the contract.
CATEGORIES = (
    "application",
    "cancelled",
    "terminated",
    "timeout",
    "activity",
    "child_workflow",
    "task_failure",
    "internal",
    "structural_limit",
)


def _require_contract(
    ctx: CheckContext, where: str, events: list[dict[str, Any]], expected: dict[str, Any], details: dict[str, str]
) -> None:
    """One ActivityFailed in ``events`` whose contract fields are ``expected``, ``details`` unchanged, and no field of
    the contract carrying the stack trace."""
    ctx.require(
        len(events) == 1,
        f"{where} holds the final failure's ActivityFailed once",
        expected="one ActivityFailed",
        received=len(events),
        requirement=CONTRACT,
    )
    got = _payload(events[0])
    contract = {k: got.get(k) for k in expected}
    ctx.require(
        contract == expected and got.get("failure_category") in CATEGORIES,
        f"ActivityFailed in {where} carries the failure contract as the worker reported it, non_retryable the "
        "effective flag (the failure's type is listed in non_retryable_error_types)",
        expected={**expected, "failure_category": f"one of {', '.join(CATEGORIES)}"},
        received={**contract, "failure_category": got.get("failure_category")},
        requirement=CONTRACT,
    )
    ctx.require(
        _carries_envelope(got.get("details"), details["blob"]),
        f"ActivityFailed in {where} carries details with its codec",
        expected=details,
        received=got.get("details"),
        requirement=CONTRACT,
    )
    leaked = [k for k in (*expected, "failure_category", "details") if STACK_MARK in str(got.get(k))]
    ctx.require(
        not leaked,
        f"the stack trace is diagnostics only: no contract field of ActivityFailed in {where} carries it",
        expected="no stack trace in " + ", ".join((*expected, "failure_category", "details")),
        received={k: got.get(k) for k in leaked},
        requirement=CONTRACT,
    )


@check(CONTRACT)
async def activity_failure_contract(ctx: CheckContext) -> None:
    """A failure made final by its type (the worker's flag false), with a class, a code, details and a stack trace:
    ActivityFailed, in the control-plane history and in the history of the workflow task it resumes, carries
    activity_type, exception_type, message and code as given, non_retryable true, the details, and the stack trace
    in none of them."""
    details = ctx.envelope({"order": 7, "reason": "declined"})
    policy = {"max_attempts": 3, "backoff_seconds": [0], "non_retryable_error_types": ["Conformance.Fatal"]}
    run = await schedule_activities(ctx, retry_policy=policy, requirement=CONTRACT)
    task = await lease_activity(ctx, run, requirement=CONTRACT)
    failure = {
        "message": "conformance contract failure",
        "type": "Conformance.Fatal",
        "class": "ConformanceFatalError",
        "code": 42,
        "stack_trace": STACK_TRACE,
        "non_retryable": False,
        "details": details,
    }
    reply = await activity_call(ctx, task, "fail", {"failure": failure})
    ctx.expect(reply, 200, what="activity fail with the whole failure contract", requirement=CONTRACT)
    resume = await lease_resume(ctx, run, requirement=CONTRACT, why="a final activity failure resumes the workflow")
    expected = {
        "activity_type": ACTIVITY_TYPE,
        "exception_type": "Conformance.Fatal",
        "message": failure["message"],
        "code": 42,
        "non_retryable": True,
    }
    execution = task.get("activity_execution_id")
    recorded = history_events(await ctx.history(run.workflow_id, run.run_id), "ActivityFailed", execution)
    _require_contract(ctx, "the control-plane history", recorded, expected, details)
    shown = [e for e in resume.get("history_events") or [] if isinstance(e, dict)]
    _require_contract(
        ctx,
        "the resumed workflow task's history",
        history_events(shown, "ActivityFailed", execution),
        expected,
        details,
    )


@check("ACTIVITY-HEARTBEAT-RENEWS")
async def activity_heartbeat_renews(ctx: CheckContext) -> None:
    """A heartbeat by the owner is 200 can_continue:true, and lease_expires_at never moves backwards."""
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    previous = parse_rfc3339(task.get("lease_expires_at"))
    for n in (1, 2):
        reply = await activity_call(ctx, task, "heartbeat", {"message": f"beat {n}", "current": n, "total": 2})
        body = ctx.expect(reply, 200, what="activity heartbeat by the owner", fields={"can_continue": True})
        previous = ctx.renewed_lease(body, reply, previous)


@check("ACTIVITY-HEARTBEAT-STOP-200")
async def activity_heartbeat_stop_is_200(ctx: CheckContext) -> None:
    """A heartbeat for an attempt that cannot continue is 200 can_continue:false with a reason; only an
    unknown attempt is 404 attempt_not_found."""
    req = "ACTIVITY-HEARTBEAT-STOP-200"
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 2, "backoff_seconds": [0]})
    first = await lease_activity(ctx, run)
    ctx.expect(
        await activity_call(ctx, first, "fail", {"failure": {"message": "retry me"}}),
        200,
        what="activity fail (a retry follows)",
    )
    second = await lease_activity(ctx, run, requirement=req)
    ctx.expect(
        await activity_call(ctx, second, "complete", {"result": ctx.envelope("ok")}), 200, what="activity complete"
    )
    for task, state in ((first, "failed"), (second, "completed")):
        reply = await activity_call(ctx, task, "heartbeat", {"message": "still there?"})
        body = ctx.expect(reply, 200, what=f"heartbeat of a {state} attempt")
        problems = []
        if body.get("can_continue") is not False:
            problems.append(f"can_continue={body.get('can_continue')!r}")
        if body.get("heartbeat_recorded") is not False:
            problems.append(f"heartbeat_recorded={body.get('heartbeat_recorded')!r}")
        if not isinstance(body.get("reason"), str) or not body.get("reason"):
            problems.append(f"reason={body.get('reason')!r}")
        ctx.require(
            not problems,
            f"the heartbeat of a {state} attempt says it cannot continue",
            expected="can_continue:false, heartbeat_recorded:false, a reason",
            received=problems,
            replies=[reply],
        )
    reply = await activity_call(ctx, second, "heartbeat", attempt_id=ctx.uid("no-such-attempt"))
    ctx.expect(reply, 404, "attempt_not_found", what="heartbeat of an unknown attempt")


# -- fencing (invariant 53) ----------------------------------------------------------------------------------


STATUS = "ACTIVITY-STATUS-VERB"


async def _status(ctx: CheckContext, task: dict[str, Any], what: str) -> tuple[Reply, dict[str, Any]]:
    reply = await activity_call(ctx, task, "status", {})
    if reply.status == 404 and reply.json().get("reason") == "route_not_found":
        raise Unimplemented(
            "activity status verb",
            "the target does not serve the optional activity status verb (POST …/activity-tasks/{task_id}/status "
            "answers 404 route_not_found)",
        )
    return reply, ctx.expect(reply, 200, what=what, requirement=STATUS)


@check(STATUS)
async def activity_status_verb(ctx: CheckContext) -> None:
    """Where the status verb is served: a second after the claim it says the attempt can continue, recorded no
    heartbeat and left lease_expires_at where the claim put it (no ActivityHeartbeatRecorded); after the run is
    cancelled it says cancel_requested true, can_continue false."""
    run = await schedule_activities(ctx, requirement=STATUS)
    task = await lease_activity(ctx, run, requirement=STATUS)
    await ctx.wait(1)  # a renewal now would move the lease by a second
    reply, body = await _status(ctx, task, "activity status of a live attempt")
    want = {"can_continue": True, "cancel_requested": False, "heartbeat_recorded": False}
    got = {k: body.get(k) for k in want}
    ctx.require(got == want, "status of a live attempt", expected=want, received=got, replies=[reply])
    try:
        same = parse_rfc3339(body.get("lease_expires_at")) == parse_rfc3339(task.get("lease_expires_at"))
    except ValueError:
        same = False
    ctx.require(
        same,
        "the status verb does not renew the lease",
        expected=f"lease_expires_at {task.get('lease_expires_at')} (as leased)",
        received=body.get("lease_expires_at"),
        replies=[reply],
    )
    history = await ctx.history(run.workflow_id, run.run_id)
    beats = history_events(history, "ActivityHeartbeatRecorded", task.get("activity_execution_id"))
    ctx.require(
        not beats, "the status verb records no heartbeat", expected="no ActivityHeartbeatRecorded", received=beats
    )
    ctx.expect(await ctx.client.control("POST", f"/workflows/{run.workflow_id}/cancel", {}), 200, what="cancel")
    reply, body = await _status(ctx, task, "activity status after the run was cancelled")
    want = {"can_continue": False, "cancel_requested": True}
    got = {k: body.get(k) for k in want}
    ctx.require(got == want, "status reports the run's cancellation", expected=want, received=got, replies=[reply])


@check("ACTIVITY-FENCE-OWNER")
async def activity_wrong_owner_fenced(ctx: CheckContext) -> None:
    """Complete, fail and heartbeat by a non-owner are 409 lease_owner_mismatch; the owner still wins."""
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    intruder = ctx.uid("intruder")
    for verb, stolen in (
        ("complete", {"result": ctx.envelope("stolen")}),
        ("fail", {"failure": {"message": "stolen"}}),
        ("heartbeat", {}),
    ):
        reply = await activity_call(ctx, task, verb, stolen, owner=intruder)
        ctx.expect(reply, 409, "lease_owner_mismatch", what=f"activity {verb} by a worker that is not the owner")
    reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("mine")})
    ctx.expect(reply, 200, what="the owner's complete after the fenced attempts", fields={"recorded": True})


@check("ACTIVITY-ATTEMPT-NOT-FOUND")
async def activity_unknown_attempt_not_found(ctx: CheckContext) -> None:
    """Complete or fail with an unknown activity_attempt_id on a real task is 404 attempt_not_found."""
    run = await schedule_activities(ctx)
    task = await lease_activity(ctx, run)
    for verb, body in (("complete", {"result": ctx.envelope("x")}), ("fail", {"failure": {"message": "x"}})):
        reply = await activity_call(ctx, task, verb, body, attempt_id=ctx.uid("no-such-attempt"))
        ctx.expect(reply, 404, "attempt_not_found", what=f"activity {verb} with an unknown attempt id")


@check("ACTIVITY-TASK-MISMATCH")
async def activity_attempt_of_other_task(ctx: CheckContext) -> None:
    """An attempt id of one activity task sent under another task's id is 409 task_mismatch."""
    run = await schedule_activities(ctx, count=2)
    a = await lease_activity(ctx, run)
    b = await lease_activity(ctx, run)
    ctx.require(
        a.get("task_id") != b.get("task_id"),
        "two scheduled activities are two tasks",
        expected="distinct task ids",
        received=a.get("task_id"),
        requirement=SCHEDULED,
    )
    for verb, body in (("complete", {"result": ctx.envelope("x")}), ("fail", {"failure": {"message": "x"}})):
        reply = await activity_call(ctx, a, verb, body, attempt_id=b.get("activity_attempt_id"))
        ctx.expect(reply, 409, "task_mismatch", what=f"activity {verb} of task A with task B's attempt")
    for task in (a, b):
        reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("ok")})
        ctx.expect(reply, 200, what="the owner's complete after the mismatched calls")


# -- retries (invariants 55-57, §11.6, §14.2) ----------------------------------------------------------------


async def _fail(ctx: CheckContext, task: dict[str, Any], requirement: str, **failure: Any) -> datetime:
    """Fail the attempt; return when the answer arrived (on ``ctx.now()``)."""
    reply = await activity_call(ctx, task, "fail", {"failure": {"message": "conformance failure", **failure}})
    ctx.expect(reply, 200, what=f"fail of attempt {task.get('attempt_number')}", requirement=requirement)
    return ctx.now()


def _terminal_outcomes(history: list[dict[str, Any]], execution: str) -> list[str]:
    kinds = ("ActivityCompleted", "ActivityFailed", "ActivityTimedOut", "ActivityCancelled")
    return [str(e.get("event_type")) for kind in kinds for e in history_events(history, kind, execution)]


def _require_backoff(ctx: CheckContext, gap: float, backoff: float, attempt: int, req: str) -> None:
    ctx.require(
        gap >= backoff - BACKOFF_TOLERANCE,
        f"attempt {attempt + 1} became leasable before the {backoff:g}s backoff after attempt {attempt} failed",
        expected=f">= {backoff - BACKOFF_TOLERANCE:g}s after the fail answer",
        received=f"leased {gap:.2f}s after it",
        requirement=req,
    )


def _require_lineage(ctx: CheckContext, tasks: list[dict[str, Any]], expected: list[int]) -> None:
    numbers = [t.get("attempt_number") for t in tasks]
    ctx.require_equal(
        numbers, expected, "retries are leased as attempts 1, 2, 3, … in order", requirement="RETRY-ATTEMPTS-CONTIGUOUS"
    )
    executions = {t.get("activity_execution_id") for t in tasks}
    ctx.require(
        len(executions) == 1,
        "every attempt of one activity has the same activity_execution_id",
        expected="one id",
        received=sorted(map(str, executions)),
        requirement="RETRY-EXECUTION-ID-STABLE",
    )
    attempts = [t.get("activity_attempt_id") for t in tasks]
    ctx.require(
        len(set(attempts)) == len(attempts) and all(attempts),
        "every lease has a new activity_attempt_id",
        expected="distinct ids",
        received=attempts,
        requirement="RETRY-ATTEMPT-ID-DISTINCT",
    )


@check(
    "RETRY-ATTEMPT-NUMBERS",
    "RETRY-EXECUTION-ID-STABLE",
    "RETRY-ATTEMPT-ID-DISTINCT",
    "ACTIVITY-RETRY-BACKOFF",
    "RETRY-RESUME-ONLY-FINAL",
    "RETRY-ONE-OUTCOME-PER-EXECUTION",
    "RETRY-ATTEMPTS-CONTIGUOUS",
)
async def retry_attempts_and_backoff(ctx: CheckContext) -> None:
    """max_attempts 3, backoff [2], two failures: attempts 1, 2, 3 of one execution, each ≥ 2 s after the
    previous failure, no workflow task in between, one outcome."""
    backoff = ctx.needs_short(2, "the retry backoff this check schedules")
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 3, "backoff_seconds": [2]})
    tasks = [await lease_activity(ctx, run)]
    for attempt in (1, 2):
        failed_at = await _fail(ctx, tasks[-1], "RETRY-ATTEMPT-NUMBERS")
        await expect_no_workflow_task(
            ctx,
            run,
            requirement="RETRY-RESUME-ONLY-FINAL",
            why=f"a retried failure of attempt {attempt} must not resume the workflow",
        )
        task, leased_at = await lease_activity_at(
            ctx, run, within=backoff + READY_WITHIN, requirement="RETRY-ATTEMPT-NUMBERS"
        )
        _require_backoff(ctx, (leased_at - failed_at).total_seconds(), backoff, attempt, "ACTIVITY-RETRY-BACKOFF")
        tasks.append(task)
    numbers = [t.get("attempt_number") for t in tasks]
    ctx.require_equal(
        numbers, [1, 2, 3], "two retried failures give leases numbered 1, 2, 3", requirement="RETRY-ATTEMPT-NUMBERS"
    )
    _require_lineage(ctx, tasks, [1, 2, 3])
    reply = await activity_call(ctx, tasks[-1], "complete", {"result": ctx.envelope("third time lucky")})
    ctx.expect(reply, 200, what="complete of attempt 3", requirement="RETRY-ONE-OUTCOME-PER-EXECUTION")
    history = await ctx.history(run.workflow_id, run.run_id)
    outcomes = _terminal_outcomes(history, str(tasks[0].get("activity_execution_id")))
    ctx.require_equal(
        outcomes,
        ["ActivityCompleted"],
        "one activity execution has exactly one terminal outcome",
        requirement="RETRY-ONE-OUTCOME-PER-EXECUTION",
    )


async def _final_failure_resumes(
    ctx: CheckContext, run: ActivityRun, execution: str, *, requirement: str, why: str, retries: int
) -> None:
    """After a final failure: no activity task, then the run's workflow task; one ActivityFailed."""
    await expect_no_activity(ctx, run, requirement=requirement, why=why)
    await lease_resume(
        ctx,
        run,
        requirement="RETRY-FINAL-RESUMES-WORKFLOW",
        why="after a final activity failure the next leasable task is the run's workflow task",
    )
    history = await ctx.history(run.workflow_id, run.run_id)
    outcomes = _terminal_outcomes(history, execution)
    ctx.require_equal(
        outcomes,
        ["ActivityFailed"],
        "a final failure records exactly one ActivityFailed",
        requirement="RETRY-ONE-OUTCOME-PER-EXECUTION",
    )
    scheduled = len(history_events(history, "ActivityRetryScheduled", execution))
    ctx.require(
        scheduled <= retries,
        "only the retried failures schedule retries",
        expected=f"at most {retries} ActivityRetryScheduled",
        received=scheduled,
        requirement=requirement,
    )


@check(
    "RETRY-FAILED-ATTEMPTS-BOUNDED",
    "RETRY-FINAL-RESUMES-WORKFLOW",
    "RETRY-ATTEMPTS-CONTIGUOUS",
    "RETRY-ONE-OUTCOME-PER-EXECUTION",
    "RETRY-RESUME-ONLY-FINAL",
)
async def retry_exhausted_is_final(ctx: CheckContext) -> None:
    """After max_attempts (3) failures nothing more is leasable, ActivityFailed is recorded once and the
    workflow resumes."""
    req = "RETRY-FAILED-ATTEMPTS-BOUNDED"
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 3, "backoff_seconds": [0]})
    tasks: list[dict[str, Any]] = []
    for attempt in (1, 2, 3):
        tasks.append(await lease_activity(ctx, run, requirement="RETRY-ATTEMPTS-CONTIGUOUS"))
        await _fail(ctx, tasks[-1], req)
        if attempt < 3:
            await expect_no_workflow_task(
                ctx,
                run,
                requirement="RETRY-RESUME-ONLY-FINAL",
                why=f"a retried failure of attempt {attempt} must not resume the workflow",
            )
    _require_lineage(ctx, tasks, [1, 2, 3])
    await _final_failure_resumes(
        ctx,
        run,
        str(tasks[0].get("activity_execution_id")),
        requirement=req,
        why="after max_attempts failures no further attempt is leasable",
        retries=2,
    )


async def _first_failure_is_final(
    ctx: CheckContext, req: str, why: str, policy: dict[str, Any] | None, **failure: Any
) -> None:
    """An activity scheduled with ``policy`` whose first attempt fails with ``failure``: never retried, and the
    workflow resumes."""
    run = await schedule_activities(ctx, retry_policy=policy)
    task = await lease_activity(ctx, run)
    await _fail(ctx, task, req, **failure)
    await _final_failure_resumes(ctx, run, str(task.get("activity_execution_id")), requirement=req, why=why, retries=0)


@check("RETRY-NON-RETRYABLE-FLAG", "RETRY-FINAL-RESUMES-WORKFLOW")
async def retry_non_retryable_flag(ctx: CheckContext) -> None:
    """failure.non_retryable:true ends the activity after attempt 1 of 5 and resumes the workflow."""
    await _first_failure_is_final(
        ctx,
        "RETRY-NON-RETRYABLE-FLAG",
        "a non_retryable failure is never retried",
        {"max_attempts": 5, "backoff_seconds": [0]},
        non_retryable=True,
        type="Conformance.Transient",
    )


@check("RETRY-NON-RETRYABLE-TYPE", "RETRY-FINAL-RESUMES-WORKFLOW")
async def retry_non_retryable_type(ctx: CheckContext) -> None:
    """A failure.type, or a failure.class, listed in non_retryable_error_types is final."""
    policy = {"max_attempts": 5, "backoff_seconds": [0], "non_retryable_error_types": ["Conformance.Fatal"]}
    for field, other in (("type", "class"), ("class", "type")):
        await _first_failure_is_final(
            ctx,
            "RETRY-NON-RETRYABLE-TYPE",
            f"a failure.{field} listed in non_retryable_error_types is never retried",
            policy,
            **{field: "Conformance.Fatal", other: "Conformance.Other"},
        )


@check("RETRY-DEFAULT-NONE", "RETRY-FINAL-RESUMES-WORKFLOW")
async def retry_default_none(ctx: CheckContext) -> None:
    """Without a retry_policy one failure is final."""
    await _first_failure_is_final(
        ctx, "RETRY-DEFAULT-NONE", "with no retry policy the first failure is final", None, type="Conformance.Transient"
    )


@check("RETRY-BACKOFF-SCHEDULE", "RETRY-ATTEMPTS-CONTIGUOUS")
async def retry_backoff_schedule(ctx: CheckContext) -> None:
    """backoff_seconds [1, 2] waits about 1 s, then 2 s, then 2 s again (the last value repeats)."""
    req = "RETRY-BACKOFF-SCHEDULE"
    schedule = [1, 2, 2]
    ctx.needs_short(max(schedule), "the retry backoff this check schedules")
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 4, "backoff_seconds": [1, 2]})
    tasks = [await lease_activity(ctx, run)]
    for attempt, backoff in enumerate(schedule, start=1):
        failed_at = await _fail(ctx, tasks[-1], req)
        task, leased_at = await lease_activity_at(ctx, run, within=backoff + READY_WITHIN, requirement=req)
        gap = (leased_at - failed_at).total_seconds()
        _require_backoff(ctx, gap, backoff, attempt, req)
        if attempt == 1:
            # ≈1 s, not the 2 s of the next entry: a server that ignores the schedule's order fails here.
            ctx.require(
                gap < schedule[1] - 0.1,
                "the first retry waits backoff_seconds[0] (1 s), not longer",
                expected=f"< {schedule[1] - 0.1:g}s",
                received=f"{gap:.2f}s",
                requirement=req,
            )
        tasks.append(task)
    _require_lineage(ctx, tasks, [1, 2, 3, 4])
    ids = [t.get("task_id") for t in tasks]
    ctx.require(
        len(set(ids)) == len(ids),
        "every retry is a new activity task (a new task_id)",
        expected="distinct task ids",
        received=ids,
        requirement=req,
    )
    ctx.expect(
        await activity_call(ctx, tasks[-1], "complete", {"result": ctx.envelope("done")}),
        200,
        what="complete of attempt 4",
        requirement=req,
    )
    retries = history_events(
        await ctx.history(run.workflow_id, run.run_id),
        "ActivityRetryScheduled",
        str(tasks[0].get("activity_execution_id")),
    )
    recorded = [_payload(e).get("retry_backoff_seconds") for e in retries]
    ctx.require_equal(
        recorded, schedule, "each retry records ActivityRetryScheduled with its retry_backoff_seconds", requirement=req
    )


# -- timeouts (§11.7) ----------------------------------------------------------------------------------------


async def _outlive(ctx: CheckContext, task: dict[str, Any], leased_at: datetime, seconds: float) -> None:
    """Wait until an attempt's ``seconds``-long timeout has certainly passed: the owner's heartbeat says it
    cannot continue, or a full second more than the timeout has elapsed since the lease arrived."""

    async def probe() -> bool | None:
        reply = await activity_call(ctx, task, "heartbeat", {})
        if reply.status != 200 or reply.json().get("can_continue") is False:
            return True
        return True if (ctx.now() - leased_at).total_seconds() >= seconds + 1.0 else None

    await ctx.wait_until(probe, timeout=seconds + READY_WITHIN, what="the start_to_close timeout", interval=0.2)


@check("TIMEOUT-LATE-COMPLETE-STALE")
async def timeout_late_complete_stale(ctx: CheckContext) -> None:
    """A complete after the attempt's start_to_close_timeout (1 s) passed is 409 stale_attempt."""
    ctx.needs_short(1, "the start_to_close_timeout this check schedules")
    run = await schedule_activities(ctx, options={"start_to_close_timeout": 1})
    task, leased_at = await lease_activity_at(ctx, run)
    await _outlive(ctx, task, leased_at, 1)
    reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("too late")})
    ctx.expect(reply, 409, "stale_attempt", what="activity complete after its start_to_close_timeout")


async def _timed_out(ctx: CheckContext, run: ActivityRun, execution: str, seconds: float, req: str) -> dict[str, Any]:
    """Drive polls until the run's history records ActivityTimedOut; a new activity lease meanwhile fails."""

    async def probe() -> dict[str, Any] | None:
        reply = await poll_activity(ctx, run.worker, run.queue)
        require_no_task(
            ctx, reply, what="activity-task poll", requirement=req, why="a terminal timeout leaves no further attempt"
        )
        found = history_events(await ctx.history(run.workflow_id, run.run_id), "ActivityTimedOut", execution)
        return found[0] if found else None

    return await attributed(
        ctx.wait_until(probe, timeout=seconds + READY_WITHIN, what="ActivityTimedOut in history", interval=0.2),
        req,
    )


@check("TIMEOUT-TIMED-OUT-EVENT")
async def timeout_records_timed_out(ctx: CheckContext) -> None:
    """With no retry left, a start_to_close timeout records ActivityTimedOut (failure_category timeout)
    and wakes the workflow."""
    req = "TIMEOUT-TIMED-OUT-EVENT"
    ctx.needs_short(1, "the start_to_close_timeout this check schedules")
    run = await schedule_activities(ctx, options={"start_to_close_timeout": 1})
    task = await lease_activity(ctx, run)
    event = await _timed_out(ctx, run, str(task.get("activity_execution_id")), 1, req)
    ctx.require_equal(
        _payload(event).get("failure_category"), "timeout", "ActivityTimedOut says failure_category timeout"
    )
    await lease_resume(ctx, run, requirement=req, why="a terminal activity timeout wakes the workflow")


def _require_retry(
    ctx: CheckContext, first: dict[str, Any], second: dict[str, Any], what: str, requirement: str
) -> None:
    """``second`` is the retry of ``first``, a timed-out attempt: attempt 2 of the same execution, on a new task
    (a lease expiry would redeliver the same task_id instead)."""
    ctx.require(
        second.get("attempt_number") == 2
        and second.get("activity_execution_id") == first.get("activity_execution_id")
        and second.get("task_id") != first.get("task_id"),
        f"{what}, a new task",
        expected=f"attempt 2 of {first.get('activity_execution_id')}, task_id != {first.get('task_id')}",
        received=task_summary(second),
        requirement=requirement,
    )


@check("TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL")
async def timeout_start_to_close_retries(ctx: CheckContext) -> None:
    """A start_to_close timeout with attempts left is retried: attempt 2 arrives as a new task."""
    req = "TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL"
    ctx.needs_short(1, "the start_to_close_timeout this check schedules")
    run = await schedule_activities(
        ctx, retry_policy={"max_attempts": 2, "backoff_seconds": [0]}, options={"start_to_close_timeout": 1}
    )
    first = await lease_activity(ctx, run)
    second = await lease_activity(ctx, run, within=1 + READY_WITHIN, requirement=req)
    _require_retry(
        ctx, first, second, "a timed-out attempt with attempts left is retried as attempt 2 of the same execution", req
    )


@check("TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL", "TIMEOUT-TIMED-OUT-EVENT")
async def timeout_schedule_to_close_terminal(ctx: CheckContext) -> None:
    """A schedule_to_close timeout is terminal even with attempts left: ActivityTimedOut, no retry."""
    req = "TIMEOUT-SCHEDULE-TO-CLOSE-TERMINAL"
    ctx.needs_short(2, "the schedule_to_close_timeout this check schedules")
    run = await schedule_activities(
        ctx,
        retry_policy={"max_attempts": 5, "backoff_seconds": [0]},
        options={"schedule_to_close_timeout": 2},
    )
    task = await lease_activity(ctx, run)
    execution = str(task.get("activity_execution_id"))
    event = await _timed_out(ctx, run, execution, 2, req)
    history = await ctx.history(run.workflow_id, run.run_id)
    # No attempt ever failed, so any retry in history was scheduled by the schedule_to_close expiry.
    retried = [_payload(e) for e in history_events(history, "ActivityRetryScheduled", execution)]
    outcomes = _terminal_outcomes(history, execution)
    ctx.require(
        not retried and outcomes == ["ActivityTimedOut"],
        "a schedule_to_close expiry schedules no retry and records one ActivityTimedOut",
        expected="no ActivityRetryScheduled, one ActivityTimedOut",
        received=f"ActivityRetryScheduled {retried}, outcomes {outcomes}",
        requirement=req,
    )
    ctx.require_equal(
        _payload(event).get("failure_category"),
        "timeout",
        "ActivityTimedOut says failure_category timeout",
        requirement="TIMEOUT-TIMED-OUT-EVENT",
    )
    await lease_resume(
        ctx, run, requirement="TIMEOUT-TIMED-OUT-EVENT", why="a terminal activity timeout wakes the workflow"
    )


def _require_timeout_type(ctx: CheckContext, event: dict[str, Any], expected: str, req: str) -> None:
    """ActivityTimedOut says failure_category timeout, and names the timeout that fired where it names one."""
    got = _payload(event)
    ctx.require(
        got.get("failure_category") == "timeout" and got.get("timeout_type") in (None, expected),
        f"the {expected} expiry records ActivityTimedOut with failure_category timeout",
        expected={"failure_category": "timeout", "timeout_type": f"{expected} (or absent)"},
        received={k: got.get(k) for k in ("failure_category", "timeout_type")},
        requirement=req,
    )


async def _recorded_timeout(
    ctx: CheckContext, run: ActivityRun, execution: str | None, within: float
) -> dict[str, Any]:
    """The run's ActivityTimedOut, read from history alone (a poll could lease the very task being judged)."""

    async def probe() -> dict[str, Any] | None:
        found = history_events(await ctx.history(run.workflow_id, run.run_id), "ActivityTimedOut", execution)
        return found[0] if found else None

    return await ctx.wait_until(probe, timeout=within, what="ActivityTimedOut in history", interval=0.2)


HEARTBEAT = "TIMEOUT-HEARTBEAT-ENFORCED"


@check(HEARTBEAT)
async def timeout_heartbeat_enforced(ctx: CheckContext) -> None:
    """heartbeat_timeout 2 s, two attempts: attempt 1 outlives 2 s while it heartbeats every second, and once its
    heartbeats stop it is timed out and retried as a new task; attempt 2, never heartbeating, ends in
    ActivityTimedOut and wakes the workflow."""
    gap = ctx.needs_short(2, "the heartbeat_timeout this check schedules")
    run = await schedule_activities(
        ctx,
        retry_policy={"max_attempts": 2, "backoff_seconds": [0]},
        options={"heartbeat_timeout": 2, "start_to_close_timeout": 600},
        requirement=HEARTBEAT,
    )
    sent = ctx.now()  # before the claim: the server's gap until each heartbeat is at most ctx.now() - sent
    first = await lease_activity(ctx, run, requirement=HEARTBEAT)
    for beat in (1, 2, 3):  # 3 s in all, each gap 1 s: past the timeout measured from the claim, never past a gap
        await ctx.wait(gap / 2)
        before = ctx.now()
        reply = await activity_call(ctx, first, "heartbeat", {"message": f"beat {beat}"})
        body = ctx.expect(reply, 200, what=f"heartbeat {beat} of attempt 1", requirement=HEARTBEAT)
        if body.get("can_continue") is not True:  # a delayed heartbeat (a loaded machine) is no evidence
            still_within(ctx, sent, gap, f"attempt 1's heartbeat_timeout before heartbeat {beat}")
        sent = before
        ctx.require(
            body.get("can_continue") is True,
            f"an attempt that heartbeats within heartbeat_timeout ({gap:g} s) keeps running ({beat} s after its claim)",
            expected="can_continue: true",
            received={k: body.get(k) for k in ("can_continue", "reason")},
            replies=[reply],
            requirement=HEARTBEAT,
        )
    # The heartbeats stop: within the gap (and the time a server takes to notice), attempt 2 arrives as a retry,
    # a new task. A lease expiry would redeliver the same task_id instead.
    second = await lease_activity(ctx, run, within=gap + READY_WITHIN, requirement=HEARTBEAT)
    _require_retry(
        ctx,
        first,
        second,
        "an attempt whose heartbeats stopped is timed out and retried as attempt 2 of its execution",
        HEARTBEAT,
    )
    reply = await activity_call(ctx, first, "heartbeat", {"message": "too late"})
    ctx.require(
        reply.json().get("can_continue") is False,
        "the timed-out attempt 1 can no longer continue",
        expected="can_continue: false",
        received={"status": reply.status, "can_continue": reply.json().get("can_continue")},
        replies=[reply],
        requirement=HEARTBEAT,
    )
    execution = str(first.get("activity_execution_id"))
    event = await attributed(_recorded_timeout(ctx, run, execution, gap + READY_WITHIN), HEARTBEAT)
    _require_timeout_type(ctx, event, "heartbeat", HEARTBEAT)
    ctx.require_equal(
        _terminal_outcomes(await ctx.history(run.workflow_id, run.run_id), execution),
        ["ActivityTimedOut"],
        "the last attempt's heartbeat expiry ends the execution: one ActivityTimedOut",
        requirement=HEARTBEAT,
    )
    await lease_resume(ctx, run, requirement=HEARTBEAT, why="a terminal heartbeat timeout wakes the workflow")


START = "TIMEOUT-SCHEDULE-TO-START-ENFORCED"


@check(START)
async def timeout_schedule_to_start_enforced(ctx: CheckContext) -> None:
    """schedule_to_start_timeout 2 s on two runs: the activity left unclaimed is timed out (ActivityTimedOut, never
    leased, the workflow woken); the one claimed at once outlives the timeout and completes."""
    budget = ctx.needs_short(2, "the schedule_to_start_timeout this check schedules")
    options = {"schedule_to_start_timeout": 2}
    unclaimed = await schedule_activities(ctx, options=options, requirement=START)
    claimed = await schedule_activities(ctx, options=options, requirement=START)
    task = await lease_activity(ctx, claimed, requirement=START)
    for half in (1, 2):  # heartbeats keep the claimed attempt's lease, which may be shorter than the wait
        await ctx.wait((budget + 1) / 2)
        reply = await activity_call(ctx, task, "heartbeat", {"message": f"claimed in time, {half}"})
        body = ctx.expect(reply, 200, what="heartbeat of the activity claimed at once", requirement=START)
        ctx.require(
            body.get("can_continue") is True,
            "schedule_to_start ends at the claim: a claimed activity is not timed out by it",
            expected="can_continue: true",
            received={k: body.get(k) for k in ("can_continue", "reason")},
            replies=[reply],
            requirement=START,
        )
    event = await attributed(_recorded_timeout(ctx, unclaimed, None, READY_WITHIN), START)
    _require_timeout_type(ctx, event, "schedule_to_start", START)
    await expect_no_activity(
        ctx, unclaimed, requirement=START, why="an activity timed out before its claim is never leased"
    )
    await lease_resume(ctx, unclaimed, requirement=START, why="a schedule_to_start timeout wakes the workflow")
    reply = await activity_call(ctx, task, "complete", {"result": ctx.envelope("claimed in time")})
    ctx.expect(reply, 200, what=f"complete of an activity claimed at once, {budget + 1:g} s later", requirement=START)


WHOLE = "TIMEOUT-SCHEDULE-TO-CLOSE-WHOLE-EXECUTION"


@check(WHOLE)
async def timeout_schedule_to_close_spans_retries(ctx: CheckContext) -> None:
    """schedule_to_close_timeout 4 s, five attempts: attempt 1 fails 2 s after scheduling and attempt 2 is held;
    the execution times out 4 s after scheduling (ActivityTimedOut), not 4 s after the retry."""
    budget = ctx.needs_short(4, "the schedule_to_close_timeout this check schedules")
    run = await schedule_activities(
        ctx,
        retry_policy={"max_attempts": 5, "backoff_seconds": [0]},
        options={"schedule_to_close_timeout": 4},
        requirement=WHOLE,
    )
    scheduled_at = ctx.now()  # the scheduling answer arrived: the deadline is no later than this + 4 s
    first = await lease_activity(ctx, run, requirement=WHOLE)
    await ctx.wait(until=scheduled_at + timedelta(seconds=budget / 2))
    failed_at = await _fail(ctx, first, WHOLE)
    second = await lease_activity(ctx, run, requirement=WHOLE)
    ctx.require_equal(second.get("attempt_number"), 2, "the failure is retried as attempt 2", requirement=WHOLE)
    execution = str(first.get("activity_execution_id"))
    event = await attributed(_recorded_timeout(ctx, run, execution, budget + READY_WITHIN), WHOLE)
    seen = (ctx.now() - failed_at).total_seconds()
    # Midway between the two readings: the timeout due budget/2 after the fail, and one restarted by the retry,
    # due a whole budget after it.
    ctx.require(
        seen < budget * 3 / 4,
        "schedule_to_close runs from scheduling: a retry does not restart it",
        expected=f"ActivityTimedOut within {budget * 3 / 4:g} s of the retry (due {budget / 2:g} s after it)",
        received=f"seen {seen:.2f} s after the retry",
        requirement=WHOLE,
    )
    _require_timeout_type(ctx, event, "schedule_to_close", WHOLE)


ATTEMPTS = "RETRY-ATTEMPTS-CONTIGUOUS"


@check(ATTEMPTS)
async def retry_after_heartbeat_numbers_run_on(ctx: CheckContext) -> None:
    """An attempt that heartbeated and then failed is retried as attempt 2, and the retry's heartbeat is
    recorded as attempt 2: every event of an attempt carries its lease's number."""
    run = await schedule_activities(ctx, retry_policy={"max_attempts": 3, "backoff_seconds": [0]}, requirement=ATTEMPTS)
    accepted: list[Accepted] = []
    replies: list[Reply] = []
    for number in (1, 2):
        task = await lease_activity(ctx, run, requirement=ATTEMPTS)
        accepted.append(
            Accepted(
                Kind.ATTEMPT,
                str(task.get("activity_attempt_id")),
                scope=str(task.get("activity_execution_id")),
                number=int_or_none(task.get("attempt_number")),
            )
        )
        reply = await activity_call(ctx, task, "heartbeat", {"message": f"attempt {number} at work"})
        ctx.expect(reply, 200, what=f"the heartbeat of lease {number}")
        verb, body = (
            ("fail", {"failure": {"message": "retry me"}})
            if number == 1
            else ("complete", {"result": ctx.envelope("done")})
        )
        reply = await activity_call(ctx, task, verb, body)
        ctx.expect(reply, 200, what=f"the {verb} of lease {number}")
        replies.append(reply)
    events = await ctx.history(run.workflow_id, run.run_id)
    with judged_by_oracle(ctx, replies):
        judge_history(events, accepted)
