"""The results document: the run's records turned into per-requirement verdicts and one run verdict.

``build_results`` is the only place a verdict is decided: it aggregates the records per requirement
(:func:`aggregate`; worst verdict wins, a check that could not run says nothing) and decides the run
(:func:`decide`):

* ``NOT CONFORMANT`` — a MUST failed (or a SHOULD under ``--strict``);
* ``HARNESS ERROR`` — otherwise, when any record is a harness error (a check, a machine or a fuzz group that
  could not judge, an item of the suite that crashed) or when no item ran at all;
* ``INCOMPLETE`` — otherwise, when the run does not cover everything: a selection narrowed it, a budget was
  below its default, an item did not run, an applicable requirement is not covered, or a capability the target
  advertises promises a behaviour no record exercised (the capability ledger, :func:`capability_ledger`);
* ``CONFORMANT`` — otherwise: every applicable requirement got a verdict and none failed.

The document is validated by ``schemas/json/report.schema.json``; the writers in :mod:`suite.reports` and
``python -m suite.certify verify`` read it. ``verify`` re-runs :func:`aggregate` and :func:`decide` on the
document's own records, so a verdict edited by hand does not survive verification.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import suite
from suite.build import suite_build
from suite.protocol.coverage import EntityRow, matrix, not_reached
from suite.protocol.promises import CapabilityRow, ledger, unexercised
from suite.protocol.requirements import REGISTRY, Level, applicable

from .context import TargetInfo
from .outcomes import Record, RunVerdict, Verdict, profile_setting, worst
from .text import clip, plural

__all__ = [
    "CHECKED",
    "REPORT_SCHEMA",
    "Completeness",
    "aggregate",
    "build_results",
    "capability_ledger",
    "coverage_matrix",
    "decide",
    "document_matrix",
    "headline",
    "summarize",
    "target_doc",
]

REPORT_SCHEMA = "durable-workflow.conformance-report.v1"

# A requirement with one of these verdicts was checked; the others say why it was not.
CHECKED = frozenset({Verdict.PASSED, Verdict.FAILED, Verdict.NON_STRICT, Verdict.UNIMPLEMENTED, Verdict.INFORMATIONAL})


@dataclass(frozen=True)
class Completeness:
    """What of the suite the run executed: the options that narrowed it, budgets below their defaults, the
    items that did not run (ids), how many items the suite has, and whether it is a certification run (which must
    also reach every applicable coverage cell)."""

    narrowed_by: tuple[str, ...] = ()
    reduced: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()
    items: int = 0
    collect_only: bool = False
    certify: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "narrowed_by": list(self.narrowed_by),
            "reduced": list(self.reduced),
            "not_run": list(self.not_run),
            "items": self.items,
            "items_run": self.items - len(self.not_run),
            "collect_only": self.collect_only,
            "certify": self.certify,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Completeness:
        return cls(
            narrowed_by=tuple(doc.get("narrowed_by", ())),
            reduced=tuple(doc.get("reduced", ())),
            not_run=tuple(doc.get("not_run", ())),
            items=int(doc.get("items", 0)),
            collect_only=bool(doc.get("collect_only", False)),
            certify=bool(doc.get("certify", False)),
        )


def aggregate(records: Iterable[Record], certified_minor: int) -> list[dict[str, Any]]:
    """One row per requirement of the registry, in registry order, with its verdict and evidence."""
    by_req: dict[str, list[Record]] = defaultdict(list)
    for rec in records:
        for req_id in rec.requirements:
            by_req[req_id].append(rec)
        if rec.failed_requirement and rec.failed_requirement not in rec.requirements:
            by_req[rec.failed_requirement].append(rec)
    return [_row(req.id, by_req.get(req.id, []), certified_minor) for req in REGISTRY.values()]


def _row(req_id: str, recs: list[Record], certified_minor: int) -> dict[str, Any]:
    req = REGISTRY[req_id]
    setting = None
    if not applicable(req, certified_minor):
        verdict, reason, evidence = Verdict.NOT_APPLICABLE, f"introduced in protocol 1.{req.minor}", []
    else:
        seen = [_as_seen_by(rec, req_id) for rec in recs]
        verdict = worst([r.verdict for r in seen]) if seen else Verdict.NOT_COVERED
        evidence = [r for r in seen if r.verdict is verdict]
        reason = clip("; ".join(dict.fromkeys(r.message for r in evidence if r.message)), 2000, "checks[].message")
        if verdict is Verdict.NOT_COVERED:
            settings = [r.setting for r in evidence if r.setting]
            setting = settings[0] if settings else (profile_setting(req.profile) if req.profile else None)
        if not recs:
            reason = "no item of this requirement ran"
    return {
        "id": req.id,
        "level": req.level.value,
        "area": req.area.value,
        "minor": req.minor,
        "section": req.section,
        "profile": req.profile,
        "cites": [{"document": c.document.name, "section": c.section, "detail": c.detail} for c in req.cites],
        "source": req.source,
        "sentence": req.sentence,
        "verdict": verdict.value,
        "reason": reason,
        "setting": setting,
        "ran": bool(recs),
        "checks": list(dict.fromkeys(r.check for r in recs)),
        "exchanges": [dict(e) for r in evidence for e in r.exchanges][:6],
    }


def _as_seen_by(rec: Record, req_id: str) -> Record:
    """``rec`` as evidence on ``req_id``. A check that failed on another of its requirements stopped there and
    says nothing about this one: not covered by it, with a reason of its own — never the other's message or
    exchanges. Any other record of this requirement still decides its verdict (worst wins)."""
    verdict = Verdict.NOT_COVERED if rec.verdict is Verdict.NOT_APPLICABLE else rec.verdict
    if verdict in (Verdict.FAILED, Verdict.NON_STRICT) and rec.failed_requirement != req_id:
        return replace(
            rec,
            verdict=Verdict.NOT_COVERED,
            message=f"not judged: {rec.check} failed on {rec.failed_requirement} first",
            setting=f"{rec.failed_requirement} passing ({rec.check} judges them together)",
            exchanges=(),
        )
    return replace(rec, verdict=verdict) if verdict is not rec.verdict else rec


# A record exercises a requirement when it judged it: it passed, it broke, or it worked though unadvertised.
_EXERCISING = frozenset({Verdict.PASSED, Verdict.FAILED, Verdict.NON_STRICT, Verdict.INFORMATIONAL})


def capability_ledger(
    capabilities: Mapping[str, Any], records: Iterable[Record], certified_minor: int
) -> tuple[CapabilityRow, ...]:
    """For each capability the target advertises, the behaviours it promises and how many records of each
    behaviour's requirements exercised it (``suite.protocol.promises``)."""
    counts: Counter[str] = Counter()
    unused: set[str] = set()  # an option of the server it showed it does not use (the check said unimplemented)
    for rec in records:
        named = (*rec.requirements, *([rec.failed_requirement] if rec.failed_requirement else []))
        for req_id in dict.fromkeys(named):
            verdict = _as_seen_by(rec, req_id).verdict if req_id in REGISTRY else None
            if verdict in _EXERCISING:
                counts[req_id] += 1
            elif verdict is Verdict.UNIMPLEMENTED:
                unused.add(req_id)
    return ledger(capabilities, counts, certified_minor, unused)


