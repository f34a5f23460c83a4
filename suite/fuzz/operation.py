"""Fuzzing one operation: Schemathesis' coverage phase, then Hypothesis' positive and negative draws, each case
aimed at the operation's live world with some probability."""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable
from typing import Any, Final

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from suite.context import TargetInfo
from suite.outcomes import HarnessError

from .cases import CaseRunner, integral_floats_to_ints, negative_in, pin_headers, pin_holds, substitute
from .document import Operation, load_schema, operations
from .live import WORLDS, Lab, Worlds
from .results import FuzzBudget, FuzzResult

__all__ = ["SUBSTITUTE", "fuzz_operation", "hypothesis_run"]

SUBSTITUTE: Final = ("none", "ids", "ids+fence")  # how a case targets the live world, drawn per case


def hypothesis_run(strategy: st.SearchStrategy[Any], examples: int, seed: int, body: Callable[[Any], None]) -> str:
    """Run ``body`` over ``examples`` draws; returns "" or why no example could be drawn."""
    if examples <= 0:
        return ""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(strategy)
    def test(value: Any) -> None:
        body(value)

    try:
        test()
    except Unsatisfiable:
        return "the schema leaves nothing to draw"
    return ""


def _coverage_cases(schema: Any, api_op: Any, cap: int, rng: random.Random) -> list[Any]:
    """Schemathesis' coverage phase for the operation: deterministic positive and negative cases for every
    parameter and body property (boundaries, wrong types, missing required values, unexpected content
    types and methods). Over ``cap``, a seeded round-robin over the case descriptions keeps every kind."""
    if cap <= 0:
        return []
    cases = list(
        schema.iter_coverage_cases(
            api_op,
            generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            generation_config=schema.config.generation_for(operation=api_op, phase="coverage"),
        )
    )
    if len(cases) <= cap:
        return cases
    groups: dict[str, list[Any]] = {}
    for case in cases:
        groups.setdefault(str(case.meta.phase.data.description), []).append(case)
    pools = list(groups.values())
    for pool in pools:
        rng.shuffle(pool)
    rng.shuffle(pools)
    picked: list[Any] = []
    while len(picked) < cap:
        for pool in pools:
            if pool and len(picked) < cap:
                picked.append(pool.pop())
    return picked


def _steer(op: Operation, case: Any, how: str, *, coverage: bool) -> str:
    """Keep a case from waiting on the target. A valid poll as the live worker finds its ready task
    instead of holding; a query always names the parked run (whose queue has no worker) unless its
    path is what the case breaks; a coverage update asks only for acceptance unless its wait is what
    the case is about."""
    positive = case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE
    if op.op_id.startswith("poll_") and coverage and positive:
        return "ids+fence"
    if op.op_id.startswith("query_") and how == "none" and not negative_in(case, "path"):
        return "ids"
    about = getattr(case.meta.phase.data, "parameter", None) if case.meta is not None else None
    waits = about in ("wait_for", "wait_timeout_seconds")
    if op.op_id.startswith("update_") and coverage and isinstance(case.body, dict) and not waits:
        case.body["wait_for"] = "accepted"
    return how


def _case_strategies(target: TargetInfo, api_op: Any, pinned: dict[str, str]) -> tuple[Any, Any]:
    """The drawn cases of one operation: valid ones with the target's headers pinned, and invalid ones, two
    thirds pinned and one third free (the headers broken too); each paired with how a live world is used."""
    query = {"namespace": target.namespace}  # X-Namespace decides; a negated query value is noise
    positive = st.tuples(
        api_op.as_strategy(GenerationMode.POSITIVE, headers=pinned).map(lambda c: ("pinned", c)),
        st.sampled_from(SUBSTITUTE),
    )
    negative_cases = st.one_of(
        api_op.as_strategy(GenerationMode.NEGATIVE, headers=pinned, query=query).map(lambda c: ("pinned", c)),
        api_op.as_strategy(GenerationMode.NEGATIVE, headers=pinned, query=query).map(lambda c: ("pinned", c)),
        api_op.as_strategy(GenerationMode.NEGATIVE).map(lambda c: ("free", c)),
    )
    negative = st.tuples(negative_cases, st.sampled_from(SUBSTITUTE))
    return positive, negative


def fuzz_operation(target: TargetInfo, op_id: str, budget: FuzzBudget) -> FuzzResult:
    """Fuzz one operation with ``budget.examples`` cases; never raises for what the target answers."""
    op = operations()[op_id]
    result = FuzzResult(op_id, f"Schemathesis cases for {op.method} {op.path}: {op.summary}")
    started = time.monotonic()
    schema = load_schema()
    api_op = schema.find_operation_by_id(op_id)
    lab = Lab(target, f"fuzz-{op_id}")
    runner = CaseRunner(target, result, lab)
    kind = WORLDS.get(op_id)
    worlds = Worlds(lab, kind) if kind is not None else None
    pinned = lab.headers(op.plane)

    def dispatch(case: Any, how: str, stat: str, *, positive: bool, coverage: bool) -> None:
        if positive and isinstance(case.body, dict | list):
            case.body = integral_floats_to_ints(case.body)
        pin_holds(op, case)
        how = _steer(op, case, how, coverage=coverage)
        world = None
        if worlds is not None and how != "none":
            world = worlds.get()
            if world is not None and not substitute(world, case, how):
                world = None
        result.stats[stat] += 1
        runner.send(op, case, world, probe=str(case.method).upper() != op.method)

    def covered(case: Any, how: str) -> None:
        if runner.aborted:
            return
        data = case.meta.phase.data
        about = data.parameter if getattr(data.parameter_location, "value", None) == "header" else None
        pin_headers(case, pinned, keep=about)
        positive = case.meta.generation.mode is GenerationMode.POSITIVE
        dispatch(case, how, "coverage", positive=positive, coverage=True)

    def one(mode: str, drawn: tuple[tuple[str, Any], str]) -> None:
        (branch, case), how = drawn
        if runner.aborted:
            return
        if branch != "free":
            pin_headers(case, pinned)
        dispatch(case, how, mode, positive=mode == "positive", coverage=False)

    try:
        rng = random.Random(budget.seed_for(f"{op_id}:coverage"))
        for case in _coverage_cases(schema, api_op, budget.coverage_cap, rng):
            covered(case, rng.choice(SUBSTITUTE))
        positive, negative = _case_strategies(target, api_op, pinned)
        n_pos = math.ceil(budget.examples / 2)
        for mode, strategy, n in (("positive", positive, n_pos), ("negative", negative, budget.examples - n_pos)):
            why = hypothesis_run(strategy, n, budget.seed_for(f"{op_id}:{mode}"), functools.partial(one, mode))
            if why:
                result.notes.append(f"{mode}: {why}")
    except HarnessError as exc:
        result.error = f"harness error (not a conformance failure): {exc}"
    finally:
        if worlds is not None:
            if worlds.failed:
                result.notes.append(f"no live world: {worlds.failed}")
            result.stats["worlds"] = worlds.builds
            worlds.close()
        result.stats["requests"] += lab.requests
        lab.close()
        result.duration = time.monotonic() - started
    return result
