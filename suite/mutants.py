"""``python -m suite.mutants``: the mutant kill matrix — proof that the suite catches each named bug.

The reference server ships named faults (``python -m reference_server --fault list``), each a deliberately
broken rule with the requirement IDs the suite must report against it. For every fault this command starts
the server with that fault, as its own process on a free port with the embedded target's short leases,
and runs the suite against it — only the checks of the fault's requirements, or with ``--full`` every plain
check — several mutants at a time (``--jobs``). The correct server runs the same way and must pass.

It writes ``<report-dir>/mutants.json`` and ``<report-dir>/mutants.html`` (each suite run's own reports
stay in ``<report-dir>/mutants/<fault>/``). Exit status 0 when every mutant is killed by a requirement it
is expected to break and the correct server passes; 1 otherwise, with each gap named; 2 on a usage error.

The suite never imports the reference server: faults are listed, and servers started, as subprocesses.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from .outcomes import Kind
from .processes import read_url, stop_process, stop_restarted, write_restart_spec
from .reports import render_mutants_page
from .settings import SEED_ENV
from .text import plural

__all__ = [
    "CORRECT",
    "FIRST_FAILURES_SCHEMA",
    "MATRIX_SCHEMA",
    "FirstFailures",
    "Matrix",
    "Mutant",
    "MutantResult",
    "gaps",
    "judge_run",
    "list_faults",
    "main",
    "run_first_failures",
    "run_matrix",
    "write_matrix",
]

R = TypeVar("R")
MATRIX_SCHEMA = "durable-workflow.mutant-matrix.v1"
CORRECT = "(correct server)"
# A requirement counts as reported when the suite says it is broken: a MUST (failed) or a SHOULD (non-strict).
_REPORTED = ("failed", "non-strict")


@dataclass(frozen=True)
class Mutant:
    """One named fault of the reference server, as ``--fault list`` prints it."""

    name: str
    description: str
    kills: tuple[str, ...]
    # The --faults spec under which the suite kills it: a bug only retried requests reveal. Such a mutant is
    # also run without the proxy, where it must survive (the plain suite never retries).
    proxy: str | None = None
    # The state machine that kills it (a bug only a multi-step history shows): its run includes that machine.
    machine: str | None = None
    # A bug too deep for a default run: its run is a campaign of that machine this long (--campaign).
    campaign: str | None = None


# The fault proxy's seed in the kill matrix: a fixed one, so a matrix run is reproducible.
PROXY_SEED = 1
# The suite's own seed in the kill matrix (DW_CONFORMANCE_SEED, unless set): fixed too, so that a machine or a
# campaign takes the same path each matrix run, and a deep fault is found by the same first failure.
SUITE_SEED = "1"


@dataclass
class MutantResult:
    """What the suite said about one server (a mutant, or the correct server)."""

    name: str
    description: str
    expected: list[str]
    # killed | survived | error (the run itself broke: neither killed nor survived); the correct server's
    # run is passed | failed | error instead.
    verdict: str
    failed: list[str] = field(default_factory=list)  # every requirement reported broken
    expected_caught: list[str] = field(default_factory=list)  # those of ``expected`` among ``failed``
    first_failure: dict[str, Any] | None = None  # check, requirement, requests and seconds until it
    checks_run: int = 0
    requests: int = 0
    wall_seconds: float = 0.0
    suite_seconds: float = 0.0  # the suite's own run (pytest started → exited), without the server's start
    exit_code: int | None = None
    report: str | None = None
    note: str = ""
    proxy: str | None = None  # the --faults spec of the run (None: no proxy)
    # A proxy-only mutant: what the suite said without the proxy (it must survive there).
    without_proxy: str | None = None

    @property
    def as_expected(self) -> bool:
        """Killed, and by every requirement the fault is declared to break."""
        return self.verdict == "killed" and bool(self.expected) and self.expected_caught == self.expected


@dataclass
class Matrix:
    mode: str  # targeted | full
    jobs: int
    started_at: str
    seconds: float
    correct: MutantResult
    mutants: list[MutantResult]
    # The correct server through the fault proxy, on the proxy-only mutants' requirements: it must pass too.
    correct_proxy: MutantResult | None = None

    def to_json(self) -> dict[str, Any]:
        killed = [m for m in self.mutants if m.verdict == "killed"]
        return {
            "schema": MATRIX_SCHEMA,
            "mode": self.mode,
            "jobs": self.jobs,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "summary": {
                "mutants": len(self.mutants),
                "killed": len(killed),
                "killed_as_expected": sum(m.as_expected for m in self.mutants),
                "survived": sum(m.verdict == "survived" for m in self.mutants),
                "errors": sum(m.verdict == "error" for m in self.mutants),
                "correct_server_passed": self.correct.verdict == "passed"
                and (self.correct_proxy is None or self.correct_proxy.verdict == "passed"),
                "proxy_only": sum(m.proxy is not None for m in self.mutants),
                "gaps": gaps(self),
            },
            "correct": _result_json(self.correct),
            "correct_proxy": _result_json(self.correct_proxy) if self.correct_proxy else None,
            "mutants": [_result_json(m) for m in self.mutants],
        }


def _result_json(result: MutantResult) -> dict[str, Any]:
    return {**asdict(result), "as_expected": result.as_expected}


def gaps(matrix: Matrix) -> list[str]:
    """Every reason the matrix is not a clean proof, one readable line each (empty when it is)."""
    out = []
    for correct in (matrix.correct, matrix.correct_proxy):
        if correct is not None and correct.verdict != "passed":
            out.append(
                f"the correct server fails {', '.join(correct.failed) or 'the run'}"
                + (f" through the fault proxy ({correct.proxy})" if correct.proxy else "")
                + f" ({correct.verdict}{': ' + correct.note if correct.note else ''}):"
                " a check is wrong, or the reference server is"
            )
    for m in matrix.mutants:
        if m.proxy is not None and m.without_proxy != "survived":
            out.append(
                f"{m.name} is declared to need the fault proxy ({m.proxy}), but without it the suite said "
                f"{m.without_proxy}: it is not a bug only retried requests reveal; drop its proxy spec"
            )
        if m.verdict == "error":
            out.append(f"{m.name}: the run broke ({m.note}); see {m.report or 'its output'}")
        elif m.verdict == "survived":
            out.append(
                f"{m.name} survived: no check reports {', '.join(m.expected)} broken although the server "
                f"{_lower_first(m.description)} Add or sharpen a check of {m.expected[0]}."
            )
        elif not m.as_expected:
            missing = [r for r in m.expected if r not in m.failed]
            out.append(
                f"{m.name} was killed by {', '.join(m.failed)}, but not by the expected {', '.join(missing)}: "
                "fix the fault's declared requirements or the check of the expected one."
            )
    return out


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# -- listing faults ---------------------------------------------------------------------------------------


def list_faults(python: str = sys.executable) -> list[Mutant]:
    """``python -m reference_server --fault list``: one ``name<TAB>description<TAB>kills`` line per fault."""
    proc = subprocess.run(
        [python, "-m", "reference_server", "--fault", "list"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -m reference_server --fault list failed ({proc.returncode}): {proc.stderr}")
    mutants = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) not in (3, 4, 5, 6) or not parts[2].strip():
            raise RuntimeError(
                f"--fault list printed {line!r}; expected name, description, requirement IDs, an optional "
                "--faults spec, an optional state machine and an optional campaign duration, tab-separated"
            )
        name, description, kills = parts[:3]
        proxy = parts[3].strip() if len(parts) >= 4 and parts[3].strip() else None
        machine = parts[4].strip() if len(parts) >= 5 and parts[4].strip() else None
        campaign = parts[5].strip() if len(parts) == 6 and parts[5].strip() else None
        mutants.append(Mutant(name, description, tuple(k for k in kills.split(",") if k), proxy, machine, campaign))
    return mutants


# -- one run ----------------------------------------------------------------------------------------------


@dataclass
class _Server:
    proc: subprocess.Popen[str]
    url: str
    # Kills it hard and starts it again on the same port and database (the suite's --restart-command).
    restart_command: str = ""
    spec: Path | None = None

    def stop(self) -> None:
        stop_process(self.proc)
        if self.spec is not None:
            stop_restarted(self.spec, unless=self.proc.pid)


def _start_server(python: str, workdir: Path, args: Sequence[str], env: dict[str, str]) -> _Server:
    cmd = [python, "-m", "reference_server", "--port", "0", "--db", str(workdir / "dw.sqlite"), *args]
    with open(workdir / "server.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    url = read_url(proc, 30)
    if url is not None:
        again = [*cmd[:4], url.rsplit(":", 1)[1].split("/")[0], *cmd[5:]]
        spec = workdir / "restart.json"
        restart = write_restart_spec(spec, command=again, url=url, pid=proc.pid, log=str(workdir / "server.log"))
        return _Server(proc, url, restart, spec)
    _Server(proc, "").stop()
    tail = (workdir / "server.log").read_text(encoding="utf-8", errors="replace")[-1500:]
    raise RuntimeError(f"the reference server did not start: {' '.join(cmd)}\n{tail}")


@functools.cache
def server_args(python: str) -> tuple[str, ...]:
    """The embedded target's server options of the suite installed for ``python`` (its own version's)."""
    proc = subprocess.run(
        [python, "-c", "import json; from suite.target import EMBEDDED_ARGS; print(json.dumps(EMBEDDED_ARGS))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{python} has no suite.target.EMBEDDED_ARGS: {proc.stderr.strip()[-300:]}")
    return tuple(json.loads(proc.stdout))


def _run(
    mutant: Mutant | None,
    requirements: Sequence[str],
    report_dir: Path,
    *,
    python: str,
    timeout: float,
    proxy: str | None = None,
    machines: Sequence[str] = (),
    selection: Sequence[str] | None = None,
    folder: str = "mutants",
) -> MutantResult:
    """Start one server (with ``mutant``'s fault, or none), run the suite against it (through the fault
    proxy with ``proxy``'s spec, when given), judge the results. ``selection`` are the pytest options that choose
    the items (default: the plain checks and ``machines``; ``("-x",)``: every item, stopping at the first
    failure)."""
    name = mutant.name if mutant else CORRECT
    result = MutantResult(
        name=name,
        description=mutant.description if mutant else "The reference server with no fault: it must pass.",
        expected=list(mutant.kills) if mutant else [],
        verdict="error",
        proxy=proxy,
    )
    workdir = report_dir / folder / (f"{_folder_of(mutant)}+proxy" if proxy else _folder_of(mutant))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    env = _token_env()
    started = time.monotonic()
    fault_args = ["--fault", mutant.name] if mutant else []
    try:
        server = _start_server(python, workdir, [*server_args(python), *fault_args], env)
    except RuntimeError as exc:
        result.note = str(exc).splitlines()[0]
        result.wall_seconds = round(time.monotonic() - started, 2)
        return result
    try:
        cmd = [
            python,
            "-m",
            "pytest",
            f"--target={server.url}",
            f"--report-dir={workdir / 'reports'}",
            f"--restart-command={server.restart_command}",
            *_suite_options(requirements, proxy=proxy, machines=machines, selection=selection),
            *(["--campaign", mutant.campaign] if mutant is not None and mutant.campaign else []),
        ]
        suite_started = time.monotonic()
        try:
            # From the work directory, as a user would: no project configuration applies to the run.
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir, env=env)
        except subprocess.TimeoutExpired:
            result.note = f"the suite did not finish within {timeout:g} s"
            return result
        finally:
            result.suite_seconds = round(time.monotonic() - suite_started, 2)
    finally:
        server.stop()
        result.wall_seconds = round(time.monotonic() - started, 2)
    (workdir / "pytest.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    result.exit_code = proc.returncode
    found = sorted((workdir / "reports").glob("*/results.json"))
    if not found:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        result.note = f"no results.json (pytest exit {proc.returncode}: {tail[0][:300]})"
        return result
    result.report = str(found[-1].parent / "report.html")
    judge_run(result, json.loads(found[-1].read_text(encoding="utf-8")))
    return result


def _token_env() -> dict[str, str]:
    """The environment of a server and its suite run: role tokens and a full-access token, as for
    --target=embedded, so the auth requirements are covered; pytest's own variables left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.setdefault(SEED_ENV, SUITE_SEED)
    env.update(
        DW_WORKER_TOKEN=secrets.token_urlsafe(18),
        DW_OPERATOR_TOKEN=secrets.token_urlsafe(18),
        DW_ADMIN_TOKEN=secrets.token_urlsafe(18),
        DW_AUTH_TOKEN=secrets.token_urlsafe(18),  # the full-access token beside them (AUTH-FULL-ACCESS-TOKEN)
    )
    return env


def _suite_options(
    requirements: Sequence[str],
    *,
    proxy: str | None,
    machines: Sequence[str],
    selection: Sequence[str] | None,
) -> list[str]:
    """The pytest options of one suite run after its target and report folder."""
    return [
        "-p",
        "no:cacheprovider",
        "-q",
        *(_selection(machines) if selection is None else selection),
        *[a for r in requirements for a in ("--requirement", r)],
        *(["--faults", proxy, "--fault-seed", str(PROXY_SEED)] if proxy else []),
        # A machine's kill is what counts here, not its minimal program (shrinking replays it for minutes).
        *(["--no-machine-shrink"] if machines else []),
    ]


def _selection(machines: Sequence[str]) -> list[str]:
    """The pytest selection of a run: the plain checks, and the state machines that kill a history fault (by
    marker, then by name: ``-k`` matches a check by its marker, a machine by its item name)."""
    if not machines:
        return ["-m", "dw_check"]
    return ["-m", "dw_check or dw_machine", "-k", " or ".join(["dw_check", *sorted(set(machines))])]


def _folder_of(mutant: Mutant | None) -> str:
    """The work directory of one server's run: the fault's name, or ``correct``."""
    return mutant.name if mutant else "correct"


def judge_run(result: MutantResult, results: dict[str, Any]) -> None:
    """What one suite run (its results.json) says of a server: the requirements reported broken, the expected
    ones among them, the first failing record and the cost of reaching it; killed, survived or error."""
    reqs = results["requirements"]
    result.failed = sorted(r["id"] for r in reqs if r["verdict"] in _REPORTED)
    result.expected_caught = [r for r in result.expected if r in result.failed]
    errors = sorted(r["id"] for r in reqs if r["verdict"] == "error")
    checks = results.get("checks", [])
    result.checks_run = len(checks)
    result.requests = sum(int(c.get("requests") or 0) for c in checks)
    # Items run one after another: the cost of detection is everything up to the first failing record. A machine
    # writes one record per requirement, each carrying the whole machine's duration: it is counted once.
    requests = 0
    seconds = 0.0
    counted: set[str] = set()
    for c in checks:
        requests += int(c.get("requests") or 0)
        item = str(c.get("test_id") or c.get("check"))
        if item not in counted:
            counted.add(item)
            seconds += float(c.get("duration_seconds") or 0.0)
        if c.get("verdict") in _REPORTED:
            result.first_failure = {
                "check": c.get("check"),
                "requirement": c.get("failed_requirement"),
                "requests": requests,
                "seconds": round(seconds, 3),
            }
            break
    time_plan = (results.get("target") or {}).get("time") or {}
    if result.first_failure is not None and time_plan.get("test_clock_used") is False:
        # Waiting in real time the items overlap (suite.overlap): their durations add up to more than the time
        # that passed. Under -x the run ends at its first failure, so its span is the time until it.
        span = _seconds_between(results.get("started_at"), results.get("finished_at"))
        if span is not None:
            result.first_failure["seconds"] = span
    if result.failed:
        result.verdict = "killed"
    elif errors or result.exit_code not in (0, 1):
        result.verdict = "error"
        result.note = f"harness errors on {', '.join(errors) or 'the run'} (pytest exit {result.exit_code})"
    else:
        result.verdict = "survived"


def _seconds_between(start: object, end: object) -> float | None:
    """The seconds from one ISO 8601 time of a results.json to another; None when either is missing."""
    if not isinstance(start, str) or not isinstance(end, str):
        return None
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 3)


