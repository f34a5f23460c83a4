"""Wall time of a whole conformance run, for two or more installations side by side.

    python bench/suite_run.py --python /path/to/other/.venv/bin/python --python .venv/bin/python
    python bench/suite_run.py --python .venv/bin/python --args="--target=embedded" --rounds 1
    python bench/suite_run.py --python old/.venv/bin/python --args="--target=embedded -n 2" \
        --python .venv/bin/python --args="--target=embedded --real-time -n 2"

Each installation (its interpreter, with its suite and reference server) runs
``pytest <args> -p no:cacheprovider -q`` from an empty directory, so no project configuration applies; the
installations take turns, ``--rounds`` times, so a change in the machine's load meets them alike. One ``--args``
applies to every installation; one per ``--python``, in the same order, gives each its own (the same run spelled
by each version's options). Printed per run: the wall seconds, the CPU seconds of pytest and of the processes it
started (its servers, its xdist workers), the load average before it and the pytest summary line; then each
installation's median and its ratio to the first one's. Exit 1 when a run did not pass.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Run:
    """One kind of run the bench repeats: what it is called, the interpreter, pytest's options, extra environment."""

    label: str
    python: str
    args: list[str]
    env: Mapping[str, str] = field(default_factory=dict)


def one_run(
    python: str, args: list[str], workdir: Path, env: Mapping[str, str] | None = None
) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (the run and every process it started and waited for), exit status and the last
    line of one ``pytest`` run with ``python`` (``env`` over this process's environment)."""
    cmd = [python, "-m", "pytest", *args, "-p", "no:cacheprovider", "-q", f"--report-dir={workdir / 'reports'}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    environ = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=environ, check=False)
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return seconds, cpu, proc.returncode, lines[-1] if lines else proc.stderr.strip()[-200:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append", required=True, help="an installation's interpreter (repeatable)")
    p.add_argument(
        "--args",
        action="append",
        help='pytest options (default "--target=embedded -n 2"); once for all, or once per --python in its order',
    )
    p.add_argument("--rounds", type=int, default=1, help="runs of each installation, taking turns (default 1)")
    opts = p.parse_args(argv)
    given = opts.args or ["--target=embedded -n 2"]
    if len(given) not in (1, len(opts.python)):
        p.error(f"give --args once, or once per --python ({len(opts.python)}), not {len(given)} times")
    # An interpreter runs from a temporary directory: a relative path is the caller's.
    runs = []
    for i, py in enumerate(opts.python):
        args = shlex.split(given[i if len(given) > 1 else 0])
        runs.append(Run(f"{os.path.abspath(py)} {' '.join(args)}", os.path.abspath(py), args))
    return 0 if take_turns(runs, opts.rounds) else 1


def take_turns(runs: Sequence[Run], rounds: int) -> bool:
    """Each run in turn, ``rounds`` times, a line each; then each run's median and its ratio to the first's.
    Whether every run passed."""
    times: list[list[float]] = [[] for _ in runs]
    passed = True
    for round_no in range(1, rounds + 1):
        for i, run in enumerate(runs):
            load = os.getloadavg()
            with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmp:
                seconds, cpu, status, last = one_run(run.python, run.args, Path(tmp), run.env)
            times[i].append(seconds)
            passed = passed and status == 0
            print(
                f"round {round_no}  {run.label}  {seconds:7.1f} s  cpu {cpu:6.1f} s  load {load[0]:.2f}"
                f"  exit {status}  {last}",
                flush=True,
            )
    first = statistics.median(times[0])
    for run, values in zip(runs, times, strict=True):
        median = statistics.median(values)
        print(f"{run.label}: median {median:.1f} s over {len(values)} run(s), {median / first:.2f}x the first")
    return passed


if __name__ == "__main__":
    sys.exit(main())
