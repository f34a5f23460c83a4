"""What every protocol state machine shares: a target, a recording client on its own event loop, a
per-example world, a step log, the coverage ledger, the "maybe applied" rule, and the judging every machine
does the same way.

Hypothesis rules are synchronous; each machine owns one event loop and runs every request (and every
race, released together behind an :class:`asyncio.Barrier`) on it with :meth:`MachineBase.run`. The
verdict always comes from the pure model (``suite.protocol``): a rule computes what the protocol allows
before it looks at what the target answered.

The shared world, for a machine that subclasses :class:`MachineBase`:

- a task ``queue`` per example, and the ``workers`` :meth:`~MachineBase.register_workers` registers there;
- :meth:`~MachineBase.call` one request (``None``: no answer, maybe applied); :meth:`~MachineBase.judged`
  turns a :class:`~suite.protocol.errors.Violation` a pure judge raised into the machine's failure;
- :meth:`~MachineBase.poll_once` and :meth:`~MachineBase.poll_race` poll (one, or several released together),
  check every answer's shape (:meth:`~MachineBase.check_poll_shape`) and call the machine's
  :meth:`~MachineBase.lost_poll` for every poll whose answer was lost or resent (it may have leased behind the
  model's back); :meth:`~MachineBase.granted_once` says a (task, attempt) was granted to one poll only;
- :meth:`~MachineBase.close_by_control` cancels or terminates a run from the control plane and steps its shadow;
- :meth:`~MachineBase.check_touched_histories` reads back the control-plane history of every run the machine
  touched since the last step (gap-free, one terminal event at most and exactly one once closed), then hands
  it to the machine's own judge;
- :meth:`~MachineBase.workflow_outcomes` what §8.9 allows for a workflow-task call around a moment.

Shadows of runs and workflow tasks live in :mod:`suite.machines.world`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from hypothesis import event as _hypothesis_event
from hypothesis import note as _hypothesis_note
from hypothesis.errors import HypothesisException, InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine

from suite.client import Reply
from suite.context import CheckContext, TargetInfo, target_client
from suite.outcomes import STOPPING, CheckFailure, HarnessError, Indeterminate, Stopped
from suite.protocol.coverage import Actor, cell_key, known_cell
from suite.protocol.errors import Violation
from suite.protocol.fencing import WorkflowTaskView, guard_workflow_task, outcome
from suite.protocol.history import RUN_TERMINAL_EVENTS, check_sequences
from suite.protocol.oracle import Accepted, Applied, Kind, Page, join_pages, judge_history, page_of
from suite.text import plural

from .cells import run_state
from .world import CLOSE_EVENTS, RunShadow

__all__ = [
    "CELLS",
    "EXPIRY_STEP",
    "LEDGER",
    "RUN",
    "STOPPING",
    "MachineBase",
    "Polled",
    "Stopped",
    "ThisThread",
    "event",
    "note",
    "race",
    "record_step",
]

R = TypeVar("R")
RunT = TypeVar("RunT", bound=RunShadow)

# With a test clock, a rule that waits out a lease moves the clock this far past its expiry (and no further):
# the expiry has certainly passed on the target, and no more time passes than a real wait would let pass.
EXPIRY_STEP = timedelta(milliseconds=10)

# How often each hard state was reached in this process, per machine (the coverage ledger).
LEDGER: dict[str, Counter[str]] = {}
# How often each cell of the coverage model (suite.protocol.coverage) was hit in this process, per machine.
CELLS: dict[str, Counter[str]] = {}


class ThisThread(threading.local):
    """What the machine running in this thread has seen so far. A machine runs in one thread from start to end,
    and without a test clock several machines run at once, each in a thread of its own (suite.overlap): what one
    found is never another's evidence."""

    def __init__(self) -> None:
        # Every violation the machine raised, in order: under --faults a failing sequence may not fail again when
        # Hypothesis replays it (the faults differ), and the first violation is then the evidence.
        self.found: list[CheckFailure] = []
        # Every time a step could not go on because a fault left an outcome unknown (the example is then discarded).
        self.unknown: list[Indeterminate] = []
        # Every exception that ended an example of the machine, in order, whatever raised it: the first execution
        # of a failing example and Hypothesis' replay of it each add theirs. Under --faults the replay meets other
        # faults and may go another way, and Hypothesis then raises Flaky* in place of what the example raised;
        # this list keeps what it raised. The runner clears it before each run it judges and once the machine is
        # judged (it holds the examples' machines).
        self.escaped: list[BaseException] = []
        # Examples begun and requests sent (a campaign's statistics).
        self.stats: Counter[str] = Counter()
        # The step lines Hypothesis printed for the example running now, when the runner records programs (a run
        # given --example-db or --campaign): what a failure is stored as when no shrunk program comes back (a
        # timing-dependent target: Hypothesis' replay of the failure went another way). See :func:`record_step`.
        self.printed: list[str] = []