# -- the matrix -------------------------------------------------------------------------------------------


def run_matrix(
    *,
    jobs: int = 2,
    full: bool = False,
    report_dir: Path = Path("reports"),
    only: Sequence[str] = (),
    python: str = sys.executable,
    timeout: float = 900.0,
    progress: Callable[[MutantResult], None] | None = None,
) -> Matrix:
    """Run the suite against every fault (or those in ``only``) and the correct server, ``jobs`` at a time.

    Targeted mode runs each mutant's own requirements and the correct server on their union; ``full`` runs
    every plain check against every server.
    """
    mutants = _selected(list_faults(python), only)
    union = sorted({r for m in mutants for r in m.kills})
    report_dir = Path(report_dir).resolve()
    started_at = datetime.now(UTC).isoformat()
    started = time.monotonic()

    proxied = [m for m in mutants if m.proxy]
    # One spec for the correct server's run through the proxy: every proxy-only mutant's faults at once.
    proxy_union = ",".join(sorted({item for m in proxied for item in str(m.proxy).split(",")})) or None
    proxy_reqs = sorted({r for m in proxied for r in m.kills})

    # The correct server also runs every machine some mutant needs: they must pass against it too.
    machines = sorted({m.machine for m in mutants if m.machine})

    def one(m: Mutant | None, proxy: str | None = None) -> MutantResult:
        reqs: Sequence[str] = () if full else (m.kills if m else proxy_reqs if proxy else union)
        needed = ([m.machine] if m.machine else []) if m else ([] if proxy else machines)
        result = _run(m, reqs, report_dir, python=python, timeout=timeout, proxy=proxy, machines=needed)
        if progress is not None:
            progress(result)
        return result

    def one_plain(m: Mutant) -> MutantResult:
        """A proxy-only mutant without the proxy: the plain suite must not catch it."""
        result = _run(m, m.kills, report_dir, python=python, timeout=timeout)
        result.note = f"without the fault proxy (must survive): {result.verdict}"
        if progress is not None:
            progress(result)
        return result

    # The correct server first in the queue: it is the longest targeted run.
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, m, m.proxy if m else None) for m in (None, *mutants)]
        plain = {m.name: pool.submit(one_plain, m) for m in proxied}
        correct_proxy = pool.submit(one, None, proxy_union) if proxy_union else None
        results = [f.result() for f in futures]
        for result in results[1:]:
            if result.name in plain:
                result.without_proxy = plain[result.name].result().verdict
        correct_through_proxy = correct_proxy.result() if correct_proxy else None
    # The correct server passes where a mutant would survive: nothing is reported broken.
    for correct in (results[0], correct_through_proxy):
        if correct is not None:
            correct.verdict = {"survived": "passed", "killed": "failed"}.get(correct.verdict, correct.verdict)
    return Matrix(
        mode="full" if full else "targeted",
        jobs=jobs,
        started_at=started_at,
        seconds=time.monotonic() - started,
        correct=results[0],
        mutants=results[1:],
        correct_proxy=correct_through_proxy,
    )


