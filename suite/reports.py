"""Reports: one results document, written out by one writer per format.

``build_results`` turns the per-check records into per-requirement verdicts (the document validated by
``schemas/json/report.schema.json``); ``write_reports`` writes ``results.json``, ``junit.xml`` and
``report.html`` into ``reports/<run-id>/``. Tokens never reach a report: the client redacts them in
every exchange and the options record only whether a token was set.

The mutant kill matrix (``python -m suite.mutants``) is rendered here too: ``mutants.html`` on its own, and
as a section of every ``report.html`` written beside a ``mutants.json`` (``reports/mutants.json`` for
``reports/<run-id>/report.html``).
"""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import suite
from suite.protocol.requirements import REGISTRY, applicable

from .context import TargetInfo
from .outcomes import Verdict, worst

__all__ = [
    "build_results",
    "render_html",
    "render_junit",
    "render_mutants_page",
    "render_mutants_section",
    "terminal_lines",
    "write_reports",
]

REPORT_SCHEMA = "durable-workflow.conformance-report.v1"


def build_results(
    target: TargetInfo, records: list[dict[str, Any]], run: dict[str, Any], *, options: dict[str, Any]
) -> dict[str, Any]:
    by_req: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        for req_id in rec["requirements"]:
            by_req[req_id].append(rec)
        failed_req = rec.get("failed_requirement")
        if failed_req and failed_req not in rec["requirements"]:
            by_req[failed_req].append(rec)
    requirements = []
    for req in REGISTRY.values():
        if not applicable(req, target.certified_minor):
            verdict, reason, evidence = (
                Verdict.NOT_COVERED,
                f"not applicable at protocol {target.protocol_version}",
                [],
            )
        else:
            recs = by_req.get(req.id, [])
            verdicts = []
            for rec in recs:
                v = Verdict(rec["verdict"])
                # A check that failed on another of its requirements says nothing about this one.
                if v in (Verdict.FAILED, Verdict.NON_STRICT) and rec.get("failed_requirement") != req.id:
                    v = Verdict.NOT_COVERED
                verdicts.append(v)
            verdict = worst(verdicts) if verdicts else Verdict.NOT_COVERED
            evidence = [r for r, v in zip(recs, verdicts, strict=True) if v is verdict]
            reason = "; ".join(sorted({r.get("message") or "" for r in evidence} - {""}))[:2000]
            if not recs:
                reason = "no check of this requirement ran in this session"
        requirements.append(
            {
                "id": req.id,
                "level": req.level.value,
                "area": req.area.value,
                "minor": req.minor,
                "invariant": req.invariant,
                "source": req.source,
                "sentence": req.sentence,
                "verdict": verdict.value,
                "reason": reason,
                "checks": [r["check"] for r in by_req.get(req.id, [])],
                "exchanges": [e for r in evidence for e in r.get("exchanges", [])][:6],
            }
        )
    counts = Counter(r["verdict"] for r in requirements)
    summary = {
        "requirements": len(requirements),
        "passed": counts.get(Verdict.PASSED.value, 0),
        "failed": counts.get(Verdict.FAILED.value, 0),
        "non_strict": counts.get(Verdict.NON_STRICT.value, 0),
        "unimplemented": counts.get(Verdict.UNIMPLEMENTED.value, 0),
        "not_covered": counts.get(Verdict.NOT_COVERED.value, 0),
        "informational": counts.get(Verdict.INFORMATIONAL.value, 0),
        "harness_errors": counts.get(Verdict.ERROR.value, 0),
        "checks_run": len(records),
        "requests": sum(int(r.get("requests") or 0) for r in records),
    }
    summary["conformant"] = (
        summary["failed"] == 0 and summary["harness_errors"] == 0 and (not target.strict or summary["non_strict"] == 0)
    )
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run["run_id"],
        "started_at": run["started_at"],
        "finished_at": datetime.now(UTC).isoformat(),
        "suite_version": suite.__version__,
        "seed": run["seed"],
        "target": {
            "url": target.url,
            "embedded": target.embedded,
            "advertised_version": target.advertised_version,
            "certified_version": target.protocol_version,
            "capabilities": target.server_capabilities,
            "clock_skew_seconds": target.clock_skew_seconds,
        },
        "options": options,
        "summary": summary,
        "requirements": requirements,
        "checks": [{k: v for k, v in r.items() if k != "exchanges"} for r in records],
        "coverage_ledger": _ledgers(records),
    }


