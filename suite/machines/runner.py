"""Running a machine as part of ``pytest --target``: budget, seed, verdicts, coverage ledger and the
replay bundle of a failure.

A machine judges several requirements. It passes a requirement only if the run reached the hard state
that requirement needs (the coverage ledger): a requirement whose state was never reached is
``not-covered``, never ``passed``. A failure is shrunk by Hypothesis; the final, minimal step program is
written to ``reports/<run-id>/replay/<machine>/`` as a runnable script, with the seed and the exchanges.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.reporting import with_reporter
from hypothesis.stateful import get_state_machine_test, initialize

from suite.campaign import CampaignClock, Store, check_program, worker_seed
from suite.context import TargetInfo
from suite.outcomes import CheckFailure, HarnessError, Indeterminate, Kind, NotCovered, Record, Verdict, broken
from suite.protocol.requirements import REGISTRY, applicable
from suite.text import plural

from ..outcomes import Stopped
from .base import CELLS, LEDGER, RUN, MachineBase, record_step

__all__ = ["Campaign", "MachineBudget", "MachineResult", "judged_cells", "run_machine"]


@dataclass(frozen=True)
class MachineBudget:
    examples: int = 8
    steps: int = 40
    seed: int = 0
    # Shrinking replays the failing sequence against the target many times (minutes against a real server);
    # without it the first failing sequence is reported as found.
    shrink: bool = True


@dataclass
class Campaign:
    """What a run given --campaign or --example-db adds to a machine's run: the database (its Hypothesis keys and
    the replays of the failures it holds), the clock of a campaign (None: one round), the worker's index, and
    where the progress lines go."""

    store: Store | None
    build: str
    target: str
    clock: CampaignClock | None = None
    worker: int = 0
    workers: int | None = None
    say: Callable[[str], None] = field(default=lambda line: None)


@dataclass
class MachineResult:
    records: list[Record]
    failed: bool
    message: str
    bundle: str | None


def run_machine(
    cls: type[MachineBase],
    target: TargetInfo,
    budget: MachineBudget,
    replay_dir: Path | None,
    campaign: Campaign | None = None,
) -> MachineResult:
    """Run ``cls`` against ``target`` within ``budget``; one record per requirement the machine judges. Given a
    database, the failures it holds for this target and machine are replayed first; a still failing one is the
    outcome, and exploration does not run."""
    LEDGER[cls.name] = Counter()
    CELLS[cls.name] = Counter()
    RUN.found.clear()
    RUN.escaped.clear()  # what ended another machine's examples (and the machines it holds) is not kept
    RUN.printed.clear()
    started = time.monotonic()
    stats: dict[str, Any] = {}
    replayed: dict[str, Any] | None = None
    outcome: BaseException | None
    examples_before, requests_before = RUN.stats["examples"], RUN.stats["requests"]
    try:
        if campaign is not None and campaign.store is not None:
            replayed, stored = _replay_stored(cls, target, campaign, stats)
        else:
            stored = None
        if stored is not None:
            outcome, reported = stored
        elif campaign is not None:
            outcome, reported = _campaign(cls, target, budget, campaign, stats)
        else:
            outcome, reported = _explore(cls.bound(target), target, budget, cls.name)
    finally:
        RUN.escaped.clear()  # judged: the outcome is kept, not the machines of every example that ended
    swept = outcome is None and cls.sweeps()
    if swept:
        outcome = _sweep(cls.bound(target), cls.name)
    failure = _failure_of(outcome)
    if failure is None and outcome is not None and RUN.found and _is_flaky(outcome):
        failure = RUN.found[0]  # the replay met other faults and did not fail again: the first violation stands
    message, bundle = "", None
    if isinstance(outcome, NotCovered):  # the target cannot be driven this way at all: no failure to replay
        message = outcome.reason
    elif swept and outcome is not None:  # a deterministic phase, not a Hypothesis program: no replay bundle
        message = _message(outcome, failure, "").replace(MINIMAL, "Found by the sweep")
    elif outcome is not None:
        message, bundle = _failed(
            cls, target, budget, replay_dir, campaign, (outcome, failure, reported), replayed, stats
        )
    ledger = dict(LEDGER.get(cls.name, Counter()))
    hits = dict(sorted(CELLS.get(cls.name, Counter()).items()))
    seconds = round(time.monotonic() - started, 3)
    base = Record(
        Kind.MACHINE,
        f"machine:{cls.name}",
        doc=_first_line(cls),
        duration_seconds=seconds,
        ledger=ledger,
        cells=hits,
    )
    base = replace(base, budget=dict(budget.__dict__))
    if campaign is not None:
        stats.update(
            examples=RUN.stats["examples"] - examples_before,
            requests=RUN.stats["requests"] - requests_before,
            seconds=seconds,
            failures=int(failure is not None),
            worker=campaign.worker,
            workers=campaign.workers,
            database=None if campaign.store is None else campaign.store.url,
            readonly=campaign.store is not None and campaign.store.readonly,
        )
        base = replace(base, campaign=stats, requests=stats["requests"])
    records = _records(base, cls.REQUIREMENTS, target, budget, outcome, failure, message, bundle)
    records = judged_cells(records, cls.REQUIREMENT_CELLS, hits)
    return MachineResult(records, failure is not None or outcome is not None, message, bundle)


def _failed(
    cls: type[MachineBase],
    target: TargetInfo,
    budget: MachineBudget,
    replay_dir: Path | None,
    campaign: Campaign | None,
    ended: tuple[BaseException, CheckFailure | None, list[str]],
    replayed: dict[str, Any] | None,
    stats: dict[str, Any],
) -> tuple[str, str | None]:
    """The message and replay bundle of a machine whose examples (or a stored failure's replay) ended in
    ``ended`` (what was raised, the violation, what Hypothesis reported); a failure found here is stored."""
    outcome, failure, reported = ended
    # The shrunk program Hypothesis reported, when it reported one for this failure; else the program of the
    # execution that raised it, as recorded (Hypothesis' replay of it went another way: a target whose timing
    # differs between two runs of one sequence).
    shrunk = _steps(outcome, reported) if failure is None or _failure_of(outcome) is failure else ""
    steps = replayed["steps"] if replayed is not None else shrunk or _recorded(failure, outcome)
    bundle = None
    if replay_dir is not None:
        bundle = str(_write_bundle(replay_dir / cls.name, cls, target, budget, steps, failure, outcome))
    # Minimal only when Hypothesis shrank it (a stored one: when it was stored so).
    minimal = replayed.get("shrunk") is not False if replayed is not None else bool(shrunk) and budget.shrink
    message = _message(outcome, failure, steps, MINIMAL if minimal else AS_IT_RAN)
    if replayed is not None:
        was = replayed.get("requirement")
        other = failure is not None and was and was != failure.requirement
        now = f" (stored as a failure of {was})" if other else ""
        message = f"{_stored_origin(replayed)} still fails on replay{now}:\n{message}"
    elif failure is not None and campaign is not None and campaign.store is not None and steps:
        _keep_failure(cls, campaign, budget, failure, steps, minimal, stats)
    return message, bundle


def _stored_origin(entry: dict[str, Any]) -> str:
    worker = entry.get("worker")
    who = f" by worker {worker}" if worker is not None else ""
    return f"a stored failure (found {entry.get('found_at', 'earlier')}{who}, suite build {entry.get('build', '?')})"


def _replay_stored(
    cls: type[MachineBase], target: TargetInfo, campaign: Campaign, stats: dict[str, Any]
) -> tuple[dict[str, Any] | None, tuple[BaseException, list[str]] | None]:
    """Replay every failure the database holds for this target and machine: the first that still fails, with
    what it raised. One that no longer fails is reported as fixed (and, when the database is written, removed
    from it) only when its replay went the way the failure went up to its failing step; a replay that could not
    run through, or that took another path (a target whose timing differs), is reported as not replayed and kept:
    it says nothing of the failure either way."""
    assert campaign.store is not None
    entries = campaign.store.replays.entries(campaign.target, cls.name)
    stats.update(replayed=len(entries), still_failing=0, fixed=[], unreplayable=[], unreadable=0)
    for entry in entries:
        try:
            program = check_program(entry["steps"], cls.__name__)
        except (SyntaxError, ValueError):
            stats["unreadable"] += 1  # not a step program: never executed
            continue
        origin = _stored_origin(entry)
        campaign.say(f"[dw] replaying {origin} of machine {cls.name}")
        RUN.found.clear()
        exc, path = _replay(cls.bound(target), program)
        outcome, reason = replay_outcome(exc, _failure_of(exc), entry.get("path"), path)
        if outcome == "failing":
            stats["still_failing"] += 1
            assert exc is not None
            return entry, (exc, [])
        if outcome == "unreplayable":
            stats["unreplayable"].append({"id": entry.get("id"), "reason": reason})
            campaign.say(
                f"[dw] {origin} of machine {cls.name} could not be replayed: {reason}; kept, neither failing nor fixed"
            )
            continue
        stats["fixed"].append(entry.get("id"))
        campaign.say(f"[dw] {origin} of machine {cls.name} no longer fails: fixed{reason}")
        if not campaign.store.readonly:
            campaign.store.replays.remove(campaign.target, cls.name, str(entry.get("id")))
    return None, None


def replay_outcome(
    exc: BaseException | None, failure: CheckFailure | None, stored: Any, taken: list[str]
) -> tuple[str, str]:
    """How a stored failure's replay came out: ``failing`` (it raised a violation, whatever path led there),
    ``unreplayable`` (it raised something else, or ran through another way than the failure went: the path
    stored is not where the replay's path began) or ``fixed`` (it ran through the failure's path and on); with a
    reason to show (for ``fixed``: empty, or that the stored failure has no path to compare)."""
    if failure is not None:
        return "failing", ""
    if exc is not None:
        first = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
        return "unreplayable", f"the replay stopped at {first[0] if first else type(exc).__name__}"
    if not isinstance(stored, list):
        return "fixed", " (stored without its path: not compared)"
    for i, (was, now) in enumerate(zip(stored, taken, strict=False)):
        if was != now:
            return "unreplayable", f"the replay took another path at its {_ordinal(i + 1)} cell ({now}, stored: {was})"
    if len(taken) < len(stored):
        return (
            "unreplayable",
            f"the replay ended after {len(taken)} of the {plural(len(stored), 'cell')} the failure went through",
        )
    return "fixed", ""


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _replay(bound: type[MachineBase], program: Any) -> tuple[BaseException | None, list[str]]:
    """Run a stored program; what it raised (``None``: nothing) and the path it took."""
    namespace: dict[str, Any] = {bound.__name__: bound}
    path: list[str] = []
    try:
        try:
            exec(compile(program, "<stored replay>", "exec"), namespace)
        finally:
            state = namespace.get("state")
            if isinstance(state, MachineBase):
                path = list(state.path)
                state.teardown()
    except Exception as exc:
        return exc, path
    return None, path


def _recorded(failure: CheckFailure | None, outcome: BaseException) -> str:
    """The program of the execution that raised ``failure`` (or ``outcome``), as recorded while it ran."""
    for exc in (failure, outcome):
        steps = getattr(exc, "dw_steps", "")
        if isinstance(steps, str) and steps.startswith("state = "):
            return steps
    return ""


def _keep_failure(
    cls: type[MachineBase],
    campaign: Campaign,
    budget: MachineBudget,
    failure: CheckFailure,
    steps: str,
    shrunk: bool,
    stats: dict[str, Any],
) -> None:
    """A failure found here, kept as its step program (a later build replays it too) with the path it took,
    unless read-only. ``shrunk``: Hypothesis' minimal program, else the failing execution's own."""
    assert campaign.store is not None
    if campaign.store.readonly:
        return
    entry: dict[str, Any] = {
        "machine": cls.name,
        "steps": steps,
        "requirement": failure.requirement,
        "message": str(failure).splitlines()[0] if str(failure) else "",
        "found_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build": campaign.build,
        "seed": budget.seed,
        "worker": campaign.worker,
        "shrunk": shrunk,
    }
    path = getattr(failure, "dw_path", None)
    if isinstance(path, list):
        entry["path"] = path
    stats["stored"] = campaign.store.replays.save(campaign.target, cls.name, entry)


def _campaign(
    cls: type[MachineBase], target: TargetInfo, budget: MachineBudget, campaign: Campaign, stats: dict[str, Any]
) -> tuple[BaseException | None, list[str]]:
    """Rounds of ``budget.examples`` examples, each round its own seed, until the machine's share of the campaign
    is spent (one round without a campaign clock) or a round fails."""
    database = None
    if campaign.store is not None:
        database = campaign.store.for_machine(campaign.build, campaign.target, cls.name)
    bound = cls.bound(target)
    clock = campaign.clock
    share = clock.share() if clock is not None else 0.0
    began = time.monotonic()
    rounds = 0
    outcome: BaseException | None = None
    reported: list[str] = []
    while True:
        seed = worker_seed(budget.seed, campaign.worker, rounds) if clock is not None else budget.seed
        outcome, reported = _explore(bound, target, replace(budget, seed=seed), cls.name, database, record=True)
        rounds += 1
        stats["rounds"] = rounds
        if clock is not None and clock.due():
            clock.last_line = time.monotonic()
            campaign.say(_progress(cls.name, clock, campaign, outcome is not None))
        if outcome is not None or clock is None or time.monotonic() - began >= share:
            break
    if clock is not None:
        clock.machines_left -= 1
    return outcome, reported


def _progress(name: str, clock: CampaignClock, campaign: Campaign, failed: bool) -> str:
    workers = f"/{campaign.workers}" if campaign.workers is not None else ""
    cells = sum(1 for v in CELLS.get(name, Counter()).values() if v)
    states = sum(1 for v in LEDGER.get(name, Counter()).values() if v)
    reached = f"{plural(cells, 'coverage cell')} and {plural(states, 'hard state')} of {name}"
    return (
        f"[dw] campaign {clock.elapsed() / 60:.1f} of {clock.seconds / 60:.1f} min, worker {campaign.worker}{workers}: "
        f"{plural(RUN.stats['examples'], 'example')}, {plural(RUN.stats['requests'], 'request')}, "
        f"{plural(int(failed), 'failure')}, {reached} reached (machine {name})"
    )


def _sweep(bound: type[MachineBase], name: str) -> BaseException | None:
    """Run the machine's sweep over cold cells on a machine of its own; what it raised (``None``: nothing). A fault
    that left an outcome unknown stops it without a verdict (the cells it did not reach stay not reached)."""
    machine = bound()
    try:
        machine.sweep()
    except Indeterminate:
        LEDGER.setdefault(name, Counter())["sweep_stopped_by_faults"] += 1
    except NotCovered:
        LEDGER.setdefault(name, Counter())["sweep_not_possible"] += 1
    except Exception as exc:
        return exc
    finally:
        machine.teardown()
    return None


def _settings(
    budget: MachineBudget, database: ExampleDatabase | None = None, record: bool = False
) -> hypothesis_settings:
    phases = (Phase.generate, Phase.shrink) if budget.shrink else (Phase.generate,)
    return hypothesis_settings(
        max_examples=budget.examples,
        stateful_step_count=budget.steps,
        deadline=None,
        database=database,
        suppress_health_check=list(HealthCheck),
        # Given a database, the examples it holds for this build, target and machine run first.
        phases=(Phase.reuse, *phases) if database is not None else phases,
        # Recording: Hypothesis prints every example's steps (kept by record_step, the rest dropped), so a
        # failure whose replay went another way still has the program that raised it.
        verbosity=Verbosity.debug if record else Verbosity.normal,
        report_multiple_bugs=False,
    )


def _explore(
    bound: type[MachineBase],
    target: TargetInfo,
    budget: MachineBudget,
    name: str,
    database: ExampleDatabase | None = None,
    record: bool = False,
) -> tuple[BaseException | None, list[str]]:
    """Run the examples; what the run raised (``None``: no violation) and what Hypothesis reported (with
    ``record``, every example's steps are recorded and only the rest of the normal report is kept)."""
    reported: list[str] = []
    faulty = target.fault_ledger is not None

    def report(text: object) -> None:
        if record:
            record_step(text)  # the rest is Hypothesis' debugging output, the notes of every example
        else:
            reported.append(str(text))

    with with_reporter(report):
        if not faulty:
            outcome = _run(bound, budget.seed, _settings(budget, database, record))
            # A precondition reads the model, which the target's answers shape; when the target's timing makes
            # one choice sequence take two paths, Hypothesis' data tree raises Flaky* although nothing was
            # violated. That is neither a verdict nor a harness fault: the examples run again one by one —
            # unless an example did raise a violation on the way (a check of the context's, not the machine's).
            if outcome is None or RUN.found or not _is_flaky(outcome):
                return outcome, reported
            violation = _escaped_violation()
            if violation is not None:
                return violation, reported
            LEDGER.setdefault(name, Counter())["examples_rerun_one_by_one"] += 1
        outcome = _one_by_one(bound, budget, name, faulty, record)
    return outcome, reported


def _run(bound: type[MachineBase], seed: int, settings: hypothesis_settings) -> BaseException | None:
    test = hypothesis_seed(seed)(get_state_machine_test(bound, settings=settings))
    # Hypothesis' @seed also turns the example database off (a seeded run is taken for a reproduction); here the
    # seed is the exploration's, and what a campaign finds must reach its database: the run keeps its settings.
    setattr(test, "_hypothesis_internal_use_settings", settings)  # noqa: B010
    try:
        test()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | Stopped):  # the run stopped: nothing to judge, nobody to tell
            raise
        return exc
    return None


def _one_by_one(
    bound: type[MachineBase], budget: MachineBudget, name: str, faulty: bool, record: bool = False
) -> BaseException | None:
    """Each example as its own Hypothesis run, with its own seed, so no data tree spans two examples.

    Under --faults the same choices do not meet the same faults twice, so one run's data tree would see one
    sequence behave two ways: there a failure is reported as found (shrinking would replay it under other
    faults), and an example a fault left unable to go on (a setup step whose answer was lost: Indeterminate)
    is discarded and another one runs instead, up to twice the budget. Without faults an example whose replay
    went another way without a violation is discarded the same way. When the replay went another way, the example
    is judged by what its first execution raised (``RUN.escaped``), never by Hypothesis' Flaky* in its place.
    """
    settings = _settings(budget, record=record)
    one = hypothesis_settings(settings, max_examples=1, phases=(Phase.generate,) if faulty else settings.phases)
    bound = _salted(bound)
    completed = discarded = 0
    for i in range(2 * budget.examples):
        if completed >= budget.examples:
            break
        RUN.escaped.clear()  # what ended the examples before (and the machines it holds) was judged already
        unknown_before = len(RUN.unknown)
        exc = _run(bound, budget.seed * 1009 + i, one)
        if exc is None:
            completed += 1
            continue
        first: BaseException | None = None
        if _is_flaky(exc) and not RUN.found:
            # Hypothesis' replay of a failing example went another way (under --faults: met other faults) and
            # Flaky* took the place of what the example raised. A violation raised on the way (one the client or
            # the context found, not the machine's own judging) is the target's failure; otherwise what the
            # example raised in its first execution is the outcome, not the replay's inconsistency.
            violation = _escaped_violation()
            if violation is not None:
                return violation
            if RUN.escaped:
                first = RUN.escaped[0]
        # A step met an unknown outcome; what Hypothesis raised is that, or its replay that went another way
        # under other faults (Flaky*).
        met_unknown = len(RUN.unknown) > unknown_before
        unknown_first = first is not None and _only_indeterminate(first)
        harmless = _is_flaky(exc) and (met_unknown or unknown_first or not faulty)
        if not RUN.found and (harmless or (faulty and met_unknown and _only_indeterminate(exc))):
            discarded += 1
            continue
        return first if first is not None else exc
    if discarded:
        LEDGER.setdefault(name, Counter())["example_discarded_by_faults" if faulty else "example_discarded"] += (
            discarded
        )
    return None


def _escaped_violation() -> CheckFailure | None:
    """The first violation among what ended the examples being judged (``RUN.escaped`` is cleared before each run)."""
    for exc in RUN.escaped:
        found = _failure_of(exc)
        if found is not None:
            return found
    return None


MINIMAL = "Minimal failing step program:"
AS_IT_RAN = "Failing step program, as it ran (not shrunk):"


def _message(outcome: BaseException, failure: CheckFailure | None, steps: str, heading: str = MINIMAL) -> str:
    if failure is not None:
        return f"{failure}\n\n{heading}\n{steps}"
    message = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
    for inner in outcome.exceptions if isinstance(outcome, BaseExceptionGroup) else ():
        message += "\n  caused by: " + "".join(traceback.format_exception(inner)).strip()
    own = not isinstance(outcome, HarnessError | BaseExceptionGroup) and not _is_flaky(outcome)
    if own and outcome.__traceback__ is not None:
        # Not a problem the harness named (the target unreachable, an answer lost): a fault of the machine's own
        # code, which its last frames locate.
        message += "\n" + "".join(traceback.format_tb(outcome.__traceback__)[-6:]).rstrip()
    return message


def _records(
    base: Record,
    requirements: dict[str, str | None],
    target: TargetInfo,
    budget: MachineBudget,
    outcome: BaseException | None,
    failure: CheckFailure | None,
    message: str,
    bundle: str | None,
) -> list[Record]:
    """One record per requirement: passed only where the machine reached the state it needs."""
    ledger = base.ledger or {}
    evidence = tuple(e.to_json() for e in failure.exchanges) if failure is not None else ()

    def failed(req_id: str) -> Record:
        return replace(
            base,
            requirements=(req_id,),
            verdict=broken(req_id),
            failed_requirement=req_id,
            message=message,
            replay=bundle,
            exchanges=evidence,
        )

    records: list[Record] = []
    for req_id, state in requirements.items():
        one = replace(base, requirements=(req_id,))
        if not applicable(REGISTRY[req_id], target.certified_minor):
            one = replace(one, verdict=Verdict.NOT_APPLICABLE, message="not applicable at this protocol version")
        elif failure is not None and failure.requirement == req_id:
            one = failed(req_id)
        elif isinstance(outcome, NotCovered):
            one = replace(one, verdict=Verdict.NOT_COVERED, message=message, setting=outcome.setting)
        elif outcome is not None and failure is None:
            one = replace(one, verdict=Verdict.ERROR, message=message)
        elif state is not None and not ledger.get(state):
            one = replace(
                one,
                verdict=Verdict.NOT_COVERED,
                message=f"the machine never reached '{state}' in {plural(budget.examples, 'example')} × "
                f"{plural(budget.steps, 'step')}",
                setting=f"--machine-examples above {budget.examples} or --machine-steps above {budget.steps}, "
                "or shorter leases",
            )
        records.append(one)
    extra = failure.requirement if failure is not None else None
    if extra is not None and extra not in requirements and extra in REGISTRY:
        records.append(failed(extra))
    return records


def judged_cells(records: list[Record], needs: dict[str, tuple[str, ...]], hits: dict[str, int]) -> list[Record]:
    """A requirement the machine judges only in some coverage cells (``needs``: cell-key patterns, ``*`` for any
    part) passes only when the run reached one of them: judged only on cells not reached, it is not covered."""
    out = []
    for rec in records:
        req = rec.requirements[0] if rec.requirements else ""
        patterns = needs.get(req)
        if (
            rec.verdict is Verdict.PASSED
            and patterns
            and not any(n > 0 and fnmatchcase(key, p) for key, n in hits.items() for p in patterns)
        ):
            rec = replace(
                rec,
                verdict=Verdict.NOT_COVERED,
                message=f"judged only in coverage cells the run did not reach ({', '.join(patterns)})",
                setting="every cell of the coverage matrix reached (see Coverage matrix)",
            )
        out.append(rec)
    return out


def _salted(bound: type[MachineBase]) -> type[MachineBase]:
    """The machine with one more initialize rule that refuses the all-zero choice sequence.

    When each example is its own Hypothesis run (see _one_by_one), a run's first test case is
    always the simplest one (every choice at its minimum: a two-step program). Refusing it before any request
    is sent makes the one valid example of the run a random one, drawn from the run's seed; the refused case
    shares no choices with it past the salt, so the data tree never sees one path behave two ways.
    """

    @initialize(salt=st.integers(min_value=0, max_value=2**62))
    def _fault_salt(self: MachineBase, salt: int) -> None:
        if salt == 0:
            reject()

    return type(bound.__name__, (bound,), {"_fault_salt": _fault_salt})


def _only_indeterminate(exc: BaseException) -> bool:
    """Whether what an example raised comes down to outcomes a fault left unknown (and nothing else)."""
    if isinstance(exc, Indeterminate):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_indeterminate(inner) for inner in exc.exceptions)
    return exc.__cause__ is not None and _only_indeterminate(exc.__cause__)