# -- first failures ---------------------------------------------------------------------------------------


@dataclass
class FirstFailures:
    """How soon a run stops on a server broken in one rule: ``pytest -x`` of the whole suite, in its default
    (failures-first) order, against every fault (with its ``--faults`` spec for a proxy-only one)."""

    started_at: str
    seconds: float
    jobs: int
    python: str
    runs: list[MutantResult]

    def to_json(self) -> dict[str, Any]:
        caught = [r for r in self.runs if r.first_failure is not None]
        in_suite = [float(r.first_failure["seconds"]) for r in caught if r.first_failure]
        wall = [r.suite_seconds for r in caught]
        return {
            "schema": FIRST_FAILURES_SCHEMA,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "jobs": self.jobs,
            "python": self.python,
            "summary": {
                "mutants": len(self.runs),
                "stopped_at_a_failure": len(caught),
                # The whole suite passed against these: a fault no item notices.
                "not_caught": sorted(r.name for r in self.runs if r.first_failure is None and r.verdict != "error"),
                # These runs stopped at a harness error before any failure: no verdict on how soon one comes.
                "no_verdict": sorted(r.name for r in self.runs if r.first_failure is None and r.verdict == "error"),
                # Until the failing item's verdict: with a test clock the items run before it and its own
                # duration, as recorded; waiting in real time (items overlap) the run's span, which -x ends there.
                "first_failure_seconds": _spread(in_suite),
                # The whole `pytest -x` process: start-up, target probe, the items, the reports.
                "run_seconds": _spread(wall),
            },
            "runs": [
                {
                    "name": r.name,
                    "expected": r.expected,
                    "proxy": r.proxy,
                    "first_failure": r.first_failure,
                    "run_seconds": r.suite_seconds,
                    "exit_code": r.exit_code,
                    "note": r.note,
                }
                for r in self.runs
            ],
        }


