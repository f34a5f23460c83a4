"""Reports: the results document (:mod:`suite.results`), written out by one writer per format.

``write_reports`` writes ``results.json``, ``junit.xml`` and ``report.html`` into ``reports/<run-id>/``;
``terminal_lines`` is the end-of-run summary. Tokens never reach a report: the client redacts them in every
exchange, the command line is recorded with token values redacted, and the options record only whether a
token was set.

The mutant kill matrix (``python -m suite.mutants``) is rendered here too: ``mutants.html`` on its own, and
as a section of every ``report.html`` written beside a ``mutants.json`` (``reports/mutants.json`` for
``reports/<run-id>/report.html``).
"""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from .outcomes import RunVerdict
from .results import REPORT_SCHEMA, headline
from .text import clip, plural, wrap

__all__ = [
    "REPORT_SCHEMA",
    "VERDICT_LEGEND",
    "render_html",
    "render_junit",
    "render_mutants_page",
    "render_mutants_section",
    "shown_verdict",
    "terminal_lines",
    "write_reports",
]

REPORT_FILES = ("results.json", "junit.xml", "report.html")

RUN_LEGEND: dict[str, str] = {
    RunVerdict.CONFORMANT.value: "every applicable requirement was checked at the default budgets, no MUST "
    "failed, none is not covered, no harness error, nothing narrowed the run",
    RunVerdict.NOT_CONFORMANT.value: "a MUST is broken (or a SHOULD, under --strict); exit status 1",
    RunVerdict.INCOMPLETE.value: "nothing that ran failed, but the run did not check everything (a selection, a "
    "budget below its default, requirements not covered); exit status 0, or 11 under --certify",
    RunVerdict.HARNESS_ERROR.value: "the suite or the network broke, or nothing ran: no verdict on the target; "
    "exit status 10",
}
VERDICT_LEGEND: dict[str, str] = {
    "passed": "every check of the requirement passed",
    "failed": "a MUST is broken",
    "non-strict": "a SHOULD is broken (fails the run only under --strict)",
    "unimplemented": "an optional capability the target does not advertise",
    "informational": "works, but the capability is not advertised",
    "not-covered": "could not be checked here; the Not covered section names the setting that covers it",
    "not run": "no item of the requirement ran: it is outside the selection, or the run stopped before it (-x)",
    "not-applicable": "introduced after the protocol minor being certified",
    "error": "the harness or the network broke — never the target's failure",
}


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
    """The headline (kept in the document; recomputed for documents written before it was)."""
    return str(results["summary"].get("headline") or headline(results))


_TERMINAL_ORDER = (
    "passed",
    "failed",
    "non-strict",
    "not-covered",
    "not run",
    "unimplemented",
    "informational",
    "error",
)
# A curl line is printed whole or not at all (a cut one reproduces nothing); past this length the terminal
# points at report.html, which holds every exchange in full.
CURL_LINE_MAX = 4000


def shown_verdict(req: dict[str, Any]) -> str:
    """The verdict a writer shows for a requirement row: "not run" when no item of it ran (outside the
    selection, or after ``-x`` or an interrupt stopped the run) — the same in every writer."""
    return "not run" if req["verdict"] == "not-covered" and not req["ran"] else str(req["verdict"])


