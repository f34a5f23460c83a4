"""The pytest plugin: ``pytest --target=URL`` runs the conformance suite against a server.

Registered through the ``pytest11`` entry point, so it is active wherever the package is installed.
Without ``--target`` it only adds its options (and, when a plain ``pytest`` collects nothing, a one-line
hint): the project's own tests and any other pytest run are unaffected. With ``--target`` it checks every
option before the first request (:mod:`suite.settings`), replaces the collected paths by the suite's own
items (:mod:`suite.run`: ids such as ``dw::VERSION-TRIM::version_trimmed``, the same wherever the suite is
installed), resolves the target once (starting the embedded reference server when asked, probing the
namespace), hands the target to xdist workers, gathers every item's records, and at the end writes the
reports — and under ``--certify`` the verifiable bundle (:mod:`suite.certify`).

Exit status (:data:`suite.outcomes.EXIT_CODES`): 0 CONFORMANT, or INCOMPLETE without ``--certify``; 1 NOT
CONFORMANT (a MUST broken, or a SHOULD under ``--strict``); 4 a usage error, before the first request; 10 a
harness error (target unreachable, an item of the suite crashed, nothing ran) — never a conformance
failure; 11 INCOMPLETE under ``--certify``.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import shlex
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from suite.protocol.requirements import REGISTRY

from .context import TargetInfo
from .ordering import failures_first
from .outcomes import (
    EXIT_HARNESS_ERROR,
    EXIT_INCOMPLETE_CERTIFY,
    HarnessError,
    Kind,
    Record,
    RunVerdict,
    Verdict,
    exit_status,
)
from .registry import TEST_ID_ROOT, Check, entries
from .run import (
    MACHINE_COUNT_KEY,
    OVERLAP_KEY,
    RUN_KEY,
    RUNNERS,
    SETTINGS_KEY,
    STORED_KEY,
    TARGET_KEY,
    SuiteCollector,
    check_records,
    records_of,
    run_first_failures_first,
    stored_failure_machines,
    stored_failures_first,
)
from .settings import DEFAULT_BUDGET, LIMITS, RunSettings, parse_settings, probe_report_dir
from .text import plural

if TYPE_CHECKING:
    from .target import Credential

__all__ = [
    "EXIT_HARNESS_ERROR",
    "EXIT_INCOMPLETE_CERTIFY",
    "HINT",
    "Recorder",
    "list_requirements",
    "progress_line",
    "redacted_command",
]

HINT = (
    "dw-conformance: no --target given, so the conformance suite did not run; "
    "pytest --target=URL (or --target=embedded) runs it, pytest --help lists its options (group conformance)"
)
_EXIT_HELP = (
    "exit status: 0 CONFORMANT (or INCOMPLETE without --certify), 1 NOT CONFORMANT, 4 usage error, "
    "10 harness error, 11 INCOMPLETE under --certify"
)
_PROXY_KEY = pytest.StashKey[Any]()
_EMBEDDED_KEY = pytest.StashKey[Any]()
_ANCHOR = Path(__file__).resolve()  # the path pytest is pointed at; collected as the suite's items (node "dw")


def _limit_help(name: str, text: str) -> str:
    limit = LIMITS[name]
    return f"{text} ({limit.low:g}–{limit.high:g}; default {getattr(DEFAULT_BUDGET, name):g})"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", f"Durable Workflow worker protocol conformance ({_EXIT_HELP})")
    group.addoption(
        "--target",
        default=None,
        metavar="URL|embedded",
        help="Run the conformance suite against this http(s) server URL, or 'embedded' to start the reference server",
    )
    group.addoption(
        "--certify",
        action="store_true",
        default=False,
        help="Certification run: refuses any selection, budget below the defaults and --faults before the first "
        "request; exits 0 only when CONFORMANT (INCOMPLETE: 11); writes reports/<run-id>/manifest.json, which "
        "python -m suite.certify verify DIR checks",
    )
    group.addoption(
        "--sign-key",
        default=None,
        metavar="FILE",
        help="With --certify: sign the bundle with this Ed25519 private key (PEM; python -m suite.certify keygen "
        "writes a pair): an in-toto Statement in a DSSE envelope, manifest.intoto.json",
    )
    group.addoption(
        "--list-requirements",
        action="store_true",
        default=False,
        help="Print the requirement registry (ID, level, area, minor, section, sentence) and exit",
    )
    group.addoption("--format", default="text", metavar="text|json", help="--list-requirements: text or json")
    _add_target_options(group)
    _add_budget_options(group)
    _add_campaign_options(group)


def _add_campaign_options(group: Any) -> None:
    group.addoption(
        "--campaign",
        default=None,
        metavar="DURATION",
        help="Run the state machines round after round (each round its own seed) until DURATION (20s, 10m, 2h) is "
        "spent, a progress line every minute; the checks and fuzzing run once. Ends with the usual verdict and the "
        "campaign's statistics",
    )
    group.addoption(
        "--campaign-worker",
        default=None,
        metavar="I/N",
        help="This worker's index among N identical workers (default: JOB_COMPLETION_INDEX of a Kubernetes "
        "Indexed Job, else 0): each draws its own seeds; they share what they find through --example-db",
    )
    group.addoption(
        "--campaign-progress", default=None, metavar="SECONDS", help="Seconds between progress lines (default 60)"
    )
    group.addoption(
        "--example-db",
        default=None,
        metavar="URL",
        help="The machines' example database: redis://HOST:PORT/DB (pip install 'hypothesis[redis]') or a "
        "directory, keyed by suite build and target; its stored failures are replayed first (reached before the "
        "first request: unreachable is a usage error)",
    )
    group.addoption(
        "--example-db-readonly",
        action="store_true",
        default=False,
        help="Replay what --example-db holds and never write to it (CI jobs)",
    )
    group.addoption(
        "--example-db-target",
        default=None,
        metavar="NAME",
        help="The target's name in --example-db (default: the server's name and version, and its URL)",
    )


def _add_target_options(group: Any) -> None:
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
        help="Full-access bearer token (env DW_AUTH_TOKEN), one token for both planes (docs/reference.md: Auth); "
        "used for both planes when no role tokens are given",
    )
    group.addoption(
        "--restart-command",
        default=None,
        metavar="CMD",
        help="A shell command that kills the target hard (as a crash would), starts it again on the same URL and "
        "state, and returns once it answers: the restart checks run it mid-flight (without it they are not "
        "covered; the embedded target restarts itself)",
    )
    group.addoption(
        "--namespace", default="default", help="Namespace the checks run in, probed first (default 'default')"
    )
    group.addoption(
        "--protocol-version",
        default="1.20",
        help="Certify at this 1.x minor (1.0–1.20): requirements introduced later are not applicable",
    )
    group.addoption(
        "--report-dir", default="reports", help="Where reports/<run-id>/ is written, probed first (default reports)"
    )
    group.addoption(
        "--requirement",
        action="append",
        default=[],
        metavar="ID",
        help="Run only the items of these requirement IDs (repeatable; the run is then INCOMPLETE)",
    )
    group.addoption(
        "--faults",
        default=None,
        metavar="SPEC",
        help="Talk to the target through a seeded fault-injecting proxy, e.g. drop_response=0.05,delay=0.1, or "
        "'standard' (every fault; 'none': transparent; the faults: python -m suite.proxy --help)",
    )
    group.addoption("--fault-seed", default=None, metavar="N", help="Seed of the fault proxy (default: the run's seed)")
    group.addoption(
        "--area-order",
        action="store_true",
        default=False,
        help="Run the items in the registry's order (checks by area, then machines, then fuzzing) instead of "
        "failures first (cheap, broad checks first, then by cost)",
    )
    group.addoption(
        "--real-time",
        action="store_true",
        default=False,
        help="Wait in real time even when the target advertises a test clock (test_profile.clock_advance)",
    )
    group.addoption(
        "--concurrency",
        default=None,
        metavar="N",
        help="Checks run at once while they wait in real time (no test clock, or --real-time), and as many state "
        "machines and fuzz groups beside them; 1 runs every item one by one (default 8)",
    )


# The budget options: attribute of Budget → (metavar, help); ranges and defaults come from LIMITS and Budget.
_BUDGET_HELP = {
    "max_wait": ("SECONDS", "Longest the suite may wait for a lease expiry or timer, in seconds"),
    "machine_examples": ("N", "Random sequences per state machine"),
    "machine_steps": ("N", "Steps per sequence of a state machine"),
    "fuzz_examples": (
        "N",
        "Random Schemathesis cases per OpenAPI operation, plus up to 5×N coverage-phase cases; 0 disables fuzzing",
    ),
}


def _add_budget_options(group: Any) -> None:
    # --strict is pytest's own flag (strict mode); with --target it also makes SHOULD violations fail the run.
    for name, (metavar, text) in _BUDGET_HELP.items():
        default = str(getattr(DEFAULT_BUDGET, name))
        group.addoption(LIMITS[name].option, default=default, metavar=metavar, help=_limit_help(name, text))
    group.addoption(
        "--no-machine-shrink",
        action="store_true",
        default=False,
        help="Report a state machine's first failing sequence without shrinking it (faster, longer replay)",
    )


def _enabled(config: pytest.Config) -> bool:
    return config.getoption("--target", default=None) is not None


# -- the registry on the command line ------------------------------------------------------------------------


def list_requirements(fmt: str) -> str:
    """The registry as text (one line per requirement) or JSON (a list of objects)."""
    rows = [
        {
            "id": r.id,
            "level": r.level.value,
            "area": r.area.value,
            "minor": r.minor,
            "section": r.section,
            "profile": r.profile,
            "sentence": r.sentence,
        }
        for r in REGISTRY.values()
    ]
    if fmt == "json":
        return json.dumps(rows, indent=2, ensure_ascii=False)
    width = max(len(str(r["id"])) for r in rows)
    return "\n".join(
        f"{r['id']!s:<{width}}  {r['level']!s:<6} {r['area']!s:<15} 1.{r['minor']!s:<3} {r['section']!s:<8} "
        f"{r['sentence']}"
        for r in rows
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    fmt = str(config.getoption("--format"))
    if fmt not in ("text", "json"):
        raise pytest.UsageError(f"--format={fmt}: must be text or json")
    if not config.getoption("--list-requirements"):
        return None
    sys.stdout.write(list_requirements(fmt) + "\n")
    return 0


# -- configuration: check everything, then reach the target ----------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _enabled(config):
        return
    config.addinivalue_line("markers", "conformance_slow: a check that waits for leases or timers")
    for kind in Kind:
        config.addinivalue_line("markers", f"dw_{kind.value}: an item of the conformance suite of kind {kind.value}")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller checked the options and resolved the target
        config.args[:] = [str(_ANCHOR)]
        config.stash[SETTINGS_KEY] = RunSettings.from_json(json.loads(workerinput["dw_settings"]))
        config.stash[TARGET_KEY] = TargetInfo(**json.loads(workerinput["dw_target"]))
        config.stash[RUN_KEY] = json.loads(workerinput["dw_run"])
        config.stash[STORED_KEY] = json.loads(workerinput.get("dw_stored", "[]"))
        target = config.stash[TARGET_KEY]
        try:
            if target.embedded:  # each worker its own server, so its clock moves for its checks alone
                _own_embedded(config, target)
            if config.stash[SETTINGS_KEY].faults is not None:
                index = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
                _attach_proxy(config, target, index)
            _attach_clock(config, target, int(workerinput.get("workercount", 1)))
            _start_overlap(config, target)
        except HarnessError as exc:
            _stop_proxy(config)
            _stop_embedded(config)
            pytest.exit(f"harness error: {exc}", returncode=EXIT_HARNESS_ERROR)
        return
    settings = parse_settings(config)
    _check_ids(settings.ids)
    collect_only = bool(config.getoption("collectonly"))
    if not collect_only:
        probe_report_dir(Path(settings.report_dir))
    config.args[:] = [str(_ANCHOR)]
    config.stash[SETTINGS_KEY] = settings
    now = datetime.now(UTC)
    config.stash[RUN_KEY] = {
        "run_id": now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3),
        "started_at": now.isoformat(),
        "seed": settings.seed,
        "command": _command_line(config),
    }
    if not collect_only:  # listing the items needs no target
        try:
            target = config.stash[TARGET_KEY] = _resolve_target(config, settings)
            target.time = time_plan(config, target)
            config.stash[STORED_KEY] = stored_failure_machines(target, settings)
            # Under xdist the workers run the checks, each behind its own proxy; otherwise this process does.
            if getattr(config.option, "dist", "no") == "no":
                if settings.faults is not None:
                    _attach_proxy(config, target, 0)
                _attach_clock(config, target, 1)
                _start_overlap(config, target)
        except HarnessError as exc:
            _stop_proxy(config)
            _stop_embedded(config)
            # One line, a distinct exit code, no traceback: the target could not be reached at all.
            pytest.exit(f"harness error: {exc}", returncode=EXIT_HARNESS_ERROR)
    config.pluginmanager.register(Recorder(config, settings, collect_only), "dw-recorder")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The verdict and the reports are written; what is left of the process lives until exit. pytest's cleanup
    still runs several full garbage collections, each walking the whole heap of the imported libraries and the
    parsed schema — most of a second of CPU for every suite process. Frozen (``gc.freeze``), that heap is no
    longer walked (cyclic garbage left in it is freed at exit instead); collections during the run are
    unchanged."""
    if _enabled(session.config):
        gc.freeze()