FIRST_FAILURES_SCHEMA = "durable-workflow.first-failures.v1"


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "worst": None}
    return {"median": round(statistics.median(values), 2), "worst": round(max(values), 2)}


def run_first_failures(
    *,
    jobs: int = 1,
    report_dir: Path = Path("reports"),
    only: Sequence[str] = (),
    python: str = sys.executable,
    timeout: float = 900.0,
    progress: Callable[[MutantResult], None] | None = None,
    real_time: bool = False,
    time_driven: bool = False,
) -> FirstFailures:
    """``pytest -x`` of the whole suite against every fault (or those in ``only``), ``jobs`` at a time.

    ``python`` chooses the installation, suite and reference server alike: another checkout's interpreter
    measures that version the same way (its own faults, embedded server options and order). ``real_time``: the
    runs wait in real time (``--real-time``), as against a server without a test clock; ``time_driven``: only the
    faults :func:`time_driven_faults` names.
    """
    mutants = _selected(list_faults(python), only)
    if time_driven:
        driven = time_driven_faults({m.name: m.kills for m in mutants})
        mutants = [m for m in mutants if m.name in driven]
    report_dir = Path(report_dir).resolve()
    started_at = datetime.now(UTC).isoformat()
    started = time.monotonic()

    def one(m: Mutant) -> MutantResult:
        result = _run(
            m,
            (),
            report_dir,
            python=python,
            timeout=timeout,
            proxy=m.proxy,
            selection=("-x", "--real-time") if real_time else ("-x",),
            folder="first-failures",
        )
        if progress is not None:
            progress(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(one, mutants))
    return FirstFailures(started_at, time.monotonic() - started, jobs, python, runs)


