"""Workflow-task poll → complete throughput of the reference server over loopback, beside a minimal server.

Starts ``python -m reference_server`` (and ``bench/minimal_server.py``, the same stack without the protocol's
rules) as a subprocess on a fresh database, registers ``--concurrency`` workers
on one task queue, starts ``--cycles`` workflows, then lets the workers loop ``poll → complete_workflow`` over
HTTP/1.1 keep-alive connections (httpx) until every run is completed. A *cycle* is one leased workflow task
and its accepted completion: two HTTP requests and two committed SQLite transactions (the claim, which also
records the worker's liveness, and the completion), each fsynced (``PRAGMA synchronous=FULL``).

The minimal server does the same cycle in the same two transactions, with no validation, lifecycle tables or
fencing beyond the conditional update; by default (``--minimal-answers protocol``) it answers as the protocol says
— the envelope with the reference server's capabilities, the run's history inline, the whole task object — so the
ratio weighs the reference server's rules and not the size of the protocol's answers; ``--minimal-answers bare``
answers with the few fields the workload reads and keeps no history (the yardstick of runs B1–B12 and 1–36 in
bench/RESULTS.md). With ``--server both`` (the default) the two servers run at once, each on a
fresh database, and each one's ``--cycles`` (default 4000) are run in ``--blocks`` blocks (default 20) taken
alternately — reference, minimal, minimal, reference, … — for every concurrency in ``--concurrency``; the ratio
of each pair of blocks, measured a second apart, is printed with their median and quartiles. ``--blocks 0``
measures in rounds instead: a fresh server for each of ``--rounds`` measurements of ``--cycles`` (default 2000)
per server, alternating, with the median cycles per second of each and their ratio.

Prints a one-line summary per measurement, then one JSON line. Each measurement is bounded in work
(``--cycles``) and in time (``--max-seconds``): at the deadline a round stops and reports what it measured, and
a block stops the run (exit 2). Examples::

    python bench/poll_complete.py                        # both servers, interleaved blocks, 1 and 8 workers
    python bench/poll_complete.py --blocks 0 --rounds 3  # both servers, a fresh pair of servers per round

Speed is measured here, never asserted in tests (tests/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from suite.processes import read_url, stop_process

ROOT = Path(__file__).resolve().parent.parent
WORKER_HEADERS = {"X-Durable-Workflow-Protocol-Version": "1.20"}
CONTROL_HEADERS = {"X-Durable-Workflow-Control-Plane-Version": "2"}
QUEUE = "bench"
RESULT_BLOB = "wwHioz3/VYAiNwoIZG9uZQ=="  # suite.protocol.codec.encode_blob("done"): an Avro Value frame


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers, comma-separated (e.g. 1,8)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Measure poll→complete cycles per second against the reference server.")
    p.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="Cycles per server: per round (default 2000), or split into the blocks (default 4000: 20 blocks of 200).",
    )
    p.add_argument(
        "--concurrency",
        type=_positive_ints,
        default=[1, 8],
        help="Concurrent workers, one connection each; a comma list measures each (default 1,8).",
    )
    p.add_argument(
        "--server",
        choices=("reference", "minimal", "both"),
        default="both",
        help="Which server to measure; 'both' alternates them in one run and prints the ratio (default both).",
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="With --blocks 0: measurements per server and concurrency (default 3)."
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="With --server both: both servers run at once and each one's --cycles are split into this many blocks, "
        "run alternately (reference, minimal, minimal, reference, …); 0 measures in --rounds instead (default 20).",
    )
    p.add_argument("--lease-seconds", type=int, default=30, help="Workflow-task lease of the server (default 30).")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="A round stops after this long at most and reports what it measured; a block that takes longer stops "
        "the run (default 120).",
    )
    p.add_argument("--db", default=None, help="Database file (default: a fresh file in a temporary directory).")
    p.add_argument(
        "--minimal-burn-ms",
        type=float,
        default=0.0,
        help="Calibration only: the minimal server spends this many ms of CPU in each poll that leases and each "
        "completion, to show how the ratio answers to a costlier handler; never a figure (default 0).",
    )
    p.add_argument(
        "--minimal-answers",
        choices=("protocol", "bare"),
        default="protocol",
        help="'protocol': the minimal server answers with what the protocol puts in each answer (the envelope with "
        "the reference server's capabilities, the run's history, the whole task object), still with none of its "
        "rules; 'bare': with the few fields the workload reads, and it keeps no history (default protocol).",
    )
    p.set_defaults(capabilities=None)  # the copied capabilities' file: main() fills it in (protocol_capabilities)
    args = p.parse_args(argv)
    if not 0 <= args.minimal_burn_ms < math.inf:  # NaN fails this too
        p.error("--minimal-burn-ms must be a finite number >= 0")
    if args.minimal_burn_ms and args.server == "reference":
        p.error("--minimal-burn-ms changes the minimal server, which --server reference does not run")
    if args.blocks is None:
        args.blocks = 20 if args.server == "both" and args.db is None else 0
    if args.cycles is None:
        args.cycles = 4000 if args.blocks else 2000
    if args.cycles < 1 or args.rounds < 1 or args.lease_seconds < 1 or args.max_seconds <= 0:
        p.error("--cycles, --rounds and --lease-seconds must be >= 1 and --max-seconds > 0")
    if args.blocks:
        if not 2 <= args.blocks <= args.cycles:
            p.error("--blocks must be 0 (rounds) or from 2 to --cycles")
        if args.server != "both" or args.db is not None:
            p.error("--blocks measures both servers, each on a fresh database: drop --server and --db")
    return args


class BenchError(Exception):
    """The server answered something a benchmark run cannot continue from."""


# -- the server -------------------------------------------------------------------------------------------------


def start_server(
    db: Path,
    lease_seconds: int,
    kind: str = "reference",
    timeout: float = 30.0,
    burn_ms: float = 0.0,
    capabilities: Path | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """Start a server of ``kind``; for the minimal one, ``capabilities`` (a JSON file) asks for protocol answers."""
    if kind == "minimal":
        cmd = [sys.executable, str(ROOT / "bench" / "minimal_server.py"), "--port", "0", "--db", str(db)]
        cmd += ["--burn-ms", str(burn_ms)] if burn_ms else []
        cmd += ["--protocol-answers", str(capabilities)] if capabilities is not None else []
    else:
        cmd = [sys.executable, "-m", "reference_server", "--port", "0", "--db", str(db)]
        cmd += ["--lease-seconds", str(lease_seconds), "--long-poll-default", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
    url = read_url(proc, timeout)
    if url is not None:
        return proc, url
    proc.kill()
    proc.wait()
    raise BenchError(f"the reference server did not start: {' '.join(cmd)}")


def stop_server(proc: subprocess.Popen[str]) -> None:
    stop_process(proc)


def advertised_capabilities(url: str) -> dict[str, Any]:
    """The ``server_capabilities`` the server at ``url`` advertises (``GET /api/cluster/info``)."""
    response = httpx.get(f"{url}/api/cluster/info", timeout=30.0)
    capabilities = response.json()["worker_protocol"]["server_capabilities"] if response.status_code == 200 else None
    if not isinstance(capabilities, dict):
        raise BenchError(f"the reference server's cluster info has no capabilities: {response.status_code}")
    return capabilities


def protocol_capabilities(args: argparse.Namespace, directory: Path) -> Path | None:
    """For a minimal server with protocol answers: the reference server's capabilities, read from one started for
    that alone, in a JSON file in ``directory`` (``None`` when no minimal server answers so)."""
    if args.minimal_answers != "protocol" or args.server == "reference":
        return None
    proc, url = start_server(directory / "capabilities.sqlite", args.lease_seconds)
    try:
        capabilities = advertised_capabilities(url)
    finally:
        stop_server(proc)
    path = directory / "capabilities.json"
    path.write_text(json.dumps(capabilities), encoding="utf-8")
    return path


# -- the workload -----------------------------------------------------------------------------------------------


@dataclass
class Tally:
    target: int
    completed: int = 0
    empty_polls: int = 0
    rejected: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds from poll sent to completion acknowledged
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    response = await client.post(path, json=body, headers=headers)
    if response.status_code >= 500:
        raise BenchError(f"server error {response.status_code} on {path}: {response.text[:300]}")
    return response.status_code, response.json()


async def start_workflows(url: str, count: int, concurrency: int) -> float:
    """Start ``count`` runs with ``concurrency`` clients; returns the seconds it took."""
    ids = iter(range(count))
    began = time.perf_counter()

    async def starter() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            for i in ids:
                body = {"workflow_type": "bench", "workflow_id": f"bench-{i}", "task_queue": QUEUE, "input": []}
                status, doc = await post(client, "/api/workflows", body, CONTROL_HEADERS)
                if status != 201:
                    raise BenchError(f"start failed: {status} {doc.get('reason')}")

    await asyncio.gather(*(starter() for _ in range(concurrency)))
    return time.perf_counter() - began


async def register(url: str, worker_id: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        body = {"worker_id": worker_id, "task_queue": QUEUE, "runtime": "python"}
        status, doc = await post(client, "/api/worker/register", body, WORKER_HEADERS)
        if status != 201:
            raise BenchError(f"register failed: {status} {doc.get('reason')}")


async def worker(url: str, worker_id: str, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        await work(client, worker_id, tally)


async def work(client: httpx.AsyncClient, worker_id: str, tally: Tally) -> None:
    """Loop poll → complete on ``client`` until ``tally`` is done (the cycle in flight is finished first)."""
    poll = {"worker_id": worker_id, "task_queue": QUEUE, "timeout_seconds": 1}
    while not tally.done.is_set():
        sent = time.perf_counter()
        status, doc = await post(client, "/api/worker/workflow-tasks/poll", poll, WORKER_HEADERS)
        task = doc.get("task") if status == 200 else None
        if task is None:
            tally.empty_polls += 1
            continue
        body = {
            "lease_owner": worker_id,
            "workflow_task_attempt": task["workflow_task_attempt"],
            "commands": [{"type": "complete_workflow", "result": RESULT_BLOB}],
        }
        status, doc = await post(client, f"/api/worker/workflow-tasks/{task['task_id']}/complete", body, WORKER_HEADERS)
        if status != 200:
            tally.rejected += 1  # e.g. the lease ran out under load; the task is redelivered
            continue
        tally.latencies.append(time.perf_counter() - sent)
        tally.completed += 1
        if tally.completed >= tally.target:
            tally.done.set()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process ``pid`` has used so far (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, in clock ticks


async def measure(url: str, args: argparse.Namespace, concurrency: int, pid: int) -> dict[str, Any]:
    names = [f"bench-w{i}" for i in range(concurrency)]
    await asyncio.gather(*(register(url, name) for name in names))
    start_seconds = await start_workflows(url, args.cycles, concurrency)
    tally = Tally(target=args.cycles)
    cpu_before = cpu_seconds(pid)
    client_before = time.process_time()
    began = time.perf_counter()
    workers = [asyncio.create_task(worker(url, name, tally)) for name in names]
    all_done = asyncio.create_task(tally.done.wait())
    finished, _ = await asyncio.wait(
        [all_done, *workers], timeout=args.max_seconds, return_when=asyncio.FIRST_COMPLETED
    )
    elapsed = time.perf_counter() - began
    cpu_after = cpu_seconds(pid)
    client_cpu = time.process_time() - client_before
    timed_out = not finished
    tally.done.set()
    # Each worker stops after its current poll (at most ~1 s); a worker's error is raised here.
    await asyncio.gather(*workers, all_done)
    ms = sorted(x * 1000 for x in tally.latencies) or [0.0]
    return {
        "benchmark": "poll_complete",
        "cycles": tally.completed,
        "cycles_requested": args.cycles,
        "concurrency": concurrency,
        "lease_seconds": args.lease_seconds,
        "seconds": round(elapsed, 3),
        "cycles_per_second": round(tally.completed / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms": {
            "p50": round(statistics.median(ms), 2),
            "p95": round(ms[min(len(ms) - 1, int(len(ms) * 0.95))], 2),
            "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max": round(ms[-1], 2),
        },
        # The server's CPU time per cycle does not depend on how busy the rest of the machine is (unlike cycles/s).
        "server_cpu_ms_per_cycle": (
            round(1000 * (cpu_after - cpu_before) / tally.completed, 3)
            if cpu_before is not None and cpu_after is not None and tally.completed
            else None
        ),
        # The workers' own CPU per cycle (this process): with one worker it is on every cycle's path.
        "client_cpu_ms_per_cycle": round(1000 * client_cpu / tally.completed, 3) if tally.completed else None,
        "starts_per_second": round(args.cycles / start_seconds, 1) if start_seconds > 0 else 0.0,
        "empty_polls": tally.empty_polls,
        "rejected_completes": tally.rejected,
        "timed_out": timed_out,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
        },
    }


def measure_one(kind: str, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: a fresh server of ``kind`` on a fresh database, the whole workload, then stopped."""
    with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "bench.sqlite"
        proc, url = start_server(
            db, args.lease_seconds, kind, burn_ms=args.minimal_burn_ms, capabilities=args.capabilities
        )
        try:
            result = asyncio.run(measure(url, args, concurrency, proc.pid))
        finally:
            stop_server(proc)
    result["server"] = kind
    latency = result["latency_ms"]
    print(
        f"{kind:>9} poll→complete: {result['cycles']} cycles in {result['seconds']} s = "
        f"{result['cycles_per_second']} cycles/s with {concurrency} workers (p50 {latency['p50']} ms, p99 "
        f"{latency['p99']} ms per cycle; CPU per cycle: server {result['server_cpu_ms_per_cycle']} ms, client "
        f"{result['client_cpu_ms_per_cycle']} ms; "
        f"starts {result['starts_per_second']}/s)"
        f"{' — stopped at --max-seconds' if result['timed_out'] else ''}",
        flush=True,
    )
    return result


