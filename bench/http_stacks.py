"""The whole conformance run with the suite's own HTTP/1.1 transport against httpx's, side by side.

    python bench/http_stacks.py --rounds 3
    python bench/http_stacks.py --rounds 2 --args "--target=embedded -n 2"

The suite's client reaches a plain-http target through a transport of its own (``suite.client.Http11Transport``:
asyncio streams and h11). The rule (ARCHITECTURE.md) is to keep it only while the whole run is at least 15 %
faster with it. Each stack runs the whole suite (``pytest <args>`` from an empty directory, as
``bench/suite_run.py`` does):

* ``own``: the code as it is;
* ``httpx-transport``: the suite's client on httpx's own transport (httpcore), as for an https target.

(The reference server's own response framer was measured the same way, and dropped for h11's events: the
``h11-events`` stack of this script at b296db9, figures in bench/RESULTS.md.)

A stack is installed in every process of the run (pytest, its xdist workers, the embedded server) by a
``sitecustomize`` module on ``PYTHONPATH``. The stacks take turns, ``--rounds`` times, so a change in the
machine's load meets them alike. Printed per run: wall seconds, CPU seconds of the processes, the load average
before it and pytest's last line; then each stack's median wall time and its ratio to the first stack's. Exit 1
when a run did not pass.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

from suite_run import Run, take_turns

STACKS = ("own", "httpx-transport")
BENCH = Path(__file__).resolve().parent
SITECUSTOMIZE = f"""
import os, sys
if os.environ.get("DW_BENCH_STACK", "own") != "own":
    sys.path.insert(0, {str(BENCH)!r})
    import http_stacks
    http_stacks.install(os.environ["DW_BENCH_STACK"])
"""


def install(stack: str) -> None:
    """Put ``stack`` in place in this process (called from the generated ``sitecustomize``)."""
    if stack == "httpx-transport":
        import suite.client

        # ProtocolClient reaches a plain-http target through httpx's own client and transport, as it reaches an
        # https or proxied one.
        suite.client.direct_http = lambda url: False
    elif stack != "own":
        raise ValueError(f"unknown stack {stack!r}; one of {', '.join(STACKS)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stacks", default=",".join(STACKS), help=f"comma-separated, from {', '.join(STACKS)}")
    p.add_argument("--args", default="--target=embedded", help='pytest options (default "--target=embedded")')
    p.add_argument("--python", default=sys.executable, help="the installation's interpreter (default this one)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each stack, taking turns (default 2)")
    opts = p.parse_args(argv)
    stacks = [s.strip() for s in opts.stacks.split(",") if s.strip()]
    unknown = sorted(set(stacks) - set(STACKS))
    if unknown or not stacks:
        p.error(f"unknown stack {', '.join(unknown)}; choose from {', '.join(STACKS)}")
    args = shlex.split(opts.args)
    with tempfile.TemporaryDirectory(prefix="dw-stacks-site-") as site:
        (Path(site) / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        path = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
        runs = [
            Run(f"{stack:<16}", opts.python, args, {"PYTHONPATH": path, "DW_BENCH_STACK": stack}) for stack in stacks
        ]
        return 0 if take_turns(runs, opts.rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
