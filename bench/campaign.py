"""A campaign of N identical workers sharing one Redis, then (optionally) CI-style read-only runs replaying what
it stored: the figures of docs/campaigns.md.

    python bench/campaign.py --workers 2 --duration 10m                       # each worker its embedded server
    python bench/campaign.py --workers 2 --duration 10m --servers per-worker \\
        --fault third-attempt-takes-previous --ci --fixed                     # find, store, replay read-only
    python bench/campaign.py --workers 2 --duration 10m --servers shared      # one server in real time

Servers: ``embedded`` (each worker ``--target=embedded``: the reference server on its test clock, the default),
``per-worker`` (a reference server per worker, with the embedded target's options and ``--fault``, on its test
clock, restarted by its worker's restart checks: as a CI matrix whose jobs each start the server under test),
``shared`` (one reference server for all workers, in real time: two workers cannot share a test clock, and no
worker may restart a server another one uses, so the restart checks are not covered).
A redis-server of its own runs on a Unix socket in a temporary directory unless ``--redis URL`` names one.
``--ci``: then a default run (the whole suite, whatever the campaign selected) with ``--example-db-readonly``
against a server of the same kind (a fresh one, with ``--fault``); ``--fixed``: the same against a server
without the fault. Prints one JSON line per run (exit code, verdict, the campaign's statistics; for the
read-only runs, the seconds to their first replay line and to their first failed machine); ``--out FILE``
writes them all as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from suite.processes import read_url, start_redis, stop_process, stop_restarted, write_restart_spec  # noqa: E402
from suite.target import EMBEDDED_ARGS, REAL_TIME_ARGS  # noqa: E402

servers: dict[int, str] = {}  # the pid of each server started, to its name


def start_server(
    folder: Path, name: str, args: tuple[str, ...], fault: str | None
) -> tuple[subprocess.Popen[str], str, list[str], list[str]]:
    """A reference server on a port of its own, with auth on (role and full-access tokens, as the embedded target
    has); its URL, the suite's token options, and the suite's option that restarts it hard (same port and
    database), for a run that alone uses it."""
    tokens = {role: secrets.token_urlsafe(18) for role in ("worker", "operator", "admin", "auth")}
    cmd = [sys.executable, "-m", "reference_server", "--port", "0", "--db", str(folder / f"{name}.sqlite"), *args]
    cmd += [f"--{role}-token={token}" for role, token in tokens.items()]
    if fault:
        cmd += ["--fault", fault]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    url = read_url(proc, 30)
    if url is None:
        proc.kill()
        raise SystemExit(f"the reference server did not start: {' '.join(cmd[:8])} …")
    servers[proc.pid] = name
    port = url.rsplit(":", 1)[1].split("/")[0]
    again = [port if i > 0 and cmd[i - 1] == "--port" else a for i, a in enumerate(cmd)]
    log = str(folder / f"{name}.server.log")
    restart = write_restart_spec(folder / f"{name}.restart.json", command=again, url=url, pid=proc.pid, log=log)
    auth = [f"--{role}-token={tokens[role]}" for role in ("worker", "operator", "auth")]
    return proc, url, auth, ["--restart-command", restart]


def suite_cmd(target: str, report: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", f"--target={target}", f"--report-dir={report}", "-p", "no:cacheprovider"]


def summary(name: str, rc: int, report: Path, seconds: float, marks: dict[str, float] | None = None) -> dict[str, Any]:
    found = sorted(report.glob("*/results.json"))
    doc: dict[str, Any] = {"run": name, "exit": rc, "seconds": round(seconds, 1)}
    doc.update({k: round(v, 1) for k, v in (marks or {}).items()})
    if found:
        results = json.loads(found[-1].read_text(encoding="utf-8"))
        doc["verdict"] = results["summary"]["verdict"]
        doc["failed"] = sorted({r for c in results["checks"] if c["verdict"] == "failed" for r in c["requirements"]})
        campaign = results.get("campaign") or {}
        doc["campaign"] = {k: v for k, v in campaign.items() if k != "machines"}
        doc["machines"] = {
            m: {k: s.get(k) for k in ("rounds", "examples", "requests", "seconds", "stored", "still_failing")}
            for m, s in campaign.get("machines", {}).items()
        }
    return doc


def read_only(run: str, target: str, folder: Path, db: list[str]) -> dict[str, Any]:
    """A default run against ``target`` replaying the database read-only; when its first replay line and its
    first failed machine came, in seconds from its start."""
    report = folder / run
    cmd = [*suite_cmd(target, report), *db, "--example-db-readonly"]
    began = time.monotonic()
    marks: dict[str, float] = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder) as proc:
        assert proc.stdout is not None
        with (folder / f"{run}.log").open("w") as log:
            for line in proc.stdout:
                log.write(line)
                if "replaying a stored failure" in line:
                    marks.setdefault("first_replay_line_seconds", time.monotonic() - began)
                if line.startswith("[dw] machine ") and " failed" in line:
                    marks.setdefault("first_failed_machine_seconds", time.monotonic() - began)
        rc = proc.wait()
    return summary(f"{run} (read only)", rc, report, time.monotonic() - began, marks)


def serve(
    folder: Path, name: str, args: tuple[str, ...], fault: str | None, procs: list[Any], restart: bool = True
) -> tuple[str, list[str]]:
    """A reference server (kept in ``procs`` to stop): its URL and the suite's options for it."""
    proc, target, auth, again = start_server(folder, name, args, fault)
    procs.append(proc)
    return target, [*auth, *(again if restart else [])]


