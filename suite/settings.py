"""The suite's own options, parsed and checked before the first request.

Every budget and wait has a range; a value outside it, a report directory that cannot be written, a target
that is neither an http(s) URL nor ``embedded``, an unknown requirement ID: each is a
:class:`pytest.UsageError` of one line naming the option, the value and what is accepted (exit 4), raised
in ``pytest_configure`` before the target is contacted. ``--certify`` refuses here, just as early, every
option that would narrow the run.

:class:`RunSettings` is what the rest of the plugin reads; :meth:`RunSettings.narrowing` and
:meth:`RunSettings.reductions` say why a run is not complete (README, "Verdicts").
"""

from __future__ import annotations

import math
import os
import secrets
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from suite.protocol.requirements import REGISTRY

from .registry import TEST_ID_ROOT

__all__ = [
    "DEFAULT_BUDGET",
    "LIMITS",
    "Budget",
    "Limit",
    "RunSettings",
    "parse_settings",
    "probe_report_dir",
]

SEED_ENV = "DW_CONFORMANCE_SEED"


@dataclass(frozen=True)
class Budget:
    """How hard a run tries. A run below any default is INCOMPLETE, and ``--certify`` refuses it."""

    max_wait: float = 30.0
    machine_examples: int = 8
    machine_steps: int = 40
    fuzz_examples: int = 20


DEFAULT_BUDGET = Budget()


@dataclass(frozen=True)
class Limit:
    """The accepted range of one numeric option."""

    option: str
    kind: type[int] | type[float]
    low: float
    high: float
    unit: str = ""

    def parse(self, raw: object) -> int | float:
        text = str(raw).strip()
        try:
            value: int | float = self.kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise pytest.UsageError(f"{self.option}={raw}: {self.accepted}")
        return value

    @property
    def accepted(self) -> str:
        kind = "a whole number" if self.kind is int else "a number"
        unit = f" {self.unit}" if self.unit else ""
        low, high = (
            (f"{int(self.low)}", f"{int(self.high)}") if self.kind is int else (f"{self.low:g}", f"{self.high:g}")
        )
        return f"must be {kind}{unit} from {low} to {high}"


LIMITS: dict[str, Limit] = {
    "max_wait": Limit("--max-wait", float, 1, 3600, "of seconds"),
    "machine_examples": Limit("--machine-examples", int, 1, 10_000),
    "machine_steps": Limit("--machine-steps", int, 1, 10_000),
    "fuzz_examples": Limit("--fuzz-examples", int, 0, 10_000),
    "fault_seed": Limit("--fault-seed", int, 0, 2**32 - 1),
    "concurrency": Limit("--concurrency", int, 1, 64),
    "seed": Limit(SEED_ENV, int, 0, 2**32 - 1),
}


@dataclass(frozen=True)
class RunSettings:
    """The parsed options of a run (the same in the controller and every xdist worker)."""

    target: str
    namespace: str
    protocol_version: str
    report_dir: str
    budget: Budget
    shrink: bool
    strict: bool
    certify: bool
    requirements: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()  # dw:: item ids given as arguments
    faults: str | None = None
    fault_seed: int | None = None
    sign_key: str | None = None
    real_time: bool = False  # --real-time: wait in real time even when the target advertises a test clock
    area_order: bool = False  # --area-order: the registry's order, not failures first (suite.ordering)
    restart_command: str | None = None  # --restart-command: kills the target hard and starts it again
    concurrency: int = 8  # --concurrency: checks in flight at once while they wait in real time (suite.overlap)
    seed: int = 0
    narrowed_by: tuple[str, ...] = field(default=())
    # --campaign: the machines run round after round until these seconds are spent (None: one round each).
    campaign_seconds: float | None = None
    campaign_progress: float = 60.0
    campaign_worker: int = 0
    campaign_workers: int | None = None
    example_db: str | None = None  # --example-db: redis://… or a directory
    example_db_readonly: bool = False
    example_db_target: str | None = None

    def narrowing(self) -> list[str]:
        """Every option of this run that selects a part of the suite, as the user wrote it."""
        return list(self.narrowed_by)

    def reductions(self) -> list[str]:
        """Every budget below its default."""
        out = []
        for name, value in asdict(self.budget).items():
            default = getattr(DEFAULT_BUDGET, name)
            if value < default:
                out.append(f"{LIMITS[name].option} {value:g} (below the default {default:g})")
        return out

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["budget"] = asdict(self.budget)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunSettings:
        values = dict(doc)
        values["budget"] = Budget(**values["budget"])
        for key in ("requirements", "ids", "narrowed_by"):
            values[key] = tuple(values[key])
        return cls(**values)


def _option(config: pytest.Config, name: str, default: Any = None) -> Any:
    return config.getoption(name, default=default)


