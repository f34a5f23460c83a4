"""Workflow-task commands, timers and the task payload shape (§8.2-§8.3, §8.7, §12.1; invariants 33-44): a batch
is validated whole and applied atomically, at most one terminal command, each command's effect on the run and
its history, and the fields a leased task carries.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import Any

import schemas
from suite.client import Reply
from suite.context import CheckContext
from suite.protocol.codec import (
    decode_blob,
    same_value,
)
from suite.protocol.errors import CodecError
from suite.protocol.oracle import Accepted, Kind
from suite.protocol.payloads import RESUME_CONTEXT_KEYS
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    ACTIVITY_TYPE,
    READY_WITHIN,
    LeasedRun,
    activity_call,
    activity_cmd,
    carrying,
    complete_bodies,
    judge_task_history,
    lease_wf,
    leased_activity,
    leased_run,
    next_activity,
    refused_without_effect,
    require_same_state,
    run_state,
    side_effect_cmd,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.COMMANDS, Area.PAYLOAD_SHAPE)


# Valid frames that no single-block encoder produces (§13.2: "Decoders MUST also accept multiple blocks and
# negative counts followed by a byte size"). A server that decodes and re-encodes a payload instead of storing
# the blob unchanged gives back different bytes for each of them.
_FRAME_HEADER = "c301e2a33dff55802237"


NON_CANONICAL_FRAMES: dict[str, str] = {
    name: base64.b64encode(bytes.fromhex(f"{_FRAME_HEADER} {datum}")).decode("ascii")
    for name, datum in {
        # [1, 2] as two blocks of one item each.
        "array_in_two_blocks": "0c 020402 020404 00",
        # [1, 2] as one block with count -2 and its byte size 4.
        "array_negative_count": "0c 03 08 04020404 00",
        # [{"a": 1, "b": 2}] with the map in two blocks of one entry each.
        "map_in_two_blocks": "0c 02 0e 02 026104 02 02 026204 04 00 00",
    }.items()
}


def _scope_judge(ctx: CheckContext, requirement: str) -> Callable[[Reply, str], None]:
    """A field-shape refusal: 422 validation_failed (or invalid_commands)."""

    def judge(reply: Reply, what: str) -> None:
        ctx.expect(reply, 422, ("validation_failed", "invalid_commands"), what=what, requirement=requirement)

    return judge


async def _commands_refused(
    ctx: CheckContext, run: LeasedRun, cases: Iterable[tuple[str, dict[str, Any]]], what: str, requirement: str
) -> None:
    """Each command, alone in a batch, is a 422 field-shape refusal that changes nothing."""
    bodies = complete_bodies((label, [command]) for label, command in cases)
    await refused_without_effect(ctx, run, bodies, _scope_judge(ctx, requirement), what, requirement)


def _marker(change_id: str, version: int = 1, lo: int = 1, hi: int = 1) -> dict[str, Any]:
    return {
        "type": "record_version_marker",
        "change_id": change_id,
        "version": version,
        "min_supported": lo,
        "max_supported": hi,
    }


def _expect_invalid_batch(
    ctx: CheckContext, reply: Reply, what: str, requirement: str, *, shape_error: bool = False
) -> None:
    """invalid_commands with 409 or 422 (§8.7); a field-shape error may also be 422 validation_failed."""
    if shape_error and reply.status == 422:
        ctx.expect(reply, 422, ("validation_failed", "invalid_commands"), what=what, requirement=requirement)
        return
    ctx.expect(reply, (409, 422), "invalid_commands", what=what, requirement=requirement)


@check("COMMANDS-NON-EMPTY")
async def commands_must_be_non_empty(ctx: CheckContext) -> None:
    """A complete with commands: [], without commands, or with a typeless command is 422 validation_failed."""
    run = await leased_run(ctx)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("commands: []", {"commands": []}),
        ("no commands member", {}),
        ("a command without type", {"commands": [{"result": ctx.envelope(1)}]}),
    ]

    def judge(reply: Reply, what: str) -> None:
        ctx.expect(reply, 422, "validation_failed", what=f"complete with {what}", requirement="COMMANDS-NON-EMPTY")

    await refused_without_effect(ctx, run, cases, judge, "an empty command batch", "COMMANDS-NON-EMPTY")


@check("COMMANDS-ONE-TERMINAL")
async def commands_at_most_one_terminal(ctx: CheckContext) -> None:
    """Two terminal commands in one batch are rejected with invalid_commands and the run is unchanged."""
    run = await leased_run(ctx)
    batches: list[list[dict[str, Any]]] = [
        [
            {"type": "complete_workflow", "result": ctx.envelope("a")},
            {"type": "fail_workflow", "message": "b"},
        ],
        [{"type": "complete_workflow"}, {"type": "complete_workflow"}],
        [side_effect_cmd(1), {"type": "continue_as_new"}, {"type": "complete_workflow"}],
    ]
    cases = complete_bodies((f"a batch of {[c['type'] for c in commands]}", commands) for commands in batches)

    def judge(reply: Reply, what: str) -> None:
        _expect_invalid_batch(ctx, reply, what, "COMMANDS-ONE-TERMINAL")

    await refused_without_effect(ctx, run, cases, judge, "a batch with two terminal commands", "COMMANDS-ONE-TERMINAL")


@check("COMMANDS-UNKNOWN-TYPE")
async def commands_unknown_type_rejects_batch(ctx: CheckContext) -> None:
    """An unknown command type makes the whole batch invalid_commands; its valid commands are not applied."""
    run = await leased_run(ctx)
    batches: list[list[dict[str, Any]]] = [
        [{"type": "conformance_no_such_command"}],
        [
            side_effect_cmd("kept?"),
            {"type": "start_timer", "delay_seconds": 3600},
            {"type": "conformance_another_unknown_type"},
        ],
    ]
    cases = complete_bodies((f"a batch with unknown type {commands[-1]['type']!r}", commands) for commands in batches)

    def judge(reply: Reply, what: str) -> None:
        _expect_invalid_batch(ctx, reply, what, "COMMANDS-UNKNOWN-TYPE")

    await refused_without_effect(
        ctx, run, cases, judge, "a batch with an unknown command type", "COMMANDS-UNKNOWN-TYPE"
    )


@check("COMMANDS-REQUIRED-FIELDS", "COMMANDS-RETRY-AFTER-REJECT")
async def commands_required_fields(ctx: CheckContext) -> None:
    """Each invariant-34 case (missing or out-of-range required field) is rejected and nothing is applied."""
    run = await leased_run(ctx)
    invalid: list[tuple[str, dict[str, Any]]] = [
        (
            "schedule_activity without activity_type",
            {"type": "schedule_activity", "arguments": ctx.envelope([])},
        ),
        ("start_timer with delay_seconds -1", {"type": "start_timer", "delay_seconds": -1}),
        ("fail_workflow without message", {"type": "fail_workflow"}),
        ("complete_update without update_id", {"type": "complete_update", "result": ctx.envelope(1)}),
        ("record_version_marker with version above max_supported", _marker("above", 3, 1, 2)),
        ("record_version_marker with version below min_supported", _marker("below", 1, 2, 3)),
    ]
    # A valid command first: the rejection must take the whole batch, not just the bad command.
    cases = complete_bodies((what, [side_effect_cmd(what), command]) for what, command in invalid)

    def judge(reply: Reply, what: str) -> None:
        _expect_invalid_batch(ctx, reply, what, "COMMANDS-REQUIRED-FIELDS", shape_error=True)

    await refused_without_effect(ctx, run, cases, judge, "a batch with an invalid command", "COMMANDS-REQUIRED-FIELDS")
    # §8.7: "The task stays leased, so the same owner can retry with a valid batch."
    reply = await ctx.complete(run.task, [side_effect_cmd("ok"), {"type": "complete_workflow"}])
    ctx.expect(
        reply,
        200,
        what="a valid batch from the same owner after six rejected ones",
        requirement="COMMANDS-RETRY-AFTER-REJECT",
    )
    desc = await ctx.describe(run.workflow_id)
    ctx.require(
        desc.get("status") == "completed",
        "the valid retry batch is applied",
        expected="status completed",
        received=desc.get("status"),
        requirement="COMMANDS-RETRY-AFTER-REJECT",
    )


@check("COMMANDS-RETRY-AFTER-REJECT")
async def commands_retry_after_reject(ctx: CheckContext) -> None:
    """After a rejected batch the task stays leased: the same owner and attempt then complete it once."""
    run = await leased_run(ctx)
    reply = await ctx.complete(run.task, [{"type": "complete_workflow"}, {"type": "conformance_no_such_command"}])
    _expect_invalid_batch(ctx, reply, "a batch with an unknown type", "COMMANDS-UNKNOWN-TYPE")
    retry = await ctx.complete(run.task, [{"type": "complete_workflow", "result": ctx.envelope("done")}])
    body = ctx.expect(retry, 200, what="the same owner's valid batch after a rejection")
    ctx.require(
        body.get("recorded") is not False and body.get("outcome", "completed") == "completed",
        "the retry batch is recorded",
        expected="outcome completed, recorded true",
        received={k: body.get(k) for k in ("outcome", "recorded")},
        replies=[retry],
    )
    events = await ctx.history(run.workflow_id, run.run_id)
    ctx.require_counts(events, {"WorkflowCompleted": 1}, "the retried batch closes the run exactly once")


@check("COMMANDS-ATOMIC")
async def commands_batch_is_atomic(ctx: CheckContext) -> None:
    """A batch whose last command is invalid applies none of its earlier valid commands; a valid batch applies
    its non-terminal commands in order, then the terminal one."""
    run = await leased_run(ctx)
    before = await run_state(ctx, run)
    prefix = [
        side_effect_cmd("first"),
        _marker("atomic-1"),
        {"type": "start_timer", "delay_seconds": 3600},
        {"type": "schedule_activity", "activity_type": "conformance.Atomic", "arguments": ctx.envelope([])},
    ]
    bad_tails: list[tuple[str, list[dict[str, Any]], bool]] = [
        ("an unknown type last", [{"type": "conformance_no_such_command"}], False),
        ("a negative timer last", [{"type": "start_timer", "delay_seconds": -1}], True),
        (
            "a second terminal command last",
            [{"type": "complete_workflow"}, {"type": "fail_workflow", "message": "x"}],
            False,
        ),
    ]
    replies = []
    for what, tail, shape in bad_tails:
        reply = await ctx.complete(run.task, [*prefix, *tail])
        _expect_invalid_batch(ctx, reply, f"a batch with {what}", "COMMANDS-ATOMIC", shape_error=shape)
        replies.append(reply)
    after = await run_state(ctx, run)
    applied = [t for _, t in after["history"][len(before["history"]) :]]
    ctx.require(
        not applied,
        "a rejected batch applies nothing, not even the valid commands before the bad one",
        expected="no new events",
        received=applied,
        replies=replies,
    )
    require_same_state(ctx, before, after, "a batch whose last command is invalid", replies, "COMMANDS-ATOMIC")
    # The valid batch, terminal command last; the non-terminal types read differently backwards, so a server
    # that reorders them (or applies the terminal command first) shows.
    good = [side_effect_cmd("one"), _marker("atomic-2"), _marker("atomic-3"), {"type": "complete_workflow"}]
    reply = await ctx.complete(run.task, good)
    ctx.expect(reply, 200, what="a valid batch")
    events = await ctx.history(run.workflow_id, run.run_id)
    new = [e.get("event_type") for e in events[len(before["history"]) :]]
    wanted = ["SideEffectRecorded", "VersionMarkerRecorded", "VersionMarkerRecorded", "WorkflowCompleted"]
    ctx.require(
        [t for t in new if t in set(wanted)] == wanted,
        "the non-terminal commands are applied in order, then the terminal command",
        expected=wanted,
        received=new,
        replies=[reply],
    )


@check("COMMANDS-FIELD-SCOPE")
async def commands_field_scope(ctx: CheckContext) -> None:
    """A field on a command that does not allow it (heartbeat_timeout on start_timer, retry_policy on
    complete_workflow, …) returns 422 and applies nothing."""
    run = await leased_run(ctx)
    cases: list[tuple[str, dict[str, Any]]] = [
        (
            "heartbeat_timeout on start_timer",
            {"type": "start_timer", "delay_seconds": 3600, "heartbeat_timeout": 5},
        ),
        (
            "retry_policy on complete_workflow",
            {"type": "complete_workflow", "retry_policy": {"max_attempts": 2}},
        ),
        (
            "retry_policy on start_timer",
            {"type": "start_timer", "delay_seconds": 3600, "retry_policy": {"max_attempts": 2}},
        ),
        ("start_to_close_timeout on record_side_effect", {**side_effect_cmd(1), "start_to_close_timeout": 5}),
        (
            "run_timeout_seconds on schedule_activity",
            {"type": "schedule_activity", "activity_type": "conformance.Scope", "run_timeout_seconds": 5},
        ),
        ("non_retryable on complete_workflow", {"type": "complete_workflow", "non_retryable": True}),
    ]
    await _commands_refused(ctx, run, cases, "a command with an out-of-scope field", "COMMANDS-FIELD-SCOPE")


@check("COMMANDS-TIMEOUT-ORDER")
async def commands_timeout_order(ctx: CheckContext) -> None:
    """schedule_activity with heartbeat > start_to_close, start_to_close > schedule_to_close or
    schedule_to_start > schedule_to_close is 422; equal timeouts are accepted."""
    run = await leased_run(ctx)

    def activity(**timeouts: int) -> dict[str, Any]:
        return {
            "type": "schedule_activity",
            "activity_type": "conformance.Timeouts",
            "arguments": ctx.envelope([]),
            **timeouts,
        }

    cases = [
        (
            "heartbeat_timeout > start_to_close_timeout",
            activity(heartbeat_timeout=10, start_to_close_timeout=5),
        ),
        (
            "start_to_close_timeout > schedule_to_close_timeout",
            activity(start_to_close_timeout=10, schedule_to_close_timeout=5),
        ),
        (
            "schedule_to_start_timeout > schedule_to_close_timeout",
            activity(schedule_to_start_timeout=10, schedule_to_close_timeout=5),
        ),
    ]
    await _commands_refused(ctx, run, cases, "a schedule_activity with misordered timeouts", "COMMANDS-TIMEOUT-ORDER")
    # "≤" allows equality: a server that rejects everything with timeouts would fail here.
    ok = activity(
        heartbeat_timeout=3600,
        start_to_close_timeout=3600,
        schedule_to_start_timeout=3600,
        schedule_to_close_timeout=3600,
    )
    reply = await ctx.complete(run.task, [ok])
    ctx.expect(
        reply,
        200,
        what="schedule_activity with equal timeouts (heartbeat = start_to_close = "
        "schedule_to_start = schedule_to_close)",
    )


@check("COMMANDS-COMPLETE-WORKFLOW", "PAYLOAD-RESULT-UNCHANGED")
async def complete_workflow_closes_run(ctx: CheckContext) -> None:
    """complete_workflow moves the run to completed with one WorkflowCompleted, and keeps the result blob."""
    run = await leased_run(ctx)
    result = ctx.envelope({"answer": 42, "bytes": b"\x00\xff"})
    reply = await ctx.complete(run.task, [{"type": "complete_workflow", "result": result}])
    ctx.expect(reply, 200, what="complete_workflow", requirement="COMMANDS-COMPLETE-WORKFLOW")
    desc = await ctx.describe(run.workflow_id)
    ctx.require(
        desc.get("status") == "completed" and desc.get("run_id") == run.run_id,
        "after complete_workflow the run is completed",
        expected="status completed",
        received=desc.get("status"),
        requirement="COMMANDS-COMPLETE-WORKFLOW",
    )
    events = await ctx.history(run.workflow_id, run.run_id)
    ctx.require_counts(
        events,
        {"WorkflowCompleted": 1},
        "complete_workflow records WorkflowCompleted once",
        "COMMANDS-COMPLETE-WORKFLOW",
    )
    got = (desc.get("output_envelope") or {}).get("blob") if isinstance(desc.get("output_envelope"), dict) else None
    ctx.require(
        got == result["blob"],
        "describe.output_envelope.blob is the completion's result blob, unchanged",
        expected=result["blob"],
        received=desc.get("output_envelope"),
        requirement="PAYLOAD-RESULT-UNCHANGED",
    )


@check("PAYLOAD-RESULT-UNCHANGED")
async def result_blob_not_reencoded(ctx: CheckContext) -> None:
    """Result blobs in alternate map orders and in multi-block framing come back in describe byte for byte."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    # A server that decodes and re-encodes the result changes the multi-block frames, and a sorting one
    # changes one of the two map orders.
    for blob in [*golden["alternate_map_orders"][0]["wire_base64"], *NON_CANONICAL_FRAMES.values()]:
        run = await leased_run(ctx)
        reply = await ctx.complete(run.task, [{"type": "complete_workflow", "result": {"codec": "avro", "blob": blob}}])
        ctx.expect(reply, 200, what="complete_workflow with a golden result")
        desc = await ctx.describe(run.workflow_id)
        env = desc.get("output_envelope")
        ctx.require(
            isinstance(env, dict) and env.get("blob") == blob and env.get("codec") == "avro",
            "describe.output_envelope is the result envelope byte for byte",
            expected={"codec": "avro", "blob": blob},
            received=env,
        )