def _is_flaky(exc: BaseException) -> bool:
    return any(cls.__name__.startswith("Flaky") for cls in type(exc).__mro__)


def _first_line(cls: type[MachineBase]) -> str:
    for klass in cls.__mro__:  # a bound subclass has no docstring of its own
        if klass.__doc__:
            return klass.__doc__.strip().splitlines()[0]
    return cls.name


def _failure_of(exc: BaseException | None) -> CheckFailure | None:
    """The CheckFailure inside whatever Hypothesis raised (it may wrap it in an exception group)."""
    if exc is None:
        return None
    if isinstance(exc, CheckFailure):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _failure_of(inner)
            if found is not None:
                return found
    if isinstance(exc, HarnessError):
        return None
    return _failure_of(exc.__cause__) if exc.__cause__ is not None else None


def _steps(outcome: BaseException, reported: list[str]) -> str:
    """The step program of the final, shrunk example: Hypothesis attaches it to the exception as notes
    (``state = Machine()`` … ``state.teardown()``); older versions report it instead."""
    lines = [str(n) for n in getattr(outcome, "__notes__", [])]
    if not any(line.startswith("state = ") for line in lines):
        lines = "\n".join(reported).splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^state = \w+\(\)", line)]
    if not starts:
        return ""
    program = []
    for line in lines[starts[-1] :]:
        if line.startswith("state.teardown()"):
            break
        # Keep the step statements; drop the notes recorded between them (exchanges, checks run), and the
        # salt step of a run under --faults (it sends nothing; a replay runs the plain machine).
        if line.startswith("state._fault_salt("):
            continue
        if re.match(r"^(state\b|\(|[\w, ]+ = state\.)", line):
            program.append(line)
    return "\n".join(program)


