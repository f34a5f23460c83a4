"""Running the registry: one pytest item per entry, one runner per kind, one record type out.

The plugin collects :class:`SuiteCollector` (node id ``dw``) in place of any test module. It yields one
:class:`EntryItem` per entry of :func:`suite.registry.entries`, under a collector per requirement (checks)
or per kind, so the ids are ``dw::VERSION-TRIM::version_trimmed``, ``dw::machine::workflow_leases``,
``dw::fuzz::worker-registration`` wherever the suite is installed — and one item is re-run by naming it:
``pytest --target=URL dw::VERSION-TRIM::version_trimmed``.

An item runs its entry with the runner of its kind (:data:`RUNNERS`), which returns
:class:`~suite.outcomes.Record`\\ s; the item attaches them to its report (they cross from xdist workers to
the controller that way) and ends as a pytest failure, skip or pass by their verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from suite.protocol.requirements import REGISTRY, applicable

from .context import CheckContext, TargetInfo, target_client
from .outcomes import (
    CheckFailure,
    HarnessError,
    Indeterminate,
    Kind,
    NotCovered,
    Record,
    Unimplemented,
    Verdict,
    broken,
)
from .registry import Check, entries
from .settings import RunSettings
from .text import plural

__all__ = [
    "FAULT_ATTEMPTS",
    "FAULT_RERUN_SECONDS",
    "MACHINE_COUNT_KEY",
    "OVERLAP_KEY",
    "RECORD_KEY",
    "RUNNERS",
    "RUN_KEY",
    "SETTINGS_KEY",
    "TARGET_KEY",
    "EntryItem",
    "SuiteCollector",
    "judge",
    "records_of",
    "run_check",
    "run_first_failures_first",
]

RECORD_KEY = "dw_record"
TARGET_KEY = pytest.StashKey[TargetInfo]()
SETTINGS_KEY = pytest.StashKey[RunSettings]()
RUN_KEY = pytest.StashKey[dict[str, Any]]()  # run_id, started_at, seed, command line
MACHINE_COUNT_KEY = pytest.StashKey[int]()  # the machine items this process runs (a campaign splits its time)
_CAMPAIGN_KEY = pytest.StashKey[Any]()  # this process's suite.campaign.CampaignClock
# The machines the example database holds failures of for this target, read once by the controller (its workers
# get the list, so every process orders its items alike): they run first.
STORED_KEY = pytest.StashKey[list[str]]()
OVERLAP_KEY = pytest.StashKey[Any]()  # this process's suite.overlap.Overlap, when checks overlap

# Under --faults a check whose request met a fault that left its outcome unknown runs again in a fresh world:
# at most FAULT_ATTEMPTS times in all, and after the first few only while its attempts have taken less than
# FAULT_RERUN_SECONDS (a check of many requests rarely runs clean; a slow one must not run for ever). Then it
# is a harness error, never the target's failure.
FAULT_ATTEMPTS = 40
# Without --faults a check runs again only when delays, not the target, decided an answer it would judge (a
# lease or timeout that may have lapsed on its own while a loaded machine held the check back): three times.
TIMING_ATTEMPTS = 3
FAULT_RERUN_SECONDS = 180.0
_FAULT_ATTEMPTS_ALWAYS = 4


# -- collection -----------------------------------------------------------------------------------------


class SuiteCollector(pytest.File):
    """The whole suite, as node ``dw``: a collector per requirement (checks) or per kind, one item per entry."""

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        groups: dict[str, list[Check]] = {}
        for entry in entries():
            groups.setdefault(entry.group, []).append(entry)
        for name, members in groups.items():
            yield EntryGroup.from_parent(self, name=name, members=members)


class EntryGroup(pytest.Collector):
    def __init__(self, *, members: list[Check], **kw: Any) -> None:
        super().__init__(**kw)
        self.members = members

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        for entry in self.members:
            yield EntryItem.from_parent(self, name=entry.name, entry=entry)


class EntryItem(pytest.Item):
    """One entry of the registry; markers ``dw_check`` / ``dw_machine`` / ``dw_fuzz`` select a kind."""

    def __init__(self, *, entry: Check, **kw: Any) -> None:
        super().__init__(**kw)
        self.entry = entry
        self.add_marker(f"dw_{entry.kind.value}")
        if entry.slow:
            self.add_marker("conformance_slow")

    def runtest(self) -> None:
        config = self.config
        target, settings = config.stash[TARGET_KEY], config.stash[SETTINGS_KEY]
        overlap = config.stash.get(OVERLAP_KEY, None)
        if overlap is not None and self.entry.restarts:
            overlap.drain()  # a restart runs alone: no check started ahead may be in flight
        with restart_guard(target, exclusive=self.entry.restarts):
            if overlap is not None and _overlaps(self.entry, overlap.blocks()):
                ran = overlap.take(self.nodeid, self._ahead(overlap.blocks()))
            else:
                ran = RUNNERS[self.entry.kind](self.entry, target, settings, config)
        records = [replace(r, test_id=self.nodeid) for r in ran]
        foreign = foreign_clock(target)
        if foreign is not None:  # whatever the entry saw cannot be held against the target
            records = [
                replace(r, verdict=Verdict.ERROR, message=str(foreign), failed_requirement=None) for r in records
            ]
        for record in records:
            self.user_properties.append((RECORD_KEY, json.dumps(record.to_json(), default=str)))
        _conclude(self.entry, records, target, settings)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.nodeid

    def _ahead(self, blocks: bool) -> list[tuple[str, Check]]:
        """This item and the run's items after it that may overlap it: those up to the next item that may not,
        or that must run alone. Under xdist only the items this worker was handed count (suite.overlap)."""
        order = _run_order(self)
        out: list[tuple[str, Check]] = []
        for item in order[order.index(self) :]:
            entry = getattr(item, "entry", None)
            if not isinstance(item, EntryItem) or entry is None or not _overlaps(entry, blocks):
                break
            out.append((item.nodeid, entry))
        return out


def _overlaps(entry: Check, blocks: bool) -> bool:
    """Whether an entry may run ahead of its turn beside others: one that does not restart the target, and a
    check unless machines and fuzz groups run ahead too (``blocks``)."""
    return not entry.restarts and (blocks or entry.kind is Kind.CHECK)


def _run_order(item: pytest.Item) -> list[pytest.Item]:
    """The items this process will run, in order, from ``item`` on: the session's, or under xdist the ones this
    worker was handed so far (the worker's queue of item indices, read under its lock without taking from it)."""
    session = item.session
    if getattr(item.config, "workerinput", None) is None:
        return list(session.items)
    here = session.items.index(item)
    return [item, *(session.items[i] for i in _worker_queue(item.config) if i != here)]


def _worker_queue(config: pytest.Config) -> list[int]:
    """The item indices an xdist worker holds and has not started, in order ([] when there is no such queue)."""
    for plugin in config.pluginmanager.get_plugins():
        queue = getattr(plugin, "torun", None)
        if queue is None or not hasattr(queue, "lock"):
            continue
        head = getattr(plugin, "nextitem_index", None)
        with queue.lock() as items:
            rest = [i for i in items if isinstance(i, int)]
        return ([head] if isinstance(head, int) else []) + rest
    return []


@contextlib.contextmanager
def restart_guard(target: TargetInfo, *, exclusive: bool) -> Iterator[None]:
    """With a restart command, items that restart the target run alone: every other item holds a shared lock
    while it runs, a restarting item the exclusive one — across xdist workers, which share the lock file of the
    target's URL. A turnstile taken first keeps a waiting restart from being starved by a stream of new items."""
    if target.restart_command is None:
        yield
        return
    key = hashlib.sha256((target.upstream_url or target.url).encode()).hexdigest()[:16]
    base = Path(tempfile.gettempdir()) / f"dw-conformance-restart-{key}"
    with open(f"{base}.turnstile", "a") as turnstile, open(f"{base}.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


def foreign_clock(target: TargetInfo) -> HarnessError | None:
    """A harness error when someone else moved the target's test clock while an entry ran: leases expiring
    early and timers firing are then no evidence against the target (suite.timing)."""
    try:
        moved = target.clock.moved_by_others()
    except HarnessError as exc:
        return exc
    return HarnessError(moved) if moved else None


def records_of(report: pytest.TestReport) -> list[Record]:
    """The records an item attached to its report (in the controller, for every worker's items)."""
    return [Record.from_json(json.loads(str(v))) for k, v in report.user_properties if k == RECORD_KEY]


def _failing(records: list[Record], target: TargetInfo) -> list[Record]:
    """The records that fail their item: a broken rule (a SHOULD too, under ``--strict``)."""
    return [r for r in records if r.verdict is Verdict.FAILED or (r.verdict is Verdict.NON_STRICT and target.strict)]


def run_first_failures_first(session: pytest.Session) -> bool | None:
    """The run loop under ``-x`` / ``--maxfail`` while items overlap (suite.overlap): pytest's own, except that
    an item started ahead which has already failed (a broken rule or a harness error) reports before the item
    whose turn it is, so the run stops at the first failure in time rather than the first in the run's order.
    None (pytest's loop) otherwise, and in an xdist worker, which runs its own loop."""
    config = session.config
    overlap = config.stash.get(OVERLAP_KEY, None)
    if overlap is None or not config.option.maxfail or getattr(config, "workerinput", None) is not None:
        return None
    if session.testsfailed and not config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{plural(session.testsfailed, 'error')} during collection")
    target = config.stash[TARGET_KEY]

    def fails(records: list[Record]) -> bool:
        return bool(_failing(records, target)) or any(r.verdict is Verdict.ERROR for r in records)

    rest = list(session.items)
    while rest:
        chosen = overlap.next_item([item.nodeid for item in rest], fails)
        item = next(i for i in rest if i.nodeid == chosen)
        rest.remove(item)
        config.hook.pytest_runtest_protocol(item=item, nextitem=rest[0] if rest else None)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


def _conclude(entry: Check, records: list[Record], target: TargetInfo, settings: RunSettings) -> None:
    """The item's pytest outcome: failed for a broken rule, failed (marked harness error) for an error, skipped
    when nothing was judged."""
    failing = _failing(records, target)
    seed = f"\nseed: {settings.seed}" if entry.kind is not Kind.CHECK else ""
    if failing:
        lines = [f"[{r.failed_requirement}] {r.check}: {r.message}" for r in failing]
        lines += sorted({f"replay bundle: {r.replay}" for r in failing if r.replay})
        pytest.fail("\n\n".join(lines) + seed, pytrace=False)
    errors = [r for r in records if r.verdict is Verdict.ERROR]
    if errors:
        text = "\n".join(f"{r.check}: {r.message}" for r in errors)
        pytest.fail(f"harness error (not a conformance failure):\n{text}", pytrace=False)
    silent = (Verdict.NOT_COVERED, Verdict.UNIMPLEMENTED, Verdict.NOT_APPLICABLE)
    if records and all(r.verdict in silent for r in records):
        first = records[0]
        setting = f" (to cover it: {first.setting})" if first.setting else ""
        pytest.skip(f"{first.verdict.value}: {first.message}{setting}")


# -- the runners --------------------------------------------------------------------------------------------

Runner = Callable[[Check, TargetInfo, RunSettings, pytest.Config], list[Record]]


def _base(entry: Check) -> Record:
    record = Record(entry.kind, entry.record_name, entry.test_id, entry.requirements)
    return replace(record, doc=entry.doc, capability=entry.capability)


def run_check(check: Check, target: TargetInfo, settings: RunSettings, config: pytest.Config) -> list[Record]:
    """Run one check (again in a fresh world while a fault leaves its outcome unknown) and judge it."""
    return asyncio.run(check_records(check, target))


async def check_records(check: Check, target: TargetInfo) -> list[Record]:
    """:func:`run_check` on the running event loop, where checks overlapped by :mod:`suite.overlap` run."""
    record = _base(check)
    if not any(applicable(REGISTRY[r], target.certified_minor) for r in check.requirements):
        message = f"not applicable when certifying protocol {target.protocol_version}"
        return [replace(record, verdict=Verdict.NOT_APPLICABLE, message=message)]
    advertised = check.capability is None or bool(target.server_capabilities.get(check.capability))
    started = time.monotonic()
    attempts = FAULT_ATTEMPTS if target.fault_ledger is not None else TIMING_ATTEMPTS
    unknown: list[str] = []
    for n in range(attempts):
        if n >= _FAULT_ATTEMPTS_ALWAYS and time.monotonic() - started > FAULT_RERUN_SECONDS:
            break
        ctx, outcome = await _attempt(check, target)
        if not isinstance(outcome, Indeterminate):
            break
        unknown.append(str(outcome))  # a fresh world (new queues and ids) for the next attempt
    if unknown:
        last_unknown = isinstance(outcome, Indeterminate)
        record = replace(record, fault_reruns=len(unknown) - int(last_unknown), indeterminate=tuple(unknown[:5]))
        if last_unknown:
            why = "met a fault" if target.fault_ledger is not None else "could not judge"
            outcome = Indeterminate(f"{plural(len(unknown), 'attempt')} in a row {why}; the last: {unknown[-1]}")
    schema_problems = [(e, err) for e in ctx.exchanges for err in e.schema_errors]
    if outcome is None and schema_problems:
        ex, err = schema_problems[0]
        outcome = CheckFailure(
            f"response does not match its schema: {err}",
            expected="a schema-valid response",
            received=ex.summary(),
            exchanges=[ex],
            requirement="SCHEMA-RESPONSES",
        )
    if isinstance(outcome, KeyboardInterrupt):
        raise outcome
    verdict, message, exchanges, failed_req = judge(check, outcome, advertised, target)
    return [
        replace(
            record,
            verdict=verdict,
            message=message,
            failed_requirement=failed_req,
            setting=outcome.setting if isinstance(outcome, NotCovered) else None,
            exchanges=tuple(e.to_json() for e in exchanges),
            duration_seconds=round(time.monotonic() - started, 3),
            requests=len(ctx.exchanges),
        )
    ]


async def _attempt(check: Check, target: TargetInfo) -> tuple[CheckContext, BaseException | None]:
    """One run of a check in its own world; its outcome (``None``: it passed)."""
    client = target_client(target, validator=_validator())
    ctx = CheckContext(target=target, client=client, check_name=check.name)
    assert check.fn is not None
    try:
        try:
            await check.fn(ctx)
        finally:
            await client.aclose()
    except asyncio.CancelledError:
        raise  # the run stopped (suite.overlap cancels the checks started ahead of it)
    except BaseException as exc:
        return ctx, exc
    return ctx, None


def judge(
    check: Check, outcome: BaseException | None, advertised: bool, target: TargetInfo
) -> tuple[Verdict, str, list[Any], str | None]:
    """A check's outcome as a verdict, its message, the evidence and the requirement it broke."""
    if outcome is None:
        if not advertised:
            return Verdict.INFORMATIONAL, f"works, but {check.capability!r} is not advertised", [], None
        return Verdict.PASSED, "", [], None
    if isinstance(outcome, CheckFailure):
        req_id = outcome.requirement if outcome.requirement in REGISTRY else check.requirements[0]
        assert req_id is not None
        if not advertised:
            message = f"{check.capability!r} not advertised; {outcome}"
            return Verdict.UNIMPLEMENTED, message, outcome.exchanges, req_id
        return broken(req_id), str(outcome), outcome.exchanges, req_id
    if isinstance(outcome, NotCovered):
        return Verdict.NOT_COVERED, outcome.reason, [], None
    if isinstance(outcome, Unimplemented):
        return Verdict.UNIMPLEMENTED, str(outcome), [], None
    if isinstance(outcome, HarnessError):
        return Verdict.ERROR, str(outcome), [], None
    tb = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
    return Verdict.ERROR, f"the check raised {tb}", [], None


_VALIDATOR: Any = None


def _validator() -> Any:
    global _VALIDATOR
    if _VALIDATOR is None:
        from .schema_check import ResponseValidator

        _VALIDATOR = ResponseValidator()
    return _VALIDATOR


def run_machine_entry(entry: Check, target: TargetInfo, settings: RunSettings, config: pytest.Config) -> list[Record]:
    """Run one state machine with the session's budget and seed; one record per requirement it judges."""
    from .machines.runner import MachineBudget, run_machine

    budget = MachineBudget(
        examples=settings.budget.machine_examples,
        steps=settings.budget.machine_steps,
        shrink=settings.shrink,
        seed=settings.seed,
    )
    replay_dir = Path(settings.report_dir) / str(config.stash[RUN_KEY]["run_id"]) / "replay"
    campaign = _campaign_of(target, settings, config)
    result = run_machine(entry.subject, target, budget, replay_dir, campaign)
    return [replace(r, doc=entry.doc) for r in result.records]


def stored_failure_machines(target: TargetInfo, settings: RunSettings) -> list[str]:
    """The machines whose stored failures the example database holds for this target (none without one, or when
    it cannot be read now: the machine says so when it runs)."""
    if settings.example_db is None:
        return []
    from .campaign import open_store, target_identity
    from .machines import MACHINES

    try:
        store = open_store(settings.example_db, readonly=True)
    except ValueError:
        return []
    identity = target_identity(
        target.cluster_info, target.upstream_url or target.url, target.embedded, settings.example_db_target
    )
    return [cls.name for cls in MACHINES if store.replays.entries(identity, cls.name)]


def stored_failures_first(items: list[pytest.Item], machines: list[str]) -> list[pytest.Item]:
    """The items of ``machines`` first, in their order, then the rest in theirs: a run replaying what campaigns
    found (a CI job) fails on it in its first seconds, not after the checks that take minutes."""

    def stored(item: pytest.Item) -> bool:
        entry: Check | None = getattr(item, "entry", None)
        return entry is not None and entry.kind is Kind.MACHINE and getattr(entry.subject, "name", None) in machines

    first = [item for item in items if stored(item)]
    return first + [item for item in items if not stored(item)]


def _campaign_of(target: TargetInfo, settings: RunSettings, config: pytest.Config) -> Any:
    """The campaign a machine runs in (suite.machines.runner.Campaign), or None for a plain run."""
    if settings.campaign_seconds is None and settings.example_db is None:
        return None
    from .campaign import CampaignClock, open_store, suite_build, target_identity
    from .machines.runner import Campaign

    clock = None
    if settings.campaign_seconds is not None:
        clock = config.stash.get(_CAMPAIGN_KEY, None)
        if clock is None:
            machines = config.stash.get(MACHINE_COUNT_KEY, 1)
            clock = CampaignClock(settings.campaign_seconds, machines, settings.campaign_progress)
            config.stash[_CAMPAIGN_KEY] = clock
    try:
        store = None if settings.example_db is None else open_store(settings.example_db, settings.example_db_readonly)
    except ValueError as exc:  # reached when the run began: it went away since
        raise HarnessError(f"--example-db={settings.example_db}: {exc}") from None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        """A line on the terminal while the item runs (its own output is captured meanwhile)."""
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(line)

    identity = target_identity(
        target.cluster_info, target.upstream_url or target.url, target.embedded, settings.example_db_target
    )
    return Campaign(
        store=store,
        build=suite_build(),
        target=identity,
        clock=clock,
        worker=settings.campaign_worker,
        workers=settings.campaign_workers,
        say=say,
    )


def run_fuzz_entry(entry: Check, target: TargetInfo, settings: RunSettings, config: pytest.Config) -> list[Record]:
    """Fuzz one group of operations with the session's budget and seed; records per operation and rule."""
    from .fuzz import FuzzBudget, fuzz_group

    if settings.budget.fuzz_examples <= 0:
        pytest.skip("fuzzing disabled (--fuzz-examples 0)")
    budget = FuzzBudget(examples=settings.budget.fuzz_examples, seed=settings.seed)
    return [r for result in fuzz_group(target, str(entry.subject), budget) for r in result.records(target, entry.name)]


RUNNERS: dict[Kind, Runner] = {Kind.CHECK: run_check, Kind.MACHINE: run_machine_entry, Kind.FUZZ: run_fuzz_entry}