def _check_ids(ids: tuple[str, ...]) -> None:
    known = [e.test_id for e in entries()]
    for wanted in ids:
        if not any(k == wanted or k.startswith(wanted + "::") for k in known):
            raise pytest.UsageError(
                f"{wanted}: no item of the suite has this id or prefix "
                "(pytest --target=... --collect-only -q lists them)"
            )


_SECRET_OPTIONS = ("--worker-token", "--operator-token", "--auth-token")


def _command_line(config: pytest.Config) -> str:
    return redacted_command([str(a) for a in config.invocation_params.args])


def redacted_command(args: list[str]) -> str:
    """The command as typed, with token values redacted (a report never carries a token)."""
    out = []
    hide = False
    for arg in args:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg in _SECRET_OPTIONS:
            out.append(arg)
            hide = True
        elif arg.startswith(tuple(o + "=" for o in _SECRET_OPTIONS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return shlex.join(["pytest", *out])


def _resolve_target(config: pytest.Config, settings: RunSettings) -> TargetInfo:
    from .target import EmbeddedServer, TokenRefused, measure_clock_skew, probe_cluster_info, probe_credentials

    embedded = settings.target == "embedded"
    server = None
    if embedded:
        server = EmbeddedServer()
        config.stash[_EMBEDDED_KEY] = server
        url = server.start()
    else:
        url = settings.target
    worker_token, operator_token, full_token = _tokens(config, server)
    planes, full = _credentials(config, server)
    try:
        # Before anything else: a refused token is the user's to fix, never a verdict on the target.
        credentials = probe_credentials(
            url, settings.namespace, planes, full=full, worker_version=settings.protocol_version
        )
    except TokenRefused as exc:
        _stop_embedded(config)
        raise pytest.UsageError(str(exc)) from None
    info = probe_cluster_info(url, operator_token or worker_token)
    if credentials.namespace_missing is not None:
        _stop_embedded(config)
        raise pytest.UsageError(
            f"--namespace={settings.namespace}: the target has no such namespace ({credentials.namespace_missing}); "
            "create it or pass an existing one"
        )
    return TargetInfo(
        url=url,
        cluster_info=info,
        worker_token=worker_token,
        operator_token=operator_token,
        full_token=full_token,
        auth=credentials.to_json(),
        namespace=settings.namespace,
        protocol_version=settings.protocol_version,
        max_wait=settings.budget.max_wait,
        strict=settings.strict,
        embedded=embedded,
        clock_skew_seconds=measure_clock_skew(url),
        restart_command=server.restart_command if server is not None else settings.restart_command,
    )


def _tokens(config: pytest.Config, server: Any) -> tuple[str | None, str | None, str | None]:
    """Worker, operator and full-access tokens: the given ones, else those an embedded ``server`` started with;
    a full-access token alone serves both planes."""
    worker_token = config.getoption("--worker-token") or None
    operator_token = config.getoption("--operator-token") or None
    full_token = config.getoption("--auth-token") or None
    if server is not None and not (worker_token or operator_token or full_token):
        worker_token, operator_token, full_token = server.worker_token, server.operator_token, server.full_token
    if full_token and not (worker_token or operator_token):
        worker_token = operator_token = full_token  # one token for both planes
    return worker_token, operator_token, full_token


def _credentials(config: pytest.Config, server: Any) -> tuple[tuple[Credential, Credential], Credential | None]:
    """The token of each plane with the option that gave it (the one that would, when none did; ``None`` for
    the embedded server's own), and a full-access token given beside role tokens."""
    from .target import CONTROL_PLANE, WORKER_PLANE, Credential

    worker_token, operator_token, full_token = _tokens(config, server)
    given = {option: bool(config.getoption(option)) for option in _SECRET_OPTIONS}
    own = server is not None and not any(given.values())

    def option(role_option: str, token: str | None) -> str | None:
        if own:
            return None
        if not given[role_option] and given["--auth-token"] and token == full_token:
            return "--auth-token"
        return role_option

    planes = (
        Credential(WORKER_PLANE, worker_token, option("--worker-token", worker_token)),
        Credential(CONTROL_PLANE, operator_token, option("--operator-token", operator_token)),
    )
    beside = full_token is not None and full_token not in (worker_token, operator_token)
    return planes, Credential("both", full_token, None if own else "--auth-token") if beside else None


def _own_embedded(config: pytest.Config, target: TargetInfo) -> None:
    """An xdist worker of ``--target=embedded`` starts its own reference server and runs its checks on it: a
    test-clock jump made by one check then expires no lease of a check running on another worker."""
    from .target import EmbeddedServer, probe_cluster_info

    server = EmbeddedServer()
    config.stash[_EMBEDDED_KEY] = server
    url = server.start()
    target.worker_token, target.operator_token, target.full_token = _tokens(config, server)
    target.url = url
    target.cluster_info = probe_cluster_info(url, target.operator_token or target.worker_token)
    # A restart check restarts the server this worker talks to, never the controller's (which another worker's
    # restart would kill at the same moment, and whose restart proves nothing about this worker's server).
    target.restart_command = server.restart_command


def _attach_clock(config: pytest.Config, target: TargetInfo, processes: int) -> None:
    """How this process lets the target's time pass (suite.timing): its test clock, when it advertises one and
    no other process of the run shares it, else real time."""
    from .timing import TargetClock, advertised_route, plan

    route = advertised_route(target.test_profile)
    base = (target.upstream_url or target.url).rstrip("/")
    clock = TargetClock(url=base + route if route else None, token=target.operator_token)
    clock.real_time_reason = plan(
        target.test_profile,
        processes=processes,
        embedded=target.embedded,
        real_time=config.stash[SETTINGS_KEY].real_time,
    )
    clock.skips = clock.real_time_reason is None
    spec = config.stash[SETTINGS_KEY].faults
    if spec is not None:  # the proxy may hold a request back this long before the target sees it
        from .proxy import FaultSpec

        clock.network_hold = FaultSpec.parse(spec).longest_hold()
    clock.read()
    target.clock = clock


def _start_overlap(config: pytest.Config, target: TargetInfo) -> None:
    """Items that wait in real time overlap in this process (suite.overlap); with the target's test clock,
    or ``--concurrency 1``, they run one by one."""
    from .overlap import Overlap

    limit = config.stash[SETTINGS_KEY].concurrency
    if target.clock.skips or limit <= 1 or config.getoption("collectonly"):
        return

    async def start(check: Check) -> list[Record]:
        return await check_records(check, target)

    config.stash[OVERLAP_KEY] = Overlap(start, limit, *_blocking_overlap(config, target))


def _blocking_overlap(config: pytest.Config, target: TargetInfo) -> tuple[Any, Any]:
    """How machines and fuzz groups run ahead of their turn (suite.overlap), each in a thread: the runner and
    the stop signal; (None, None) in a campaign or with an example database, whose machines share a budget and
    write progress lines in turn."""
    settings = config.stash[SETTINGS_KEY]
    if settings.campaign_seconds is not None or settings.example_db is not None:
        return None, None
    from .outcomes import STOPPING

    STOPPING.clear()

    def block(entry: Check) -> list[Record]:
        return RUNNERS[entry.kind](entry, target, settings, config)

    return block, STOPPING.set


def _stop_overlap(config: pytest.Config) -> None:
    overlap = config.stash.get(OVERLAP_KEY, None)
    if overlap is not None:
        del config.stash[OVERLAP_KEY]
        overlap.close()


def _processes(config: pytest.Config) -> int:
    """How many processes run checks: the xdist workers, or this one."""
    if getattr(config.option, "dist", "no") == "no":
        return 1
    n = getattr(config.option, "numprocesses", 1)
    return max(1, n) if isinstance(n, int) else 2  # "auto" not yet resolved: assume it shares


def time_plan(config: pytest.Config, target: TargetInfo) -> dict[str, Any]:
    """How this run lets the target's time pass (the report's ``target.time``, the header line)."""
    from .timing import advertised_route, plan

    reason = plan(
        target.test_profile,
        processes=_processes(config),
        embedded=target.embedded,
        real_time=config.stash[SETTINGS_KEY].real_time,
    )
    return {
        "test_clock_advertised": advertised_route(target.test_profile) is not None,
        "test_clock_used": reason is None,
        "real_time_reason": reason,
    }


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    target = config.stash.get(TARGET_KEY, None) if _enabled(config) else None
    if target is None or target.time is None or hasattr(config, "workerinput"):
        return None
    lines = [f"dw auth: {target.auth['summary']}"] if target.auth is not None else []
    reason = target.time["real_time_reason"]
    if reason is None:
        where = "one embedded server per xdist worker" if target.embedded and _processes(config) > 1 else "one process"
        return [*lines, f"dw time: the target's test clock is moved instead of waiting ({where})"]
    return [*lines, f"dw time: real time, because {reason}"]


def pytest_configure_node(node: Any) -> None:
    """xdist: every worker gets the controller's settings and target, so one embedded server serves them all."""
    target = node.config.stash.get(TARGET_KEY, None)
    if target is not None:
        node.workerinput["dw_target"] = json.dumps(target.shareable())
        node.workerinput["dw_settings"] = json.dumps(node.config.stash[SETTINGS_KEY].to_json())
        node.workerinput["dw_run"] = json.dumps(node.config.stash[RUN_KEY])
        node.workerinput["dw_stored"] = json.dumps(node.config.stash.get(STORED_KEY, []))


def _attach_proxy(config: pytest.Config, target: TargetInfo, index: int) -> None:
    """``--faults``: this process's checks talk to a fault proxy in front of the target, on its own thread and
    event loop, and read what it did to their requests (``target.fault_ledger``). Worker ``index`` draws
    from seed + index, so a run is reproducible worker by worker."""
    from .proxy import ProxyThread

    settings = config.stash[SETTINGS_KEY]
    seed = (settings.fault_seed if settings.fault_seed is not None else settings.seed) + index
    url = target.url
    try:
        proxy = ProxyThread(url, str(settings.faults), seed=seed)
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
        del config.stash[_EMBEDDED_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Under ``-x`` while items overlap, the first failure in time reports first (suite.run)."""
    return run_first_failures_first(session)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _enabled(config):
        _stop_overlap(config)
        _stop_proxy(config)
        _stop_embedded(config)


# -- collection ------------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not _enabled(parent.config) or module_path.resolve() != _ANCHOR:
        return None
    return SuiteCollector.from_parent(parent, path=module_path, name=TEST_ID_ROOT, nodeid=TEST_ID_ROOT)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _enabled(config):
        return
    settings = config.stash[SETTINGS_KEY]
    wanted = set(settings.requirements)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        entry: Check | None = getattr(item, "entry", None)
        chosen = entry is not None and (not wanted or bool(wanted & set(entry.requirements)))
        if settings.ids:
            chosen = chosen and any(item.nodeid == i or item.nodeid.startswith(i + "::") for i in settings.ids)
        (keep if chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    kinds = [getattr(getattr(item, "entry", None), "kind", None) for item in items]
    config.stash[MACHINE_COUNT_KEY] = kinds.count(Kind.MACHINE)
    if not settings.area_order:
        target = config.stash.get(TARGET_KEY, None)
        timed = target is not None and target.time is not None and not target.time["test_clock_used"]
        items[:] = failures_first(items, "real-time" if timed else "test-clock")
        # Given an example database, the machines it holds failures of go before everything else: their replays.
        items[:] = stored_failures_first(items, config.stash.get(STORED_KEY, []))


# -- the records, the progress lines, the verdict --------------------------------------------------------------


class Recorder:
    """The controller's view of the run: every item's records (from any worker), a progress line per area and
    per machine, and at the end the reports, the bundle and the exit status."""

    def __init__(self, config: pytest.Config, settings: RunSettings, collect_only: bool) -> None:
        self.config = config
        self.settings = settings
        self.collect_only = collect_only
        self.entries = {e.test_id: e for e in entries()}
        self.records: list[Record] = []
        self.ran: set[str] = set()
        self.pending: Counter[str] | None = None
        self.done: dict[str, list[Record]] = {}
        self.lines: list[str] = []
        self.results: dict[str, Any] | None = None
        self.out_dir: Path | None = None

    # progress ----------------------------------------------------------------------------------------

    def _expect(self, ids: list[str]) -> None:
        if self.pending is None and ids:
            self.pending = Counter(self._area(i) for i in ids if i in self.entries)

    def _area(self, test_id: str) -> str:
        entry = self.entries[test_id]
        return entry.primary.area.value if entry.kind is Kind.CHECK else f"{entry.kind.value}:{entry.name}"

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._expect([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._expect(list(ids))

    def _progress(self, test_id: str, records: list[Record]) -> None:
        if test_id not in self.entries or self.pending is None:
            return
        area = self._area(test_id)
        self.done.setdefault(area, []).extend(records)
        self.pending[area] -= 1
        if self.pending[area] <= 0:
            self.lines.append(f"[dw] {progress_line(area, self.done[area])}")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """After pytest's own progress marks: the line of an area (or machine, fuzz group) just finished."""
        lines, self.lines = self.lines, []
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or self.config.get_verbosity() < 0:
            return
        for line in lines:
            reporter.ensure_newline()
            # Under xdist the progress dots run on without a path, so ensure_newline() does not end their line.
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(line)

    # records -------------------------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "setup":
            self.ran.add(report.nodeid)
        records = records_of(report) if report.when == "call" else []
        self.records.extend(records)
        explained = any(r.verdict in (Verdict.FAILED, Verdict.NON_STRICT, Verdict.ERROR) for r in records)
        silent = report.when == "call" and report.passed and not records
        if (report.failed and not (report.when == "call" and explained)) or silent:
            self.records.append(self._suite_error(report))
        if report.when == "teardown":
            self._progress(report.nodeid, [r for r in self.records if r.test_id == report.nodeid])

    def _suite_error(self, report: pytest.TestReport) -> Record:
        """An item of the suite that failed outside any verdict (a crash, an exception in a hook) or ended
        without one: a harness error on its requirements, never a pass."""
        entry = self.entries.get(report.nodeid)
        crash = getattr(report.longrepr, "reprcrash", None)
        lines = [line for line in str(report.longreprtext or "").strip().splitlines() if line.strip()]
        what = getattr(crash, "message", None) or (lines[-1] if lines else "it produced no verdict")
        return Record(
            kind=entry.kind if entry else Kind.CHECK,
            check=entry.record_name if entry else report.nodeid,
            test_id=report.nodeid,
            requirements=entry.requirements if entry else ("ROBUST-NO-5XX",),
            verdict=Verdict.ERROR,
            message=f"the suite's item {report.nodeid} failed outside a requirement verdict ({report.when}): {what}",
        )

    # the end -------------------------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.collect_only:  # pytest's own status: 0 when the items were listed
            return
        target = self.config.stash.get(TARGET_KEY, None)
        if target is None:
            return
        try:
            self._finish(session, target)
        except Exception as exc:  # the plugin itself broke: never a pass, never the target's failure
            sys.stderr.write(f"harness error: the suite could not finish the run: {type(exc).__name__}: {exc}\n")
            session.exitstatus = EXIT_HARNESS_ERROR

    def _finish(self, session: pytest.Session, target: TargetInfo) -> None:
        from .reports import write_reports
        from .results import Completeness, build_results

        run = self.config.stash[RUN_KEY].copy()
        run["finished_at"] = datetime.now(UTC).isoformat()
        completeness = Completeness(
            narrowed_by=tuple(self.settings.narrowing()),
            reduced=tuple(self.settings.reductions()),
            not_run=tuple(i for i in self.entries if i not in self.ran),
            items=len(self.entries),
            certify=self.settings.certify,
        )
        self.results = build_results(
            target, self.records, run, options=_options(self.config), completeness=completeness
        )
        from .certify import certification

        self.results["certification"] = certification(self.settings)
        campaign = campaign_statistics(self.records, self.settings)
        if campaign is not None:
            self.results["campaign"] = campaign
        self.out_dir = write_reports(self.results, Path(self.settings.report_dir) / run["run_id"])
        if self.settings.certify:
            from .certify import write_manifest

            write_manifest(self.out_dir, self.results, self.settings, target, sign_key=self.settings.sign_key)
        verdict = RunVerdict(self.results["summary"]["verdict"])
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:
            return
        session.exitstatus = exit_status(verdict, certify=self.settings.certify)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.collect_only:
            terminalreporter.write_line(
                "no verdict: --collect-only lists the items of the suite and runs none (run without it for a verdict)"
            )
            return
        if self.results is None:
            return
        from .reports import terminal_lines

        width = getattr(getattr(terminalreporter, "_tw", None), "fullwidth", 100)
        for line in terminal_lines(self.results, str(self.out_dir) if self.out_dir else None, width=width):
            terminalreporter.write_line(line)
        for line in campaign_lines(self.results.get("campaign")):
            terminalreporter.write_line(line)
        if self.settings.certify and self.out_dir is not None:
            from .certify import certification_lines

            for line in certification_lines(self.out_dir, self.results, self.settings.sign_key):
                terminalreporter.write_line(line)


def campaign_statistics(records: list[Record], settings: RunSettings) -> dict[str, Any] | None:
    """What a campaign (or a run given a database) spent and replayed, per machine and in all."""
    if settings.campaign_seconds is None and settings.example_db is None:
        return None
    machines: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.kind is Kind.MACHINE and r.campaign is not None:
            machines.setdefault(r.check.removeprefix("machine:"), dict(r.campaign))
    seconds = sum(float(m.get("seconds", 0)) for m in machines.values())
    examples = sum(int(m.get("examples", 0)) for m in machines.values())
    requests = sum(int(m.get("requests", 0)) for m in machines.values())
    minutes = seconds / 60 if seconds else 0.0
    return {
        "duration_seconds": settings.campaign_seconds,
        "worker": settings.campaign_worker,
        "workers": settings.campaign_workers,
        "seed": settings.seed,
        "example_db": settings.example_db,
        "readonly": settings.example_db_readonly,
        "machine_seconds": round(seconds, 1),
        "examples": examples,
        "requests": requests,
        "examples_per_minute": round(examples / minutes, 1) if minutes else None,
        "requests_per_minute": round(requests / minutes, 1) if minutes else None,
        "rounds": sum(int(m.get("rounds", 0)) for m in machines.values()),
        "failures": sum(int(m.get("failures", 0)) for m in machines.values()),
        "replayed": sum(int(m.get("replayed", 0)) for m in machines.values()),
        "still_failing": sum(int(m.get("still_failing", 0)) for m in machines.values()),
        "fixed": sum(len(m.get("fixed", [])) for m in machines.values()),
        "unreplayable": sum(len(m.get("unreplayable", [])) for m in machines.values()),
        "machines": machines,
    }


def campaign_lines(doc: dict[str, Any] | None) -> list[str]:
    """The campaign's statistics under the verdict."""
    if doc is None:
        return []
    workers = f"/{doc['workers']}" if doc.get("workers") is not None else ""
    rate = (
        f" ({doc['examples_per_minute']:g} examples and {doc['requests_per_minute']:g} requests a minute)"
        if doc.get("examples_per_minute") is not None
        else ""
    )
    lines = [
        f"campaign (worker {doc['worker']}{workers}, seed {doc['seed']}): {plural(doc['rounds'], 'round')}, "
        f"{plural(doc['examples'], 'example')}, {plural(doc['requests'], 'request')} in "
        f"{doc['machine_seconds']:g} s of machines{rate}, {plural(doc['failures'], 'failure')} found",
    ]
    if doc.get("example_db"):
        mode = "read only" if doc.get("readonly") else "read and written"
        lines.append(
            f"example database {doc['example_db']} ({mode}): {plural(doc['replayed'], 'stored failure')} replayed, "
            f"{doc['still_failing']} still failing, {doc['fixed']} fixed, "
            f"{doc.get('unreplayable', 0)} could not be replayed (kept)"
        )
    return lines


def progress_line(area: str, records: list[Record]) -> str:
    """One line when an area's checks, a machine or a fuzz group are done: what it judged, and how."""
    verdicts = Counter(r.verdict.value for r in records)
    judged = ", ".join(f"{n} {v}" for v, n in verdicts.most_common()) or "no verdict"
    seconds = sum(r.duration_seconds for r in records)
    kind, _, name = area.partition(":")
    if kind == Kind.MACHINE.value:
        seconds = max((r.duration_seconds for r in records), default=0.0)  # every record carries the whole run
        ledger = next((r.ledger for r in records if r.ledger is not None), {}) or {}
        budget = next((r.budget for r in records if r.budget), {}) or {}
        reached = plural(sum(1 for v in ledger.values() if v), "hard state")
        cells = next((r.cells for r in records if r.cells is not None), {}) or {}
        hit = plural(sum(1 for v in cells.values() if v), "coverage cell")
        return (
            f"machine {name}: {judged} — {_counted(budget.get('examples'), 'example')} × "
            f"{_counted(budget.get('steps'), 'step')}, {reached} and {hit} reached, {seconds:.1f} s"
        )
    if kind == Kind.FUZZ.value:
        cases = sum(r.fuzz.cases for r in records if r.fuzz)
        seconds = sum(r.fuzz.seconds for r in records if r.fuzz)
        ops = sum(1 for r in records if r.fuzz)
        requests = sum(r.requests for r in records)
        return (
            f"fuzz {name}: {judged} — {plural(ops, 'operation')}, {plural(cases, 'case')}, "
            f"{plural(requests, 'request')}, {seconds:.1f} s"
        )
    checks = len({r.check for r in records})
    requests = sum(r.requests for r in records)
    return f"{area}: {plural(checks, 'check')} done — {judged} ({plural(requests, 'request')}, {seconds:.1f} s)"


def _counted(n: Any, noun: str) -> str:
    """A count from a record's budget, which a record of another version may lack (``? examples``)."""
    return plural(n, noun) if isinstance(n, int) else f"? {noun}s"


def _options(config: pytest.Config) -> dict[str, Any]:
    settings = config.stash[SETTINGS_KEY]
    return {
        "target": settings.target,
        "namespace": settings.namespace,
        "protocol_version": settings.protocol_version,
        "max_wait": settings.budget.max_wait,
        "machine_examples": settings.budget.machine_examples,
        "machine_steps": settings.budget.machine_steps,
        "machine_shrink": settings.shrink,
        "fuzz_examples": settings.budget.fuzz_examples,
        "strict": settings.strict,
        "certify": settings.certify,
        "signed": settings.sign_key is not None,
        "requirement": list(settings.requirements),
        "ids": list(settings.ids),
        "narrowed_by": settings.narrowing(),
        "faults": settings.faults,
        "fault_seed": settings.fault_seed,
        "workers": getattr(config.option, "numprocesses", None),
        "campaign": settings.campaign_seconds,
        "campaign_worker": settings.campaign_worker,
        "example_db": settings.example_db,
        "example_db_readonly": settings.example_db_readonly,
        "worker_token": "<set>" if config.getoption("--worker-token") else None,
        "operator_token": "<set>" if config.getoption("--operator-token") else None,
        "auth_token": "<set>" if config.getoption("--auth-token") else None,
        "restart_command": "<set>" if config.getoption("--restart-command") else None,
    }


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Without --target: a plain ``pytest`` that collected nothing says how to run the suite."""
    if not _enabled(config) and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        terminalreporter.write_line(HINT)
