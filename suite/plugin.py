"""The pytest plugin: ``pytest --target=URL`` runs the conformance suite against a server.

Registered through the ``pytest11`` entry point, so it is active wherever the package is installed.
Without ``--target`` it only adds its options: the project's own tests and any other pytest run are
unaffected. With ``--target`` it replaces the collected paths by the suite's own check module (so it
runs from any directory, with no checkout), resolves the target once (starting the embedded reference
server when asked), hands the target to xdist workers, turns each check's outcome into a verdict, and
writes the reports.

Exit status: 0 when no MUST is broken (and no SHOULD under ``--strict``); 1 when one is; 10 on a
harness error (target unreachable, network timeouts) — never a conformance failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from suite.protocol.requirements import REGISTRY, Level, applicable

from .client import ProtocolClient
from .context import CheckContext, TargetInfo
from .outcomes import CheckFailure, HarnessError, Indeterminate, NotCovered, Unimplemented, Verdict
from .registry import Check

__all__ = ["EXIT_HARNESS_ERROR", "run_check", "run_fuzz_item", "run_machine_item"]

EXIT_HARNESS_ERROR = 10
RESULT_KEY = "dw_result"
_TARGET_KEY = pytest.StashKey[TargetInfo]()
_RESULTS_KEY = pytest.StashKey[list[dict[str, Any]]]()
_EMBEDDED_KEY = pytest.StashKey[Any]()
_PROXY_KEY = pytest.StashKey[Any]()
_RUN_KEY = pytest.StashKey[dict[str, Any]]()
# Under --faults a check whose request met a fault that left its outcome unknown runs again in a fresh world:
# at most FAULT_ATTEMPTS times in all, and after the first few only while its attempts have taken less than
# FAULT_RERUN_SECONDS (a check of many requests rarely runs clean; a slow one must not run for ever). Then it
# is a harness error, never the target's failure.
FAULT_ATTEMPTS = 40
FAULT_RERUN_SECONDS = 180.0
_FAULT_ATTEMPTS_ALWAYS = 4


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "Durable Workflow worker protocol conformance")
    group.addoption(
        "--target",
        default=None,
        metavar="URL|embedded",
        help="Run the conformance suite against this server URL, or 'embedded' to start the reference server",
    )
    group.addoption(
        "--worker-token",
        default=os.environ.get("DW_WORKER_TOKEN"),
        help="Bearer token of the worker role (env DW_WORKER_TOKEN)",
    )
    group.addoption(
        "--operator-token",
        default=os.environ.get("DW_OPERATOR_TOKEN"),
        help="Bearer token of the operator role (env DW_OPERATOR_TOKEN)",
    )
    group.addoption(
        "--auth-token",
        default=os.environ.get("DW_AUTH_TOKEN"),
        help="Full-access bearer token (env DW_AUTH_TOKEN), one token for both planes (PROTOCOL.md §4.1); "
        "used for both planes when no role tokens are given",
    )
    group.addoption("--namespace", default="default", help="Namespace the checks run in (default 'default')")
    group.addoption(
        "--protocol-version",
        default="1.20",
        help="Certify at this 1.x minor: requirements introduced later are not applicable",
    )
    group.addoption("--report-dir", default="reports", help="Where reports/<run-id>/ is written (default reports)")
    group.addoption(
        "--max-wait",
        type=float,
        default=30.0,
        help="Longest the suite may wait for a lease expiry or timer, in seconds (default 30)",
    )
    # --strict is pytest's own flag (strict mode); with --target it also makes SHOULD violations fail the run.
    group.addoption("--machine-examples", type=int, default=8, help="Random sequences per state machine (default 8)")
    group.addoption("--machine-steps", type=int, default=40, help="Steps per sequence of a state machine (default 40)")
    group.addoption(
        "--no-machine-shrink",
        action="store_true",
        default=False,
        help="Report a state machine's first failing sequence without shrinking it (faster, longer replay)",
    )
    group.addoption(
        "--fuzz-examples",
        type=int,
        default=20,
        metavar="N",
        help="Random Schemathesis cases per OpenAPI operation, plus up to 5×N coverage-phase cases "
        "(default 20; 0 disables the fuzz items)",
    )
    group.addoption(
        "--requirement",
        action="append",
        default=[],
        metavar="ID",
        help="Run only the checks of these requirement IDs (repeatable)",
    )
    group.addoption(
        "--faults",
        default=None,
        metavar="SPEC",
        help="Talk to the target through a seeded fault-injecting proxy, e.g. drop_response=0.05,delay=0.1, or "
        "'standard' (every fault; 'none': transparent; the faults: python -m suite.proxy --help)",
    )
    group.addoption("--fault-seed", type=int, default=None, help="Seed of the fault proxy (default: the run's seed)")


def _enabled(config: pytest.Config) -> bool:
    return config.getoption("--target", default=None) is not None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _enabled(config):
        return
    config.addinivalue_line("markers", "conformance_slow: a check that waits for leases or timers")
    version = str(config.getoption("--protocol-version"))
    if not _valid_minor(version):
        raise pytest.UsageError(f"--protocol-version={version}: use 1.0 … 1.20")
    unknown = [r for r in config.getoption("--requirement") if r not in REGISTRY]
    if unknown:
        raise pytest.UsageError(f"--requirement: unknown IDs {unknown}; see suite.protocol.requirements")
    if config.getoption("--faults") is not None:
        from .proxy import parse_faults

        try:
            parse_faults(str(config.getoption("--faults")))
        except ValueError as exc:
            raise pytest.UsageError(f"--faults: {exc}") from None
    # Collect the suite's own checks, wherever pytest was started.
    checks = Path(__file__).parent / "checks"
    config.args[:] = [str(checks / n) for n in ("test_conformance.py", "test_machines.py", "test_fuzz.py")]
    config.stash[_RESULTS_KEY] = []
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller resolved the target already
        config.stash[_TARGET_KEY] = TargetInfo(**json.loads(workerinput["dw_target"]))
        config.stash[_RUN_KEY] = json.loads(workerinput["dw_run"])
        if config.getoption("--faults") is not None:
            index = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
            try:
                _attach_proxy(config, config.stash[_TARGET_KEY], index)
            except HarnessError as exc:
                pytest.exit(f"harness error: {exc}", returncode=EXIT_HARNESS_ERROR)
        return
    config.stash[_RUN_KEY] = {
        "run_id": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3),
        "started_at": datetime.now(UTC).isoformat(),
        "seed": int(os.environ.get("DW_CONFORMANCE_SEED", secrets.randbelow(2**32))),
    }
    try:
        config.stash[_TARGET_KEY] = _resolve_target(config)
        # Under xdist the workers run the checks, each behind its own proxy; otherwise this process does.
        if config.getoption("--faults") is not None and getattr(config.option, "dist", "no") == "no":
            _attach_proxy(config, config.stash[_TARGET_KEY], 0)
    except HarnessError as exc:
        _stop_proxy(config)
        _stop_embedded(config)
        # One line, a distinct exit code, no traceback: the target could not be reached at all.
        pytest.exit(f"harness error: {exc}", returncode=EXIT_HARNESS_ERROR)


def _valid_minor(version: str) -> bool:
    major, _, minor = version.partition(".")
    return major == "1" and minor.isdigit() and 0 <= int(minor) <= 20 and str(int(minor)) == minor


def _resolve_target(config: pytest.Config) -> TargetInfo:
    from .target import EmbeddedServer, measure_clock_skew, probe_cluster_info

    target = str(config.getoption("--target"))
    embedded = target == "embedded"
    if embedded:
        server = EmbeddedServer()
        config.stash[_EMBEDDED_KEY] = server
        url = server.start()
    else:
        if not target.startswith(("http://", "https://")):
            raise HarnessError(f"--target={target}: give an http(s) URL or 'embedded'")
        url = target.rstrip("/")
    worker_token = config.getoption("--worker-token") or None
    operator_token = config.getoption("--operator-token") or None
    full_token = config.getoption("--auth-token") or None
    if embedded and not (worker_token or operator_token or full_token):
        worker_token, operator_token = server.worker_token, server.operator_token
        full_token = server.full_token
    if full_token and not (worker_token or operator_token):
        worker_token = operator_token = full_token  # one token for both planes
    info = probe_cluster_info(url, operator_token or worker_token)
    return TargetInfo(
        url=url,
        cluster_info=info,
        worker_token=worker_token,
        operator_token=operator_token,
        full_token=full_token,
        namespace=str(config.getoption("--namespace")).lower(),
        protocol_version=str(config.getoption("--protocol-version")),
        max_wait=float(config.getoption("--max-wait")),
        strict=bool(config.getoption("strict", default=False)),
        embedded=embedded,
        clock_skew_seconds=measure_clock_skew(url),
    )


def pytest_configure_node(node: Any) -> None:
    """xdist: every worker gets the controller's target, so one embedded server serves them all."""
    target = node.config.stash.get(_TARGET_KEY, None)
    if target is not None:
        node.workerinput["dw_target"] = json.dumps(target.shareable())
        node.workerinput["dw_run"] = json.dumps(node.config.stash[_RUN_KEY])