@check("COMMANDS-FAIL-WORKFLOW")
async def fail_workflow_fails_run(ctx: CheckContext) -> None:
    """fail_workflow moves the run to failed with one WorkflowFailed."""
    run = await leased_run(ctx)
    reply = await ctx.complete(run.task, [{"type": "fail_workflow", "message": "conformance failure"}])
    ctx.expect(reply, 200, what="fail_workflow")
    desc = await ctx.describe(run.workflow_id)
    ctx.require_equal(desc.get("status"), "failed", "after fail_workflow the run is failed")
    events = await ctx.history(run.workflow_id, run.run_id)
    ctx.require_counts(
        events, {"WorkflowFailed": 1, "WorkflowCompleted": 0}, "fail_workflow records WorkflowFailed once"
    )


@check("COMMANDS-FAIL-WORKFLOW-EXCEPTION")
async def fail_workflow_with_exception(ctx: CheckContext) -> None:
    """fail_workflow with the optional exception object (protocol 1.10 on) is accepted and fails the run."""
    for version in (ctx.target.protocol_version, "1.10"):
        run = await leased_run(ctx)
        command = {
            "type": "fail_workflow",
            "message": "boom",
            "exception_type": "ValueError",
            "exception_class": "ValueError",
            "non_retryable": True,
            "exception": {
                "class": "ValueError",
                "type": "ValueError",
                "message": "boom",
                "details": {"attempt": 1},
            },
        }
        body = {
            "lease_owner": run.task.get("lease_owner"),
            "workflow_task_attempt": run.task.get("workflow_task_attempt"),
            "commands": [command],
        }
        reply = await ctx.client.worker(f"/workflow-tasks/{run.task['task_id']}/complete", body, version=version)
        ctx.expect(reply, 200, what=f"fail_workflow with an exception object at protocol {version}")
        desc = await ctx.describe(run.workflow_id)
        ctx.require_equal(desc.get("status"), "failed", "the run is failed")