def worker_targets(opts: argparse.Namespace, folder: Path, procs: list[Any]) -> list[tuple[str, list[str]]]:
    """Each worker's target and its options."""
    if opts.servers == "embedded":
        if opts.fault:
            raise SystemExit("--fault needs --servers per-worker or shared")
        return [("embedded", [])] * opts.workers
    if opts.servers == "shared":  # nobody may restart a server another worker uses
        return [serve(folder, "shared", REAL_TIME_ARGS, opts.fault, procs, restart=False)] * opts.workers
    return [serve(folder, f"server{i}", EMBEDDED_ARGS, opts.fault, procs) for i in range(opts.workers)]


def run_workers(
    opts: argparse.Namespace, folder: Path, targets: list[tuple[str, list[str]]], db: list[str]
) -> list[dict[str, Any]]:
    """The campaign: every worker at once, each its own index; their summaries."""
    runs = []
    started = time.monotonic()
    for i, (target, options) in enumerate(targets):
        report = folder / f"worker{i}"
        cmd = [
            *suite_cmd(target, report),
            *("--campaign", opts.duration, "--campaign-worker", f"{i}/{opts.workers}"),
            *options,
            *db,
            *opts.selection,
        ]
        log = (folder / f"worker{i}.log").open("w")
        runs.append((i, report, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder), log))
    rows = []
    for i, report, worker, log in runs:
        rc = worker.wait()
        log.close()
        rows.append(summary(f"worker {i}", rc, report, time.monotonic() - started))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--duration", default="10m")
    parser.add_argument("--servers", choices=["embedded", "per-worker", "shared"], default="embedded")
    parser.add_argument("--fault", default=None)
    parser.add_argument("--redis", default=None, help="a Redis of your own (default: one started here)")
    parser.add_argument("--name", default="bench-target", help="--example-db-target of every run")
    parser.add_argument("--ci", action="store_true", help="then a read-only default run (a server with --fault)")
    parser.add_argument("--fixed", action="store_true", help="then a read-only default run, a server without it")
    parser.add_argument("--out", default=None)
    parser.add_argument("selection", nargs="*", help="pytest selection (e.g. dw::machine::workflow_leases)")
    opts = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dw-campaign-"))
    procs: list[subprocess.Popen[Any]] = []
    redis_proc = None
    rows: list[dict[str, Any]] = []
    try:
        url = opts.redis
        if url is None:
            try:
                redis_proc, url = start_redis(folder)
            except RuntimeError as exc:
                raise SystemExit(str(exc)) from None
        db = ["--example-db", url, "--example-db-target", opts.name]
        rows += run_workers(opts, folder, worker_targets(opts, folder, procs), db)
        for run, fault in (("ci", opts.fault), ("fixed", None)):
            if not getattr(opts, run):
                continue
            target, options = "embedded", list[str]()
            if opts.servers != "embedded":
                per_worker = opts.servers == "per-worker"
                args = EMBEDDED_ARGS if per_worker else REAL_TIME_ARGS
                target, options = serve(folder, run, args, fault, procs, restart=per_worker)
            rows.append(read_only(run, target, folder, [*options, *db]))
            print(json.dumps(rows[-1]), flush=True)
        print(f"logs and reports: {folder}", flush=True)
    finally:
        for proc in procs:
            stop_process(proc)
        for proc in procs:  # a restart check may have started a server again, detached
            stop_restarted(folder / f"{servers[proc.pid]}.restart.json", unless=proc.pid)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
    if opts.out:
        Path(opts.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.pop("PYTEST_XDIST_WORKER", None)
    sys.exit(main())