def _attach_proxy(config: pytest.Config, target: TargetInfo, index: int) -> None:
    """``--faults``: this process's checks talk to a fault proxy in front of the target, on its own thread and
    event loop, and read what it did to their requests (``target.fault_ledger``). Worker ``index`` draws
    from seed + index, so a run is reproducible worker by worker."""
    from .proxy import ProxyThread

    seed = config.getoption("--fault-seed")
    seed = int(seed if seed is not None else config.stash[_RUN_KEY]["seed"]) + index
    url = target.url
    try:
        proxy = ProxyThread(url, str(config.getoption("--faults")), seed=seed)
        config.stash[_PROXY_KEY] = proxy
        target.url = proxy.start()
    except (ValueError, OSError, RuntimeError) as exc:
        raise HarnessError(f"--faults: the fault proxy in front of {url} did not start: {exc}") from None
    target.upstream_url = url
    target.fault_ledger = proxy.proxy


def _stop_proxy(config: pytest.Config) -> None:
    thread = config.stash.get(_PROXY_KEY, None)
    if thread is not None:
        thread.stop()
        counts = ", ".join(f"{name}={n}" for name, n in thread.proxy.counts.items())
        sys.stderr.write(f"fault proxy (seed {thread.proxy.seed}): {counts}\n")


