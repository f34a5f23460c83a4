"""The payload codec (§13; invariants 65, 66): the golden vectors decoded and re-encoded byte for byte, the
schema fingerprint, malformed frames and non-Avro envelopes refused before anything is decoded or stored.
"""

from __future__ import annotations

from typing import Any

import schemas
from suite.client import Reply
from suite.context import CheckContext
from suite.protocol.codec import (
    FINGERPRINT,
    GOLDEN_IMPLICIT_VALUES,
    decode_blob,
    encode_blob,
    encode_value,
    golden_value,
    same_value,
)
from suite.protocol.errors import CodecError
from suite.protocol.requirements import Area
from suite.registry import check
from suite.worlds import (
    complete_bodies,
    leased_activity,
    leased_run,
    refused_without_effect,
    side_effect_cmd,
)

# The registry's areas whose checks live here (tests/architecture/test_check_areas.py).
AREAS = (Area.CODEC,)


_UNSUPPORTED_CODEC = "unsupported_payload_codec"


def _mentions(body: Any, needle: str) -> bool:
    """Whether any string in the error body's errors/message fields contains ``needle``."""
    if isinstance(body, str):
        return needle in body
    if isinstance(body, dict):
        return any(_mentions(v, needle) for v in body.values())
    if isinstance(body, list):
        return any(_mentions(v, needle) for v in body)
    return False


def _codec_error_named(ctx: CheckContext, reply: Reply, what: str, requirement: str) -> None:
    body = reply.json()
    fields = {k: body.get(k) for k in ("errors", "validation_errors", "command_errors", "message", "error")}
    ctx.require(
        _mentions(fields, _UNSUPPORTED_CODEC + ":"),
        f"{what}: the 422 names the problem with a message beginning '{_UNSUPPORTED_CODEC}:'",
        expected=f"an error message '{_UNSUPPORTED_CODEC}: …'",
        received=fields,
        replies=[reply],
        requirement=requirement,
    )


@check("CODEC-GOLDEN-DECODE")
async def codec_decodes_golden_cases(ctx: CheckContext) -> None:
    """The suite's codec decodes all 16 golden cases (and both alternate map orders) to their values."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    cases = [(c["name"], c["wire_base64"], golden_value(c)) for c in golden["cases"]]
    cases += [
        (g["name"], w, GOLDEN_IMPLICIT_VALUES[g["name"]])
        for g in golden["alternate_map_orders"]
        for w in g["wire_base64"]
    ]
    ctx.require_equal(len(golden["cases"]), 16, "the golden file has 16 valid cases")
    for name, wire, wanted in cases:
        try:
            got: Any = decode_blob(wire)
        except CodecError as exc:
            raise ctx.fail(f"golden case {name} does not decode", expected=repr(wanted), received=str(exc)) from None
        ctx.require(
            same_value(got, wanted),
            f"golden case {name} decodes to its listed value",
            expected=repr(wanted),
            received=repr(got),
        )


@check("CODEC-GOLDEN-ROUNDTRIP")
async def codec_reencodes_golden_bytes(ctx: CheckContext) -> None:
    """Re-encoding each golden case's value reproduces its bytes."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    for case in golden["cases"]:
        wanted = case["wire_base64"]
        got = encode_blob(golden_value(case))
        ctx.require_equal(got, wanted, f"golden case {case['name']} re-encodes byte for byte")


@check("CODEC-MALFORMED-REJECTED")
async def codec_rejects_malformed_frames(ctx: CheckContext) -> None:
    """All 18 malformed golden frames fail with the listed error (17 framing, 1 schema)."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    frames = golden["malformed_frames"]
    ctx.require(len(frames) == 18, "the golden file has 18 malformed frames", expected=18, received=len(frames))
    for frame in frames:
        try:
            value = decode_blob(frame["wire_base64"])
        except CodecError as exc:
            ctx.require_equal(exc.code, frame["error"], f"malformed frame {frame['name']} fails with its listed error")
        else:
            raise ctx.fail(
                f"malformed frame {frame['name']} decoded instead of failing",
                expected=frame["error"],
                received=repr(value),
            )


@check("CODEC-FINGERPRINT")
async def codec_fingerprint(ctx: CheckContext) -> None:
    """The frame's fingerprint bytes are e2a33dff55802237, after the magic c301."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    ctx.require(
        FINGERPRINT.hex() == "e2a33dff55802237" == golden["fingerprint"],
        "the CRC-64-AVRO fingerprint of the Value schema is e2a33dff55802237",
        expected="e2a33dff55802237",
        received=FINGERPRINT.hex(),
    )
    frame = encode_value("x")
    ctx.require_equal(
        frame[:10].hex(), "c301e2a33dff55802237", "every frame starts with magic c301 and the fingerprint"
    )