def terminal_lines(results: dict[str, Any], report_dir: str | None, width: int = 100) -> list[str]:
    """The end-of-run summary: verdicts per area, then every failure whole — its message, the rule it breaks
    and a ``curl`` line that reproduces it — what was not covered and how to cover it, and the headline.
    Long lines wrap at word boundaries to ``width`` columns; nothing is cut."""
    lines = ["", "=" * 30 + " Durable Workflow conformance " + "=" * 30]
    areas: dict[str, Counter[str]] = defaultdict(Counter)
    for req in results["requirements"]:
        areas[req["area"]][shown_verdict(req)] += 1
    for area in sorted(areas):
        c = areas[area]
        lines.append(f"  {area:<16} " + ", ".join(f"{c[v]} {v}" for v in _TERMINAL_ORDER if c[v]))
    for req in results["requirements"]:
        if req["verdict"] in ("failed", "error", "non-strict"):
            lines += _terminal_failure(req, width, report_dir)
    for req in results["requirements"]:
        if req["verdict"] == "not-covered" and req["ran"]:
            cover = f" — to cover it: {req['setting']}" if req["setting"] else ""
            lines += wrap(f"NOT COVERED {req['id']} ({req['level']}): {req['reason']}{cover}", width, "  ")
    lines += wrap(capability_line(results), width, "  ")
    for line in coverage_lines(results):
        lines += wrap(line, width, "  ")
    auth = results["target"].get("auth")
    if auth is not None and not auth.get("enabled"):
        lines += wrap(f"auth: {auth['summary']}", width, "  ")
    skew = results["target"].get("clock_skew_seconds")
    if skew is not None and abs(skew) >= 2:
        lines.append(
            f"  clock skew: the target's clock is {skew:+.1f} s from this machine's (reported, not judged: "
            "timing checks use the server's own timestamps)"
        )
    if report_dir is not None:
        lines.append(f"  reports: {report_dir}/report.html, results.json, junit.xml")
    lines.append(quote_line(results))
    return lines


def capability_line(results: dict[str, Any]) -> str:
    """The capability ledger in one line: how many advertised capabilities had every promised behaviour
    exercised, and which behaviours were not."""
    rows = results.get("capability_ledger") or []
    behaviours = sum(len(r["behaviours"]) for r in rows)
    missing = results["summary"].get("unexercised_capabilities") or []
    head = (
        f"capabilities: {plural(len(rows), 'advertised capability', 'advertised capabilities')} promise "
        f"{plural(behaviours, 'behaviour')}"
    )
    if not missing:
        return f"{head}, every one exercised"
    return f"{head}; never exercised: {'; '.join(missing)}"


def coverage_lines(results: dict[str, Any]) -> list[str]:
    """One line per entity of the coverage matrix with cells in this run: reached (hits), ruled out, not reached."""
    out = []
    for row in results.get("coverage_matrix") or []:
        reached = row["reached"]
        total = len(reached) + len(row["not_reached"])
        if not row["applicable"] and not reached:
            continue
        line = (
            f"coverage {row['entity']}: {len(reached)}/{total} cells reached ({plural(sum(reached.values()), 'hit')}), "
            f"{len(row['ruled_out'])} ruled out, {len(row['not_reached'])} not reached"
        )
        if row.get("not_applicable"):
            line += f", {len(row['not_applicable'])} not applicable to this target"
        if row.get("impossible_hits"):
            line += f"; hit though ruled out (a classifier bug of the suite): {', '.join(row['impossible_hits'])}"
        out.append(line)
    return out


def _terminal_failure(req: dict[str, Any], width: int, report_dir: str | None) -> list[str]:
    """One failure: the whole message, the spec sentence it breaks, and the curl line of its last exchange."""
    out = wrap(f"{req['verdict'].upper():<10} {req['id']} ({req['level']}): {req['reason']}", width, "  ")
    out += wrap(f"Rule ({req['section']}): {req['sentence']}", width, "    ")
    exchanges = [ex for ex in req.get("exchanges") or [] if ex.get("curl")]
    if exchanges:
        curl = str(exchanges[-1]["curl"])
        more = len(exchanges) - 1
        where = f"{report_dir}/report.html" if report_dir else "report.html"
        if len(curl) > CURL_LINE_MAX:
            out.append(f"    Reproduce: a curl line of {plural(len(curl), 'character')}, whole in {where}")
        else:
            out.append(f"    Reproduce: {curl}")  # one line, never wrapped: it is copied as it is
        if more:
            out.append(f"    ({plural(more, 'more exchange')} of this failure in {where})")
    return out


def _junit_time(value: str) -> str:
    """JUnit's timestamp: ISO 8601 in UTC without an offset (``2026-01-01T00:00:00``)."""
    return datetime.fromisoformat(value).replace(tzinfo=None).isoformat(timespec="seconds")