def _write_bundle(
    folder: Path,
    cls: type[MachineBase],
    target: TargetInfo,
    budget: MachineBudget,
    steps: str,
    failure: CheckFailure | None,
    outcome: BaseException,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    module = cls.__module__
    script = f'''\
"""Replay of a failing {cls.name} run: the minimal step program, runnable against any URL.

    python replay.py [URL]      (tokens, if the target needs them: DW_WORKER_TOKEN, DW_OPERATOR_TOKEN)

Found with seed {budget.seed} ({plural(budget.examples, "example")} x {plural(budget.steps, "step")}).
The expectations are recomputed by the pure model at every step, so the verdict means the same on every replay.
"""

import os
import sys

from suite.campaign import CampaignClock, Store, check_program, worker_seed
from suite.context import TargetInfo
from suite.target import probe_cluster_info
from {module} import {cls.__name__} as _Machine

url = sys.argv[1] if len(sys.argv) > 1 else {target.url!r}
worker_token = os.environ.get("DW_WORKER_TOKEN")
operator_token = os.environ.get("DW_OPERATOR_TOKEN")
target = TargetInfo(
    url=url,
    cluster_info=probe_cluster_info(url, operator_token or worker_token),
    worker_token=worker_token,
    operator_token=operator_token,
    max_wait={target.max_wait!r},
)
{cls.__name__} = _Machine.bound(target)
{steps}
state.teardown()
print("replayed without a violation")
'''
    (folder / "replay.py").write_text(script, encoding="utf-8")
    exchanges = [e.to_json() for e in (failure.exchanges if failure else [])]
    (folder / "exchanges.json").write_text(json.dumps(exchanges, indent=2, default=str), encoding="utf-8")
    (folder / "README.txt").write_text(
        textwrap.dedent(f"""\
        machine: {cls.name}
        seed: {budget.seed}   (re-run: DW_CONFORMANCE_SEED={budget.seed} pytest --target=... dw::machine::{cls.name})
        failure: {failure if failure is not None else outcome}
        """),
        encoding="utf-8",
    )
    return folder
