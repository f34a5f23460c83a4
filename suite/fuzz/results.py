"""What fuzzing costs and finds: the budget of a run, and the result of fuzzing one operation (or the stateful
sequence) as statistics and :class:`~suite.outcomes.Record`\\ s."""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Final

from suite.context import TargetInfo
from suite.outcomes import FUZZ_COUNTERS, FuzzStats, Kind, Record, Verdict, broken
from suite.protocol.requirements import REGISTRY, applicable
from suite.text import plural

from .judges import FUZZ_REQUIREMENTS, NO_5XX, FuzzFailure

__all__ = ["KEPT_FAILURES", "FuzzBudget", "FuzzResult"]

KEPT_FAILURES: Final = 3  # exchanges kept as evidence per failing requirement and operation


@dataclass(frozen=True)
class FuzzBudget:
    """``examples`` random cases per operation (half positive, half negative) plus up to ``coverage_cap``
    cases of Schemathesis' coverage phase; ``seed`` makes the draw repeatable."""

    examples: int = 20
    seed: int = 0
    coverage: int | None = None  # coverage-phase cases per operation; None: 5 × examples

    @property
    def coverage_cap(self) -> int:
        # 5 × 20 keeps at least one case of every coverage description for all operations but one.
        return self.coverage if self.coverage is not None else 5 * self.examples

    def seed_for(self, name: str) -> int:
        return (self.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32


@dataclass
class FuzzResult:
    """What fuzzing one operation (or the stateful sequence) found."""

    name: str
    doc: str
    judged: set[str] = field(default_factory=set)
    failures: dict[str, list[FuzzFailure]] = field(default_factory=dict)
    failure_counts: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    duration: float = 0.0

    def fail(self, failure: FuzzFailure) -> None:
        req = failure.requirement or NO_5XX
        self.failure_counts[req] += 1
        kept = self.failures.setdefault(req, [])
        if len(kept) < KEPT_FAILURES:
            kept.append(failure)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def summary(self) -> str:
        s = self.stats
        if s["sequences"]:
            parts = [
                f"{plural(s['sequences'], 'sequence')} ({s['started']} started, {s['leased']} leased, "
                f"{s['completed']} completed), {plural(s['cases'], 'case')}"
            ]
        else:
            parts = [
                f"{plural(s['cases'], 'case')} ({s['coverage']} coverage-phase, {s['positive']} positive, "
                f"{s['negative']} negative)"
            ]
        if s["live"]:
            parts.append(f"{s['live']} on a live workflow, {plural(s['compared'], 'state comparison')}")
        if s["unsendable"]:
            parts.append(f"{s['unsendable']} unsendable by the HTTP client")
        statuses = ", ".join(f"{code}×{n}" for code, n in sorted(self.statuses.items()))
        return "; ".join(parts) + (f"; statuses {statuses}" if statuses else "") + f"; {self.duration:.1f}s"

    def first_failure(self) -> FuzzFailure | None:
        for req in FUZZ_REQUIREMENTS:
            if self.failures.get(req):
                return self.failures[req][0]
        return next((f[0] for f in self.failures.values() if f), None)

    def stats_row(self, group: str) -> FuzzStats:
        """The labelled statistics of this run (a row of the report's fuzz table, never truncated)."""
        statuses = {str(k): v for k, v in sorted(self.statuses.items())}
        counters = {name: self.stats[name] for name in FUZZ_COUNTERS}
        return FuzzStats(self.name, group, **counters, statuses=statuses, seconds=round(self.duration, 3))

    def records(self, target: TargetInfo, group: str = "") -> list[Record]:
        """One passing record for every requirement the run judged without a failure, and one record per
        failed requirement; the first carries the run's statistics and request count."""
        seconds = round(self.duration, 3)
        base = Record(
            Kind.FUZZ, f"fuzz:{self.name}", doc=self.doc, duration_seconds=seconds, fuzz=self.stats_row(group)
        )
        base = replace(base, requests=self.stats["requests"])
        records: list[Record] = []
        order = [*FUZZ_REQUIREMENTS, *sorted(self.judged - set(FUZZ_REQUIREMENTS))]
        passed = [r for r in order if r in self.judged and r not in self.failures]
        passed = [r for r in passed if applicable(REGISTRY[r], target.certified_minor)]
        if self.error is not None:
            message = f"{self.error} (after {self.summary()})"
            records.append(
                replace(base, requirements=tuple(passed or [NO_5XX]), verdict=Verdict.ERROR, message=message)
            )
        elif passed:
            records.append(replace(base, requirements=tuple(passed)))
        for req, kept in self.failures.items():
            if not applicable(REGISTRY[req], target.certified_minor):
                continue
            first = kept[0]
            more = self.failure_counts[req] - 1
            message = (
                f"{first}"
                + (f"\n  ({plural(more, 'more failing case')} of this rule)" if more else "")
                + f"\n  Reproduce: {first.exchanges[0].curl()}"
                + f"\n  ({self.summary()})"
            )
            records.append(
                replace(
                    base,
                    requirements=(req,),
                    verdict=broken(req),
                    message=message,
                    failed_requirement=req,
                    exchanges=tuple(f.exchanges[0].to_json() for f in kept),
                )
            )
        # The report sums requests and lists statistics over records: the operation's count once.
        return [records[0], *(replace(r, requests=0, fuzz=None) for r in records[1:])] if records else []