def _selection(config: pytest.Config, requirements: list[str], ids: list[str]) -> list[str]:
    """The options that narrow the run: the suite's own and pytest's selection options."""
    out = [f"--requirement {r}" for r in requirements]
    out += [f"{i}" for i in ids]
    flags: list[tuple[str, str, Callable[[Any], str]]] = [
        ("keyword", "-k", lambda v: f"-k {v!r}"),
        ("markexpr", "-m", lambda v: f"-m {v!r}"),
        ("deselect", "--deselect", lambda v: " ".join(f"--deselect {d}" for d in v)),
        ("ignore", "--ignore", lambda v: " ".join(f"--ignore {d}" for d in v)),
        ("ignore_glob", "--ignore-glob", lambda v: " ".join(f"--ignore-glob {d}" for d in v)),
        ("lf", "--lf", lambda v: "--lf"),
        ("stepwise", "--sw", lambda v: "--sw"),
        ("stepwise_skip", "--sw-skip", lambda v: "--sw-skip"),
    ]
    for dest, _flag, show in flags:
        value = _option(config, dest)
        if value:
            out.append(show(value))
    return out


def _target(raw: str) -> str:
    if raw == "embedded":
        return raw
    problem = "give an http(s) URL such as http://localhost:8080, or 'embedded'"
    try:
        parts = urlsplit(raw)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        raise pytest.UsageError(f"--target={raw}: {problem}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise pytest.UsageError(f"--target={raw}: {problem}")
    return raw.rstrip("/")


def _ids(config: pytest.Config) -> list[str]:
    """Item ids given as arguments (``dw::VERSION-TRIM::version_trimmed``, or a prefix such as
    ``dw::VERSION-TRIM``); any other argument is refused: the suite collects its own items."""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return []
    ids: list[str] = []
    other: list[str] = []
    for arg in config.args:
        (ids if arg == TEST_ID_ROOT or arg.startswith(TEST_ID_ROOT + "::") else other).append(arg)
    if other:
        raise pytest.UsageError(
            f"{other[0]}: with --target the suite runs its own items; name them by id (dw::REQUIREMENT::check, "
            "dw::machine::NAME, dw::fuzz::GROUP; pytest --target=... --collect-only -q lists them) or --requirement"
        )
    return ids


def _restart_command(raw: Any, target: str) -> str | None:
    """``--restart-command``: a shell command line whose program exists and may be run; not with the embedded
    target, which restarts itself."""
    if raw is None:
        return None
    command = str(raw)
    if target == "embedded":
        raise pytest.UsageError(
            "--restart-command: the embedded target restarts itself (kill -9, the same database); leave it out"
        )
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise pytest.UsageError(f"--restart-command={command}: not a command line ({exc})") from None
    if not words:
        raise pytest.UsageError(
            "--restart-command='': give the command that kills the server hard, starts it again on the same URL "
            "and state, and returns once it answers"
        )
    program = words[0]
    found = shutil.which(program) if os.sep not in program else (program if os.access(program, os.X_OK) else None)
    if found is None or not os.path.isfile(found):
        raise pytest.UsageError(
            f"--restart-command={command}: {program} is not an executable file (give a path or a program on PATH)"
        )
    return command


def _minor(version: str) -> str:
    major, _, minor = version.partition(".")
    if not (major == "1" and minor.isdigit() and int(minor) <= 20 and str(int(minor)) == minor):
        raise pytest.UsageError(f"--protocol-version={version}: must be 1.0 … 1.20")
    return version


def _seed() -> int:
    raw = os.environ.get(SEED_ENV)
    return secrets.randbelow(2**32) if raw is None else int(LIMITS["seed"].parse(raw))


def parse_settings(config: pytest.Config) -> RunSettings:
    """Read and check every option of the suite; raise a one-line :class:`pytest.UsageError` on the first
    bad one. Nothing here sends a request."""
    budget = Budget(
        max_wait=float(LIMITS["max_wait"].parse(_option(config, "--max-wait"))),
        machine_examples=int(LIMITS["machine_examples"].parse(_option(config, "--machine-examples"))),
        machine_steps=int(LIMITS["machine_steps"].parse(_option(config, "--machine-steps"))),
        fuzz_examples=int(LIMITS["fuzz_examples"].parse(_option(config, "--fuzz-examples"))),
    )
    requirements = list(_option(config, "--requirement") or [])
    unknown = [r for r in requirements if r not in REGISTRY]
    if unknown:
        raise pytest.UsageError(
            f"--requirement={unknown[0]}: not a requirement ID (pytest --list-requirements prints them)"
        )
    faults = _option(config, "--faults")
    if faults is not None:
        from .proxy import parse_faults

        try:
            parse_faults(str(faults))
        except ValueError as exc:
            raise pytest.UsageError(f"--faults={faults}: {exc}") from None
    fault_seed = _option(config, "--fault-seed")
    namespace = str(_option(config, "--namespace"))
    if not namespace.strip():
        raise pytest.UsageError("--namespace='': give the name of an existing namespace (default 'default')")
    _check_tokens(config)
    ids = _ids(config)
    campaign = _campaign(config)
    settings = RunSettings(
        **campaign,
        target=_target(str(_option(config, "--target"))),
        namespace=namespace.lower(),
        protocol_version=_minor(str(_option(config, "--protocol-version"))),
        report_dir=str(_option(config, "--report-dir")),
        budget=budget,
        shrink=not _option(config, "--no-machine-shrink"),
        strict=bool(_option(config, "strict", False)),
        certify=bool(_option(config, "--certify")),
        requirements=tuple(requirements),
        ids=tuple(ids),
        faults=None if faults is None else str(faults),
        fault_seed=None if fault_seed is None else int(LIMITS["fault_seed"].parse(fault_seed)),
        sign_key=_option(config, "--sign-key"),
        real_time=bool(_option(config, "--real-time", False)),
        area_order=bool(_option(config, "--area-order", False)),
        concurrency=_concurrency(_option(config, "--concurrency")),
        restart_command=_restart_command(_option(config, "--restart-command"), str(_option(config, "--target"))),
        seed=_seed(),
        narrowed_by=tuple(_selection(config, requirements, ids)),
    )
    if settings.certify:
        _refuse_for_certify(config, settings)
    elif settings.sign_key is not None:
        raise pytest.UsageError(f"--sign-key={settings.sign_key}: signing needs --certify (only a bundle is signed)")
    return settings


def _concurrency(raw: object) -> int:
    """--concurrency, or the default of :mod:`suite.overlap`."""
    from .overlap import DEFAULT_LIMIT

    return DEFAULT_LIMIT if raw is None else int(LIMITS["concurrency"].parse(raw))


def _campaign(config: pytest.Config) -> dict[str, Any]:
    """--campaign, --campaign-worker and the example database; the database is reached here (a Redis that does
    not answer is the user's to fix, before the first request to the target)."""
    from .campaign import open_store, parse_duration, parse_worker

    out: dict[str, Any] = {}
    raw = _option(config, "--campaign")
    if raw is not None:
        seconds = parse_duration(str(raw))
        if seconds is None:
            raise pytest.UsageError(f"--campaign={raw}: give a duration from 1s to 7 days, such as 20s, 10m or 2h")
        out["campaign_seconds"] = seconds
    progress = _option(config, "--campaign-progress")
    if progress is not None:
        out["campaign_progress"] = float(Limit("--campaign-progress", float, 1, 3600, "of seconds").parse(progress))
    worker = parse_worker(_option(config, "--campaign-worker"), dict(os.environ))
    if worker is None:
        raw_worker = _option(config, "--campaign-worker")
        shown = f"--campaign-worker={raw_worker}" if raw_worker is not None else "JOB_COMPLETION_INDEX"
        raise pytest.UsageError(f"{shown}: give I/N with 0 <= I < N (the worker's index and the number of workers)")
    out["campaign_worker"], out["campaign_workers"] = worker
    url = _option(config, "--example-db")
    readonly = bool(_option(config, "--example-db-readonly", False))
    if url is None and readonly:
        raise pytest.UsageError("--example-db-readonly: give the database to read with --example-db URL")
    if url is not None:
        try:
            open_store(str(url), readonly)
        except ValueError as exc:
            raise pytest.UsageError(f"--example-db={url}: {exc}") from None
        out["example_db"], out["example_db_readonly"] = str(url), readonly
    out["example_db_target"] = _option(config, "--example-db-target")
    return out


# The token options and the environment variable each defaults to.
TOKEN_OPTIONS: dict[str, str] = {
    "--worker-token": "DW_WORKER_TOKEN",
    "--operator-token": "DW_OPERATOR_TOKEN",
    "--auth-token": "DW_AUTH_TOKEN",
}


def _check_tokens(config: pytest.Config) -> None:
    """An empty token (typically a CI secret that is not set, expanded to nothing) is refused here; whether the
    target accepts a token is probed when the target is reached (suite.target.probe_credentials)."""
    for option, env in TOKEN_OPTIONS.items():
        value = _option(config, option)
        if value is not None and not str(value).strip():
            raise pytest.UsageError(
                f"{option} is empty (given as '' or through an empty {env}): pass the token, or leave both unset"
            )


def _refuse_for_certify(config: pytest.Config, settings: RunSettings) -> None:
    """A certification run checks everything, at full budget, straight to the target."""
    refused = settings.narrowing() + settings.reductions()
    if settings.faults is not None:
        refused.append(f"--faults {settings.faults}")
    if _option(config, "collectonly"):
        refused.append("--collect-only")
    if refused:
        them = "it" if len(refused) == 1 else "them"
        raise pytest.UsageError(
            f"--certify cannot run with {'; '.join(refused)}: a certification run checks every requirement at the "
            f"default budgets, straight to the target; leave {them} out, or run without --certify"
        )
    if settings.sign_key is not None:
        from .keys import load_private_key

        try:
            load_private_key(Path(settings.sign_key))
        except (OSError, ValueError) as exc:
            raise pytest.UsageError(f"--sign-key={settings.sign_key}: {exc}") from None


def probe_report_dir(path: Path) -> None:
    """Create the report directory and write a file in it, so a run cannot fail at its end for want of a place
    to write its reports."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dw-write-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise pytest.UsageError(
            f"--report-dir={path}: cannot create or write it ({reason}); pass a writable directory"
        ) from None