RUN = ThisThread()
# A step line as Hypothesis prints it: the machine built, a rule called, its results assigned.
STEP_LINE = re.compile(r"^(state = \w+\(\)$|state\.\w+\(|\(?[\w, ]+,?\)? = state\.\w+\()")

# The protocol outcomes a coverage-guided fuzzer may steer by, as Hypothesis events: a reason of an answer.
OUTCOME_EVENTS = {
    "lease_owner_mismatch": "fenced",
    "workflow_task_attempt_mismatch": "stale attempt",
    "query_task_attempt_mismatch": "stale attempt",
    "stale_attempt": "stale attempt",
    "stale_task": "stale attempt",
    "lease_expired": "lease expired",
}


def note(text: str) -> None:
    """Record a line with the failing example (Hypothesis' ``note``); outside a Hypothesis run — a replay
    script — print it instead, so the replay shows the same exchanges."""
    try:
        _hypothesis_note(text)
    except InvalidArgument:
        print(text, file=sys.stderr)


def record_step(text: object) -> bool:
    """Keep ``text`` when it is a step line of the example running now (a new example's first line starts a new
    program); whether it was one. The salt step of a run under --faults sends nothing, and a replay ends with
    teardown of its own: both are left out."""
    line = str(text)
    if "\n" in line:
        kept = [record_step(part) for part in line.splitlines()]  # every part, not up to the first step
        return any(kept)
    if not STEP_LINE.match(line) or line.startswith(("state._fault_salt(", "state.teardown(")):
        return False
    if line.startswith("state = "):
        RUN.printed.clear()
    RUN.printed.append(line)
    return True


def event(text: str) -> None:
    """A Hypothesis event (shown by --hypothesis-show-statistics, read by coverage-guided fuzzers); nothing outside
    a Hypothesis run (a replay)."""
    with contextlib.suppress(InvalidArgument):
        _hypothesis_event(text)


async def race(n: int, make: Callable[[int], Awaitable[R]]) -> list[R | BaseException]:
    """Run ``make(i)`` for i in 0..n-1 released together: each coroutine waits on one barrier first, so
    the requests leave as close to simultaneously as the event loop allows."""
    barrier = asyncio.Barrier(n)

    async def one(i: int) -> R:
        await barrier.wait()
        return await make(i)

    return list(await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True))


@dataclass(frozen=True)
class ReadStyle:
    """How a machine reads a leased task's history back: the inline page size it asks the poll for (None: the
    server's default), the page size of the pages it fetches, the cursor it follows (``after_sequence``, the
    token, or the two in turn) and the encoding it opts in to (§8.4, §8.5)."""

    inline: int | None
    page: int
    cursor: str
    encoding: str | None

    def poll_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.inline is not None:
            fields["history_page_size"] = self.inline
        if self.encoding is not None:
            fields["accept_history_encoding"] = self.encoding
        return fields