def coverage_matrix(
    capabilities: Mapping[str, Any], records: Iterable[Record], profile: Mapping[str, Any] | None = None
) -> tuple[EntityRow, ...]:
    """The coverage matrix of a run (``suite.protocol.coverage``): the cells every machine hit, summed over
    machines (each machine's records all carry its whole run, so one record per machine counts)."""
    per_machine = {r.check: r.cells for r in records if r.cells is not None}
    hits: Counter[str] = Counter()
    for cells in per_machine.values():
        hits.update({k: int(v) for k, v in cells.items()})
    return matrix(hits, capabilities, profile)


def document_matrix(results: Mapping[str, Any]) -> tuple[EntityRow, ...]:
    """The coverage matrix a results document's own hit counts make, re-derived from the model and the target's
    capabilities (what verification trusts: the document's not-reached lists are not read)."""
    hits: Counter[str] = Counter()
    for row in results.get("coverage_matrix") or ():
        hits.update({str(k): int(v) for k, v in (row.get("reached") or {}).items()})
    target = results["target"]
    return matrix(hits, target.get("capabilities") or {}, target.get("test_profile") or {})


def _unexercised_lines(rows: Iterable[CapabilityRow]) -> list[str]:
    """``capability (behaviour, …)`` for every advertised capability with a behaviour no record exercised."""
    missing: dict[str, list[str]] = defaultdict(list)
    for capability, behaviour in unexercised(rows):
        missing[capability].append(behaviour)
    return [f"{capability} ({', '.join(names)})" for capability, names in missing.items()]