def _ledgers(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How often each state machine reached each hard state (one ledger per machine)."""
    out: dict[str, dict[str, int]] = {}
    for rec in records:
        ledger = rec.get("ledger")
        if isinstance(ledger, dict) and str(rec.get("check", "")).startswith("machine:"):
            out[rec["check"].removeprefix("machine:")] = {str(k): int(v) for k, v in sorted(ledger.items())}
    return out


def _ledger_section(ledgers: dict[str, dict[str, int]]) -> str:
    if not ledgers:
        return ""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(machine)}</td><td><code>{e(state)}</code></td><td>{count}</td></tr>"
        for machine, ledger in sorted(ledgers.items())
        for state, count in ledger.items()
    )
    return (
        "<h2>State-machine coverage ledger</h2><p>How often each hard state was reached; a requirement whose "
        "state was never reached is not covered, never passed.</p><table><thead><tr><th>Machine</th><th>State"
        f"</th><th>Reached</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def write_reports(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    (out_dir / "junit.xml").write_text(render_junit(results), encoding="utf-8")
    (out_dir / "report.html").write_text(render_html(results, mutants=_mutants_beside(out_dir)), encoding="utf-8")
    return out_dir


def _mutants_beside(out_dir: Path) -> dict[str, Any] | None:
    """The kill matrix in the report directory's parent (``reports/mutants.json``), if one was written."""
    path = out_dir.parent / "mutants.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("mutants"), list) else None


def quote_line(results: dict[str, Any]) -> str:
    s = results["summary"]
    t = results["target"]
    verdict = "CONFORMANT" if s["conformant"] else "NOT CONFORMANT"
    return (
        f"{verdict}: {t['url']} — worker protocol {t['certified_version']}: {s['passed']}/{s['requirements']} "
        f"requirements passed, {s['failed']} failed, {s['non_strict']} SHOULD not met, "
        f"{s['not_covered']} not covered, {s['unimplemented']} unimplemented "
        f"(suite {results['suite_version']}, run {results['run_id']})"
    )


def terminal_lines(results: dict[str, Any], report_dir: str) -> list[str]:
    lines = ["", "=" * 30 + " Durable Workflow conformance " + "=" * 30]
    areas: dict[str, Counter[str]] = defaultdict(Counter)
    for req in results["requirements"]:
        areas[req["area"]][req["verdict"]] += 1
    for area in sorted(areas):
        c = areas[area]
        parts = [
            f"{c[v]} {v}"
            for v in (
                "passed",
                "failed",
                "non-strict",
                "not-covered",
                "unimplemented",
                "informational",
                "error",
            )
            if c[v]
        ]
        lines.append(f"  {area:<16} " + ", ".join(parts))
    for req in results["requirements"]:
        if req["verdict"] in ("failed", "error") or (req["verdict"] == "non-strict"):
            lines.append(f"  {req['verdict'].upper():<10} {req['id']} ({req['level']}): {req['reason'][:200]}")
    skew = results["target"].get("clock_skew_seconds")
    if skew is not None and abs(skew) >= 2:
        lines.append(
            f"  clock skew: the target's clock is {skew:+.1f} s from this machine's (reported, not judged: "
            "timing checks use the server's own timestamps)"
        )
    lines.append(f"  reports: {report_dir}/report.html, results.json, junit.xml")
    lines.append(quote_line(results))
    return lines


def render_junit(results: dict[str, Any]) -> str:
    suite_el = ET.Element("testsuite", name="durable-workflow-conformance", tests=str(len(results["requirements"])))
    failures = errors = skipped = 0
    for req in results["requirements"]:
        case = ET.SubElement(suite_el, "testcase", classname=f"conformance.{req['area']}", name=req["id"])
        verdict = req["verdict"]
        if verdict == "failed":
            failures += 1
            ET.SubElement(case, "failure", message=req["reason"][:500]).text = req["sentence"]
        elif verdict == "error":
            errors += 1
            ET.SubElement(case, "error", message=req["reason"][:500])
        elif verdict in ("not-covered", "unimplemented", "non-strict"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{verdict}: {req['reason'][:500]}")
    suite_el.set("failures", str(failures))
    suite_el.set("errors", str(errors))
    suite_el.set("skipped", str(skipped))
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite_el, encoding="unicode")


_COLORS = {
    "passed": "#1a7f37",
    "failed": "#cf222e",
    "non-strict": "#bf8700",
    "not-covered": "#6e7781",
    "unimplemented": "#8250df",
    "informational": "#0969da",
    "error": "#953800",
}


def _faults_line(results: dict[str, Any]) -> str:
    """Under --faults: through which faults the run went, and how often a check had to run again."""
    options = results.get("options") or {}
    if options.get("faults") is None:
        return ""
    checks = results.get("checks") or []
    reran = [c for c in checks if c.get("fault_reruns")]
    runs = sum(int(c["fault_reruns"]) for c in reran)
    seed = options.get("fault_seed")
    return (
        f"<p id='faults'>Run through the fault-injecting proxy: <code>--faults {html.escape(str(options['faults']))}"
        f"</code>{f', seed {seed}' if seed is not None else ''}. {len(reran)} check{'' if len(reran) == 1 else 's'} "
        f"ran again ({runs} re-runs in "
        "all) because a fault left an outcome unknown; lost answers were resent only where the protocol makes "
        "that safe, and every resend and duplicate was judged against the answer the client never saw.</p>"
    )


def render_html(results: dict[str, Any], *, mutants: dict[str, Any] | None = None) -> str:
    """One self-contained page: badge, summary, a table by area, and every failure with its evidence; with
    ``mutants`` (a ``mutants.json`` document), a "Mutant kill matrix" section at the end."""
    e = html.escape
    s = results["summary"]
    ok = s["conformant"]
    badge = "CONFORMANT" if ok else "NOT CONFORMANT"
    rows = []
    for req in sorted(results["requirements"], key=lambda r: (r["area"], r["id"])):
        color = _COLORS.get(req["verdict"], "#000")
        rows.append(
            f"<tr><td>{e(req['area'])}</td><td><code>{e(req['id'])}</code></td><td>{e(req['level'])}</td>"
            f"<td style='color:{color};font-weight:600'>{e(req['verdict'])}</td>"
            f"<td>{e(req['sentence'])}</td><td>{e(req['reason'][:300])}</td></tr>"
        )
    failures = []
    for req in results["requirements"]:
        if req["verdict"] not in ("failed", "non-strict", "error"):
            continue
        ex_html = []
        for ex in req["exchanges"]:
            # An answer the fault proxy kept from the client carries that in its error: show it.
            note = f" ({ex['error']})" if ex.get("error") else ""
            ex_html.append(
                "<details open><summary>"
                + e(f"{ex['method']} {ex['url']} → {ex.get('status')}{note}")
                + "</summary>"
                + "<h4>Request</h4><pre>"
                + e(json.dumps(ex.get("request_headers"), indent=1))
                + "\n"
                + e(ex.get("request_body") or "")
                + "</pre>"
                + "<h4>Response</h4><pre>"
                + e(json.dumps(ex.get("response_body"), indent=1, default=str)[:6000])
                + "</pre><h4>Reproduce</h4><pre>"
                + e(ex.get("curl") or "")
                + "</pre></details>"
            )
        failures.append(
            f"<section class='failure' id='{e(req['id'])}'><h3>{e(req['verdict'].upper())} "
            f"<code>{e(req['id'])}</code> ({e(req['level'])}, {e(req['area'])})</h3>"
            f"<blockquote>{e(req['sentence'])}<br><small>{e(req['source'])}</small></blockquote>"
            f"<pre>{e(req['reason'])}</pre>{''.join(ex_html)}</section>"
        )
    t = results["target"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Conformance report — {e(t["url"])}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#1f2328}}
.badge{{display:inline-block;padding:.4rem 1rem;border-radius:6px;color:#fff;font-weight:700;
background:{"#1a7f37" if ok else "#cf222e"}}}
table{{border-collapse:collapse;width:100%;font-size:.85rem}}td,th{{border:1px solid #d0d7de;padding:4px;
vertical-align:top;text-align:left}}pre{{background:#f6f8fa;padding:.5rem;overflow-x:auto;white-space:pre-wrap}}
.failure{{border-left:4px solid #cf222e;padding-left:1rem;margin:1rem 0}}
</style></head><body>
<h1>Durable Workflow worker protocol conformance</h1>
<p id="summary"><span class="badge" id="badge">{badge}</span>
 {s["passed"]}/{s["requirements"]} requirements passed · {s["failed"]} failed · {s["non_strict"]} SHOULD not met ·
 {s["not_covered"]} not covered · {s["unimplemented"]} unimplemented · {s["harness_errors"]} harness errors</p>
<p>Target <code>{e(t["url"])}</code> advertises protocol <code>{e(str(t["advertised_version"]))}</code>;
certified at <code>{e(t["certified_version"])}</code>. Suite {e(results["suite_version"])}, run
<code>{e(results["run_id"])}</code>, seed {results["seed"]}, {s["checks_run"]} checks, {s["requests"]} requests.</p>
<p><b>{e(quote_line(results))}</b></p>
{_faults_line(results)}
<h2>Failures</h2>{"".join(failures) or "<p>None.</p>"}
<h2>All requirements</h2>
<table><thead><tr><th>Area</th><th>Requirement</th><th>Level</th><th>Verdict</th><th>Rule</th><th>Note</th></tr>
</thead><tbody>{"".join(rows)}</tbody></table>
{_ledger_section(results.get("coverage_ledger") or {})}
{render_mutants_section(mutants) if mutants else ""}
</body></html>
"""


# -- the mutant kill matrix --------------------------------------------------------------------------------


def render_mutants_section(matrix: dict[str, Any]) -> str:
    """The kill matrix as one HTML section: a summary line and a table, survivors and gaps highlighted."""
    e = html.escape
    s = matrix["summary"]
    rows = []
    corrects = [matrix["correct"], *([matrix["correct_proxy"]] if matrix.get("correct_proxy") else [])]
    for m in [*matrix["mutants"], *corrects]:
        first = m.get("first_failure") or {}
        correct = any(m is c for c in corrects)
        if correct:
            verdict, style = ("passed", "") if m["verdict"] == "passed" else (m["verdict"].upper(), " class='gap'")
        elif m["verdict"] == "killed":
            verdict = "killed" if m.get("as_expected") else "killed (unexpected)"
            style = "" if m.get("as_expected") else " class='gap'"
        else:
            verdict, style = m["verdict"].upper(), " class='gap'"
        killed_by = ", ".join(f"<b>{e(r)}</b>" if r in m["expected"] else e(r) for r in m.get("failed", [])) or e(
            m.get("note") or "—"
        )
        # A bug only retried requests reveal: killed through the fault proxy, and must survive without it.
        network = "—"
        if m.get("proxy"):
            network = f"<code>--faults {e(m['proxy'])}</code>"
            if m.get("without_proxy"):
                network += f"; without the proxy: {e(m['without_proxy'])}"
        rows.append(
            f"<tr{style}><td><code>{e(m['name'])}</code></td><td>{e(m['description'])}</td><td>{network}</td>"
            f"<td>{e(', '.join(m['expected']) or '—')}</td><td>{e(verdict)}</td><td>{killed_by}</td>"
            f"<td>{e(str(first.get('requests', '—')))}</td><td>{e(str(first.get('seconds', '—')))}</td></tr>"
        )
    gaps = "".join(f"<li>{e(g)}</li>" for g in s.get("gaps", []))
    return f"""<section id="mutants"><h2>Mutant kill matrix</h2>
<style>#mutants tr.gap td{{background:#ffebe9;font-weight:600}}</style>
<p id="mutants-summary">{s["killed"]}/{s["mutants"]} mutants killed, {s["killed_as_expected"]} by the expected
requirement · {s["survived"]} survived · {s["errors"]} errors · correct server
{"passed" if s["correct_server_passed"] else "FAILED"} · {e(matrix["mode"])} runs, --jobs {matrix["jobs"]},
{matrix["seconds"]:.0f} s in all. Requests and seconds are counted up to the first failing check.</p>
{f"<ul class='gaps'>{gaps}</ul>" if gaps else ""}
<table><thead><tr><th>Mutant</th><th>Description</th><th>Network</th><th>Expected requirement</th><th>Verdict</th>
<th>Killed by</th><th>Requests</th><th>Seconds</th></tr></thead><tbody>{"".join(rows)}</tbody></table>
</section>"""


def render_mutants_page(matrix: dict[str, Any]) -> str:
    """``mutants.html``: the kill matrix on a self-contained page."""
    ok = not matrix["summary"].get("gaps")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Mutant kill matrix</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1400px;color:#1f2328}}
.badge{{display:inline-block;padding:.4rem 1rem;border-radius:6px;color:#fff;font-weight:700;
background:{"#1a7f37" if ok else "#cf222e"}}}
table{{border-collapse:collapse;width:100%;font-size:.85rem}}td,th{{border:1px solid #d0d7de;padding:4px;
vertical-align:top;text-align:left}}
</style></head><body>
<h1>Durable Workflow conformance suite: mutant kill matrix</h1>
<p><span class="badge" id="badge">{"EVERY MUTANT KILLED" if ok else "GAPS FOUND"}</span></p>
{render_mutants_section(matrix)}
</body></html>
"""