# A check waits on the target's time when it takes at least this much longer in real time than with the test
# clock (suite/costs.json): it waits for a lease, a timer, a timeout or a long poll's hold.
WAITS_SECONDS = 1.0


def time_driven_faults(kills: Mapping[str, Sequence[str]]) -> list[str]:
    """The faults (name → the requirements that kill it) at least one of whose requirements is judged by a check
    that waits on the target's time: the faults whose first failure a run without a test clock waits for."""
    from .ordering import costs
    from .registry import entries

    real, clocked = costs()["real-time"], costs()["test-clock"]
    waiting = {
        requirement
        for entry in entries()
        if entry.kind is Kind.CHECK and real.get(entry.test_id, 0.0) - clocked.get(entry.test_id, 0.0) >= WAITS_SECONDS
        for requirement in entry.requirements
    }
    return sorted(name for name, reqs in kills.items() if waiting & set(reqs))


def _selected(mutants: list[Mutant], only: Sequence[str]) -> list[Mutant]:
    if not only:
        return mutants
    unknown = sorted(set(only) - {m.name for m in mutants})
    if unknown:
        raise ValueError(f"unknown faults {unknown}; python -m reference_server --fault list prints the names")
    return [m for m in mutants if m.name in set(only)]


def write_matrix(matrix: Matrix, report_dir: Path) -> tuple[Path, Path]:
    """``mutants.json`` and ``mutants.html`` in ``report_dir``; a later report.html there shows the matrix."""
    report_dir.mkdir(parents=True, exist_ok=True)
    doc = matrix.to_json()
    json_path = report_dir / "mutants.json"
    html_path = report_dir / "mutants.html"
    json_path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    html_path.write_text(render_mutants_page(doc), encoding="utf-8")
    return json_path, html_path