@check("COMMANDS-FAIL-WORKFLOW-FAILURE")
async def fail_workflow_records_failure(ctx: CheckContext) -> None:
    """fail_workflow with exception_class, exception_type and non_retryable true: WorkflowFailed records each."""
    req = "COMMANDS-FAIL-WORKFLOW-FAILURE"
    run = await leased_run(ctx)
    failure = {
        "message": "conformance failure contract",
        "exception_class": "ConformanceFatalError",
        "exception_type": "Conformance.Fatal",
        "non_retryable": True,
    }
    ctx.expect(await ctx.complete(run.task, [{"type": "fail_workflow", **failure}]), 200, what="fail_workflow")
    failed = [e for e in await ctx.history(run.workflow_id, run.run_id) if e.get("event_type") == "WorkflowFailed"]
    ctx.require(
        len(failed) == 1 and carrying(failed[0].get("payload"), failure) is not None,
        "WorkflowFailed records fail_workflow's message, exception_class, exception_type and non_retryable as given",
        expected=failure,
        received=[e.get("payload") for e in failed] or "no WorkflowFailed",
        requirement=req,
    )


@check("COMMANDS-CONTINUE-AS-NEW")
async def continue_as_new_starts_next_run(ctx: CheckContext) -> None:
    """continue_as_new closes the run as completed (continued); describe shows a new run_id, run_number 2."""
    run = await leased_run(ctx, input=["first"])
    reply = await ctx.complete(run.task, [{"type": "continue_as_new", "arguments": ctx.envelope(["second"])}])
    ctx.expect(reply, 200, what="continue_as_new")
    desc = await ctx.describe(run.workflow_id)
    new_run = desc.get("run_id")
    ctx.require(
        isinstance(new_run, str)
        and new_run != run.run_id
        and desc.get("workflow_id") == run.workflow_id
        and desc.get("run_number") == 2,
        "describe shows the new run: a new run_id, the same workflow_id and run_number 2",
        expected=f"run_id != {run.run_id}, workflow_id {run.workflow_id}, run_number 2",
        received={k: desc.get(k) for k in ("workflow_id", "run_id", "run_number", "status")},
    )
    old = ctx.expect(
        await ctx.client.control("GET", f"/workflows/{run.workflow_id}/runs/{run.run_id}"),
        200,
        what="describe of the continued run",
    )
    ctx.require(
        old.get("status") == "completed" and old.get("closed_reason") == "continued",
        "the continued run is completed with closed_reason 'continued'",
        expected="completed / continued",
        received=(old.get("status"), old.get("closed_reason")),
    )
    events = await ctx.history(run.workflow_id, run.run_id)
    ctx.require_counts(events, {"WorkflowContinuedAsNew": 1}, "the continued run records WorkflowContinuedAsNew")
    task = await lease_wf(ctx, run.worker, run.queue)
    ctx.require(
        task.get("run_id") == new_run and task.get("workflow_id") == run.workflow_id,
        "the new run starts with a workflow task of its own",
        expected=f"a task of run {new_run}",
        received={k: task.get(k) for k in ("workflow_id", "run_id")},
    )