@check("CODEC-START-UNKNOWN-CODEC", "CODEC-NON-AVRO-ENVELOPE-422", "CODEC-CHECK-BEFORE-DECODE")
async def start_with_unknown_codec(ctx: CheckContext) -> None:
    """A start whose input envelope names a codec other than avro is 422 unsupported_payload_codec: and
    creates no run, even when the blob is a valid Avro frame."""
    queue = ctx.uid("q")
    valid_frame = encode_blob(["hello", 42])
    for codec in ("json", "php", "base64", "Y", ""):
        wid = ctx.uid("wf")
        body = {
            "workflow_type": "conformance.Probe",
            "workflow_id": wid,
            "task_queue": queue,
            "input": {"codec": codec, "blob": valid_frame},
        }
        reply = await ctx.client.control("POST", "/workflows", body)
        ctx.expect(reply, 422, what=f"start with input codec {codec!r}", requirement="CODEC-START-UNKNOWN-CODEC")
        _codec_error_named(ctx, reply, f"start with input codec {codec!r}", "CODEC-NON-AVRO-ENVELOPE-422")
        probe = await ctx.client.control("GET", f"/workflows/{wid}")
        ctx.expect(
            probe,
            404,
            what=f"describe after the rejected start with codec {codec!r} (no run is created)",
            requirement="CODEC-START-UNKNOWN-CODEC",
        )
        # Nothing was reserved either: the same workflow id now starts normally.
        ctx.expect(
            await ctx.client.control("POST", "/workflows", {**body, "input": ctx.envelope(["ok"])}),
            201,
            what="a valid start with the id of the rejected one",
            requirement="CODEC-START-UNKNOWN-CODEC",
        )


@check("CODEC-CHECK-BEFORE-DECODE", "CODEC-NON-AVRO-ENVELOPE-422")
async def command_envelope_codec_checked(ctx: CheckContext) -> None:
    """Command result/arguments envelopes with a codec other than avro (around a valid Avro frame) are 422
    unsupported_payload_codec: and apply nothing."""
    run = await leased_run(ctx)
    frame = encode_blob(["valid", "avro"])
    cases: list[tuple[str, dict[str, Any]]] = [
        (
            "complete_workflow.result codec json",
            {"type": "complete_workflow", "result": {"codec": "json", "blob": frame}},
        ),
        (
            "record_side_effect.result codec php",
            {"type": "record_side_effect", "result": {"codec": "php", "blob": frame}},
        ),
        (
            "schedule_activity.arguments codec json",
            {
                "type": "schedule_activity",
                "activity_type": "conformance.Codec",
                "arguments": {"codec": "json", "blob": frame},
            },
        ),
        (
            "continue_as_new.arguments codec base64",
            {"type": "continue_as_new", "arguments": {"codec": "base64", "blob": frame}},
        ),
    ]

    def judge(reply: Reply, what: str) -> None:
        ctx.expect(reply, 422, what=what, requirement="CODEC-NON-AVRO-ENVELOPE-422")
        _codec_error_named(ctx, reply, what, "CODEC-NON-AVRO-ENVELOPE-422")

    batches = complete_bodies((what, [side_effect_cmd("before"), command]) for what, command in cases)
    await refused_without_effect(
        ctx, run, batches, judge, "a batch with a non-avro envelope", "CODEC-CHECK-BEFORE-DECODE"
    )
    ctx.expect(
        await ctx.complete(run.task, [{"type": "complete_workflow", "result": ctx.envelope("ok")}]),
        200,
        what="the same task completed with an avro envelope",
        requirement="COMMANDS-RETRY-AFTER-REJECT",
    )


@check("CODEC-NON-AVRO-ENVELOPE-422")
async def activity_envelope_codec_checked(ctx: CheckContext) -> None:
    """An activity result or failure-details envelope with codec json is 422 unsupported_payload_codec:; the
    attempt stays open."""
    run = await leased_run(ctx)
    task = await leased_activity(ctx, run, activity_type="conformance.Codec")
    base = {"activity_attempt_id": task.get("activity_attempt_id"), "lease_owner": run.worker}
    frame = encode_blob("result")
    path = f"/activity-tasks/{task['task_id']}"
    reply = await ctx.client.worker(f"{path}/complete", {**base, "result": {"codec": "json", "blob": frame}})
    ctx.expect(reply, 422, what="activity complete with result codec json")
    _codec_error_named(ctx, reply, "activity complete with result codec json", "CODEC-NON-AVRO-ENVELOPE-422")
    reply = await ctx.client.worker(
        f"{path}/fail", {**base, "failure": {"message": "x", "details": {"codec": "json", "blob": frame}}}
    )
    ctx.expect(reply, 422, what="activity fail with details codec json")
    _codec_error_named(ctx, reply, "activity fail with details codec json", "CODEC-NON-AVRO-ENVELOPE-422")
    reply = await ctx.client.worker(f"{path}/complete", {**base, "result": {"codec": "avro", "blob": frame}})
    ctx.expect(reply, 200, what="the attempt completed with an avro result after the rejections")


@check("CODEC-SIGNAL-MALFORMED")
async def signal_with_malformed_frame(ctx: CheckContext) -> None:
    """A signal whose input is a malformed golden frame is 422 (never 5xx) and records no SignalReceived."""
    golden = schemas.load_json("avro/avro-value-v1-golden.json")
    queue = ctx.uid("q")
    await ctx.register(queue)
    wid, rid = await ctx.start(queue)
    for frame in golden["malformed_frames"]:
        reply = await ctx.client.control(
            "POST",
            f"/workflows/{wid}/signal/conformance",
            {"input": {"codec": "avro", "blob": frame["wire_base64"]}},
        )
        ctx.expect(reply, 422, what=f"signal with malformed frame {frame['name']} ({frame['error']})")
    events = await ctx.history(wid, rid)
    ctx.require_counts(events, {"SignalReceived": 0}, "a rejected signal records no SignalReceived")
    # The control: a well-formed signal is recorded, so the history above could have shown one.
    ok = await ctx.client.control("POST", f"/workflows/{wid}/signal/conformance", {"input": ctx.envelope(["ok"])})
    ctx.expect(ok, 202, what="a well-formed signal")
    events = await ctx.history(wid, rid)
    ctx.require_counts(events, {"SignalReceived": 1}, "the well-formed signal is recorded exactly once")