def _seconds(results: dict[str, Any]) -> float:
    started = datetime.fromisoformat(results["started_at"])
    return max(0.0, (datetime.fromisoformat(results["finished_at"]) - started).total_seconds())


def render_junit(results: dict[str, Any]) -> str:
    """One test case per requirement (its verdict), timed by the checks that judged it."""
    durations: dict[str, float] = defaultdict(float)
    for rec in results["checks"]:
        for req_id in rec["requirements"]:
            durations[req_id] += float(rec.get("duration_seconds") or 0.0)
    suite_el = ET.Element(
        "testsuite",
        name="durable-workflow-conformance",
        tests=str(len(results["requirements"])),
        timestamp=_junit_time(results["started_at"]),
        time=f"{_seconds(results):.3f}",
    )
    props = ET.SubElement(suite_el, "properties")
    for name, value in (
        ("verdict", results["summary"]["verdict"]),
        ("run_id", results["run_id"]),
        ("target", results["target"]["description"]),
        ("target_url", results["target"]["url"]),
        ("suite_version", results["suite_version"]),
    ):
        ET.SubElement(props, "property", name=name, value=str(value))
    failures = errors = skipped = 0
    for req in results["requirements"]:
        case = ET.SubElement(
            suite_el,
            "testcase",
            classname=f"conformance.{req['area']}",
            name=req["id"],
            time=f"{durations.get(req['id'], 0.0):.3f}",
        )
        verdict = req["verdict"]
        if verdict == "failed":
            failures += 1
            ET.SubElement(case, "failure", message=clip(req["reason"], 500, "results.json")).text = req["sentence"]
        elif verdict == "error":
            errors += 1
            ET.SubElement(case, "error", message=clip(req["reason"], 500, "results.json"))
        elif verdict in ("not-covered", "unimplemented", "non-strict", "not-applicable"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{shown_verdict(req)}: {clip(req['reason'], 500, 'results.json')}")
    suite_el.set("failures", str(failures))
    suite_el.set("errors", str(errors))
    suite_el.set("skipped", str(skipped))
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite_el, encoding="unicode")


_COLORS = {
    "passed": "#1a7f37",
    "failed": "#cf222e",
    "non-strict": "#bf8700",
    "not-covered": "#6e7781",
    "not-applicable": "#6e7781",
    "unimplemented": "#8250df",
    "informational": "#0969da",
    "error": "#953800",
}
_BADGE_COLORS = {
    RunVerdict.CONFORMANT.value: "#1a7f37",
    RunVerdict.NOT_CONFORMANT.value: "#cf222e",
    RunVerdict.INCOMPLETE.value: "#9a6700",
    RunVerdict.HARNESS_ERROR.value: "#953800",
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
        f"ran again ({plural(runs, 're-run')} in "
        "all) because a fault left an outcome unknown; lost answers were resent only where the protocol makes "
        "that safe, and every resend and duplicate was judged against the answer the client never saw.</p>"
    )


def _utc(value: str) -> str:
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S UTC")


def _build(results: dict[str, Any]) -> str:
    """The suite's exact build (version, commit, uncommitted changes), as a third party installs it."""
    from .build import describe

    build = results.get("suite_build")
    return describe(build) if build else f"suite {results['suite_version']}"


def _certification(results: dict[str, Any]) -> str:
    """Whether the run is a certification, and whether (and by which key) its bundle is signed."""
    cert = results.get("certification") or {}
    if not cert.get("certify"):
        return "no: an ordinary run, no bundle (--certify writes one)"
    if cert.get("key_fingerprint"):
        return f"yes, signed by {cert['key_fingerprint']} (manifest.intoto.json)"
    return "yes, unsigned: anyone could have produced this bundle (--sign-key signs it)"