# The machines take these in turn, poll by poll: every read style meets every machine's histories.
READ_STYLES: tuple[ReadStyle, ...] = (
    ReadStyle(None, 500, "after", None),
    ReadStyle(2, 3, "token", None),
    ReadStyle(1, 2, "alternate", "gzip"),
    ReadStyle(3, 1000, "after", "deflate"),
    ReadStyle(None, 1000, "token", "gzip"),
)
MAX_PAGES = 2000


@dataclass(frozen=True)
class Polled:
    """One poll's answer (``reply`` None: lost), its body once its shape was checked, and when it left and
    arrived (client clock; ``sent`` is the resend's departure when the answer came to a resend)."""

    reply: Reply | None
    body: dict[str, Any]
    sent: datetime
    received: datetime
    acked: Mapping[str, int] = field(default_factory=dict)  # per run: acceptances acknowledged before it left
    style: ReadStyle = READ_STYLES[0]

    @property
    def task(self) -> dict[str, Any] | None:
        task = self.body.get("task")
        return task if isinstance(task, dict) else None


class MachineBase(RuleBasedStateMachine):
    """Base of the protocol machines. ``target`` is bound by the runner (or a replay script)."""

    target: ClassVar[TargetInfo | None] = None
    name: ClassVar[str] = "machine"
    # A workflow-task call within this many seconds of a lease expiry may land on either side.
    MARGIN: ClassVar[float] = 1.0
    # requirement -> the ledger state a run must reach before the machine may call it passed (None: no state needed)
    REQUIREMENTS: ClassVar[dict[str, str | None]] = {}
    # Requirements judged only in some coverage cells (cell-key patterns, ``*`` for any part): passed only when
    # the run reached one of them (suite.machines.runner.judged_cells).
    REQUIREMENT_CELLS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self) -> None:
        super().__init__()
        if self.target is None:
            raise RuntimeError("bind a target first: Machine.bound(target_info) or the pytest plugin")
        self.loop = asyncio.new_event_loop()
        self.client = target_client(self.target, timeout=30.0)
        self.ctx = CheckContext(target=self.target, client=self.client, check_name=self.name, tag=secrets.token_hex(3))
        # Each example works a task queue of its own, with the workers it registers there.
        self.queue = self.ctx.uid("q")
        self.workers: list[str] = []
        self.ledger = LEDGER.setdefault(self.name, Counter())
        self.cells = CELLS.setdefault(self.name, Counter())
        self.touched: set[str] = set()  # run ids whose history changed since the last history check
        # The path this example took, as the coverage model sees it: every cell hit and every hard state reached,
        # in order. A stored failure keeps it; its replay took the same path only if it went this way again.
        self.path: list[str] = []
        # Per run, what the target acknowledged, in order: what the history oracle judges its histories by.
        self.acks: dict[str, list[Accepted]] = {}
        self.reads = 0
        RUN.stats["examples"] += 1

    @classmethod
    def bound(cls, target: TargetInfo) -> type[MachineBase]:
        """A subclass of this machine bound to ``target`` (what a replay script uses)."""
        return type(cls.__name__, (cls,), {"target": target})

    def now(self) -> datetime:
        """The target's clock (``ctx.now()``): the local clock, or the target's test clock as moved so far."""
        return self.ctx.now()

    def polls_past_expiry(
        self, expires: datetime, lease_seconds: float, poll: Callable[[int, datetime], Polled]
    ) -> Iterator[Polled]:
        """The polls of a worker waiting to be handed a lease that ends at ``expires``: ``poll(hold, until)``
        again and again until a redelivery is overdue (a whole lease plus 5 s past the expiry). Each holds at
        most 10 s; with a test clock its hold ends at the expiry, so just as much time passes as in real time."""
        deadline = max(expires, self.now()) + timedelta(seconds=lease_seconds + 5)
        while self.now() < deadline:
            hold = max(1, min(10, int((deadline - self.now()).total_seconds())))
            yield poll(hold, max(expires, self.now()) + EXPIRY_STEP)

    def redelivery_overdue(self, requirement: str, task: str, expires: datetime, attempt: str) -> CheckFailure:
        """The violation of ``requirement`` when :meth:`polls_past_expiry` ran out: ``task`` was not handed
        out again (as ``attempt``) after its lease expired."""
        return self.violation(
            requirement,
            f"{task} was never redelivered after its lease expired at {expires.isoformat()}",
            expected=f"a lease of {task} with {attempt}",
            received="none",
        )

    def register_workers(self, n: int) -> None:
        """Register ``n`` workers on the example's queue."""
        self.workers = [self.run(self.ctx.register(self.queue)) for _ in range(n)]

    # -- running requests ----------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        self._unless_stopping(coro)
        try:
            return self.loop.run_until_complete(coro)
        except Indeterminate as exc:
            RUN.unknown.append(exc)
            raise

    def call(self, coro: Coroutine[Any, Any, Reply]) -> Reply | None:
        """One request; ``None`` when no answer arrived (the request is *maybe applied*: the caller must
        keep its invariants true for both outcomes and never blame the target)."""
        self._unless_stopping(coro)
        try:
            # Not through run(): an unknown outcome handled here as maybe applied did not escape the step.
            reply = self.loop.run_until_complete(coro)
        except HarnessError as exc:
            self.reached("response_lost")
            note(f"no response (maybe applied): {exc}")
            return None
        note(reply.exchange.summary())
        if reply.status != 200 and reply.reason in OUTCOME_EVENTS:
            event(OUTCOME_EVENTS[reply.reason])
        return reply

    @staticmethod
    def sent_of(reply: Reply, sent: datetime) -> datetime:
        """When the delivery that was answered left (client clock): under --faults a poll resent after a lost
        answer left later than the step began, and the server judged it at that later time."""
        if reply.resent:
            return max(sent, datetime.fromtimestamp(reply.exchange.started_at, UTC))
        return sent

    @staticmethod
    def outcome(reply: Reply) -> str:
        """'ok' for a 200, else the reason (``http_<status>`` when the body names none)."""
        return "ok" if reply.status == 200 else (reply.reason or f"http_{reply.status}")

    # -- verdicts ------------------------------------------------------------------------------------

    def reached(self, state: str) -> None:
        self.path.append(state)
        if not self.ledger[state]:
            event(f"cell reached: {self.name}.{state}")
        self.ledger[state] += 1

    def hit(self, entity: str, state: str, operation: str, actor: Actor) -> None:
        """Count a judged exchange in its coverage cell: the entity's state as the model tracked it when the call
        left (or as the answer settled it), the operation, and who made it. A cell the model does not have is the
        machine's own bug (``ValueError``); the unit tests drive every classifier."""
        key = cell_key(entity, state, operation, actor)
        if not known_cell(key):
            raise ValueError(f"{type(self).__name__} hit {key}, which is not a cell of the coverage model")
        self.cells[key] += 1
        self.path.append(key)

    def sweep(self) -> None:
        """A deterministic phase over the cells the examples left cold, for the machines that define one."""

    @classmethod
    def sweeps(cls) -> bool:
        """Whether the runner runs :meth:`sweep` after the examples (when they found nothing): the machine
        defines one. Asked of the method itself, so a sweep is never defined and then left unrun."""
        return cls.sweep is not MachineBase.sweep

    def sweep_rounds(self, one_round: Callable[[], None], rounds: int = 3) -> None:
        """Run a sweep's round again (each plans from the cells still cold) while the last one reached a new cell
        and cold cells remain: under --faults a lost answer leaves an instance unjudged, and a fresh one, on
        queues and runs of its own, is made for it. Without faults the first round reaches what it plans, so a
        second plans nothing and costs nothing."""
        for _ in range(rounds):
            before = sum(1 for n in self.cells.values() if n)
            one_round()
            if sum(1 for n in self.cells.values() if n) == before:
                return

    def sweep_start(self, start: Callable[[], R]) -> R | None:
        """A sweep instance's set-up (registrations, a run started): ``None`` when a fault left an outcome of it
        unknown. The instance is dropped before any of its answers was judged, and the sweep goes on with the
        others (each works a queue and runs of its own)."""
        try:
            return start()
        except Indeterminate:
            self.ledger["sweep_instance_dropped_by_faults"] += 1
            return None

    def run_generation(self, run: RunShadow) -> int:
        """The run's number within its workflow (> 1: it began with a continue-as-new); machines that follow
        continue-as-new chains say more."""
        return 1

    def hit_run(self, run: RunShadow, operation: str, actor: Actor) -> None:
        """Count an exchange about ``run`` in its cell (its state before the exchange changed it)."""
        state = run_state(run, self.run_generation(run))
        if state is not None:
            self.hit("run", state, operation, actor)

    def violation(
        self,
        requirement: str,
        message: str,
        *,
        expected: Any = None,
        received: Any = None,
        replies: list[Reply] | None = None,
    ) -> CheckFailure:
        failure = CheckFailure(
            message,
            expected=expected,
            received=received,
            exchanges=[r.exchange for r in replies or []] or self.client.exchanges[-4:],
            requirement=requirement,
        )
        RUN.found.append(failure)
        return failure

    def unexpected(self, reply: Reply, requirement: str, message: str, expected: Any, shown: str = "") -> CheckFailure:
        """The failure of ``requirement`` when ``reply`` is not what was ``expected``: it shows the answer's status
        and reason, then ``shown`` (what else of the answer matters)."""
        received = f"{reply.status} {reply.reason}" + (f" {shown}" if shown else "")
        return self.violation(requirement, message, expected=expected, received=received, replies=[reply])

    def disallowed(self, requirement: str, what: str, allowed: set[str], reply: Reply) -> CheckFailure:
        """The failure of ``requirement`` when ``reply`` is none of the outcomes (``ok`` or a reason) the model
        allows ``what``."""
        expected = sorted(allowed)
        return self.unexpected(reply, requirement, f"{what}: the model allows {expected}", " or ".join(expected))

    def expect_status(self, reply: Reply, status: int, requirement: str, message: str, expected: Any = None) -> None:
        """``reply`` answers ``status``, or the machine fails ``requirement``."""
        if reply.status != status:
            raise self.unexpected(reply, requirement, message, status if expected is None else expected)

    def expect_signal_received(self, reply: Reply, run: RunShadow) -> None:
        """§12.2: a signal to an open run answers 202 ``outcome: "signal_received"``."""
        outcome = reply.json().get("outcome")
        if reply.status != 202 or outcome != "signal_received":
            raise self.unexpected(
                reply,
                "SIGNAL-RECORDED-AND-WAKES",
                f"a signal to open run {run.run_id} is accepted",
                '202 outcome "signal_received"',
                f"outcome={outcome!r}",
            )

    @contextlib.contextmanager
    def judged(self, *replies: Reply) -> Iterator[None]:
        """Turn a :class:`Violation` raised by a pure judge inside the block into this machine's failure, with
        ``replies`` (or the latest exchanges) as the evidence."""
        try:
            yield
        except Violation as v:
            raise self.violation(
                v.requirement, v.message, expected=v.expected, received=v.received, replies=list(replies)
            ) from None

    # -- polls ---------------------------------------------------------------------------------------

    def lost_poll(self) -> None:
        """A poll whose answer was lost, or came to a resend, may have leased a task the model does not know
        of: the machine marks what that poll could have leased as uncertain."""
        raise NotImplementedError

    def check_poll_shape(self, reply: Reply, what: str = "workflow-task") -> dict[str, Any]:
        """§7.4 and §16.17: a poll of a registered worker answers 200 with ``poll_status``, and ``task`` is
        non-null exactly when ``poll_status`` is ``leased``. Returns the body."""
        body = reply.json()
        if reply.status != 200 or "poll_status" not in body:
            raise self.unexpected(
                reply,
                "POLL-STATUS-PRESENT",
                f"a {what} poll of a registered worker answers 200 with poll_status",
                "200 with poll_status",
                f"keys={sorted(body)}",
            )
        if (body.get("task") is not None) != (body.get("poll_status") == "leased"):
            raise self.unexpected(
                reply,
                "POLL-STATUS-TASK-IFF-LEASED",
                "task != null iff poll_status == leased",
                "consistent",
                f"poll_status={body.get('poll_status')!r} with task {'null' if body.get('task') is None else 'set'}",
            )
        return body

    def next_read(self) -> ReadStyle:
        """The read style of the next workflow-task poll (the styles in turn)."""
        style = READ_STYLES[self.reads % len(READ_STYLES)]
        self.reads += 1
        return style

    def poll_once(
        self, send: Coroutine[Any, Any, Reply], what: str = "workflow-task", style: ReadStyle = READ_STYLES[0]
    ) -> Polled:
        """One poll, shape-checked; a lost or resent answer calls :meth:`lost_poll`."""
        acked = {run_id: len(acks) for run_id, acks in self.acks.items()}
        sent = self.now()
        reply = self.call(send)
        if reply is None or reply.resent:
            self.lost_poll()
        received = self.now()
        if reply is None:
            return Polled(None, {}, sent, received, acked, style)
        return Polled(reply, self.check_poll_shape(reply, what), self.sent_of(reply, sent), received, acked, style)

    def poll_race(
        self,
        n: int,
        make: Callable[[int], Coroutine[Any, Any, Reply]],
        what: str = "workflow-task",
        style: ReadStyle = READ_STYLES[0],
    ) -> list[tuple[int, Polled]]:
        """``n`` polls released together; the answered ones as (index, poll), each shape-checked. A lost or
        resent answer calls :meth:`lost_poll`."""
        acked = {run_id: len(acks) for run_id, acks in self.acks.items()}
        sent = self.now()
        results = self.run(race(n, make))
        received = self.now()
        answered: list[tuple[int, Polled]] = []
        for i, res in enumerate(results):
            if isinstance(res, HarnessError):
                self.reached("response_lost")
                note(f"race poll {i}: no response (maybe applied): {res!r}")
                self.lost_poll()
                continue
            if isinstance(res, BaseException):
                raise res
            if res.resent:
                self.lost_poll()
            note(res.exchange.summary())
            body = self.check_poll_shape(res, what)
            answered.append((i, Polled(res, body, self.sent_of(res, sent), received, acked, style)))
        return answered

    def granted_once(self, polls: list[tuple[int, Polled]], key: Callable[[dict[str, Any]], Any], req: str) -> None:
        """Dispatch, Lease and Hooks "one valid lease": no two polls of one race were granted the same ``key(task)``."""
        granted: dict[Any, list[Reply]] = {}
        for _, p in polls:
            if p.task is not None and p.reply is not None:
                granted.setdefault(key(p.task), []).append(p.reply)
        for k, replies in granted.items():
            if len(replies) > 1:
                raise self.violation(
                    req,
                    f"{plural(len(replies), 'concurrent poll')} were granted {k}",
                    expected="exactly one lease",
                    received=len(replies),
                    replies=replies,
                )

    def leased_run(self, task: dict[str, Any], worker: str, runs: Mapping[str, RunT], reply: Reply) -> RunT:
        """The run a granted workflow-task lease belongs to: one this example started on its queue, leased to
        the poller (§16.22 "lease_owner == the poller's worker_id")."""
        run = runs.get(str(task.get("run_id")))
        if run is None:
            expected = "a run started on this example's queue"
            message = "leased a task of a run this queue never started"
            raise self.unexpected(reply, "LEASE-OWNER-IS-POLLER", message, expected, f"run_id={task.get('run_id')!r}")
        if task.get("lease_owner") != worker:
            owner = f"lease_owner={task.get('lease_owner')!r}"
            raise self.unexpected(reply, "LEASE-OWNER-IS-POLLER", "lease_owner is the poller", worker, owner)
        return run

    # -- runs ----------------------------------------------------------------------------------------

    def close_by_control(self, run: RunShadow, kind: str, reason: str = "conformance") -> Reply | None:
        """Cancel or terminate ``run`` (§12.2): an open run answers 200 and its shadow steps to cancelled or
        terminated, a closed one refuses (409). Returns the answer when the model could judge it, else None
        (no answer, or the run was already uncertain)."""
        closing = Kind.CANCEL if kind == "cancel" else Kind.TERMINATE
        reply = self.call(self.client.control("POST", f"/workflows/{run.workflow_id}/{kind}", {"reason": reason}))
        if reply is None:
            run.uncertain = True
            self.ack(run.run_id, closing, applied=Applied.MAYBE)
            return None
        self.touched.add(run.run_id)
        if run.uncertain:
            if reply.status == 200:
                self.ack(run.run_id, closing)
            return None
        if run.open:
            self.expect_status(reply, 200, "CONTROL-CANCEL-CLOSES-RUN", f"{kind} of an open run")
            run.step(CLOSE_EVENTS[kind])
            self.ack(run.run_id, closing)
        else:
            self.expect_status(reply, 409, "CONTROL-CANCEL-CLOSES-RUN", f"{kind} of a closed run is refused")
        return reply

    def check_touched_histories(
        self, runs: Mapping[str, RunShadow], judge: Callable[[Any, list[dict[str, Any]]], None] | None = None
    ) -> None:
        """Read the control-plane history of every touched run: gap-free (§16.41), at most one terminal run
        event and exactly one once the model knows the run closed (§16.69), everything it acknowledged there once
        (the history oracle); then ``judge(run, events)``."""
        for run_id in sorted(self.touched):
            run = runs[run_id]
            events = self.run(self.ctx.history(run.workflow_id, run.run_id))
            problem = check_sequences([e.get("sequence") for e in events])
            if problem:
                raise self.violation("HISTORY-SEQUENCE-CONTIGUOUS", f"run {run_id}: {problem}")
            terminal = [str(e.get("event_type")) for e in events if e.get("event_type") in RUN_TERMINAL_EVENTS]
            if len(terminal) > 1 or (not run.uncertain and not run.open and len(terminal) != 1):
                raise self.violation(
                    "HISTORY-ONE-TERMINAL-PER-RUN",
                    f"run {run_id} ({run.status.value}) has terminal events {terminal}",
                    expected="exactly one once closed, none before",
                    received=terminal,
                )
            with self.judged():
                judge_history(events, self.acks.get(run_id, []))
            self.hit_run(run, "read_history", Actor.OPERATOR)
            if judge is not None:
                judge(run, events)
        note(f"checked {plural(len(self.touched), 'run history', 'run histories')}")
        self.touched.clear()

    # -- workflow tasks ------------------------------------------------------------------------------

    def workflow_outcomes(self, view: WorkflowTaskView, owner: str, attempt: int, at: datetime) -> set[str]:
        """The outcomes §8.9 allows ('ok' or a reason) for ``owner``'s call with ``attempt`` at ``at`` ±
        :attr:`MARGIN` (an expiry that close may land on either side)."""
        return {
            outcome(guard_workflow_task, view, task_id=view.task_id, lease_owner=owner, attempt=attempt, now=moment)
            for moment in (at - timedelta(seconds=self.MARGIN), at + timedelta(seconds=self.MARGIN))
        }

    # -- reading histories back ---------------------------------------------------------------------

    def ack(self, run_id: str, kind: Kind, key: str = "", **extra: Any) -> None:
        """Record what the target acknowledged for ``run_id`` (or maybe applied: ``applied=Applied.MAYBE``)."""
        self.acks.setdefault(run_id, []).append(Accepted(kind, key, **extra))

    def read_back(self, task: Mapping[str, Any], polled: Polled, owner: str, attempt: int) -> list[Page] | None:
        """The full history of a leased workflow task — its inline page, then every page the cursor names, in
        ``polled.style`` — judged by the history oracle against what its run had acknowledged before the poll
        left (:mod:`suite.protocol.oracle`). None when a page could not be read (the lease or the answer was
        lost): nothing is judged then."""
        replies = [polled.reply] if polled.reply is not None else []
        style = polled.style
        with self.judged(*replies):
            pages = [page_of(task, after=0, page_size=style.inline)]
        while pages[-1].has_more:
            if len(pages) >= MAX_PAGES:
                raise self.violation(
                    "HISTORY-PAGINATION-COMPLETE",
                    f"the history of task {task.get('task_id')} never ends",
                    replies=replies,
                )
            page = self.fetch_page(task, pages[-1], len(pages), owner, attempt, style)
            if page is None:
                return None
            pages.append(page)
        run_id = str(task.get("run_id"))
        last = task.get("last_history_sequence")
        with self.judged(*replies):
            events = join_pages(pages)
            judge_history(
                events,
                self.acks.get(run_id, []),
                seen_before=polled.acked.get(run_id, 0),
                last_sequence=last if isinstance(last, int) else None,
            )
        self.reached("task_history_read")
        if len(pages) > 1:
            self.reached("task_history_paged")
        if any(p.compressed for p in pages):
            self.reached("task_history_compressed")
        return pages

    def fetch_page(
        self, task: Mapping[str, Any], previous: Page, n: int, owner: str, attempt: int, style: ReadStyle
    ) -> Page | None:
        """The page after ``previous`` (§8.4), by the cursor ``style`` names for page ``n``."""
        assert previous.next_after is not None
        body: dict[str, Any] = {"page_size": style.page}
        by_token = style.cursor == "token" or (style.cursor == "alternate" and n % 2 == 1)
        if by_token and previous.token is not None:
            body["next_history_page_token"] = previous.token
        else:
            body["after_sequence"] = previous.next_after
        if style.encoding is not None:
            body["accept_history_encoding"] = style.encoding
        call = self.ctx.wf_call({"task_id": task.get("task_id")}, "history", body, owner=owner, attempt=attempt)
        reply = self.call(call)
        if reply is None or reply.status != 200:
            note(f"history page {n + 1} of task {task.get('task_id')} not read: the history stays unjudged")
            return None
        with self.judged(reply):
            return page_of(reply.json(), after=previous.next_after, page_size=style.page)

    def teardown(self) -> None:
        # Hypothesis calls teardown in the ``finally`` of an example, so an exception that ends the example is the
        # one being handled here. Only one raised through this machine's own code is the example's: a teardown
        # after a passing example may run while an exception of Hypothesis' engine is being handled further up.
        # Hypothesis' own exceptions (a rejected example, a draw that went another way, the end of a test case)
        # are its control flow, not what the example raised.
        ending = sys.exc_info()[1]
        if isinstance(ending, Exception) and not isinstance(ending, HypothesisException) and self._raised_here(ending):
            # What ended the example keeps the program that led to it and the path it took (Hypothesis printed
            # the failing step before it called teardown).
            ending.dw_steps = "\n".join(RUN.printed)  # type: ignore[attr-defined]
            ending.dw_path = list(self.path)  # type: ignore[attr-defined]
            RUN.escaped.append(ending)
        RUN.stats["requests"] += len(self.client.exchanges)
        try:
            self.loop.run_until_complete(self.client.aclose())  # not through run(): closed even when stopping
        finally:
            self.loop.close()

    @staticmethod
    def _unless_stopping(coro: Coroutine[Any, Any, Any]) -> None:
        if STOPPING.is_set():
            coro.close()  # never awaited: closed so that it is not reported as such
            raise Stopped

    def _raised_here(self, exc: BaseException) -> bool:
        """Whether ``exc`` went through a method of this machine (a rule, an invariant, or what they called)."""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_locals.get("self") is self:
                return True
            tb = tb.tb_next
        return False
