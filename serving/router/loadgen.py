"""Bounded open-loop load generator for the sandbox router.

Requests are *scheduled* at a fixed rate (request ``i`` is due at ``i / rate_per_s``) whatever the
latency, so a slow router shows up as higher latency, not as silently lower offered load. Every run is
bounded three ways: ``duration_s``, ``max_requests`` and ``max_in_flight`` (when that many requests
are outstanding the sender waits). A request sent more than one interval (``1 / rate_per_s``) after it was due is
counted in ``LoadReport.late``, whatever held it: no free slot, or the sender itself starved of CPU on a loaded
machine (a run offered 243/s for 300 so, 2026-12-05), so a run that fell behind its schedule says so. Each request has its
own timeout, so the run ends at most ``duration_s + timeout_s`` after it starts.

``failover`` spreads the requests over more router instances: request ``i`` goes to instance ``i mod n``, and a
request whose connection an instance refused or reset before any response came is sent once more to the next one,
as behind a load balancer that retries on connect failure and reset (Envoy's ``retry_on: connect-failure,reset``):
the fault drills' ``router-loss``. Like such a balancer's active health check (and a Kubernetes Service's readiness
gate), an instance that refused or reset a connection gets no more requests until its ``/readiness`` answers 200
(asked every :data:`READINESS_POLL_S`): smg answers 503 there until its workers are registered, and a restarted
router serves 404 ``model_not_found`` to what reaches it before (its port opens first).

Each request has a shape (:class:`RequestShape`): its route (``/generate``, ``/v1/completions``,
``/v1/chat/completions``), streamed or not, its prompt and output lengths, and the served ``model`` name (smg requires
it on the OpenAI routes in every mode, and on ``/generate`` in Kubernetes discovery (IGW) mode: 400 ``missing_model``). ``shapes`` cycles request
``i`` through a mix (:data:`PRODUCTION_MIX`: what clients of an SGLang fleet send); without it every request is
``body`` on ``path``. A streamed request is read as SSE to its ``data: [DONE]``: its time to the first token (TTFT)
and the gaps between token chunks (inter-token latency) are kept, and a stream that breaks off, carries an error
chunk (SGLang's own, smg's ``stream_error`` for an upstream that broke) or an abort, or ends without ``[DONE]`` is a
failed request, whatever its status: the 200 head went out first.
Every request but a 2xx answered in full is an error, 4xx included: a release that answers 400 fails its clients.

Use it in-process (``await LoadGenerator(spec).run()``, with :meth:`LoadGenerator.report` readable
while it runs, e.g. for an updater's gates) or from a test (:func:`run_load_sync`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from serving.stats import nearest_rank

if TYPE_CHECKING:
    import aiohttp

DEFAULT_BODY: Mapping[str, Any] = {"text": "hello world", "sampling_params": {"max_new_tokens": 8}}
TRANSPORT_ERROR = 0  # status recorded when no HTTP response arrived (refused, reset, timeout)
ERROR_BODY_CHARS = 200  # of an error response's body, kept in RequestResult.error
READINESS_POLL_S = 0.5  # how often the balancer asks an instance it took out whether it is ready again
BROKEN_STREAM = "broken stream"  # LoadReport.errors_by_status's key for a 2xx stream that did not end in [DONE]
SSE_DONE = b"[DONE]"  # SGLang's terminator on every streaming route (http_server.py, serving_base.py)

Route = Literal["generate", "completions", "chat"]
ROUTE_PATHS: Mapping[Route, str] = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}
_WORDS = ("the", "fleet", "serves", "tokens", "to", "clients", "across", "many", "nodes", "today")


@dataclass(frozen=True)
class RequestShape:
    """One kind of client request: its route, streamed or not, its prompt length in words and its output length in
    tokens (``max_new_tokens`` on ``/generate``, ``max_tokens`` on the OpenAI routes)."""

    route: Route = "generate"
    stream: bool = False
    prompt_words: int = 2
    max_tokens: int = 8

    def __post_init__(self) -> None:
        if self.route not in ROUTE_PATHS:
            raise ValueError(f"request route {self.route!r}: must be one of {', '.join(ROUTE_PATHS)}")
        if self.prompt_words < 1 or self.max_tokens < 1:
            raise ValueError(
                f"request shape prompt_words={self.prompt_words}, max_tokens={self.max_tokens}: both must be >= 1"
            )

    @property
    def path(self) -> str:
        return ROUTE_PATHS[self.route]

    def body(self, model: str | None) -> dict[str, Any]:
        prompt = " ".join(_WORDS[i % len(_WORDS)] for i in range(self.prompt_words))
        body: dict[str, Any]
        if self.route == "generate":
            body = {"text": prompt, "sampling_params": {"max_new_tokens": self.max_tokens}}
        elif self.route == "completions":
            body = {"prompt": prompt, "max_tokens": self.max_tokens}
        else:
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": self.max_tokens}
        if self.stream:
            body["stream"] = True
            if self.route != "generate":  # the usage chunk before [DONE], as OpenAI clients ask for it
                body["stream_options"] = {"include_usage": True}
        if model is not None:
            body["model"] = model
        return body


# What clients of a chat-serving fleet send, cycled request by request: mostly streamed chat, some completions and
# native /generate, short and long prompts and outputs (the sandbox's generation time is per request, so the lengths
# shape the token chunks and the KV pool, not the time).
PRODUCTION_MIX: tuple[RequestShape, ...] = (
    RequestShape("chat", stream=True, prompt_words=64, max_tokens=32),
    RequestShape("chat", stream=False, prompt_words=16, max_tokens=8),
    RequestShape("completions", stream=True, prompt_words=256, max_tokens=16),
    RequestShape("generate", stream=False, prompt_words=8, max_tokens=8),
    RequestShape("chat", stream=True, prompt_words=8, max_tokens=64),
    RequestShape("generate", stream=True, prompt_words=32, max_tokens=16),
    RequestShape("completions", stream=False, prompt_words=128, max_tokens=4),
    RequestShape("chat", stream=True, prompt_words=512, max_tokens=8),
)


@dataclass(frozen=True)
class LoadSpec:
    url: str
    rate_per_s: float
    duration_s: float
    max_requests: int = 100_000
    max_in_flight: int = 256
    path: str = "/generate"
    body: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_BODY))
    timeout_s: float = 10.0
    failover: tuple[str, ...] = ()  # more instances beside ``url``: round robin, refused or reset retried once
    model: str | None = None  # the served model name, sent as ``model`` in every body
    shapes: tuple[RequestShape, ...] = ()  # request i is shapes[i % len]; none: ``body`` on ``path``

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)}: must be > 0"
            for name in ("rate_per_s", "duration_s", "max_requests", "max_in_flight", "timeout_s")
            if not getattr(self, name) > 0
        ]
        if problems:
            raise ValueError("invalid load spec: " + "; ".join(problems))

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(u.rstrip("/") for u in (self.url, *self.failover))

    def request(self, i: int) -> tuple[str, Mapping[str, Any], bool]:
        """Request ``i``'s path, body and whether it is streamed."""
        if self.shapes:
            shape = self.shapes[i % len(self.shapes)]
            return shape.path, shape.body(self.model), shape.stream
        body = dict(self.body) if self.model is None else {**self.body, "model": self.model}
        return self.path, body, bool(body.get("stream"))

    @property
    def planned_requests(self) -> int:
        return min(self.max_requests, max(1, math.ceil(self.rate_per_s * self.duration_s)))