def _run_section(results: dict[str, Any]) -> str:
    e = html.escape
    t = results["target"]
    server = t.get("server") or {}
    named = f"{server.get('name') or 'no name given'}, version {server.get('version') or 'not given'}"
    rows = [
        ("Date", f"{_utc(results['started_at'])} to {_utc(results['finished_at'])} ({_seconds(results):.0f} s)"),
        ("Target", t["description"]),
        ("Server (from discovery)", named + (f", id {server['id']}" if server.get("id") else "")),
        ("Protocol", f"advertises {t['advertised_version']}; certified at {t['certified_version']}"),
        *([("Auth", t["auth"]["summary"])] if t.get("auth") else []),
        ("Suite", f"{_build(results)}, run {results['run_id']}, seed {results['seed']}"),
        ("Certification", _certification(results)),
        ("Command line", results.get("command") or "not recorded"),
    ]
    body = "".join(f"<tr><th>{e(k)}</th><td><code>{e(str(v))}</code></td></tr>" for k, v in rows)
    options = "".join(
        f"<tr><th><code>{e(str(k))}</code></th><td><code>{e(json.dumps(v, default=str))}</code></td></tr>"
        for k, v in sorted((results.get("options") or {}).items())
    )
    s = results["summary"]
    return (
        f"<h2>Run</h2><table id='run'><tbody>{body}</tbody></table>"
        f"<details><summary>Options</summary><table id='options'><tbody>{options}</tbody></table></details>"
        f"<p id='counts'>{plural(s['checks_run'], 'record')} from checks, machines and fuzz groups; "
        f"{plural(s['requests'], 'request')}; "
        f"{results['completeness']['items_run']} of {plural(results['completeness']['items'], 'item')} ran.</p>"
    )


def _legend() -> str:
    e = html.escape
    run = "".join(f"<tr><td><b>{e(k)}</b></td><td>{e(v)}</td></tr>" for k, v in RUN_LEGEND.items())
    req = "".join(
        f"<tr><td style='color:{_COLORS.get(k, '#6e7781')};font-weight:600'>{e(k)}</td><td>{e(v)}</td></tr>"
        for k, v in VERDICT_LEGEND.items()
    )
    return (
        "<details id='legend'><summary>Legend</summary><table><thead><tr><th>Run verdict</th><th>Meaning</th>"
        f"</tr></thead><tbody>{run}</tbody></table><table><thead><tr><th>Requirement verdict</th><th>Meaning</th>"
        f"</tr></thead><tbody>{req}</tbody></table></details>"
    )


def _failures(results: dict[str, Any]) -> str:
    e = html.escape
    out = []
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
                + "</summary><h4>Request</h4><pre>"
                + e(json.dumps(ex.get("request_headers"), indent=1))
                + "\n"
                + e(ex.get("request_body") or "")
                + "</pre><h4>Response</h4><pre>"
                + e(clip(json.dumps(ex.get("response_body"), indent=1, default=str), 6000, "results.json"))
                + "</pre><h4>Reproduce</h4><pre>"
                + e(ex.get("curl") or "")
                + "</pre></details>"
            )
        out.append(
            f"<section class='failure' id='{e(req['id'])}'><h3>{e(req['verdict'].upper())} "
            f"<code class='id'>{e(req['id'])}</code> ({e(req['level'])}, {e(req['area'])}, {e(req['section'])})</h3>"
            f"<blockquote>{e(req['sentence'])}<br><small>{e(req['source'])}</small></blockquote>"
            f"<pre>{e(req['reason'])}</pre>{''.join(ex_html)}</section>"
        )
    return f"<h2>Failures</h2>{''.join(out) or '<p>None.</p>'}"


def _not_covered(results: dict[str, Any]) -> str:
    """What the run tried and could not judge, each with the exact setting that covers it, and how much did
    not run at all."""
    e = html.escape
    tried = [r for r in results["requirements"] if r["verdict"] == "not-covered" and r["ran"]]
    rows = "".join(
        f"<tr><td><code class='id'>{e(r['id'])}</code></td><td>{e(r['level'])}</td><td>{e(r['reason'])}</td>"
        f"<td><code>{e(r['setting'] or 'no setting: the target did not allow it')}</code></td></tr>"
        for r in tried
    )
    table = (
        "<table><thead><tr><th>Requirement</th><th>Level</th><th>Why</th><th>To cover it</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if tried
        else "<p>None.</p>"
    )
    not_run = [r["id"] for r in results["requirements"] if r["verdict"] == "not-covered" and not r["ran"]]
    gaps = results["summary"].get("gaps") or []
    extra = ""
    if not_run:
        extra = (
            f"<p id='not-run'>{plural(len(not_run), 'requirement was', 'requirements were')} not run at all"
            f"{' because of ' + e('; '.join(gaps)) if gaps else ''}.</p>"
        )
    return f"<h2 id='not-covered'>Not covered</h2>{table}{extra}"


