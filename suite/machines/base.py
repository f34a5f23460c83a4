"""What every protocol state machine shares: a target, a recording client on its own event loop, a
per-example world, a step log, the coverage ledger and the "maybe applied" rule.

Hypothesis rules are synchronous; each machine owns one event loop and runs every request (and every
race, released together behind an :class:`asyncio.Barrier`) on it with :meth:`MachineBase.run`. The
verdict always comes from the pure model (``suite.protocol``): a rule computes what the protocol allows
before it looks at what the target answered.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from hypothesis import note as _hypothesis_note
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine

from suite.client import ProtocolClient, Reply
from suite.context import CheckContext, TargetInfo
from suite.outcomes import CheckFailure, HarnessError, Indeterminate

__all__ = ["FOUND", "LEDGER", "UNKNOWN", "MachineBase", "note", "race"]

R = TypeVar("R")

# How often each hard state was reached in this process, per machine (the coverage ledger).
LEDGER: dict[str, Counter[str]] = {}
# Every violation a machine raised in this process, in order: under --faults a failing sequence may not fail
# again when Hypothesis replays it (the faults differ), and the first violation is then the evidence.
FOUND: list[CheckFailure] = []
# Every time a step could not go on because a fault left an outcome unknown (the example is then discarded).
UNKNOWN: list[Indeterminate] = []


def note(text: str) -> None:
    """Record a line with the failing example (Hypothesis' ``note``); outside a Hypothesis run — a replay
    script — print it instead, so the replay shows the same exchanges."""
    try:
        _hypothesis_note(text)
    except InvalidArgument:
        print(text, file=sys.stderr)


async def race(n: int, make: Callable[[int], Awaitable[R]]) -> list[R | BaseException]:
    """Run ``make(i)`` for i in 0..n-1 released together: each coroutine waits on one barrier first, so
    the requests leave as close to simultaneously as the event loop allows."""
    barrier = asyncio.Barrier(n)

    async def one(i: int) -> R:
        await barrier.wait()
        return await make(i)

    return list(await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True))


class MachineBase(RuleBasedStateMachine):
    """Base of the protocol machines. ``target`` is bound by the runner (or a replay script)."""

    target: ClassVar[TargetInfo | None] = None
    name: ClassVar[str] = "machine"

    def __init__(self) -> None:
        super().__init__()
        if self.target is None:
            raise RuntimeError("bind a target first: Machine.bound(target_info) or the pytest plugin")
        self.loop = asyncio.new_event_loop()
        self.client = ProtocolClient(
            self.target.url,
            worker_token=self.target.worker_token,
            operator_token=self.target.operator_token,
            namespace=self.target.namespace,
            worker_version=self.target.protocol_version,
            timeout=30.0,
            faults=self.target.fault_ledger,
        )
        self.ctx = CheckContext(target=self.target, client=self.client, check_name=self.name, tag=secrets.token_hex(3))
        self.ledger = LEDGER.setdefault(self.name, Counter())

    @classmethod
    def bound(cls, target: TargetInfo) -> type[MachineBase]:
        """A subclass of this machine bound to ``target`` (what a replay script uses)."""
        return type(cls.__name__, (cls,), {"target": target})

    # -- running requests ----------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        try:
            return self.loop.run_until_complete(coro)
        except Indeterminate as exc:
            UNKNOWN.append(exc)
            raise

    def call(self, coro: Coroutine[Any, Any, Reply]) -> Reply | None:
        """One request; ``None`` when no answer arrived (the request is *maybe applied*: the caller must
        keep its invariants true for both outcomes and never blame the target)."""
        try:
            # Not through run(): an unknown outcome handled here as maybe applied did not escape the step.
            reply = self.loop.run_until_complete(coro)
        except HarnessError as exc:
            self.reached("response_lost")
            note(f"no response (maybe applied): {exc}")
            return None
        note(reply.exchange.summary())
        return reply

    @staticmethod
    def sent_of(reply: Reply, sent: datetime) -> datetime:
        """When the delivery that was answered left (client clock): under --faults a poll resent after a lost
        answer left later than the step began, and the server judged it at that later time."""
        if reply.resent:
            return max(sent, datetime.fromtimestamp(reply.exchange.started_at, UTC))
        return sent

    def reached(self, state: str) -> None:
        self.ledger[state] += 1

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
        FOUND.append(failure)
        return failure

    def teardown(self) -> None:
        try:
            self.run(self.client.aclose())
        finally:
            self.loop.close()