@dataclass
class Block:
    """One block of an interleaved measurement: ``cycles`` cycles of one server, back to back with the other's."""

    server: str
    cycles: int
    seconds: float
    server_cpu: float | None
    client_cpu: float
    empty_polls: int
    rejected: int


async def _block(
    server: str, clients: Sequence[httpx.AsyncClient], names: Sequence[str], cycles: int, pid: int, limit: float
) -> Block:
    tally = Tally(target=cycles)
    cpu_before = cpu_seconds(pid)
    client_before = time.process_time()
    began = time.perf_counter()
    workers = [asyncio.create_task(work(client, name, tally)) for client, name in zip(clients, names, strict=True)]
    try:
        # Each worker finishes the cycle it is in, so a block with several workers may end a few cycles over.
        async with asyncio.timeout(limit):
            await asyncio.gather(*workers)
    except TimeoutError:
        raise BenchError(f"a block of {cycles} cycles of the {server} server took over {limit:g} s") from None
    seconds = time.perf_counter() - began
    cpu_after = cpu_seconds(pid)
    server_cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    client_cpu = time.process_time() - client_before
    return Block(server, tally.completed, seconds, server_cpu, client_cpu, tally.empty_polls, tally.rejected)


async def _interleave(
    urls: dict[str, str], pids: dict[str, int], args: argparse.Namespace, concurrency: int
) -> list[Block]:
    names = [f"bench-w{i}" for i in range(concurrency)]
    per_block = args.cycles // args.blocks
    for url in urls.values():
        await asyncio.gather(*(register(url, name) for name in names))
        # A block may end up to concurrency - 1 cycles over, so no block ever waits on an empty queue.
        await start_workflows(url, per_block * args.blocks + concurrency * args.blocks, concurrency)
    clients = {kind: [httpx.AsyncClient(base_url=url, timeout=30.0) for _ in names] for kind, url in urls.items()}
    blocks: list[Block] = []
    try:
        for i in range(args.blocks):
            # reference, minimal, then minimal, reference: a drift of the machine's speed meets both alike.
            order = ("reference", "minimal") if i % 2 == 0 else ("minimal", "reference")
            for kind in order:
                blocks.append(await _block(kind, clients[kind], names, per_block, pids[kind], args.max_seconds))
    finally:
        for mine in clients.values():
            await asyncio.gather(*(client.aclose() for client in mine))
    return blocks