def _requirements(results: dict[str, Any]) -> str:
    e = html.escape
    areas: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for req in results["requirements"]:
        areas[req["area"]].append(req)
    parts = []
    for area in sorted(areas):
        rows = []
        for req in sorted(areas[area], key=lambda r: r["id"]):
            note = req["reason"].splitlines()[0] if req["reason"] else ""
            if req["verdict"] in ("failed", "non-strict", "error"):
                note = f"<a href='#{e(req['id'])}'>{e(note)}</a>"
            else:
                note = e(note)
            shown = shown_verdict(req)
            rows.append(
                f"<tr><td><code class='id'>{e(req['id'])}</code></td><td>{e(req['level'])}</td>"
                f"<td class='section'>{e(req['section'])}</td><td class='verdict' style='color:"
                f"{_COLORS.get(req['verdict'], '#000')};font-weight:600'>{e(shown)}</td>"
                f"<td>{e(req['sentence'])}</td><td>{note}</td></tr>"
            )
        parts.append(
            f"<h3 id='area-{e(area)}'>{e(area)}</h3><table class='reqs'><thead><tr><th>Requirement</th>"
            "<th>Level</th><th>Section</th><th>Verdict</th><th>Rule</th><th>Note</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    return "<h2>Requirements by area</h2>" + "".join(parts)


# The fuzz table's columns: (label, key of a fuzz_statistics row).
FUZZ_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Group", "group"),
    ("Operation", "operation"),
    ("Cases", "cases"),
    ("Coverage phase", "coverage"),
    ("Positive", "positive"),
    ("Negative", "negative"),
    ("On a live workflow", "live"),
    ("State comparisons", "compared"),
    ("Sequences", "sequences"),
    ("Unsendable", "unsendable"),
    ("Requests", "requests"),
    ("Statuses", "statuses"),
    ("Seconds", "seconds"),
)