def summarize(
    rows: list[dict[str, Any]],
    records: list[Record],
    capabilities: Iterable[CapabilityRow] = (),
    cells: Iterable[EntityRow] = (),
) -> dict[str, Any]:
    cells = tuple(cells)
    counts = Counter(r["verdict"] for r in rows)
    applicable_rows = [r for r in rows if r["verdict"] != Verdict.NOT_APPLICABLE.value]
    unchecked = [r for r in applicable_rows if Verdict(r["verdict"]) not in CHECKED]
    tried = [r for r in unchecked if r["ran"] and r["verdict"] == Verdict.NOT_COVERED.value]
    return {
        "requirements": len(rows),
        "applicable": len(applicable_rows),
        "checked": len(applicable_rows) - len(unchecked),
        "passed": counts[Verdict.PASSED.value],
        "failed": counts[Verdict.FAILED.value],
        "non_strict": counts[Verdict.NON_STRICT.value],
        "unimplemented": counts[Verdict.UNIMPLEMENTED.value],
        # Not covered: an item tried and could not judge it here; not run: no item of it ran.
        "not_covered": len(tried),
        "not_covered_must": sum(1 for r in tried if r["level"] == Level.MUST.value),
        "not_run": sum(1 for r in unchecked if not r["ran"]),
        "not_applicable": counts[Verdict.NOT_APPLICABLE.value],
        "informational": counts[Verdict.INFORMATIONAL.value],
        "harness_errors": counts[Verdict.ERROR.value],
        "error_records": sum(1 for r in records if r.verdict is Verdict.ERROR),
        "checks_run": len(records),
        "requests": sum(r.requests for r in records),
        # Advertised capabilities with behaviours no record exercised, as "capability (behaviour, …)".
        "unexercised_capabilities": _unexercised_lines(capabilities),
        # Reachable coverage cells of the entities the target's capabilities bring in that no machine reached.
        "cells_not_reached": len(not_reached(cells)),
        # Per entity with cells not reached: [not reached, applicable reachable cells].
        "cells_not_reached_by_entity": {
            row.entity: [len(row.not_reached), len(row.reached) + len(row.not_reached)]
            for row in cells
            if row.applicable and row.not_reached
        },
    }


def decide(summary: Mapping[str, Any], completeness: Completeness, *, strict: bool) -> tuple[RunVerdict, list[str]]:
    """The run verdict, and why the run is not complete (empty for a complete run)."""
    gaps = []
    if completeness.collect_only:
        gaps.append("--collect-only runs no item")
    if completeness.narrowed_by:
        gaps.append(f"the selection {' '.join(completeness.narrowed_by)}")
    gaps += list(completeness.reduced)
    if completeness.not_run and not completeness.narrowed_by:
        gaps.append(f"{len(completeness.not_run)} of {plural(completeness.items, 'item')} did not run")
    if summary["not_covered"]:
        gaps.append(
            f"{plural(summary['not_covered'], 'requirement')} not covered ({summary['not_covered_must']} MUST; "
            "see Not covered)"
        )
    if completeness.certify and summary.get("cells_not_reached"):
        gaps.append(_cells_gap(summary))
    missing = [line.split(" (")[0] for line in summary.get("unexercised_capabilities") or ()]
    if missing and summary["checks_run"]:  # a run that ran nothing says that alone
        gaps.append(
            f"{plural(len(missing), 'advertised capability', 'advertised capabilities')} with behaviours no check "
            f"exercised: {', '.join(missing)} (see Capability ledger)"
        )
    if summary["failed"] or (strict and summary["non_strict"]):
        return RunVerdict.NOT_CONFORMANT, gaps
    if summary["error_records"] or summary["harness_errors"] or summary["checks_run"] == 0:
        return RunVerdict.HARNESS_ERROR, gaps
    if gaps or summary["checked"] < summary["applicable"]:
        return RunVerdict.INCOMPLETE, gaps
    return RunVerdict.CONFORMANT, gaps


def _cells_gap(summary: Mapping[str, Any]) -> str:
    """A certification run's coverage cells not reached, per entity (``entity n of m not reached``)."""
    by_entity = summary.get("cells_not_reached_by_entity") or {}
    parts = [f"{entity} {n} of {total}" for entity, (n, total) in sorted(by_entity.items())]
    detail = f": {', '.join(parts)}" if parts else ""
    return (
        f"{plural(summary['cells_not_reached'], 'applicable coverage cell')} not reached{detail} (a certification "
        "run reaches every one; see Coverage matrix)"
    )