@check("COMMANDS-CONTINUE-AS-NEW-CARRIES")
async def continue_as_new_carries_type_and_arguments(ctx: CheckContext) -> None:
    """continue_as_new with workflow_type and arguments: the new run has that type, its task those arguments."""
    run = await leased_run(ctx, input=["first"])
    next_type, args = "conformance.Continued", ["second", 2]
    command = {"type": "continue_as_new", "workflow_type": next_type, "arguments": ctx.envelope(args)}
    ctx.expect(await ctx.complete(run.task, [command]), 200, what="continue_as_new with workflow_type and arguments")
    task = await lease_wf(ctx, run.worker, run.queue)
    desc = await ctx.describe(run.workflow_id)
    got = {"task": task.get("workflow_type"), "describe": desc.get("workflow_type")}
    ctx.require_equal(got, {"task": next_type, "describe": next_type}, "the new run has the workflow_type given")
    arguments = task.get("arguments")
    blob = arguments.get("blob") if isinstance(arguments, dict) else arguments
    ctx.require(
        task.get("run_id") != run.run_id and _decodes_to(blob, args),
        "the new run's first task carries the arguments continue_as_new gave",
        expected=repr(args),
        received=arguments,
    )


@check("COMMANDS-CREATED-TASK-IDS")
async def created_task_ids_name_tasks(ctx: CheckContext) -> None:
    """created_task_ids names the first workflow task of a child run and of a continue_as_new's run, not the run."""
    run = await leased_run(ctx)
    child_queue = ctx.uid("cq")
    child_worker = await ctx.register(child_queue)
    start = {"type": "start_child_workflow", "workflow_type": "conformance.Child", "queue": child_queue}
    reply = await ctx.complete(run.task, [start, {"type": "continue_as_new"}])
    created = ctx.expect(reply, 200, what="a batch of start_child_workflow and continue_as_new").get("created_task_ids")
    child = await lease_wf(ctx, child_worker, child_queue)
    following = await lease_wf(ctx, run.worker, run.queue)
    expected = [child.get("task_id"), following.get("task_id")]
    ctx.require(
        isinstance(created, list) and all(t in created for t in expected),
        "created_task_ids lists the child's first workflow task and the next run's, as the task_ids a poll leases",
        expected=expected,
        received={"created_task_ids": created, "runs": [child.get("run_id"), following.get("run_id")]},
        replies=[reply],
    )
    runs = [r for r in (child.get("run_id"), following.get("run_id")) if isinstance(created, list) and r in created]
    ctx.require(not runs, "created_task_ids lists tasks, never a run id", received=runs, replies=[reply])