@dataclass(frozen=True)
class RequestResult:
    sent_at_s: float  # seconds after the run started
    latency_s: float
    status: int  # HTTP status, or TRANSPORT_ERROR
    error: str | None = None  # a transport error, an HTTP error (>= 400) with the head of its body, a broken stream
    streamed: bool = False
    ttft_s: float | None = None  # a stream's time to its first token chunk
    itl_s: tuple[float, ...] = ()  # a stream's gaps between token chunks

    @property
    def ok(self) -> bool:
        """Answered 2xx in full: a stream to its ``[DONE]`` with no error chunk."""
        return 200 <= self.status < 300 and self.error is None

    @property
    def error_kind(self) -> str:
        """What :attr:`LoadReport.errors_by_status` counts a failed request under: its status, or a broken stream."""
        return BROKEN_STREAM if 200 <= self.status < 300 else str(self.status)


def latency_quantile(results: Iterable[RequestResult], q: float) -> float:
    """Nearest-rank ``q``-quantile of the successful requests' latency in seconds (a stream's to its end); NaN with
    none."""
    return _quantile([r.latency_s for r in results if r.ok], q)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return sorted(values)[nearest_rank(q, len(values)) - 1]


@dataclass(frozen=True)
class LoadReport:
    results: tuple[RequestResult, ...]
    wall_s: float
    late: int = 0  # requests sent more than one interval after they were due (the module's docstring)

    @property
    def count(self) -> int:
        return len(self.results)

    @property
    def status_counts(self) -> dict[int, int]:
        return dict(Counter(r.status for r in self.results))

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def errors_by_status(self) -> dict[str, int]:
        """The failed requests by what failed them: every non-2xx status (``"0"``: :data:`TRANSPORT_ERROR`, no answer)
        and ``"broken stream"`` for a 2xx stream that did not end in ``[DONE]`` or carried an error chunk."""
        return dict(Counter(r.error_kind for r in self.results if not r.ok))

    @property
    def errors(self) -> int:
        return self.count - self.ok

    @property
    def error_rate(self) -> float:
        return self.errors / self.count if self.results else 0.0

    @property
    def qps(self) -> float:
        """Successful responses per second of wall time."""
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0

    def latency_quantile(self, q: float) -> float:
        """Nearest-rank quantile of successful requests' latency in seconds; NaN with none."""
        return latency_quantile(self.results, q)

    @property
    def p50_s(self) -> float:
        return self.latency_quantile(0.50)

    @property
    def p99_s(self) -> float:
        return self.latency_quantile(0.99)

    @property
    def streamed(self) -> int:
        return sum(r.streamed for r in self.results)

    def ttft_quantile(self, q: float) -> float:
        """Nearest-rank quantile of the successful streams' time to their first token chunk; NaN with none."""
        return _quantile([r.ttft_s for r in self.results if r.ok and r.ttft_s is not None], q)

    def itl_quantile(self, q: float) -> float:
        """Nearest-rank quantile of every gap between token chunks of the successful streams; NaN with none."""
        return _quantile([gap for r in self.results if r.ok for gap in r.itl_s], q)

    def window(self, start_s: float, end_s: float) -> LoadReport:
        """Requests sent in ``[start_s, end_s)`` (run-relative seconds), as a report of that window."""
        picked = tuple(r for r in self.results if start_s <= r.sent_at_s < end_s)
        return LoadReport(picked, max(0.0, end_s - start_s))

    def summary(self) -> str:
        return (
            f"{self.count} requests in {self.wall_s:.2f} s: {self.qps:.1f} ok/s, errors {self.errors} "
            f"({self.error_rate:.2%}), p50 {self.p50_s * 1000:.1f} ms, p99 {self.p99_s * 1000:.1f} ms, "
            f"statuses {dict(sorted(self.status_counts.items()))}, {self.late} sent late"
            + (
                f", {self.streamed} streamed (TTFT p99 {self.ttft_quantile(0.99) * 1000:.1f} ms, inter-token p99 "
                f"{self.itl_quantile(0.99) * 1000:.1f} ms)"
                if self.streamed
                else ""
            )
            + self._error_span()
            + "".join(f"; {n} × {error}" for error, n in self.distinct_errors().items())
        )

    def _error_span(self) -> str:
        """When the failed requests were sent (run-relative seconds), for a failed run's message: one burst or a
        scatter says which of the run's steps to look at."""
        sent = [r.sent_at_s for r in self.results if not r.ok]
        return f", errors sent {min(sent):.2f}-{max(sent):.2f} s" if sent else ""

    def distinct_errors(self, most: int = 5) -> dict[str, int]:
        """The ``most`` commonest error texts among the failed requests, with their counts: what a failed run's
        message names, e.g. ``HTTP 503: {"error": ...}``, a client timeout or a broken stream."""
        counted = Counter(r.error or f"HTTP {r.status}" for r in self.results if not r.ok)
        return dict(counted.most_common(most))

    def to_json(self) -> dict[str, Any]:
        """The figures ``exaserve sandbox load --json`` reports; NaN (nothing to take a quantile of) is null."""

        def ms(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 6)

        return {
            "count": self.count,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "errors_by_status": self.errors_by_status,
            "status_counts": {str(k): v for k, v in sorted(self.status_counts.items())},
            "streamed_share": self.streamed / self.count if self.count else 0.0,
            "qps": self.qps,
            "p50_s": ms(self.p50_s),
            "p99_s": ms(self.p99_s),
            "ttft_p50_s": ms(self.ttft_quantile(0.50)),
            "ttft_p99_s": ms(self.ttft_quantile(0.99)),
            "itl_p50_s": ms(self.itl_quantile(0.50)),
            "itl_p99_s": ms(self.itl_quantile(0.99)),
            "late": self.late,
        }