def _stop_embedded(config: pytest.Config) -> None:
    server = config.stash.get(_EMBEDDED_KEY, None)
    if server is not None:
        server.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _enabled(config):
        _stop_proxy(config)
        _stop_embedded(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _enabled(config):
        return
    wanted = set(config.getoption("--requirement"))
    if not wanted:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        if isinstance(params.get("check"), Check):
            reqs = set(params["check"].requirements)
        else:
            reqs = set(getattr(params.get("machine"), "REQUIREMENTS", {}))
        (keep if wanted & reqs else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# -- the fixture and the runner --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dw_target(pytestconfig: pytest.Config) -> TargetInfo:
    target = pytestconfig.stash.get(_TARGET_KEY, None)
    if target is None:
        pytest.skip("the conformance suite runs only with --target=URL or --target=embedded")
    return target


def run_check(check: Check, target: TargetInfo, item: pytest.Item) -> None:
    """Run one check and turn its outcome into a verdict (recorded on the item for the reports)."""
    record: dict[str, Any] = {
        "check": check.name,
        "requirements": list(check.requirements),
        "doc": check.doc,
        "capability": check.capability,
    }
    relevant = [r for r in check.requirements if applicable(REGISTRY[r], target.certified_minor)]
    if not relevant:
        record.update(
            verdict=Verdict.NOT_COVERED.value,
            message=f"not applicable when certifying protocol {target.protocol_version}",
        )
        _record(item, record)
        pytest.skip(record["message"])
    advertised = check.capability is None or bool(target.server_capabilities.get(check.capability))
    started = time.monotonic()
    attempts = FAULT_ATTEMPTS if target.fault_ledger is not None else 1
    unknown: list[str] = []
    for n in range(attempts):
        if n >= _FAULT_ATTEMPTS_ALWAYS and time.monotonic() - started > FAULT_RERUN_SECONDS:
            break
        ctx, outcome = _attempt(check, target)
        if not isinstance(outcome, Indeterminate):
            break
        unknown.append(str(outcome))  # a fresh world (new queues and ids) for the next attempt
    if unknown:
        record["fault_reruns"] = len(unknown) - (1 if isinstance(outcome, Indeterminate) else 0)
        record["indeterminate"] = unknown[:5]
        if isinstance(outcome, Indeterminate):
            outcome = Indeterminate(f"{len(unknown)} attempts in a row met a fault; the last: {unknown[-1]}")
    record["duration_seconds"] = round(time.monotonic() - started, 3)
    record["requests"] = len(ctx.exchanges)
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
    verdict, message, exchanges, failed_req = _judge(check, outcome, advertised, target)
    record.update(
        verdict=verdict.value,
        message=message,
        failed_requirement=failed_req,
        exchanges=[e.to_json() for e in exchanges],
    )
    _record(item, record)
    if verdict is Verdict.FAILED or (verdict is Verdict.NON_STRICT and target.strict):
        pytest.fail(f"[{failed_req}] {message}", pytrace=False)
    if verdict is Verdict.ERROR:
        pytest.fail(f"harness error (not a conformance failure): {message}", pytrace=False)
    if verdict in (Verdict.NOT_COVERED, Verdict.UNIMPLEMENTED):
        pytest.skip(f"{verdict.value}: {message}")


def _attempt(check: Check, target: TargetInfo) -> tuple[CheckContext, BaseException | None]:
    """One run of a check in its own world; its outcome (``None``: it passed)."""
    client = ProtocolClient(
        target.url,
        worker_token=target.worker_token,
        operator_token=target.operator_token,
        namespace=target.namespace,
        worker_version=target.protocol_version,
        validator=_validator(),
        faults=target.fault_ledger,
    )
    ctx = CheckContext(target=target, client=client, check_name=check.name)

    async def go() -> None:
        try:
            await check.fn(ctx)
        finally:
            await client.aclose()

    try:
        asyncio.run(go())
    except BaseException as exc:
        return ctx, exc
    return ctx, None


def run_machine_item(machine: Any, target: TargetInfo, item: pytest.Item) -> None:
    """Run one state machine with the session's budget and seed; one verdict record per requirement."""
    from .machines.runner import MachineBudget, run_machine

    config = item.config
    run = config.stash[_RUN_KEY]
    budget = MachineBudget(
        examples=int(config.getoption("--machine-examples")),
        steps=int(config.getoption("--machine-steps")),
        shrink=not config.getoption("--no-machine-shrink"),
        seed=int(run["seed"]),
    )
    replay_dir = Path(str(config.getoption("--report-dir"))) / run["run_id"] / "replay"
    result = run_machine(machine, target, budget, replay_dir)
    for record in result.records:
        _record(item, record)
    verdicts = {Verdict(r["verdict"]) for r in result.records}
    if Verdict.FAILED in verdicts or (Verdict.NON_STRICT in verdicts and target.strict):
        where = f"\nreplay bundle: {result.bundle}" if result.bundle else ""
        pytest.fail(f"[machine {machine.name}] {result.message}{where}\nseed: {budget.seed}", pytrace=False)
    if Verdict.ERROR in verdicts:
        pytest.fail(
            f"harness error in machine {machine.name} (not a conformance failure): {result.message}", pytrace=False
        )


def run_fuzz_item(check: Check, target: TargetInfo, item: pytest.Item) -> None:
    """Fuzz one group of operations with the session's budget and seed; one verdict record per judged
    requirement and operation."""
    from .fuzz import FuzzBudget, fuzz_group

    config = item.config
    examples = int(config.getoption("--fuzz-examples"))
    if examples <= 0:
        pytest.skip("fuzzing disabled (--fuzz-examples 0)")
    budget = FuzzBudget(examples=examples, seed=int(config.stash[_RUN_KEY]["seed"]))
    failed: list[str] = []
    errors: list[str] = []
    for result in fuzz_group(target, check.name.removeprefix("fuzz:"), budget):
        for record in result.records(target):
            _record(item, record)
            verdict = Verdict(record["verdict"])
            if verdict is Verdict.FAILED or (verdict is Verdict.NON_STRICT and target.strict):
                failed.append(f"[{record['failed_requirement']}] fuzz:{result.name}: {record['message']}")
            elif verdict is Verdict.ERROR:
                errors.append(f"fuzz:{result.name}: {record['message']}")
    if failed:
        pytest.fail("\n\n".join(failed) + f"\nseed: {budget.seed}", pytrace=False)
    if errors:
        pytest.fail("harness error (not a conformance failure):\n" + "\n".join(errors), pytrace=False)


def _judge(
    check: Check, outcome: BaseException | None, advertised: bool, target: TargetInfo
) -> tuple[Verdict, str, list[Any], str | None]:
    if outcome is None:
        if not advertised:
            return Verdict.INFORMATIONAL, f"works, but {check.capability!r} is not advertised", [], None
        return Verdict.PASSED, "", [], None
    if isinstance(outcome, CheckFailure):
        req_id = outcome.requirement if outcome.requirement in REGISTRY else check.requirements[0]
        assert req_id is not None
        if not advertised:
            return (
                Verdict.UNIMPLEMENTED,
                f"{check.capability!r} not advertised; {outcome}",
                outcome.exchanges,
                req_id,
            )
        level = REGISTRY[req_id].level if req_id in REGISTRY else Level.MUST
        verdict = Verdict.FAILED if level is Level.MUST else Verdict.NON_STRICT
        return verdict, str(outcome), outcome.exchanges, req_id
    if isinstance(outcome, NotCovered):
        return Verdict.NOT_COVERED, str(outcome), [], None
    if isinstance(outcome, Unimplemented):
        return Verdict.UNIMPLEMENTED, str(outcome), [], None
    if isinstance(outcome, HarnessError):
        return Verdict.ERROR, str(outcome), [], None
    tb = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
    return Verdict.ERROR, f"the check raised {tb}", [], None


def _record(item: pytest.Item, record: dict[str, Any]) -> None:
    item.user_properties.append((RESULT_KEY, json.dumps(record, default=str)))


_VALIDATOR: Any = None


def _validator() -> Any:
    global _VALIDATOR
    if _VALIDATOR is None:
        from .schema_check import ResponseValidator

        _VALIDATOR = ResponseValidator()
    return _VALIDATOR


# -- collecting verdicts and reporting -------------------------------------------------------------------


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    for key, value in report.user_properties:
        if key == RESULT_KEY:
            _SESSION_RESULTS.append(json.loads(str(value)))


_SESSION_RESULTS: list[dict[str, Any]] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _enabled(config) or hasattr(config, "workerinput"):
        return
    target = config.stash.get(_TARGET_KEY, None)
    if target is None:
        return
    from .reports import build_results, write_reports

    run = config.stash[_RUN_KEY]
    results = build_results(target, _SESSION_RESULTS, run, options=_options(config))
    out_dir = write_reports(results, Path(str(config.getoption("--report-dir"))) / run["run_id"])
    config.stash[_RUN_KEY]["report_dir"] = str(out_dir)
    config.stash[_RUN_KEY]["results"] = results
    summary = results["summary"]
    if summary["harness_errors"]:
        session.exitstatus = EXIT_HARNESS_ERROR
    elif summary["failed"] or (target.strict and summary["non_strict"]):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        session.exitstatus = pytest.ExitCode.OK


def _options(config: pytest.Config) -> dict[str, Any]:
    return {
        "target": config.getoption("--target"),
        "namespace": config.getoption("--namespace"),
        "protocol_version": config.getoption("--protocol-version"),
        "max_wait": config.getoption("--max-wait"),
        "strict": bool(config.getoption("strict", default=False)),
        "requirement": list(config.getoption("--requirement")),
        "faults": config.getoption("--faults"),
        "fault_seed": config.getoption("--fault-seed"),
        "workers": getattr(config.option, "numprocesses", None),
        "worker_token": "<set>" if config.getoption("--worker-token") else None,
        "operator_token": "<set>" if config.getoption("--operator-token") else None,
        "auth_token": "<set>" if config.getoption("--auth-token") else None,
    }


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _enabled(config) or hasattr(config, "workerinput"):
        return
    run = config.stash.get(_RUN_KEY, None)
    if not run or "results" not in run:
        return
    from .reports import terminal_lines

    for line in terminal_lines(run["results"], run["report_dir"]):
        terminalreporter.write_line(line)