@check("COMMANDS-UPSERT-SEARCH-ATTRIBUTES")
async def upsert_search_attributes_described(ctx: CheckContext) -> None:
    """A run started with {Region, Old} upserts {Tier, Tags, Old: null}: describe shows Region, Tier, Tags, no Old."""
    run = await leased_run(ctx, search_attributes={"Region": "eu", "Old": "x"})
    upsert = {"type": "upsert_search_attributes", "attributes": {"Tier": "gold", "Tags": ["a", "b"], "Old": None}}
    parked = {"type": "start_timer", "delay_seconds": 3600}
    ctx.expect(await ctx.complete(run.task, [upsert, parked]), 200, what="a batch with upsert_search_attributes")
    shown = (await ctx.describe(run.workflow_id)).get("search_attributes")
    attributes = shown if isinstance(shown, dict) else {}
    got = {k: attributes.get(k) for k in ("Region", "Tier", "Tags")} | {"Old present": "Old" in attributes}
    ctx.require_equal(
        got,
        {"Region": "eu", "Tier": "gold", "Tags": ["a", "b"], "Old present": False},
        "describe shows the upserted search attributes, without the key upserted null and with the others kept",
    )


@check("COMMANDS-NON-TERMINAL-WAITING")
async def non_terminal_batch_waits(ctx: CheckContext) -> None:
    """A batch of only non-terminal commands moves the run to waiting; created_task_ids is a list."""
    run = await leased_run(ctx)
    reply = await ctx.complete(run.task, [side_effect_cmd(1), {"type": "start_timer", "delay_seconds": 3600}])
    body = ctx.expect(reply, 200, what="a start_timer-only batch")
    ctx.require(
        isinstance(body.get("created_task_ids"), list),
        "the complete response carries created_task_ids[]",
        expected="a list",
        received=body.get("created_task_ids"),
        replies=[reply],
    )
    desc = await ctx.describe(run.workflow_id)
    ctx.require_equal(desc.get("status"), "waiting", "a run with only non-terminal commands applied is waiting")
    if "run_status" in body:
        ctx.require_equal(
            body.get("run_status"), "waiting", "the complete response's run_status is waiting", replies=[reply]
        )


