"""One fuzz case from Schemathesis to its verdict: prepared (the plane's headers pinned, long waits kept short, the
live world's ids and fencing values substituted), sent on the lab's session, judged by the registered response
checks, and — rejected on a live world — followed by a comparison of the world's run before and after
(ROBUST-REJECTED-NO-STATE-CHANGE)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from schemathesis import GenerationMode
from schemathesis.core import NotSet

from suite.client import CONTROL_HEADER, REDACTED, WORKER_HEADER
from suite.context import TargetInfo
from suite.exchange import Exchange
from suite.outcomes import STOPPING, Stopped
from suite.text import plural

from .document import Operation
from .judges import NO_CHANGE, Answer, judge, judged_requirements
from .live import CALL_TIMEOUT, Lab, LiveWorld, WorldUnavailable
from .results import FuzzResult

__all__ = [
    "SHORT_HOLD",
    "CaseRunner",
    "integral_floats_to_ints",
    "negative_in",
    "pin_headers",
    "pin_holds",
    "substitute",
]

# Long polls, update waits and history waits are pinned to this many seconds so a case never holds a
# connection for the target's default (30 s); the value stays inside every schema's positive space.
SHORT_HOLD: Final = 1
# What a lost answer looks like to requests (matched by name: the suite does not import requests).
_LOST_NAMES = frozenset({"ConnectionError", "ChunkedEncodingError", "ContentDecodingError"})


def integral_floats_to_ints(value: Any) -> Any:
    """Schemathesis may draw 3.0 for an integer; JSON Schema counts it as one but a server may refuse it
    (``x-implementation-defined``), so positive cases send 3."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [integral_floats_to_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: integral_floats_to_ints(v) for k, v in value.items()}
    return value


def pin_holds(op: Operation, case: Any) -> None:
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


def pin_headers(case: Any, pinned: Mapping[str, str], keep: str | None = None) -> None:
    """The plane's version, namespace and credential headers (``pinned``), except ``keep`` (the header a
    coverage case is about, left exactly as generated, absent included)."""
    keep = (keep or "").lower()
    headers = dict(case.headers or {})
    for name in list(headers):
        lower = name.lower()
        if lower != keep and lower in ("authorization", "x-namespace", WORKER_HEADER.lower(), CONTROL_HEADER.lower()):
            del headers[name]
    headers.update({k: v for k, v in pinned.items() if k.lower() != keep})
    case.headers = headers
    if isinstance(case.query, dict):
        case.query.pop("namespace", None)  # X-Namespace decides (§4.2); a stray query value is noise


def negative_in(case: Any, location: str) -> bool:
    """Whether the case was generated to break its ``location`` (path, query, header, body)."""
    meta = case.meta
    if meta is None:
        return False
    return any(
        getattr(loc, "value", loc) == location and info.mode is GenerationMode.NEGATIVE
        for loc, info in meta.components.items()
    )


def substitute(world: LiveWorld, case: Any, how: str) -> bool:
    """Point the case at the live world: its ids into the path (unless the path is what the case breaks),
    and with ``ids+fence`` its fencing values into the body keys the case already has. Returns whether
    anything was substituted."""
    changed = False
    if isinstance(case.path_parameters, dict) and case.path_parameters and not negative_in(case, "path"):
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


class CaseRunner:
    """Sends prepared cases, judges them, and compares live-world snapshots around rejected ones."""

    def __init__(self, target: TargetInfo, result: FuzzResult, lab: Lab) -> None:
        self.target = target
        self.result = result
        self.lab = lab
        self.aborted = False
        # The world's run as read after the last case, rejected, changed nothing; with what had been sent and how far
        # this process had moved the target's clock by then. It is the next case's "before" when that case targets
        # the same world and nothing was sent and no time was skipped in between (no renewal, no other case).
        self._seen: tuple[LiveWorld, tuple[Any, list[Any]], tuple[int, int, float]] | None = None

    def _marker(self) -> tuple[int, int, float]:
        return self.lab.requests, self.result.stats["requests"], self.target.clock.advanced

    def _before(self, world: LiveWorld) -> tuple[Any, list[Any]]:
        """The world's run now: as the last comparison read it if nothing happened since, else read again."""
        seen, self._seen = self._seen, None
        if seen is not None and seen[0] is world and seen[2] == self._marker() and not world.dirty:
            return seen[1]
        return self.lab.snapshot(world)

    def send(self, op: Operation, case: Any, world: LiveWorld | None = None, *, probe: bool = False) -> Answer | None:
        """Send ``case`` and judge the answer; with a ``world``, a 4xx must leave it unchanged."""
        if self.aborted:
            return None
        if STOPPING.is_set():  # the run stopped (-x) while this group ran ahead of its turn: nobody will take it
            raise Stopped
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
                case.call, base_url=self.target.url, session=self.lab.session, timeout=CALL_TIMEOUT
            )
            response = self.lab.held(send, SHORT_HOLD) if holds else send()
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

    def _compare(self, world: LiveWorld, before: tuple[Any, list[Any]], answer: Answer) -> None:
        r = self.result
        r.stats["compared"] += 1
        r.judged.add(NO_CHANGE)
        try:
            after = self.lab.snapshot(world)
            diff = _diff(before, after) if after != before else ""
            if not diff:
                self._seen = (world, after, self._marker())
        except WorldUnavailable as exc:
            diff = f"the run could no longer be read: {exc}"
        if diff:
            world.dirty = True
            message = (
                f"was rejected with {answer.status} {answer.reason or ''} but changed workflow {world.workflow_id}"
            )
            expected = "describe and control-plane history unchanged"
            r.fail(answer.failure("rejected_changes_nothing", message, NO_CHANGE, expected, diff))


def _diff(before: tuple[Any, list[Any]], after: tuple[Any, list[Any]]) -> str:
    if before[1] != after[1]:
        new = [e.get("event_type") if isinstance(e, dict) else e for e in after[1][len(before[1]) :]]
        return f"history went from {len(before[1])} to {plural(len(after[1]), 'event')} (new: {new})"
    b = before[0] if isinstance(before[0], dict) else {}
    a = after[0] if isinstance(after[0], dict) else {}
    changed = sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k))
    return "describe changed: " + ", ".join(f"{k}: {b.get(k)!r} -> {a.get(k)!r}" for k in changed)
