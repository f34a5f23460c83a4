"""The whole conformance run with the project's own HTTP/1.1 code against the stock stacks, side by side.

    python bench/http_stacks.py --rounds 2
    python bench/http_stacks.py --stacks own,httpx-transport --rounds 3 --args "--target=embedded"

Two pieces of the project speak HTTP/1.1 themselves for speed: the suite's client transport for plain-http
targets (``suite.client.Http11Transport``, asyncio streams and h11) and the reference server's response framer
(``reference_server.http._frame``: one buffer per answer, a fresh h11 parser per request). The rule
(ARCHITECTURE.md) is to keep each only while the whole run is at least 15 % faster with it. Each stack runs the
whole suite (``pytest <args>`` from an empty directory, as ``bench/suite_run.py`` does):

* ``own``: the code as it is;
* ``httpx-transport``: the suite's client on httpx's own transport (httpcore), as for an https target;
* ``h11-events``: the reference server answering through its connection's h11 state machine (``Response``,
  ``Data``, ``EndOfMessage`` and ``start_next_cycle``) instead of framing the bytes itself.

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
from typing import Any

from suite_run import Run, take_turns

STACKS = ("own", "httpx-transport", "h11-events")
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
    elif stack == "h11-events":
        from reference_server import http

        http.HttpServer._answer = _answer_with_h11_events  # type: ignore[method-assign]
    elif stack != "own":
        raise ValueError(f"unknown stack {stack!r}; one of {', '.join(STACKS)}")


async def _answer_with_h11_events(self: Any, connection: Any, request: Any, head: Any, target: str) -> Any:
    """``HttpServer._answer`` with the answer sent as h11 events on the connection's own state machine."""
    import h11

    from reference_server import http

    peer_gone = False
    close = self._closing or not http._keep_alive(connection.protocol, head)
    try:
        result, peer_gone = await self._run_handler(connection, request)
    except Exception:
        close = close or self._closing
        data = self._render_error(http._internal_error(head), close=close, head_only=request.method == "HEAD")
    else:
        if result is http._PEER_GONE:
            return http._Outcome.ABORT
        close = close or self._closing or peer_gone
        try:
            data = _events(connection.protocol, result, close=close, head_only=head.method == "HEAD", now=self._clock())
        except Exception:
            data = self._render_error(http._internal_error(head), close=close, head_only=head.method == "HEAD")
    await self._write(connection, data)
    if peer_gone:
        return http._Outcome.ABORT
    if close:
        return http._Outcome.CLOSE
    protocol = connection.protocol
    if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
        protocol.start_next_cycle()
    else:  # an error answer framed as bytes: h11 did not see it sent
        http._next_request(connection, self._max_header_bytes)
    return http._Outcome.KEEP_ALIVE


def _events(protocol: Any, response: Any, *, close: bool, head_only: bool, now: float) -> bytes:
    """The bytes of ``response`` as h11 frames them: the same headers ``_frame`` adds (Server, Date, the length,
    Connection: close), h11's own validation and framing."""
    import h11

    from reference_server import http

    headers = [(n, v) for n, v in response.headers if n.lower() not in ("content-length", "transfer-encoding")]
    names = {n.lower() for n, _ in headers}
    if "server" not in names:
        headers.append(("Server", http.SERVER_NAME))
    if "date" not in names:
        headers.append(("Date", http._http_date(int(now)).decode("ascii")))
    no_content = response.status in (204, 304)
    body = b"" if no_content else bytes(response.body)
    if not no_content:
        headers.append(("Content-Length", str(len(body))))
    if close:
        headers.append(("Connection", "close"))
    data = protocol.send(h11.Response(status_code=response.status, headers=headers))
    if body and not head_only:
        data += protocol.send(h11.Data(data=body))
    return bytes(data + protocol.send(h11.EndOfMessage()))


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
