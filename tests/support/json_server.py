"""A loopback HTTP server in a thread that answers every GET with JSON: the stand-in for an API whose answers a test
writes itself (a Prometheus query, a router's worker list), where the code under test is the client's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def json_server(answer: Callable[[str], Any], *, delay_s: float = 0.0) -> Iterator[str]:
    """Serve ``answer(path)`` (the request's path with its query) as JSON on every GET, ``delay_s`` after the request
    came; yields the base URL, and stops the server after the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay_s)
            body = json.dumps(answer(self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