def _fuzz_section(results: dict[str, Any]) -> str:
    stats = results.get("fuzz_statistics") or []
    if not stats:
        return ""
    e = html.escape

    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        if key == "statuses":
            return ", ".join(f"{code}×{n}" for code, n in sorted((value or {}).items()))
        return str(value if value is not None else "")

    head = "".join(f"<th>{e(label)}</th>" for label, _ in FUZZ_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(cell(row, key))}</td>" for _, key in FUZZ_COLUMNS) + "</tr>" for row in stats
    )
    total = sum(int(r.get("cases") or 0) for r in stats)
    return (
        f"<h2>Fuzz statistics</h2><p>{plural(len(stats), 'operation')}, {plural(total, 'case')}.</p>"
        f"<table id='fuzz'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _capability_section(results: dict[str, Any]) -> str:
    rows = results.get("capability_ledger") or []
    e = html.escape
    body = []
    for cap in rows:
        for b in cap["behaviours"]:
            reqs = ", ".join(f"{r['id']} ×{r['exercised']}" for r in b["requirements"])
            state = "exercised" if b["exercised"] else ("not applicable" if not b["applicable"] else "NEVER EXERCISED")
            color = "#1a7f37" if b["exercised"] else ("#57606a" if not b["applicable"] else "#cf222e")
            body.append(
                f"<tr><td><code>{e(cap['capability'])}</code></td><td>{e(b['behaviour'])}</td>"
                f"<td>{e(b['description'])}</td><td style='color:{color};font-weight:600'>{e(state)}</td>"
                f"<td>{e(reqs)}</td></tr>"
            )
    table = (
        "<table id='capability-ledger'><thead><tr><th>Capability</th><th>Behaviour</th><th>Promise</th>"
        f"<th>State</th><th>Exercised by (records)</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
        if body
        else "<p>The target advertises no capability with promised behaviours.</p>"
    )
    return (
        "<h2 id='capabilities'>Capability ledger</h2><p>For each capability the target advertises, the behaviours "
        "it promises and how many records of each requirement exercised them; an advertised capability with a "
        f"behaviour never exercised keeps the run from CONFORMANT.</p>{table}"
    )


def _coverage_section(results: dict[str, Any]) -> str:
    rows = results.get("coverage_matrix") or []
    if not rows:
        return ""
    e = html.escape
    parts = []
    for row in rows:
        cells = [(k, "reached", str(n), "#1a7f37") for k, n in row["reached"].items()]
        cells += [(k, "not reached", "", "#cf222e") for k in row["not_reached"]]
        cells += [(k, "ruled out", why, "#57606a") for k, why in row["ruled_out"].items() if k not in row["reached"]]
        cells += [
            (k, "not applicable here", why, "#57606a")
            for k, why in (row.get("not_applicable") or {}).items()
            if k not in row["reached"]
        ]
        body = "".join(
            f"<tr><td><code>{e(k)}</code></td><td style='color:{color};font-weight:600'>{e(state)}</td>"
            f"<td>{e(detail)}</td></tr>"
            for k, state, detail, color in cells
        )
        scope = "" if row["applicable"] else " (capability not advertised)"
        parts.append(
            f"<details><summary>{e(row['entity'])}{e(scope)}: {len(row['reached'])} reached, "
            f"{len(row['not_reached'])} not reached, {len(row['ruled_out'])} ruled out</summary>"
            f"<table><thead><tr><th>Cell (entity/state/operation/actor)</th><th>State</th><th>Hits, or why ruled "
            f"out</th></tr></thead><tbody>{body}</tbody></table></details>"
        )
    return (
        "<h2 id='coverage-matrix'>Coverage matrix</h2><p>For each entity with a lifecycle, every cell of state × "
        "operation or event × actor: how often the machines hit it, the cells the protocol rules out and why, and "
        f"the cells no machine reached.</p>{''.join(parts)}"
    )


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


def render_html(results: dict[str, Any], *, mutants: dict[str, Any] | None = None) -> str:
    """One self-contained page: badge and headline, the run, a legend, every failure with its evidence, what
    was not covered and how to cover it, the requirements by area, fuzz statistics and the machines' ledger;
    with ``mutants`` (a ``mutants.json`` document), a "Mutant kill matrix" section at the end."""
    e = html.escape
    verdict = results["summary"]["verdict"]
    t = results["target"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Conformance report — {e(t["description"])}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#1f2328}}
.badge{{display:inline-block;padding:.4rem 1rem;border-radius:6px;color:#fff;font-weight:700;
background:{_BADGE_COLORS.get(verdict, "#953800")}}}
table{{border-collapse:collapse;width:100%;font-size:.85rem;margin:.5rem 0}}td,th{{border:1px solid #d0d7de;
padding:4px;vertical-align:top;text-align:left}}pre{{background:#f6f8fa;padding:.5rem;overflow-x:auto;
white-space:pre-wrap}}code.id,td.section,td.verdict{{white-space:nowrap}}#run th{{width:14rem}}
.failure{{border-left:4px solid #cf222e;padding-left:1rem;margin:1rem 0}}
</style></head><body>
<h1>Durable Workflow worker protocol conformance</h1>
<p id="summary"><span class="badge" id="badge">{e(verdict)}</span></p>
<p id="headline"><b>{e(quote_line(results))}</b></p>
{_faults_line(results)}
{_run_section(results)}
{_legend()}
{_failures(results)}
{_not_covered(results)}
{_requirements(results)}
{_capability_section(results)}
{_coverage_section(results)}
{_fuzz_section(results)}
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
requirement · {s["survived"]} survived · {plural(s["errors"], "error")} · correct server
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
