"""``python -m reference_server``: run the reference server of worker protocol 1.20.

Prints the URL it serves on the first line of standard output (``--port 0`` picks a free port), so a
harness can start it as a subprocess and read where to connect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from .config import Settings

__all__ = ["build_parser", "main", "settings_from_args"]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw and raw.strip().isdigit() else default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reference_server",
        description="The reference server of the Durable Workflow worker protocol 1.20, on asyncio and SQLite. "
        "It prints the URL it serves, creates the database on first start and keeps it across restarts.",
    )
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=8080, help="Port to listen on; 0 picks a free port (default 8080).")
    p.add_argument(
        "--db",
        default="./dw.sqlite",
        help="SQLite database file; created on first start (default ./dw.sqlite).",
    )
    _add_time_options(p)
    _add_role_tokens(p)
    p.add_argument(
        "--cancellation-cleanup-seconds",
        type=int,
        default=60,
        help="How long a child asked to cancel cooperatively (parent_close_policy request_cancellation) may "
        "clean up before the server closes it (default 60).",
    )
    p.add_argument(
        "--heartbeat-interval-seconds",
        type=int,
        default=30,
        help="The worker heartbeat cadence registration and heartbeat answers ask for (heartbeat_interval_seconds, "
        "1–3600, default 30; in the test profile).",
    )
    _env_token(
        p,
        "--auth-token",
        "DW_AUTH_TOKEN",
        "Full-access bearer token",
        " Every role on both planes, beside any role tokens (docs/reference.md: Auth).",
    )
    _env_flag(
        p,
        "--auth-token-admin-beside-roles",
        "DW_AUTH_TOKEN_ADMIN_BESIDE_ROLES",
        "Upstream's rule for the full-access token: admin-only once role tokens are configured, so the "
        "worker plane answers it 403 (env DW_AUTH_TOKEN_ADMIN_BESIDE_ROLES=1). Default: full access beside them.",
    )
    _env_flag(
        p,
        "--test-clock",
        "DW_TEST_CLOCK",
        'A test build: POST /api/test/clock/advance {"seconds": s} moves the server\'s clock forward for '
        "everything time-driven (leases, timers, backoff, timeouts, long-poll holds), advertised in "
        "worker_protocol.test_profile.clock_advance (env DW_TEST_CLOCK=1). Never on a production server.",
    )
    p.add_argument("--event-log", default=None, help="Append every lifecycle transition as one JSON line to this file.")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="Deliberately break one protocol rule (for proving the conformance suite); repeatable. "
        "--fault list prints each name, its bug, the requirement IDs the suite must report, (for a bug only "
        "retried requests reveal) the suite's --faults spec and (for a bug only a multi-step history shows) the "
        "state machine that kills it and (for a bug too deep for a default run) the campaign that finds it, "
        "tab-separated.",
    )
    p.add_argument(
        "--variation",
        action="append",
        default=[],
        metavar="NAME",
        help="Take another legal choice the protocol leaves to each server (for proving the conformance suite "
        "never fails one); repeatable. --variation list prints each name, its choice and the requirement IDs it "
        "bears on, tab-separated.",
    )
    p.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING).")
    return p


def _env_seconds(p: argparse.ArgumentParser, flag: str, env: str, default: int, what: str, more: str = "") -> None:
    """A whole number of seconds whose default the environment variable ``env`` may override."""
    p.add_argument(flag, type=int, default=_env_int(env, default), help=f"{what} (default {default}, env {env}).{more}")


def _env_token(p: argparse.ArgumentParser, flag: str, env: str, what: str, more: str = "") -> None:
    """A bearer token, by default the environment variable ``env``."""
    p.add_argument(flag, default=os.environ.get(env), help=f"{what} (env {env}).{more}")


def _env_flag(p: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """An on/off option, on by default when the environment variable ``env`` is set to anything but 0 or false."""
    p.add_argument(flag, action="store_true", default=os.environ.get(env, "") not in ("", "0", "false"), help=help)


def _add_time_options(p: argparse.ArgumentParser) -> None:
    """Lease lengths, query timeout, long-poll holds and the admission limit."""
    _env_seconds(
        p,
        "--lease-seconds",
        "DW_V2_WORKFLOW_TASK_LEASE_SECONDS",
        300,
        "Workflow-task lease length in seconds",
        " Short leases let a conformance run cover lease expiry and redelivery.",
    )
    _env_seconds(
        p, "--activity-lease-seconds", "DW_ACTIVITY_TASK_LEASE_SECONDS", 300, "Activity-task lease length in seconds"
    )
    _env_seconds(
        p,
        "--query-timeout",
        "DW_QUERY_TASK_TIMEOUT",
        30,
        "How long a control-plane query waits for a worker's answer before 504 query_worker_timeout",
    )
    _env_seconds(p, "--query-lease-seconds", "DW_QUERY_TASK_LEASE_TIMEOUT", 60, "Query-task lease length in seconds")
    _env_seconds(
        p,
        "--long-poll-default",
        "DW_WORKER_POLL_TIMEOUT",
        30,
        "Long-poll hold when a poll sends no timeout_seconds",
    )
    p.add_argument(
        "--long-poll-max",
        type=int,
        default=60,
        help="Longest long-poll hold in seconds: larger timeout_seconds are clamped to it (default 60, the "
        "protocol maximum; a shorter clamp is advertised in the test profile).",
    )
    p.add_argument(
        "--max-active-leases-per-queue",
        type=int,
        default=None,
        help="Admission limit: with this many live leases on a queue, further polls answer "
        "poll_status 'throttled' (default: no limit).",
    )


def _add_role_tokens(p: argparse.ArgumentParser) -> None:
    """One bearer token per role (§4.1); none at all means no auth."""
    _env_token(
        p, "--worker-token", "DW_WORKER_TOKEN", "Bearer token of the worker role", " No tokens at all = no auth."
    )
    _env_token(p, "--operator-token", "DW_OPERATOR_TOKEN", "Bearer token of the operator role")
    _env_token(p, "--admin-token", "DW_ADMIN_TOKEN", "Bearer token of the admin role")


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        db_path=args.db,
        lease_seconds=args.lease_seconds,
        activity_lease_seconds=args.activity_lease_seconds,
        query_timeout_seconds=args.query_timeout,
        query_lease_seconds=args.query_lease_seconds,
        long_poll_default_seconds=min(args.long_poll_default, args.long_poll_max),
        long_poll_max_seconds=max(1, min(60, args.long_poll_max)),
        max_active_leases_per_queue=args.max_active_leases_per_queue,
        worker_token=args.worker_token or None,
        operator_token=args.operator_token or None,
        admin_token=args.admin_token or None,
        auth_token=args.auth_token or None,
        auth_token_admin_beside_roles=bool(args.auth_token_admin_beside_roles),
        cancellation_cleanup_seconds=max(1, args.cancellation_cleanup_seconds),
        heartbeat_interval_seconds=min(3600, max(1, args.heartbeat_interval_seconds)),
        event_log=args.event_log,
        test_clock=bool(args.test_clock),
    )


async def _serve(settings: Settings, host: str, port: int) -> None:
    from .server import Server

    server = Server(settings)
    url = await server.start(host, port)
    print(url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if "list" in args.fault:
        from .faults import FAULTS

        # One line per fault: name, the bug, the requirement IDs the suite must report (comma-separated), for a
        # fault only a faulty network reveals the suite's --faults spec that kills it, and for one only a
        # multi-step history shows the state machine that kills it, and the campaign that finds a deeper one (empty
        # columns when none applies).
        for name, spec in sorted(FAULTS.items()):
            extra = (
                f"\t{spec.proxy or ''}\t{spec.machine}" if spec.machine else (f"\t{spec.proxy}" if spec.proxy else "")
            )
            if spec.campaign:  # and one too deep for a default run: how long a campaign of its machine finds it
                extra += f"\t{spec.campaign}"
            print(f"{name}\t{spec.description}\t{','.join(spec.kills)}{extra}")
        return 0
    if "list" in args.variation:
        from .variations import VARIATIONS

        for name, variation in sorted(VARIATIONS.items()):
            print(f"{name}\t{variation.description}\t{','.join(variation.bears_on)}")
        return 0
    settings = settings_from_args(args)
    if args.variation:
        from .variations import VARIATIONS
        from .variations import install as vary

        unknown = sorted(set(args.variation) - VARIATIONS.keys())
        if unknown:
            print(f"unknown --variation {', '.join(unknown)}; --variation list prints the names", file=sys.stderr)
            return 2
        vary(args.variation)  # before the server is built, as the faults below
    if args.fault:
        # The faults layer is imported only when asked for: a server started without faults runs the spec alone.
        from .faults import FAULTS, install

        unknown = sorted(set(args.fault) - FAULTS.keys())
        if unknown:
            print(f"unknown --fault {', '.join(unknown)}; --fault list prints the names", file=sys.stderr)
            return 2
        install(args.fault)  # before the server is built: its routes are bound when it mounts them
    asyncio.run(_serve(settings, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