@check("TIMER-FIRES", slow=True)
async def timer_fires_with_resume_context(ctx: CheckContext) -> None:
    """After start_timer{delay_seconds:1} a workflow task is leasable with the pure-timer resume context."""
    delay = 1
    ctx.needs_short(delay + 10, "a 1-second timer plus 10 s of slack")
    run = await leased_run(ctx)
    ctx.expect(await ctx.complete(run.task, [{"type": "start_timer", "delay_seconds": delay}]), 200, what="start_timer")
    task = await lease_wf(ctx, run.worker, run.queue, within=delay + 10)
    context = {
        k: task.get(k) for k in ("workflow_id", "workflow_wait_kind", "resume_source_kind", "timer_id", "open_wait_id")
    }
    timer_id = task.get("timer_id")
    ok = (
        task.get("workflow_id") == run.workflow_id
        and task.get("workflow_wait_kind") == "timer"
        and task.get("resume_source_kind") == "timer"
        and isinstance(timer_id, str)
        and bool(timer_id)
        and task.get("open_wait_id") == f"timer:{timer_id}"
    )
    ctx.require(
        ok,
        "the timer's task carries workflow_wait_kind 'timer', resume_source_kind 'timer', a timer_id "
        "and open_wait_id 'timer:' + timer_id",
        expected={
            "workflow_wait_kind": "timer",
            "resume_source_kind": "timer",
            "timer_id": "<id>",
            "open_wait_id": "timer:<id>",
        },
        received=context,
    )


@check("TIMER-NOT-EARLY", slow=True)
async def timer_not_leasable_early(ctx: CheckContext) -> None:
    """A 3-second timer's workflow task is not leasable before 3 s (0.5 s tolerance) after the complete."""
    delay, tolerance = 3, 0.5
    ctx.needs_short(delay + 10, "a 3-second timer plus 10 s of slack")
    run = await leased_run(ctx)
    reply = await ctx.complete(run.task, [{"type": "start_timer", "delay_seconds": delay}])
    # The timer was scheduled before this response left the server, so this instant is late, never early:
    # the time measured from it (on the target's clock, ctx.now()) can only understate how long the server held
    # the task back.
    scheduled = ctx.now()
    ctx.expect(reply, 200, what="start_timer")

    task = await lease_wf(ctx, run.worker, run.queue, within=delay + 10)
    message = f"the timer's workflow task must not be leasable before {delay} s"
    ctx.require_not_sooner(scheduled, delay, tolerance, message, "the start_timer complete")
    ctx.require_equal(task.get("workflow_id"), run.workflow_id, "the leased task belongs to the timer's run")


def _require_resume_keys(ctx: CheckContext, task: dict[str, Any], which: str) -> None:
    """``task`` (``which`` workflow task) carries all 20 resume-context keys, null where they do not apply."""
    missing = [k for k in RESUME_CONTEXT_KEYS if k not in task]
    ctx.require(
        not missing,
        f"{which} workflow task carries all 20 resume-context keys",
        expected="all 20 keys (null when they do not apply)",
        received=f"missing {missing}",
        requirement="PAYLOAD-RESUME-CONTEXT-KEYS",
    )


@check("PAYLOAD-RESUME-CONTEXT-KEYS", "PAYLOAD-RESUME-CONTEXT-NULL-ON-START", "PAYLOAD-CODEC-AVRO")
async def first_task_payload_shape(ctx: CheckContext) -> None:
    """The first task after start has payload_codec avro and all 20 resume-context keys, every one null."""
    run = await leased_run(ctx, input=["x"])
    task = run.task
    _require_resume_keys(ctx, task, "every leased")
    set_keys = {k: task[k] for k in RESUME_CONTEXT_KEYS if task[k] is not None}
    ctx.require(
        not set_keys,
        "on the first task after start every resume-context key is null",
        expected="all null",
        received=set_keys,
        requirement="PAYLOAD-RESUME-CONTEXT-NULL-ON-START",
    )
    ctx.require_equal(
        task.get("payload_codec"),
        "avro",
        "a leased workflow task has payload_codec 'avro'",
        requirement="PAYLOAD-CODEC-AVRO",
    )


@check("PAYLOAD-RESUME-CONTEXT-KEYS", "PAYLOAD-CODEC-AVRO")
async def resumed_task_payload_shape(ctx: CheckContext) -> None:
    """A task resumed by a timer (not the first task) also carries all 20 resume-context keys, codec avro."""
    run = await leased_run(ctx)
    ctx.expect(
        await ctx.complete(run.task, [{"type": "start_timer", "delay_seconds": 0}]),
        200,
        what="start_timer with delay 0",
        requirement="PAYLOAD-RESUME-CONTEXT-KEYS",
    )
    task = await lease_wf(ctx, run.worker, run.queue, within=15)
    _require_resume_keys(ctx, task, "a resumed")
    ctx.require_equal(
        task.get("payload_codec"),
        "avro",
        "a resumed workflow task has payload_codec 'avro'",
        requirement="PAYLOAD-CODEC-AVRO",
    )