def headline(results: Mapping[str, Any]) -> str:
    """The one line a vendor quotes: the verdict, the target, how much was checked and why not the rest."""
    s = results["summary"]
    t = results["target"]
    verdict = RunVerdict(s["verdict"])
    counts = (
        f"{s['passed']} passed, {s['failed']} failed, {s['non_strict']} SHOULD not met, "
        f"{s['unimplemented']} unimplemented"
    )
    checked = f"{s['checked']} of {plural(s['applicable'], 'requirement')} checked"
    if verdict is RunVerdict.CONFORMANT:
        body = f"all {checked.removesuffix(' checked')} checked: {counts}"
    elif verdict is RunVerdict.NOT_CONFORMANT:
        failed = [r["id"] for r in results["requirements"] if r["verdict"] in ("failed", "non-strict")]
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        body = f"broken: {shown}; {checked}: {counts}"
    elif verdict is RunVerdict.INCOMPLETE:
        body = f"PARTIAL: {checked}, nothing that ran failed ({counts}); not checked because of {'; '.join(s['gaps'])}"
    elif s["checks_run"] == 0:
        why = "; ".join(s["gaps"]) or "nothing was collected"
        body = f"no verdict: no item ran ({why})"
    else:
        errors = s["error_records"]
        body = f"no verdict: {errors} harness error{'s' if errors != 1 else ''} (not the target's failure); {checked}"
    where = f"{t['description']} — worker protocol {t['certified_version']}"
    return f"{verdict.value}: {where}: {body} (suite {results['suite_version']}, run {results['run_id']})"


def target_doc(target: TargetInfo) -> dict[str, Any]:
    info = target.cluster_info
    server = {
        "name": _text(info.get("server_name") or info.get("name")),
        "version": _text(info.get("version")),
        "id": _text(info.get("server_id")),
    }
    version = f" {server['version']}" if server["version"] else ""
    description = f"embedded reference server{version} at {target.url}" if target.embedded else target.url
    return {
        "url": target.url,
        "embedded": target.embedded,
        "description": description,
        "server": server,
        "advertised_version": target.advertised_version,
        "certified_version": target.protocol_version,
        "capabilities": target.server_capabilities,
        "test_profile": target.test_profile,
        "clock_skew_seconds": target.clock_skew_seconds,
        **({"auth": target.auth} if target.auth is not None else {}),
        **({"time": target.time} if target.time is not None else {}),
    }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def build_results(
    target: TargetInfo,
    records: list[Record],
    run: Mapping[str, Any],
    *,
    options: Mapping[str, Any],
    completeness: Completeness | None = None,
) -> dict[str, Any]:
    """The whole document of a run (``results.json``)."""
    completeness = completeness or Completeness()
    rows = aggregate(records, target.certified_minor)
    capabilities = capability_ledger(target.server_capabilities, records, target.certified_minor)
    cells = coverage_matrix(target.server_capabilities, records, target.test_profile)
    summary = summarize(rows, records, capabilities, cells)
    verdict, gaps = decide(summary, completeness, strict=target.strict)
    summary.update(verdict=verdict.value, conformant=verdict is RunVerdict.CONFORMANT, gaps=gaps)
    results: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "run_id": run["run_id"],
        "started_at": run["started_at"],
        "finished_at": run.get("finished_at") or datetime.now(UTC).isoformat(),
        "command": run.get("command", ""),
        "suite_version": suite.__version__,
        "suite_build": suite_build(),
        "seed": run["seed"],
        "target": target_doc(target),
        "options": dict(options),
        "completeness": completeness.to_json(),
        "summary": summary,
        "requirements": rows,
        "checks": [{k: v for k, v in r.to_json().items() if k not in ("exchanges", "cells")} for r in records],
        "capability_ledger": [row.to_json() for row in capabilities],
        "coverage_ledger": _ledgers(records),
        "coverage_matrix": [row.to_json() for row in cells],
        "fuzz_statistics": [r.fuzz.__dict__ | {"statuses": dict(r.fuzz.statuses)} for r in records if r.fuzz],
    }
    summary["headline"] = headline(results)
    return results


def _ledgers(records: list[Record]) -> dict[str, dict[str, int]]:
    """How often each state machine reached each hard state (one ledger per machine)."""
    return {
        r.check.removeprefix("machine:"): {str(k): int(v) for k, v in sorted(r.ledger.items())}
        for r in records
        if r.ledger is not None
    }
