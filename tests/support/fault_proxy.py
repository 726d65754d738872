"""A fault proxy in front of one real router instance (issue 38's "a router answering 500"): every request is passed
to the router behind it, but while :attr:`FaultProxy.faulted` is set, the calls on its worker API (``/workers`` and
below: the membership changes and the listing, or the changes only) are answered HTTP 500 with smg 1.13.0's body for a job queue that takes
no job (``QueueSubmitFailed``, ``model_gateway/src/worker/service.rs:238, 251, 301-306``; the message is
``workflow/job_queue.rs:278``'s), which is what a router under that
fault, or a proxy or load balancer in front of it, answers. Clients' inference calls pass. It counts what it refused,
by method, so a test can hold the caller to how often it came back."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

WORKER_API = "/workers"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
# WorkerServiceError::QueueSubmitFailed as smg answers it (into_response: the message, error_code INTERNAL_SERVER_ERROR)
QUEUE_SUBMIT_FAILED = b'{"error":"Job queue full: 1000 jobs pending (capacity: 1000)","code":"INTERNAL_SERVER_ERROR"}'


class FaultProxy:
    """What the proxy does and did: :attr:`faulted` (set it to answer 500), :attr:`methods` (the worker-API calls it
    answers 500: every one, or only the changes, POST and DELETE), :attr:`refused` (calls answered 500, by method)
    and :attr:`passed` (calls passed to the router, by method)."""

    def __init__(self) -> None:
        self.faulted = threading.Event()
        self.methods: frozenset[str] = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH"})
        self._lock = threading.Lock()
        self.refused: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()

    def count(self, which: Counter[str], method: str) -> None:
        with self._lock:
            which[method] += 1

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.refused), dict(self.passed)


@contextmanager
def fault_proxy(port: int, upstream: str) -> Iterator[FaultProxy]:
    """Listen on 127.0.0.1:``port`` and pass every request to ``upstream`` (the router's base URL) until the block
    ends; the yielded :class:`FaultProxy` turns the fault on and off and says what it did."""
    proxy = FaultProxy()
    client = httpx.Client(base_url=upstream, timeout=30.0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            faulted = proxy.faulted.is_set() and self.command in proxy.methods
            if faulted and self.path.split("?", 1)[0].startswith(WORKER_API):
                proxy.count(proxy.refused, self.command)
                self._answer(500, {"content-type": "application/json"}, QUEUE_SUBMIT_FAILED)
                return
            proxy.count(proxy.passed, self.command)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            try:
                answer = client.request(self.command, self.path, content=body, headers=headers)
            except httpx.HTTPError as exc:  # the router behind is down: as a proxy says so
                self._answer(502, {"content-type": "text/plain"}, f"upstream: {exc}".encode())
                return
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
            self._answer(answer.status_code, kept, answer.content)

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        client.close()