class LoadGenerator:
    """One bounded run against ``spec``'s router instances; :meth:`report` may be read while it runs."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._results: list[RequestResult] = []
        self._late = 0
        self._started = 0.0
        self._out: set[int] = set()  # failover instances out until their /readiness answers 200
        self._checks: set[asyncio.Task[None]] = set()

    def report(self) -> LoadReport:
        elapsed = time.monotonic() - self._started if self._started else 0.0
        return LoadReport(tuple(self._results), elapsed, self._late)

    async def run(self, stop: asyncio.Event | None = None) -> LoadReport:
        """Send until the duration, the request budget or ``stop`` ends it; then await in-flight ones."""
        import aiohttp  # noqa: PLC0415 - imported on first use: importing serving.rollout stays free of aiohttp

        spec = self.spec
        connector = aiohttp.TCPConnector(limit=spec.max_in_flight, force_close=False)
        timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
        slots = asyncio.Semaphore(spec.max_in_flight)
        tasks: list[asyncio.Task[None]] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self._started = time.monotonic()
            for i in range(spec.planned_requests):
                due = self._started + i / spec.rate_per_s
                if await _sleep_until(due, stop):
                    break
                await slots.acquire()
                tasks.append(asyncio.create_task(self._one(session, slots, i, due)))
            await asyncio.gather(*tasks)
            for check in list(self._checks):
                check.cancel()
        return LoadReport(tuple(self._results), time.monotonic() - self._started, self._late)

    async def _one(self, session: aiohttp.ClientSession, slots: asyncio.Semaphore, i: int, due: float) -> None:
        import aiohttp  # noqa: PLC0415 - already loaded by run()

        spec = self.spec
        path, body, stream = spec.request(i)
        instances = spec.instances
        sent = time.monotonic()
        if sent - due > 1 / spec.rate_per_s:
            self._late += 1
        status, error, ttft = TRANSPORT_ERROR, None, None
        gaps: tuple[float, ...] = ()
        try:
            for target in self._targets(i, min(2, len(instances))):
                try:
                    async with session.post(instances[target] + path, json=body) as response:
                        status = response.status
                        if stream and 200 <= status < 300:
                            ttft, gaps, error = await _read_stream(response, sent)
                        else:
                            raw = await response.read()
                            error = None if status < 400 else f"HTTP {status}: {_head(raw)}"
                    break
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if status != TRANSPORT_ERROR:  # after the head: the body broke off, never sent again
                        error += " (the body broke off)"
                        break
                    self._take_out(session, target)  # refused or reset before any response: the next one, once
        except (aiohttp.ClientError, TimeoutError) as exc:  # a timeout, or a body that broke off after the head
            error = f"{type(exc).__name__}: {exc}" + (" (the body broke off)" if status != TRANSPORT_ERROR else "")
        except Exception as exc:  # one request's surprise (a line past aiohttp's limit) is its own error
            error = f"{type(exc).__name__}: {exc}"
        finally:
            slots.release()
        self._results.append(RequestResult(sent - self._started, time.monotonic() - sent, status, error, stream,
                                           ttft, gaps))  # fmt: skip

    def _targets(self, i: int, attempts: int) -> list[int]:
        """The instances request ``i`` tries, in order: from ``i mod n`` on, those in; all of them when none is."""
        n = len(self.spec.instances)
        order = [(i + k) % n for k in range(n)]
        ready = [k for k in order if k not in self._out] or order
        return ready[:attempts]

    def _take_out(self, session: aiohttp.ClientSession, target: int) -> None:
        if len(self.spec.instances) < 2 or target in self._out:
            return
        self._out.add(target)
        task = asyncio.create_task(self._until_ready(session, target))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _until_ready(self, session: aiohttp.ClientSession, target: int) -> None:
        import aiohttp  # noqa: PLC0415 - already loaded by run()

        url = self.spec.instances[target] + "/readiness"
        while target in self._out:
            await asyncio.sleep(READINESS_POLL_S)
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        self._out.discard(target)
            except (aiohttp.ClientError, TimeoutError):
                continue


def _head(raw: bytes) -> str:
    return raw[:ERROR_BODY_CHARS].decode(errors="replace")


async def _read_stream(
    response: aiohttp.ClientResponse, sent: float
) -> tuple[float | None, tuple[float, ...], str | None]:
    """Read an SSE body to its ``data: [DONE]``: (time to the first token chunk, the gaps between token chunks,
    why the stream failed or None). An error chunk (SGLang's ``{"error": …}`` mid-stream) or an end without
    ``[DONE]`` fails it; a chunk carrying no output (a role-only first delta, the finish or usage chunk) is not timed."""
    ttft: float | None = None
    last = 0.0
    gaps: list[float] = []
    chunks = 0
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # the blank line between events, or an SSE comment
        data = line[len(b"data:") :].strip()
        if data == SSE_DONE:
            return ttft, tuple(gaps), None
        try:
            chunk = json.loads(data)
        except ValueError:
            return ttft, tuple(gaps), f"broken stream: chunk {chunks + 1} is not JSON: {_head(data)}"
        if isinstance(chunk, dict) and ("error" in chunk or _aborted(chunk)):
            return (
                ttft,
                tuple(gaps),
                f"stream error chunk after {chunks} chunks: {_head(json.dumps(chunk).encode())}",
            )
        chunks += 1
        if not _carries_output(chunk):
            continue
        now = time.monotonic()
        if ttft is None:
            ttft = now - sent
        else:
            gaps.append(now - last)
        last = now
    return ttft, tuple(gaps), f"broken stream: the body ended after {chunks} chunks without data: [DONE]"


def _aborted(chunk: dict[str, Any]) -> bool:
    """SGLang's in-stream abort: ``/generate``'s ``meta_info.finish_reason.type == "abort"`` (an engine failure after
    the 200 head, tokenizer_manager.py), an OpenAI choice's ``finish_reason == "abort"``."""
    meta = chunk.get("meta_info")
    reason = meta.get("finish_reason") if isinstance(meta, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return True
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices)


def _carries_output(chunk: Any) -> bool:
    """Whether an SSE chunk carries generated output: ``/generate``'s every chunk (its text so far), an OpenAI chunk
    whose choice has text or a delta's content."""
    if not isinstance(chunk, dict):
        return False
    choices = chunk.get("choices")
    if choices is None:
        return "text" in chunk or "output_ids" in chunk
    return any(
        isinstance(c, dict) and (c.get("text") or (isinstance(c.get("delta"), dict) and c["delta"].get("content")))
        for c in choices
    )


async def _sleep_until(due: float, stop: asyncio.Event | None) -> bool:
    """Sleep until ``due`` (monotonic); True if ``stop`` was set first."""
    delay = due - time.monotonic()
    if stop is None:
        if delay > 0:
            await asyncio.sleep(delay)
        return False
    if stop.is_set():
        return True
    if delay > 0:
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except TimeoutError:
            return False
        return True
    return False


async def run_load(spec: LoadSpec, stop: asyncio.Event | None = None) -> LoadReport:
    return await LoadGenerator(spec).run(stop)


def run_load_sync(spec: LoadSpec) -> LoadReport:
    """Run one bounded load in a fresh event loop (for tests)."""
    return asyncio.run(run_load(spec))
