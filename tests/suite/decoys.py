"""A server that is not the one a test started: it answers ``GET /api/health`` with 200 on a port of its own, as
another test's server does in a shared CI machine. The tests of waiting for a started server use it to show the
wait never judges it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "serving"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def health_decoy(port: int = 0) -> Iterator[int]:
    """A server in this process serving ``GET /api/health`` on ``port`` (0: a free one), yielding its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