# -- what woke a task: the resume context of a signal, an update and an activity's outcome ------------------


def _context(task: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: task.get(k) for k in keys}


def _named(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


@check("PAYLOAD-RESUME-CONTEXT-SIGNAL")
async def signal_wake_resume_context(ctx: CheckContext) -> None:
    """The task a signal wakes names the signal it applies: wait kind signal, the signal_name, a workflow_signal_id."""
    run = await leased_run(ctx)
    parked = [{"type": "start_timer", "delay_seconds": 3600}]
    ctx.expect(await ctx.complete(run.task, parked), 200, what="a batch that parks the run on a long timer")
    name = "conformance-wake"
    reply = await ctx.client.control("POST", f"/workflows/{run.workflow_id}/signal/{name}", {"input": ["x"]})
    ctx.expect(reply, 202, what="signal")
    task = await lease_wf(ctx, run.worker, run.queue)
    got = _context(task, "run_id", "workflow_wait_kind", "signal_name", "workflow_signal_id")
    ctx.require(
        got["run_id"] == run.run_id
        and got["workflow_wait_kind"] == "signal"
        and got["signal_name"] == name
        and _named(got["workflow_signal_id"]),
        "the task the signal woke carries workflow_wait_kind 'signal', its signal_name and its workflow_signal_id",
        expected={
            "run_id": run.run_id,
            "workflow_wait_kind": "signal",
            "signal_name": name,
            "workflow_signal_id": "<id>",
        },
        received=got,
        replies=[reply],
    )


@check("PAYLOAD-RESUME-CONTEXT-UPDATE")
async def update_wake_resume_context(ctx: CheckContext) -> None:
    """The task an accepted update wakes names the update: wait kind update, source workflow_update, its id twice."""
    run = await leased_run(ctx)
    parked = [{"type": "start_timer", "delay_seconds": 3600}]
    ctx.expect(await ctx.complete(run.task, parked), 200, what="a batch that parks the run on a long timer")
    reply = await ctx.client.control(
        "POST", f"/workflows/{run.workflow_id}/update/bump", {"input": [1], "wait_for": "accepted"}
    )
    answered = ctx.expect(reply, 202, what="update accepted")
    update_id = answered.get("update_id")
    if not _named(update_id):  # the answer may omit it; UpdateAccepted names it
        events = await ctx.history(run.workflow_id, run.run_id)
        accepted = [e.get("payload") or {} for e in events if e.get("event_type") == "UpdateAccepted"]
        update_id = next((p.get("update_id") for p in accepted if isinstance(p, dict)), None)
    task = await lease_wf(ctx, run.worker, run.queue)
    got = _context(task, "workflow_wait_kind", "resume_source_kind", "workflow_update_id", "open_wait_id")
    wanted_id = update_id if _named(update_id) else got["workflow_update_id"]
    expected = {
        "workflow_wait_kind": "update",
        "resume_source_kind": "workflow_update",
        "workflow_update_id": wanted_id,
        "open_wait_id": f"update:{wanted_id}",
    }
    ctx.require(
        got == expected and _named(wanted_id),
        "the task the update woke carries workflow_wait_kind 'update', resume_source_kind 'workflow_update', "
        "the update's workflow_update_id and open_wait_id 'update:' + that id",
        expected=expected,
        received=got,
        replies=[reply],
    )


@check("PAYLOAD-RESUME-CONTEXT-ACTIVITY")
async def activity_wake_resume_context(ctx: CheckContext) -> None:
    """The tasks an activity's completion and its final failure wake name the activity, its attempt and the event."""
    run = await leased_run(ctx)
    task = await leased_activity(ctx, run)
    outcomes: list[tuple[str, dict[str, Any]]] = [
        ("ActivityCompleted", {"result": ctx.envelope("done")}),
        ("ActivityFailed", {"failure": {"message": "final", "non_retryable": True}}),
    ]
    for event_type, body in outcomes:
        verb = "complete" if event_type == "ActivityCompleted" else "fail"
        ctx.expect(await activity_call(ctx, task, verb, body), 200, what=f"the activity's {verb}")
        woken = await lease_wf(ctx, run.worker, run.queue)
        got = _context(woken, "activity_attempt_id", "activity_type", "workflow_event_type", "activity_execution_id")
        sequence = woken.get("workflow_sequence")
        events = await ctx.history(run.workflow_id, run.run_id)
        at = [e.get("event_type") for e in events if e.get("sequence") == sequence]
        expected = {
            "activity_attempt_id": task.get("activity_attempt_id"),
            "activity_type": ACTIVITY_TYPE,
            "workflow_event_type": event_type,
        }
        ctx.require(
            {k: got[k] for k in expected} == expected and _named(got["activity_execution_id"]) and at == [event_type],
            f"the task the activity's {verb} woke carries its activity_execution_id, activity_attempt_id and "
            f"activity_type, and workflow_sequence and workflow_event_type naming the {event_type} event",
            expected={**expected, "activity_execution_id": "<id>", "event at workflow_sequence": [event_type]},
            received={**got, "workflow_sequence": sequence, "event at workflow_sequence": at},
        )
        if verb == "complete":
            again = {**activity_cmd(ACTIVITY_TYPE), "retry_policy": {"max_attempts": 1}}
            ctx.expect(await ctx.complete(woken, [again]), 200, what="schedule_activity of a second activity")
            task, _reply = await next_activity(ctx, run.worker, run.queue)


@check("PAYLOAD-ARGUMENTS-ENVELOPE")
async def arguments_envelope_decodes_to_inputs(ctx: CheckContext) -> None:
    """task.arguments is {codec:"avro", blob} decoding to the start's input array (null or [] for none)."""
    cases: list[tuple[Any, Any]] = [
        (["hello", 42], ["hello", 42]),
        ([{"k": [1, 2.5, None, True]}, "x", -7], [{"k": [1, 2.5, None, True]}, "x", -7]),
    ]
    for given, wanted in cases:
        run = await leased_run(ctx, input=given)
        args = run.task.get("arguments")
        ctx.require(
            isinstance(args, dict) and set(args) == {"codec", "blob"} and args.get("codec") == "avro",
            "task.arguments is an envelope with exactly codec 'avro' and blob",
            expected={"codec": "avro", "blob": "<base64>"},
            received=args,
        )
        assert isinstance(args, dict)
        try:
            decoded: Any = decode_blob(args["blob"])
        except CodecError as exc:
            raise ctx.fail(
                "task.arguments.blob does not decode with the golden-tested codec",
                expected="an Avro Value frame",
                received=f"{exc.code}: {exc}",
            ) from None
        ctx.require(
            same_value(decoded, wanted),
            "task.arguments decodes to the array of start inputs",
            expected=repr(wanted),
            received=repr(decoded),
        )
    run = await leased_run(ctx)
    args = run.task.get("arguments")
    if args is not None:
        ok = isinstance(args, dict) and args.get("codec") == "avro" and _decodes_to(args.get("blob"), [])
        ctx.require(
            ok,
            "a start without input gives arguments null or an envelope of []",
            expected="null or the envelope of []",
            received=args,
        )


def _decodes_to(blob: Any, wanted: Any) -> bool:
    try:
        return isinstance(blob, str) and same_value(decode_blob(blob), wanted)
    except CodecError:
        return False


@check("PAYLOAD-START-ENVELOPE-UNCHANGED")
async def start_envelope_returned_unchanged(ctx: CheckContext) -> None:
    """Each golden blob (and each multi-block frame) sent as a start's input envelope comes back as
    task.arguments.blob byte-identical."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    blobs = [(c["name"], c["wire_base64"]) for c in golden["cases"]]
    blobs += [(f"{g['name']}[{i}]", w) for g in golden["alternate_map_orders"] for i, w in enumerate(g["wire_base64"])]
    blobs += list(NON_CANONICAL_FRAMES.items())
    queue = ctx.uid("q")
    worker = await ctx.register(queue)
    for name, blob in blobs:
        wid, _ = await ctx.start(queue, input={"codec": "avro", "blob": blob})
        task = await lease_wf(ctx, worker, queue)
        args = task.get("arguments")
        ctx.require(
            task.get("workflow_id") == wid
            and isinstance(args, dict)
            and args.get("blob") == blob
            and args.get("codec") == "avro",
            f"case {name}: the start envelope comes back in task.arguments unchanged",
            expected={"codec": "avro", "blob": blob},
            received=args,
        )
        ctx.expect(await ctx.complete(task, [{"type": "complete_workflow"}]), 200, what="complete_workflow")


@check("PAYLOAD-ACTIVITY-ATTEMPT-ALIAS")
async def activity_task_attempt_alias(ctx: CheckContext) -> None:
    """A leased activity task also carries attempt, equal to attempt_number."""
    run = await leased_run(ctx)
    task = await leased_activity(ctx, run, activity_type="conformance.Alias")
    ctx.require(
        "attempt" in task and task.get("attempt") == task.get("attempt_number"),
        "the activity task carries attempt as an alias of attempt_number",
        expected=f"attempt == attempt_number ({task.get('attempt_number')})",
        received=task.get("attempt", "(absent)"),
    )


@check("COMMANDS-CONTINUE-AS-NEW")
async def continue_as_new_chain_names_each_run(ctx: CheckContext) -> None:
    """Down a chain of two continuations, the first task of each new run names that run (the one describe
    shows, run_number 2 then 3), and its history is read in full."""
    run = await leased_run(ctx, input=["run 1"])
    task = run.task
    for number in (2, 3):
        command = {"type": "continue_as_new", "arguments": ctx.envelope([f"run {number}"])}
        ctx.expect(await ctx.complete(task, [command]), 200, what=f"continue_as_new into run {number}")
        desc = await ctx.describe(run.workflow_id)
        ctx.require_equal(desc.get("run_number"), number, f"describe shows run {number} of the chain")
        task = await lease_wf(ctx, run.worker, run.queue, within=READY_WITHIN)
        ctx.require_equal(
            (task.get("workflow_id"), task.get("run_id")),
            (run.workflow_id, desc.get("run_id")),
            f"the first task after continuation {number - 1} names the new run {number}",
        )
        await judge_task_history(ctx, task, [Accepted(Kind.START)], inline=None, page_size=1000)