def _line(r: MutantResult) -> str:
    first = r.first_failure or {}
    cost = f"{first.get('requests', '-')} req, {first.get('seconds', '-')} s" if first else "-"
    mark = {"killed": "killed  ", "survived": "SURVIVED", "error": "ERROR   "}[r.verdict]
    if r.name == CORRECT:  # reported before run_matrix renames its verdict
        mark = "passed  " if r.verdict == "survived" else "FAILED  "
    by = ", ".join(r.failed) if r.failed else r.note
    via = f" [through the proxy: {r.proxy}]" if r.proxy else ""
    return f"  {mark} {r.name:<32} {cost:<18} {by}{via}"[:240]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m suite.mutants",
        description="Run the conformance suite against every named fault of the reference server (and the "
        "correct server) and write the kill matrix: reports/mutants.json and reports/mutants.html.",
    )
    p.add_argument("--jobs", type=int, default=2, help="Servers tested at the same time (default 2).")
    p.add_argument(
        "--full",
        action="store_true",
        help="Run every plain check against each server, not only the checks of the fault's requirements.",
    )
    p.add_argument("--report-dir", default="reports", help="Where mutants.json and mutants.html go (default reports).")
    p.add_argument("--fault", action="append", default=[], metavar="NAME", help="Only this fault (repeatable).")
    p.add_argument("--timeout", type=float, default=900.0, help="Longest one suite run may take, in s (default 900).")
    p.add_argument(
        "--first-failure",
        action="store_true",
        help="Instead of the matrix: run the whole suite with -x against every fault and report how soon it stops "
        "(median and worst seconds until the first failure) in first-failures.json.",
    )
    p.add_argument(
        "--real-time",
        action="store_true",
        help="With --first-failure: the runs wait in real time (pytest --real-time), as against a server without a "
        "test clock.",
    )
    p.add_argument(
        "--time-driven",
        action="store_true",
        help="With --first-failure: only the faults one of whose requirements is judged by a check that waits on "
        "the target's time (1 s or more longer in real time than with the test clock, by suite/costs.json).",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="The interpreter whose suite and reference server are measured (default this one), e.g. another "
        "checkout's virtualenv, to compare versions side by side.",
    )
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    report_dir = Path(args.report_dir)

    def progress(r: MutantResult) -> None:
        print(_line(r), flush=True)

    common: dict[str, Any] = {
        "jobs": args.jobs,
        "report_dir": report_dir,
        "only": args.fault,
        "python": args.python,
        "timeout": args.timeout,
        "progress": progress,
    }
    if args.first_failure:
        return _first_failure_main({**common, "real_time": args.real_time, "time_driven": args.time_driven})
    if args.real_time or args.time_driven:
        p.error("--real-time and --time-driven go with --first-failure")
    matrix = _or_usage_error(lambda: run_matrix(full=args.full, **common))
    if matrix is None:
        return 2
    json_path, html_path = write_matrix(matrix, report_dir)
    doc = matrix.to_json()
    s = doc["summary"]
    return _summed_up(
        f"\n{s['killed']}/{s['mutants']} mutants killed ({s['killed_as_expected']} by the expected requirement), "
        f"{s['survived']} survived, {plural(s['errors'], 'error')}; correct server "
        f"{'passed' if s['correct_server_passed'] else 'FAILED'}; {doc['seconds']:.0f} s with --jobs {matrix.jobs}",
        f"matrix: {html_path}, {json_path}",
        [f"GAP: {gap}" for gap in s["gaps"]],
    )


