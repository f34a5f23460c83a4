"""Wall time of a whole conformance run, for two or more installations side by side.

    python bench/suite_run.py --python /path/to/other/.venv/bin/python --python .venv/bin/python
    python bench/suite_run.py --python .venv/bin/python --args "--target=embedded" --rounds 1

Each installation (its interpreter, with its suite and reference server) runs
``pytest <args> -p no:cacheprovider -q`` from an empty directory, so no project configuration applies; the
installations take turns, ``--rounds`` times, so a change in the machine's load meets them alike. Printed per
run: the seconds, the load average before it and the pytest summary line; then each installation's median and
its ratio to the first one's. Exit 1 when a run did not pass.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(python: str, args: list[str], workdir: Path) -> tuple[float, int, str]:
    """Seconds, exit status and the last line of one ``pytest`` run with ``python``."""
    cmd = [python, "-m", "pytest", *args, "-p", "no:cacheprovider", "-q", f"--report-dir={workdir / 'reports'}"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, check=False)
    seconds = time.monotonic() - started
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return seconds, proc.returncode, lines[-1] if lines else proc.stderr.strip()[-200:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append", required=True, help="an installation's interpreter (repeatable)")
    p.add_argument("--args", default="--target=embedded -n 2", help='pytest options (default "--target=embedded -n 2")')
    p.add_argument("--rounds", type=int, default=1, help="runs of each installation, taking turns (default 1)")
    opts = p.parse_args(argv)
    args = shlex.split(opts.args)
    times: dict[str, list[float]] = {py: [] for py in opts.python}
    failed = False
    for round_no in range(1, opts.rounds + 1):
        for py in opts.python:
            load = os.getloadavg()
            with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmp:
                seconds, status, last = one_run(py, args, Path(tmp))
            times[py].append(seconds)
            failed = failed or status != 0
            print(f"round {round_no}  {py}  {seconds:7.1f} s  load {load[0]:.2f}  exit {status}  {last}", flush=True)
    first = statistics.median(times[opts.python[0]])
    for py, values in times.items():
        median = statistics.median(values)
        print(f"{py}: median {median:.1f} s over {len(values)} run(s), {median / first:.2f}x the first")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
