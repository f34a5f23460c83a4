"""What a check gets: a recording client, the target's advertised facts, and protocol helpers.

Each check builds its own world — its own task queues and workflow ids, made unique per run and per
check — so checks are independent, order-free and safe under ``pytest -n``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TypedDict, TypeVar, Unpack

from suite.protocol.codec import encode_blob
from suite.protocol.fencing import parse_rfc3339

from .client import Exchange, ProtocolClient, Reply
from .outcomes import CheckFailure, HarnessError, Indeterminate, NotCovered, profile_setting
from .timing import HELD_GRACE, TargetClock

__all__ = ["HELD_GRACE", "SHORT_SPAN", "CheckContext", "TargetInfo", "fenced_body", "lease_seconds", "target_client"]

R = TypeVar("R")

_counter = itertools.count(1)
# A held request whose last stop is at most this many seconds away gets the grace measured on the target
# (TargetClock.grace) instead of HELD_GRACE: should it reach the target only after the clock moved, it holds again,
# in real time, for no longer than this. A longer hold (a clamp or a timeout being measured) gets HELD_GRACE.
SHORT_SPAN = 1.0
# Assumed worst clock skew when the target sends no Date header and the local clock must stand in.
CLOCK_SKEW = 2.0
# How long a restart command may take, and what covers the restart checks without one.
RESTART_TIMEOUT = 120.0
RESTART_SETTING = (
    "--restart-command CMD (a command that kills the server hard, starts it again on the same URL and state, and "
    "returns once it answers)"
)
# The longest wait a test clock covers (one advance of the reference server's route moves at most 366 days).
TEST_CLOCK_MAX_WAIT = 366 * 86_400.0


# Answers saying a task's lease or timeout ran out (CheckContext.lapsed_on_its_own).
LAPSE_REASONS = frozenset({"lease_expired", "stale_attempt", "stale_task", "query_task_not_leased"})
_TASK_PATH = re.compile(r"/(workflow-tasks|activity-tasks|query-tasks)/([^/?]+)/")


def lease_seconds(profile: Mapping[str, Any], kind: str) -> float | None:
    """How long a task of ``kind`` may go unrenewed on the target, by what it advertises (a query task: the
    shorter of its lease and its timeout); None when it advertises nothing."""
    keys = {
        "workflow-tasks": ("workflow_task_lease_seconds",),
        "activity-tasks": ("activity_task_lease_seconds",),
        "query-tasks": ("query_task_lease_seconds", "query_task_timeout_seconds"),
    }[kind]
    values = [profile.get(k) for k in keys]
    found = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and v > 0]
    return min(found, default=None)


class Evidence(TypedDict, total=False):
    """What a failure shows beside its message: see :meth:`CheckContext.fail`."""

    expected: Any
    received: Any
    replies: Iterable[Reply]
    requirement: str | None


@dataclass
class TargetInfo:
    """Facts about the target, read once per session from ``GET /api/cluster/info``."""

    url: str
    cluster_info: dict[str, Any]
    worker_token: str | None = None
    operator_token: str | None = None
    # --auth-token: a full-access token (docs/reference.md: Auth) the target accepts on both planes.
    full_token: str | None = None
    # What probing the tokens found (suite.target.Credentials.to_json): {"enabled": bool, "summary": line}.
    auth: dict[str, Any] | None = None
    namespace: str = "default"
    protocol_version: str = "1.20"
    max_wait: float = 30.0
    strict: bool = False
    embedded: bool = False
    clock_skew_seconds: float | None = None
    # The shell command that kills the target hard and starts it again (--restart-command; the embedded target's
    # own); None: the restart checks are not covered.
    restart_command: str | None = None
    # --faults: the fault proxy of this process (a suite.client.FaultLedger), in front of ``upstream_url``.
    # Each process running checks has its own; neither field crosses to xdist workers.
    fault_ledger: Any = field(default=None, repr=False, compare=False)
    upstream_url: str | None = None
    # How the run lets time pass (the controller's plan, for the reports; suite.plugin.time_plan).
    time: dict[str, Any] | None = None
    # How waits pass on the target (suite.timing): set up by each process that runs checks.
    clock: TargetClock = field(default_factory=TargetClock, repr=False, compare=False)

    def shareable(self) -> dict[str, Any]:
        """The fields an xdist worker gets (the proxy and the clock stay in the process that set them up)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("fault_ledger", "upstream_url", "clock")}
        if self.upstream_url is not None:
            out["url"] = self.upstream_url
        return out

    def _worker_protocol(self, key: str) -> Any:
        """``worker_protocol.<key>`` of the cluster info; None where the target leaves it out."""
        wp = self.cluster_info.get("worker_protocol")
        return wp.get(key) if isinstance(wp, dict) else None

    @property
    def server_capabilities(self) -> dict[str, Any]:
        caps = self._worker_protocol("server_capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def advertised_version(self) -> str | None:
        v = self._worker_protocol("version")
        return str(v) if v is not None else None

    @property
    def test_profile(self) -> dict[str, Any]:
        prof = self._worker_protocol("test_profile")
        return prof if isinstance(prof, dict) else {}

    @property
    def auth_enabled(self) -> bool:
        """Whether the target enforces auth, as the credential probe found; unprobed, whether tokens were given."""
        if self.auth is not None:
            return bool(self.auth.get("enabled"))
        return bool(self.worker_token or self.operator_token or self.full_token)

    @property
    def certified_minor(self) -> int:
        return int(self.protocol_version.split(".")[1])


def target_client(target: TargetInfo, **options: Any) -> ProtocolClient:
    """The suite's recording client of ``target``: its tokens, namespace and certified version, through its fault
    proxy under --faults; ``options`` (a timeout, a validator, a shared exchange list) as ProtocolClient takes them."""
    return ProtocolClient(
        target.url,
        worker_token=target.worker_token,
        operator_token=target.operator_token,
        namespace=target.namespace,
        worker_version=target.protocol_version,
        faults=target.fault_ledger,
        **options,
    )


@dataclass
class CheckContext:
    target: TargetInfo
    client: ProtocolClient
    check_name: str
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    _clock_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    @property
    def exchanges(self) -> list[Exchange]:
        return self.client.exchanges

    @property
    def caps(self) -> dict[str, Any]:
        return self.target.server_capabilities

    @property
    def default_history_page_size(self) -> int:
        """The page size the target applies to a history page asked for without one: the one it advertises
        (either name), else the protocol's 500. A server may advertise its own; checks read it, never assume 500."""
        for key in ("history_page_size_default", "default_history_page_size"):
            value = self.caps.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1000:
                return value
        return 500

    # -- naming ----------------------------------------------------------------------------------------

    def uid(self, prefix: str) -> str:
        """A name no other check, run or worker process uses: safe for queues, workflow and worker ids."""
        return f"{prefix}-{self.check_name[:24]}-{self.tag}-{next(_counter)}".replace("_", "-")

    # -- verdict helpers -------------------------------------------------------------------------------
    # ``requirement`` is the requirement a failure breaks; ``None`` judges it against the check's first.

    def fail(
        self,
        message: str,
        *,
        expected: Any = None,
        received: Any = None,
        replies: Iterable[Reply] = (),
        requirement: str | None = None,
    ) -> CheckFailure:
        """The failure to raise: ``message``, what was ``expected`` and ``received``, the exchanges of
        ``replies`` (or the latest three) and the ``requirement`` it breaks."""
        ex = [r.exchange for r in replies] or self.exchanges[-3:]
        return CheckFailure(message, expected=expected, received=received, exchanges=ex, requirement=requirement)

    def require_equal(
        self,
        received: Any,
        expected: Any,
        message: str,
        *,
        replies: Iterable[Reply] = (),
        requirement: str | None = None,
    ) -> None:
        """Fail unless ``received == expected`` (``is``, for ``True``, ``False`` and ``None``: JSON ``1`` is not
        ``true``); the failure shows both."""
        self.require(
            received is expected if expected is None or isinstance(expected, bool) else received == expected,
            message,
            expected=expected,
            received=received,
            replies=replies,
            requirement=requirement,
        )

    def require_not_sooner(self, since: datetime, seconds: float, tolerance: float, message: str, after: str) -> None:
        """Fail when less than ``seconds`` (minus ``tolerance``) passed on the target's clock from ``since`` to now:
        what was just leased was held back too briefly (``after`` names what ``since`` marks)."""
        elapsed = (self.now() - since).total_seconds()
        self.require(
            elapsed >= seconds - tolerance,
            message,
            expected=f">= {seconds - tolerance:g} s after {after}",
            received=f"leased after {elapsed:.2f} s",
        )

    def require_counts(
        self, events: list[dict[str, Any]], counts: Mapping[str, int], message: str, requirement: str | None = None
    ) -> None:
        """Fail unless the history ``events`` hold each event type of ``counts`` exactly that many times."""
        found = dict.fromkeys(counts, 0)
        for event in events:
            if event.get("event_type") in found:
                found[event["event_type"]] += 1
        self.require(
            found == dict(counts),
            message,
            expected=dict(counts),
            received=[e.get("event_type") for e in events],
            requirement=requirement,
        )

    def expect(
        self,
        reply: Reply,
        status: int | Iterable[int],
        reason: str | Iterable[str] | None = None,
        *,
        what: str = "",
        requirement: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Fail unless ``reply`` has the status (and ``reason``) and each body field of ``fields`` has the value
        given there (compared as :meth:`require_equal` does); return its JSON body."""
        statuses = {status} if isinstance(status, int) else set(status)
        reasons = None if reason is None else ({reason} if isinstance(reason, str) else set(reason))
        got_reason = reply.reason
        ok = reply.status in statuses and (reasons is None or got_reason in reasons)
        if not ok:
            lapsed = self.lapsed_on_its_own(reply)
            if lapsed is not None:
                raise Indeterminate(lapsed)
            exp = " or ".join(str(s) for s in sorted(statuses))
            if reasons:
                exp += " " + " | ".join(sorted(reasons))
            raise self.fail(
                (what + ": " if what else "") + f"{reply.exchange.method} {reply.exchange.url}",
                expected=exp,
                received=f"{reply.status} {got_reason or ''}".strip() + _snippet(reply),
                replies=[reply],
                requirement=requirement,
            )
        body = reply.json()
        for name, value in (fields or {}).items():
            message = f"{what or 'the answer'}: {name} is {json.dumps(value)}"
            self.require_equal(body.get(name), value, message, replies=[reply], requirement=requirement)
        return body

    def lapsed_on_its_own(self, reply: Reply) -> str | None:
        """Why ``reply``, a task's lease or timeout reported run out, is no evidence: waiting in real time, the
        check itself may have let it run out — its call may have reached the target a whole lease after the last
        answered poll or heartbeat of the task (the local clock bounds both ends), as on a loaded machine or
        across a slow network. None when the lease cannot have run out on a correct target, or with a test
        clock, where only the check moves time."""
        if self.target.clock.skips or reply.reason not in LAPSE_REASONS:
            return None
        found = _TASK_PATH.search(reply.exchange.url)
        if found is None:
            return None
        kind, task_id = found.group(1), found.group(2)
        lease = lease_seconds(self.target.test_profile, kind)
        renewed = [
            e
            for e in self.client.exchanges
            if e is not reply.exchange
            and e.status == 200
            and e.started_at <= reply.exchange.started_at
            and (
                f"/{task_id}/heartbeat" in e.url or (e.url.endswith("/poll") and task_id in json.dumps(e.response_body))
            )
        ]
        if lease is None or not renewed:
            return None
        gap = reply.exchange.started_at + reply.exchange.elapsed - renewed[-1].started_at
        if gap < lease:
            return None
        return (
            f"the {kind[:-1].replace('-', ' ')} {task_id} may have run out on its own: the check's call could reach "
            f"the target {gap:.1f}s after its last answered poll or heartbeat, past its {lease:g}s"
        )

    def require(self, condition: bool, message: str, **evidence: Unpack[Evidence]) -> None:
        """Unless ``condition`` holds, fail with ``message`` and ``evidence`` (what :meth:`fail` takes)."""
        if not condition:
            raise self.fail(message, **evidence)

    @property
    def max_wait(self) -> float:
        """The longest wait this run affords: ``--max-wait``, or with a test clock any wait it covers."""
        return TEST_CLOCK_MAX_WAIT if self.target.clock.skips else self.target.max_wait

    def needs_short(self, seconds: float | None, what: str, setting: str | None = None) -> float:
        """Not covered when waiting ``seconds`` does not fit ``--max-wait`` (with a test clock, any wait fits).
        ``setting`` is the test-profile key that shortens the wait on the target (``None``: the check fixes the
        wait, only --max-wait covers it)."""
        if seconds is None:
            raise NotCovered(
                f"the target does not say how long {what} takes",
                profile_setting(setting) if setting else None,
            )
        if seconds > self.max_wait:
            cover = f"--max-wait {math.ceil(seconds)}"
            raise NotCovered(
                f"waiting for {what} takes {seconds:g} s, but --max-wait lets this run wait at most "
                f"{self.target.max_wait:g} s",
                f"{cover}, or a shorter {profile_setting(setting)}" if setting else cover,
            )
        return seconds

    # -- time ----------------------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The target's clock as this process knows it (the local clock for a target without a test clock)."""
        return self.target.clock.now()

    async def wait(self, seconds: float = 0.0, *, until: datetime | None = None, real: bool = False) -> None:
        """The one way the suite lets time pass: ``seconds`` of the target's time, or until its clock reaches
        ``until`` (a target timestamp such as ``lease_expires_at``), whichever is later.

        With the target's test clock (:attr:`suite.timing.TargetClock.skips`) the clock is moved forward and the
        wait takes no real time; concurrent waits of one check aim at absolute instants, so they never add up.
        Otherwise, and with ``real=True`` (time for a request to reach the target, a rule about real elapsed
        time), it sleeps.
        """
        clock = self.target.clock
        target = clock.now() + timedelta(seconds=max(0.0, seconds))
        if until is not None and until > target:
            target = until
        if real or not clock.skips:
            remaining = (target - clock.now()).total_seconds()
            if remaining > 0:
                await asyncio.sleep(remaining)
            return
        async with self._clock_lock:
            remaining = (target - clock.now()).total_seconds()
            if remaining > 0:
                self.client.exchanges.append(await clock.advance(self.client, remaining))

    async def held(self, request: Awaitable[R], hold: float = 0.0, *, until: datetime | None = None) -> R:
        """Await a request the target may hold for ``hold`` seconds of its clock (a long poll), where ``until``
        is an instant that should end the hold early (a lease expiry, a timer) when the rule says so.

        With a test clock, a request still unanswered after a grace (see :meth:`_answered_at_once`) is released by
        moving the clock: first to ``until`` (the request then has another grace to answer), then to the end of its
        hold. An empty long poll thus costs a fraction of a second instead of ``hold``; a request answered at
        once moves nothing; a target that goes on holding past the end of the hold is awaited in real time.
        Without a test clock this is just ``await request``.
        """
        task = asyncio.ensure_future(request)
        clock = self.target.clock
        if not clock.skips:
            return await task
        now = clock.now()
        ends = now + timedelta(seconds=max(0.0, hold))
        stops = [ends] if until is None else [until, ends] if until < ends else [until]
        grace = clock.grace() if (stops[-1] - now).total_seconds() <= SHORT_SPAN else clock.long_grace()
        try:
            for stop in stops:
                if stop <= clock.now():
                    continue
                if await self._answered_at_once(task, grace):
                    break
                await self.wait(until=stop)
            return await task
        except asyncio.CancelledError:
            task.cancel()
            raise

    def held_seconds(self, started: datetime, reply: Reply) -> float:
        """Seconds of the target's clock from ``started`` (taken just before the request was sent) to the arrival of
        ``reply``: the length of the hold it answers. Its arrival, not the end of the await: under --faults the
        client may go on to judge a duplicate delivery, whose own hold moves the clock further. A request whose
        first answer was lost was sent again, later, and maybe after the clock had moved to where the first hold
        should end, so its hold cannot be told from the clock: the check runs again."""
        if reply.resent:
            raise Indeterminate(
                f"{reply.exchange.summary()}: sent again after the answers of {reply.resent} earlier "
                "deliveries were lost, so its hold cannot be told from the target's clock"
            )
        arrived = self.target.clock.at(reply.exchange.started_at + reply.exchange.elapsed)
        answered = _answered_by_date(reply)
        # An answer in flight may arrive after the clock was moved on; its Date says when the server answered (whole
        # seconds, truncated: before the next one), and the hold ended no later than that.
        if answered is not None and started <= answered < arrived:
            arrived = answered
        return (arrived - started).total_seconds()

    async def _answered_at_once(self, task: asyncio.Future[Any], grace: float) -> bool:
        """Whether ``task`` is answered before the target falls quiet: ``grace`` seconds with no answer to any request
        of this check (racing requests are served one after another, so a grace runs from the last answer), and never
        more than :data:`HELD_GRACE` (plus the network's hold, under --faults) in all."""
        began = time.monotonic()
        while True:
            cap = began + self.target.clock.long_grace()
            quiet = min(max(began, self.client.last_answer) + grace, cap) - time.monotonic()
            if quiet <= 0:
                return False
            done, _ = await asyncio.wait({task}, timeout=quiet)
            if done:
                self.target.clock.served(time.monotonic() - began)
                return True

    async def wait_past(self, instant: datetime, *, within: float, what: str) -> None:
        """Wait until the target's clock is past ``instant`` (a target timestamp, e.g. ``lease_expires_at``).

        With a test clock, the advance's answer proves it. Otherwise the ``Date`` of ``GET /api/health`` does:
        it has whole seconds and is truncated, so ``Date > instant`` proves the target's now is past it (a
        read-only health probe is no stimulus for the task queues); without a Date header the local clock,
        less :data:`CLOCK_SKEW`, stands in.
        """
        if self.target.clock.skips:
            await self.wait(until=instant + timedelta(microseconds=1))
            return

        async def probe() -> bool | None:
            reply = await self.client.request("GET", "/api/health")
            now = reply.server_date or self.now() - timedelta(seconds=CLOCK_SKEW)
            return True if now > instant else None

        await self.wait(until=instant)
        await self.wait_until(probe, timeout=within, what=what, interval=0.25)

    async def wait_until(
        self, probe: Callable[[], Awaitable[R | None]], *, timeout: float, what: str, interval: float = 0.1
    ) -> R:
        """Poll ``probe`` until it returns something other than None, letting ``interval`` pass between probes;
        fail after ``timeout`` seconds.

        With a test clock the time between probes is the target's (moved, not slept), and the check fails only
        once ``timeout`` has passed both on the target's clock and in real time: a target that does some work
        in real time (a timer service that polls) is never failed sooner than without a test clock.
        """
        loop = asyncio.get_running_loop()
        real_deadline = loop.time() + timeout
        deadline = self.now() + timedelta(seconds=timeout)
        while True:
            result = await probe()
            if result is not None:
                return result
            target_left = self.now() < deadline
            if not target_left and loop.time() >= real_deadline:
                raise self.fail(f"timed out after {timeout:g}s waiting for {what}")
            await self.wait(interval, real=not target_left)

    # -- restarts ----------------------------------------------------------------------------------------

    async def restart(self) -> None:
        """Kill the target hard and start it again (the run's restart command), then reconnect. Not covered
        without a restart command; a command that fails, or a target that does not answer after it, is a harness
        error (the command is the run's, not the protocol's)."""
        command = self.target.restart_command
        if command is None:
            raise NotCovered("the suite cannot restart this target", RESTART_SETTING)
        proc = await asyncio.create_subprocess_shell(
            command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), RESTART_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise HarnessError(f"--restart-command did not return within {RESTART_TIMEOUT:g} s") from None
        if proc.returncode != 0:
            tail = output.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise HarnessError(f"--restart-command exited {proc.returncode}: {tail[0][:300]}")
        await self.client.reconnect()
        reply = await self.client.request("GET", "/api/health")
        if reply.status != 200:
            raise HarnessError(f"the target does not answer after --restart-command returned (health: {reply.status})")

    # -- protocol helpers ------------------------------------------------------------------------------

    async def register(self, queue: str, worker_id: str | None = None, **extra: Any) -> str:
        wid = worker_id or self.uid("w")
        body = {"worker_id": wid, "task_queue": queue, "runtime": "python", **extra}
        reply = await self.client.worker("/register", body)
        self.expect(reply, (200, 201), what="worker registration")
        return wid

    async def start(
        self,
        queue: str,
        *,
        workflow_type: str = "conformance.Probe",
        input: Any = None,
        workflow_id: str | None = None,
        **extra: Any,
    ) -> tuple[str, str]:
        wid = workflow_id or self.uid("wf")
        body: dict[str, Any] = {
            "workflow_type": workflow_type,
            "workflow_id": wid,
            "task_queue": queue,
            **extra,
        }
        if input is not None:
            body["input"] = input
        reply = await self.client.control("POST", "/workflows", body)
        out = self.expect(reply, 201, what="workflow start")
        return wid, str(out.get("run_id"))

    async def poll(
        self, kind: str, worker_id: str, queue: str, timeout: int = 1, *, until: datetime | None = None, **extra: Any
    ) -> Reply:
        """A poll for a ``kind`` ("workflow", "activity" or "query") task; with a test clock its hold ends at
        once, or at ``until`` (see :meth:`held`)."""
        body = {"worker_id": worker_id, "task_queue": queue, "timeout_seconds": timeout, **extra}
        request = self.client.worker(f"/{kind}-tasks/poll", body, timeout=timeout + 15)
        return await self.held(request, self.poll_hold(timeout), until=until)

    async def poll_wf(
        self, worker_id: str, queue: str, timeout: int = 1, *, until: datetime | None = None, **extra: Any
    ) -> Reply:
        """A workflow-task :meth:`poll`."""
        return await self.poll("workflow", worker_id, queue, timeout, until=until, **extra)

    def poll_hold(self, timeout: int) -> float:
        """How long the target holds an empty poll with ``timeout_seconds`` (§7.2: clamped into [1, max])."""
        clamp = self.target.test_profile.get("long_poll_max_seconds")
        top = float(clamp) if isinstance(clamp, int | float) and not isinstance(clamp, bool) and clamp >= 1 else 60.0
        return max(1.0, min(float(timeout), top))

    async def wf_call(
        self,
        task: dict[str, Any],
        verb: str,
        body: dict[str, Any] | None = None,
        *,
        owner: str | None = None,
        attempt: int | None = None,
    ) -> Reply:
        payload = fenced_body(task, body, lease_owner=owner, workflow_task_attempt=attempt)
        return await self.client.worker(f"/workflow-tasks/{task['task_id']}/{verb}", payload)

    async def complete(self, task: dict[str, Any], commands: list[dict[str, Any]], **kw: Any) -> Reply:
        return await self.wf_call(task, "complete", {"commands": commands}, **kw)

    async def describe(self, workflow_id: str) -> dict[str, Any]:
        reply = await self.client.control("GET", f"/workflows/{workflow_id}")
        return self.expect(reply, 200, what="describe")

    async def history(self, workflow_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every control-plane history event of a run, following ``next_page_token``."""
        events: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(1000):
            params = {"page_size": "1000", **({"next_page_token": token} if token else {})}
            reply = await self.client.control("GET", f"/workflows/{workflow_id}/runs/{run_id}/history", params=params)
            body = self.expect(reply, 200, what="control-plane history")
            page = body.get("events")
            if isinstance(page, list):
                events.extend(e for e in page if isinstance(e, dict))
            nxt = body.get("next_page_token")
            if not nxt or nxt == token:
                break
            token = str(nxt)
        return events

    @staticmethod
    def envelope(value: Any) -> dict[str, str]:
        return {"codec": "avro", "blob": encode_blob(value)}

    def lease_expiry(self, body: dict[str, Any], reply: Reply, requirement: str | None = None) -> datetime:
        """The ``lease_expires_at`` of a lease or heartbeat answer (``body`` of ``reply``); the check fails
        ``requirement`` unless it is an RFC 3339 instant."""
        try:
            return parse_rfc3339(body.get("lease_expires_at"))
        except ValueError as exc:
            raise self.fail(
                "lease_expires_at is an RFC 3339 timestamp",
                expected="e.g. 2026-04-18T12:05:00.000000Z",
                received=f"{body.get('lease_expires_at')!r} ({exc})",
                replies=[reply],
                requirement=requirement,
            ) from None

    def renewed_lease(self, body: dict[str, Any], reply: Reply, previous: datetime) -> datetime:
        """The ``lease_expires_at`` a heartbeat answered (``body`` of ``reply``), which never moves back from
        ``previous``, the lease's expiry before it."""
        expires = self.lease_expiry(body, reply)
        self.require(
            expires >= previous,
            "a heartbeat never moves lease_expires_at backwards",
            expected=f"≥ {previous.isoformat()}",
            received=body.get("lease_expires_at"),
            replies=[reply],
        )
        return expires

    @staticmethod
    def lease_seconds(task: dict[str, Any], sent_at_server: str | None = None) -> float | None:
        """Seconds from ``sent_at_server`` (an RFC 3339 instant) to the task's ``lease_expires_at``."""
        try:
            expires = parse_rfc3339(task.get("lease_expires_at"))
        except (ValueError, TypeError):
            return None
        if sent_at_server is None:
            return None
        return (expires - parse_rfc3339(sent_at_server)).total_seconds()


def fenced_body(task: dict[str, Any], body: dict[str, Any] | None = None, **fence: Any) -> dict[str, Any]:
    """A report body fenced like ``task``'s lease: each ``fence`` field the caller gives (not ``None``), else the
    task's own value of it, then ``body``."""
    return {**{k: v if v is not None else task.get(k) for k, v in fence.items()}, **(body or {})}


def _snippet(reply: Reply) -> str:
    body = reply.json()
    msg = body.get("message") or body.get("error")
    return f" ({str(msg)[:160]})" if msg else ""


def _answered_by_date(reply: Reply) -> datetime | None:
    """The latest instant the target can have answered ``reply``: its ``Date`` (truncated to the second) plus one
    second; None without a readable Date."""
    headers = {k.lower(): v for k, v in reply.exchange.response_headers.items()}
    try:
        date = parsedate_to_datetime(headers["date"])
    except (KeyError, TypeError, ValueError):
        return None
    return date + timedelta(seconds=1)