def measure_interleaved(concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both servers at once, each on a fresh database, measured in alternating blocks; their ratios block by block."""
    with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmp:
        procs: dict[str, subprocess.Popen[str]] = {}
        urls: dict[str, str] = {}
        try:
            for kind in ("reference", "minimal"):
                db = Path(tmp) / f"{kind}.sqlite"
                procs[kind], urls[kind] = start_server(
                    db, args.lease_seconds, kind, burn_ms=args.minimal_burn_ms, capabilities=args.capabilities
                )
            blocks = asyncio.run(_interleave(urls, {k: p.pid for k, p in procs.items()}, args, concurrency))
        finally:
            for proc in procs.values():
                stop_server(proc)
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "blocks": args.blocks,
        "minimal_burn_ms": args.minimal_burn_ms,
        "minimal_answers": args.minimal_answers,
    }
    by_server = {kind: [b for b in blocks if b.server == kind] for kind in ("reference", "minimal")}
    for kind, mine in by_server.items():
        cycles = sum(b.cycles for b in mine)
        row[f"{kind}_cycles"] = cycles
        row[kind] = round(cycles / sum(b.seconds for b in mine), 1)
        cpu = [b.server_cpu for b in mine]
        row[f"{kind}_server_cpu_ms_per_cycle"] = (
            round(1000 * sum(c for c in cpu if c is not None) / cycles, 3) if None not in cpu else None
        )
        row[f"{kind}_client_cpu_ms_per_cycle"] = round(1000 * sum(b.client_cpu for b in mine) / cycles, 3)
        row[f"{kind}_empty_polls"] = sum(b.empty_polls for b in mine)
        row[f"{kind}_rejected_completes"] = sum(b.rejected for b in mine)
    row["ratio"] = round(row["reference"] / row["minimal"], 3)
    # Block i of each server, measured next to each other: the machine's state between them hardly changes.
    pairs = [
        round((a.cycles / a.seconds) / (b.cycles / b.seconds), 3)
        for a, b in zip(by_server["reference"], by_server["minimal"], strict=True)
    ]
    row["block_ratios"] = pairs
    row["block_ratio_median"] = round(statistics.median(pairs), 3)
    quartiles = statistics.quantiles(pairs, n=4)  # --blocks is at least 2
    row["block_ratio_quartiles"] = [round(quartiles[0], 3), round(quartiles[2], 3)]
    print(
        f"{concurrency} workers, {args.blocks} blocks of {args.cycles // args.blocks} cycles each, interleaved: "
        f"reference {row['reference']} / {_minimal_label(args)} {row['minimal']} cycles/s = {row['ratio']:.2f} × "
        f"(CPU per cycle: server {row['reference_server_cpu_ms_per_cycle']} / "
        f"{row['minimal_server_cpu_ms_per_cycle']} ms, client {row['reference_client_cpu_ms_per_cycle']} / "
        f"{row['minimal_client_cpu_ms_per_cycle']} ms); block by block median {row['block_ratio_median']:.2f} × "
        f"(quartiles {row['block_ratio_quartiles'][0]:.2f}–{row['block_ratio_quartiles'][1]:.2f})",
        flush=True,
    )
    return row


def _minimal_label(args: argparse.Namespace) -> str:
    """The minimal server's name in a summary line: with protocol answers when it gives them, and its calibration
    burn when there is one (a calibrated run must not read as a measurement)."""
    notes = ["protocol answers"] if args.minimal_answers == "protocol" else []
    if args.minimal_burn_ms:
        notes.append(f"+{args.minimal_burn_ms:g} ms CPU per request, calibration")
    return f"minimal ({', '.join(notes)})" if notes else "minimal"


def pair_ratios(runs: Sequence[dict[str, Any]], concurrency: int) -> list[float]:
    """Reference / minimal cycles per second of each round (the two servers measured back to back), in order."""
    mine = [r for r in runs if r["concurrency"] == concurrency]
    reference = [r["cycles_per_second"] for r in mine if r["server"] == "reference"]
    minimal = [r["cycles_per_second"] for r in mine if r["server"] == "minimal"]
    return [round(a / b, 3) for a, b in zip(reference, minimal, strict=True) if b > 0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dw-bench-capabilities-") as tmp:
        try:
            args.capabilities = protocol_capabilities(args, Path(tmp))
        except BenchError as exc:
            print(f"poll_complete: {exc}", file=sys.stderr)
            return 2
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    kinds = ["reference", "minimal"] if args.server == "both" else [args.server]
    runs: list[dict[str, Any]] = []
    if args.blocks:
        try:
            rows = [measure_interleaved(concurrency, args) for concurrency in args.concurrency]
        except BenchError as exc:
            print(f"poll_complete: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"benchmark": "poll_complete", "interleaved": rows}, separators=(",", ":")))
        return 0
    try:
        # Alternate the servers round by round, so a change in the machine's load meets both alike.
        for concurrency in args.concurrency:
            for _ in range(args.rounds):
                runs.extend(measure_one(kind, concurrency, args) for kind in kinds)
    except BenchError as exc:
        print(f"poll_complete: {exc}", file=sys.stderr)
        return 2
    summary: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        row: dict[str, Any] = {
            "concurrency": concurrency,
            "minimal_burn_ms": args.minimal_burn_ms,
            "minimal_answers": args.minimal_answers,
        }
        for kind in kinds:
            mine = [r for r in runs if r["server"] == kind and r["concurrency"] == concurrency]
            row[kind] = round(statistics.median(r["cycles_per_second"] for r in mine), 1)
            for side in ("server", "client"):
                cpu = [r[f"{side}_cpu_ms_per_cycle"] for r in mine if r[f"{side}_cpu_ms_per_cycle"] is not None]
                row[f"{kind}_{side}_cpu_ms_per_cycle"] = round(statistics.median(cpu), 3) if cpu else None
        if len(kinds) == 2 and row["minimal"] > 0:
            row["ratio"] = round(row["reference"] / row["minimal"], 3)
            # Each round measured the two servers back to back, so a change in the machine's load between rounds
            # moves no round's ratio; one slow round of one server moves its own round's ratio, which the median
            # of the rounds sets aside, but it can move the ratio of the medians (run 30 in bench/RESULTS.md).
            pairs = pair_ratios(runs, concurrency)
            row["pair_ratios"] = pairs
            row["pair_ratio_median"] = round(statistics.median(pairs), 3) if pairs else None
            print(
                f"{concurrency} workers: reference {row['reference']} / {_minimal_label(args)} {row['minimal']} "
                f"cycles/s (medians of {args.rounds}) = {row['ratio']:.2f} × (CPU per cycle: server "
                f"{row['reference_server_cpu_ms_per_cycle']} / {row['minimal_server_cpu_ms_per_cycle']} ms, client "
                f"{row['reference_client_cpu_ms_per_cycle']} / {row['minimal_client_cpu_ms_per_cycle']} ms); "
                f"round by round {', '.join(f'{r:.2f}' for r in pairs)} × (median {row['pair_ratio_median']:.2f} ×)"
            )
        summary.append(row)
    print(json.dumps({"benchmark": "poll_complete", "summary": summary, "runs": runs}, separators=(",", ":")))
    return 1 if any(r["timed_out"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