def _summed_up(headline: str, written: str, problems: Sequence[str]) -> int:
    """How either mode ends: the ``headline`` and where its report was ``written`` on stdout, each problem on
    stderr, and the exit status, 1 when there is any problem (a gap of the matrix, a fault nothing caught)."""
    print(headline)
    print(written)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def _or_usage_error(run: Callable[[], R]) -> R | None:
    """``run()``, or None after printing why it could not start (an unknown fault, a server that does not)."""
    try:
        return run()
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _first_failure_main(common: dict[str, Any]) -> int:
    found = _or_usage_error(lambda: run_first_failures(**common))
    if found is None:
        return 2
    report_dir = Path(common["report_dir"])
    doc = found.to_json()
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / "first-failures.json"
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    s = doc["summary"]
    first, run = s["first_failure_seconds"], s["run_seconds"]
    notes = {r.name: r.note for r in found.runs}
    return _summed_up(
        f"\npytest -x against {s['mutants']} faults: {s['stopped_at_a_failure']} stopped at a failure; first failure "
        f"after {first['median']} s median, {first['worst']} s worst (whole run: {run['median']} s median, "
        f"{run['worst']} s worst) with --jobs {found.jobs}",
        f"first failures: {path}",
        [
            *(f"NOT CAUGHT: {name}: the whole suite passed against it" for name in s["not_caught"]),
            *(
                f"NO VERDICT: {name}: the run stopped at a harness error before a failure ({notes[name]})"
                for name in s["no_verdict"]
            ),
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
